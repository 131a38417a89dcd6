"""The multi-threaded kernel paths against the reference, and under late threads.

Most tests use small shapes, which the automatic thread count runs on one thread. A bug
that only the split paths have (row groups, unit parts, the backward's shared weight
tasks) passes everything else, so here a seeded sweep of configurations in every layout
runs on 1, 3 and 4 threads with the recurrences split as finely as the threads allow,
and compares with the numpy reference and bit for bit between thread counts.

In the debug build (``LSTMCY_DEBUG=1``, test hooks on) one worker of every job is made to
start late (``LSTMCY_TEST_START_DELAY_US``): the other threads then take its tasks, or
wait for it; the bits must not change.
"""
import os

import numpy as np
import pytest

import lstmcy
from lstmcy import _threadpool, reference
from hostile import Config, make_call, most_split, run_with_threads

LAYOUTS = ["time_major", "batch_first", "packed", "padded_2d", "padded_3d"]


def sweep(n_cases, seed=2024):
    rng = np.random.default_rng(seed)
    configs = []
    while len(configs) < n_cases:
        cfg = Config(T=int(rng.integers(1, 12)), B=int(rng.integers(1, 20)),
                     I=int(rng.choice([0, 3, 20, 33])), H=int(rng.choice([17, 24, 40, 56, 72])),
                     L=int(rng.choice([1, 1, 2])), bidirectional=bool(rng.random() < 0.3),
                     has_bias=bool(rng.random() < 0.8), layout=LAYOUTS[len(configs) % len(LAYOUTS)],
                     dtype=np.dtype(np.float64), dropout=float(rng.choice([0.0, 0.0, 0.3])),
                     with_hx=bool(rng.random() < 0.8), with_dhdc=bool(rng.random() < 0.8),
                     lengths_seed=int(rng.integers(0, 100)))
        configs.append(cfg)
    return configs


CONFIGS = sweep(20)
IDS = [f"{c.layout}-T{c.T}-B{c.B}-I{c.I}-H{c.H}-L{c.L}{'-bi' if c.bidirectional else ''}"
       for c in CONFIGS]


def expected_outputs(call, args, kwargs):
    fwd = reference.lstm_forward(*call.fwd_args, **call.fwd_kwargs)[:3]
    bwd = reference.lstm_backward(*args, **kwargs)
    return [*fwd, bwd[0], bwd[1], bwd[2], *bwd[3]]


@pytest.mark.parametrize("split", ["rows", "units"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_split_paths_match_reference_and_one_thread(cfg, split, monkeypatch, request):
    most_split(request, split)
    call = make_call(cfg, np.random.default_rng(cfg.lengths_seed), seed=7)
    one, (args, kwargs) = run_with_threads(call, 1)
    for threads in (3, 4):
        other, _ = run_with_threads(call, threads)
        for k, (a, b) in enumerate(zip(one, other)):
            assert a.tobytes() == b.tobytes(), f"output {k}: 1 and {threads} threads differ"
    expected = expected_outputs(call, args, kwargs)
    assert len(expected) == len(one)
    for k, (a, e) in enumerate(zip(one, expected)):
        e = np.asarray(e, dtype=np.float64)
        scale = float(np.max(np.abs(e))) if e.size else 0.0
        np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-10 * scale, err_msg=f"output {k}")


needs_hooks = pytest.mark.skipif(not _threadpool.HAS_TEST_HOOKS,
                                 reason="test hooks are in the debug build (LSTMCY_DEBUG=1) only")


@pytest.fixture
def late_worker(monkeypatch):
    """``late_worker(part, us)``: every job's worker ``part`` starts ``us`` microseconds late."""
    def set_delay(part, microseconds):
        monkeypatch.setenv("LSTMCY_TEST_START_DELAY_US", f"{part}:{microseconds}")
    yield set_delay
    os.environ.pop("LSTMCY_TEST_START_DELAY_US", None)


LATE_CONFIGS = [
    Config(T=19, B=16, I=24, H=56, layout="packed", dtype=np.dtype(np.float32), lengths_seed=4),
    Config(T=9, B=24, I=40, H=64, L=2, layout="batch_first", dtype=np.dtype(np.float64)),
    Config(T=8, B=12, I=10, H=24, L=1, bidirectional=True, layout="padded_3d",
           dtype=np.dtype(np.float64), lengths_seed=4),
    Config(T=7, B=2, I=6, H=48, L=1, layout="time_major", dtype=np.dtype(np.float64)),
]
MASKS = [(True, True, True, True), (False, False, False, True), (True, False, False, False)]


@needs_hooks
@pytest.mark.parametrize("split", ["rows", "units"])
@pytest.mark.parametrize("late_part", [0, 1, 2])
@pytest.mark.parametrize("delay_us", [200, 3000])
@pytest.mark.parametrize("cfg", LATE_CONFIGS,
                         ids=[f"{c.layout}-B{c.B}-L{c.L}{'-bi' if c.bidirectional else ''}"
                              for c in LATE_CONFIGS])
def test_same_bits_when_one_thread_starts_late(cfg, delay_us, late_part, split, late_worker,
                                               monkeypatch, request):
    most_split(request, split)
    call = make_call(cfg, np.random.default_rng(cfg.lengths_seed), seed=13)
    one, (args, kwargs) = run_with_threads(call, 1)
    expected = {}
    for mask in MASKS:
        lstmcy.set_num_threads(1)
        try:
            expected[mask] = lstmcy.lstm_backward(*args, **dict(kwargs, output_mask=mask))
        finally:
            lstmcy.set_num_threads(None)
    late_worker(late_part, delay_us)
    three, _ = run_with_threads(call, 3)
    for k, (a, b) in enumerate(zip(one, three)):
        assert a.tobytes() == b.tobytes(), f"output {k}: 1 and 3 threads differ"
    for mask in MASKS:
        lstmcy.set_num_threads(3)
        try:
            got = lstmcy.lstm_backward(*args, **dict(kwargs, output_mask=mask))
        finally:
            lstmcy.set_num_threads(None)
        for k, (a, b) in enumerate(zip(expected[mask], got)):
            if k == 3:
                a, b = (a or []), (b or [])
                assert len(a) == len(b)
                for j, (p, q) in enumerate(zip(a, b)):
                    assert p.tobytes() == q.tobytes(), f"dparams[{j}], mask {mask}"
            else:
                assert (a is None) == (b is None), f"output {k}, mask {mask}"
                if a is not None:
                    assert a.tobytes() == b.tobytes(), f"output {k}, mask {mask}"
