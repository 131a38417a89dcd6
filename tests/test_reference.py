"""Tests of the numpy reference (lstmcy.reference) against PyTorch and finite differences.

The reference is the oracle of the other tests, so it is checked here on its
own: forward outputs and every backward output against PyTorch float64
autograd of ``torch._VF.lstm`` (and its packed overload), central finite
differences, edge sizes, dtypes, dropout masks and non-finite propagation.
"""

import numpy as np
import pytest

from lstmcy import reference as ref
from lstmcy._engine.cache import LSTMCache
from torch_oracle import make_params

torch = pytest.importorskip("torch")

RTOL = 1e-10


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def assert_close(actual, desired, rtol=RTOL, what=""):
    """Max-norm relative comparison: |a - d| <= rtol * (|d| + max|d|)."""
    actual = np.asarray(actual, dtype=np.float64)
    desired = np.asarray(desired, dtype=np.float64)
    assert actual.shape == desired.shape, (what, actual.shape, desired.shape)
    scale = float(np.max(np.abs(desired))) if desired.size else 0.0
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=rtol * scale,
                               err_msg=what)


def scaled_normal(rng, shape):
    """Random values with signs and magnitudes spread over several decades."""
    return rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)


def lengths_to_batch_sizes(lengths):
    """PackedSequence batch sizes of decreasing sequence lengths."""
    lengths = np.asarray(lengths)
    return np.array([(lengths > t).sum() for t in range(lengths.max())],
                    dtype=np.int64)


def pack(time_major, batch_sizes):
    """Padded time-major [T, B, W] -> packed [sum(bs), W]."""
    return np.concatenate([time_major[t, :n] for t, n in enumerate(batch_sizes)])


def active_mask(batch_sizes, batch):
    """[T, B] bool, True where row b is active at step t."""
    return np.arange(batch)[None, :] < np.asarray(batch_sizes)[:, None]


def torch_lstm(x, hx, params, dy, dh, dc, *, has_bias, num_layers, bidirectional,
               batch_first=False, batch_sizes=None, dropout=0.0, train=True):
    """Forward and float64 autograd backward of torch._VF.lstm.

    ``x`` and ``dy`` are packed 2-D when ``batch_sizes`` is given.
    Returns y, h_n, c_n, dx, dh0, dc0, dparams as numpy arrays.
    """
    xt = torch.tensor(x, requires_grad=True)
    h0 = torch.tensor(hx[0], requires_grad=True)
    c0 = torch.tensor(hx[1], requires_grad=True)
    weights = [torch.tensor(p, requires_grad=True) for p in params]
    if batch_sizes is None:
        y, h_n, c_n = torch._VF.lstm(xt, (h0, c0), weights, has_bias, num_layers,
                                     dropout, train, bidirectional, batch_first)
    else:
        y, h_n, c_n = torch._VF.lstm(xt, torch.tensor(batch_sizes), (h0, c0),
                                     weights, has_bias, num_layers, dropout,
                                     train, bidirectional)
    loss = ((y * torch.tensor(dy)).sum() + (h_n * torch.tensor(dh)).sum()
            + (c_n * torch.tensor(dc)).sum())
    loss.backward()
    return (y.detach().numpy(), h_n.detach().numpy(), c_n.detach().numpy(),
            xt.grad.numpy(), h0.grad.numpy(), c0.grad.numpy(),
            [w.grad.numpy() for w in weights])


def run_reference(x, hx, params, dy, dh, dc, **kwargs):
    """Reference forward then backward; returns forward and backward results."""
    seed = kwargs.pop("seed", None)
    y, h_n, c_n, cache = ref.lstm_forward(x, hx, params, seed=seed, **kwargs)
    grads = ref.lstm_backward(x, hx, params, dy, dh, dc, *cache.saved(),
                              dropout_masks=cache.dropout_masks, **kwargs)
    return (y, h_n, c_n, cache), grads


# ---------------------------------------------------------------------------
# against PyTorch float64 autograd
# ---------------------------------------------------------------------------

