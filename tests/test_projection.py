"""LSTMs with projections (LSTMP, ``proj_size > 0``): h_t = (o_t * tanh(c_t)) @ w_hr^T.

Forward and backward against PyTorch's ``nn.LSTM(proj_size=...)`` float64 autograd on the
same weights (layers, directions, layouts, variable lengths, with and without biases), the
float32 kernels against PyTorch float32, finite differences of the projection's gradient,
the numpy reference, bit-identical results on 1 to 8 threads, and the checks of the extra
arguments.
"""
import numpy as np
import pytest

import lstmcy
from lstmcy import reference
from hostile import most_split

torch = pytest.importorskip("torch")
from torch_oracle import norm_rel_err  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")

CONFIGS = [
    # T, B, I, H, P, L, bidirectional, has_bias, layout
    (5, 3, 4, 8, 3, 1, False, True, "time_major"),
    (7, 9, 5, 16, 5, 2, True, True, "batch_first"),
    (6, 16, 3, 32, 8, 2, False, False, "time_major"),
    (4, 1, 2, 12, 4, 1, True, True, "packed"),
    (9, 12, 6, 20, 7, 3, True, True, "packed"),
    # layer 0 takes its input's product inside the recurrence (_schedule.fused_input)
    (6, 5, 40, 24, 6, 2, True, True, "batch_first"),
    (8, 6, 33, 20, 5, 1, False, True, "packed"),
    # layer 0's backward takes dx with the packed product (_schedule.packed_dx)
    (5, 4, 70, 130, 10, 2, True, True, "batch_first"),
]
IDS = [f"T{c[0]}-B{c[1]}-H{c[3]}-P{c[4]}-L{c[5]}{'-bi' if c[6] else ''}{'' if c[7] else '-nobias'}-{c[8]}"
       for c in CONFIGS]


def make(cfg, dtype, seed=0):
    T, B, I, H, P, L, bi, has_bias, layout = cfg
    D = 2 if bi else 1
    torch.manual_seed(seed)
    module = torch.nn.LSTM(I, H, num_layers=L, bidirectional=bi, proj_size=P, bias=has_bias,
                           batch_first=layout == "batch_first").to(getattr(torch, dtype))
    rng = np.random.default_rng(seed)
    lengths = np.sort(rng.integers(1, T + 1, B))[::-1].copy()
    lengths[0] = T
    x = rng.standard_normal((B, T, I) if layout == "batch_first" else (T, B, I)).astype(dtype)
    h0 = rng.standard_normal((L * D, B, P)).astype(dtype)
    c0 = rng.standard_normal((L * D, B, H)).astype(dtype)
    dh = rng.standard_normal((L * D, B, P)).astype(dtype)
    dc = rng.standard_normal((L * D, B, H)).astype(dtype)
    kwargs = dict(num_layers=L, bidirectional=bi, has_bias=has_bias, proj_size=P,
                  batch_first=layout == "batch_first")
    params = [w.detach().numpy().copy() for w in module._flat_weights]
    if layout == "packed":
        batch_sizes = np.array([(lengths > t).sum() for t in range(T)])
        packed = torch.nn.utils.rnn.pack_padded_sequence(torch.from_numpy(x), torch.from_numpy(lengths))
        x = packed.data.numpy().copy()
        kwargs["batch_sizes"] = batch_sizes
    dy = rng.standard_normal((x.shape[0], D * P) if layout == "packed"
                             else x.shape[:-1] + (D * P,)).astype(dtype)
    return module, x, (h0, c0), params, dy, dh, dc, kwargs


def torch_grads(module, x, hx, dy, dh, dc, kwargs):
    xt = torch.tensor(x, requires_grad=True)
    h0, c0 = (torch.tensor(a, requires_grad=True) for a in hx)
    if "batch_sizes" in kwargs:
        inp = torch.nn.utils.rnn.PackedSequence(xt, torch.from_numpy(kwargs["batch_sizes"]))
        out, (h_n, c_n) = module(inp, (h0, c0))
        y = out.data
    else:
        y, (h_n, c_n) = module(xt, (h0, c0))
    loss = (y * torch.from_numpy(dy)).sum() + (h_n * torch.from_numpy(dh)).sum() + \
        (c_n * torch.from_numpy(dc)).sum()
    loss.backward()
    return [a.detach().numpy() for a in (y, h_n, c_n, xt.grad, h0.grad, c0.grad)] + \
        [w.grad.numpy() for w in module._flat_weights]


def lstmcy_outputs(x, hx, params, dy, dh, dc, kwargs, api=lstmcy):
    y, h_n, c_n, cache = api.lstm_forward(x, hx, params, **kwargs)
    dx, dh0, dc0, dparams = api.lstm_backward(x, hx, params, dy, dh, dc, *cache.saved(), **kwargs)
    return [y, h_n, c_n, dx, dh0, dc0, *dparams]


