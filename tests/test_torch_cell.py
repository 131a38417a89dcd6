"""``lstmcy.torch.LSTMCell`` against ``torch.nn.LSTMCell``.

In float64 the cell must compute what ``nn.LSTMCell`` computes (steps unrolled, every
gradient: input, both states, each parameter), batched and unbatched, with and without
bias and states; its eager step must be one autograd node whose results are bitwise
those of the general route (a one-step ``lstmcy.torch.LSTM`` call); errors must be
``nn.LSTMCell``'s; and it must work under ``torch.compile``, ``torch.func`` and second
derivatives as the LSTM module does.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import lstmcy.torch  # noqa: E402
from lstmcy.torch import LSTMCell  # noqa: E402
from torch_oracle import assert_close, single_torch_thread  # noqa: E402,F401

F64 = torch.float64


def cell_pair(input_size=5, hidden_size=7, bias=True, dtype=F64, seed=0):
    torch.manual_seed(seed)
    ours = LSTMCell(input_size, hidden_size, bias=bias, dtype=dtype)
    ref = nn.LSTMCell(input_size, hidden_size, bias=bias, dtype=dtype)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def _unrolled(module, xs, hx):
    """Steps over ``xs``; a loss of every step's states."""
    states = hx
    loss = 0
    for k, x in enumerate(xs):
        states = module(x, states)
        loss = loss + (states[0] * (k + 1)).sum() + (states[1] ** 2).sum()
    return states, loss


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch", [None, 1, 4])
@pytest.mark.parametrize("with_states", [True, False])
def test_unrolled_steps_match_nn_lstmcell_float64(bias, batch, with_states):
    ours, ref = cell_pair(bias=bias)
    gen = torch.Generator().manual_seed(3)
    lead = () if batch is None else (batch,)
    xs = torch.randn((4,) + lead + (5,), generator=gen, dtype=F64, requires_grad=True)
    hx = None
    if with_states:
        hx = tuple(torch.randn(lead + (7,), generator=gen, dtype=F64, requires_grad=True)
                   for _ in range(2))
    inputs = [xs] + (list(hx) if hx else [])
    results = []
    for module in (ours, ref):
        (h, c), loss = _unrolled(module, xs, hx)
        grads = torch.autograd.grad(loss, inputs + list(module.parameters()))
        results.append((h, c) + grads)
    names = ["h", "c", "dx"] + (["dh0", "dc0"] if hx else []) + \
        [name for name, _ in ref.named_parameters()]
    for name, a, b in zip(names, *results):
        assert a.shape == b.shape, name
        assert_close(a, b, what=name)


def _names(node):
    return [None if fn is None else type(fn).__name__ for fn, _ in node.next_functions]


def test_one_autograd_node_per_step():
    """A step is one node; every step of a module sends its parameters' gradients through
    the module's one parameters node, whose edges are the parameters' own."""
    ours, _ = cell_pair()
    x = torch.randn(2, 5, dtype=F64, requires_grad=True)
    h, c = ours(x)
    assert type(h.grad_fn).__name__ == "_CellStepBackward"
    assert h.grad_fn is c.grad_fn
    # x, h0, c0 (zeros: no node), the parameters' node.
    assert _names(h.grad_fn) == ["AccumulateGrad", None, None, "_StepParametersBackward"]
    params_node = h.grad_fn.next_functions[3][0]
    assert [fn.variable for fn, _ in params_node.next_functions] == list(ours.parameters())
    h2, _ = ours(x, (h, c))
    assert h2.grad_fn.next_functions[3][0] is params_node
    assert h2.grad_fn.next_functions[1][0] is h.grad_fn
    # Another parameter, or another requires_grad flag: another parameters node.
    ours.bias_hh.requires_grad_(False)
    h3, _ = ours(x, (h2, c))
    other = h3.grad_fn.next_functions[3][0]
    assert other is not params_node
    assert _names(other) == ["AccumulateGrad", "AccumulateGrad", "AccumulateGrad", None]
    ours.weight_ih = nn.Parameter(ours.weight_ih.detach().clone())
    h4, _ = ours(x, (h3, c))
    assert h4.grad_fn.next_functions[3][0] is not other
    assert h4.grad_fn.next_functions[3][0].next_functions[0][0].variable is ours.weight_ih


