"""The two-thread kernel paths on shapes big enough to take them, against the reference.

Most tests use small shapes, which the kernels run on one thread and without the split
forward (each forward step split between two threads once 8*B*H^2 reaches
``_core._SPLIT_FORWARD_MIN``) or the overlapped backward (two threads once a layer has
~2 MFLOP). A bug that only those paths have (one in the split forward's final h of
variable-length batches did) passes everything else, so here a seeded sweep of
configurations above both thresholds, in every layout, compares forward and backward
with the numpy reference and one thread with two, bit for bit.
"""
import numpy as np
import pytest

from lstmcy import _core, reference
from hostile import Config, force_split, make_call, run_with_threads

LAYOUTS = ["time_major", "batch_first", "packed", "padded_2d", "padded_3d"]


def sweep(n_cases, seed=2024):
    rng = np.random.default_rng(seed)
    configs = []
    while len(configs) < n_cases:
        H = int(rng.choice([17, 24, 40, 56, 72]))
        # Smallest batch that takes the split forward, plus a little.
        B = int(np.ceil(_core._SPLIT_FORWARD_MIN / (8.0 * H * H))) + int(rng.integers(0, 4))
        T = int(rng.integers(1, 12))
        cfg = Config(T=T, B=B, I=int(rng.choice([0, 3, 20, 33])), H=H,
                     L=int(rng.choice([1, 1, 2])), bidirectional=bool(rng.random() < 0.2),
                     has_bias=bool(rng.random() < 0.8), layout=LAYOUTS[len(configs) % len(LAYOUTS)],
                     dtype=np.dtype(np.float64), dropout=float(rng.choice([0.0, 0.0, 0.3])),
                     with_hx=bool(rng.random() < 0.8), with_dhdc=bool(rng.random() < 0.8),
                     lengths_seed=int(rng.integers(0, 100)))
        configs.append(cfg)
    return configs


CONFIGS = sweep(20)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[f"{c.layout}-T{c.T}-B{c.B}-I{c.I}-H{c.H}-L{c.L}"
                                              f"{'-bi' if c.bidirectional else ''}" for c in CONFIGS])
def test_two_thread_paths_match_reference_and_one_thread(cfg):
    call = make_call(cfg, np.random.default_rng(cfg.lengths_seed), seed=7)
    one, (args, kwargs) = run_with_threads(call, 1)
    two, _ = run_with_threads(call, 2)
    for k, (a, b) in enumerate(zip(one, two)):
        assert a.tobytes() == b.tobytes(), f"output {k}: 1 and 2 threads differ"
    fwd = reference.lstm_forward(*call.fwd_args, **call.fwd_kwargs)[:3]
    bwd = reference.lstm_backward(*args, **kwargs)
    expected = [*fwd, bwd[0], bwd[1], bwd[2], *bwd[3]]
    assert len(expected) == len(one)
    for k, (a, e) in enumerate(zip(one, expected)):
        e = np.asarray(e, dtype=np.float64)
        scale = float(np.max(np.abs(e))) if e.size else 0.0
        np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-10 * scale, err_msg=f"output {k}")


# The split forward's tasks: a thread that starts late finds some (or all) of its half's
# tasks done by the other thread, which runs the same calls. Made to happen with the
# kernels' start-delay hook, on either thread, for inference and training, uniform and
# variable-length batches.
SPLIT_CONFIGS = [
    Config(T=9, B=16, I=20, H=40, L=1, layout="time_major", dtype=np.dtype(np.float64),
           with_hx=True, with_dhdc=True),
    Config(T=11, B=14, I=3, H=56, L=2, layout="packed", dtype=np.dtype(np.float64),
           with_hx=True, with_dhdc=False, lengths_seed=3),
    Config(T=7, B=16, I=33, H=48, L=1, layout="batch_first", dtype=np.dtype(np.float32),
           with_hx=False, with_dhdc=True),
]


@pytest.fixture
def split_start_delay():
    from lstmcy._dispatch import kernels

    def set_delay(thread, microseconds):
        kernels._set_split_start_delay(thread, microseconds)

    yield set_delay
    kernels._set_split_start_delay(0, 0)
    kernels._set_split_start_delay(1, 0)


@pytest.mark.parametrize("split_by", ["rows", "units"])
@pytest.mark.parametrize("late_thread", [0, 1])
@pytest.mark.parametrize("delay_us", [300, 3000])
@pytest.mark.parametrize("cfg", SPLIT_CONFIGS, ids=[c.layout for c in SPLIT_CONFIGS])
def test_split_forward_same_bits_when_one_thread_starts_late(cfg, delay_us, late_thread, split_by,
                                                              split_start_delay, monkeypatch):
    assert 8.0 * cfg.B * cfg.H * cfg.H >= _core._SPLIT_FORWARD_MIN  # the split path runs
    force_split(monkeypatch, cfg, split_by)
    call = make_call(cfg, np.random.default_rng(cfg.lengths_seed), seed=11)
    one, _ = run_with_threads(call, 1)
    split_start_delay(late_thread, delay_us)
    for train in (True, False):
        kwargs = dict(call.fwd_kwargs, train=train)
        import lstmcy
        lstmcy.set_num_threads(2)
        try:
            y, h_n, c_n, _ = lstmcy.lstm_forward(*call.fwd_args, **kwargs)
        finally:
            lstmcy.set_num_threads(None)
        for k, (a, b) in enumerate(zip(one[:3], (y, h_n, c_n))):
            assert a.tobytes() == np.asarray(b).tobytes(), f"output {k}, train={train}"
    two, _ = run_with_threads(call, 2)  # and the backward on the late-start forward's cache
    for k, (a, b) in enumerate(zip(one, two)):
        assert a.tobytes() == b.tobytes(), f"output {k}: 1 and 2 threads differ"


