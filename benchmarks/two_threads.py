"""One thread against two: lstmcy's training pass beside OpenBLAS's own GEMM, in one run.

On a shared or virtual machine the second core does not always give a full core's work
(another guest on its sibling, a host that moves virtual CPUs). A 1 -> 2 thread speed-up
measured there mixes lstmcy's scaling with the machine's. This script alternates, round
by round, a 2048 x 2048 float32 GEMM (numpy's OpenBLAS, capped to 1 or 2 threads) with
the cases' training passes (forward + backward, ``LSTMPlan(n_threads=1 or 2)``), so the
GEMM's 1 -> 2 speed-up, measured in the same minutes, says what the machine gave.

Usage (the OpenBLAS variables unset in this command only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/two_threads.py \\
        --shapes large-256,braun --rounds 30
"""
import argparse
import os
import sys
import time

import numpy as np
import threadpoolctl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import lstmcy  # noqa: E402
from cases import CASES, lstm_kwargs, make_inputs  # noqa: E402


def _training_pass(case, inputs, plan):
    kw = lstm_kwargs(case)
    hx = (inputs["h0"], inputs["c0"])
    y, h_n, c_n, cache = plan.forward(inputs["x"], hx, inputs["params"], **kw)
    plan.backward(inputs["x"], hx, inputs["params"], inputs["dy"], inputs["dh"], inputs["dc"],
                  *cache.saved(), **kw)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="large-256,braun")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    cases = [by_name[name] for name in args.shapes.split(",")]
    inputs = {case.name: make_inputs(case) for case in cases}
    plans = {n: lstmcy.LSTMPlan(n_threads=n) for n in (1, 2)}
    a = np.random.default_rng(0).random((2048, 2048), dtype=np.float32)
    c = np.empty_like(a)
    controller = threadpoolctl.ThreadpoolController()
    times = {}
    for rnd in range(args.rounds):
        for n in ((1, 2) if rnd % 2 else (2, 1)):
            with controller.limit(limits=n, user_api="blas"):
                np.matmul(a, a, out=c)
                start = time.perf_counter()
                np.matmul(a, a, out=c)
                times.setdefault(("GEMM 2048", n), []).append(time.perf_counter() - start)
            for case in cases:
                _training_pass(case, inputs[case.name], plans[n])  # not timed: settles
                start = time.perf_counter()
                _training_pass(case, inputs[case.name], plans[n])
                times.setdefault((case.name, n), []).append(time.perf_counter() - start)
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    print(f"{args.rounds} alternating rounds; load average {load} at the end")
    print(f"{'':<14} {'1 thread ms':>11} {'2 threads ms':>12} {'1->2':>6}  per-round 1->2: median (quartiles)")
    for name in ["GEMM 2048"] + [case.name for case in cases]:
        one, two = np.array(times[(name, 1)]), np.array(times[(name, 2)])
        ratios = one / two
        print(f"{name:<14} {np.median(one) * 1e3:11.2f} {np.median(two) * 1e3:12.2f} "
              f"{np.median(one) / np.median(two):5.2f}x  {np.median(ratios):.2f} "
              f"({np.percentile(ratios, 25):.2f}-{np.percentile(ratios, 75):.2f})")


if __name__ == "__main__":
    main()
