"""Property-based tests (hypothesis).

1. Random valid configurations, zero sizes, variable lengths and dropout included: the
   forward (outputs, saved activations, dropout masks) and the backward (every gradient,
   under a random ``output_mask``) match ``lstmcy.reference``.
2. Random malformations of a valid call only ever raise ValueError or TypeError; those
   that leave the call valid (read-only or strided arrays, NaN/Inf values, inconsistent
   saved activations, ...) never raise.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lstmcy
from lstmcy._engine.cache import SAVED_NAMES
from hostile import (LAYOUTS, MUST_SUCCEED, MUTATIONS, Config, apply_mutation, make_call,
                     run_call)
from lstmcy import reference

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False)
TOLERANCE = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 2e-5}


@st.composite
def configs(draw, dtypes=(np.float64, np.float32)):
    T, B, I, H = (draw(st.integers(0, 4)) for _ in range(4))
    layout = draw(st.sampled_from(LAYOUTS))
    if layout in ("packed", "padded_2d", "padded_3d") and T > 0:
        B = max(B, 1)
    with_hx = draw(st.booleans()) or (layout in ("packed", "padded_2d") and T == 0)
    return Config(T=T, B=B, I=I, H=H, L=draw(st.integers(1, 3)),
                  bidirectional=draw(st.booleans()), has_bias=draw(st.booleans()),
                  layout=layout, dtype=np.dtype(draw(st.sampled_from(dtypes))),
                  dropout=draw(st.sampled_from([0.0, 0.0, 0.5])), with_hx=with_hx,
                  with_dhdc=draw(st.booleans()), lengths_seed=draw(st.integers(0, 2 ** 32 - 1)))


def assert_close(actual, expected, tol, what):
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if expected.size == 0:
        return
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    scale = max(1.0, float(np.abs(e).max()))
    err = float(np.abs(a - e).max())
    assert err <= tol * scale, f"{what}: max abs error {err:.3g} (scale {scale:.3g})"


@settings(max_examples=60, **SETTINGS)
@given(cfg=configs(), values_seed=st.integers(0, 2 ** 32 - 1),
       output_mask=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()))
def test_valid_configurations_match_reference(cfg, values_seed, output_mask):
    call = make_call(cfg, np.random.default_rng(values_seed), seed=values_seed)
    tol = TOLERANCE[cfg.dtype]

    y, h_n, c_n, cache = lstmcy.lstm_forward(*call.fwd_args, **call.fwd_kwargs)
    y_r, h_r, c_r, cache_r = reference.lstm_forward(*call.fwd_args, **call.fwd_kwargs)
    for name, a, e in (("y", y, y_r), ("h_n", h_n, h_r), ("c_n", c_n, c_r)):
        assert_close(a, e, tol, name)
    for name, ours, ref in zip(SAVED_NAMES, cache.saved(),
                               cache_r.saved()):
        assert len(ours) == len(ref) == cfg.L * cfg.D
        for k, (a, e) in enumerate(zip(ours, ref)):
            assert_close(a, e, tol, f"cache.{name}[{k}]")
    if cache_r.dropout_masks is None:
        assert cache.dropout_masks is None
    else:  # same seed, same masks, bit for bit
        assert len(cache.dropout_masks) == len(cache_r.dropout_masks) == cfg.L - 1
        for a, e in zip(cache.dropout_masks, cache_r.dropout_masks):
            np.testing.assert_array_equal(a, e)

    kwargs = dict(call.bwd_kwargs, output_mask=output_mask)
    ours = lstmcy.lstm_backward(*call.bwd_args, **kwargs)
    ref = reference.lstm_backward(*call.bwd_args, **kwargs)
    for k, name in enumerate(("dx", "dh_prev", "dc_prev")):
        if output_mask[k]:
            assert_close(ours[k], ref[k], tol, name)
        else:
            assert ours[k] is None, f"{name} should be None when output_mask[{k}] is False"
    if output_mask[3]:
        assert len(ours[3]) == len(ref[3]) == len(call.fwd_args[2])
        for k, (a, e) in enumerate(zip(ours[3], ref[3])):
            assert_close(a, e, tol, f"dparams[{k}]")
    else:
        assert ours[3] is None


BREAKING = sorted(set(MUTATIONS) - MUST_SUCCEED)


@settings(max_examples=150, **SETTINGS)
@given(cfg=configs(dtypes=(np.float64, np.float32, np.float16)),
       mutations=st.lists(st.sampled_from(sorted(MUTATIONS)), min_size=1, max_size=2),
       mutation_seed=st.integers(0, 2 ** 32 - 1))
def test_malformations_only_raise_value_or_type_errors(cfg, mutations, mutation_seed):
    rng = np.random.default_rng(mutation_seed)
    call = make_call(cfg, rng)
    descriptions = [apply_mutation(call, name, rng) for name in mutations]
    must_succeed = all(name in MUST_SUCCEED for name in mutations)
    for which in ("fwd", "bwd"):
        try:
            run_call(call, which)
        except (ValueError, TypeError) as exc:
            assert not must_succeed, f"{which} of a valid call {descriptions} raised {exc!r}"
            assert str(exc), "an error without a message"


@pytest.mark.parametrize("name", BREAKING)
def test_each_breaking_mutation_gets_rejected_sometimes(name):
    """Sanity check of the generator: every breaking mutation is caught in some cases
    (otherwise the property above would test nothing for it)."""
    rejected = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        cfg = Config(T=3, B=2, I=2, H=3, L=2, bidirectional=bool(seed % 2), dropout=0.5,
                     layout=LAYOUTS[seed % len(LAYOUTS)], lengths_seed=seed)
        call = make_call(cfg, rng)
        MUTATIONS[name](call, rng)
        for which in ("fwd", "bwd"):
            try:
                run_call(call, which)
            except (ValueError, TypeError):
                rejected += 1
    assert rejected > 0
