"""Accuracy where the gates saturate and in float16/bfloat16, against PyTorch in the same
dtype (the promise: no worse than PyTorch), and how float16/bfloat16 backwards get the
forward's float32 activations.

Errors are norm-wise relative, per output, against PyTorch float64 autograd on the same
(rounded) values; see ``torch_oracle.py``. The activations' own accuracy is tested in
``test_kernels.py``.
"""
import itertools

import numpy as np
import pytest

import lstmcy

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from torch_oracle import as_f64, assert_no_worse_than, make_params, torch_lstm  # noqa: E402

LOWP = {"float16": (np.float16, torch.float16), "bfloat16": (ml_dtypes.bfloat16, torch.bfloat16)}


def _saturated_params(rng, L, D, I, H, reach):
    """Weights and biases in [0, w] with w = min(1, reach / fan-in): with inputs and states
    in [0, 1] the pre-activations are all positive, ~reach / 3 and more."""
    params = []
    for layer in range(L):
        layer_in = I if layer == 0 else D * H
        high = min(1.0, reach / (layer_in + H))
        for _ in range(D):
            params += [rng.uniform(0, high, s) for s in
                       ((4 * H, layer_in), (4 * H, H), (4 * H,), (4 * H,))]
    return params


def _problem(kind, seed, *, T, B, I, H, num_layers, bidirectional, batch_first, lowp=None):
    """``(x, hx, params, dy, dh, dc)`` in float64 (kwargs: the shapes and options).

    kind "saturated": positive inputs, states and weights (float32: weights in [0, 1];
    ``lowp``: scaled to the fan-in, see :func:`_saturated_params`), gradients of random
    sign and magnitudes 2**U(-8, 12) (float32) or 2**U(-4, 4). "tiny" / "huge": the usual
    weights, gradients 2**U(-4, 4) scaled down / up to the edge of ``lowp``'s range (inputs
    x4 for "huge").
    """
    rng = np.random.default_rng(seed)
    L, D = num_layers, 2 if bidirectional else 1
    x_shape = (B, T, I) if batch_first else (T, B, I)
    if kind == "saturated":
        x = rng.uniform(0, 1, x_shape)
        hx = tuple(rng.uniform(0, 1, (2, L * D, B, H)))
        params = _saturated_params(rng, L, D, I, H, np.inf if lowp is None else 16)
        decades, scale = ((-8, 12) if lowp is None else (-4, 4)), 1.0
    else:
        x = rng.standard_normal(x_shape) * (4 if kind == "huge" else 1)
        hx = tuple(rng.standard_normal((2, L * D, B, H)))
        params = make_params(rng, L, D, I, H, True)
        edge = {"float16": (-12, 8), "bfloat16": (-100, 100)}[lowp]
        decades, scale = (-4, 4), 2.0 ** edge[kind == "huge"]

    def grads(shape):
        return rng.choice([-1.0, 1.0], shape) * 2.0 ** rng.uniform(*decades, shape) * scale

    return x, hx, params, grads(x_shape[:2] + (D * H,)), grads((L * D, B, H)), grads((L * D, B, H))


def _cast(problem, dtype):
    """``problem`` (``(x, hx, params, dy, dh, dc)``) rounded to ``dtype``."""
    x, hx, params, dy, dh, dc = problem
    return (x.astype(dtype), tuple(a.astype(dtype) for a in hx), [p.astype(dtype) for p in params],
            dy.astype(dtype), dh.astype(dtype), dc.astype(dtype))


def _compare(problem, dtype, torch_dtype, options, what, **kwargs):
    """lstmcy in ``dtype`` and torch in ``torch_dtype`` against float64 autograd, on
    ``problem`` rounded to ``dtype`` (``options``: num_layers, bidirectional, batch_first);
    ``kwargs`` go to :func:`assert_no_worse_than`."""
    x, hx, params, dy, dh, dc = _cast(problem, dtype)
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params, **options)
    dx, dh_prev, dc_prev, dparams = lstmcy.lstm_backward(x, hx, params, dy, dh, dc, *cache.saved(),
                                                         **options)
    names = ["y", "h_n", "c_n", "dx", "dh_prev", "dc_prev"] + [f"params[{k}]" for k in range(len(params))]
    ours = dict(zip(names, [y, h_n, c_n, dx, dh_prev, dc_prev, *dparams]))
    exact, theirs = [
        dict(zip(names, [r.y, r.h_n, r.c_n, r.dx, r.dh_prev, r.dc_prev, *r.dparams]))
        for r in (torch_lstm(x, hx, params, dy=dy, dh=dh, dc=dc, dtype=t, **options)
                  for t in (torch.float64, torch_dtype))]
    assert_no_worse_than(ours, theirs, exact, what, **kwargs)


FAMILIES = {"moderate": dict(T=16, B=64, I=4, H=16),  # layer 0: pre-activations ~5 and more
            "deep": dict(T=12, B=16, I=8, H=32)}       # ~10 and more: many gates round to 1
SATURATED_GRID = list(itertools.product(FAMILIES, (1, 2), (False, True), (False, True)))


@pytest.mark.parametrize("family, num_layers, bidirectional, batch_first", SATURATED_GRID,
                         ids=[f"{f}-L{L}-{'bi' if bi else 'uni'}-{'bf' if bf else 'tm'}"
                              for f, L, bi, bf in SATURATED_GRID])
