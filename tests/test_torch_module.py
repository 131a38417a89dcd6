"""Tests of lstmcy.torch: the nn.LSTM drop-in and the state_dict helpers.

Every comparison is against ``torch.nn.LSTM`` itself (float64 autograd) with the same
weights: outputs, final states and the gradients of the input, the initial states and
every parameter, for 1-3 layers, both directions, batch-first input, packed sequences
with unsorted lengths, with and without initial states, and dropout for every p in
[0, 1]; by each of the module's routes (eager, custom operator, torch.func, reference).
"""
import contextlib
import copy
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence  # noqa: E402

import lstmcy  # noqa: E402
import lstmcy.torch  # noqa: E402
from lstmcy.torch import (LSTM, config_from_state_dict, params_from_state_dict,  # noqa: E402
                          params_to_state_dict)
from torch_oracle import assert_close, module_pair, random_states  # noqa: E402
from torch_oracle import single_torch_thread  # noqa: E402,F401  (autouse fixture)

RTOL = 1e-10
F64 = torch.float64


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def compare(ours, ref, make_inputs, hx_seed=None, batch=None):
    """Compare outputs and all gradients of ``ours`` and ``ref`` on the same inputs (and,
    with dropout, the same masks: torch's generator is seeded alike before each)."""
    results = []
    for module in (ours, ref):
        x, inputs = make_inputs()
        hx = None if hx_seed is None else random_states(module, batch, seed=hx_seed)
        torch.manual_seed(99)
        out, (h_n, c_n) = module(inputs, hx)
        y = out.data if isinstance(out, PackedSequence) else out
        if isinstance(out, PackedSequence):
            assert torch.equal(out.batch_sizes, inputs.batch_sizes)
            assert out.sorted_indices is inputs.sorted_indices or torch.equal(
                out.sorted_indices, inputs.sorted_indices)
        gen = torch.Generator().manual_seed(7)
        cot = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in (y, h_n, c_n)]
        leaves = [x] + ([] if hx is None else list(hx)) + list(module.parameters())
        grads = torch.autograd.grad([y, h_n, c_n], leaves, cot)
        results.append(((y, h_n, c_n), grads))
    (outs_a, grads_a), (outs_b, grads_b) = results
    for name, a, b in zip(("output", "h_n", "c_n"), outs_a, outs_b):
        assert_close(a, b, what=name)
    names = ["input"] + ([] if hx_seed is None else ["h0", "c0"]) + [
        n for n, _ in ours.named_parameters()]
    assert len(names) == len(grads_a) == len(grads_b)
    for name, a, b in zip(names, grads_a, grads_b):
        assert_close(a, b, what=f"grad of {name}")


def padded_input(T, B, I, batch_first, seed=3):
    gen = torch.Generator().manual_seed(seed)
    shape = (B, T, I) if batch_first else (T, B, I)

    def make():
        x = torch.randn(shape, generator=gen.manual_seed(seed), dtype=F64, requires_grad=True)
        return x, x
    return make


def packed_input(lengths, I, batch_first, seed=4):
    T, B = max(lengths), len(lengths)
    shape = (B, T, I) if batch_first else (T, B, I)

    def make():
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(shape, generator=gen, dtype=F64, requires_grad=True)
        packed = pack_padded_sequence(x, torch.tensor(lengths), batch_first=batch_first,
                                      enforce_sorted=False)
        return x, packed
    return make


# ---------------------------------------------------------------------------
# equality with nn.LSTM
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_hx", [False, True])
def test_matches_nn_lstm(num_layers, bidirectional, batch_first, with_hx):
    ours, ref = module_pair(3, 4, num_layers=num_layers, bidirectional=bidirectional,
                          batch_first=batch_first)
    compare(ours, ref, padded_input(5, 3, 3, batch_first), hx_seed=11 if with_hx else None, batch=3)


@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_matches_nn_lstm_without_bias(num_layers, bidirectional):
    ours, ref = module_pair(2, 5, num_layers=num_layers, bidirectional=bidirectional, bias=False)
    compare(ours, ref, padded_input(4, 2, 2, False), hx_seed=5, batch=2)


@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_hx", [False, True])
def test_packed_unsorted_matches_nn_lstm(num_layers, bidirectional, batch_first, with_hx):
    lengths = [3, 6, 1, 6, 4]  # unsorted, with ties: exercises sorted/unsorted_indices
    ours, ref = module_pair(3, 4, num_layers=num_layers, bidirectional=bidirectional,
                          batch_first=batch_first)
    compare(ours, ref, packed_input(lengths, 3, batch_first), hx_seed=12 if with_hx else None,
            batch=len(lengths))


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_projections_match_nn_lstm(num_layers, bidirectional, packed):
    ours, ref = module_pair(3, 5, num_layers=num_layers, bidirectional=bidirectional, proj_size=2,
                          batch_first=packed)
    if packed:
        compare(ours, ref, packed_input([3, 6, 1, 6, 4], 3, True), hx_seed=13, batch=5)
    else:
        compare(ours, ref, padded_input(5, 3, 3, False), hx_seed=13, batch=3)


