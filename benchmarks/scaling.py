"""Predicted scaling to N threads, from the task graph of real calls replayed on N workers.

A machine with 2 cores cannot time 8 or 32 threads. The kernels' work is a task graph,
though, and each task's duration can be measured: for each N the calls run with the
schedule lstmcy uses on N threads (its row groups, unit parts and packing pieces), on one
thread, with the kernels tracing every task (``LSTMPlan.trace``). The graph is then
replayed on N workers the way the kernels run it (list scheduling: the next task in list
order goes to the first worker free, which waits there for the task's inputs), and the
predicted time is the replay's makespan. For each shape it reports the predicted speed-up
over one thread, the critical path (span: the recurrence and what waits for it) and the
work per worker (total / N), and which of the two bounds the call.

What the model leaves out: the cores' shared caches and memory bandwidth (tasks are timed
alone on one core), the wake-up of sleeping workers, and frequency changes with the number
of busy cores. Measured 1 -> 2 thread speed-ups (the same traced calls really run on two
threads) are printed beside the prediction for N = 2 as a check of the model.

Usage (the OpenBLAS variables unset in this command only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/scaling.py \\
        --shapes small-50x32,large-256,braun --json benchmarks/results/scaling.json
"""
import argparse
import json
import os
import sys
from collections import defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import lstmcy  # noqa: E402
from lstmcy import _core, _schedule  # noqa: E402
from cases import CASES, lstm_kwargs, make_inputs  # noqa: E402

# Task kinds (src/lstmcy/_layer.pxd, TaskKind)
PACK, PROJECT, RECURRENCE, UNIT_STEP, GATHER_X, GATHER_H, WEIGHTS, DX = range(8)
KIND, DIRECTION, I, J, WORKER, START, END, ORDER = range(8)
COUNTS = (1, 2, 4, 8, 16, 32)


def traced_calls(case, inputs, n_model, n_run, repeats):
    """Per kernel call: its kind, the schedule for ``n_model`` threads, and the median
    duration of each task entry over ``repeats`` runs on ``n_run`` threads; also the median
    makespan of each call."""
    T, B, H, D = case.T, case.B, case.H, case.D
    forward = _schedule.forward_schedule.__wrapped__
    backward = _schedule.backward_schedule.__wrapped__
    saved = (_core.forward_schedule, _core.backward_schedule)
    _core.forward_schedule = lambda T_, B_, H_, D_, n: forward(T_, B_, H_, D_, n_model)
    _core.backward_schedule = lambda T_, B_, H_, D_, n: backward(T_, B_, H_, D_, n_model)
    try:
        plan = lstmcy.LSTMPlan(n_threads=n_run)
        kw = lstm_kwargs(case)
        hx = (inputs["h0"], inputs["c0"])
        runs = []
        for repeat in range(repeats + 1):
            plan.trace = []
            y, h_n, c_n, cache = plan.forward(inputs["x"], hx, inputs["params"], **kw)
            plan.backward(inputs["x"], hx, inputs["params"], inputs["dy"], inputs["dh"],
                          inputs["dc"], *cache.saved(), **kw)
            if repeat:  # the first run warms up
                runs.append(plan.trace)
    finally:
        _core.forward_schedule, _core.backward_schedule = saved
    calls = []
    for k, (kind, layer, first) in enumerate(runs[0]):
        durations = np.median([run[k][2][:, END] - run[k][2][:, START] for run in runs], axis=0)
        spans = [run[k][2][:, END].max() - run[k][2][:, START].min() for run in runs]
        schedule = (forward if kind == "forward" else backward)(T, B, H, D, n_model)
        calls.append(dict(kind=kind, layer=layer, entries=first, durations=durations,
                          makespan=float(np.median(spans)) if len(first) else 0.0,
                          schedule=schedule))
    return calls


