#!/usr/bin/env python
"""Where a backward's time goes, per kind of task: each kind's busy time on each thread,
its rate where it is a product, and the threads' idle time, from the kernels' own trace
(``LSTMPlan.trace``).

Time a case's backward on ``--threads`` threads (median of ``--repeats`` traced runs
after one warm-up) and print, per kind of task, the summed busy time, its share of
``threads x makespan``, and for the products (the recurrence's ``dh W_hh``, the weight
gradients, dx) the rate they ran at. ``--avx2-proxy`` runs the AVX2 code paths (see
``benchmarks/_env.py``). Like ``run.py`` it re-executes itself without
``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE``::

    python tools/backward_tasks.py --case deepbench-512 --case braun
    python tools/backward_tasks.py --case braun --avx2-proxy
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from _env import reexec_without_openblas_overrides, use_avx2_proxy  # noqa: E402

reexec_without_openblas_overrides(__name__)
use_avx2_proxy(sys.argv, __name__)

import argparse  # noqa: E402
import collections  # noqa: E402

import numpy as np  # noqa: E402

import lstmcy  # noqa: E402
from cases import CASES, lstm_kwargs, make_inputs  # noqa: E402

# Trace entry columns and task kinds as src/lstmcy/_layer.pxd names them.
KIND, DIRECTION, I_, J_, WORKER, START, END, PLACE = range(8)
TASK_NAMES = {0: "pack", 1: "project", 2: "recurrence", 3: "unit step", 4: "gather",
              5: "weights (dW, db)", 6: "dx", 7: "finish (lane sums)"}


def product_flops(case, layer, name):
    """Multiply-adds x 2 of a backward layer call's ``name`` products (None: not a
    product)."""
    G = 4 * case.H
    rows = case.T * case.B * case.D
    in_size = case.I if layer == 0 else case.D * case.H
    return {"recurrence": 2 * rows * case.H * G,
            "weights (dW, db)": 2 * rows * (in_size + case.H) * G,
            "dx": 2 * rows * in_size * G}.get(name)


def split(case, threads, repeats):
    inputs = make_inputs(case)
    plan = lstmcy.LSTMPlan(n_threads=threads)
    kw = lstm_kwargs(case)
    hx = (inputs["h0"], inputs["c0"])
    cache = plan.forward(inputs["x"], hx, inputs["params"], **kw)[3]
    runs = []
    for repeat in range(repeats + 1):
        plan.trace = []
        plan.backward(inputs["x"], hx, inputs["params"], inputs["dy"], inputs["dh"],
                      inputs["dc"], *cache.saved(), **kw)
        if repeat:
            runs.append([c for c in plan.trace if c[0] == "backward"])
    rows = []
    for k, (_, layer, _) in enumerate(runs[0]):
        busy = collections.defaultdict(list)
        spans = []
        for run in runs:
            e = run[k][2]
            spans.append((e[:, END].max() - e[:, START].min()) * 1e-9)
            per_kind = collections.Counter()
            for row in e:
                per_kind[TASK_NAMES[int(row[KIND])]] += (row[END] - row[START]) * 1e-9
            for name in TASK_NAMES.values():
                busy[name].append(per_kind[name])
        span = float(np.median(spans))
        rows.append((layer, span, {name: float(np.median(v)) for name, v in busy.items()}))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--avx2-proxy", action="store_true")
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    from lstmcy._engine.dispatch import kernels
    print(f"kernels {kernels.__name__}, {args.threads} threads, median of {args.repeats}")
    for name in args.case:
        case = by_name[name]
        for layer, span, busy in split(case, args.threads, args.repeats):
            total = args.threads * span
            print(f"\n{name} ({case.T}, {case.B}, {case.I}, {case.H}) layer {layer}: "
                  f"makespan {span * 1e3:.2f} ms, {args.threads} threads")
            for kind, seconds in sorted(busy.items(), key=lambda kv: -kv[1]):
                if not seconds:
                    continue
                flops = product_flops(case, layer, kind)
                rate = f"{flops / seconds / 1e9:7.1f} GF/s a thread" if flops else ""
                print(f"  {kind:20s} {seconds * 1e3:8.2f} ms  {100 * seconds / total:5.1f} %  "
                      f"{rate}")
            idle = total - sum(busy.values())
            print(f"  {'idle (waits)':20s} {idle * 1e3:8.2f} ms  {100 * idle / total:5.1f} %")


if __name__ == "__main__":
    main()
