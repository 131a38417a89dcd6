"""Where lstmcy's backward spends its time, beside PyTorch's backward of the same case.

For each case and thread count, rounds alternate PyTorch's backward
(``torch.autograd.grad`` on a recorded forward, as ``run.py`` times it) with lstmcy's
backward through an ``LSTMPlan`` that traces its kernel tasks (``LSTMPlan.trace``), in an
order rotated every round (PyTorch's OpenMP workers spin on after its calls). It
prints the medians: both backwards' wall time and GF/s (``16 T B H (I + H)`` per layer and
direction, as ``run.py`` counts them), and lstmcy's task time by kind (summed over
threads, so at two threads the kinds add up to about twice the wall time), with the GF/s
of the two kinds that are products of a known size:

* ``WEIGHTS``: ``[dW_ih | dW_hh] += dgates^T [x | h_{t-1}]`` over every chunk and block
  (lstmcy's ``gemm_tn`` on wide layers, else OpenBLAS; ``--weights openblas`` or ``both``
  times OpenBLAS there too), ``8 T B H (I + P)`` floating-point operations per layer and
  direction;
* ``DX``: ``dx = dgates @ w_ih`` (OpenBLAS), ``8 T B H I`` per layer and direction;
* ``RECURRENCE`` / ``UNIT_STEP``: the gate gradients' cells and ``dh = dgates @ w_hh``.

Beside them, the same two products as single OpenBLAS calls over every row at once
(``np.matmul`` on one thread), the best their cuts into tasks could give. Tracing adds its
buffer and a few microseconds per task: the wall times are of traced calls, for shapes whose
backward takes milliseconds.

Usage (the OpenBLAS variables unset in this command only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/backward_pieces.py \\
        --shapes deepbench-512,large-256 --threads 1,2 [--weights both]
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
import time  # noqa: E402
from collections import defaultdict  # noqa: E402

import numpy as np  # noqa: E402
import threadpoolctl  # noqa: E402

import lstmcy  # noqa: E402
from cases import CASES, backward_flops, lstm_kwargs, make_inputs  # noqa: E402
from lstmcy import _core, _schedule  # noqa: E402
from machine import _times, machine_label  # noqa: E402

# Task kinds (src/lstmcy/_layer.pxd, TaskKind)
KINDS = ("PACK", "PROJECT", "RECURRENCE", "UNIT_STEP", "GATHER", "WEIGHTS", "DX", "FINISH")


def _flops(case):
    """Operations of the WEIGHTS and DX tasks of the whole call."""
    D = 2 if case.bidirectional else 1
    weights = dx = 0.0
    for layer in range(case.L):
        in_size = case.I if layer == 0 else D * case.H
        weights += D * 8.0 * case.T * case.B * case.H * (in_size + case.H)
        dx += D * 8.0 * case.T * case.B * case.H * in_size
    return weights, dx


def _one_call_gflops(case, inputs, repeats=5):
    """GF/s of the first layer's dW and dx as one OpenBLAS call each, on one thread."""
    rng = np.random.default_rng(0)
    rows, G4 = case.T * case.B, 4 * case.H
    dt = np.dtype(case.dtype)
    dgates = rng.standard_normal((rows, G4)).astype(dt)
    z = rng.standard_normal((rows, case.I + case.H)).astype(dt)
    w_ih = inputs["params"][0]
    dw = np.empty((G4, case.I + case.H), dt)
    dx = np.empty((rows, case.I), dt)

    def best(fn, flops):
        return flops / _times(fn, repeats)[0] / 1e9

    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        weights = best(lambda: np.matmul(dgates.T, z, out=dw), 2.0 * G4 * rows * (case.I + case.H))
        inputs_ = best(lambda: np.matmul(dgates, w_ih, out=dx), 2.0 * rows * G4 * case.I)
    return weights, inputs_


_OPENBLAS_WEIGHTS = [False]  # whether the plan being called adds dW with OpenBLAS


def _schedule_with_weights_choice(T, B, I, H, D, n_threads, projected=False, small_gemms=False):
    """lstmcy's backward schedule, with the weight gradients by OpenBLAS when asked."""
    schedule = _schedule.backward_schedule(T, B, I, H, D, n_threads, projected, small_gemms)
    return schedule._replace(panel_weights=False) if _OPENBLAS_WEIGHTS[0] else schedule