@pytest.mark.parametrize("route", ["eager", "operator", "func", "reference"])
def test_projections_with_dropout_match_nn_lstm_on_every_route(route):
    ours, ref = module_pair(3, 6, num_layers=3, bidirectional=True, proj_size=4, dropout=0.4)
    with lstmcy.torch.force_route(route):
        compare(ours, ref, padded_input(4, 3, 3, False), hx_seed=14, batch=3)


def test_packed_output_keeps_permutation():
    lengths = [2, 5, 3]
    ours, ref = module_pair(3, 4, bidirectional=True)
    _, packed = packed_input(lengths, 3, False)()
    hx = random_states(ours, 3, requires_grad=False)
    out, (h_n, c_n) = ours(packed, hx)
    out_ref, (h_ref, c_ref) = ref(packed, hx)
    assert isinstance(out, PackedSequence)
    assert torch.equal(out.sorted_indices, packed.sorted_indices)
    assert torch.equal(out.unsorted_indices, packed.unsorted_indices)
    assert_close(out.data, out_ref.data)
    # States come back in the caller's (unsorted) batch order.
    assert_close(h_n, h_ref)
    assert_close(c_n, c_ref)
    # And the sequence of length 5 (index 1) ends in a different state than if unsorted
    # indices had been ignored.
    assert not torch.allclose(h_n[:, 1], h_n[:, 0])


def _packed_with_rows(rows, batch_sizes, seed=5):
    """A hand-built PackedSequence whose data has ``rows`` rows."""
    def make():
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(rows, 3, generator=gen, dtype=F64, requires_grad=True)
        return x, PackedSequence(x, torch.tensor(batch_sizes))
    return make


def test_packed_data_beyond_the_batch_sizes_is_ignored_as_by_nn_lstm():
    # 6 rows with batch_sizes [2, 1, 1]: nn.LSTM reads the first 4 (6 = T * B is never
    # read as a padded layout); the rows beyond get zero gradients.
    ours, ref = module_pair(3, 4, num_layers=2, dropout=0.5)
    compare(ours, ref, _packed_with_rows(6, [2, 1, 1]), hx_seed=13, batch=2)
    out, _ = ours(_packed_with_rows(7, [2, 1, 1])()[1])
    assert out.data.shape == (4, 4)


def test_packed_data_short_of_the_batch_sizes_raises_as_nn_lstm():
    ours, ref = module_pair(3, 4)
    for module in (ours, ref):
        with pytest.raises(RuntimeError):
            module(_packed_with_rows(3, [2, 1, 1])()[1])


ROUTES = ["eager", "operator", "func", "reference"]


@pytest.fixture
def force_route():
    """Run the module by the given route, whatever the context, until the test ends."""
    with contextlib.ExitStack() as forced:
        yield lambda route: forced.enter_context(lstmcy.torch.force_route(route))


def test_force_route_runs_the_route_it_names():
    # Each route leaves its own node at the output: the autograd function over the
    # kernels, the custom operator's, the torch.func function's, the reference's last op.
    module = lstmcy.torch.LSTM(3, 4).double()
    x = torch.randn(5, 2, 3, dtype=F64, requires_grad=True)
    nodes = {"eager": "_LSTMFunctionBackward",
             "operator": "GeneratedBackwardFor_lstmcy_lstm_forward_defaultBackward",
             "func": "_ForwardBackward", "reference": "StackBackward0"}
    for route in ROUTES:
        with lstmcy.torch.force_route(route):
            assert module(x)[0].grad_fn.name() == nodes[route], route
    assert module(x)[0].grad_fn.name() == nodes["eager"]  # chosen per call again
    with pytest.raises(ValueError, match="route must be one of"):
        with lstmcy.torch.force_route("fast"):
            pass


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_matches_nn_lstm(route, force_route):
    force_route(route)
    ours, ref = module_pair(3, 4, num_layers=2, bidirectional=True, batch_first=True)
    compare(ours, ref, padded_input(5, 3, 3, True), hx_seed=11, batch=3)
    ours, ref = module_pair(3, 4, num_layers=2, bidirectional=True, dropout=0.5)
    compare(ours, ref, packed_input([3, 6, 1, 4], 3, False), hx_seed=12, batch=4)


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_without_grad_matches_nn_lstm(route, force_route):
    force_route(route)
    ours, ref = module_pair(3, 4, num_layers=2, bias=False)
    x = torch.randn(5, 2, 3, dtype=F64)
    with torch.no_grad():
        for a, b in zip(*[(out, *states) for out, states in (ours(x), ref(x))]):
            assert_close(a, b)


