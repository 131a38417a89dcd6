"""Interleaved, repeated timing: several implementations measured side by side.

The machine may be shared, so the implementations of one case are timed in
rounds: each round runs every implementation once (in a rotating order), so a
burst of outside load hits all of them alike, and the median over rounds is
reported. Each timed batch is preceded by an untimed warm-up of at least
``warm_time`` seconds of the same implementation: it absorbs the hand-over
between thread pools (OpenBLAS pthreads and PyTorch's OpenMP threads keep
spinning for a while after their last call and would otherwise steal a core from
the next implementation).
"""
import gc
import math
import statistics
import time

__all__ = ["measure", "rotating_rounds", "summarise"]


def rotating_rounds(calls, rounds, repeats, warm_time=0.05):
    """ms per call of each of ``calls`` (name -> function) in each of ``rounds`` rounds:
    every round runs each function untimed for ``warm_time`` seconds (at least once), then
    ``repeats`` times timed, in an order that rotates from round to round; a first round
    warms up and is not kept. The warm-up absorbs the hand-over from the function before
    (PyTorch's OpenMP workers spin on for a while after its last call and would take a
    core from the next function: the rotation alone puts some function right after
    PyTorch in most rounds)."""
    times = {key: [] for key in calls}
    order = list(calls)
    for round_ in range(rounds + 1):
        for key in order[round_ % len(order):] + order[:round_ % len(order)]:
            _warm(calls[key], warm_time)
            start = time.perf_counter()
            for _ in range(repeats):
                calls[key]()
            if round_:
                times[key].append((time.perf_counter() - start) / repeats * 1e3)
    return times


def _run_batch(fn, number):
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return time.perf_counter() - start


def _run_batch_cpu(fn, number):
    """Wall time and this process's CPU time (all threads) of ``number`` calls."""
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    wall = time.perf_counter() - start
    return wall, time.process_time() - cpu


def _warm(fn, warm_time):
    start = time.perf_counter()
    fn()
    while time.perf_counter() - start < warm_time:
        fn()


def summarise(samples):
    """Median, min, max and inter-quartile range (seconds per call) of ``samples``."""
    ordered = sorted(samples)
    n = len(ordered)
    if n >= 4:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1, q3 = ordered[0], ordered[-1]
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1],
            "iqr": q3 - q1, "n": n, "samples": ordered}


def measure(functions, repeats=7, min_time=0.05, warm_time=0.02, max_number=1000):
    """Time several zero-argument callables side by side.

    Parameters
    ----------
    functions : dict of str -> callable
        The implementations. Each is called once first (untimed) and must be
        repeatable.
    repeats : int
        Rounds; each yields one sample per implementation.
    min_time : float
        A timed batch repeats the call ``number`` times so that it lasts about
        this long (``number`` is calibrated per implementation, at most
        ``max_number``).
    warm_time : float
        Untimed warm-up before every batch.

    Returns
    -------
    dict of str -> dict
        Per implementation: :func:`summarise` of the per-call times, plus
        ``number`` (calls per batch) and ``cpu_per_wall``, the median over
        batches of this process's CPU time / wall time (about the number of
        cores the implementation kept busy, spinning included).
    """
    names = list(functions)
    numbers = {}
    for name in names:
        fn = functions[name]
        fn()  # first call: imports, allocations, lazy initialisation
        one = _run_batch(fn, 1)
        numbers[name] = max(1, min(max_number, math.ceil(min_time / max(one, 1e-7))))
    samples = {name: [] for name in names}
    cpu_share = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    try:
        for r in range(repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                fn = functions[name]
                _warm(fn, warm_time)
                gc.collect()
                gc.disable()
                try:
                    elapsed, cpu = _run_batch_cpu(fn, numbers[name])
                finally:
                    if gc_was_enabled:
                        gc.enable()
                samples[name].append(elapsed / numbers[name])
                cpu_share[name].append(cpu / elapsed)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: dict(summarise(samples[name]), number=numbers[name],
                       cpu_per_wall=statistics.median(cpu_share[name])) for name in names}
