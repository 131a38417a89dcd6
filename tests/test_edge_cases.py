"""Edge cases of lstm_forward / lstm_backward.

Zero sizes, ``output_mask``, memory layouts (Fortran order, strided and negative-stride
views), inputs left untouched, bitwise reproducibility, gradient scales over many
decades, ``hx=None`` and inference mode.
"""

import itertools

import numpy as np
import pytest

import lstmcy
from lstmcy._engine.cache import SAVED_NAMES as SAVED
from lstmcy import reference
from torch_oracle import make_case, make_params, param_names, run_lstmcy, torch_lstm



def results_as_list(result):
    """Flat list of the arrays of a run_lstmcy result (None kept)."""
    return [result.y, result.h_n, result.c_n, result.dx, result.dh_prev, result.dc_prev] + (
        list(result.dparams) if result.dparams is not None else [None])


def assert_bitwise_equal(first, second, what=""):
    assert len(first) == len(second), what
    for k, (a, b) in enumerate(zip(first, second)):
        if a is None or b is None:
            assert a is None and b is None, f"{what} [{k}]"
            continue
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what} [{k}]"
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), \
            f"{what}: output {k} differs"


def forward_backward(case, *, hx="case", output_mask=(True, True, True, True), arrays=None):
    """Raw (input-dtype) outputs of lstmcy, optionally on replacement arrays (same values)."""
    a = arrays or case.arrays()
    n = len(case.params)
    params = [a[f"params[{k}]"] for k in range(n)]
    hx = (a["h0"], a["c0"]) if hx == "case" else hx
    kw = case.kwargs()
    y, h_n, c_n, cache = lstmcy.lstm_forward(a["x"], hx, params, dropout=case.dropout,
                                             seed=case.seed, **kw)
    saved = cache.saved()
    if "saved" in a:
        saved = a["saved"](saved)
    grads = lstmcy.lstm_backward(a["x"], hx, params, a["dy"], a["dh"], a["dc"], *saved,
                                 dropout=case.dropout, dropout_masks=cache.dropout_masks,
                                 output_mask=output_mask, **kw)
    return [y, h_n, c_n, *grads[:3]] + (list(grads[3]) if grads[3] is not None else [None]), cache


# ---------------------------------------------------------------------------
# zero sizes
# ---------------------------------------------------------------------------

ZERO_SIZES = [dict(T=0), dict(B=0), dict(I=0), dict(H=0)]