def test_saturated_float32_gradients_no_worse_than_torch(family, num_layers, bidirectional,
                                                         batch_first):
    """Every float32 output and gradient within 1.05x of PyTorch float32's error. (With
    sigmoid as 1 / (1 + exp(-x)), which rounds 1 + exp(-x), the gradients through
    1 - sigma get up to 3x PyTorch's error here.)"""
    options = dict(num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first)
    problem = _problem("saturated", 11, **options, **FAMILIES[family])
    _compare(problem, np.float32, torch.float32, options, f"{family} {options}")


LOWP_GRID = list(itertools.product(LOWP, ("saturated", "tiny", "huge"), (1, 2), (False, True)))


@pytest.mark.parametrize("dtype_name, kind, num_layers, batch_first", LOWP_GRID,
                         ids=[f"{d}-{k}-L{L}-{'bf' if bf else 'tm'}" for d, k, L, bf in LOWP_GRID])
def test_low_precision_extremes_no_worse_than_torch(dtype_name, kind, num_layers, batch_first):
    """float16 / bfloat16 against PyTorch in that dtype (typical cases:
    ``test_against_torch.py``): within 1.05x of its error and below the format's unit
    roundoff, which needs the float32 activations where the gates saturate (rounded to the
    format, 1 - sigma loses all its digits: PyTorch's worst error there is 8-99 %)."""
    np_dtype, torch_dtype = LOWP[dtype_name]
    options = dict(num_layers=num_layers, bidirectional=num_layers == 2, batch_first=batch_first)
    problem = _problem(kind, 23, T=8, B=8, I=6, H=16, lowp=dtype_name, **options)
    _compare(problem, np_dtype, torch_dtype, options, f"{dtype_name} {kind} {options}",
             below=float(ml_dtypes.finfo(np_dtype).eps) / 2)


def _as_float32(arrays):
    return [a.astype(np.float32) for a in arrays]


def _flat(result):
    """The arrays of a forward's or backward's result, nested lists flattened."""
    return [a for item in result for a in (item if isinstance(item, (list, tuple)) else [item])]


@pytest.mark.parametrize("use_plan", [False, True])
@pytest.mark.parametrize("dtype_name", LOWP)
def test_low_precision_backward_takes_the_forwards_float32_values(dtype_name, use_plan):
    """Handed the forward's own saved arrays, a float16/bfloat16 backward gives exactly the
    float32 call's results, rounded; copies of them are used as given (rounded values), and
    the arrays themselves are read-only."""
    dtype = LOWP[dtype_name][0]
    # dropout 0.5: the mask values 0 and 2 are the same in every dtype.
    options = dict(num_layers=2, bidirectional=True, batch_first=True, dropout=0.5)
    problem = _problem("saturated", 5, T=6, B=3, I=4, H=8, num_layers=2, bidirectional=True,
                       batch_first=True, lowp=dtype_name)
    x, hx, params, dy, dh, dc = lowp = _cast(problem, dtype)
    x32, hx32, params32, dy32, dh32, dc32 = _cast(lowp, np.float32)  # exact
    plan = lstmcy.LSTMPlan() if use_plan else None
    forward = plan.forward if use_plan else lstmcy.lstm_forward
    backward = plan.backward if use_plan else lstmcy.lstm_backward

    *outputs, cache = forward(x, hx, params, seed=3, **options)
    *outputs32, cache32 = forward(x32, hx32, params32, seed=3, **options)
    for got, want in zip(_flat(outputs + list(cache.saved())), _flat(outputs32 + list(cache32.saved()))):
        assert got.dtype == dtype
        np.testing.assert_array_equal(as_f64(got), as_f64(want.astype(dtype)))
    saved = cache.saved()
    assert all(not a.flags.writeable for a in _flat(saved))
    with pytest.raises(ValueError, match="read-only"):
        cache.o[0][0, 0, 0] = 0

    masks32 = _as_float32(cache.dropout_masks)
    own = _flat(backward(x32, hx32, params32, dy32, dh32, dc32, *cache32.saved(),
                         dropout_masks=masks32, **options))
    rounded = _flat(backward(x32, hx32, params32, dy32, dh32, dc32,
                             *[_as_float32(arrays) for arrays in saved],
                             dropout_masks=masks32, **options))
    for saved_lists, want in [(saved, own), ([[a.copy() for a in arrays] for arrays in saved], rounded)]:
        got = _flat(backward(x, hx, params, dy, dh, dc, *saved_lists,
                             dropout_masks=cache.dropout_masks, **options))
        for a, b in zip(got, want, strict=True):
            assert a.dtype == dtype
            np.testing.assert_array_equal(as_f64(a), as_f64(b.astype(dtype)))
    # The rounded activations do give other gradients on these saturated gates.
    assert any(not np.array_equal(a, b) for a, b in zip(own, rounded))


def test_low_precision_refuses_float32_saved_arrays():
    """One dtype per call, as the vendor's operator: float32 activations with float16
    inputs are refused, whatever they are."""
    problem = _problem("tiny", 1, T=3, B=2, I=3, H=4, num_layers=1, bidirectional=False,
                       batch_first=False, lowp="float16")
    x, hx, params, dy, dh, dc = _cast(problem, np.float16)
    _, _, _, cache = lstmcy.lstm_forward(x, hx, params)
    saved = [_as_float32(arrays) for arrays in cache.saved()]
    with pytest.raises(TypeError, match="share one dtype"):
        lstmcy.lstm_backward(x, hx, params, dy, dh, dc, *saved)