@pytest.mark.parametrize("route", ROUTES)
def test_outputs_resize_as_nn_lstm(route, force_route):
    force_route(route)
    ours, ref = module_pair(3, 4, num_layers=2)
    x = torch.randn(5, 2, 3, dtype=F64, requires_grad=True)
    with torch.no_grad():
        without_grad = [ours(x)[0], *ours(x)[1]]
    y, (h_n, c_n) = ours(x)
    for module_outputs in (without_grad, [t.detach() for t in (y, h_n, c_n)]):
        for out in module_outputs:
            values = out.clone()
            out.resize_(out.numel() + 100)  # storage that grows, as nn.LSTM's does
            assert torch.equal(out[:values.numel()], values.flatten())
    with torch.no_grad():
        y_ref = ref(x)[0]
    y_ref.resize_(y_ref.numel() + 100)


@pytest.mark.parametrize("shape", [(0, 2, 3), (0, 3)])
@pytest.mark.parametrize("batch_first", [False, True])
def test_zero_length_sequence_raises_as_nn_lstm(shape, batch_first):
    ours, ref = module_pair(3, 4, batch_first=batch_first)
    x = torch.randn(shape[1], 0, 3, dtype=F64) if batch_first and len(shape) == 3 else \
        torch.randn(shape, dtype=F64)
    message = "Expected sequence length to be larger than 0"
    for module in (ref, ours):
        with pytest.raises(RuntimeError, match=message):
            module(x)
        with torch.no_grad(), pytest.raises(RuntimeError, match=message):
            module(x)


def test_three_states_raise_as_nn_lstm():
    ours, ref = module_pair(3, 4)
    x = torch.randn(5, 2, 3, dtype=F64)
    state = torch.zeros(1, 2, 4, dtype=F64)
    for module in (ref, ours):
        with pytest.raises(RuntimeError, match="lstm expects two hidden states"):
            module(x, (state, state, state))


@pytest.mark.parametrize("dtype, which", [(torch.float32, 0), (torch.float32, 1),
                                          (F64, 0), (F64, 1)])
def test_a_state_of_another_dtype_raises_a_runtime_error(dtype, which):
    ours, ref = module_pair(3, 4, dtype=dtype)
    other = F64 if dtype == torch.float32 else torch.float32
    x = torch.randn(5, 2, 3, dtype=dtype)
    states = [torch.zeros(1, 2, 4, dtype=dtype), torch.zeros(1, 2, 4, dtype=dtype)]
    states[which] = states[which].to(other)
    if not (dtype == F64 and which == 1):  # nn.LSTM's float64 kernel converts c0
        with pytest.raises(RuntimeError):
            ref(x, tuple(states))
    name = "hx[0] (h0)" if which == 0 else "hx[1] (c0)"
    with pytest.raises(RuntimeError, match=rf"{re.escape(name)} has dtype {other} but "
                                           rf"input has {dtype}") as info:
        ours(x, tuple(states))
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, lstmcy.torch.StateDtypeError)


def test_empty_batch_matches_nn_lstm():
    ours, ref = module_pair(3, 4, num_layers=2, bidirectional=True)
    x = torch.randn(5, 0, 3, dtype=F64, requires_grad=True)
    for a, b in zip(*[(out, *states) for out, states in (ours(x), ref(x))]):
        assert a.shape == b.shape and a.shape[-2] == 0
    y, (h_n, _) = ours(x)
    (grad,) = torch.autograd.grad(y.sum() + h_n.sum(), x)
    assert grad.shape == x.shape


def test_unbatched_input_matches_nn_lstm():
    ours, ref = module_pair(3, 4, num_layers=2, bidirectional=True)
    results = []
    for module in (ours, ref):
        x = torch.randn(6, 3, dtype=F64, generator=torch.Generator().manual_seed(0),
                        requires_grad=True)
        h0 = torch.randn(4, 4, dtype=F64, generator=torch.Generator().manual_seed(1),
                         requires_grad=True)
        c0 = torch.randn(4, 4, dtype=F64, generator=torch.Generator().manual_seed(2),
                         requires_grad=True)
        y, (h_n, c_n) = module(x, (h0, c0))
        loss = (y ** 2).sum() + h_n.sum() + (c_n * 3).sum()
        results.append((y, h_n, c_n) + torch.autograd.grad(loss, [x, h0, c0]))
    assert results[0][0].shape == (6, 8) and results[0][1].shape == (4, 4)
    for a, b in zip(*results):
        assert_close(a, b)


