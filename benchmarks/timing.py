"""Interleaved, repeated timing: several implementations measured side by side.

The machine may be shared, so the implementations of one case are timed in
rounds: each round runs every implementation once (in a rotating order), so a
burst of outside load hits all of them alike, and the median over rounds is
reported. Each timed batch is preceded by a garbage collection, then by an
untimed warm-up of at least ``warm_time`` seconds of the same implementation,
immediately before it: the warm-up absorbs the hand-over between thread pools
(OpenBLAS pthreads and PyTorch's OpenMP threads keep spinning for a while after
their last call and would otherwise steal a core from the next implementation)
and brings the implementation's data back into cache after the collection, which
walks the whole heap (about 100 ms with PyTorch and Opacus loaded; a training
step timed right after it ran 30-50 % slower than in a loop of steps).
"""
import gc
import math
import statistics
import time

__all__ = ["measure", "run_batch", "summarise"]


def run_batch(fn, number):
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
    """Median, min, max and inter-quartile range (seconds per call) of ``samples`` (kept
    in the order given)."""
    ordered = sorted(samples)
    n = len(ordered)
    if n >= 4:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1, q3 = ordered[0], ordered[-1]
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1],
            "iqr": q3 - q1, "n": n, "samples": list(samples)}


def measure(functions, repeats=7, min_time=0.05, warm_time=0.02, max_number=1000, number=None):
    """Time the zero-argument callables of ``functions`` (name -> callable) side by side.

    Each is called once first (untimed) and must be repeatable. Each of ``repeats`` rounds
    yields one sample per callable: a batch of calls lasting about ``min_time`` seconds
    (the count calibrated per callable, at most ``max_number``, unless ``number`` fixes
    it) after an untimed warm-up of ``warm_time`` (at least one call). Returns, per name,
    :func:`summarise` of the seconds per call (``samples`` in round order, for same-round
    ratios), ``number`` (calls per batch) and ``cpu_per_wall``, the median over batches of
    this process's CPU time / wall time (about the cores the callable kept busy, spinning
    included).
    """
    names = list(functions)
    numbers = {}
    for name in names:
        functions[name]()  # first call: imports, allocations, lazy initialisation
        numbers[name] = number or max(1, min(max_number, math.ceil(
            min_time / max(run_batch(functions[name], 1)[0], 1e-7))))
    samples = {name: [] for name in names}
    cpu_share = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    try:
        for r in range(repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                fn = functions[name]
                gc.collect()
                _warm(fn, warm_time)
                gc.disable()
                try:
                    elapsed, cpu = run_batch(fn, numbers[name])
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
