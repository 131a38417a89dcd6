"""Threads that outnumber the cores, and cores another process holds.

Side by side in one run (medians of alternating blocks): the training pass on 2 threads
against 4 x the CPU count (waits never spin without bound: target within ~10 %); and, with
a spinning process on every CPU, the automatic thread count against one thread (target:
never more than 10 % slower). ``--json`` writes the run as the ``contention`` section of
the scaling run's file, keeping the rest of it::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/contention.py \\
        --shapes small-32x16,small-50x32,large-256 --json benchmarks/results/scaling.json
"""
import argparse
import multiprocessing as mp
import time

import numpy as np

import lstmcy
from lstmcy._engine import threads as _threads
from cases import CASES, make_inputs, training_pass
from machine import result_stamp, update_result_file
from report import contention_table, text_table


def _spin(stop):
    while not stop.is_set():
        for _ in range(100000):
            pass


def side_by_side(case, inputs, counts, blocks, per_block):
    """Median seconds per pass for each thread count (None: automatic), in alternating
    blocks of ``per_block`` passes (the first pass of a block not timed)."""
    plans = {n: lstmcy.LSTMPlan(n_threads=n) for n in counts}
    times = {n: [] for n in counts}
    for block in range(blocks):
        for n in (counts if block % 2 == 0 else counts[::-1]):
            training_pass(case, inputs, plans[n])
            for _ in range(per_block):
                start = time.perf_counter()
                training_pass(case, inputs, plans[n])
                times[n].append(time.perf_counter() - start)
    return {n: float(np.median(t)) for n, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="small-32x16,small-50x32,large-256")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--per-block", type=int, default=5)
    parser.add_argument("--json", help="the scaling run's JSON file to write the section into")
    args = parser.parse_args(argv)
    cpus = _threads.available_cpus()
    many = 4 * cpus
    by_name = {c.name: c for c in CASES}
    doc = dict(cpus=cpus, **result_stamp(), blocks=args.blocks, per_block=args.per_block, results=[])
    print(f"{cpus} CPUs; load average {doc['load']} before the run")
    for name in args.shapes.split(","):
        case = by_name[name]
        inputs = make_inputs(case)
        over = side_by_side(case, inputs, [2, many], args.blocks, args.per_block)
        stop = mp.Event()
        hogs = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(cpus)]
        for p in hogs:
            p.start()
        try:
            time.sleep(0.5)
            loaded = side_by_side(case, inputs, [1, None], args.blocks, args.per_block)
        finally:
            stop.set()
            for p in hogs:
                p.join(10)
        doc["results"].append(dict(case=name, shape=case.shape_label, dtype=case.dtype,
                                   two=over[2], many=over[many], many_threads=many,
                                   loaded_one=loaded[1], loaded_auto=loaded[None]))
    print(text_table(*contention_table(doc)))
    if args.json:
        update_result_file(args.json, contention=doc)


if __name__ == "__main__":
    main()
