"""Gradients against central finite differences, and the Cython core against the reference.

The scalar checked is ``<dy, y> + <dh, h_n> + <dc, c_n>`` (float64), whose gradient
with respect to every input is what ``lstm_backward`` returns. Dropout masks are fixed
by ``seed`` so the forward is a deterministic function of its inputs.
"""

import numpy as np
import pytest

import lstmcy
from lstmcy._engine.cache import SAVED_NAMES
from lstmcy import reference
from torch_oracle import LAYOUTS, make_case, run_lstmcy

MODULES = {"cython": lstmcy, "reference": reference}

FD_CONFIGS = {
    # name: (num_layers, bidirectional, has_bias, layout, dropout)
    "L1-uni-time_major": (1, False, True, "time_major", 0.0),
    "L2-bi-packed": (2, True, True, "packed", 0.0),
    "L1-bi-padded-nobias": (1, True, False, "padded_2d", 0.0),
    "L2-uni-batch_first-dropout": (2, False, True, "batch_first", 0.5),
    "L2-bi-padded-dropout": (2, True, True, "padded_2d", 0.3),
}

STEP = 1e-6
MAX_ENTRIES = 10  # entries checked per array (all of them when the array is smaller)


def objective(module, case, arrays):
    """``<dy, y> + <dh, h_n> + <dc, c_n>`` for the inputs in ``arrays`` (x, h0, c0, params)."""
    y, h_n, c_n, _ = module.lstm_forward(
        arrays["x"], (arrays["h0"], arrays["c0"]),
        [arrays[f"params[{k}]"] for k in range(len(case.params))],
        dropout=case.dropout, seed=case.seed, **case.kwargs())
    return float(np.sum(case.dy * y) + np.sum(case.dh * h_n) + np.sum(case.dc * c_n))


def analytic_gradients(module, case):
    got, _, _ = run_lstmcy(module, case)
    grads = {"x": got.dx, "h0": got.dh_prev, "c0": got.dc_prev}
    grads.update({f"params[{k}]": g for k, g in enumerate(got.dparams)})
    return grads


@pytest.mark.parametrize("config", list(FD_CONFIGS))
@pytest.mark.parametrize("module_name", list(MODULES))
def test_central_finite_differences(module_name, config):
    module = MODULES[module_name]
    num_layers, bidirectional, has_bias, layout, dropout = FD_CONFIGS[config]
    case = make_case(11, T=3, B=3, I=2, H=2, num_layers=num_layers, bidirectional=bidirectional,
                     has_bias=has_bias, layout=layout, dropout=dropout)
    if layout == "padded_2d":  # padded garbage is ignored: keep it moderate for the FD scale
        case.x[~case.valid_rows()] *= 1e-3
    grads = analytic_gradients(module, case)
    arrays = {name: a.copy() for name, a in case.arrays().items() if name in grads}
    rng = np.random.default_rng(0)
    errors = {}
    for name, grad in grads.items():
        base = arrays[name]
        assert grad.shape == base.shape, name
        flat = base.reshape(-1)  # a view: perturbing it perturbs arrays[name]
        picks = np.arange(flat.size)
        if flat.size > MAX_ENTRIES:
            picks = rng.choice(flat.size, MAX_ENTRIES, replace=False)
        numeric = np.empty(len(picks))
        for n, index in enumerate(picks):
            saved = flat[index]
            flat[index] = saved + STEP
            plus = objective(module, case, arrays)
            flat[index] = saved - STEP
            minus = objective(module, case, arrays)
            flat[index] = saved
            numeric[n] = (plus - minus) / (2 * STEP)
        analytic = grad.reshape(-1)[picks]
        scale = max(np.max(np.abs(analytic)), 1e-3)
        errors[name] = np.max(np.abs(numeric - analytic)) / scale
    # Whole-gradient check along one random direction over every input at once.
    direction = {name: rng.standard_normal(a.shape) for name, a in arrays.items()}
    plus = objective(module, case, {n: arrays[n] + STEP * direction[n] for n in arrays})
    minus = objective(module, case, {n: arrays[n] - STEP * direction[n] for n in arrays})
    numeric = (plus - minus) / (2 * STEP)
    analytic = sum(float(np.sum(grads[n] * direction[n])) for n in arrays)
    errors["<grad, random direction>"] = abs(numeric - analytic) / max(abs(analytic), 1e-3)
    bad = {name: f"{err:.3g}" for name, err in errors.items() if not err <= 1e-7}
    assert not bad, f"finite differences disagree for {bad}"


def random_configs(count, seed):
    """Random problem configurations, zero sizes included."""
    rng = np.random.default_rng(seed)
    configs = []
    for n in range(count):
        layout = LAYOUTS[rng.integers(len(LAYOUTS))]
        low = 1 if layout in ("packed", "padded_2d") else 0
        sizes = dict(T=int(rng.integers(low, 7)), B=int(rng.integers(low, 5)),
                     I=int(rng.integers(0, 6)), H=int(rng.integers(0, 6)))
        if rng.random() < 0.6:  # mostly non-degenerate
            sizes = {k: max(v, 1) for k, v in sizes.items()}
        configs.append(dict(seed=1000 + n, layout=layout, num_layers=int(rng.integers(1, 4)),
                            bidirectional=bool(rng.integers(2)), has_bias=bool(rng.integers(2)),
                            dropout=float(rng.choice([0.0, 0.0, 0.2, 0.6])),
                            grad_scale_decades=float(rng.choice([0.0, 3.0])), **sizes))
    return configs


RANDOM_CONFIGS = random_configs(40, 2024)


@pytest.mark.parametrize("config", RANDOM_CONFIGS,
                         ids=[f"{c['layout']}-L{c['num_layers']}-T{c['T']}B{c['B']}I{c['I']}H{c['H']}"
                              for c in RANDOM_CONFIGS])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cython_matches_reference(config, dtype):
    case = make_case(dtype=dtype, **config)
    got, cache, raw = run_lstmcy(lstmcy, case)
    expected, ref_cache, ref_raw = run_lstmcy(reference, case)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    # Same seed, same masks (both draw them with numpy.random.default_rng(seed)).
    if ref_cache.dropout_masks is None:
        assert cache.dropout_masks is None
    else:
        for a, b in zip(cache.dropout_masks, ref_cache.dropout_masks, strict=True):
            np.testing.assert_array_equal(a, b)
    names = ["y", "h_n", "c_n", "dx", "dh_prev", "dc_prev"]
    for name in names:  # both return the input dtype
        assert getattr(raw, name).dtype == getattr(ref_raw, name).dtype == dtype, name
    assert all(a.dtype == b.dtype == dtype for a, b in zip(raw.dparams, ref_raw.dparams))
    pairs = {n: (getattr(got, n), getattr(expected, n)) for n in names}
    pairs.update({f"dparams[{k}]": ab for k, ab in enumerate(zip(got.dparams, expected.dparams,
                                                                  strict=True))})
    for field in SAVED_NAMES:
        for k, (a, b) in enumerate(zip(getattr(cache, field), getattr(ref_cache, field), strict=True)):
            pairs[f"cache.{field}[{k}]"] = (np.asarray(a, np.float64), np.asarray(b, np.float64))
    errors = {}
    for name, (a, b) in pairs.items():
        assert a.shape == b.shape, (name, a.shape, b.shape)
        scale = np.max(np.abs(b), initial=0.0)
        err = np.max(np.abs(a - b), initial=0.0)
        errors[name] = err / scale if scale > 0 else err
    bad = {name: f"{err:.3g}" for name, err in errors.items() if not err <= tol}
    assert not bad, f"Cython and reference differ in {bad}"