@pytest.mark.parametrize("layout", ["time_major", "batch_first"])
@pytest.mark.parametrize("zero", ZERO_SIZES, ids=lambda z: f"{next(iter(z))}=0")
def test_zero_sizes(zero, layout):
    sizes = dict(T=4, B=3, I=5, H=4) | zero
    L, D = 2, 2
    case = make_case(3, num_layers=L, bidirectional=True, layout=layout, dropout=0.3, **sizes)
    T, B, I, H = sizes["T"], sizes["B"], sizes["I"], sizes["H"]
    got, cache, raw = run_lstmcy(lstmcy, case)
    y_shape = (B, T, D * H) if layout == "batch_first" else (T, B, D * H)
    assert got.y.shape == y_shape
    assert got.h_n.shape == got.c_n.shape == (L * D, B, H)
    assert got.dx.shape == case.x.shape
    assert got.dh_prev.shape == got.dc_prev.shape == (L * D, B, H)
    assert [p.shape for p in got.dparams] == [p.shape for p in case.params]
    for name in SAVED:
        assert [a.shape for a in getattr(cache, name)] == [(T, B, H)] * (L * D)
    assert all(np.isfinite(a).all() for a in results_as_list(got))
    if T == 0:
        np.testing.assert_array_equal(got.h_n, case.h0)
        np.testing.assert_array_equal(got.c_n, case.c0)
        np.testing.assert_array_equal(got.dh_prev, case.dh)
        np.testing.assert_array_equal(got.dc_prev, case.dc)
    if T == 0 or B == 0 or H == 0:  # nothing to differentiate
        for p in got.dparams:
            np.testing.assert_array_equal(p, 0.0)
        np.testing.assert_array_equal(got.dx, 0.0)
    if H == 0:
        assert got.dx.size > 0  # all-zero dx of the full input shape
    if I == 0:
        # The recurrence still runs on h0 and the biases: compare with the reference.
        expected, _, _ = run_lstmcy(reference, case)
        for a, b in zip(results_as_list(got), results_as_list(expected)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        assert np.abs(got.y).max() > 0 and np.abs(got.dh_prev).max() > 0


@pytest.mark.parametrize("layout", ["packed", "padded_2d"])
def test_zero_steps_varlen(layout):
    """T = 0 with (empty) batch_sizes: h_n = h0, dh_prev = dh; B comes from hx."""
    rng = np.random.default_rng(4)
    L, D, B, I, H = 2, 2, 3, 5, 4
    x = np.zeros((0, I))
    h0, c0 = rng.standard_normal((2, L * D, B, H))
    dh, dc = rng.standard_normal((2, L * D, B, H))
    params = make_params(rng, L, D, I, H, True)
    kw = dict(num_layers=L, bidirectional=True, batch_sizes=np.zeros(0, dtype=np.int64))
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, (h0, c0), params, **kw)
    assert y.shape == (0, D * H)
    np.testing.assert_array_equal(h_n, h0)
    np.testing.assert_array_equal(c_n, c0)
    dx, dh_prev, dc_prev, dparams = lstmcy.lstm_backward(
        x, (h0, c0), params, np.zeros((0, D * H)), dh, dc, *cache.saved(), **kw)
    assert dx.shape == (0, I)
    np.testing.assert_array_equal(dh_prev, dh)
    np.testing.assert_array_equal(dc_prev, dc)
    for p, q in zip(dparams, params, strict=True):
        assert p.shape == q.shape
        np.testing.assert_array_equal(p, 0.0)


@pytest.mark.parametrize("batch_first", [False, True])
def test_empty_batch_of_any_length_costs_nothing_per_step(batch_first):
    """B = 0 with T = 2**40 (a zero-byte input): nothing of size T is built (per-step tables
    of that length would need terabytes), and the results are the empty ones."""
    rng = np.random.default_rng(5)
    T, I, H = 2 ** 40, 3, 4
    x = np.zeros((0, T, I) if batch_first else (T, 0, I))
    params = make_params(rng, 2, 2, I, H, True)
    kw = dict(num_layers=2, bidirectional=True, batch_first=batch_first)
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, None, params, **kw)
    assert y.shape == x.shape[:2] + (2 * H,) and h_n.shape == c_n.shape == (4, 0, H)
    dx, dh_prev, dc_prev, dparams = lstmcy.lstm_backward(
        x, None, params, np.zeros_like(y), None, None, *cache.saved(), **kw)
    assert dx.shape == x.shape and dh_prev.shape == (4, 0, H)
    for p, q in zip(dparams, params, strict=True):
        assert p.shape == q.shape
        np.testing.assert_array_equal(p, 0.0)


# ---------------------------------------------------------------------------
# output_mask
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["time_major", "packed"])
def test_output_mask_combinations(layout):
    case = make_case(8, T=5, B=3, I=4, H=3, num_layers=2, bidirectional=True, layout=layout,
                     dropout=0.3)
    full, _ = forward_backward(case)
    for mask in itertools.product((False, True), repeat=4):
        outputs, _ = forward_backward(case, output_mask=mask)
        grads = outputs[3:]
        dx, dh_prev, dc_prev = grads[:3]
        dparams = grads[3:]
        for wanted, value, name in zip(mask[:3], (dx, dh_prev, dc_prev), ("dx", "dh_prev", "dc_prev")):
            assert (value is None) == (not wanted), (mask, name)
        assert (dparams == [None]) == (not mask[3]), mask
        expected = full[:3] + [full[3 + k] if mask[k] else None for k in range(3)] + (
            full[6:] if mask[3] else [None])
        assert_bitwise_equal(outputs, expected, f"output_mask={mask}")


