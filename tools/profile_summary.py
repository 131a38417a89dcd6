#!/usr/bin/env python
"""Summarise a ``py-spy record --native -f raw`` profile of ``profile_backward.py``.

Only samples taken inside the profiled call are counted (stacks containing the
``--marker`` frame, by default the closure ``backward`` of ``run.py``). They are
grouped by where the leaf frame is: OpenBLAS GEMM micro-kernels, OpenBLAS packing
(copy) routines, lstmcy's Cython kernels (by source line), OpenMP runtime (waiting at
barriers), libc (memcpy/memset; py-spy cannot name libc's symbols), numpy, CPython.

Usage::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE py-spy record --native --rate 250 -f raw \\
        -o /tmp/bwd.txt -- python tools/profile_backward.py --case braun --seconds 15
    python tools/profile_summary.py /tmp/bwd.txt
"""
import argparse
import collections
import re
import sys


def category(leaf):
    low = leaf.lower()
    if "openblas" in low or re.search(r"[sd]gemm|[sd]gemv|[sd]axpy", low):
        if "kernel" in low:
            return "OpenBLAS GEMM micro-kernel"
        if "copy" in low:
            return "OpenBLAS packing (itcopy/oncopy...)"
        return "OpenBLAS other (driver, threading)"
    if "_lstm" in low or "__pyx" in low or ".pyx:" in low:
        return "lstmcy Cython kernels (elementwise, loops)"
    if "libgomp" in low:
        return "OpenMP runtime (libgomp: barriers, spinning)"
    if "libm." in low or "libmvec" in low:
        return "libm (exp, tanh)"
    if "libc.so" in low:
        return "libc (memcpy/memset/malloc, unresolved)"
    if "numpy" in low or "multiarray" in low:
        return "numpy C code"
    if ".py:" in leaf or "(<frozen" in leaf:
        return "Python code"
    if "python" in low:
        return "CPython interpreter"
    if "kernel" in low or "[k]" in low:
        return "kernel"
    return "other"


def summarise(lines, marker="backward (run.py"):
    total = outside = 0
    cats = collections.Counter()
    leaves = collections.Counter()
    frames_py = collections.Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if not any(marker in f for f in frames):
            outside += n
            continue
        total += n
        leaf = re.sub(r"^0x[0-9a-f]+ ", "", frames[-1])
        cats[category(leaf)] += n
        leaves[leaf] += n
        python = [f for f in frames if ".py:" in f and marker not in f]
        frames_py[python[-1] if python else "-"] += n
    return total, outside, cats, leaves, frames_py


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", help="py-spy raw output (-f raw)")
    parser.add_argument("--marker", default="backward (run.py",
                        help="count only stacks with a frame containing this (default: the timed call; "
                             "use 'forward (run.py' for --what fwd)")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    with open(args.raw) as fh:
        total, outside, cats, leaves, frames_py = summarise(fh, args.marker)
    if not total:
        print(f"no sample contains {args.marker!r}", file=sys.stderr)
        return 1
    print(f"{total} samples in the profiled call ({outside} outside: start-up, set-up)")
    print("by category:")
    for name, n in cats.most_common():
        print(f"  {100 * n / total:5.1f}%  {name}")
    print("top leaf frames:")
    for name, n in leaves.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {name[:150]}")
    print("deepest Python frame:")
    for name, n in frames_py.most_common(args.top // 2):
        print(f"  {100 * n / total:5.1f}%  {name[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
