"""The per-call fast paths agree with the full code paths.

``check_problem`` and ``check_backward`` first try a cheap check of the common case
(exact ndarrays of one native float32/float64 dtype with the expected shapes, plain bool
and int options, no ``batch_sizes``) and fall back to the full checks for anything else.
The fast path must accept only valid arguments and build the same :class:`Problem`.
"""
import dataclasses
import itertools

import numpy as np
import pytest

import lstmcy
from lstmcy import _validation
from lstmcy._core import LSTMPlan
from torch_oracle import make_params

T, B, I, H = 5, 3, 4, 6


def _arguments(dtype, L, D, batch_first, has_bias, with_hx, order, seed=0):
    rng = np.random.default_rng(seed)
    params = [np.asarray(p, order=order) for p in make_params(rng, L, D, I, H, has_bias, dtype)]
    x = np.asarray(rng.standard_normal((B, T, I) if batch_first else (T, B, I)).astype(dtype),
                   order=order)
    hx = None
    if with_hx:
        hx = tuple(np.asarray(rng.standard_normal((L * D, B, H)).astype(dtype), order=order)
                   for _ in range(2))
    return x, hx, params


def _assert_same_problem(fast, full):
    for field in dataclasses.fields(_validation.Problem):
        a, b = getattr(fast, field.name), getattr(full, field.name)
        if field.name == "weights":
            assert len(a) == len(b)
            for wa, wb in zip(a, b):
                for u, v in zip(wa, wb):
                    assert u.dtype == v.dtype and u.flags.c_contiguous and np.array_equal(u, v)
        elif isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), field.name
            assert a.flags.c_contiguous == b.flags.c_contiguous, field.name
        else:
            assert type(a) is type(b) and a == b, field.name


CONFIGS = list(itertools.product((np.float32, np.float64), (1, 2), (1, 2), (False, True),
                                 (True, False), (True, False), ("C", "F")))


@pytest.mark.parametrize("dtype, L, D, batch_first, has_bias, with_hx, order", CONFIGS)
def test_fast_problem_matches_full_checks(monkeypatch, dtype, L, D, batch_first, has_bias,
                                          with_hx, order):
    x, hx, params = _arguments(dtype, L, D, batch_first, has_bias, with_hx, order)
    options = dict(has_bias=has_bias, num_layers=L, bidirectional=D == 2,
                   batch_first=batch_first, batch_sizes=None)
    fast = _validation._problem_fast(x, hx, params, has_bias, L, D == 2, batch_first, None)
    assert fast is not None  # the common case takes the fast path
    monkeypatch.setattr(_validation, "_problem_fast", lambda *args: None)
    _assert_same_problem(fast, _validation.check_problem(x, hx, params, **options))


@pytest.mark.parametrize("dtype, L, D, with_dh, dropout", itertools.product(
    (np.float32, np.float64), (1, 2), (1, 2), (True, False), (0.0, 0.25)))
def test_fast_backward_matches_full_checks(monkeypatch, dtype, L, D, with_dh, dropout):
    x, hx, params = _arguments(dtype, L, D, False, True, True, "C")
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params, num_layers=L, bidirectional=D == 2,
                                             dropout=dropout, seed=1)
    dy = np.ones_like(y)
    dh = np.ones_like(h_n) if with_dh else None
    options = dict(batch_sizes=None, has_bias=True, num_layers=L, dropout=dropout, train=True,
                   bidirectional=D == 2, batch_first=False, dropout_masks=cache.dropout_masks)
    args = (x, hx, params, dy, dh, dh, cache.saved())
    fast = _validation._backward_fast(*args, **options)
    assert fast is not None
    monkeypatch.setattr(_validation, "_problem_fast", lambda *args: None)
    monkeypatch.setattr(_validation, "_backward_fast", lambda *args: None)
    full = _validation.check_backward(*args, **options)
    _assert_same_problem(fast[0], full[0])
    assert fast[1].keys() == full[1].keys()
    for name, value in fast[1].items():  # the caller's arrays, unconverted
        items = value if isinstance(value, list) else [value]
        other = full[1][name] if isinstance(value, list) else [full[1][name]]
        assert len(items) == len(other) and all(a is b for a, b in zip(items, other)), name


class _Subclass(np.ndarray):
    pass


