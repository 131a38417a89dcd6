"""lstmcy against PyTorch autograd (``torch._VF.lstm`` and its packed overload).

Every forward output (y, h_n, c_n) and every gradient (dx, dh_prev, dc_prev, each
parameter) is compared with the float64 PyTorch result (see ``torch_oracle.py``) over
a grid of layer counts, directions, bias, layouts (time-major, batch-first, packed and
padded variable lengths) and dropout (masks recorded by lstmcy and replayed between
single-layer torch calls).
"""

import itertools

import numpy as np
import pytest

import lstmcy

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from torch_oracle import (LAYOUTS, as_f64, assert_no_worse_than, make_case,  # noqa: E402
                          run_lstmcy, torch_lstm)

GRID = list(itertools.product((1, 2, 3), (False, True), (True, False), LAYOUTS, (0.0, 0.4)))
GRID_IDS = [f"L{L}-{'bi' if bi else 'uni'}-{'bias' if b else 'nobias'}-{lay}-p{p}"
            for L, bi, b, lay, p in GRID]


def max_rel_err(actual, expected):
    """``max|actual - expected| / max|expected|`` (absolute error if expected is all 0)."""
    actual, expected = as_f64(actual), as_f64(expected)
    assert actual.shape == expected.shape
    if expected.size == 0:
        return 0.0
    scale = np.max(np.abs(expected))
    err = np.max(np.abs(actual - expected))
    return float(err / scale) if scale > 0 else float(err)


def assert_all_close(got, expected, tol, what=""):
    """Compare dicts name -> array; the failure message lists every output above ``tol``."""
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].shape == expected[name].shape, (name, got[name].shape, expected[name].shape)
    errors = {name: max_rel_err(got[name], expected[name]) for name in expected}
    bad = {name: f"{err:.3g}" for name, err in errors.items() if not err <= tol}
    assert not bad, f"{what}: relative error above {tol:g} in {bad}"


def oracle_for(case, cache, dtype=torch.float64, source=None):
    """PyTorch result for ``case`` (values taken from ``source``, default the case itself)."""
    c = source or case
    return torch_lstm(c.x, c.hx, c.params, dy=c.dy, dh=c.dh, dc=c.dc,
                      dropout_masks=cache.dropout_masks, dtype=dtype, **case.kwargs())


def check_masks(case, cache):
    """The recorded masks exist exactly when dropout is active and hold 0 or 1/(1-p)."""
    if case.dropout > 0 and case.num_layers > 1:
        assert cache.dropout_masks is not None and len(cache.dropout_masks) == case.num_layers - 1
        D = 2 if case.bidirectional else 1
        for mask in cache.dropout_masks:
            assert mask.shape == (case.T, case.B, D * case.H)
            values = as_f64(mask)
            scale = as_f64(np.asarray(1.0 / (1.0 - case.dropout)).astype(case.x.dtype))
            assert np.all((values == 0) | (values == scale))
            assert (values == 0).any() and (values != 0).any()  # the masks really drop
    else:
        assert cache.dropout_masks is None


@pytest.mark.parametrize("num_layers, bidirectional, has_bias, layout, dropout", GRID, ids=GRID_IDS)
def test_float64_matches_torch_autograd(num_layers, bidirectional, has_bias, layout, dropout):
    case = make_case(100 + num_layers, T=5, B=3, I=4, H=5, num_layers=num_layers,
                     bidirectional=bidirectional, has_bias=has_bias, layout=layout,
                     dropout=dropout)
    got, cache, raw = run_lstmcy(lstmcy, case)
    assert raw.y.dtype == np.float64 and raw.dx.dtype == np.float64
    check_masks(case, cache)
    expected = oracle_for(case, cache)
    assert_all_close(got.named(case), expected.named(case), 1e-10, "float64")


@pytest.mark.parametrize("num_layers, bidirectional, has_bias, layout, dropout", GRID, ids=GRID_IDS)
def test_float32_matches_torch_float64(num_layers, bidirectional, has_bias, layout, dropout):
    case = make_case(200 + num_layers, T=5, B=3, I=4, H=5, num_layers=num_layers,
                     bidirectional=bidirectional, has_bias=has_bias, layout=layout,
                     dropout=dropout, dtype=np.float32)
    got, cache, raw = run_lstmcy(lstmcy, case)
    assert raw.y.dtype == np.float32 and raw.h_n.dtype == np.float32
    assert raw.dx.dtype == np.float32 and all(p.dtype == np.float32 for p in raw.dparams)
    check_masks(case, cache)
    # Oracle in float64 on the float32 values (and the float32 masks).
    expected = oracle_for(case, cache)
    assert_all_close(got.named(case), expected.named(case), 2e-5, "float32")


