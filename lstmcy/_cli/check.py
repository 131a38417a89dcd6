"""``lstmcy check``: lstmcy's gradients against the numpy reference and, when it is
installed, PyTorch's float64 autograd, on random configurations."""
import time

import numpy as np

import lstmcy
from lstmcy import reference


def random_case(rng):
    """A random configuration: ``(x, hx, params, kwargs)`` in float64.

    Uniform batches come time-major or batch-first; variable-length ones in PyTorch's
    packed layout (2-D input with ``batch_sizes``).
    """
    T, B, I, H = (int(v) for v in rng.integers(1, 7, size=4))
    L = int(rng.integers(1, 4))
    bidirectional = bool(rng.integers(2))
    D = 2 if bidirectional else 1
    has_bias = bool(rng.integers(2))
    kwargs = dict(has_bias=has_bias, num_layers=L, bidirectional=bidirectional)
    if rng.integers(2):
        lengths = np.sort(rng.integers(1, T + 1, size=B))[::-1]
        lengths[0] = T  # the longest sequence sets T
        batch_sizes = np.array([(lengths > t).sum() for t in range(T)], dtype=np.int64)
        kwargs["batch_sizes"] = batch_sizes
        x = rng.standard_normal((int(batch_sizes.sum()), I))
    else:
        kwargs["batch_first"] = bool(rng.integers(2))
        x = rng.standard_normal((B, T, I) if kwargs["batch_first"] else (T, B, I))
    params = []
    for layer in range(L):
        for _ in range(D):
            in_size = I if layer == 0 else D * H
            params += [rng.uniform(-1, 1, (4 * H, in_size)), rng.uniform(-1, 1, (4 * H, H))]
            if has_bias:
                params += [rng.uniform(-1, 1, 4 * H), rng.uniform(-1, 1, 4 * H)]
    hx = (rng.standard_normal((L * D, B, H)), rng.standard_normal((L * D, B, H)))
    return x, hx, params, kwargs


def torch_results(x, hx, params, dy, dh, dc, kwargs):
    """Forward outputs and all gradients from PyTorch float64 autograd (``torch._VF.lstm``)."""
    import torch

    def leaf(a):
        return torch.tensor(a, dtype=torch.float64, requires_grad=True)

    xt, h0, c0 = leaf(x), leaf(hx[0]), leaf(hx[1])
    weights = [leaf(p) for p in params]
    flags = (kwargs["has_bias"], kwargs["num_layers"], 0.0, True, kwargs["bidirectional"])
    if "batch_sizes" in kwargs:
        y, h_n, c_n = torch._VF.lstm(xt, torch.as_tensor(kwargs["batch_sizes"]), (h0, c0),
                                     weights, *flags)
    else:
        y, h_n, c_n = torch._VF.lstm(xt, (h0, c0), weights, *flags, kwargs["batch_first"])
    grads = torch.autograd.grad((y, h_n, c_n), [xt, h0, c0] + weights,
                                tuple(torch.tensor(a) for a in (dy, dh, dc)), allow_unused=True)
    grads = [np.zeros_like(a) if gr is None else gr.numpy()
             for gr, a in zip(grads, [x, hx[0], hx[1]] + list(params))]
    return (y.detach().numpy(), h_n.detach().numpy(), c_n.detach().numpy(),
            (grads[0], grads[1], grads[2], grads[3:]))


def _rel_err(a, b):
    scale = max(np.abs(b).max(initial=0.0), 1e-300)
    return float(np.abs(a - b).max(initial=0.0) / scale)


def _errors(outputs, grads, expected_outputs, expected_grads):
    errors = [_rel_err(a, b) for a, b in zip(outputs, expected_outputs)]
    errors += [_rel_err(a, b) for a, b in zip(grads[:3], expected_grads[:3])]
    errors += [_rel_err(a, b) for a, b in zip(grads[3], expected_grads[3])]
    return max(errors)


def run_check(n_cases=20, seed=0, out=print):
    """Compare lstmcy with the reference (and PyTorch) on ``n_cases`` random configurations.

    Returns the process exit code: 0 when the worst relative error is below 1e-10.
    """
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    rng = np.random.default_rng(seed)
    worst = {"reference": 0.0, "torch": 0.0}
    start = time.perf_counter()
    for case in range(n_cases):
        x, hx, params, kwargs = random_case(rng)
        y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params, **kwargs)
        dy, dh, dc = (rng.standard_normal(a.shape) for a in (y, h_n, c_n))
        grads = lstmcy.lstm_backward(x, hx, params, dy, dh, dc, *cache.saved(), **kwargs)
        y_ref, h_ref, c_ref, cache_ref = reference.lstm_forward(x, hx, params, **kwargs)
        grads_ref = reference.lstm_backward(x, hx, params, dy, dh, dc, *cache_ref.saved(), **kwargs)
        line = {"reference": _errors((y, h_n, c_n), grads, (y_ref, h_ref, c_ref), grads_ref)}
        if have_torch:
            *expected, expected_grads = torch_results(x, hx, params, dy, dh, dc, kwargs)
            line["torch"] = _errors((y, h_n, c_n), grads, expected, expected_grads)
        for key, value in line.items():
            worst[key] = max(worst[key], value)
        described = ", ".join(f"{k}={'[..]' if k == 'batch_sizes' else v}" for k, v in kwargs.items())
        errors = "  ".join(f"vs {k} {v:.1e}" for k, v in line.items())
        out(f"case {case:3d}: input {x.shape}, H={h_n.shape[-1]}, {described}: max rel err {errors}")
    out(f"worst relative error over {n_cases} cases: vs numpy reference {worst['reference']:.2e}"
        + (f", vs PyTorch float64 autograd {worst['torch']:.2e}" if have_torch
           else " (PyTorch not installed: not compared)")
        + f" ({time.perf_counter() - start:.1f} s)")
    return 0 if max(worst.values()) < 1e-10 else 1