def _general(module, x, hx):
    return module._general_step(x, hx)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("batch", [1, 3, 64, 512])
@pytest.mark.parametrize("bias", [True, False])
def test_fast_step_is_bitwise_the_general_route(dtype, batch, bias):
    ours, _ = cell_pair(16, 32, bias=bias, dtype=dtype)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(batch, 16, generator=gen, dtype=dtype, requires_grad=True)
    hx = tuple(torch.randn(batch, 32, generator=gen, dtype=dtype, requires_grad=True)
               for _ in range(2))
    dh, dc = (torch.randn(batch, 32, generator=gen, dtype=dtype) for _ in range(2))
    inputs = [x, *hx, *ours.parameters()]
    results = []
    for step in (ours, lambda x, hx: _general(ours, x, hx)):
        h, c = step(x, hx)
        grads = torch.autograd.grad((h, c), inputs, (dh, dc))
        with torch.no_grad():
            inference = step(x, hx)
        results.append((h, c) + grads + inference)
    fast, general = results
    for a, b in zip(fast, general):
        assert torch.equal(a, b)
    # The small steps ran on the kernel objects (the larger on the layer calls: B = 64
    # its backward, B = 512 both).
    if batch == 512:
        assert ours._step_kernel is None
        return
    plan = ours._step_kernel[3]
    key = (batch, 16, 32, np.dtype(str(dtype).split(".")[1]), True, True)
    assert (key in plan._step_kernels) == (batch < 64)


def test_state_dict_parameters_and_type():
    ours, ref = cell_pair(bias=True)
    assert isinstance(ours, nn.LSTMCell)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert ours.state_dict().keys() == ref.state_dict().keys()
    torch.manual_seed(4)
    a = LSTMCell(3, 6)
    torch.manual_seed(4)
    b = nn.LSTMCell(3, 6)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert repr(a).endswith("LSTMCell(3, 6)")


def test_weights_changed_between_steps_are_read():
    """The cell's numpy views of its weights follow in-place changes and replacements."""
    ours, ref = cell_pair()
    x = torch.randn(2, 5, dtype=F64)
    with torch.no_grad():
        for p in ours.parameters():
            p.mul_(0.5)
        ref.load_state_dict(ours.state_dict())
        for a, b in zip(ours(x), ref(x)):
            assert_close(a, b)
        ours.weight_hh.data = torch.randn(28, 7, dtype=F64)
        ref.weight_hh.data = ours.weight_hh.data.clone()
        for a, b in zip(ours(x), ref(x)):
            assert_close(a, b)


@pytest.mark.parametrize("grad", [False, True])
def test_non_contiguous_weights_changed_in_place_are_read(grad):
    """A parameter over strided memory (a transposed tensor) is read as it is at each
    step, in place changes included."""
    ours, ref = cell_pair()
    ours.weight_hh = nn.Parameter(ours.weight_hh.detach().t().contiguous().t())
    ref.weight_hh = nn.Parameter(ours.weight_hh.detach().clone())
    assert not ours.weight_hh.is_contiguous()
    x = torch.randn(2, 5, dtype=F64)
    with torch.set_grad_enabled(grad):
        for scale in (1.0, 0.5, 2.0):
            with torch.no_grad():
                ours.weight_hh.mul_(scale)
                ref.weight_hh.mul_(scale)
            hx = (torch.full((2, 7), 0.3, dtype=F64), torch.full((2, 7), -0.2, dtype=F64))
            for a, b in zip(ours(x, hx), ref(x, hx)):
                assert_close(a, b)


def test_copies_compute_with_their_own_weights():
    import copy
    import io
    ours, ref = cell_pair()
    x = torch.randn(2, 5, dtype=F64)
    ours(x)  # the original's views made
    buffer = io.BytesIO()
    torch.save(ours, buffer)
    buffer.seek(0)
    for twin in (copy.deepcopy(ours), torch.load(buffer, weights_only=False)):
        with torch.no_grad():
            for p in twin.parameters():
                p.mul_(2.0)
            for a, b in zip(twin(x), nn.LSTMCell.forward(twin, x)):
                assert_close(a, b)