LAYOUTS = ["time_major", "batch_first", "packed", "padded_2d", "padded_3d",
           "padded_3d_batch_first"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("has_bias", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_against_torch(num_layers, bidirectional, has_bias, layout):
    rng = np.random.default_rng(
        [num_layers, bidirectional, has_bias, LAYOUTS.index(layout)])
    T, B, I, H = 5, 4, 3, 3
    D = 2 if bidirectional else 1
    variable = layout in ("packed", "padded_2d", "padded_3d", "padded_3d_batch_first")
    lengths = [5, 4, 4, 2] if variable else [T] * B
    bs = lengths_to_batch_sizes(lengths)
    active = active_mask(bs, B)[:, :, None]

    params = make_params(rng, num_layers, D, I, H, has_bias)
    hx = (rng.standard_normal((D * num_layers, B, H)),
          rng.standard_normal((D * num_layers, B, H)))
    x_tm = rng.standard_normal((T, B, I))
    dy_tm = scaled_normal(rng, (T, B, D * H))
    dh = scaled_normal(rng, (D * num_layers, B, H))
    dc = scaled_normal(rng, (D * num_layers, B, H))
    # Padded positions hold NaN: the reference must ignore them.
    x_tm = np.where(active, x_tm, np.nan)
    dy_tm = np.where(active, dy_tm, np.nan)

    kwargs = dict(has_bias=has_bias, num_layers=num_layers,
                  bidirectional=bidirectional)
    if variable:
        t_y, t_hn, t_cn, t_dx, t_dh0, t_dc0, t_dp = torch_lstm(
            pack(x_tm, bs), hx, params, pack(dy_tm, bs), dh, dc,
            batch_sizes=bs, **kwargs)
    else:
        t_y, t_hn, t_cn, t_dx, t_dh0, t_dc0, t_dp = torch_lstm(
            x_tm, hx, params, dy_tm, dh, dc, **kwargs)
        t_y, t_dx = pack(t_y, bs), pack(t_dx, bs)

    # Lay the inputs out as the case asks; convert outputs back to packed.
    if layout == "time_major":
        x, dy, unlay = x_tm, dy_tm, (lambda a: a)
    elif layout in ("batch_first", "padded_3d_batch_first"):
        x, dy = x_tm.transpose(1, 0, 2), dy_tm.transpose(1, 0, 2)
        unlay = lambda a: a.transpose(1, 0, 2)  # noqa: E731
        kwargs["batch_first"] = True
    elif layout == "packed":
        x, dy, unlay = pack(x_tm, bs), pack(dy_tm, bs), None
    elif layout == "padded_2d":
        x, dy = x_tm.reshape(T * B, I), dy_tm.reshape(T * B, D * H)
        unlay = lambda a: a.reshape(T, B, -1)  # noqa: E731
    else:  # padded_3d
        x, dy, unlay = x_tm, dy_tm, (lambda a: a)
    if variable:
        kwargs["batch_sizes"] = bs

    (y, h_n, c_n, cache), (dx, dh0, dc0, dparams) = run_reference(
        x, hx, params, dy, dh, dc, **kwargs)

    assert y.dtype == np.float64 and y.shape[:-1] == x.shape[:-1]
    assert dx.shape == x.shape
    if unlay is not None:
        y_tm, dx_tm = unlay(y), unlay(dx)
        # Padded positions: exactly zero.
        assert np.all(np.where(active, 0.0, y_tm) == 0.0)
        assert np.all(np.where(active, 0.0, dx_tm) == 0.0)
        y, dx = pack(y_tm, bs), pack(dx_tm, bs)
    assert_close(y, t_y, what="y")
    assert_close(h_n, t_hn, what="h_n")
    assert_close(c_n, t_cn, what="c_n")
    assert_close(dx, t_dx, what="dx")
    assert_close(dh0, t_dh0, what="dh_prev")
    assert_close(dc0, t_dc0, what="dc_prev")
    assert len(dparams) == len(params)
    for k, (mine, theirs) in enumerate(zip(dparams, t_dp)):
        assert_close(mine, theirs, what=f"dparams[{k}]")
    if has_bias:
        for k in range(2, len(dparams), 4):
            np.testing.assert_array_equal(dparams[k], dparams[k + 1])

    # Cache: time-major [T, B, H], zero where inactive, consistent.
    assert isinstance(cache, LSTMCache)
    assert cache.dropout_masks is None
    for name, arrays in zip("igfohc", cache.saved()[:6]):
        assert len(arrays) == D * num_layers
        for arr in arrays:
            assert arr.shape == (T, B, H), name
            assert np.all(np.where(active, 0.0, arr) == 0.0), name
    for h, o, c, tanhc in zip(cache.h, cache.o, cache.c, cache.tanhc):
        np.testing.assert_array_equal(tanhc, np.tanh(c))
        np.testing.assert_array_equal(h, o * tanhc)
    # Last layer's cached h is y.
    top = np.concatenate(cache.h[-D:], axis=2)
    assert_close(pack(top, bs), t_y, what="cache.h")


@pytest.mark.parametrize("shape", [(3, 0, 2, 3), (3, 2, 0, 3), (3, 2, 2, 0)],
                         ids=["B0", "I0", "H0"])
def test_zero_sizes_against_torch(shape):
    T, B, I, H = shape
    rng = np.random.default_rng(7)
    params = make_params(rng, 2, 2, I, H, True)
    hx = (rng.standard_normal((4, B, H)), rng.standard_normal((4, B, H)))
    x = rng.standard_normal((T, B, I))
    dy = rng.standard_normal((T, B, 2 * H))
    dh = rng.standard_normal((4, B, H))
    dc = rng.standard_normal((4, B, H))
    kwargs = dict(has_bias=True, num_layers=2, bidirectional=True)
    expected = torch_lstm(x, hx, params, dy, dh, dc, **kwargs)
    (y, h_n, c_n, _), (dx, dh0, dc0, dparams) = run_reference(
        x, hx, params, dy, dh, dc, **kwargs)
    for name, mine, theirs in zip(["y", "h_n", "c_n", "dx", "dh0", "dc0"],
                                  [y, h_n, c_n, dx, dh0, dc0], expected[:6]):
        assert_close(mine, theirs, what=name)
    for mine, theirs in zip(dparams, expected[6]):
        assert_close(mine, theirs, what="dparams")


@pytest.mark.parametrize("packed", [False, True])
def test_dropout_against_composed_torch(packed):
    """Dropout masks from the reference, applied between single-layer torch calls."""
    rng = np.random.default_rng(11)
    T, B, I, H, L, D = 4, 3, 2, 3, 3, 2
    p = 0.4
    bs = lengths_to_batch_sizes([4, 3, 1]) if packed else np.full(T, B)
    params = make_params(rng, L, D, I, H, True)
    hx = (rng.standard_normal((D * L, B, H)), rng.standard_normal((D * L, B, H)))
    x_tm = rng.standard_normal((T, B, I))
    dy_tm = rng.standard_normal((T, B, D * H))
    dh = rng.standard_normal((D * L, B, H))
    dc = rng.standard_normal((D * L, B, H))
    kwargs = dict(num_layers=L, bidirectional=True, dropout=p, seed=5)
    if packed:
        x, dy = pack(x_tm, bs), pack(dy_tm, bs)
        kwargs["batch_sizes"] = bs
    else:
        x, dy = x_tm, dy_tm
    (y, h_n, c_n, cache), (dx, dh0, dc0, dparams) = run_reference(
        x, hx, params, dy, dh, dc, **kwargs)
    masks = cache.dropout_masks
    assert len(masks) == L - 1

    # Torch: one single-layer call per layer, the reference's masks in between.
    xt = torch.tensor(x, requires_grad=True)
    h0 = torch.tensor(hx[0], requires_grad=True)
    c0 = torch.tensor(hx[1], requires_grad=True)
    weights = [torch.tensor(w, requires_grad=True) for w in params]
    layer_input, h_ns, c_ns = xt, [], []
    for layer in range(L):
        sl = slice(layer * D, (layer + 1) * D)
        w = weights[layer * 8:(layer + 1) * 8]
        if packed:
            out, hn, cn = torch._VF.lstm(layer_input, torch.tensor(bs),
                                         (h0[sl], c0[sl]), w, True, 1, 0.0,
                                         True, True)
        else:
            out, hn, cn = torch._VF.lstm(layer_input, (h0[sl], c0[sl]), w, True,
                                         1, 0.0, True, True, False)
        h_ns.append(hn)
        c_ns.append(cn)
        if layer < L - 1:
            mask = masks[layer] if not packed else pack(masks[layer], bs)
            layer_input = out * torch.tensor(mask)
    h_n_t, c_n_t = torch.cat(h_ns), torch.cat(c_ns)
    loss = ((out * torch.tensor(dy)).sum() + (h_n_t * torch.tensor(dh)).sum()
            + (c_n_t * torch.tensor(dc)).sum())
    loss.backward()
    assert_close(y, out.detach().numpy(), what="y")
    assert_close(h_n, h_n_t.detach().numpy(), what="h_n")
    assert_close(c_n, c_n_t.detach().numpy(), what="c_n")
    assert_close(dx, xt.grad.numpy(), what="dx")
    assert_close(dh0, h0.grad.numpy(), what="dh_prev")
    assert_close(dc0, c0.grad.numpy(), what="dc_prev")
    for mine, w in zip(dparams, weights):
        assert_close(mine, w.grad.numpy(), what="dparams")


# ---------------------------------------------------------------------------
# finite differences
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["packed_bidir_dropout", "batch_first_nobias"])
def test_finite_differences(case):
    rng = np.random.default_rng(3)
    T, B, I, H = 3, 3, 2, 2
    if case == "packed_bidir_dropout":
        L, D, has_bias = 2, 2, True
        bs = lengths_to_batch_sizes([3, 2, 1])
        kwargs = dict(has_bias=True, num_layers=L, bidirectional=True,
                      dropout=0.3, batch_sizes=bs)
        x = rng.standard_normal((int(bs.sum()), I))
        dy = rng.standard_normal((int(bs.sum()), D * H))
    else:
        L, D, has_bias = 1, 1, False
        kwargs = dict(has_bias=False, num_layers=1, batch_first=True)
        x = rng.standard_normal((B, T, I))
        dy = rng.standard_normal((B, T, H))
    params = make_params(rng, L, D, I, H, has_bias)
    h0 = rng.standard_normal((D * L, B, H))
    c0 = rng.standard_normal((D * L, B, H))
    dh = rng.standard_normal((D * L, B, H))
    dc = rng.standard_normal((D * L, B, H))
    seed = 2  # fixed masks for every evaluation

    def loss(x_, h0_, c0_, params_):
        y, h_n, c_n, _ = ref.lstm_forward(x_, (h0_, c0_), params_, seed=seed,
                                          **kwargs)
        return np.sum(y * dy) + np.sum(h_n * dh) + np.sum(c_n * dc)

    y, h_n, c_n, cache = ref.lstm_forward(x, (h0, c0), params, seed=seed, **kwargs)
    if case == "packed_bidir_dropout":
        assert cache.dropout_masks is not None
        assert np.any(cache.dropout_masks[0] == 0.0)
    dx, dh0, dc0, dparams = ref.lstm_backward(
        x, (h0, c0), params, dy, dh, dc, *cache.saved(),
        dropout_masks=cache.dropout_masks, **kwargs)

    arrays = [x, h0, c0] + list(params)
    analytic = [dx, dh0, dc0] + list(dparams)
    eps = 1e-6
    for which, (arr, grad) in enumerate(zip(arrays, analytic)):
        numeric = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            values = []
            for sign in (1.0, -1.0):
                perturbed = [a.copy() for a in arrays]
                perturbed[which][idx] += sign * eps
                values.append(loss(perturbed[0], perturbed[1], perturbed[2],
                                   perturbed[3:]))
            numeric[idx] = (values[0] - values[1]) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7,
                                   err_msg=f"argument {which}")