# ---------------------------------------------------------------------------
# memory layouts, input integrity, reproducibility
# ---------------------------------------------------------------------------

def fortran(a):
    return np.asfortranarray(a)


def strided(a):
    """Same values in a view with every axis strided by 2 (non-contiguous)."""
    big = np.full(tuple(2 * n for n in a.shape), np.nan, dtype=a.dtype)
    view = big[tuple(slice(None, None, 2) for _ in a.shape)]
    view[...] = a
    return view


def negative(a):
    """Same values in a view with negative strides on every axis."""
    buf = np.empty_like(a)
    view = buf[tuple(slice(None, None, -1) for _ in a.shape)]
    view[...] = a
    return view


@pytest.mark.parametrize("layout", ["time_major", "batch_first", "packed", "padded_2d"])
@pytest.mark.parametrize("make_view", [fortran, strided, negative])
def test_any_strides_same_bits(make_view, layout):
    case = make_case(9, T=5, B=3, I=4, H=3, num_layers=2, bidirectional=True, layout=layout,
                     dropout=0.3)
    expected, _ = forward_backward(case)
    arrays = {name: make_view(a) for name, a in case.arrays().items()}
    arrays["saved"] = lambda saved: tuple([make_view(a) for a in lst] for lst in saved)
    for name, a in arrays.items():
        if name != "saved" and a.ndim > 1 and a.size > 1:
            assert not a.flags.c_contiguous, name
    got, _ = forward_backward(case, arrays=arrays)
    assert_bitwise_equal(got, expected, make_view.__name__)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_inputs_never_modified(dtype):
    case = make_case(10, T=5, B=3, I=4, H=3, num_layers=2, bidirectional=True, layout="padded_2d",
                     dropout=0.3, dtype=dtype)
    y, h_n, c_n, cache = lstmcy.lstm_forward(case.x, case.hx, case.params, dropout=case.dropout,
                                             seed=case.seed, **case.kwargs())
    inputs = list(case.arrays().values()) + [a for lst in cache.saved() for a in lst] \
        + list(cache.dropout_masks)
    # Half of them read-only: they must be accepted and stay read-only.
    for a in inputs[::2]:
        a.flags.writeable = False
    flags = [(a.flags.writeable, a.flags.c_contiguous, a.flags.owndata) for a in inputs]
    copies = [a.copy() for a in inputs]
    for _ in range(2):
        lstmcy.lstm_forward(case.x, case.hx, case.params, dropout=case.dropout, seed=case.seed,
                            **case.kwargs())
        lstmcy.lstm_backward(case.x, case.hx, case.params, case.dy, case.dh, case.dc,
                             *cache.saved(), dropout=case.dropout,
                             dropout_masks=cache.dropout_masks, **case.kwargs())
    for k, (a, before) in enumerate(zip(inputs, copies)):
        assert a.tobytes() == before.tobytes(), f"input {k} was modified"
    assert flags == [(a.flags.writeable, a.flags.c_contiguous, a.flags.owndata) for a in inputs]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_repeated_calls_bitwise_identical(dtype):
    case = make_case(12, T=7, B=5, I=6, H=9, num_layers=3, bidirectional=True, layout="packed",
                     dropout=0.2, dtype=dtype)
    first, _ = forward_backward(case)
    other = make_case(13, T=3, B=8, I=2, H=17, num_layers=1, layout="time_major", dtype=dtype)
    for _ in range(2):
        forward_backward(other)  # different sizes in between: no state carried over
        again, _ = forward_backward(case)
        assert_bitwise_equal(again, first, "repeated call")


def test_dropout_seed_reproducible_and_masks_used():
    case = make_case(14, T=5, B=3, I=4, H=3, num_layers=2, layout="time_major", dropout=0.5)
    first, cache1 = forward_backward(case)
    again, cache2 = forward_backward(case)
    for a, b in zip(cache1.dropout_masks, cache2.dropout_masks, strict=True):
        np.testing.assert_array_equal(a, b)
    case.seed = 15
    other, cache3 = forward_backward(case)
    assert not np.array_equal(cache1.dropout_masks[0], cache3.dropout_masks[0])
    assert not np.array_equal(first[0], other[0])


