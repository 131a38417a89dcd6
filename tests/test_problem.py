"""The Problem of a call: every valid spelling of the arguments gives the same one; the
parts shared between calls of one shape are read-only; a plan's work buffers and setups.

``check_problem`` and ``check_backward`` are the one check of a call's arguments: each
test is cheap when it passes, and the slower conversions (lists, numpy scalars, other
memory layouts, subclasses) run only for the arguments that need them. Whatever route an
argument takes, the :class:`Problem` (and the backward's arrays) must be the same.
"""
import dataclasses
import itertools

import numpy as np
import pytest

import lstmcy
from lstmcy._engine import validation as _validation
from lstmcy._engine.plan import LSTMPlan
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


def _assert_same_problem(a_problem, b_problem):
    for field in dataclasses.fields(_validation.Problem):
        a, b = getattr(a_problem, field.name), getattr(b_problem, field.name)
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


class _Subclass(np.ndarray):
    pass


def _spellings(x, hx, params, options):
    """Other valid spellings of one call: ``(what, x, hx, params, options)``."""
    yield "numpy bools and ints", x, hx, params, dict(
        options, has_bias=np.bool_(options["has_bias"]),
        bidirectional=np.bool_(options["bidirectional"]),
        batch_first=np.bool_(options["batch_first"]), num_layers=np.int64(options["num_layers"]))
    yield "Fortran order", np.asfortranarray(x), hx, [np.asfortranarray(p) for p in params], options
    yield "tuple params, list hx", x, None if hx is None else list(hx), tuple(params), options
    yield "ndarray subclasses", x.view(_Subclass), hx, [p.view(_Subclass) for p in params], options


CONFIGS = list(itertools.product((np.float64,), (1, 2), (1, 2), (False, True), (True, False),
                                 (True, False)))


@pytest.mark.parametrize("dtype, L, D, batch_first, has_bias, with_hx", CONFIGS)
def test_every_spelling_of_a_call_gives_the_same_problem(dtype, L, D, batch_first, has_bias,
                                                        with_hx):
    x, hx, params = _arguments(dtype, L, D, batch_first, has_bias, with_hx, "C")
    options = dict(has_bias=has_bias, num_layers=L, bidirectional=D == 2,
                   batch_first=batch_first, batch_sizes=None)
    plain = _validation.check_problem(x, hx, params, **options)
    assert plain.x_rows.base is x or plain.x_rows is x  # the plain call is not copied
    for what, x2, hx2, params2, options2 in _spellings(x, hx, params, options):
        _assert_same_problem(plain, _validation.check_problem(x2, hx2, params2, **options2))


@pytest.mark.parametrize("dtype, L, D, with_dh, dropout", itertools.product(
    (np.float32, np.float64), (1, 2), (1, 2), (True, False), (0.0, 0.25)))
def test_backward_checks_keep_the_callers_arrays(dtype, L, D, with_dh, dropout):
    x, hx, params = _arguments(dtype, L, D, False, True, True, "C")
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params, num_layers=L, bidirectional=D == 2,
                                             dropout=dropout, seed=1)
    dy = np.ones_like(y)
    dh = np.ones_like(h_n) if with_dh else None
    options = dict(batch_sizes=None, has_bias=True, num_layers=L, dropout=dropout, train=True,
                   bidirectional=D == 2, batch_first=False, dropout_masks=cache.dropout_masks)
    problem, arrays = _validation.check_backward(x, hx, params, dy, dh, dh, cache.saved(),
                                                 **options)
    _assert_same_problem(problem, _validation.check_problem(
        x, hx, params, has_bias=True, num_layers=L, bidirectional=D == 2, batch_first=False))
    expected = {"dy": dy, **({"dh": dh, "dc": dh} if with_dh else {}),
                **dict(zip(_validation.SAVED_NAMES, cache.saved()))}
    if dropout and L > 1:
        expected["dropout_masks"] = cache.dropout_masks
    assert arrays.keys() == expected.keys()
    for name, value in expected.items():  # the caller's arrays, unconverted
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        got = arrays[name] if isinstance(arrays[name], list) else [arrays[name]]
        assert len(items) == len(got) and all(a is b for a, b in zip(items, got)), name
    # Saved arrays given as ndarray subclasses are read as plain arrays of the same values.
    listed = [[a.view(_Subclass) for a in items] for items in cache.saved()]
    _, converted = _validation.check_backward(x, hx, params, dy, dh, dh, listed, **options)
    for name, items in zip(_validation.SAVED_NAMES, cache.saved()):
        for a, b in zip(items, converted[name]):
            assert type(b) is np.ndarray and b.dtype == a.dtype and np.array_equal(a, b), name


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


def _unaligned(array):
    """A copy of ``array`` at an address that is not a multiple of its item size."""
    raw = np.zeros(array.nbytes + 1, np.uint8)
    out = np.frombuffer(raw.data, array.dtype, offset=1, count=array.size).reshape(array.shape)
    out[...] = array
    assert not out.flags.aligned
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unaligned_arrays_give_the_aligned_results(dtype):
    """Arrays at odd addresses (a buffer sliced at a byte offset) are copied before a
    kernel loads them: the results are bitwise those of aligned arrays, the arrays
    unchanged."""
    x, hx, params = _arguments(dtype, 2, 2, False, True, True, "C")
    rng = np.random.default_rng(1)
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params, num_layers=2, bidirectional=True)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dh = rng.standard_normal(h_n.shape).astype(dtype)
    dc = rng.standard_normal(c_n.shape).astype(dtype)
    expected = cache.backward(dy, dh, dc)
    odd = [_unaligned(a) for a in (x, *hx, *params, dy, dh, dc)]
    copies = [a.copy() for a in odd]
    ox, oh, oc = odd[:3]
    oparams = odd[3:3 + len(params)]
    ody, odh, odc = odd[3 + len(params):]
    y2, h2, c2, cache2 = lstmcy.lstm_forward(ox, (oh, oc), oparams, num_layers=2,
                                             bidirectional=True)
    for a, b in zip((y, h_n, c_n), (y2, h2, c2)):
        assert np.array_equal(a, b)
    got = cache2.backward(ody, odh, odc)
    assert np.array_equal(got.dx, expected.dx) and np.array_equal(got.dh0, expected.dh0)
    for a, b in zip(got.dparams, expected.dparams):
        assert np.array_equal(a, b)
    # One step, on the step kernel object's fallback.
    plan = LSTMPlan()
    one = [a[0] for a in (x, hx[0], hx[1])]
    p1 = [w for w in params[:4]]
    h1, c1 = plan.step(one[0], (one[1], one[2]), p1)
    h3, c3 = plan.step(*[_unaligned(a) for a in one[:1]],
                       tuple(_unaligned(a) for a in one[1:]), [_unaligned(w) for w in p1])
    assert np.array_equal(h1, h3) and np.array_equal(c1, c3)
    for a, b in zip(odd, copies):
        assert np.array_equal(a, b)