# ---------------------------------------------------------------------------
# edge cases, options, dtypes, dropout masks, non-finite values
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("packed", [False, True])
def test_zero_time_steps(packed):
    rng = np.random.default_rng(0)
    B, I, H, L, D = 3, 2, 4, 2, 2
    params = make_params(rng, L, D, I, H, True)
    hx = (rng.standard_normal((D * L, B, H)), rng.standard_normal((D * L, B, H)))
    dh = rng.standard_normal((D * L, B, H))
    dc = rng.standard_normal((D * L, B, H))
    if packed:
        x, dy = np.zeros((0, I)), np.zeros((0, D * H))
        kwargs = dict(batch_sizes=np.zeros(0, dtype=np.int64))
    else:
        x, dy = np.zeros((0, B, I)), np.zeros((0, B, D * H))
        kwargs = {}
    kwargs.update(num_layers=L, bidirectional=True, dropout=0.5, seed=0)
    (y, h_n, c_n, cache), (dx, dh0, dc0, dparams) = run_reference(
        x, hx, params, dy, dh, dc, **kwargs)
    assert y.shape == dy.shape and dx.shape == x.shape
    np.testing.assert_array_equal(h_n, hx[0])
    np.testing.assert_array_equal(c_n, hx[1])
    np.testing.assert_array_equal(dh0, dh)
    np.testing.assert_array_equal(dc0, dc)
    assert all(a.shape == (0, B, H) for a in cache.h)
    for mine, w in zip(dparams, params):
        assert mine.shape == w.shape and not mine.any()


