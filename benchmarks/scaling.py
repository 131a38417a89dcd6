"""Predicted scaling to N threads, from the task graph of real calls replayed on N workers.

A 2-core machine cannot time 8 or 32 threads, but the kernels' work is a task graph whose
tasks can be timed: for each N the calls run on one thread with the schedule lstmcy uses
on N threads, tracing every task (``LSTMPlan.trace``), and the graph is replayed on N
workers as the kernels take tasks (list scheduling). Reported per shape: the predicted
speed-up over one thread, the span (the recurrence and what waits for it) and the work per
worker, and which bounds the call; a units split's steps also count the handoff measured
on two threads (:func:`handoff_ns`), and the measured 1 -> 2 speed-up is printed beside
the prediction as a check. Left out: shared caches and memory bandwidth, workers' wake-up,
frequency changes. Usage::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/scaling.py \\
        --shapes small-50x32,large-256,braun,bidir2-large,deepbench-512 \\
        --json benchmarks/results/scaling.json
"""
import argparse
from collections import defaultdict

import numpy as np

import lstmcy
from lstmcy._engine import schedule as _schedule
from lstmcy._engine import threads as _threads
from cases import CASES, make_inputs, training_pass
from machine import result_stamp, update_result_file
from report import scaling_table, text_table

# Task kinds (src/lstmcy/_layer.pxd, TaskKind)
PACK, PROJECT, RECURRENCE, UNIT_STEP, GATHER, WEIGHTS, DX, FINISH = range(8)
KIND, DIRECTION, I, J, WORKER, START, END, ORDER = range(8)
COUNTS = (1, 2, 4, 8, 16, 32)


