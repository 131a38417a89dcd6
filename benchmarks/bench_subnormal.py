"""Backward with a gradient only at the last hidden state against a dense one.

A classifier on ``h_n`` sends its gradient in at the last step only; through a long
recurrence it decays into the subnormal range, where x86 arithmetic is 10-100x slower.
lstmcy's kernels flush subnormals to zero (``lstmcy.set_flush_denormals``), so the sparse
backward should cost about what the dense one does. For each dtype this times, side by
side in interleaved rounds (``timing.measure``), the backward with only ``dh`` (``dy`` zero) and with
a dense ``dy``, with subnormals flushed (the default) and kept. The target: the sparse
backward at most 1.3x the dense one with the default setting.

Usage (the OpenBLAS variables unset in this command only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_subnormal.py \\
        --out benchmarks/results/subnormal.md
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _env import reexec_without_openblas_overrides  # noqa: E402  (no numpy import)

if __name__ == "__main__":
    reexec_without_openblas_overrides()

import numpy as np  # noqa: E402

import lstmcy  # noqa: E402
from timing import measure  # noqa: E402

TARGET = 1.3


def make_call(T, B, I, H, dtype, seed=0):
    """Inputs, weights, a forward's cache, and the two upstream gradients: only dh at the
    last step (a classifier on h_n), or a dense dy."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    bound = 1.0 / np.sqrt(H)
    params = [rng.uniform(-bound, bound, s).astype(dtype)
              for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    _, _, _, cache = lstmcy.lstm_forward(x, None, params)
    zero_dy = np.zeros((T, B, H), dtype)
    dense_dy = rng.standard_normal((T, B, H)).astype(dtype)
    dh = rng.standard_normal((1, B, H)).astype(dtype)
    return x, params, cache, {"last state": (zero_dy, dh), "dense": (dense_dy, None)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="250,32,1,32", help="T,B,I,H")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved rounds")
    parser.add_argument("--out", default=None, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    T, B, I, H = (int(v) for v in args.shape.split(","))
    rows = []
    for dtype in (np.float32, np.float64):
        x, params, cache, grads = make_call(T, B, I, H, dtype)
        runs = {}
        for flush in (True, False):
            for kind, (dy, dh) in grads.items():
                def run(dy=dy, dh=dh, flush=flush):
                    lstmcy.set_flush_denormals(flush)
                    lstmcy.lstm_backward(x, None, params, dy, dh, None, *cache.saved())
                runs[f"{kind}, flush={flush}"] = run
        times = measure(runs, repeats=args.repeats)
        lstmcy.set_flush_denormals(True)
        for flush in (True, False):
            sparse = times[f"last state, flush={flush}"]["median"]
            dense = times[f"dense, flush={flush}"]["median"]
            rows.append((np.dtype(dtype).name, "flushed (default)" if flush else "kept (IEEE)",
                         sparse * 1e3, dense * 1e3, sparse / dense))
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    lines = [f"# Backward with the gradient only at h_n against a dense one, (T,B,I,H) = ({T},{B},{I},{H})",
             "", f"`python benchmarks/bench_subnormal.py --shape {args.shape}`; medians of "
             f"{args.repeats} interleaved rounds; lstmcy's default threads; "
             f"load average {load} at the end. Target: at most {TARGET}x with the default setting.", "",
             "| dtype | subnormals | only dh ms | dense dy ms | ratio | target |",
             "|---|---|---|---|---|---|"]
    for dtype, mode, sparse, dense, ratio in rows:
        verdict = ("met" if ratio <= TARGET else "NOT met") if mode.startswith("flushed") else "-"
        lines.append(f"| {dtype} | {mode} | {sparse:.2f} | {dense:.2f} | {ratio:.2f}x | {verdict} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
