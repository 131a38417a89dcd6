"""The backward's input gradient by lstmcy's packed product against OpenBLAS, and its gate
gradients' padded rows against rows of 4H, beside PyTorch's backward.

lstmcy's backward takes ``dx = dgates @ w_ih`` in pieces of steps one of two ways (the
shape decides, ``lstmcy._schedule.packed_dx``): one OpenBLAS GEMM per piece, which packs
``w_ih`` anew each time, or lstmcy's packed GEMM from ``w_ih`` packed once per call
(``packed_dx``). The gate gradients' rows are padded by a cache line where 4H values would
be a multiple of 4 KiB (``lstmcy._core._gate_row_stride``). For each case and thread
count this script times lstmcy's backward three ways (through three ``LSTMPlan``): rows of
4H and OpenBLAS's dx, lstmcy's rows and OpenBLAS's dx, lstmcy's rows and the packed dx; and
PyTorch's backward (``torch.autograd.grad`` on a recorded forward, as ``run.py`` times
it), in rounds whose order rotates, each call after 50 ms of untimed ones (PyTorch's
OpenMP workers spin on after its calls). It prints the medians, the ratios packed /
OpenBLAS and padded / 4H rows (1.000 where the rows need no padding), each round's packed
/ OpenBLAS ratio (median and quartiles), PyTorch's time over the faster of lstmcy's two
with its own rows (``torch/best``), and which way the shape's rule takes (for the first
layer).

Cases are ``run.py``'s by name, or ``T,B,I,H[,L[,bi]][,f64]`` (padded input).

Usage (the OpenBLAS variables unset in this command only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/backward_dx.py \\
        --shapes "braun;large-256;50,64,256,320" --threads 1,2
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
from cases import backward_flops, lstm_kwargs, make_inputs  # noqa: E402
from forward_input import parse_cases  # noqa: E402
from lstmcy import _core, _schedule  # noqa: E402
from machine import machine_label  # noqa: E402
from timing import rotating_rounds, spread  # noqa: E402


def _plan(variant, n_threads, case, inputs):
    """A plan whose backward schedules take ``packed_dx`` as ``variant`` says ("packed" or
    not) and whose gate gradients have rows of 4H ("4H rows") or lstmcy's (its layer setups
    keep what the calls made here chose), and its backward's arguments."""
    own = _core.backward_schedule
    own_stride = _core._gate_row_stride
    _core.backward_schedule = lambda *a, **k: own(*a, **k)._replace(
        packed_dx=variant == "packed")
    if variant == "4H rows":
        _core._gate_row_stride = lambda H, dtype: 4 * H
    hx = (inputs["h0"], inputs["c0"])
    try:
        plan = lstmcy.LSTMPlan(n_threads=n_threads)
        for _ in range(3):  # a buffer's first growth drops the setups made before it
            _, _, _, cache = plan.forward(inputs["x"], hx, inputs["params"], train=True,
                                          **lstm_kwargs(case))
            args = (inputs["x"], hx, inputs["params"], inputs["dy"], inputs["dh"],
                    inputs["dc"], *cache.saved())
            plan.backward(*args, **lstm_kwargs(case))
    finally:
        _core.backward_schedule = own
        _core._gate_row_stride = own_stride
    return plan, args


VARIANTS = ("4H rows", "OpenBLAS", "packed")


def measure(case, n_threads, rounds):
    """Median ms of lstmcy's backward in each of VARIANTS and of PyTorch's (``"torch"``),
    and the rounds' ratios packed / OpenBLAS."""
    import torch
    from run import torch_setup

    if case.packed:
        raise SystemExit(f"{case.name}: packed cases are not supported here")
    inputs = make_inputs(case)
    torch.set_num_threads(n_threads)
    _, torch_backward = torch_setup(case, inputs, packed=False)
    plans = {variant: _plan(variant, n_threads, case, inputs) for variant in VARIANTS}

    def run(plan, args):
        return lambda: plan.backward(*args, **lstm_kwargs(case))

    calls = {variant: run(*plans[variant]) for variant in VARIANTS}
    calls["torch"] = torch_backward
    # Enough calls per round for about 20 ms of work at 10 GF/s.
    repeats = max(1, min(50, int(2e8 / max(backward_flops(case), 1))))
    times = rotating_rounds(calls, rounds, repeats)
    ratios = [on / off for on, off in zip(times["packed"], times["OpenBLAS"])]
    return {key: statistics.median(values) for key, values in times.items()}, ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="small-50x32;braun;large-256;deepbench-512",
                        help="';'-separated case names of run.py or T,B,I,H[,L][,bi][,f64]")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=21, help="timed rounds (default 21)")
    args = parser.parse_args(argv)
    print(f"{machine_label()}; load average {os.getloadavg()[0]:.2f} at the start; "
          f"medians of {args.rounds} rotating rounds; backward, ms")
    print(f"{'case':<18} {'T,B,I,H,L':<18} {'dtype':<5} {'thr':>3} | {'4H rows':>8} "
          f"{'OpenBLAS':>8} {'packed':>8} {'pad/4H':>6} {'packed/BLAS':>11} "
          f"{'rounds [25%, 75%]':>24} | {'torch':>8} {'torch/best':>10} | rule")
    for case in parse_cases(args.shapes):
        rule = "packed" if _schedule.packed_dx(case.I, case.H) else "OpenBLAS"
        shape = (f"{case.T},{case.B},{case.I},{case.H},{case.L}"
                 + (" bi" if case.bidirectional else ""))
        for n_threads in (int(n) for n in args.threads.split(",")):
            medians, ratios = measure(case, n_threads, args.rounds)
            plain, off, on = (medians[v] for v in VARIANTS)
            torch_ms = medians["torch"]
            quartiles = spread(ratios)
            print(f"{case.name:<18} {shape:<18} {'f' + case.dtype[5:]:<5} {n_threads:>3} | "
                  f"{plain:>8.3f} {off:>8.3f} {on:>8.3f} {off / plain:>6.3f} {on / off:>11.3f} "
                  f"{quartiles:>24} | {torch_ms:>8.3f} {torch_ms / min(on, off):>10.3f} | "
                  f"{rule}", flush=True)


if __name__ == "__main__":
    main()