def _units_schedule(schedule_of):
    """``schedule_of`` with the recurrence split by units, a part per thread and direction."""
    def schedule(T, B, I, H, D, n, projected=False, **machine):
        own = schedule_of(T, B, I, H, D, n, projected, **machine)
        parts = min(max(1, n // D), max(1, H // 16))
        return own._replace(split=_schedule.SPLIT_UNITS, groups=parts, pack_pieces=1)
    return schedule


def traced_calls(case, inputs, n_model, n_run, repeats, units=False):
    """Per kernel call: its kind, the schedule for ``n_model`` threads (``units``: split by
    units), and the median duration of each task entry over ``repeats`` runs on ``n_run``
    threads; also the median makespan of each call."""
    forward = _schedule.forward_schedule
    backward = _schedule.backward_schedule
    if units:
        forward, backward = _units_schedule(forward), _units_schedule(backward)
    # The schedules of n_model threads, whatever the thread count of the run.
    policy = _schedule.SchedulePolicy(
        lambda T, B, I, H, D, n, projected=False, itemsize=4: forward(
            T, B, I, H, D, n_model, projected, itemsize=itemsize),
        lambda T, B, I, H, D, n, projected=False, small_gemms=False: backward(
            T, B, I, H, D, n_model, projected, small_gemms=small_gemms),
        cap_at_cpus=False)
    plan = lstmcy.LSTMPlan(n_threads=n_run, schedules=policy)
    runs = []
    for repeat in range(repeats + 1):
        plan.trace = []
        training_pass(case, inputs, plan)
        if repeat:  # the first run warms up
            runs.append(plan.trace)
    calls = []
    for k, (kind, layer, first) in enumerate(runs[0]):
        durations = np.median([run[k][2][:, END] - run[k][2][:, START] for run in runs], axis=0)
        spans = [run[k][2][:, END].max() - run[k][2][:, START].min() for run in runs]
        in_size = case.I if layer == 0 else case.D * case.H
        if kind == "forward":
            schedule = forward(case.T, case.B, in_size, case.H, case.D, n_model)
        else:
            schedule = backward(case.T, case.B, in_size, case.H, case.D, n_model,
                                small_gemms=_threads.blas_small_gemms())
        calls.append(dict(kind=kind, layer=layer, entries=first, durations=durations,
                          makespan=float(np.median(spans)) if len(first) else 0.0,
                          schedule=schedule))
    return calls


def _chunk_of(step, schedule, n_chunks):
    """The backward chunk holding processing step ``step``."""
    return 0 if step < schedule.first else min(n_chunks - 1, 1 + (step - schedule.first) // schedule.chunk)


def graph(call, T):
    """The call's task graph, rebuilt from the kernels' rules: per node (a trace entry) its
    duration and dependencies, the listed tasks in list order (each a sequence of nodes
    one worker runs), the unit steps, and the backward's gradients (dx pieces, and per
    chain of dW, a lane of a block, its chunks with each chunk's gather; per block the
    addition of its lanes' sums)."""
    entries, durations, schedule = call["entries"], call["durations"], call["schedule"]
    by_key = {}
    for n, e in enumerate(entries):
        by_key[(int(e[KIND]), int(e[DIRECTION]), int(e[I]), int(e[J]))] = n
    deps = defaultdict(list)
    listed = defaultdict(list)  # list position -> nodes in run order
    units, dx, weights, finishes = [], [], defaultdict(dict), {}
    chunk_ends = defaultdict(list)  # (direction, chunk) -> the recurrence nodes ending it
    packs = defaultdict(list)
    for n, e in enumerate(entries):
        kind, d, i, j, order = (int(e[f]) for f in (KIND, DIRECTION, I, J, ORDER))
        if kind == UNIT_STEP:
            units.append(n)
        elif kind == DX:
            dx.append(n)
        elif kind == WEIGHTS:  # chain (direction, lane, block) of chunk i
            weights[d, i % schedule.lanes, j][i] = n
        elif kind == FINISH:
            finishes[d, i] = n
        elif kind != GATHER:
            listed[order].append(n)
        if kind == RECURRENCE:
            chunk_ends[d, j].append(n)
        if kind == PACK:
            packs[d].append(n)
    if call["kind"] == "backward":
        first, chunk = schedule.first, schedule.chunk
        n_chunks = 1 if T <= first else 1 + -(-(T - first) // chunk)
        for n in units:  # a units split: the parts of a chunk's last step end it
            step = int(entries[n][I])
            if step < T and (step + 1 == T or _chunk_of(step + 1, schedule, n_chunks)
                             != _chunk_of(step, schedule, n_chunks)):
                chunk_ends[int(entries[n][DIRECTION]), _chunk_of(step, schedule, n_chunks)].append(n)
    else:
        n_chunks = 1
    for nodes in listed.values():
        nodes.sort(key=lambda n: entries[n][START])  # a recurrence's chunks in run order
        for previous, n in zip(nodes, nodes[1:]):
            deps[n].append(previous)
    directions = sorted({int(e[DIRECTION]) for e in entries if int(e[KIND]) in (RECURRENCE, UNIT_STEP)})
    for n, e in enumerate(entries):
        kind, d, i, j = (int(e[f]) for f in (KIND, DIRECTION, I, J))
        if kind == RECURRENCE:
            if call["kind"] == "forward":
                deps[n].append(by_key[(PROJECT, 0, j, 0)])
            if listed[int(e[ORDER])][0] == n:
                deps[n].extend(packs[d])
        elif kind == UNIT_STEP:
            if call["kind"] == "forward":
                t = T - 1 - i if d == 1 else i
                deps[n].append(by_key[(PROJECT, 0, t // schedule.piece_steps, 0)])
            deps[n].extend(m for m in units if int(entries[m][DIRECTION]) == d
                           and int(entries[m][I]) == i - 1)
            if i == 0:
                deps[n].extend(packs[d])
        elif kind == PROJECT and call["kind"] == "forward" and schedule.packed_projection:
            # from w_ih^T packed once: every direction's pack tasks first
            deps[n].extend(m for direction in sorted(packs) for m in packs[direction])
        elif kind == WEIGHTS:
            deps[n].extend(chunk_ends[d, i])
        elif kind == DX:
            t_lo, t_hi = i * schedule.dx_steps, min(T, (i + 1) * schedule.dx_steps)
            for direction in directions:
                step = T - t_lo - 1 if direction == 0 else t_hi - 1
                deps[n].extend(chunk_ends[direction, _chunk_of(step, schedule, n_chunks)])
    gathers = {(int(e[DIRECTION]), int(e[I])): n for n, e in enumerate(entries)
               if int(e[KIND]) == GATHER}
    chains = sorted(weights)
    blocks = [[weights[key][c] for c in sorted(weights[key])] for key in chains]
    finish_of = [finishes.get((key[0], key[2])) for key in chains]

    def steps_needed(n):  # the kernels take dx pieces in this order
        t_lo = int(entries[n][I]) * schedule.dx_steps
        t_hi = min(T, t_lo + schedule.dx_steps)
        return max(T - t_lo if d == 0 else t_hi for d in directions), int(entries[n][I])

    return dict(entries=entries, durations=durations, deps=deps,
                tasks=[listed[k] for k in sorted(listed)], units=units,
                dx=sorted(dx, key=steps_needed), blocks=blocks, gathers=gathers,
                finish_of=finish_of)


def replay(g, workers, handoff=0.0):
    """Makespan of graph ``g`` on ``workers`` workers, as the kernels run it: the listed
    tasks in order, each to the first worker free (which waits there for its inputs); the
    unit steps, each part of a direction on its own worker and ``handoff`` ns longer than
    traced (see :func:`handoff_ns`); then the backward's
    gradients, each worker taking a ready dx piece first, else the next ready chunk of a
    block nobody holds (its own block first, kept while its chunks are ready and no dx
    piece is), else waiting until something is ready. The worker that ends a block's last
    chain adds the block's lanes."""
    entries, durations, deps = g["entries"], g["durations"], g["deps"]
    done = {}
    free = [0.0] * workers

    def finish(n, at, extra=0.0):
        start = max([at] + [done[m] for m in deps[n]])
        done[n] = start + float(durations[n]) + extra
        return done[n]

    def ready(n):
        return max([0.0] + [done[m] for m in deps[n]])

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
            free[w] = finish(n, free[w], handoff)
    dx, blocks = list(g["dx"]), g["blocks"]
    if dx or blocks:
        next_chunk = [0] * len(blocks)
        held_until = [0.0] * len(blocks)
        gathered = set()
        own = [w % max(1, len(blocks)) for w in range(workers)]

        finish_of = g["finish_of"]

        def run_chunk(b, t):
            n = blocks[b][next_chunk[b]]
            key = (int(entries[n][DIRECTION]), int(entries[n][I]))
            if key not in gathered and key in g["gathers"]:
                gathered.add(key)
                t += float(durations[g["gathers"][key]])
            next_chunk[b] += 1
            done[n] = t + float(durations[n])
            f = finish_of[b]
            if f is not None and all(next_chunk[o] == len(blocks[o])
                                     for o in range(len(blocks)) if finish_of[o] == f):
                done[f] = done[n] + float(durations[f])
                return done[f]
            return done[n]

        active = set(range(workers))
        while active:
            w = min(active, key=lambda k: free[k])
            t = free[w]
            if dx and ready(dx[0]) <= t:
                free[w] = finish(dx.pop(0), t)
                continue
            chosen = None
            for j in range(len(blocks)):
                b = (own[w] + j) % len(blocks)
                if (next_chunk[b] < len(blocks[b]) and held_until[b] <= t
                        and ready(blocks[b][next_chunk[b]]) <= t):
                    chosen = b
                    break
            if chosen is not None:
                while True:
                    t = run_chunk(chosen, t)
                    if (next_chunk[chosen] >= len(blocks[chosen])
                            or ready(blocks[chosen][next_chunk[chosen]]) > t
                            or (dx and ready(dx[0]) <= t)):
                        break
                held_until[chosen] = t
                own[w] = chosen
                free[w] = t
                continue
            if not dx and not any(next_chunk[b] < len(blocks[b]) and held_until[b] <= t
                                  for b in range(len(blocks))):
                # Nothing left, or every block left is held by another worker: in the kernels
                # this worker returns; here it would only wait for the holder, so it stops too.
                active.discard(w)
                continue
            waiting = [ready(dx[0])] if dx else []
            waiting += [max(ready(blocks[b][next_chunk[b]]), held_until[b])
                        for b in range(len(blocks)) if next_chunk[b] < len(blocks[b])]
            free[w] = max(t, min(waiting))
    return max(free)


def handoff_ns(case, inputs, repeats):
    """What a unit step costs on two threads beyond its duration traced on one: the wait
    for the other part of the step before, and the other core's gate gradients (or h) it
    reads. Measured as the units split on two threads really run, less its replay on two
    workers, per unit step of a worker (all of the difference counted against the unit
    steps; none when the replay is the slower)."""
    traced = traced_calls(case, inputs, 2, 1, repeats, units=True)
    graphs = [graph(c, case.T) for c in traced]
    predicted = sum(replay(g, 2) for g in graphs)
    measured = sum(c["makespan"] for c in traced_calls(case, inputs, 2, 2, repeats, units=True))
    steps_per_worker = sum(len(g["units"]) for g in graphs) / 2
    return max(0.0, (measured - predicted) / max(steps_per_worker, 1))


def model_case(case, repeats):
    inputs = make_inputs(case)
    handoff = handoff_ns(case, inputs, repeats)
    rows = []
    for n in COUNTS:
        calls = traced_calls(case, inputs, n, 1, repeats)
        graphs = [graph(c, case.T) for c in calls]
        predicted = sum(replay(g, n, handoff) for g in graphs)
        critical = sum(replay(g, max(1, len(g["tasks"]) + len(g["units"]) + len(g["dx"])
                                     + len(g["blocks"])), handoff) for g in graphs)
        work = sum(float(np.sum(c["durations"])) for c in calls)
        split = "units" if any(c["schedule"].split == _schedule.SPLIT_UNITS for c in calls) else "rows"
        rows.append(dict(n=n, predicted_ns=predicted, span_ns=critical, work_ns=work, split=split,
                         bound="span" if critical >= work / n else "work"))
    for row in rows:
        row["speedup"] = rows[0]["predicted_ns"] / row["predicted_ns"]
    # The check: the same schedules really run on 1 and 2 threads.
    measured = {n: sum(c["makespan"] for c in traced_calls(case, inputs, n, n, repeats))
                for n in (1, 2)}
    return dict(case=case.name, shape=case.shape_label, dtype=case.dtype, rows=rows,
                measured_1_to_2=measured[1] / measured[2], handoff_us=handoff / 1e3)


def main(argv=None, cases=CASES):
    """Run the command line ``argv``; ``--shapes`` names cases of ``cases``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="small-50x32,large-256,braun,bidir2-large,deepbench-512")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in cases}
    doc = result_stamp()
    doc["results"] = [model_case(by_name[name], args.repeats) for name in args.shapes.split(",")]
    print(f"load average {doc['load']} at the start; kernels only (forward + backward)")
    print(text_table(*scaling_table(doc)))
    if args.json:  # its other sections (contention.py's) kept
        update_result_file(args.json, **doc)


if __name__ == "__main__":
    main()