def test_hx_none_means_zeros():
    rng = np.random.default_rng(1)
    T, B, I, H = 4, 2, 3, 2
    params = make_params(rng, 2, 1, I, H, True)
    x = rng.standard_normal((T, B, I))
    dy = rng.standard_normal((T, B, H))
    zeros = (np.zeros((2, B, H)), np.zeros((2, B, H)))
    with_none = run_reference(x, None, params, dy, None, None, num_layers=2)
    with_zeros = run_reference(x, zeros, params, dy, zeros[0], zeros[1],
                               num_layers=2)
    for a, b in zip(with_none[0][:3] + with_none[1][:3],
                    with_zeros[0][:3] + with_zeros[1][:3]):
        np.testing.assert_array_equal(a, b)


def test_output_mask():
    rng = np.random.default_rng(2)
    T, B, I, H = 3, 2, 3, 2
    params = make_params(rng, 1, 2, I, H, True)
    hx = (rng.standard_normal((2, B, H)), rng.standard_normal((2, B, H)))
    x = rng.standard_normal((T, B, I))
    dy = rng.standard_normal((T, B, 2 * H))
    dh, dc = hx[0] * 0.5, hx[1] * 0.25
    _, full = run_reference(x, hx, params, dy, dh, dc, bidirectional=True)
    y, h_n, c_n, cache = ref.lstm_forward(x, hx, params, bidirectional=True)
    for mask in [(False, True, True, True), (True, False, False, True),
                 (False, False, False, False), (True, True, True, False)]:
        got = ref.lstm_backward(x, hx, params, dy, dh, dc, *cache.saved(),
                                bidirectional=True, output_mask=mask)
        for keep, mine, reference in zip(mask, got, full):
            if not keep:
                assert mine is None
            elif isinstance(reference, list):
                for a, b in zip(mine, reference):
                    np.testing.assert_array_equal(a, b)
            else:
                np.testing.assert_array_equal(mine, reference)