def measure(case, n_threads, rounds, variants):
    """Median times (ms) of PyTorch's backward and of lstmcy's (one per variant: True adds
    the weight gradients with OpenBLAS), and lstmcy's task time by kind."""
    import torch
    from run import torch_setup

    inputs = make_inputs(case)
    kw = lstm_kwargs(case)
    hx = (inputs["h0"], inputs["c0"])
    torch.set_num_threads(n_threads)
    _, torch_backward = torch_setup(case, inputs, packed=False)
    plans = {variant: lstmcy.LSTMPlan(n_threads=n_threads) for variant in variants}
    _, _, _, cache = plans[variants[0]].forward(inputs["x"], hx, inputs["params"], **kw)
    saved = cache.saved()
    times = {variant: defaultdict(list) for variant in variants}
    torch_times = []
    # Each round runs PyTorch and the variants in a rotated order: what runs right after
    # PyTorch shares the cores with its OpenMP workers while they spin.
    order = [None] + list(variants)
    for round_ in range(rounds + 2):
        for variant in order[round_ % len(order):] + order[:round_ % len(order)]:
            if variant is None:
                start = time.perf_counter()
                torch_backward()
                torch_ms = (time.perf_counter() - start) * 1e3
                if round_ >= 2:
                    torch_times.append(torch_ms)
                continue
            plan = plans[variant]
            _OPENBLAS_WEIGHTS[0] = variant
            plan.trace = []
            start = time.perf_counter()
            plan.backward(inputs["x"], hx, inputs["params"], inputs["dy"], inputs["dh"],
                          inputs["dc"], *saved, **kw)
            lstmcy_ms = (time.perf_counter() - start) * 1e3
            trace, plan.trace = plan.trace, None
            if round_ < 2:  # warm-up
                continue
            times[variant]["lstmcy"].append(lstmcy_ms)
            by_kind = defaultdict(float)
            for kind, _, entries in trace:
                if kind != "backward":
                    continue
                for entry in entries:
                    by_kind[KINDS[int(entry[0])]] += (entry[6] - entry[5]) / 1e6
            for name, ms in by_kind.items():
                times[variant][name].append(ms)
    torch_ms = statistics.median(torch_times)
    return {variant: dict({name: statistics.median(values) for name, values in t.items()},
                          torch=torch_ms)
            for variant, t in times.items()}


def _print_row(name, n_threads, m, case, weights_flops, dx_flops, one_dw, one_dx):
    """One line of the table: the medians ``m`` of :func:`measure` for one variant."""
    recurrence = m.get("RECURRENCE", 0.0) + m.get("UNIT_STEP", 0.0)
    other = sum(m.get(k, 0.0) for k in ("PACK", "GATHER", "FINISH"))
    weights, dx = m.get("WEIGHTS", 0.0), m.get("DX", 0.0)
    total = backward_flops(case) / 1e6
    print(f"{name:<29} {n_threads:>3} | {m['torch']:>9.2f} {m['lstmcy']:>9.2f} "
          f"{m['torch'] / m['lstmcy']:>5.2f}x {total / m['torch']:>4.0f}/"
          f"{total / m['lstmcy']:<4.0f} | "
          f"{weights:>7.2f} ({weights_flops / weights / 1e6:>3.0f} GF/s) "
          f"{dx:>7.2f} ({dx_flops / dx / 1e6:>3.0f} GF/s) "
          f"{recurrence:>10.2f} {other:>7.2f} | {one_dw:>7.0f} GF/s {one_dx:>5.0f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="deepbench-512,large-256",
                        help="comma-separated case names of run.py (padded cases)")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds (default 15)")
    parser.add_argument("--weights", choices=("lstmcy", "openblas", "both"), default="lstmcy",
                        help="how lstmcy adds the weight gradients: its own choice (its product "
                             "on wide layers, see PANEL_WEIGHTS_COLUMNS), OpenBLAS always, or "
                             "both in the same rounds")
    args = parser.parse_args(argv)
    variants = {"lstmcy": [False], "openblas": [True], "both": [False, True]}[args.weights]
    _core.backward_schedule = _schedule_with_weights_choice
    cases = {case.name: case for case in CASES}
    print(f"{machine_label()}; load average {os.getloadavg()[0]:.2f} at the start; "
          f"medians of {args.rounds} alternating rounds")
    header = (f"{'case':<29} {'thr':>3} | {'torch ms':>9} {'lstmcy ms':>9} {'ratio':>6} "
              f"{'GF/s':>9} | "
              f"{'WEIGHTS':>16} {'DX':>16} {'recurrence':>10} {'other':>7} | "
              f"{'one call: dW':>12} {'dx':>5}")
    print(header)
    for name in args.shapes.split(","):
        case = cases[name]
        if case.packed:
            raise SystemExit(f"{name}: packed cases are not supported here")
        weights_flops, dx_flops = _flops(case)
        one_dw, one_dx = _one_call_gflops(case, make_inputs(case))
        for n_threads in (int(n) for n in args.threads.split(",")):
            for variant, m in measure(case, n_threads, args.rounds, variants).items():
                _print_row(name + (" (dW OpenBLAS)" if variant else ""), n_threads, m, case,
                           weights_flops, dx_flops, one_dw, one_dx)


if __name__ == "__main__":
    main()
