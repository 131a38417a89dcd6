"""The forward with x's product inside the recurrence against the BLAS projection, beside
PyTorch's forward.

lstmcy's forward takes a layer's input product one of two ways (the shape decides,
``lstmcy._schedule.fused_input``): one BLAS GEMM per piece of steps writes every row's
gates ``x @ w_ih^T`` to memory and the recurrence adds ``h_{t-1} @ w_hh^T`` to them, or
each step's packed GEMM gives ``x_t @ w_ih^T + h_{t-1} @ w_hh^T`` at once from ``w_ih``
packed beside ``w_hh`` (``fused_input``). For each case and thread count this script
times lstmcy's training forward both ways (through two ``LSTMPlan``, one with
``fused_input`` forced off, one forced on) and PyTorch's training forward (``nn.LSTM``
recording its graph, as ``run.py`` times it), in rounds whose order rotates, each call
after 50 ms of untimed ones (PyTorch's OpenMP workers spin on after its calls), and
prints the medians, the ratio of the two
ways, each round's ratio (median and quartiles), and which way the shape's rule takes
(for the first layer).

Cases are ``run.py``'s by name, or ``T,B,I,H[,L[,bi]][,f64]`` (padded input).

Usage (the OpenBLAS variables unset in this command only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/forward_input.py \\
        --shapes small-32x16,large-256,50,4,64,256 --threads 1,2
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _env import reexec_without_openblas_overrides  # noqa: E402

if __name__ == "__main__":
    reexec_without_openblas_overrides()

import argparse  # noqa: E402
import statistics  # noqa: E402

import lstmcy  # noqa: E402
from cases import CASES, Case, forward_flops, lstm_kwargs, make_inputs  # noqa: E402
from lstmcy import _core, _schedule  # noqa: E402
from machine import machine_label  # noqa: E402
from timing import rotating_rounds, spread  # noqa: E402


def parse_cases(text):
    """Case names of run.py and ``T,B,I,H[,L[,bi]][,f64]`` shapes, separated by ``;``."""
    by_name = {case.name: case for case in CASES}
    cases = []
    for item in text.split(";"):
        if item in by_name:
            cases.append(by_name[item])
            continue
        fields = item.split(",")
        flags = {f for f in fields if not f.isdigit()}
        sizes = [int(f) for f in fields if f.isdigit()]
        if len(sizes) not in (4, 5) or not flags <= {"bi", "f64"}:
            raise SystemExit(f"{item!r}: not a case of run.py nor T,B,I,H[,L][,bi][,f64]")
        cases.append(Case(item, *sizes, bidirectional="bi" in flags,
                          dtype="float64" if "f64" in flags else "float32"))
    return cases


def _plan(fused, n_threads, case, inputs):
    """A plan whose forward schedules take ``fused_input`` as given (its layer setups keep
    the schedule from the calls made here)."""
    own = _core.forward_schedule
    _core.forward_schedule = lambda *a, **k: own(*a, **k)._replace(fused_input=fused)
    try:
        plan = lstmcy.LSTMPlan(n_threads=n_threads)
        for _ in range(3):  # a buffer's first growth drops the setups made before it
            plan.forward(inputs["x"], (inputs["h0"], inputs["c0"]), inputs["params"],
                         **lstm_kwargs(case))
    finally:
        _core.forward_schedule = own
    return plan


def measure(case, n_threads, rounds):
    """Median ms of lstmcy's training forward with the BLAS projection (``False``) and
    with ``fused_input`` (``True``), of PyTorch's (``"torch"``), and the rounds' ratios
    fused / projection."""
    import torch
    from run import torch_setup

    if case.packed:
        raise SystemExit(f"{case.name}: packed cases are not supported here")
    inputs = make_inputs(case)
    hx = (inputs["h0"], inputs["c0"])
    torch.set_num_threads(n_threads)
    torch_forward, _ = torch_setup(case, inputs, packed=False)
    plans = {fused: _plan(fused, n_threads, case, inputs) for fused in (False, True)}

    def run(plan):
        return lambda: plan.forward(inputs["x"], hx, inputs["params"], **lstm_kwargs(case))

    calls = {False: run(plans[False]), True: run(plans[True]), "torch": torch_forward}
    # Enough calls per round for about 20 ms of work at 10 GF/s.
    repeats = max(1, min(50, int(2e8 / max(forward_flops(case), 1))))
    times = rotating_rounds(calls, rounds, repeats)
    ratios = [on / off for on, off in zip(times[True], times[False])]
    return {key: statistics.median(values) for key, values in times.items()}, ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="small-32x16;small-50x8;small-50x32;large-256;braun",
                        help="';'-separated case names of run.py or T,B,I,H[,L][,bi][,f64]")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=21, help="timed rounds (default 21)")
    args = parser.parse_args(argv)
    print(f"{machine_label()}; load average {os.getloadavg()[0]:.2f} at the start; "
          f"medians of {args.rounds} rotating rounds; training forward, ms")
    print(f"{'case':<22} {'T,B,I,H,L':<18} {'dtype':<7} {'thr':>3} | {'projection':>10} "
          f"{'fused':>8} {'fused/proj':>10} {'rounds [25%, 75%]':>24} | {'torch':>8} "
          f"{'torch/best':>10} | rule (layer 0)")
    for case in parse_cases(args.shapes):
        itemsize = 8 if case.dtype == "float64" else 4
        rule = "fused" if _schedule.fused_input(case.B, case.I, case.H, itemsize) else "projection"
        shape = f"{case.T},{case.B},{case.I},{case.H},{case.L}" + (" bi" if case.bidirectional else "")
        for n_threads in (int(n) for n in args.threads.split(",")):
            medians, ratios = measure(case, n_threads, args.rounds)
            off, on, torch_ms = medians[False], medians[True], medians["torch"]
            quartiles = spread(ratios)
            print(f"{case.name:<22} {shape:<18} {'f' + case.dtype[5:]:<7} {n_threads:>3} | "
                  f"{off:>10.3f} {on:>8.3f} {on / off:>10.3f} {quartiles:>24} | "
                  f"{torch_ms:>8.3f} {torch_ms / min(on, off):>10.3f} | {rule}", flush=True)


if __name__ == "__main__":
    main()