# The two ways of splitting the forward compute every element with the same calls in the
# same order (a row's products do not depend on which rows share the GEMM call, nor a
# column's on which columns do), so they agree bit for bit, with each other and across
# thread counts; odd batches leave the odd-rows half one row short.
LAYOUT_CONFIGS = SPLIT_CONFIGS + [
    Config(T=6, B=13, I=5, H=48, L=2, layout="packed", dtype=np.dtype(np.float32),
           with_hx=True, with_dhdc=True, lengths_seed=9),
    Config(T=5, B=9, I=0, H=56, L=1, layout="padded_3d", dtype=np.dtype(np.float64),
           with_hx=False, with_dhdc=False, lengths_seed=5),
]


@pytest.mark.parametrize("cfg", LAYOUT_CONFIGS, ids=[f"{c.layout}-B{c.B}-H{c.H}" for c in LAYOUT_CONFIGS])
def test_split_forward_by_rows_and_by_units_give_the_same_bits(cfg, monkeypatch):
    assert 8.0 * cfg.B * cfg.H * cfg.H >= _core._SPLIT_FORWARD_MIN  # the split path runs
    call = make_call(cfg, np.random.default_rng(cfg.lengths_seed), seed=5)
    results = {}
    for split_by in ("rows", "units"):
        force_split(monkeypatch, cfg, split_by)
        for threads in (1, 2):
            results[split_by, threads], _ = run_with_threads(call, threads)
    first = results["units", 1]
    for key, outputs in results.items():
        for k, (a, b) in enumerate(zip(outputs, first)):
            assert a.tobytes() == b.tobytes(), f"output {k}: {key} differs from units on 1 thread"
    fwd = reference.lstm_forward(*call.fwd_args, **call.fwd_kwargs)[:3]
    for k, (a, e) in enumerate(zip(first[:3], fwd)):
        e = np.asarray(e, dtype=np.float64)
        rtol = 1e-10 if cfg.dtype == np.float64 else 2e-5
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * float(np.max(np.abs(e))),
                                   err_msg=f"output {k}")


# The backward's weight gradients are (half, chunk) tasks that either thread may run, in
# chunk order per half, and its dx pieces go to whichever thread is free. A thread that
# starts late finds some or all of them done by the other one (a late helper: the
# recurrence thread takes every weight-gradient task; a late recurrence: the helper waits,
# then both share the tasks). The bits must not change, with or without dx, and with one
# direction or two.
BACKWARD_CONFIGS = SPLIT_CONFIGS + [
    Config(T=8, B=12, I=10, H=24, L=1, bidirectional=True, layout="padded_3d",
           dtype=np.dtype(np.float64), with_hx=True, with_dhdc=True, lengths_seed=4),
]


@pytest.fixture
def backward_start_delay():
    from lstmcy._dispatch import kernels

    yield kernels._set_backward_start_delay
    kernels._set_backward_start_delay(0, 0)
    kernels._set_backward_start_delay(1, 0)


@pytest.mark.parametrize("late_thread", [0, 1])
@pytest.mark.parametrize("delay_us", [200, 3000])
@pytest.mark.parametrize("cfg", BACKWARD_CONFIGS,
                         ids=[f"{c.layout}-L{c.L}{'-bi' if c.bidirectional else ''}" for c in BACKWARD_CONFIGS])
def test_backward_same_bits_when_one_thread_starts_late(cfg, delay_us, late_thread,
                                                         backward_start_delay):
    import lstmcy

    call = make_call(cfg, np.random.default_rng(cfg.lengths_seed), seed=13)
    one, (args, kwargs) = run_with_threads(call, 1)
    backward_start_delay(late_thread, delay_us)
    for mask in [(True, True, True, True), (False, False, False, True), (True, False, False, False)]:
        lstmcy.set_num_threads(1)
        try:
            expected = lstmcy.lstm_backward(*args, **dict(kwargs, output_mask=mask))
        finally:
            lstmcy.set_num_threads(None)
        lstmcy.set_num_threads(2)
        try:
            got = lstmcy.lstm_backward(*args, **dict(kwargs, output_mask=mask))
        finally:
            lstmcy.set_num_threads(None)
        for k, (a, b) in enumerate(zip(expected, got)):
            if k == 3:
                a, b = (a or []), (b or [])
                assert len(a) == len(b)
                for j, (p, q) in enumerate(zip(a, b)):
                    assert p.tobytes() == q.tobytes(), f"dparams[{j}], mask {mask}"
            else:
                assert (a is None) == (b is None), f"output {k}, mask {mask}"
                if a is not None:
                    assert a.tobytes() == b.tobytes(), f"output {k}, mask {mask}"
    # The full backward with two threads also equals the one-thread run of the sweep.
    two, _ = run_with_threads(call, 2)
    for k, (a, b) in enumerate(zip(one, two)):
        assert a.tobytes() == b.tobytes(), f"output {k}: 1 and 2 threads differ"
