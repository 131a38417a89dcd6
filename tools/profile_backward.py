#!/usr/bin/env python
"""Run one case's LSTM backward (or forward) in a loop, for a profiler to watch.

The inputs are those of ``benchmarks/run.py`` (same cases, same seed). The loop
runs for ``--seconds`` (or ``--iterations``) and prints the median time per call.
Like ``run.py`` it re-executes itself without ``OPENBLAS_CORETYPE`` /
``OPENBLAS_L2_SIZE``; under a profiler that follows a process id, unset them in
the command instead (``env -u ...``) so that no re-exec happens.

Examples::

    # which cases exist
    python tools/profile_backward.py --list

    # py-spy (pip install py-spy): flame graph with the native frames (Cython, OpenBLAS)
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE py-spy record --native --rate 250 \\
        -o /tmp/bwd-small.svg -- python tools/profile_backward.py --case small-50x32 --seconds 15
    # same, as text (one line per unique stack and its sample count) for grepping:
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE py-spy record --native --rate 250 -f raw \\
        -o /tmp/bwd-small.txt -- python tools/profile_backward.py --case small-50x32 --seconds 15
    # live view
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE py-spy top -- python tools/profile_backward.py --case braun

    # perf: where the cycles go by shared object and symbol (OpenBLAS kernels, Cython, libm)
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE perf record -F 999 -g -o /tmp/perf.data -- \\
        python tools/profile_backward.py --case braun --seconds 10
    perf report -i /tmp/perf.data --no-children --sort dso,symbol --stdio | head -60

    # callgrind: exact instruction counts (slow: ~50x; use a small case and few iterations)
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE valgrind --tool=callgrind \\
        --callgrind-out-file=/tmp/cg.out python tools/profile_backward.py --case tiny --iterations 20
    callgrind_annotate /tmp/cg.out | head -40

``--torch`` profiles PyTorch's backward of the same case instead (for comparison);
``--what fwd`` the training forward; ``--threads N`` limits BLAS/OpenMP threads.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # run.py's cases and setups
from _env import reexec_without_openblas_overrides  # noqa: E402

if __name__ == "__main__":
    reexec_without_openblas_overrides()

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description="Loop one case's backward for profiling.")
    parser.add_argument("--case", default="small-50x32", help="a case name of run.py (--list)")
    parser.add_argument("--what", choices=("bwd", "fwd"), default="bwd")
    parser.add_argument("--torch", action="store_true", help="run PyTorch instead of lstmcy")
    parser.add_argument("--padded", action="store_true",
                        help="packed cases: run the padded T x B batch instead of the packed one")
    parser.add_argument("--seconds", type=float, default=10.0, help="loop this long (default 10)")
    parser.add_argument("--iterations", type=int, default=None, help="loop this many calls instead")
    parser.add_argument("--threads", type=int, default=None, help="BLAS/OpenMP and torch threads")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)

    from cases import CASES

    if args.list:
        for c in CASES:
            print(f"{c.name:18s} {c.shape_label:28s} {c.dtype}{' packed' if c.packed else ''}")
        return 0
    matches = [c for c in CASES if c.name == args.case]
    if not matches:
        parser.error(f"unknown case {args.case!r}; see --list")
    case = matches[0]

    import threadpoolctl

    from cases import make_inputs
    from run import lstmcy_setup, torch_setup

    if args.torch:  # torch (and its OpenMP pool) only when profiling it
        import torch
        if args.threads:
            torch.set_num_threads(args.threads)
    limiter = threadpoolctl.threadpool_limits(args.threads) if args.threads else None  # noqa: F841
    inp = make_inputs(case)
    packed = case.packed and not args.padded
    setup = torch_setup if args.torch else lstmcy_setup
    forward, backward = setup(case, inp, packed=packed)
    fn = backward if args.what == "bwd" else forward
    fn()  # warm-up
    times = []
    deadline = time.perf_counter() + args.seconds
    while True:
        start = time.perf_counter()
        fn()
        end = time.perf_counter()
        times.append(end - start)
        if args.iterations is not None:
            if len(times) >= args.iterations:
                break
        elif end >= deadline:
            break
    who = "torch" if args.torch else "lstmcy"
    print(f"{who} {args.what} {case.name} {case.shape_label} {case.dtype}"
          f"{' packed' if packed else ''}: {len(times)} calls, median "
          f"{statistics.median(times) * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