def test_partial_requires_grad_and_unused_outputs():
    """Loss on h_n only (y and c_n unused), input without grad, h0 but not c0 with grad."""
    ours, ref = module_pair(3, 5, num_layers=2)
    x = torch.randn(7, 2, 3, dtype=F64)
    grads = []
    for module in (ours, ref):
        h0 = torch.full((2, 2, 5), 0.3, dtype=F64, requires_grad=True)
        c0 = torch.full((2, 2, 5), -0.2, dtype=F64)
        _, (h_n, _) = module(x, (h0, c0))
        grads.append(torch.autograd.grad(h_n[-1].sum(), [h0] + list(module.parameters())))
    for a, b in zip(*grads):
        assert_close(a, b)


def test_matches_nn_lstm_float32():
    ours, ref = module_pair(8, 16, dtype=torch.float32, num_layers=2, bidirectional=True)
    x = torch.randn(10, 4, 8)
    outs = []
    for module in (ours, ref):
        y, (h_n, c_n) = module(x)
        y.sum().backward()
        outs.append((y, h_n, c_n) + tuple(p.grad for p in module.parameters()))
    for a, b in zip(*outs):
        assert a.dtype == torch.float32
        assert_close(a, b, rtol=2e-5)


def test_no_grad_and_eval_paths():
    ours, ref = module_pair(3, 4, num_layers=2, dropout=0.5)
    x = torch.randn(5, 2, 3, dtype=F64)
    ours.eval()
    ref.eval()
    with torch.no_grad():
        y, (h_n, c_n) = ours(x)
        y_ref, (h_ref, c_ref) = ref(x)
    assert not y.requires_grad
    for a, b in zip((y, h_n, c_n), (y_ref, h_ref, c_ref)):
        assert_close(a, b)
    # Eval mode disables dropout also with grad enabled.
    y2, _ = ours(x)
    assert y2.requires_grad
    assert_close(y2, y_ref)


# ---------------------------------------------------------------------------
# dropout
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.4, 1.0])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_dropout_equals_nn_lstm_under_same_seed(p, packed, batch_first):
    """The masks are drawn from torch's generator exactly as aten::lstm draws them (and
    p = 1 zeroes every layer output but the last, drawing nothing)."""
    ours, ref = module_pair(3, 4, num_layers=3, bidirectional=True, dropout=p,
                          batch_first=batch_first)
    make = packed_input([5, 2, 4], 3, batch_first) if packed else padded_input(5, 3, 3, batch_first)
    results = []
    for module in (ours, ref):
        x, inputs = make()
        torch.manual_seed(123)
        out, (h_n, c_n) = module(inputs)
        y = out.data if packed else out
        loss = (y * torch.linspace(-1, 1, y.numel(), dtype=F64).reshape(y.shape)).sum() + h_n.sum()
        results.append((y, h_n, c_n) + torch.autograd.grad(loss, [x] + list(module.parameters())))
        results[-1] += (torch.randn(1),)  # where torch's generator is afterwards
    for a, b in zip(*results):
        assert_close(a, b)
    if p == 1.0:  # the layers above the first get zero inputs
        grads = dict(zip([name for name, _ in ours.named_parameters()], results[0][4:]))
        for name in ("weight_ih_l1", "weight_ih_l2_reverse"):
            assert torch.all(grads[name] == 0), name
        assert not torch.all(grads["weight_ih_l0"] == 0)


def test_dropout_reproducible_and_active():
    ours, _ = module_pair(3, 6, num_layers=2, dropout=0.5)
    no_dropout = copy.deepcopy(ours)
    no_dropout.dropout = 0.0
    x = torch.randn(6, 4, 3, dtype=F64)
    torch.manual_seed(5)
    y1, _ = ours(x)
    torch.manual_seed(5)
    y2, _ = ours(x)
    y3, _ = ours(x)  # the generator has moved on
    y_plain, _ = no_dropout(x)
    assert torch.equal(y1, y2)
    assert not torch.equal(y1, y3)
    assert not torch.allclose(y1, y_plain)
    # Single layer: nothing to drop (as nn.LSTM).
    single, ref_single = module_pair(3, 6, num_layers=1)
    single.dropout = ref_single.dropout = 0.5
    assert_close(single(x)[0], ref_single(x)[0])


