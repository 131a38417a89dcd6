#!/usr/bin/env python
"""lstmcy vs PyTorch CPU LSTM: backward and training forward, side by side.

Usage::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/run.py            # full suite
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/run.py --quick    # < 60 s subset
    python benchmarks/run.py --shapes 'tiny,small-*' --repeats 11 --threads 1
    python benchmarks/run.py --peers torch,jax,tf                # also JAX and TensorFlow/Keras
    python benchmarks/run.py --list
    python benchmarks/run.py --shapes braun,large-256,deepbench-512 --avx2-proxy

(The script re-executes itself without ``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE``:
OpenBLAS reads them when it is loaded, and they select older kernels.)

Per case, in one process and interleaved rounds (``timing.py``): lstmcy's backward and
training forward, plain and through an ``LSTMPlan``, beside PyTorch's (the aten ops it ran
recorded); packed cases also as a padded batch of the same tokens; with ``--peers``,
forward+backward for all once the peers' results agree with lstmcy's. Once per case: the
numpy reference (within ``--ref-budget``) and the numpy memory of one call. What is
compared, and the method: docs/benchmarks.md and RESULTS.md.

Output: a table on stdout, ``benchmarks/results/<timestamp>.json`` (or ``--json``)
and, when matplotlib is importable, a PNG chart beside it.
"""
import os
import sys

from _env import reexec_without_openblas_overrides, use_avx2_proxy  # (no numpy import)

reexec_without_openblas_overrides(__name__)
use_avx2_proxy(sys.argv, __name__)

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402

import machine  # noqa: E402
import report  # noqa: E402
from cases import backward_flops, forward_flops, lstm_kwargs, make_inputs, select_cases  # noqa: E402
from peers import check, compare, load_peers, parse_peers  # noqa: E402
from timing import measure  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="small subset, fewer repeats, shorter batches (< 60 s)")
    parser.add_argument("--shapes", default=None,
                        help="comma-separated case names or globs, e.g. 'tiny,small-*,*-f64'")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed rounds per implementation (default 7, quick 3)")
    parser.add_argument("--threads", type=int, default=None,
                        help="BLAS/OpenMP threads (threadpoolctl) and torch.set_num_threads; "
                             "default: the libraries' defaults")
    parser.add_argument("--json", default=None, help="write the JSON results here "
                        "(default benchmarks/results/<timestamp>.json)")
    parser.add_argument("--avx2-proxy", action="store_true",
                        help="run lstmcy's AVX2 kernels, OpenBLAS's Haswell kernels and "
                             "PyTorch's AVX2 code (on an AVX-512 CPU: the AVX2 code paths, "
                             "on other cores than an AVX2-only CPU's; RESULTS.md shows "
                             "section avx2_proxy)")
    parser.add_argument("--section", default=None, metavar="NAME",
                        help="write the run as section NAME of the --json file (its other "
                             "sections kept; RESULTS.md shows sections small_calls, large_shapes "
                             "and avx2_proxy) instead "
                             "of the whole file")
    parser.add_argument("--chart", default=None, help="PNG chart path (default: beside the JSON)")
    parser.add_argument("--no-chart", action="store_true", help="do not draw the PNG chart")
    parser.add_argument("--ref-budget", type=float, default=None,
                        help="skip the numpy reference when predicted to take longer (s; default 5, quick 1)")
    parser.add_argument("--min-time", type=float, default=None,
                        help="length of one timed batch in seconds (default 0.05, quick 0.02)")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="before each case, wait up to this long until other processes use less "
                             "than 0.3 cores (shared machines); default 0: do not wait")
    parser.add_argument("--peers", default="torch",
                        help="frameworks to compare with, comma-separated from torch, jax, tf (default "
                             "torch; PyTorch is always timed). jax and tf add forward+backward timings "
                             "for all, after a cross-check of their gradients; a peer that is not "
                             "installed is skipped (pip install -e '.[bench]')")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    try:
        args.peers = parse_peers(args.peers)
    except ValueError as exc:
        parser.error(str(exc))
    args.repeats = args.repeats or (3 if args.quick else 7)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    args.ref_budget = args.ref_budget if args.ref_budget is not None else (1.0 if args.quick else 5.0)
    args.min_time = args.min_time if args.min_time is not None else (0.02 if args.quick else 0.05)
    args.warm_time = 0.005 if args.quick else 0.02
    args.peak_sizes = (1024,) if args.quick else (1024, 2048)
    return args