def test_copies_train_their_own_parameters():
    """A copy made after training steps sends its gradients to its own parameters (the
    original's parameters tensor is not copied)."""
    import copy
    ours, _ = cell_pair()
    x = torch.randn(2, 5, dtype=F64)
    ours(x)[0].sum().backward()
    before = [p.grad.clone() for p in ours.parameters()]
    twin = copy.deepcopy(ours)
    twin.zero_grad(set_to_none=True)
    h, _ = twin(x)
    h.sum().backward()
    assert all(p.grad is not None for p in twin.parameters())
    assert all(torch.equal(p.grad, b) for p, b in zip(ours.parameters(), before))


@pytest.mark.parametrize("change", ["load_state_dict", "float"])
def test_parameters_swapped_in_place_train(change):
    """With swapping on, load_state_dict and .to() swap each parameter's TensorImpl under
    the same object (torch.utils.swap_tensors): the next training step takes the new
    ones (the last steps' parameters node is not reused). nn.LSTM's parameters cannot be
    swapped (its weak references to them): the cell's only."""
    ours, ref = cell_pair()
    x = torch.randn(2, 5, dtype=F64)
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        ours(x)[0].sum().backward()
        state = {k: v.clone() * 0.5 for k, v in ours.state_dict().items()}
        if change == "load_state_dict":
            ours.load_state_dict(state)
        else:
            ours.double()
        ref.load_state_dict(ours.state_dict())
        for module in (ours, ref):
            module.zero_grad(set_to_none=True)
            module(x)[0].sum().backward()
        for a, b in zip(ours.parameters(), ref.parameters()):
            assert_close(a.grad, b.grad)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)


def test_parameter_gradients_are_tensors_of_their_own():
    ours, _ = cell_pair()
    h, c = ours(torch.randn(2, 5, dtype=F64))
    (h.sum() + c.sum()).backward()
    storages = {p.grad.untyped_storage().data_ptr() for p in ours.parameters()}
    assert len(storages) == 4
    assert all(p.grad.untyped_storage().nbytes() == p.grad.nbytes for p in ours.parameters())


@pytest.mark.parametrize("hx", [False, True])
def test_inference_mode_records_nothing_as_nns(hx):
    """Under inference mode grad mode may be on (enable_grad), but autograd records
    nothing: the calls (one step or a sequence) run as inference, as nn's."""
    ours, ref = cell_pair()
    lstm = lstmcy.torch.LSTM(5, 7, dtype=F64)
    nn_lstm = nn.LSTM(5, 7, dtype=F64)
    nn_lstm.load_state_dict(lstm.state_dict())
    x = torch.randn(2, 5, dtype=F64)
    state = (torch.randn(2, 7, dtype=F64), torch.randn(2, 7, dtype=F64)) if hx else None
    with torch.inference_mode(), torch.enable_grad():
        for module, other, args in (
                (ours, ref, (x, state)),
                (lstm, nn_lstm, (x[None], None if state is None
                                 else tuple(s[None] for s in state))),
                (lstm, nn_lstm, (torch.stack([x, -x, x]), None if state is None
                                 else tuple(s[None] for s in state)))):
            mine, theirs = module(*args), other(*args)
            flat = [t for t in torch.utils._pytree.tree_leaves(mine)]
            assert not any(t.requires_grad for t in flat)
            for a, b in zip(flat, torch.utils._pytree.tree_leaves(theirs)):
                assert_close(a, b)