def test_dropout_without_grad_matches_nn_lstm():
    """Training mode under no_grad still drops (as nn.LSTM), through the inference path."""
    ours, ref = module_pair(3, 4, num_layers=2, dropout=0.3)
    x = torch.randn(5, 2, 3, dtype=F64)
    outs = []
    for module in (ours, ref):
        torch.manual_seed(8)
        with torch.no_grad():
            outs.append(module(x)[0])
    assert_close(outs[0], outs[1])
    ours.dropout = ref.dropout = 0.0
    with torch.no_grad():
        assert not torch.allclose(outs[0], ours(x)[0])


def test_non_contiguous_input_and_states():
    ours, ref = module_pair(3, 4, num_layers=2, bidirectional=True)
    base = torch.randn(3, 5, 3, dtype=F64)  # [B, T, I]; the module is time-major
    state_base = torch.randn(3, 4, 4, dtype=F64)
    results = []
    for module in (ours, ref):
        x = base.clone().requires_grad_()
        h0 = state_base.clone().requires_grad_()
        c0 = (state_base * 0.5).clone().requires_grad_()
        xt, h0t, c0t = x.transpose(0, 1), h0.transpose(0, 1), c0.transpose(0, 1)
        assert not xt.is_contiguous() and not h0t.is_contiguous()
        y, (h_n, c_n) = module(xt, (h0t, c0t))
        loss = (y[::2] ** 2).sum() + (h_n * c_n).sum()
        results.append((y, h_n, c_n) + torch.autograd.grad(loss, [x, h0, c0]))
    for a, b in zip(*results):
        assert_close(a, b)


# ---------------------------------------------------------------------------
# gradcheck
# ---------------------------------------------------------------------------

def _functional(module):
    names = [name for name, _ in module.named_parameters()]

    def run(x, h0, c0, *weights):
        out, (h_n, c_n) = torch.func.functional_call(module, dict(zip(names, weights)),
                                                     (x, (h0, c0)))
        y = out.data if isinstance(out, PackedSequence) else out
        return y, h_n, c_n
    return run


def test_gradcheck_padded():
    ours = LSTM(2, 3, num_layers=2, bidirectional=True, batch_first=True, dtype=F64)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 2, dtype=F64, generator=gen, requires_grad=True)
    h0, c0 = random_states(ours, 2)
    weights = [p.detach().clone().requires_grad_() for p in ours.parameters()]
    assert torch.autograd.gradcheck(_functional(ours), (x, h0, c0, *weights))


def test_gradcheck_packed():
    ours = LSTM(2, 3, num_layers=2, dtype=F64)
    lengths = torch.tensor([2, 4, 1])
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 2, dtype=F64, generator=gen, requires_grad=True)
    h0, c0 = random_states(ours, 3)
    weights = [p.detach().clone().requires_grad_() for p in ours.parameters()]
    run = _functional(ours)

    def packed_run(x, h0, c0, *weights):
        return run(pack_padded_sequence(x, lengths, enforce_sorted=False), h0, c0, *weights)
    assert torch.autograd.gradcheck(packed_run, (x, h0, c0, *weights))


# ---------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_optimizer_steps_match_nn_lstm(optimizer):
    ours, ref = module_pair(3, 5, num_layers=2, bidirectional=True, batch_first=True)
    heads = []
    for module in (ours, ref):
        torch.manual_seed(9)
        head = nn.Linear(10, 4, dtype=F64)
        params = list(module.parameters()) + list(head.parameters())
        opt = (torch.optim.SGD(params, lr=0.5, momentum=0.9) if optimizer == "sgd"
               else torch.optim.Adam(params, lr=0.05))
        gen = torch.Generator().manual_seed(3)
        for _ in range(4):
            x = torch.randn(6, 7, 3, dtype=F64, generator=gen)
            target = torch.randint(4, (6,), generator=gen)
            opt.zero_grad()
            _, (h_n, _) = module(x)
            logits = head(torch.cat([h_n[-2], h_n[-1]], dim=1))
            nn.functional.cross_entropy(logits, target).backward()
            opt.step()
        heads.append(head)
    start = module_pair(3, 5, num_layers=2, bidirectional=True, batch_first=True)[0]
    for (name, a), b, s in zip(ours.named_parameters(), ref.parameters(), start.parameters()):
        assert not torch.allclose(a, s), f"{name} did not move"
        assert_close(a, b, what=name)
    for a, b in zip(heads[0].parameters(), heads[1].parameters()):
        assert_close(a, b)


# ---------------------------------------------------------------------------
# module identity, state_dict and helpers
# ---------------------------------------------------------------------------