def _problem(case, inp, packed):
    """``(x, hx, dy, kwargs)`` of the case's calls, numpy arrays: packed 2-D layout or padded
    ``[T, B, I]``."""
    kw = lstm_kwargs(case)
    if packed:
        kw["batch_sizes"] = inp["batch_sizes"]
        return inp["x_packed"], (inp["h0"], inp["c0"]), inp["dy_packed"], kw
    return inp["x"], (inp["h0"], inp["c0"]), inp["dy"], kw


# --------------------------------------------------------------------------- torch side

def torch_setup(case, inp, packed, step=False):
    """``torch.nn.LSTM`` with lstmcy's parameters, and forward / backward closures.

    ``packed`` selects the PackedSequence path (input ``x_packed`` and ``batch_sizes``);
    otherwise the padded ``[T, B, I]`` input is used. The backward takes the gradients of
    one recorded forward, or with ``step`` runs its own forward first (a training step's
    gradients).
    """
    import torch
    from torch.nn.utils.rnn import PackedSequence

    tdt = torch.float32 if case.dtype == "float32" else torch.float64
    module = torch.nn.LSTM(case.I, case.H, case.L, bidirectional=case.bidirectional).to(tdt)
    with torch.no_grad():
        for weight, value in zip(module._flat_weights, inp["params"]):
            weight.copy_(torch.from_numpy(value))
    x, (h0, c0), dy, _ = _problem(case, inp, packed)
    x, h0, c0 = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, h0, c0))
    cotangents = [torch.from_numpy(a.copy()) for a in (dy, inp["dh"], inp["dc"])]
    batch_sizes = torch.from_numpy(inp["batch_sizes"].copy()) if packed else None

    def forward():
        out, (h_n, c_n) = module(PackedSequence(x, batch_sizes) if packed else x, (h0, c0))
        return (out.data if packed else out), h_n, c_n

    inputs = [x, h0, c0] + list(module._flat_weights)
    outputs = None if step else forward()  # the recorded forward that backward differentiates

    def backward():
        if step:
            return torch.autograd.grad(list(forward()), inputs, cotangents)
        return torch.autograd.grad(list(outputs), inputs, cotangents, retain_graph=True)

    return forward, backward


