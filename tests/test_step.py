"""The one-step entry (:mod:`lstmcy._engine.step`) and ``LSTMPlan.step``.

A step must give bitwise the results of the full path (``_engine.forward`` /
``backward`` of the same arrays, and ``LSTMPlan.forward`` with ``T = 1``), for the
shapes and thread counts that pick other schedules; ``LSTMPlan.step`` must refuse what
``LSTMPlan.forward`` refuses, with the same errors.
"""
import numpy as np
import pytest

import lstmcy
from lstmcy._engine import layer_loops as _engine
from lstmcy._engine import step as _step
from lstmcy._engine.validation import check_problem

SHAPES = [(1, 16, 32), (3, 5, 7), (32, 16, 32), (2, 1, 1), (8, 40, 256)]


def _arrays(B, I, H, dtype, seed=0):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(dtype) * 0.5
              for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    x = rng.standard_normal((B, I)).astype(dtype)
    h = rng.standard_normal((B, H)).astype(dtype)
    c = rng.standard_normal((B, H)).astype(dtype)
    return x, h, c, params


@pytest.mark.parametrize("B, I, H", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_threads", [None, 1, 2])
def test_step_is_bitwise_the_full_path(B, I, H, dtype, n_threads):
    x, h, c, params = _arrays(B, I, H, dtype)
    plan = lstmcy.LSTMPlan(n_threads=n_threads)
    shape = _step.step_shape(B, I, H, np.dtype(dtype))
    h1, c1, saved = _step.forward(plan, shape, x, h, c, params[0], params[1],
                                  params[2] + params[3], True)
    p = check_problem(x[None], (h[None], c[None]), params, has_bias=True, num_layers=1,
                      bidirectional=False, batch_first=False, batch_sizes=None)
    full_plan = lstmcy.LSTMPlan(n_threads=n_threads)
    y, h_n, c_n, full_saved = _engine.forward(p, True, plan=full_plan)
    assert np.array_equal(h1, h_n[0]) and np.array_equal(c1, c_n[0])
    assert np.array_equal(h1, y[0])
    assert np.array_equal(saved, full_saved)
    # Inference: the same states, nothing saved.
    h2, c2, none = _step.forward(plan, shape, x, h, c, params[0], params[1],
                                 params[2] + params[3], False)
    assert none is None and np.array_equal(h2, h1) and np.array_equal(c2, c1)

    rng = np.random.default_rng(1)
    dh = rng.standard_normal((B, H)).astype(dtype)
    dc = rng.standard_normal((B, H)).astype(dtype)
    for want_dx, want_dparams in [(True, True), (False, True), (True, False)]:
        dx, dh0, dc0, dw_ih, dw_hh, db = _step.backward(
            plan, shape, x, h, c, params[0], params[1], saved, dh, dc, want_dx, want_dparams)
        fdx, fdh0, fdc0, fdparams = _engine.backward(
            p, full_saved, dh[None], None, dc[None],
            output_mask=(want_dx, True, True, want_dparams), plan=full_plan)
        assert np.array_equal(dh0, fdh0[0]) and np.array_equal(dc0, fdc0[0])
        if want_dx:
            assert np.array_equal(dx, fdx[0])
        else:
            assert dx is None
        if want_dparams:
            for ours, full in zip((dw_ih, dw_hh, db, db), fdparams):
                assert np.array_equal(ours, full)
        else:
            assert dw_ih is None and dw_hh is None and db is None
    # No output gradients: zeros for dh, dc.
    _, dh0, dc0, *_ = _step.backward(plan, shape, x, h, c, params[0], params[1], saved,
                                     None, None, False, False)
    _, fdh0, fdc0, _ = _engine.backward(p, full_saved, np.zeros_like(dh[None]),
                                        output_mask=(False, True, True, False), plan=full_plan)
    assert np.array_equal(dh0, fdh0[0]) and np.array_equal(dc0, fdc0[0])


@pytest.mark.parametrize("B, I, H", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("has_bias", [True, False])
def test_plan_step_is_bitwise_the_forward(B, I, H, dtype, has_bias):
    x, h, c, params = _arrays(B, I, H, dtype, seed=2)
    params = params if has_bias else params[:2]
    plan = lstmcy.LSTMPlan()
    for hx in ((h, c), None):
        h1, c1 = plan.step(x, hx, params, has_bias=has_bias)
        states = None if hx is None else (h[None], c[None])
        _, h_n, c_n, _ = plan.forward(x[None], states, params, has_bias=has_bias, train=False)
        assert h1.shape == c1.shape == (B, H)
        assert np.array_equal(h1, h_n[0]) and np.array_equal(c1, c_n[0])
    # Strided (non-contiguous) arrays give the same bits.
    wide = np.zeros((B, 2 * I), dtype)
    wide[:, ::2] = x
    h3, c3 = plan.step(wide[:, ::2], (h, c), params, has_bias=has_bias)
    h1, c1 = plan.step(x, (h, c), params, has_bias=has_bias)
    assert np.array_equal(h3, h1) and np.array_equal(c3, c1)


def test_plan_step_takes_other_dtypes_as_the_forward():
    x, h, c, params = _arrays(2, 3, 4, np.float16)
    h1, c1 = lstmcy.LSTMPlan().step(x, (h, c), params)
    _, h_n, c_n, _ = lstmcy.LSTMPlan().forward(x[None], (h[None], c[None]), params, train=False)
    assert h1.dtype == np.float16 and np.array_equal(h1, h_n[0]) and np.array_equal(c1, c_n[0])


def _error(call):
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("case", ["input size", "state shape", "dtype mix", "param count",
                                  "1-D input", "list input", "state count", "bias flag"])
def test_plan_step_errors_are_the_forwards(case):
    x, h, c, params = _arrays(2, 3, 4, np.float32)
    hx, has_bias = (h, c), True
    if case == "input size":
        x = x[:, :2]
    elif case == "state shape":
        hx = (h[:1], c)
    elif case == "dtype mix":
        hx = (h.astype(np.float64), c)
    elif case == "param count":
        params = params[:3]
    elif case == "1-D input":
        x = x[0]
    elif case == "list input":
        x = x.tolist()
    elif case == "state count":
        hx = (h,)
    elif case == "bias flag":
        has_bias = False
    lift = (lambda a: a[None] if isinstance(a, np.ndarray) and a.ndim == 2 else a)
    states = type(hx)(map(lift, hx))
    expected = _error(lambda: lstmcy.LSTMPlan().forward(lift(x), states, params,
                                                        has_bias=has_bias, train=False))
    assert _error(lambda: lstmcy.LSTMPlan().step(x, hx, params, has_bias=has_bias)) == expected


def test_plan_step_refuses_a_second_thread():
    """The step holds the plan's call lock, as every call on a plan does."""
    x, h, c, params = _arrays(1, 3, 4, np.float32)
    plan = lstmcy.LSTMPlan()
    plan._in_call.acquire()
    try:
        with pytest.raises(RuntimeError, match="already running a call"):
            plan.step(x, (h, c), params)
    finally:
        plan._in_call.release()
    plan.step(x, (h, c), params)