def test_parameters_and_state_dict_are_those_of_nn_lstm():
    torch.manual_seed(0)
    ours = LSTM(3, 4, num_layers=2, bidirectional=True)
    torch.manual_seed(0)
    ref = nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    assert isinstance(ours, nn.LSTM)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    sd_ours, sd_ref = ours.state_dict(), ref.state_dict()
    assert list(sd_ours) == list(sd_ref)
    for key in sd_ref:  # same initialisation under the same seed
        assert torch.equal(sd_ours[key], sd_ref[key]), key
    # Round trip both ways.
    other = nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    other.load_state_dict(ours.state_dict())
    back = LSTM(3, 4, num_layers=2, bidirectional=True)
    back.load_state_dict(other.state_dict())
    for key, value in back.state_dict().items():
        assert torch.equal(value, sd_ours[key]), key


def test_params_helpers_round_trip_and_drive_lstm_forward():
    torch.manual_seed(0)
    ref = nn.LSTM(3, 4, num_layers=2, bidirectional=True, bias=True, dtype=F64)
    wrapper = nn.Sequential()
    wrapper.add_module("rnn", ref)
    sd = wrapper.state_dict()
    params = params_from_state_dict(sd, prefix="rnn.")
    config = config_from_state_dict(sd, prefix="rnn.")
    assert config == {"num_layers": 2, "bidirectional": True, "has_bias": True, "proj_size": 0}
    assert [p.shape for p in params] == [tuple(w.shape) for w in ref._flat_weights]
    assert all(isinstance(p, np.ndarray) for p in params)
    # Copies by default; views on request.
    params[0][0, 0] += 1.0
    assert params[0][0, 0] != ref.weight_ih_l0[0, 0].item()
    views = params_from_state_dict(ref.state_dict(), copy=False)
    assert np.shares_memory(views[0], ref.weight_ih_l0.detach().numpy())
    # The numpy API with these params equals nn.LSTM.
    x = np.random.default_rng(0).standard_normal((5, 2, 3))
    y, h_n, c_n, _ = lstmcy.lstm_forward(x, None, views, train=False, **config)
    y_ref, (h_ref, c_ref) = ref(torch.from_numpy(x))
    for a, b in zip((y, h_n, c_n), (y_ref, h_ref, c_ref)):
        assert_close(torch.from_numpy(a), b)
    # Back to a state_dict that both modules load.
    sd_back = params_to_state_dict(views, **config)
    assert list(sd_back) == list(ref.state_dict())
    for key, value in sd_back.items():
        assert torch.equal(value, ref.state_dict()[key])
        assert not np.shares_memory(value.numpy(), ref.state_dict()[key].numpy())
    LSTM(3, 4, num_layers=2, bidirectional=True, dtype=F64).load_state_dict(sd_back)
    prefixed = params_to_state_dict(views, prefix="rnn.", **config)
    wrapper.load_state_dict(prefixed)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_params_helpers_with_projections_drive_lstm_forward(bidirectional):
    torch.manual_seed(1)
    ref = nn.LSTM(3, 5, num_layers=2, bidirectional=bidirectional, proj_size=2, dtype=F64)
    sd = ref.state_dict()
    config = config_from_state_dict(sd)
    assert config == {"num_layers": 2, "bidirectional": bidirectional, "has_bias": True, "proj_size": 2}
    params = params_from_state_dict(sd)
    assert [p.shape for p in params] == [tuple(w.shape) for w in ref._flat_weights]
    x = torch.randn(6, 4, 3, dtype=F64)
    want, (h_n, c_n) = ref(x)
    y, got_h, got_c, _ = lstmcy.lstm_forward(x.numpy(), None, params, train=False, **config)
    assert_close(torch.from_numpy(y), want.detach())
    assert_close(torch.from_numpy(got_h), h_n.detach())
    assert_close(torch.from_numpy(got_c), c_n.detach())
    back = params_to_state_dict(params, **config)
    assert list(back) == list(sd)
    loaded = LSTM(3, 5, num_layers=2, bidirectional=bidirectional, proj_size=2, dtype=F64)
    loaded.load_state_dict(back)
    assert_close(loaded(x)[0].detach(), want.detach())