def torch_ops(fn, top=6):
    """Names of the aten ops that took the most self CPU time in one call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    # Kineto writes "profiler_start/stop" lines to fd 2: silence them.
    sys.stderr.flush()
    saved_fd = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    finally:
        os.dup2(saved_fd, 2)
        os.close(saved_fd)
        os.close(devnull)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [e.key for e in events[:top] if e.self_cpu_time_total > 0]


# --------------------------------------------------------------------------- lstmcy side

def lstmcy_setup(case, inp, packed, plan=False, step=False):
    """Forward / backward closures for lstmcy (packed 2-D layout or padded ``[T, B, I]``).

    ``plan`` runs them through one ``lstmcy.LSTMPlan`` (work buffers kept between calls)
    instead of the plain ``lstm_forward`` / ``lstm_backward``. The backward starts from
    what one training forward saved, or with ``step`` runs its own forward first (a
    training step's gradients).
    """
    import lstmcy

    api = lstmcy.LSTMPlan() if plan else lstmcy
    x, hx, dy, kw = _problem(case, inp, packed)
    params = inp["params"]
    run_forward = api.forward if plan else api.lstm_forward
    run_backward = api.backward if plan else api.lstm_backward

    def forward():
        return run_forward(x, hx, params, train=True, **kw)

    saved = forward()[3].saved()

    def backward():
        return run_backward(x, hx, params, dy, inp["dh"], inp["dc"],
                            *(forward()[3].saved() if step else saved), **kw)

    return forward, backward


def reference_run(case, inp, budget):
    """Time the numpy reference once, unless a probe predicts more than ``budget`` s."""
    from lstmcy import reference

    _, hx, _, kw = _problem(case, inp, packed=False)
    params = inp["params"]
    # Probe: the first few steps of the padded problem; the reference is linear in T.
    t_probe = min(case.T, 3)
    x_probe = inp["x"][:t_probe]
    start = time.perf_counter()
    y, h_n, c_n, cache = reference.lstm_forward(x_probe, hx, params, **kw)
    reference.lstm_backward(x_probe, hx, params, np.ones_like(y), None, None, *cache.saved(), **kw)
    estimate = (time.perf_counter() - start) * case.T / t_probe
    if estimate > budget:
        return {"status": "skipped", "estimate_s": estimate,
                "reason": f"predicted {estimate:.1f} s for forward+backward > budget {budget:g} s"}
    x, hx, dy, kw = _problem(case, inp, case.packed)
    start = time.perf_counter()
    cache = reference.lstm_forward(x, hx, params, train=True, **kw)[3]
    mid = time.perf_counter()
    reference.lstm_backward(x, hx, params, dy, inp["dh"], inp["dc"], *cache.saved(), **kw)
    return {"status": "ran", "estimate_s": estimate, "repeats": 1, "fwd": mid - start,
            "bwd": time.perf_counter() - mid}


def _nbytes(obj):
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    if hasattr(obj, "saved"):
        return _nbytes(list(obj.saved())) + _nbytes(getattr(obj, "dropout_masks", None))
    return 0


def peak_memory(fn):
    """Peak bytes numpy allocated during one call (tracemalloc), and bytes of the results."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, _nbytes(result)


def max_rel_err(ours, theirs):
    """Largest ``max|a - b| / max|b|`` over lstmcy's gradients ``a`` (dx, dh0, dc0, dparams...)
    and PyTorch's ``b``."""
    return max(check.rel_err(b.detach().numpy(), a)[0]
               for a, b in zip(list(ours[:3]) + list(ours[3]), theirs))


# --------------------------------------------------------------------------- one case

def run_case(case, args, peers=None):
    """Time one case; ``peers`` (``name -> (module, info)``, see ``peers.load_peers``) adds
    forward+backward for lstmcy and PyTorch and, after their cross-check, the peers."""
    inp = make_inputs(case)
    cy_fwd, cy_bwd = lstmcy_setup(case, inp, packed=case.packed)
    pt_fwd, pt_bwd = torch_setup(case, inp, packed=case.packed)
    plan_fwd, plan_bwd = lstmcy_setup(case, inp, packed=case.packed, plan=True)
    functions = dict(lstmcy_bwd=cy_bwd, torch_bwd=pt_bwd, lstmcy_fwd=cy_fwd, torch_fwd=pt_fwd,
                     lstmcy_plan_bwd=plan_bwd, lstmcy_plan_fwd=plan_fwd)
    if case.packed:
        cyp_fwd, cyp_bwd = lstmcy_setup(case, inp, packed=False)
        ptp_fwd, ptp_bwd = torch_setup(case, inp, packed=False)
        functions.update(lstmcy_padded_bwd=cyp_bwd, torch_padded_bwd=ptp_bwd,
                         lstmcy_padded_fwd=cyp_fwd, torch_padded_fwd=ptp_fwd)

    result = {"name": case.name, "group": case.group, "dtype": case.dtype, "packed": case.packed,
              "note": case.note, "shape": {"T": case.T, "B": case.B, "I": case.I, "H": case.H,
                                           "L": case.L, "D": case.D},
              "label": case.shape_label,
              "flops": {"bwd": backward_flops(case), "fwd": forward_flops(case),
                        "bwd_padded": backward_flops(case, padded=True),
                        "fwd_padded": forward_flops(case, padded=True)}}
    if case.packed:
        result["lengths"] = inp["lengths"].tolist()
        result["tokens"] = int(inp["lengths"].sum())

    result["max_rel_err_vs_torch"] = max_rel_err(cy_bwd(), pt_bwd())
    result["torch_ops"] = {"bwd": torch_ops(pt_bwd), "fwd": torch_ops(pt_fwd)}
    if peers:
        functions.update(lstmcy_fwdbwd=lstmcy_setup(case, inp, case.packed, step=True)[1],
                         torch_fwdbwd=torch_setup(case, inp, case.packed, step=True)[1])
        peer_functions, result["peers"] = compare.setup_case(case, inp, peers,
                                                             check.lstmcy_results(cy_fwd, cy_bwd))
        functions.update(peer_functions)

    before = machine.cpu_snapshot()
    times = measure(functions, repeats=args.repeats, min_time=args.min_time, warm_time=args.warm_time)
    result["others_cores"] = machine.others_cores(before, machine.cpu_snapshot())
    result["times"] = times
    med = {name: t["median"] for name, t in times.items()}
    ratios = {"bwd_ratio": med["torch_bwd"] / med["lstmcy_bwd"],
              "fwd_ratio": med["torch_fwd"] / med["lstmcy_fwd"],
              "plan_bwd_ratio": med["torch_bwd"] / med["lstmcy_plan_bwd"],
              "plan_fwd_ratio": med["torch_fwd"] / med["lstmcy_plan_fwd"]}
    if case.packed:
        ratios["packed_vs_torch_packed"] = med["torch_bwd"] / med["lstmcy_bwd"]
        ratios["packed_vs_own_padded"] = med["lstmcy_padded_bwd"] / med["lstmcy_bwd"]
        ratios["torch_packed_over_padded"] = med["torch_bwd"] / med["torch_padded_bwd"]
        ratios["padded_bwd_ratio"] = med["torch_padded_bwd"] / med["lstmcy_padded_bwd"]
        ratios["packed_fwd_vs_own_padded"] = med["lstmcy_padded_fwd"] / med["lstmcy_fwd"]
    result["ratios"] = ratios
    gflops = {}
    for name, seconds in med.items():
        padded = "_padded" if "padded" in name else ""
        if name.endswith("fwdbwd"):
            flops = result["flops"]["fwd" + padded] + result["flops"]["bwd" + padded]
        else:
            flops = result["flops"][("bwd" if name.endswith("bwd") else "fwd") + padded]
        gflops[name] = flops / seconds / 1e9
    result["gflops"] = gflops
    if peers:
        compare.summarise(result, med)

    result["reference"] = reference_run(case, inp, args.ref_budget)

    fwd_peak, fwd_out = peak_memory(cy_fwd)
    bwd_peak, bwd_out = peak_memory(cy_bwd)
    result["memory_plan"] = {"fwd_peak_bytes": peak_memory(plan_fwd)[0],
                             "bwd_peak_bytes": peak_memory(plan_bwd)[0]}
    itemsize = np.dtype(case.dtype).itemsize
    gates_bytes = case.T * case.B * 4 * case.H * itemsize
    result["memory"] = {"fwd_peak_bytes": fwd_peak, "fwd_result_bytes": fwd_out,
                        "bwd_peak_bytes": bwd_peak, "bwd_result_bytes": bwd_out,
                        "T_B_4H_bytes": gates_bytes}
    return result


def evaluate_targets(case, result, peaks):
    """Fill ``result['efficiency']`` and ``result['targets']`` from the case's targets."""
    peak = peaks[case.dtype]["peak_gflops"]
    result["efficiency"] = {name: g / peak for name, g in result["gflops"].items()}
    measured = dict(result["ratios"])
    measured["bwd_efficiency"] = result["efficiency"]["lstmcy_bwd"]
    checks = []
    for metric, (minimum, source) in case.targets.items():
        value = measured[metric]
        # "faster than" (fwd_ratio 1.0 on small shapes) is strict; the rest are ">=".
        met = value > minimum if (metric == "fwd_ratio" and minimum == 1.0) else value >= minimum
        checks.append({"metric": metric, "min": minimum, "measured": value, "met": bool(met),
                       "source": source})
    result["targets"] = checks


# --------------------------------------------------------------------------- main

def wait_quiet(max_wait, threshold=0.3, interval=1.0):
    """Wait until other processes use fewer than ``threshold`` cores, for at most ``max_wait``
    s: ``(others_cores, waited_seconds)`` of the last sample."""
    start = time.perf_counter()
    while True:
        before = machine.cpu_snapshot()
        time.sleep(interval)
        others = machine.others_cores(before, machine.cpu_snapshot())
        waited = time.perf_counter() - start
        if others is None or others < threshold or waited >= max_wait:
            return others, waited


def main(argv=None):
    args = parse_args(argv)
    cases = select_cases(args.shapes, quick=args.quick)
    if args.list:
        for c in cases:
            print(f"{c.name:18s} {c.shape_label:28s} {c.dtype:8s} {'packed' if c.packed else ''} {c.note}")
        return 0

    t_start = time.perf_counter()
    import threadpoolctl
    import torch

    import lstmcy  # loads scipy's OpenBLAS through scipy.linalg.cython_blas

    if args.threads is not None:
        limiter = threadpoolctl.threadpool_limits(limits=args.threads)  # noqa: F841  (kept alive)
        torch.set_num_threads(args.threads)
        lstmcy.set_num_threads(args.threads)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    meta = {"timestamp": stamp, "argv": sys.argv, "quick": args.quick, "repeats": args.repeats,
            "wait_quiet": args.wait_quiet,
            "threads": args.threads, "min_time": args.min_time, "warm_time": args.warm_time,
            "ref_budget": args.ref_budget, "cpu": machine.lscpu_summary(), "blas": machine.blas_info(),
            "versions": machine.versions(), "git": machine.git_state(machine.ROOT),
            "lstmcy_threads": lstmcy.get_num_threads(), "loadavg_start": os.getloadavg(),
            "avx2_proxy": args.avx2_proxy, "lstmcy_kernels": _kernels_module()}
    print(f"lstmcy benchmark {stamp}: {len(cases)} cases, {args.repeats} rounds, "
          f"threads={args.threads or 'default'}, load average {meta['loadavg_start'][0]:.2f}")
    for line in machine.describe_pools(meta["blas"]):
        print("  " + line)
    if meta["blas"]["unset_by_run_py"]:
        print(f"  re-executed without {meta['blas']['unset_by_run_py']}")
    peers = load_peers_for_run(args, meta, torch)

    def peaks_now():
        return {dt: machine.gemm_peak(dt, sizes=args.peak_sizes, repeats=3 if args.quick else 7)
                for dt in ("float32", "float64")}

    if args.wait_quiet > 0:
        wait_quiet(args.wait_quiet)
    peaks_start = peaks_now()
    print("  GEMM peak at start: " + report.format_peaks(peaks_start))

    results = []
    for case in cases:
        quiet = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
        t0 = time.perf_counter()
        result = run_case(case, args, peers)
        if quiet is not None:
            result["wait_quiet"] = {"others_cores_before": quiet[0], "waited_s": quiet[1]}
        result["wall_s"] = time.perf_counter() - t0
        results.append((case, result))
        others = result["others_cores"]
        print(f"  {case.name:18s} {result['wall_s']:5.1f} s: torch/lstmcy bwd "
              f"{result['ratios']['bwd_ratio']:6.2f}x, fwd {result['ratios']['fwd_ratio']:6.2f}x"
              + (peer_line(result) if peers else "")
              + (f"  (other processes busy on {others:.1f} cores)" if others is not None else ""),
              flush=True)

    peaks_end = peaks_now()
    print("  GEMM peak at end:   " + report.format_peaks(peaks_end))
    peaks = {}
    for dt in peaks_start:
        best = max((peaks_start[dt], peaks_end[dt]), key=lambda p: p["peak_gflops"])
        peaks[dt] = {"peak_gflops": best["peak_gflops"], "best": best["best"],
                     "start": peaks_start[dt], "end": peaks_end[dt]}
    for case, result in results:
        evaluate_targets(case, result, peaks)
    meta["loadavg_end"] = os.getloadavg()
    meta["wall_s"] = time.perf_counter() - t_start
    doc = {"meta": meta, "peaks": peaks, "cases": [r for _, r in results]}

    print()
    print(report.text_report(doc))

    json_path = args.json or os.path.join(RESULTS_DIR, f"{stamp}.json")
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    text = json.dumps(doc, indent=1, default=lambda obj: obj.tolist())  # numpy scalars, arrays
    if args.section:
        machine.update_result_file(json_path, **{args.section: json.loads(text)})
        print(f"\nresults: {json_path}, section {args.section}")
    else:
        with open(json_path, "w") as fh:
            fh.write(text)
        print(f"\nresults: {json_path}")
    if not args.no_chart:
        # (A section's run beside the file's own chart, not over it.)
        stem = os.path.splitext(json_path)[0] + (f"-{args.section}" if args.section else "")
        chart_path = args.chart or stem + ".png"
        if report.chart(doc, chart_path):
            print(f"chart:   {chart_path}")
        else:
            print("chart:   skipped (matplotlib not importable; pip install matplotlib)")
    print(f"total {meta['wall_s']:.1f} s")
    failed = [f"{r['name']}: {name} {s['status']}" for _, r in results
              for name, s in r.get("peers", {}).items() if s["status"] != "ran"]
    if failed:
        print("peers not timed (their results disagree with lstmcy's, or they failed): " + "; ".join(failed))
        return 1
    return 0


def _kernels_module():
    """The name of the build of lstmcy's kernels this process runs."""
    from lstmcy._engine.dispatch import kernels
    return kernels.__name__


def load_peers_for_run(args, meta, torch):
    """Import the peers of ``--peers`` with the suite's thread count; print and record what loaded.

    The suite's thread count is ``--threads`` or, by default, PyTorch's (the cores).
    Returns ``name -> (module, info)`` (empty for PyTorch alone).
    """
    threads = args.threads or torch.get_num_threads()
    loaded, skipped = load_peers(args.peers, threads)
    meta["peers"] = {"requested": args.peers, "threads": threads,
                     "loaded": {name: info for name, (_, info) in loaded.items()}, "skipped": skipped}
    for name, (_, info) in loaded.items():
        detail = ", ".join(f"{k}={v}" for k, v in info.items() if k != "version")
        print(f"  peer {name} {info['version']}: {detail}")
    for name, reason in skipped.items():
        print(f"  peer {name} skipped: {reason}")
    return loaded


def peer_line(result):
    """``, fwd+bwd peer/lstmcy: torch 1.20x jax 2.10x`` and the peers not timed."""
    parts = [f"{name} {result['ratios'][f'{name}_fwdbwd_ratio']:.2f}x"
             for name in ["torch"] + list(result["peers"]) if f"{name}_fwdbwd_ratio" in result["ratios"]]
    parts += [f"{name} {s['status'].upper()}" for name, s in result["peers"].items() if s["status"] != "ran"]
    return ", fwd+bwd peer/lstmcy: " + " ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