def test_parameter_hooks_see_the_steps_sum_once():
    """As with nn.LSTMCell: a hook on a parameter runs once per backward pass, on the sum
    of every step's gradient; a retained graph's second pass adds the same again."""
    ours, ref = cell_pair()
    xs = torch.randn(4, 2, 5, dtype=F64)
    calls = {id(m): [] for m in (ours, ref)}
    for module in (ours, ref):
        module.weight_hh.register_hook(lambda g, k=id(module): calls[k].append(g.clone()))
        h = c = torch.zeros(2, 7, dtype=F64)
        for x in xs:
            h, c = module(x, (h, c))
        loss = (h ** 2).sum() + c.sum()
        loss.backward(retain_graph=True)
        first = module.weight_hh.grad.clone()
        loss.backward()
        assert_close(module.weight_hh.grad, 2 * first)
    assert len(calls[id(ours)]) == len(calls[id(ref)]) == 2
    for a, b in zip(calls[id(ours)], calls[id(ref)]):
        assert_close(a, b)


def test_threads_train_one_cell_at_once():
    """Threads unrolling and differentiating one module at once (its parameters' node and
    kernel objects shared) each get the gradients of a run alone, bitwise."""
    import threading
    ours, _ = cell_pair(8, 16, dtype=torch.float32)
    xs = torch.randn(6, 3, 8)

    def gradients():
        h = c = torch.zeros(3, 16)
        for x in xs:
            h, c = ours(x, (h, c))
        return torch.autograd.grad((h ** 2).sum() + c.sum(), list(ours.parameters()))

    expected = gradients()
    failures = []

    def work():
        for _ in range(50):
            if not all(torch.equal(a, b) for a, b in zip(gradients(), expected)):
                failures.append("differs")
                return

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a training thread did not finish"
    assert not failures


def test_in_place_change_before_backward_is_refused():
    ours, _ = cell_pair()
    h, _ = ours(torch.randn(2, 5, dtype=F64))
    with torch.no_grad():
        ours.weight_ih.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        h.sum().backward()


@pytest.mark.parametrize("case", ["3-D input", "0-D input", "3-D state", "input size",
                                  "state batch", "state size", "dtype", "unbatched state"])
def test_errors_are_nn_lstmcells(case):
    ours, ref = cell_pair()
    x = torch.randn(2, 5, dtype=F64)
    hx = (torch.zeros(2, 7, dtype=F64), torch.zeros(2, 7, dtype=F64))
    if case == "3-D input":
        x = x[None]
    elif case == "0-D input":
        x = x[0, 0]
    elif case == "3-D state":
        hx = (hx[0][None], hx[1])
    elif case == "input size":
        x = x[:, :4]
    elif case == "state batch":
        hx = (hx[0][:1], hx[1][:1])
    elif case == "state size":
        hx = (hx[0][:, :6], hx[1])
    elif case == "dtype":
        x = x.float()
    elif case == "unbatched state":
        hx = (hx[0][0], hx[1][0])
    errors = []
    for module in (ours, ref):
        with pytest.raises(Exception) as info:
            module(x, hx)
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


