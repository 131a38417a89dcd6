"""The internal engine API (lstmcy._engine.layer_loops): a checked problem in, the kernels' results out.

Its results are the numpy API's, bit for bit, on every kind of call (layers, directions,
packed input, projections, dropout masks, output masks), through check_problem and
trusted_problem alike; the saved block's views are the numpy API's cache; a wrong block
is refused.
"""
import numpy as np
import pytest

import lstmcy
from lstmcy._engine import layer_loops as _engine

CONFIGS = [
    # T, B, I, H, P, L, bidirectional, has_bias, layout, dropout
    (5, 3, 4, 8, 0, 1, False, True, "time_major", 0.0),
    (7, 9, 5, 16, 0, 2, True, True, "batch_first", 0.4),
    (6, 4, 3, 12, 5, 2, False, False, "time_major", 0.0),
    (6, 5, 3, 10, 0, 3, True, True, "packed", 0.3),
    (4, 3, 2, 12, 4, 2, True, True, "packed", 0.0),
]
IDS = [f"L{c[5]}{'-bi' if c[6] else ''}-P{c[4]}-{c[8]}-p{c[9]}" for c in CONFIGS]


def make(cfg, dtype, seed=0):
    T, B, I, H, P, L, bi, has_bias, layout, dropout = cfg
    D = 2 if bi else 1
    rng = np.random.default_rng(seed)
    F = P or H
    params = []
    for layer in range(L):
        for _ in range(D):
            params.append(rng.uniform(-0.5, 0.5, (4 * H, I if layer == 0 else D * F)))
            params.append(rng.uniform(-0.5, 0.5, (4 * H, F)))
            if has_bias:
                params += [rng.uniform(-0.5, 0.5, 4 * H), rng.uniform(-0.5, 0.5, 4 * H)]
            if P:
                params.append(rng.uniform(-0.5, 0.5, (P, H)))
    params = [p.astype(dtype) for p in params]
    kwargs = dict(num_layers=L, bidirectional=bi, has_bias=has_bias, proj_size=P,
                  batch_first=layout == "batch_first")
    if layout == "packed":
        lengths = np.sort(rng.integers(1, T + 1, B))[::-1]
        lengths[0] = T
        kwargs["batch_sizes"] = np.array([(lengths > t).sum() for t in range(T)])
        x = rng.standard_normal((int(lengths.sum()), I))
        dy = rng.standard_normal((x.shape[0], D * F))
    else:
        x = rng.standard_normal((B, T, I) if layout == "batch_first" else (T, B, I))
        dy = rng.standard_normal(x.shape[:-1] + (D * F,))
    hx = (rng.standard_normal((L * D, B, F)).astype(dtype),
          rng.standard_normal((L * D, B, H)).astype(dtype))
    dh = rng.standard_normal((L * D, B, F)).astype(dtype)
    dc = rng.standard_normal((L * D, B, H)).astype(dtype)
    return x.astype(dtype), hx, params, dy.astype(dtype), dh, dc, kwargs, dropout


def same(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert got.tobytes() == want.tobytes(), f"{what} differs from the numpy API's"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_engine_matches_the_numpy_api(cfg, dtype):
    x, hx, params, dy, dh, dc, kwargs, dropout = make(cfg, dtype)
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params, dropout=dropout, seed=3, **kwargs)
    want = lstmcy.lstm_backward(x, hx, params, dy, dh, dc, *cache.saved(), dropout=dropout,
                                dropout_masks=cache.dropout_masks, **kwargs)

    problem = _engine.check_problem(x, hx, params, **kwargs)
    e_y, e_h, e_c, saved = _engine.forward(problem, True, cache.dropout_masks)
    for got, ref, what in ((e_y, y, "y"), (e_h, h_n, "h_n"), (e_c, c_n, "c_n")):
        same(got, ref, what)
    assert saved.size == _engine.saved_size(problem)
    views = _engine.saved_views(saved, problem)
    assert list(views) == list(_engine.SAVED_NAMES)
    for name, given in zip(_engine.SAVED_NAMES, cache.saved()):
        for k, part in enumerate(given):
            same(views[name][k], np.asarray(part), f"saved {name}[{k}]")

    got = _engine.backward(problem, saved, dy, dh, dc, cache.dropout_masks)
    for name, a, b in zip(("dx", "dh0", "dc0"), got[:3], want[:3]):
        same(a, b, name)
    for k, (a, b) in enumerate(zip(got[3], want[3])):
        same(a, b, f"dparams[{k}]")


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c[8] != "packed"],
                         ids=[i for c, i in zip(CONFIGS, IDS) if c[8] != "packed"])
def test_trusted_problem_gives_the_same_results(cfg):
    x, hx, params, dy, dh, dc, kwargs, _ = make(cfg, "float64")
    checked = _engine.check_problem(x, hx, params, **kwargs)
    trusted = _engine.trusted_problem(x, hx[0], hx[1], params, hidden_size=cfg[3],
                                      has_bias=kwargs["has_bias"], num_layers=kwargs["num_layers"],
                                      bidirectional=kwargs["bidirectional"],
                                      batch_first=kwargs["batch_first"], proj_size=cfg[4])
    a = _engine.forward(checked)
    b = _engine.forward(trusted)
    for k in range(4):
        same(a[k], b[k], f"forward output {k}")
    ga = _engine.backward(checked, a[3], dy, dh, dc)
    gb = _engine.backward(trusted, b[3], dy, dh, dc)
    for k in range(3):
        same(ga[k], gb[k], f"gradient {k}")


def test_output_mask_and_missing_state_gradients():
    x, hx, params, dy, dh, dc, kwargs, _ = make(CONFIGS[1], "float64")
    problem = _engine.check_problem(x, hx, params, **kwargs)
    saved = _engine.forward(problem)[3]
    full = _engine.backward(problem, saved, dy, np.zeros_like(dh), np.zeros_like(dc))
    none_given = _engine.backward(problem, saved, dy)
    for k in range(3):
        same(none_given[k], full[k], f"gradient {k} with dh, dc None")
    masked = _engine.backward(problem, saved, dy, output_mask=(False, True, False, False))
    assert masked[0] is None and masked[2] is None and masked[3] is None
    same(masked[1], full[1], "dh0")
    assert _engine.backward(problem, saved, dy, output_mask=(False,) * 4) == (None,) * 4


def test_inference_keeps_nothing_and_a_wrong_block_is_refused():
    x, hx, params, dy, dh, dc, kwargs, _ = make(CONFIGS[0], "float32")
    problem = _engine.check_problem(x, hx, params, **kwargs)
    assert _engine.forward(problem, train=False)[3] is None
    saved = _engine.forward(problem)[3]
    with pytest.raises(ValueError, match="saved must be the forward's block"):
        _engine.backward(problem, saved[:-1], dy)
    with pytest.raises(ValueError, match="saved must be the forward's block"):
        _engine.backward(problem, None, dy)


def test_a_given_plan_is_used():
    x, hx, params, dy, dh, dc, kwargs, _ = make(CONFIGS[2], "float64")
    problem = _engine.check_problem(x, hx, params, **kwargs)
    plan = lstmcy.LSTMPlan(n_threads=2)
    assert plan.workspace_size == 0
    saved = _engine.forward(problem, plan=plan)[3]
    assert plan.workspace_size > 0
    grads = _engine.backward(problem, saved, dy, dh, dc, plan=plan)
    same(grads[0], _engine.backward(problem, saved, dy, dh, dc)[0], "dx on another plan")