def test_params_helpers_without_bias_and_errors():
    ref = nn.LSTM(2, 3, num_layers=3, bias=False)
    sd = ref.state_dict()
    assert config_from_state_dict(sd) == {"num_layers": 3, "bidirectional": False, "has_bias": False,
                                          "proj_size": 0}
    params = params_from_state_dict(sd)
    assert len(params) == 6
    assert list(params_to_state_dict(params, num_layers=3, has_bias=False)) == list(sd)
    with pytest.raises(ValueError, match="params must hold 12"):
        params_to_state_dict(params, num_layers=3, has_bias=True)
    with pytest.raises(ValueError, match="weight_ih_l0"):
        params_from_state_dict(sd, prefix="encoder.")
    projected = dict(nn.LSTM(2, 4, num_layers=2, proj_size=3).state_dict())
    del projected["weight_hr_l1"]
    with pytest.raises(ValueError, match="weight_hr_l1"):
        config_from_state_dict(projected)
    with pytest.raises(ValueError, match=r"expected \(12, 3\)"):
        params_to_state_dict([np.zeros((12, 2)), np.zeros((12, 4)), np.zeros((3, 3))], has_bias=False,
                             proj_size=3)
    broken = dict(sd)
    del broken["weight_hh_l1"]
    with pytest.raises(ValueError, match="weight_hh_l1"):
        params_from_state_dict(broken)
    with pytest.raises(ValueError, match="shape"):
        params_to_state_dict([np.zeros((12, 2)), np.zeros((12, 4))], has_bias=False)
    with pytest.raises(TypeError, match="state_dict"):
        params_from_state_dict([1, 2])


# ---------------------------------------------------------------------------
# errors and import isolation
# ---------------------------------------------------------------------------

def test_unsupported_dtypes_devices_and_options():
    with warnings.catch_warnings():  # torch: "Complex modules are a new feature"
        warnings.simplefilter("ignore", UserWarning)
        complex_lstm = LSTM(3, 4).to(torch.complex64)
    with pytest.raises(TypeError, match="complex64"):
        complex_lstm(torch.randn(2, 1, 3, dtype=torch.complex64))
    ours = LSTM(3, 4)
    with pytest.raises(ValueError, match="dtype"):  # nn.LSTM's own input check
        ours(torch.randn(2, 1, 3, dtype=F64))
    with pytest.raises(TypeError, match="h0"):
        ours(torch.randn(2, 1, 3), (torch.zeros(1, 1, 4, dtype=F64), torch.zeros(1, 1, 4)))
    meta = LSTM(3, 4, device="meta")
    with pytest.raises(ValueError, match="CPU"):
        meta(torch.empty(2, 1, 3, device="meta"))
    with pytest.raises(RuntimeError, match="hidden"):  # wrong state shape, as nn.LSTM
        ours(torch.randn(2, 1, 3), (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))


def test_replaced_parameter_of_wrong_shape_is_refused():
    # The module skips lstmcy's argument checks on padded input (it checks its tensors as
    # nn.LSTM does), but a parameter swapped for one of another shape must still be
    # refused before the kernels read past it.
    ours = LSTM(3, 4)
    x = torch.randn(5, 2, 3)
    ours.weight_hh_l0 = nn.Parameter(torch.randn(16, 3))
    with pytest.raises(ValueError, match=r"params\[1\] has shape \(16, 3\), expected \(16, 4\)"):
        ours(x)
    with torch.no_grad(), pytest.raises(ValueError, match="params"):
        ours(x)


def test_weights_changed_in_place_before_backward_are_refused():
    # The backward reuses the forward's arrays (views of the tensors): autograd's version
    # counters must refuse a backward after an in-place change, as for nn.LSTM.
    for module in (LSTM(3, 4), nn.LSTM(3, 4)):
        out, _ = module(torch.randn(5, 2, 3))
        with torch.no_grad():
            module.weight_ih_l0.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_import_lstmcy_does_not_import_torch():
    code = "import sys, lstmcy; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# ---------------------------------------------------------------------------
# weights that are not the module's own parameters
# ---------------------------------------------------------------------------

def test_functional_call_uses_the_given_weights():
    """``torch.func.functional_call`` swaps tensors in for the parameters: the forward
    must use those, not the module's own (as nn.LSTM does), and differentiate them."""
    ours, ref = module_pair(3, 4, num_layers=2)
    torch.manual_seed(1)
    swapped = {name: (p.detach() * 1.5 + 0.01).requires_grad_()
               for name, p in ours.named_parameters()}
    x = torch.randn(5, 2, 3, dtype=F64)
    y, (h_n, c_n) = torch.func.functional_call(ours, swapped, (x,))
    y_ref, (h_ref, c_ref) = torch.func.functional_call(ref, swapped, (x,))
    assert_close(y, y_ref, what="y")
    assert_close(c_n, c_ref, what="c_n")
    grads = torch.autograd.grad(y.sum() + h_n.sum(), list(swapped.values()))
    grads_ref = torch.autograd.grad(y_ref.sum() + h_ref.sum(), list(swapped.values()))
    for name, g, g_ref in zip(swapped, grads, grads_ref):
        assert_close(g, g_ref, what=name)
    # The module's own weights are still its own afterwards.
    y_own, _ = ours(x)
    assert_close(y_own, ref(x)[0], what="y after functional_call")