def test_other_devices_and_state_dtypes_are_refused_as_by_the_lstm_module():
    ours, _ = cell_pair()
    x = torch.randn(2, 5, dtype=F64)
    with pytest.raises(lstmcy.torch.StateDtypeError):
        ours(x, (torch.zeros(2, 7), torch.zeros(2, 7)))
    with pytest.raises(ValueError, match="CPU"):
        ours(x.to("meta"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_is_computed_in_float32(dtype):
    ours, ref = cell_pair(dtype=torch.float32)
    ours.to(dtype)
    x = torch.randn(3, 5)
    h, c = ours(x.to(dtype))
    assert h.dtype == c.dtype == dtype
    with torch.no_grad():
        h32, c32 = ref(x)
    assert torch.allclose(h.float(), h32, atol=2e-2) and torch.allclose(c.float(), c32, atol=2e-2)


def test_second_derivatives_and_gradcheck():
    ours, ref = cell_pair(3, 4)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, generator=gen, dtype=F64, requires_grad=True)
    hx = tuple(torch.randn(2, 4, generator=gen, dtype=F64, requires_grad=True) for _ in range(2))
    results = []
    for module in (ours, ref):
        h, c = module(x, hx)
        g = torch.autograd.grad((h ** 2).sum() + c.sum(), [x, *hx], create_graph=True)
        results.append(torch.autograd.grad(sum((t ** 2).sum() for t in g),
                                           [x, *hx, *module.parameters()]))
    for a, b in zip(*results):
        assert_close(a, b)
    assert torch.autograd.gradcheck(lambda x, h, c: ours(x, (h, c)), (x, *hx))
    assert torch.autograd.gradgradcheck(lambda x, h, c: ours(x, (h, c)), (x, *hx))


@pytest.mark.parametrize("bias", [True, False])
def test_second_derivatives_through_the_parameters(bias):
    """A penalty on the parameters' gradients of three unrolled steps (the steps'
    parameter gradients differentiable through the parameters node), as nn.LSTMCell's."""
    ours, ref = cell_pair(3, 4, bias=bias)
    gen = torch.Generator().manual_seed(8)
    xs = torch.randn(3, 2, 3, generator=gen, dtype=F64, requires_grad=True)
    results = []
    for module in (ours, ref):
        h = c = torch.zeros(2, 4, dtype=F64)
        for x in xs:
            h, c = module(x, (h, c))
        params = list(module.parameters())
        g = torch.autograd.grad((h ** 2).sum() + c.sum(), params, create_graph=True)
        penalty = sum((t ** 2).sum() for t in g)
        results.append(g + torch.autograd.grad(penalty, [xs, *params]))
    for a, b in zip(*results):
        assert_close(a, b)


def test_torch_func_per_sample_gradients_and_jvp():
    from torch.func import functional_call, grad, jvp, vmap
    ours, ref = cell_pair(3, 4)
    params = {name: p.detach() for name, p in ours.named_parameters()}
    xs = torch.randn(5, 3, dtype=F64)

    def loss(module, params, x):
        h, c = functional_call(module, params, (x,))
        return (h ** 2).sum() + c.sum()

    per_sample = vmap(grad(lambda p, x: loss(ours, p, x)), in_dims=(None, 0))(params, xs)
    for k, x in enumerate(xs):
        expected = grad(lambda p: loss(ref, p, x[None]))(params)
        for name in params:
            assert_close(per_sample[name][k], expected[name], what=name)
    tangent = torch.ones_like(xs)
    ours_t = jvp(lambda x: ours(x)[0], (xs,), (tangent,))[1]
    ref_t = jvp(lambda x: ref(x)[0], (xs,), (tangent,))[1]
    assert_close(ours_t, ref_t)
    with torch.no_grad():  # an inference step under a transform: not on the step kernel
        ours_t = jvp(lambda x: ours(x)[0], (xs,), (tangent,))[1]
        assert_close(ours_t, ref_t)
        per_row = vmap(lambda x: ours(x[None])[0])(xs)
        assert_close(per_row[:, 0], ref(xs)[0])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile(backend):
    torch._dynamo.reset()
    allow_rnn = torch._dynamo.config.allow_rnn
    torch._dynamo.config.allow_rnn = True
    try:
        ours, ref = cell_pair(3, 4)
        x = torch.randn(2, 3, dtype=F64, requires_grad=True)

        def unroll(module, x):
            h, c = module(x)
            h, c = module(x, (h, c))
            return (h * c).sum()

        compiled = torch.compile(lambda x: unroll(ours, x), backend=backend, fullgraph=True)
        value = compiled(x)
        (grad,) = torch.autograd.grad(value, x)
        expected = unroll(ref, x)
        (expected_grad,) = torch.autograd.grad(expected, x)
        assert_close(value, expected)
        assert_close(grad, expected_grad)
    finally:
        torch._dynamo.config.allow_rnn = allow_rnn
        torch._dynamo.reset()


def test_fx_records_one_call():
    ours, _ = cell_pair(3, 4)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = ours

        def forward(self, x):
            return self.cell(x)

    graph = torch.fx.symbolic_trace(Model())
    calls = [n for n in graph.graph.nodes if n.op == "call_module"]
    assert [n.target for n in calls] == ["cell"]
    x = torch.randn(2, 3, dtype=F64)
    for a, b in zip(graph(x), ours(x)):
        assert torch.equal(a, b)