def _declined_cases():
    x, hx, params = _arguments(np.float32, 1, 1, False, True, True, "C")
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params)
    base = dict(input=x, hx=hx, params=params, dy=np.ones_like(y), dh=None, dc=None,
                saved=cache.saved(), batch_sizes=None, has_bias=True, num_layers=1, dropout=0.0,
                train=True, bidirectional=False, batch_first=False, dropout_masks=None)
    yield "np.bool_ option", dict(base, has_bias=np.bool_(True))
    yield "numpy int num_layers", dict(base, num_layers=np.int64(1))
    yield "batch_sizes", dict(base, batch_sizes=np.full(T, B))
    yield "float16", dict(base, input=x.astype(np.float16))
    yield "byte-swapped", dict(base, input=x.astype(x.dtype.newbyteorder()))
    yield "ndarray subclass", dict(base, input=x.view(_Subclass))
    yield "list input", dict(base, input=x.tolist())
    yield "wrong dy shape", dict(base, dy=np.ones((T, B, H + 1), np.float32))
    yield "float64 dh", dict(base, dh=np.ones((1, B, H)))
    yield "short saved list", dict(base, saved=((),) + cache.saved()[1:])
    yield "unused masks", dict(base, dropout_masks=[])
    yield "bad dropout", dict(base, dropout=1.0)
    yield "hx as array", dict(base, hx=np.stack(hx))


@pytest.mark.parametrize("what, arguments", list(_declined_cases()),
                         ids=[what for what, _ in _declined_cases()])
def test_fast_backward_declines_anything_unusual(what, arguments):
    # None sends the call to the full checks (which accept or refuse it with their message).
    assert _validation._backward_fast(**arguments) is None


def test_shared_row_maps_are_read_only():
    x, hx, params = _arguments(np.float32, 1, 1, False, True, True, "C")
    first = _validation.check_problem(x, hx, params, has_bias=True, num_layers=1,
                                      bidirectional=False, batch_first=False, batch_sizes=None)
    second = _validation.check_problem(x, None, params, has_bias=True, num_layers=1,
                                       bidirectional=False, batch_first=False, batch_sizes=None)
    for name in ("batch_sizes", "packed_start", "step_row"):
        shared = getattr(first, name)
        assert shared is getattr(second, name)  # built once per shape
        with pytest.raises(ValueError, match="read-only"):
            shared[0] = 7
    assert first.time_major_map[0] is second.time_major_map[0]
    assert not first.time_major_map[0].flags.writeable


def test_plan_workspace_views_follow_their_buffer():
    plan = LSTMPlan()
    f32 = np.dtype(np.float32)
    small = plan._buffers.take("gates", (1, 4, 8), f32)
    assert plan._buffers.take("gates", (1, 4, 8), f32) is small  # the same view again
    large = plan._buffers.take("gates", (2, 40, 8), f32)  # grows the buffer
    assert large.base is plan._buffers.current("gates")[0] and small.base is not large.base
    again = plan._buffers.take("gates", (1, 4, 8), f32)
    assert again.base is large.base and again.shape == (1, 4, 8) and again.flags.c_contiguous
    assert plan._buffers.take("gates", (1, 4, 8), np.dtype(np.float64)).dtype == np.float64


def test_layer_setups_are_reused_and_dropped_when_a_buffer_grows():
    # A plan keeps each kind of layer call's workspace views; a larger call grows the
    # buffers, which must drop every setup (else a view would keep a replaced buffer
    # alive), and results stay those of a new plan.
    rng = np.random.default_rng(3)

    def problem(T, B, I, H):
        x = rng.standard_normal((T, B, I))
        params = [rng.standard_normal(s) * 0.3 for s in ((4 * H, I), (4 * H, H), (4 * H,), (4 * H,))]
        return x, params

    small, large = problem(5, 2, 3, 4), problem(9, 6, 7, 8)
    plan = LSTMPlan()

    def run(plan, x, params):
        y, h_n, c_n, cache = plan.forward(x, None, params)
        grads = plan.backward(x, None, params, np.ones_like(y), None, None, *cache.saved())
        return [y, h_n, c_n, grads[0], grads[1], grads[2], *grads[3]]

    first = run(plan, *small)
    run(plan, *small)  # the first backward grew buffers the first forward had views of
    setups = {setup.key: setup for setup in plan._setups.values()}
    assert {key[0] for key in setups} == {"forward", "backward"}
    run(plan, *small)
    assert all(plan._setups.get(key) is setup for key, setup in setups.items())  # reused
    run(plan, *large)
    assert not any(plan._setups.get(key) is setup for key, setup in setups.items())
    again = run(plan, *small)
    current = [id(buffer) for buffer in plan._buffers.arrays().values()]
    for setup in plan._setups.values():  # every kept view is of a current buffer
        assert all(id(view.base) in current for view in setup.workspaces)
    fresh = run(LSTMPlan(), *small)
    for a, b, c in zip(first, again, fresh):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
