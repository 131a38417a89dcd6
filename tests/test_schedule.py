"""The backward's chunk schedule: any (first, chunk, dx_group) gives the reference's
gradients, and the same bits with one or two kernel threads.

The schedule (``lstmcy._core._backward_schedule``) is a function of the shape only and
picks the chunks of the weight gradients: a short first chunk, then ``chunk`` steps each.
Each chunk's weight gradients are two tasks (the rows of gates i, f and of g, o), which
either thread may run, in chunk order per half; pieces of ``dx`` (``dx_group`` chunks
each) go to whichever thread is free. The shapes the benchmark uses reach only a few
schedules, so here the schedule is forced, including the corner cases (one step per
chunk, a first chunk covering the whole sequence, more chunks than a dx piece holds).
"""
import numpy as np
import pytest

import lstmcy
from lstmcy import _core
from lstmcy import reference
from hostile import Config, make_call, run_with_threads

CONFIGS = {
    # Big enough for two kernel threads (the flops threshold) in both dtypes.
    "f64-packed": Config(T=24, B=12, I=64, H=40, layout="packed", dtype=np.dtype(np.float64),
                         lengths_seed=7),
    "f32-time-major": Config(T=17, B=16, I=48, H=64, dtype=np.dtype(np.float32)),
    "f64-batch-first-2-layers": Config(T=13, B=20, I=30, H=48, L=2, layout="batch_first",
                                       dtype=np.dtype(np.float64), dropout=0.25),
    "f64-bidirectional-padded": Config(T=15, B=14, I=40, H=40, bidirectional=True,
                                       layout="padded_3d", dtype=np.dtype(np.float64),
                                       lengths_seed=2),
}
# (first, chunk, dx_group); the schedule itself never has first > chunk, but the kernels
# take any positive values (the chunk buffer is sized for the longest chunk).
SCHEDULES = [(1, 1, 1), (1, 3, 2), (2, 5, 1), (3, 3, 3), (1000, 1000, 1), (4, 4, 100),
             (2, 7, 2), (6, 1, 1), (5, 2, 1)]


def run_backward(call, schedule, threads, monkeypatch):
    """``[dx, dh_prev, dc_prev, *dparams]`` and the backward's arguments, under ``schedule``."""
    if schedule is not None:
        monkeypatch.setattr(_core, "_backward_schedule", lambda *shape: schedule)
    try:
        outputs, arguments = run_with_threads(call, threads)
    finally:
        monkeypatch.undo()
    return outputs[3:], arguments


@pytest.fixture(scope="module")
def calls():
    return {name: make_call(cfg, np.random.default_rng(5), seed=1) for name, cfg in CONFIGS.items()}


@pytest.mark.parametrize("schedule", SCHEDULES, ids=[f"first{f}-chunk{c}-dx{g}" for f, c, g in SCHEDULES])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_schedule_matches_reference_and_is_thread_independent(name, schedule, calls, monkeypatch):
    call = calls[name]
    one, (args, kwargs) = run_backward(call, schedule, 1, monkeypatch)
    two, _ = run_backward(call, schedule, 2, monkeypatch)
    for k, (a, b) in enumerate(zip(one, two)):
        assert a.tobytes() == b.tobytes(), f"output {k}: 1 and 2 threads differ"
    expected = reference.lstm_backward(*args, **kwargs)
    expected = [expected[0], expected[1], expected[2], *expected[3]]
    rtol = 1e-10 if CONFIGS[name].dtype == np.float64 else 2e-4
    for k, (a, e) in enumerate(zip(one, expected)):
        e = np.asarray(e, dtype=np.float64)
        scale = float(np.max(np.abs(e))) if e.size else 0.0
        np.testing.assert_allclose(a.astype(np.float64), e, rtol=rtol, atol=rtol * scale,
                                   err_msg=f"output {k}")


def test_schedule_is_a_function_of_the_shape():
    # The same shape always gets the same schedule (the kernels' results depend on it),
    # whatever the thread setting.
    shape = (100, 64, 1)
    saved_threads = lstmcy.get_num_threads()
    try:
        lstmcy.set_num_threads(1)
        one = _core._backward_schedule.__wrapped__(*shape)
        lstmcy.set_num_threads(2)
        two = _core._backward_schedule.__wrapped__(*shape)
    finally:
        lstmcy.set_num_threads(saved_threads)
    assert one == two
    first, chunk, dx_group = one
    assert 1 <= first <= chunk and dx_group >= 1
    # Two directions, one on each thread: plain chunks, dx in one piece.
    assert _core._backward_schedule(100, 64, 2) == (chunk, chunk, 100)


@pytest.mark.parametrize("schedule", [(1, 1, 1), (2, 2, 4)])
def test_no_steps_gives_zero_weight_gradients(schedule, monkeypatch):
    # T == 0 has no chunks, so no weight-gradient task runs: the weight gradients are
    # zeros, not whatever an earlier call left in the plan's accumulators.
    warm = make_call(Config(T=3, B=22, I=5, H=33), np.random.default_rng(0), seed=0)
    run_backward(warm, schedule, 1, monkeypatch)
    empty = make_call(Config(T=0, B=22, I=5, H=33), np.random.default_rng(1), seed=0)
    for threads in (1, 2):
        grads, _ = run_backward(empty, schedule, threads, monkeypatch)
        for g in grads[3:]:  # dw_ih, dw_hh, db_ih, db_hh
            assert not np.any(g), "weight gradients of an empty sequence must be zero"


def test_backward_layer_refuses_a_bad_schedule(calls, monkeypatch):
    for schedule in [(0, 1, 1), (1, 0, 1), (1, 1, 0)]:
        with pytest.raises(ValueError, match="bad schedule"):
            run_backward(calls["f32-time-major"], schedule, 1, monkeypatch)
