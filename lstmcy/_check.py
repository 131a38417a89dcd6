"""``lstmcy check``: lstmcy's gradients against the numpy reference and PyTorch on random cases."""
import time

import numpy as np

import lstmcy
from lstmcy import reference


def random_case(rng):
    """A random configuration with inputs, parameters and upstream gradients (float64)."""
    T, B, I, H = (int(v) for v in rng.integers(1, 7, size=4))
    L = int(rng.integers(1, 4))
    bidirectional = bool(rng.integers(2))
    D = 2 if bidirectional else 1
    has_bias = bool(rng.integers(2))
    batch_first = bool(rng.integers(2))
    lengths = np.sort(rng.integers(1, T + 1, size=B))[::-1] if rng.integers(2) else None
    x = rng.standard_normal((B, T, I) if batch_first else (T, B, I))
    params = []
    for layer in range(L):
        for _ in range(D):
            in_size = I if layer == 0 else D * H
            params += [rng.uniform(-1, 1, (4 * H, in_size)), rng.uniform(-1, 1, (4 * H, H))]
            if has_bias:
                params += [rng.uniform(-1, 1, 4 * H), rng.uniform(-1, 1, 4 * H)]
    hx = (rng.standard_normal((L * D, B, H)), rng.standard_normal((L * D, B, H)))
    kwargs = dict(has_bias=has_bias, num_layers=L, bidirectional=bidirectional, batch_first=batch_first)
    if lengths is not None:
        kwargs["batch_sizes"] = np.array([(lengths > t).sum() for t in range(T)], dtype=np.int64)
    return x, hx, params, kwargs


def _rel_err(a, b):
    scale = max(np.abs(b).max(initial=0.0), 1e-300)
    return float(np.abs(a - b).max(initial=0.0) / scale)


def run_check(n_cases=20, seed=0, out=print):
    """Compare lstmcy with the reference on ``n_cases`` random configurations.

    Returns the process exit code: 0 when the worst relative error is below 1e-10.
    """
    rng = np.random.default_rng(seed)
    worst = 0.0
    start = time.perf_counter()
    for case in range(n_cases):
        x, hx, params, kwargs = random_case(rng)
        y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params, **kwargs)
        y_ref, h_ref, c_ref, cache_ref = reference.lstm_forward(x, hx, params, **kwargs)
        dy, dh, dc = (rng.standard_normal(a.shape) for a in (y, h_n, c_n))
        grads = lstmcy.lstm_backward(x, hx, params, dy, dh, dc, *cache.saved(), **kwargs)
        grads_ref = reference.lstm_backward(x, hx, params, dy, dh, dc, *cache_ref.saved(), **kwargs)
        errors = [_rel_err(a, b) for a, b in zip((y, h_n, c_n), (y_ref, h_ref, c_ref))]
        errors += [_rel_err(a, b) for a, b in zip(grads[:3], grads_ref[:3])]
        errors += [_rel_err(a, b) for a, b in zip(grads[3], grads_ref[3])]
        worst = max(worst, max(errors))
        out(f"case {case:3d}: {kwargs}  max rel err {max(errors):.2e}")
    out(f"worst relative error vs numpy reference over {n_cases} cases: {worst:.2e} "
        f"({time.perf_counter() - start:.1f} s)")
    return 0 if worst < 1e-10 else 1