def test_dropout_masks():
    rng = np.random.default_rng(4)
    T, B, I, H, L = 6, 5, 2, 3, 3
    p = 0.25
    params = make_params(rng, L, 2, I, H, True)
    x = rng.standard_normal((T, B, I))
    kwargs = dict(num_layers=L, bidirectional=True, dropout=p)
    _, _, _, cache = ref.lstm_forward(x, None, params, seed=9, **kwargs)
    masks = cache.dropout_masks
    draw = np.random.default_rng(9)
    assert len(masks) == L - 1
    for mask in masks:
        assert mask.shape == (T, B, 2 * H) and mask.dtype == np.float64
        expected = (draw.random((T, B, 2 * H)) >= p) / (1 - p)
        np.testing.assert_array_equal(mask, expected)
    assert set(np.unique(masks[0])) <= {0.0, 1.0 / (1 - p)}
    # Masks are stored in the input dtype; a Generator works as seed too.
    for low in (np.float32, np.float16):
        _, _, _, cache_low = ref.lstm_forward(
            x.astype(low), None, [w.astype(low) for w in params],
            seed=np.random.default_rng(9), **kwargs)
        assert cache_low.dropout_masks[0].dtype == low
        np.testing.assert_array_equal(cache_low.dropout_masks[0],
                                      masks[0].astype(low))
    # No masks in inference, for one layer, or without dropout.
    assert ref.lstm_forward(x, None, params, seed=9, train=False,
                            **kwargs)[3].dropout_masks is None
    assert ref.lstm_forward(x, None, params[:8], num_layers=1, bidirectional=True,
                            dropout=p)[3].dropout_masks is None
    # train=False: dropout is inactive, so the output equals dropout=0.
    y_eval = ref.lstm_forward(x, None, params, seed=9, train=False, **kwargs)[0]
    y_plain = ref.lstm_forward(x, None, params, num_layers=L, bidirectional=True)[0]
    np.testing.assert_array_equal(y_eval, y_plain)
    # The backward refuses to run without masks when dropout is active.
    with pytest.raises(ValueError, match="dropout_masks"):
        ref.lstm_backward(x, None, params, np.zeros((T, B, 2 * H)), None, None,
                          *cache.saved(), **kwargs)


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
def test_low_precision_dtypes(dtype_name):
    """Computation is float64 internally; results are cast to the input dtype."""
    if dtype_name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dtype = np.dtype(ml_dtypes.bfloat16)
    else:
        dtype = np.dtype(dtype_name)
    rng = np.random.default_rng(6)
    T, B, I, H = 4, 3, 2, 3
    bs = lengths_to_batch_sizes([4, 2, 2])
    cast = lambda a: np.asarray(a).astype(dtype)  # noqa: E731
    wide = lambda a: np.asarray(a).astype(np.float64)  # noqa: E731
    params = [cast(w) for w in make_params(rng, 2, 2, I, H, True)]
    hx = (cast(rng.standard_normal((4, B, H))), cast(rng.standard_normal((4, B, H))))
    x = cast(rng.standard_normal((int(bs.sum()), I)))
    dy = cast(rng.standard_normal((int(bs.sum()), 2 * H)))
    dh = cast(rng.standard_normal((4, B, H)))
    dc = cast(rng.standard_normal((4, B, H)))
    kwargs = dict(num_layers=2, bidirectional=True, batch_sizes=bs)

    y, h_n, c_n, cache = ref.lstm_forward(x, hx, params, **kwargs)
    y64, h_n64, c_n64, cache64 = ref.lstm_forward(
        wide(x), (wide(hx[0]), wide(hx[1])), [wide(w) for w in params], **kwargs)
    for mine, exact in [(y, y64), (h_n, h_n64), (c_n, c_n64),
                        (cache.c[3], cache64.c[3])]:
        assert mine.dtype == dtype
        np.testing.assert_array_equal(mine, exact.astype(dtype))

    grads = ref.lstm_backward(x, hx, params, dy, dh, dc, *cache.saved(), **kwargs)
    grads64 = ref.lstm_backward(
        wide(x), (wide(hx[0]), wide(hx[1])), [wide(w) for w in params], wide(dy),
        wide(dh), wide(dc), *[[wide(a) for a in arrays] for arrays in cache.saved()],
        **kwargs)
    mine_all = list(grads[:3]) + list(grads[3])
    exact_all = list(grads64[:3]) + list(grads64[3])
    for mine, exact in zip(mine_all, exact_all):
        assert mine.dtype == dtype
        np.testing.assert_array_equal(mine, exact.astype(dtype))


