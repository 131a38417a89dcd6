"""Derivatives of lstmcy.torch.LSTM beyond the first: double backward, gradgradcheck.

Second derivatives (``create_graph=True``: gradient penalties, meta-learning) go through
the differentiable reference in torch operations (``lstmcy.torch._reference``); the
tests compare them with ``torch.nn.LSTM``'s on the same weights, in float64, and check
them with ``gradgradcheck``. The reference itself is compared with ``nn.LSTM``,
projections included. Also: the activations a step saves are freed by its backward.
"""
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

import lstmcy.torch  # noqa: E402
from lstmcy.torch._reference import lstm as reference_lstm  # noqa: E402
from torch_oracle import assert_close, module_pair, random_states  # noqa: E402
from torch_oracle import single_torch_thread  # noqa: E402,F401  (autouse fixture)

F64 = torch.float64


def _inputs(batch_first=False, T=4, B=3, I=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (B, T, I) if batch_first else (T, B, I)
    return torch.randn(shape, generator=gen, dtype=F64)


def _penalised_gradients(module, x, hx, packed_lengths=None):
    """``loss = sum(y) + |d sum(y * w) / dx|^2`` (a gradient penalty) and its gradients
    with respect to every parameter, the input and the initial states."""
    x = x.detach().requires_grad_()
    hx = None if hx is None else tuple(s.detach().requires_grad_() for s in hx)
    inputs = x if packed_lengths is None else pack_padded_sequence(
        x, packed_lengths, enforce_sorted=False)
    torch.manual_seed(5)  # the same dropout masks for both modules
    out, (h_n, c_n) = module(inputs, hx)
    y = out if packed_lengths is None else out.data
    weights = torch.linspace(-1, 1, y.numel(), dtype=F64).reshape(y.shape)
    (dx,) = torch.autograd.grad((y * weights).sum() + (h_n * c_n).sum(), x, create_graph=True)
    loss = y.sum() + (dx ** 2).sum()
    leaves = list(module.parameters()) + [x] + ([] if hx is None else list(hx))
    return torch.autograd.grad(loss, leaves)


CASES = {
    "one layer": dict(kwargs=dict(), hx=False, packed=None),
    "two layers, bidirectional, h0": dict(kwargs=dict(num_layers=2, bidirectional=True),
                                          hx=True, packed=None),
    "batch first, no bias": dict(kwargs=dict(batch_first=True, bias=False), hx=True,
                                 packed=None),
    "packed, dropout": dict(kwargs=dict(num_layers=2, dropout=0.4), hx=True,
                            packed=torch.tensor([4, 2, 3])),
}


@pytest.mark.parametrize("route", ["eager", "operator", "func"])
@pytest.mark.parametrize("case", list(CASES))
def test_gradient_penalty_matches_nn_lstm(case, route):
    """The issue's example: the penalty's part of the weight gradient must not be lost."""
    with lstmcy.torch.force_route(route):
        spec = CASES[case]
        ours, ref = module_pair(3, 4, **spec["kwargs"])
        batch_first = spec["kwargs"].get("batch_first", False)
        x = _inputs(batch_first)
        hx = random_states(ours, 3) if spec["hx"] else None
        got = _penalised_gradients(ours, x, hx, spec["packed"])
        want = _penalised_gradients(ref, x, hx, spec["packed"])
        names = [n for n, _ in ours.named_parameters()] + ["input", "h0", "c0"]
        for name, a, b in zip(names, got, want):
            assert_close(a, b, what=name)
        # The penalty changes the weight gradient (so the test sees a dropped term).
        plain = torch.autograd.grad(ours(x)[0].sum(), ours.weight_ih_l0)[0]
        assert not torch.allclose(got[0], plain)


def _functional(module, packed_lengths=None):
    names = [name for name, _ in module.named_parameters()]

    def run(x, h0, c0, *weights):
        inputs = x if packed_lengths is None else pack_padded_sequence(
            x, packed_lengths, enforce_sorted=False)
        torch.manual_seed(3)  # the same dropout masks at every evaluation
        out, (h_n, c_n) = torch.func.functional_call(module, dict(zip(names, weights)),
                                                     (inputs, (h0, c0)))
        return (out if packed_lengths is None else out.data), h_n, c_n
    return run


@pytest.mark.parametrize("packed", [False, True])
def test_gradgradcheck(packed):
    kwargs = dict(num_layers=2, dropout=0.5) if packed else dict(bidirectional=True)
    ours = lstmcy.torch.LSTM(2, 2, dtype=F64, **kwargs)
    x = _inputs(T=3, B=2, I=2).requires_grad_()
    h0, c0 = random_states(ours, 2)
    weights = [p.detach().clone().requires_grad_() for p in ours.parameters()]
    run = _functional(ours, torch.tensor([3, 2]) if packed else None)
    assert torch.autograd.gradgradcheck(run, (x, h0, c0, *weights), fast_mode=True)


def test_third_derivative_matches_nn_lstm():
    ours, ref = module_pair(2, 3)
    results = []
    for module in (ours, ref):
        x = _inputs(T=3, B=1, I=2).requires_grad_()
        y, _ = module(x)
        (g1,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        (g2,) = torch.autograd.grad((g1 ** 2).sum(), x, create_graph=True)
        results.append(torch.autograd.grad(g2.sum(), [x, module.weight_hh_l0]))
    for a, b in zip(*results):
        assert_close(a, b)


def test_double_backward_with_retained_graph():
    """The first backward frees the forward's checked call; a second one rebuilds it."""
    ours, ref = module_pair(3, 4, num_layers=2)
    x = _inputs()
    grads = []
    for module in (ours, ref):
        y, _ = module(x)
        first = torch.autograd.grad(y.sum(), list(module.parameters()), retain_graph=True)
        second = torch.autograd.grad((y ** 2).sum(), list(module.parameters()))
        grads.append(first + second)
    for a, b in zip(*grads):
        assert_close(a, b)


def test_backward_frees_the_saved_activations():
    """A training loop keeps the last output alive while the next step runs: the
    activations its backward used must be gone by then (as nn.LSTM's are)."""
    ours = lstmcy.torch.LSTM(3, 4, dtype=F64)
    y, _ = ours(_inputs())
    node = y.grad_fn
    assert node.problem is not None
    y.sum().backward()
    with pytest.raises(RuntimeError, match="freed"):
        node.saved_tensors
    assert node.problem is None


def test_checkpointed_module_matches_nn_lstm():
    from torch.utils.checkpoint import checkpoint

    ours, ref = module_pair(3, 4, num_layers=2, dropout=0.3)
    grads = []
    for module in (ours, ref):
        x = _inputs().requires_grad_()
        torch.manual_seed(1)
        y = checkpoint(lambda inp: module(inp)[0], x, use_reentrant=False)
        grads.append(torch.autograd.grad((y ** 2).sum(), [x] + list(module.parameters())))
    for a, b in zip(*grads):
        assert_close(a, b)


@pytest.mark.parametrize("proj_size", [0, 2])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_reference_matches_aten_lstm(proj_size, packed, bidirectional):
    """The differentiable reference computes what aten::lstm computes, projections
    included (it is ready for the kernels' projections)."""
    torch.manual_seed(0)
    ref = nn.LSTM(3, 4, num_layers=2, bidirectional=bidirectional, proj_size=proj_size,
                  dtype=F64)
    x = _inputs(B=3)
    h0, c0 = random_states(ref, 3)
    weights = [w.detach().requires_grad_() for w in ref._flat_weights]
    kwargs = dict(hidden_size=4, num_layers=2, bidirectional=bidirectional, has_bias=True,
                  proj_size=proj_size)
    if packed:
        data = pack_padded_sequence(x, torch.tensor([4, 3, 1]))
        want = torch._VF.lstm(data.data, data.batch_sizes, (h0, c0), weights, True, 2, 0.0, True,
                              bidirectional)
        got = reference_lstm(data.data, (h0, c0), weights, batch_sizes=data.batch_sizes,
                             **kwargs)
    else:
        want = torch._VF.lstm(x, (h0, c0), weights, True, 2, 0.0, True, bidirectional, False)
        got = reference_lstm(x, (h0, c0), weights, **kwargs)
    for a, b in zip(got, want):
        assert_close(a, b)
    loss = [sum((t * t).sum() for t in outs) for outs in (got, want)]
    for a, b in zip(torch.autograd.grad(loss[0], weights + [h0, c0]),
                    torch.autograd.grad(loss[1], weights + [h0, c0])):
        assert_close(a, b)