def _scaled_weights(module):
    """``_flat_weights`` with every weight halved (functions of the parameters)."""
    return [w * 0.5 if name.startswith("weight") else w
            for name, w in zip(module._flat_weights_names, module._flat_weights)]


def _exchanged_hh(module):
    """``_flat_weights`` with the two layers' ``weight_hh`` entries pointing at each
    other's tensor."""
    weights = list(module._flat_weights)
    first, second = (module._flat_weights_names.index(f"weight_hh_l{k}") for k in (0, 1))
    weights[first], weights[second] = weights[second], weights[first]
    return weights


@pytest.mark.parametrize("change", ["scale", "re-point", "edit in place"])
@pytest.mark.parametrize("route", ROUTES)
def test_the_flat_weights_list_is_what_is_computed_with(route, change, force_route):
    """``nn.LSTM`` computes with ``_flat_weights``: code that swaps or edits that list
    (weight sharing, pruning utilities, PyTorch's reference quantized LSTM tests) gets
    its weights used."""
    force_route(route)
    ours, ref = module_pair(3, 7, num_layers=2)
    for module in (ours, ref):
        if change == "scale":
            module._flat_weights = _scaled_weights(module)
        elif change == "re-point":
            module._flat_weights = _exchanged_hh(module)
        else:
            module._flat_weights[0] = module._flat_weights[0] * 0.5
    compare(ours, ref, padded_input(5, 2, 3, False), hx_seed=14, batch=2)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_reference_quantized_lstm_of_the_module_matches_its_swapped_weights():
    """PyTorch's ``TestReferenceQuantizedModule.test_rnn``: the reference quantized LSTM
    made from the module equals the module with its ``_flat_weights`` quantized and
    dequantized."""
    import torch.ao.nn.quantized.reference as nnqr

    ours = LSTM(3, 7, num_layers=2, bidirectional=True)
    qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.quint8, "scale": 2.0 ** -6,
               "zero_point": 128}
    weight_qparams = {"is_decomposed": False, **{
        name: qparams for name in ours._flat_weights_names if name.startswith("weight")}}
    reference = nnqr.LSTM.from_float(ours, weight_qparams)
    ours._flat_weights = [
        torch.quantize_per_tensor(w, qparams["scale"], qparams["zero_point"],
                                  qparams["dtype"]).dequantize() if name.startswith("weight")
        else w for name, w in zip(ours._flat_weights_names, ours._flat_weights)]
    x = torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(0))
    for a, b in zip(*[(y, *states) for y, states in (ours(x), reference(x))]):
        assert_close(a, b, rtol=1e-6)


@pytest.mark.parametrize("route", ROUTES)
def test_pruned_weight_is_used_and_differentiated(route, force_route):
    """``torch.nn.utils.prune`` replaces a parameter by ``orig * mask``, recomputed before
    each forward and assigned as an attribute."""
    from torch.nn.utils import prune

    force_route(route)
    ours, ref = module_pair(3, 4, num_layers=2)
    for module in (ours, ref):
        prune.l1_unstructured(module, "weight_hh_l0", amount=0.5)
    assert torch.equal(ours.weight_hh_l0_mask, ref.weight_hh_l0_mask)
    assert (ours.weight_hh_l0 == 0).sum() == 32
    compare(ours, ref, padded_input(5, 2, 3, False), hx_seed=15, batch=2)
    # A new mask changes what is computed.
    for module in (ours, ref):
        prune.l1_unstructured(module, "weight_ih_l1", amount=0.3)
    compare(ours, ref, padded_input(5, 2, 3, False), hx_seed=15, batch=2)


@pytest.mark.parametrize("route", ROUTES)
def test_parametrized_weight_is_used_and_differentiated(route, force_route):
    """A parametrization (weight norm) replaces a parameter by a computed attribute."""
    from torch.nn.utils import parametrizations

    force_route(route)
    ours, ref = module_pair(3, 4)
    parametrizations.weight_norm(ours, "weight_hh_l0")
    parametrizations.weight_norm(ref, "weight_hh_l0")
    ref.load_state_dict(ours.state_dict())
    with torch.no_grad():  # move away from the initial g = |v|, so the norm matters
        ours.parametrizations.weight_hh_l0.original0.mul_(1.7)
        ref.parametrizations.weight_hh_l0.original0.mul_(1.7)
    x = torch.randn(6, 2, 3, dtype=F64)
    y, _ = ours(x)
    y_ref, _ = ref(x)
    assert_close(y, y_ref, what="y")
    (y * y).sum().backward()
    (y_ref * y_ref).sum().backward()
    for (name, p), (_, p_ref) in zip(ours.named_parameters(), ref.named_parameters()):
        assert_close(p.grad, p_ref.grad, what=name)