# ---------------------------------------------------------------------------
# gradient scales, hx=None, inference
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["time_major", "packed", "padded_2d"])
def test_gradients_with_scales_over_decades_match_torch(layout):
    """dy, dh, dc with random signs and magnitudes 1e-5 .. 1e5."""
    case = make_case(16, T=6, B=4, I=3, H=5, num_layers=2, bidirectional=True, layout=layout,
                     grad_scale_decades=5.0)
    got, _, _ = run_lstmcy(lstmcy, case)
    expected = torch_lstm(case.x, case.hx, case.params, dy=case.dy, dh=case.dh, dc=case.dc,
                          **case.kwargs())
    got, expected = got.named(case), expected.named(case)
    errors = {n: np.abs(got[n] - expected[n]).max() / np.abs(expected[n]).max() for n in expected}
    bad = {n: f"{e:.3g}" for n, e in errors.items() if not e <= 1e-10}
    assert not bad, bad


@pytest.mark.parametrize("power", [-300, -60, -1, 7, 60, 300])
def test_backward_is_exactly_linear_in_power_of_two_scaling(power):
    """Scaling dy, dh, dc by 2**k scales every gradient by exactly 2**k (no under/overflow)."""
    case = make_case(17, T=5, B=3, I=4, H=3, num_layers=2, bidirectional=True, layout="packed")
    base = run_lstmcy(lstmcy, case)[0]
    scale = 2.0 ** power
    case.dy, case.dh, case.dc = case.dy * scale, case.dh * scale, case.dc * scale
    scaled = run_lstmcy(lstmcy, case)[0]
    for name in ("dx", "dh_prev", "dc_prev"):
        np.testing.assert_array_equal(getattr(scaled, name), getattr(base, name) * scale, name)
    for k, (a, b) in enumerate(zip(scaled.dparams, base.dparams)):
        np.testing.assert_array_equal(a, b * scale, f"dparams[{k}]")


@pytest.mark.parametrize("layout", ["time_major", "packed"])
def test_hx_none_is_zeros(layout):
    case = make_case(18, T=4, B=3, I=4, H=3, num_layers=2, bidirectional=True, layout=layout)
    zeros = (np.zeros_like(case.h0), np.zeros_like(case.c0))
    with_none, _ = forward_backward(case, hx=None)
    with_zeros, _ = forward_backward(case, hx=zeros)
    assert_bitwise_equal(with_none, with_zeros, "hx=None")
    assert with_none[4].shape == case.h0.shape  # dh_prev still returned
    expected = torch_lstm(case.x, None, case.params, dy=case.dy, dh=case.dh, dc=case.dc,
                          **case.kwargs())
    np.testing.assert_allclose(with_none[4], expected.dh_prev, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(with_none[0], expected.y, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("layout", ["time_major", "batch_first", "packed", "padded_2d"])
def test_inference_mode(layout, dtype):
    """train=False: cache None, same outputs as training, and no dropout applied."""
    case = make_case(19, T=5, B=3, I=4, H=3, num_layers=3, bidirectional=True, layout=layout,
                     dtype=dtype)
    kw = case.kwargs()
    y, h_n, c_n, cache = lstmcy.lstm_forward(case.x, case.hx, case.params, **kw)
    assert cache is not None
    for dropout in (0.0, 0.5):
        y2, h2, c2, cache2 = lstmcy.lstm_forward(case.x, case.hx, case.params, train=False,
                                                 dropout=dropout, seed=1, **kw)
        assert cache2 is None
        assert_bitwise_equal([y2, h2, c2], [y, h_n, c_n], f"train=False, dropout={dropout}")


def test_oracle_param_names_follow_torch():
    """The names used in failure messages are nn.LSTM's, in params order."""
    import torch

    module = torch.nn.LSTM(3, 2, num_layers=2, bidirectional=True)
    assert param_names(2, True, True) == [name for name, _ in module.named_parameters()]
