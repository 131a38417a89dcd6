"""Non-finite and extreme values follow PyTorch float64 autograd.

NaN, +Inf and -Inf are placed, one at a time, in every input (x, h0, c0, each parameter,
dy, dh, dc). The set of non-finite entries of every forward and backward output must equal
the set PyTorch float64 autograd gives (``torch._VF.lstm``, see ``torch_oracle.py``), and
the finite entries must match. Extreme finite magnitudes (±1e30, the largest finite
value, the smallest normal and subnormal numbers) must not create non-finite values
that PyTorch does not have. Subnormal numbers are flushed to zero inside the kernels by
default (``lstmcy.set_flush_denormals``): whole arrays of them may then differ from
PyTorch by amounts below the smallest normal number, and with IEEE subnormals kept they
must match as everything else does.
"""

import os
import warnings
import zlib

import numpy as np
import pytest
import torch

import lstmcy
from torch_oracle import make_case, run_lstmcy, torch_lstm

CONFIGS = {
    # name: make_case keywords
    "L2-bi-time_major": dict(num_layers=2, bidirectional=True, layout="time_major"),
    "L2-bi-packed-dropout": dict(num_layers=2, bidirectional=True, layout="packed", dropout=0.3),
    "L1-bi-padded-nobias": dict(num_layers=1, bidirectional=True, layout="padded_2d", has_bias=False),
    "L3-uni-batch_first-dropout": dict(num_layers=3, layout="batch_first", dropout=0.5),
}
SIZES = dict(T=4, B=3, I=3, H=3)


def input_names(config):
    return list(make_case(0, **SIZES, **CONFIGS[config]).arrays())


CASES = [(config, name) for config in CONFIGS for name in input_names(config)]


def place(case, name, value, seed):
    """Put ``value`` at one random (valid, for padded layouts) entry of input ``name``."""
    rng = np.random.default_rng(seed)
    array = case.arrays()[name]
    if name in ("x", "dy") and case.layout == "padded_2d":
        row = rng.choice(np.flatnonzero(case.valid_rows()))
        index = (row, rng.integers(array.shape[1]))
    else:
        index = np.unravel_index(rng.integers(array.size), array.shape)
    array[index] = value
    return index


def classify(array):
    """0 where finite, 1 where NaN, 2 where +Inf, 3 where -Inf."""
    return np.select([np.isnan(array), array == np.inf, array == -np.inf], [1, 2, 3], 0)