LENGTH_PATTERNS = {
    "all-full": [5, 5, 5],
    "only-last-step-partial": [5, 5, 4],  # padded rows of the full steps coincide with packed
    "one-sequence": [5],
    "all-length-1": [1, 1, 1],
    "distinct": [6, 3, 1],
    "two-short": [4, 1, 1],
}


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("layout", ["packed", "padded_2d"])
@pytest.mark.parametrize("pattern", list(LENGTH_PATTERNS))
def test_length_patterns_match_torch(pattern, layout, bidirectional):
    lengths = LENGTH_PATTERNS[pattern]
    case = make_case(400, T=max(lengths), B=len(lengths), I=3, H=4, num_layers=2,
                     bidirectional=bidirectional, layout=layout, lengths=lengths)
    got, cache, _ = run_lstmcy(lstmcy, case)
    expected = oracle_for(case, cache)
    assert_all_close(got.named(case), expected.named(case), 1e-10, f"lengths {lengths}")


def test_packed_and_padded_layouts_agree_with_each_other():
    """Same sequences in packed and padded 2-D layouts give the same numbers."""
    packed = make_case(5, T=6, B=4, num_layers=2, bidirectional=True, layout="packed")
    padded = make_case(5, T=6, B=4, num_layers=2, bidirectional=True, layout="padded_2d")
    got_p, _, _ = run_lstmcy(lstmcy, packed)
    got_d, _, _ = run_lstmcy(lstmcy, padded)
    rows = padded.valid_rows()
    np.testing.assert_array_equal(got_d.y[rows], got_p.y)
    np.testing.assert_array_equal(got_d.y[~rows], 0.0)
    np.testing.assert_array_equal(got_d.dx[rows], got_p.dx)
    np.testing.assert_array_equal(got_d.dx[~rows], 0.0)
    for name in ("h_n", "c_n", "dh_prev", "dc_prev"):
        np.testing.assert_array_equal(getattr(got_d, name), getattr(got_p, name))
    for a, b in zip(got_d.dparams, got_p.dparams):
        np.testing.assert_array_equal(a, b)


LOWP = {"float16": (np.float16, torch.float16), "bfloat16": (ml_dtypes.bfloat16, torch.bfloat16)}
LOWP_GRID = list(itertools.product(LOWP, (1, 2), (False, True), LAYOUTS))


@pytest.mark.parametrize("dtype_name, num_layers, bidirectional, layout", LOWP_GRID,
                         ids=["-".join(map(str, c)) for c in LOWP_GRID])
def test_low_precision_no_worse_than_torch(dtype_name, num_layers, bidirectional, layout):
    """float16 / bfloat16: error vs float64 at most 1.05x PyTorch's own CPU error in that
    dtype, and below the format's unit roundoff (eps / 2).

    Both lstmcy and PyTorch (``torch.float16`` / ``torch.bfloat16`` tensors on the CPU,
    which torch 2.13 runs natively, forward and autograd) get the same rounded inputs; the
    reference is PyTorch float64 autograd on those rounded values. The error is norm-wise
    relative, per output. (Saturated and extreme-scale cases: ``test_numerics.py``.)
    """
    np_dtype, torch_dtype = LOWP[dtype_name]
    dropout = 0.25 if num_layers > 1 else 0.0
    case = make_case(300 + num_layers, T=6, B=4, I=6, H=8, num_layers=num_layers,
                     bidirectional=bidirectional, layout=layout, dropout=dropout, dtype=np_dtype)
    got, cache, raw = run_lstmcy(lstmcy, case)
    assert raw.y.dtype == np_dtype and raw.dx.dtype == np_dtype and raw.c_n.dtype == np_dtype
    assert all(p.dtype == np_dtype for p in raw.dparams)
    assert all(a.dtype == np_dtype for a in cache.h)
    check_masks(case, cache)
    exact = oracle_for(case, cache).named(case)
    theirs = oracle_for(case, cache, dtype=torch_dtype).named(case)
    ours = got.named(case)
    if layout == "padded_2d":
        rows = case.valid_rows()
        for named in (exact, theirs, ours):  # padded rows are 0 in all three
            named["y"], named["dx"] = named["y"][rows], named["dx"][rows]
    eps = float(ml_dtypes.finfo(np_dtype).eps)
    assert_no_worse_than(ours, theirs, exact, f"{dtype_name} vs torch {dtype_name}", below=eps / 2)