def relative_errors(got, expected):
    return [float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)) for a, b in zip(got, expected)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_matches_torch_float64_autograd(cfg):
    module, x, hx, params, dy, dh, dc, kwargs = make(cfg, "float64")
    expected = torch_grads(module, x, hx, dy, dh, dc, kwargs)
    got = lstmcy_outputs(x, hx, params, dy, dh, dc, kwargs)
    assert len(got) == len(expected) == 6 + len(params)
    for k, (a, b) in enumerate(zip(got, expected)):
        assert a.shape == b.shape, k
    errors = relative_errors(got, expected)
    assert max(errors) < 1e-12, errors
    # The numpy reference computes the same.
    assert max(relative_errors(lstmcy_outputs(x, hx, params, dy, dh, dc, kwargs, reference),
                               expected)) < 1e-12


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_float32_is_as_accurate_as_torch_float32(cfg):
    """Norm-wise relative errors against float64 autograd: on par with PyTorch float32's
    (both sum in different orders, so single outputs differ either way)."""
    module64, x, hx, params, dy, dh, dc, kwargs = make(cfg, "float64")
    exact = torch_grads(module64, x, hx, dy, dh, dc, kwargs)
    module32, *_ = make(cfg, "float32")
    cast = lambda a: a.astype(np.float32)  # noqa: E731
    theirs = torch_grads(module32, cast(x), tuple(map(cast, hx)), cast(dy), cast(dh), cast(dc), kwargs)
    ours = lstmcy_outputs(cast(x), tuple(map(cast, hx)), [cast(p) for p in params], cast(dy),
                          cast(dh), cast(dc), kwargs)
    ratios = [norm_rel_err(a, e) / max(norm_rel_err(b, e), 1e-12)
              for a, b, e in zip(ours, theirs, exact)]
    assert max(ratios) <= 2.5 and float(np.median(ratios)) <= 1.3, ratios


def test_projection_gradient_matches_finite_differences():
    cfg = (4, 3, 3, 6, 2, 1, True, True, "time_major")
    module, x, hx, params, dy, dh, dc, kwargs = make(cfg, "float64", seed=3)
    grads = lstmcy_outputs(x, hx, params, dy, dh, dc, kwargs)[6:]

    def loss(ps):
        y, h_n, c_n, _ = lstmcy.lstm_forward(x, hx, ps, **kwargs)
        return float((y * dy).sum() + (h_n * dh).sum() + (c_n * dc).sum())

    rng = np.random.default_rng(1)
    for k in (4, 9):  # w_hr of each direction
        for _ in range(4):
            index = tuple(int(rng.integers(n)) for n in params[k].shape)
            step = 1e-6
            up = [p.copy() for p in params]
            down = [p.copy() for p in params]
            up[k][index] += step
            down[k][index] -= step
            numeric = (loss(up) - loss(down)) / (2 * step)
            assert abs(numeric - grads[k][index]) <= 1e-6 * max(1.0, abs(numeric))


@pytest.mark.parametrize("split", ["default", "rows"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_same_bits_on_any_number_of_threads(cfg, split, monkeypatch, request):
    if split == "rows":
        most_split(request, "rows")
    _, x, hx, params, dy, dh, dc, kwargs = make(cfg, "float32")
    results = {}
    try:
        for threads in (1, 2, 3, 4, 8):
            lstmcy.set_num_threads(threads)
            results[threads] = lstmcy_outputs(x, hx, params, dy, dh, dc, kwargs)
    finally:
        lstmcy.set_num_threads(None)
    for threads, got in results.items():
        for k, (a, b) in enumerate(zip(got, results[1])):
            assert a.tobytes() == b.tobytes(), f"output {k} on {threads} threads"


def test_inference_equals_training_output():
    _, x, hx, params, dy, dh, dc, kwargs = make(CONFIGS[1], "float64")
    y, h_n, c_n, _ = lstmcy.lstm_forward(x, hx, params, **kwargs)
    y2, h2, c2, cache = lstmcy.lstm_forward(x, hx, params, train=False, **kwargs)
    assert cache is None
    for a, b in ((y, y2), (h_n, h2), (c_n, c2)):
        assert a.tobytes() == b.tobytes()


def test_projection_arguments_are_checked():
    _, x, hx, params, dy, dh, dc, kwargs = make(CONFIGS[0], "float64")
    with pytest.raises(ValueError, match=r"proj_size must be smaller than the hidden size H=8"):
        lstmcy.lstm_forward(x, (np.zeros((1, 3, 8)), hx[1]), params[:4] + [np.zeros((8, 8))],
                            **dict(kwargs, proj_size=8))
    bad = list(params)
    bad[1] = np.zeros((32, 4))
    with pytest.raises(ValueError, match=r"params\[1\] \(w_hh of layer 0, forward direction\).*\(32, 3\)"):
        lstmcy.lstm_forward(x, hx, bad, **kwargs)
    with pytest.raises(ValueError, match=r"hx\[0\] \(h0\).*\(1, 3, 3\).*proj_size"):
        lstmcy.lstm_forward(x, (hx[1], hx[1]), params, **kwargs)
    with pytest.raises(ValueError, match=r"params must hold 4 arrays"):
        lstmcy.lstm_forward(x, hx, params, **dict(kwargs, proj_size=0))
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params, **kwargs)
    saved = list(cache.saved())
    saved[4] = [np.zeros((5, 3, 8))]  # h is [T, B, P]
    with pytest.raises(ValueError, match=r"h\[0\] must have shape \(5, 3, 3\) \(time-major \[T, B, P\]\)"):
        lstmcy.lstm_backward(x, hx, params, dy, dh, dc, *saved, **kwargs)
    with pytest.raises(ValueError, match=r"backend='aclnn' has no projections"):
        lstmcy.lstm_backward(x, hx, params, dy, dh, dc, *cache.saved(), backend="aclnn", **kwargs)


def test_required_workspace_bounds_projected_calls():
    cfg = (9, 12, 6, 20, 7, 3, True, True, "time_major")
    _, x, hx, params, dy, dh, dc, kwargs = make(cfg, "float32")
    plan = lstmcy.LSTMPlan()
    y, h_n, c_n, cache = plan.forward(x, hx, params, **kwargs)
    plan.backward(x, hx, params, dy, dh, dc, *cache.saved(), **kwargs)
    bound = lstmcy.LSTMPlan.required_workspace(9, 12, 6, 20, num_layers=3, bidirectional=True,
                                               dtype=np.float32, proj_size=7)
    assert 0 < plan.workspace_size <= bound