def compare_with_torch(case, what, kinds=True, slack=0.0):
    """Assert equal non-finite masks and matching finite entries for every output.

    With ``kinds``, NaN, +Inf and -Inf must also sit at the same places as in torch.
    ``slack`` is an absolute error allowed besides the relative 1e-10.
    lstmcy must not emit floating-point warnings either (non-finite inputs are legitimate).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, cache, _ = run_lstmcy(lstmcy, case)
    expected = torch_lstm(case.x, case.hx, case.params, dy=case.dy, dh=case.dh, dc=case.dc,
                          dropout_masks=cache.dropout_masks, **case.kwargs())
    got, expected = got.named(case), expected.named(case)
    mask_errors, value_errors = {}, {}
    for name in expected:
        ours, theirs = ~np.isfinite(got[name]), ~np.isfinite(expected[name])
        if not np.array_equal(ours, theirs):
            mask_errors[name] = (f"{int((ours & ~theirs).sum())} non-finite only in lstmcy, "
                                 f"{int((theirs & ~ours).sum())} only in torch, of {ours.size}")
            continue
        if kinds and not np.array_equal(classify(got[name]), classify(expected[name])):
            mask_errors[name] = "same non-finite entries, but NaN / +Inf / -Inf differ"
            continue
        finite = ~ours
        if finite.any():
            scale = np.abs(expected[name][finite]).max()
            err = np.abs(got[name][finite] - expected[name][finite]).max()
            if not err <= 1e-10 * scale + slack:
                value_errors[name] = f"{err / scale:.3g} (absolute {err:.3g})"
    assert not mask_errors, f"{what}: non-finite masks differ: {mask_errors}"
    assert not value_errors, f"{what}: finite entries differ (relative): {value_errors}"
    return got, expected


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "+inf", "-inf"])
@pytest.mark.parametrize("config, name", CASES, ids=[f"{c}-{n}" for c, n in CASES])
def test_non_finite_input_propagates_like_torch(config, name, value):
    case = make_case(21, **SIZES, **CONFIGS[config])
    index = place(case, name, value, seed=zlib.crc32(name.encode()))
    got, _ = compare_with_torch(case, f"{value} at {name}{tuple(map(int, index))}")
    # Something really went non-finite (else the test would prove nothing), except where
    # torch itself saturates it away, e.g. an infinite pre-activation through sigmoid/tanh.
    if name in ("dy", "dh", "dc") or np.isnan(value):
        assert any(not np.isfinite(a).all() for a in got.values())


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("name", ["x", "dy"])
def test_non_finite_at_padded_positions_is_ignored(name, value):
    """Padded rows of x and dy (2-D padded layout) are never read."""
    case = make_case(22, **SIZES, num_layers=2, bidirectional=True, layout="padded_2d")
    clean, _, _ = run_lstmcy(lstmcy, case)
    array = getattr(case, name)
    array[~case.valid_rows()] = value
    got, _, _ = run_lstmcy(lstmcy, case)
    for field in ("y", "h_n", "c_n", "dx", "dh_prev", "dc_prev"):
        np.testing.assert_array_equal(getattr(got, field), getattr(clean, field), field)
    for a, b in zip(got.dparams, clean.dparams):
        np.testing.assert_array_equal(a, b)


TINY = np.finfo(np.float64).tiny
MAX = np.finfo(np.float64).max
SUBNORMAL = np.nextafter(0.0, 1.0)
EXTREMES = {"1e30": 1e30, "-1e30": -1e30, "max": MAX, "-max": -MAX, "min_normal": TINY,
            "-subnormal": -SUBNORMAL, "subnormal_x3": 3 * SUBNORMAL}
EXTREME_CONFIGS = ["L2-bi-time_major", "L2-bi-packed-dropout"]
EXTREME_CASES = [(config, name) for config in EXTREME_CONFIGS for name in input_names(config)]


@pytest.mark.parametrize("value", list(EXTREMES))
@pytest.mark.parametrize("config, name", EXTREME_CASES, ids=[f"{c}-{n}" for c, n in EXTREME_CASES])
def test_extreme_value_in_one_entry_like_torch(config, name, value):
    case = make_case(23, **SIZES, **CONFIGS[config])
    index = place(case, name, EXTREMES[value], seed=zlib.crc32(name.encode()) + 3)
    # Only finiteness is compared: whether an overflow gives +Inf, -Inf or (meeting an
    # opposite infinity) NaN may legitimately depend on the summation order.
    compare_with_torch(case, f"{value} at {name}{tuple(map(int, index))}", kinds=False)


SCALINGS = {
    # name: factors applied to whole arrays (values clipped to [-1, 1] first, signs random)
    "x*1e30,w_ih*1e-30": {"x": 1e30, "w_ih0": 1e-30},
    "h0,c0*1e30": {"h0": 1e30, "c0": 1e30},
    "dy,dh,dc*1e30": {"dy": 1e30, "dh": 1e30, "dc": 1e30},
    "dy,dh,dc*1e-300": {"dy": 1e-300, "dh": 1e-300, "dc": 1e-300},
    "dy,dh,dc subnormal": {"dy": 1e-320, "dh": 1e-320, "dc": 1e-320},
    "x,h0,c0*1e-310": {"x": 1e-310, "h0": 1e-310, "c0": 1e-310},
    "params*1e30": {"params": 1e30},
    # These overflow in the backward: torch gets +-Inf / NaN there, so must lstmcy.
    "dy,dh,dc*max/4": {"dy": MAX / 4, "dh": MAX / 4, "dc": MAX / 4},
    "h0,c0*max/4": {"h0": MAX / 4, "c0": MAX / 4},
}
OVERFLOWING = {"h0,c0*max/4"}


@pytest.fixture(params=["flush", "ieee"])
def subnormals(request):
    """Run with subnormal numbers flushed to zero (the default) or kept; the absolute
    error that flushing allows (values below the smallest normal number, summed over a
    few hundred terms at most in these sizes)."""
    lstmcy.set_flush_denormals(request.param == "flush")
    yield 1e3 * TINY if request.param == "flush" else 0.0
    lstmcy.set_flush_denormals(True)


@pytest.mark.parametrize("layout", ["time_major", "packed"])
@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_extreme_magnitudes_whole_arrays_like_torch(scaling, layout, subnormals):
    case = make_case(24, **SIZES, num_layers=2, bidirectional=True, layout=layout)
    for target, factor in SCALINGS[scaling].items():
        if target == "params":
            case.params = [np.clip(p, -1, 1) * factor for p in case.params]
        elif target == "w_ih0":
            case.params[0] = np.clip(case.params[0], -1, 1) * factor
        else:
            setattr(case, target, np.clip(getattr(case, target), -1, 1) * factor)
    got, _ = compare_with_torch(case, scaling, kinds=False, slack=subnormals)
    all_finite = all(np.isfinite(a).all() for a in got.values())
    if scaling in OVERFLOWING:  # the comparison of masks above was not vacuous
        assert not all_finite
    elif scaling.startswith(("dy,dh,dc*1e", "x*")):  # no saturation, no overflow
        assert all_finite, scaling


F32_MAX = np.finfo(np.float32).max


def _float32_with_dc_at_max(seed, **sizes):
    """A float32 problem with dc = FLT_MAX and |c0| > 1: the forget gate's gradient
    dc * c_{t-1} * f (1 - f) has a factor product above FLT_MAX, the whole below it."""
    case = make_case(seed, I=4, H=5, dtype=np.float32, **sizes)
    case.dc = np.full_like(case.dc, F32_MAX)
    case.c0 = (np.sign(case.c0) * (1 + np.abs(case.c0))).astype(np.float32)
    got, cache, _ = run_lstmcy(lstmcy, case)
    oracle = {}
    for dtype in (torch.float64, torch.float32):
        expected = torch_lstm(case.x, case.hx, case.params, dy=case.dy, dh=case.dh, dc=case.dc,
                              dropout_masks=cache.dropout_masks, dtype=dtype, **case.kwargs())
        with np.errstate(over="ignore"):  # float64 values past FLT_MAX round to inf
            oracle[dtype] = {k: v.astype(np.float32) for k, v in expected.named(case).items()}
    return got.named(case), oracle[torch.float64], oracle[torch.float32]


@pytest.mark.parametrize("seed", range(6))
def test_float32_overflows_only_where_float64_autograd_does_single_row(seed):
    """One row (T = B = 1): the parameter gradients and dc_prev are single products of a
    cell's values, with no sum. Their non-finite entries are exactly those of float64
    autograd rounded to float32; dx and dh_prev (sums over the 4H gates) overflow only
    where float64 autograd or PyTorch float32 does."""
    got, f64, f32 = _float32_with_dc_at_max(seed, T=1, B=1)
    for name in f64:
        if name in ("dx", "dh_prev"):
            assert not (~np.isfinite(got[name]) & np.isfinite(f64[name])
                        & np.isfinite(f32[name])).any(), name
            continue
        assert np.array_equal(np.isfinite(got[name]), np.isfinite(f64[name])), name
        finite = np.isfinite(f64[name])
        scale = np.abs(f64[name][finite]).max(initial=0.0)
        assert np.abs(got[name][finite] - f64[name][finite]).max(initial=0.0) <= 1e-5 * scale


@pytest.mark.parametrize("config", [dict(T=3, B=2), dict(T=2, B=3, num_layers=2, bidirectional=True)],
                         ids=["T3-B2", "T2-B3-L2-bi"])
def test_float32_cell_gradients_do_not_overflow_before_pytorch(config):
    """Several rows: an output is non-finite only where float64 autograd (rounded to
    float32) or PyTorch float32 has it. Weight gradients are sums over rows whose partial
    sums may pass FLT_MAX in one float32 order and not in another (PyTorch's included),
    so they are held to float64's mask on one row only, above."""
    spurious = {}
    for seed in range(20):
        got, f64, f32 = _float32_with_dc_at_max(seed, **config)
        for name in f64:
            if name.startswith("weight"):
                continue
            bad = ~np.isfinite(got[name]) & np.isfinite(f64[name]) & np.isfinite(f32[name])
            if bad.any():
                spurious[(seed, name)] = int(bad.sum())
    assert not spurious, spurious


def _activations_of(pre):
    """lstmcy's saved float64 sigmoid and tanh of the pre-activations ``pre`` (one sequence
    of len(pre) steps, one unit whose four gates all see ``pre[t]``, nothing else)."""
    pre = np.asarray(pre, np.float64)
    x = pre.reshape(-1, 1, 1)
    params = [np.ones((4, 1)), np.zeros((4, 1)), np.zeros(4), np.zeros(4)]
    _, _, _, cache = lstmcy.lstm_forward(x, None, params)
    i, g = (np.asarray(a).ravel() for a in cache.saved()[:2])
    return i, g


# Pre-activations around the points where float64 sigmoid and tanh become exactly 0 or 1
# (in PyTorch: 1 + exp(-x) rounds to 1 from 53 ln2 on; exp(-x) overflows below -709.78;
# its tanh reaches 1 at 19.0615474654685, or with MKL's AVX-512 code at 19.0615556159497:
# lstmcy._engine.saturation), each with its neighbouring doubles.
ENDS = [36.73680056967711, 37.0, 37.42994775023705, -708.3964185322642, -708.7429921225441,
        -709.782712893384, -709.0, 19.061547465398498, 19.06154746543, 19.061547465468465,
        19.06155, 19.061555615949707]
PROBES = sorted({v for end in ENDS for v in (np.nextafter(end, -np.inf), end,
                                              np.nextafter(end, np.inf))})


@pytest.mark.parametrize("flush", [True, False], ids=["flush", "ieee"])
def test_float64_activations_saturate_where_pytorchs_do(flush):
    """sigmoid is exactly 1 (or 0) and tanh exactly 1 at the same pre-activations as
    torch.sigmoid / torch.tanh in float64: where a gate meets an infinity in the backward,
    that decides between NaN and Inf."""
    lstmcy.set_flush_denormals(flush)
    try:
        sig, tanh = _activations_of(PROBES)
    finally:
        lstmcy.set_flush_denormals(True)
    t = torch.tensor(PROBES, dtype=torch.float64)
    want_sig, want_tanh = torch.sigmoid(t).numpy(), torch.tanh(t).numpy()
    for name, ours, theirs in [("sigmoid", sig, want_sig), ("tanh", tanh, want_tanh)]:
        for v, a, b in zip(PROBES, ours, theirs):
            assert (a == 1) == (b == 1) and (a == 0) == (b == 0), f"{name}({v!r}): {a!r}, torch {b!r}"
            assert abs(a - b) <= max(2.3e-16 * abs(b), 2.3e-308), f"{name}({v!r}): {a!r}, torch {b!r}"


def test_the_tanh_saturation_point_follows_mkls_code():
    # PyTorch's float64 tanh is MKL's; its AVX-512 code, run on Intel CPUs with AVX-512
    # unless MKL_ENABLE_INSTRUCTIONS names an older set, reaches 1 later.
    from lstmcy._engine.saturation import (CORRECTLY_ROUNDED_TANH_ONE_FROM, TANH_ONE_FROM,
                                           TANH_ONE_FROM_MKL_AVX512, tanh_one_from)
    assert tanh_one_from("GenuineIntel", True) == TANH_ONE_FROM_MKL_AVX512
    assert tanh_one_from("GenuineIntel", True, "avx512_e1") == TANH_ONE_FROM_MKL_AVX512
    assert tanh_one_from("GenuineIntel", True, "AVX2") == TANH_ONE_FROM
    assert tanh_one_from("GenuineIntel", False) == TANH_ONE_FROM
    assert tanh_one_from("AuthenticAMD", True) == TANH_ONE_FROM
    assert tanh_one_from(None, None) == TANH_ONE_FROM
    assert CORRECTLY_ROUNDED_TANH_ONE_FROM < TANH_ONE_FROM < TANH_ONE_FROM_MKL_AVX512


@pytest.mark.parametrize("point", ["intel-avx512", "elsewhere"])
def test_the_kernels_tanh_saturates_at_the_point_they_are_set_to(point):
    from lstmcy._engine import dispatch, saturation
    at = (saturation.TANH_ONE_FROM_MKL_AVX512 if point == "intel-avx512"
          else saturation.TANH_ONE_FROM)
    dispatch.kernels.set_tanh_one_from(at)
    try:
        _, tanh = _activations_of([np.nextafter(at, 0), at])
    finally:
        dispatch.set_cpu_facts(dispatch.kernels, dispatch.KERNELS)
    assert tanh[0] == 1 - 2.0 ** -53 and tanh[1] == 1.0
    below = np.nextafter(saturation.CORRECTLY_ROUNDED_TANH_ONE_FROM, 0)
    for bad in (float("nan"), 19.0, below, 20.0):
        with pytest.raises(ValueError, match="x: expected a point from "
                           + repr(saturation.CORRECTLY_ROUNDED_TANH_ONE_FROM)):
            dispatch.kernels.set_tanh_one_from(bad)
    assert dispatch.kernels.get_tanh_one_from() == saturation.tanh_one_from(
        dispatch.cpu_vendor_family()[0], dispatch.cpu_features().get("AVX512F"),
        os.environ.get("MKL_ENABLE_INSTRUCTIONS"))


def _scaled_normal_case(seed, scale):
    """L=1, T=1, B=2, I=18, H=17, normal weights times ``scale``, c0[0,1,5] = +inf and
    b_ih[16] = -inf."""
    T, B, I, H = 1, 2, 18, 17
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(shape) * scale for shape in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    x, h0, c0 = (rng.standard_normal(shape) for shape in [(T, B, I), (1, B, H), (1, B, H)])
    dy, dh, dc = (rng.standard_normal(shape) for shape in [(T, B, H), (1, B, H), (1, B, H)])
    c0[0, 1, 5] = np.inf
    params[2][16] = -np.inf
    return x, (h0, c0), params, dy, dh, dc


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("seed, scale", [(2337, 100.0), (1337, 3.0)],
                         ids=["forget-gate-just-above-0", "forget-gate-rounding-to-1"])
def test_saturated_gate_meeting_an_infinity_gives_pytorchs_nan_or_inf(seed, scale, n_threads):
    """A forget gate of pre-activation -708.7 (PyTorch: 1.6e-308, not 0) or 37.26 (PyTorch:
    exactly 1) multiplies c0 = +inf: NaN, +Inf and -Inf land where float64 autograd puts
    them, in the forward (f * c0) and the backward ((1 - f) f * dc * c0)."""
    x, hx, params, dy, dh, dc = _scaled_normal_case(seed, scale)
    plan = lstmcy.LSTMPlan(n_threads=n_threads)
    y, h_n, c_n, cache = plan.forward(x, hx, params)
    grads = cache.backward(dy, dh, dc)
    expected = torch_lstm(x, hx, params, dy=dy, dh=dh, dc=dc)
    ours = [y, h_n, c_n, grads.dx, grads.dh0, grads.dc0, *grads.dparams]
    theirs = [expected.y, expected.h_n, expected.c_n, expected.dx, expected.dh_prev,
              expected.dc_prev, *expected.dparams]
    assert any(not np.isfinite(a).all() for a in theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert np.array_equal(classify(a), classify(b)), f"output {k}: NaN/Inf placed otherwise"