def _chunk_of(step, schedule, n_chunks):
    return 0 if step < schedule.first else min(n_chunks - 1, 1 + (step - schedule.first) // schedule.chunk)


def graph(call, T):
    """The call's task graph, rebuilt from the kernels' rules: per node (a trace entry) its
    duration and dependencies, the listed tasks in list order (each a sequence of nodes
    one worker runs) and the unit steps."""
    entries, durations, schedule = call["entries"], call["durations"], call["schedule"]
    by_key = {}
    for n, e in enumerate(entries):
        by_key[(int(e[KIND]), int(e[DIRECTION]), int(e[I]), int(e[J]))] = n
    deps = defaultdict(list)
    listed = defaultdict(list)  # list position -> nodes in run order
    units = []
    groups_done = defaultdict(list)  # (direction, chunk) -> recurrence nodes ending it
    for n, e in enumerate(entries):
        kind, d, i, j, order = (int(e[f]) for f in (KIND, DIRECTION, I, J, ORDER))
        if kind == UNIT_STEP:
            units.append(n)
        else:
            listed[order].append(n)
        if kind == RECURRENCE:
            groups_done[d, j].append(n)
    packs = defaultdict(list)
    for n, e in enumerate(entries):
        if int(e[KIND]) == PACK:
            packs[int(e[DIRECTION])].append(n)
    n_chunks = 1 + max((int(e[J]) for e in entries if int(e[KIND]) == RECURRENCE), default=0)
    for order, nodes in listed.items():
        nodes.sort(key=lambda n: entries[n][START])  # a recurrence's chunks in run order
        for previous, n in zip(nodes, nodes[1:]):
            deps[n].append(previous)
    for n, e in enumerate(entries):
        kind, d, i, j = (int(e[f]) for f in (KIND, DIRECTION, I, J))
        if kind == RECURRENCE:
            if call["kind"] == "forward":
                deps[n].append(by_key[(PROJECT, 0, j, 0)])
            if listed[int(e[ORDER])][0] == n:
                deps[n].extend(packs[d])
        elif kind == UNIT_STEP:
            t = T - 1 - i if d == 1 else i
            deps[n].append(by_key[(PROJECT, 0, t // schedule.piece_steps, 0)])
            deps[n].extend(m for m in units if int(entries[m][DIRECTION]) == d
                           and int(entries[m][I]) == i - 1)
            if i == 0:
                deps[n].extend(packs[d])
        elif kind == WEIGHTS:
            deps[n].extend(groups_done[d, i])
            deps[n].append(by_key[(GATHER_H, d, i, 0)])
            deps[n].extend(m for m, f in enumerate(entries) if int(f[KIND]) == GATHER_X)
            if i > 0:
                deps[n].append(by_key[(WEIGHTS, d, i - 1, j)])
        elif kind == DX:
            t_lo, t_hi = i * schedule.dx_steps, min(T, (i + 1) * schedule.dx_steps)
            for direction in {int(f[DIRECTION]) for f in entries if int(f[KIND]) == RECURRENCE}:
                step = T - t_lo - 1 if direction == 0 else t_hi - 1
                deps[n].extend(groups_done[direction, _chunk_of(step, schedule, n_chunks)])
    tasks = [listed[k] for k in sorted(listed)]
    return dict(entries=entries, durations=durations, deps=deps, tasks=tasks, units=units)


def replay(g, workers):
    """Makespan of graph ``g`` on ``workers`` workers taking the listed tasks in order; the
    unit steps, if any, afterwards, each part of a direction on its own worker (the
    kernels' threads take their own part of each step first)."""
    entries, durations, deps = g["entries"], g["durations"], g["deps"]
    done = {}
    free = [0.0] * workers

    def finish(n, at):
        start = max([at] + [done[m] for m in deps[n]])
        done[n] = start + float(durations[n])
        return done[n]

    for nodes in g["tasks"]:
        w = min(range(workers), key=lambda k: free[k])
        t = free[w]
        for n in nodes:
            t = finish(n, t)
        free[w] = t
    units = g["units"]
    if units:
        directions = 1 + max(int(entries[n][DIRECTION]) for n in units)
        for n in sorted(units, key=lambda n: (int(entries[n][I]), int(entries[n][DIRECTION]),
                                              int(entries[n][J]))):
            d, part = int(entries[n][DIRECTION]), int(entries[n][J])
            w = (part * directions + d) % workers
            free[w] = finish(n, free[w])
    return max(free)


def span(g):
    """The critical path: the replay on as many workers as there are tasks."""
    return replay(g, max(1, len(g["tasks"]) + len(g["units"])))


def model_case(case, repeats):
    inputs = make_inputs(case)
    rows = []
    for n in COUNTS:
        calls = traced_calls(case, inputs, n, 1, repeats)
        graphs = [graph(c, case.T) for c in calls]
        predicted = sum(replay(g, n) for g in graphs)
        critical = sum(span(g) for g in graphs)
        work = sum(float(np.sum(c["durations"])) for c in calls)
        rows.append(dict(n=n, predicted_ns=predicted, span_ns=critical, work_ns=work,
                         bound="span" if critical >= work / n else "work"))
    for row in rows:
        row["speedup"] = rows[0]["predicted_ns"] / row["predicted_ns"]
    # The check: the same schedules really run on 1 and 2 threads.
    measured = {n: sum(c["makespan"] for c in traced_calls(case, inputs, n, n, repeats))
                for n in (1, 2)}
    return dict(case=case.name, shape=case.shape_label, dtype=case.dtype, rows=rows,
                measured_1_to_2=measured[1] / measured[2])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="small-50x32,large-256,braun")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    results = [model_case(by_name[name], args.repeats) for name in args.shapes.split(",")]
    print(f"load average {load} at the start; kernels only (forward + backward)")
    header = " ".join(f"{n:>6}" for n in COUNTS)
    print(f"{'shape':<24} {'dtype':<8} {header}   measured 1->2   bound at 8, 32")
    for r in results:
        speedups = " ".join(f"{row['speedup']:6.2f}" for row in r["rows"])
        bounds = {row["n"]: row["bound"] for row in r["rows"]}
        print(f"{r['shape']:<24} {r['dtype']:<8} {speedups}   {r['measured_1_to_2']:6.2f}"
              f"          {bounds[8]}, {bounds[32]}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(load=load, results=results), fh, indent=1)


if __name__ == "__main__":
    main()