NONFINITE_TARGETS = ["x", "h0", "c0", "w_ih", "w_hh", "b_ih", "dy", "dh", "dc"]


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("target", NONFINITE_TARGETS)
def test_nonfinite_pattern_matches_torch(target, value):
    """Non-finite outputs (and which are NaN) are exactly those of torch."""
    rng = np.random.default_rng(NONFINITE_TARGETS.index(target))
    T, B, I, H, L, D = 3, 3, 2, 2, 2, 2
    params = make_params(rng, L, D, I, H, True)
    h0 = rng.standard_normal((D * L, B, H))
    c0 = rng.standard_normal((D * L, B, H))
    x = rng.standard_normal((T, B, I))
    dy = rng.standard_normal((T, B, D * H))
    dh = rng.standard_normal((D * L, B, H))
    dc = rng.standard_normal((D * L, B, H))
    arrays = dict(x=x, h0=h0, c0=c0, dy=dy, dh=dh, dc=dc,
                  w_ih=params[8], w_hh=params[1], b_ih=params[6])
    arr = arrays[target]
    arr[tuple(s // 2 for s in arr.shape)] = value
    kwargs = dict(has_bias=True, num_layers=L, bidirectional=True)
    expected = torch_lstm(x, (h0, c0), params, dy, dh, dc, **kwargs)
    (y, h_n, c_n, _), (dx, dh0, dc0, dparams) = run_reference(
        x, (h0, c0), params, dy, dh, dc, **kwargs)
    names = ["y", "h_n", "c_n", "dx", "dh_prev", "dc_prev"] + [
        f"dparams[{k}]" for k in range(len(params))]
    for name, mine, theirs in zip(names, [y, h_n, c_n, dx, dh0, dc0] + dparams,
                                  list(expected[:6]) + expected[6]):
        np.testing.assert_array_equal(np.isnan(mine), np.isnan(theirs), err_msg=name)
        np.testing.assert_array_equal(np.isposinf(mine), np.isposinf(theirs),
                                      err_msg=name)
        np.testing.assert_array_equal(np.isneginf(mine), np.isneginf(theirs),
                                      err_msg=name)
        finite = np.isfinite(theirs)
        assert_close(mine[finite], theirs[finite], what=name)


def test_signatures_match_public_api():
    import inspect

    import lstmcy

    for name in ("lstm_forward", "lstm_backward"):
        public = inspect.signature(getattr(lstmcy, name))
        # The public backward also takes backend= (CPU or an Ascend NPU); the reference
        # is CPU only.
        public = public.replace(parameters=[p for p in public.parameters.values()
                                            if p.name != "backend"])
        assert inspect.signature(getattr(ref, name)) == public, name
