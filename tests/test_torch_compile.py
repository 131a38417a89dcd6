"""lstmcy.torch.LSTM under torch.compile, torch.export, torch.jit.trace and torch.fx.

Compiled, exported and traced modules must compute what ``torch.nn.LSTM`` computes on
the same weights (outputs and gradients, float64), from a cold start and after
``torch._dynamo.reset()``, and the graphs must hold the custom operator
``lstmcy::lstm_forward`` (an opaque operation), never constants baked from the example.
The operators' registrations are checked with ``torch.library.opcheck``. ``torch.fx``
must record the module as one call, as it records ``torch.nn.LSTM``.
"""
import io
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

import lstmcy.torch  # noqa: E402
from lstmcy.torch import _ops  # noqa: E402
from torch_oracle import assert_close, module_pair, random_states  # noqa: E402

F64 = torch.float64


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from a cold start, on one torch thread, with dynamo's options
    as it found them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    allow_rnn = torch._dynamo.config.allow_rnn
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch._dynamo.config.allow_rnn = allow_rnn
    torch.set_num_threads(threads)


class Model(nn.Module):
    """An LSTM and a linear head, returning a scalar loss."""

    def __init__(self, lstm):
        super().__init__()
        self.rnn = lstm
        self.head = nn.Linear(lstm.hidden_size * (2 if lstm.bidirectional else 1), 2,
                              dtype=F64)

    def forward(self, x):
        y, (h_n, c_n) = self.rnn(x)
        y = y.data if isinstance(y, torch.nn.utils.rnn.PackedSequence) else y
        return self.head(y).pow(2).sum() + (h_n * c_n).sum()


def _models(**kwargs):
    ours, ref = module_pair(3, 4, **kwargs)
    ours, ref = Model(ours), Model(ref)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def _loss_and_grads(model, run, x):
    torch.manual_seed(3)  # the same dropout masks for every model
    loss = run(x)
    return (loss,) + torch.autograd.grad(loss, list(model.parameters()))


def _assert_same(got, want):
    for a, b in zip(got, want):
        assert_close(a, b)


def _x(T=5, B=2, I=3, seed=0):
    return torch.randn(T, B, I, generator=torch.Generator().manual_seed(seed), dtype=F64)


class GraphRecorder:
    """A backend that records dynamo's graphs and runs them as they are."""

    def __init__(self):
        self.graphs = []

    def __call__(self, graph_module, example_inputs):
        self.graphs.append(graph_module)
        return graph_module.forward

    def calls(self):
        return [str(node.target) for graph in self.graphs for node in graph.graph.nodes
                if node.op == "call_function"]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_cold_and_after_reset(backend):
    """By default dynamo breaks the graph at an LSTM and runs it eagerly; the eager call
    must not let dynamo trace lstmcy's numpy code (that failed cold, and after reset)."""
    ours, ref = _models(num_layers=2, bidirectional=True)
    want = _loss_and_grads(ref, ref, _x())
    for _ in range(2):
        compiled = torch.compile(ours, backend=backend)
        _assert_same(_loss_and_grads(ours, compiled, _x()), want)
        _assert_same(_loss_and_grads(ours, compiled, _x()), want)  # the cached graph
        torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["recorder", "aot_eager"])
def test_fullgraph_with_allow_rnn(backend):
    torch._dynamo.config.allow_rnn = True
    ours, ref = _models(num_layers=2, dropout=0.5)
    recorder = GraphRecorder()
    compiled = torch.compile(ours, backend=recorder if backend == "recorder" else backend,
                             fullgraph=True)
    for seed in (0, 1):  # the second input has another shape
        x = _x(T=5 + seed, B=2 + seed, seed=seed)
        _assert_same(_loss_and_grads(ours, compiled, x), _loss_and_grads(ref, ref, x))
    if backend == "recorder":
        assert "lstmcy.lstm_forward.default" in recorder.calls()


def test_fullgraph_packed_sequence_argument():
    """A PackedSequence passed in compiles in one graph (nn.LSTM's does not: its batch
    size is data-dependent to dynamo)."""
    torch._dynamo.config.allow_rnn = True
    ours, ref = _models(bidirectional=True)
    packed = pack_padded_sequence(_x(B=3), torch.tensor([5, 2, 4]), enforce_sorted=False)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    _assert_same(_loss_and_grads(ours, compiled, packed), _loss_and_grads(ref, ref, packed))


def test_fullgraph_packed_sequence_with_states():
    """With initial states too: the states' batch, which nn.LSTM's check compares with the
    data-dependent batch_sizes[0], is checked when the operator runs."""
    torch._dynamo.config.allow_rnn = True
    ours, ref = module_pair(3, 4, bidirectional=True)
    packed = pack_padded_sequence(_x(B=3), torch.tensor([5, 2, 4]), enforce_sorted=False)
    h0, c0 = (torch.randn(2, 3, 4, dtype=F64, requires_grad=True) for _ in range(2))

    def loss(module, states):
        y, (h_n, c_n) = module(packed, states)
        return y.data.pow(2).sum() + (h_n * c_n).sum()
    compiled = torch.compile(lambda states: loss(ours, states), backend="aot_eager",
                             fullgraph=True)
    got = torch.autograd.grad(compiled((h0, c0)), [h0, c0, *ours.parameters()])
    want = torch.autograd.grad(loss(ref, (h0, c0)), [h0, c0, *ref.parameters()])
    for a, b in zip(got, want):
        assert_close(a, b)
    for batch in (2, 4):  # fewer or more sequences than the batch has
        with pytest.raises(RuntimeError, match=r"Expected hidden\[0\] size \(2, 3, 4\)"):
            compiled((torch.zeros(2, batch, 4, dtype=F64), torch.zeros(2, batch, 4, dtype=F64)))
    with pytest.raises(RuntimeError, match=r"Expected hidden\[1\] size \(2, 3, 4\)"):
        compiled((torch.zeros(2, 3, 4, dtype=F64), torch.zeros(2, 3, 5, dtype=F64)))
    # Sorted (no permutation): the operator checks the batch when it runs.
    packed = pack_padded_sequence(_x(B=3), torch.tensor([5, 4, 2]))
    with pytest.raises(Exception, match=r"\bh0 must have shape \(2, 3, 4\)"):
        compiled((torch.zeros(2, 4, 4, dtype=F64), torch.zeros(2, 4, 4, dtype=F64)))


INDUCTOR_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    sys.path.insert(0, "tests")
    from test_torch_compile import _x
    from torch_oracle import assert_close, module_pair
    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1  # no worker processes
    torch._dynamo.config.allow_rnn = True
    ours, ref = module_pair(3, 4, bidirectional=True)

    def loss(module, x):
        y, (h_n, c_n) = module(x)
        return y.pow(2).sum() + (h_n * c_n).sum()
    compiled = torch.compile(lambda x: loss(ours, x), backend="inductor", fullgraph=True)
    x = _x()
    got = (compiled(x),) + torch.autograd.grad(compiled(x), list(ours.parameters()))
    want = (loss(ref, x),) + torch.autograd.grad(loss(ref, x), list(ref.parameters()))
    for a, b in zip(got, want):
        assert_close(a, b)
    print("ok")
""")


def test_inductor_fullgraph(tmp_path):
    """Inductor compiles the model around the opaque operator (in a subprocess with a
    deadline: inductor may start compiler workers; with a cache of its own, as inductor's
    cache keys do not cover a Python fake implementation)."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    result = subprocess.run([sys.executable, "-c", INDUCTOR_SCRIPT], capture_output=True,
                            text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("grad_mode", [False, True])
def test_jit_trace_records_the_operator(grad_mode):
    """Traced (also under no_grad), saved and reloaded, the module computes new inputs
    of other shapes, and differentiates them."""
    ours, ref = module_pair(3, 4, num_layers=2, bidirectional=True)
    example = _x()
    with torch.set_grad_enabled(grad_mode):
        traced = torch.jit.trace(ours, (example,))
    assert "lstmcy::lstm_forward" in str(traced.graph)
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x = _x(T=7, B=3, seed=1).requires_grad_()
    y, (h_n, c_n) = loaded(x)
    y_ref, (h_ref, c_ref) = ref(x)
    for a, b in zip((y, h_n, c_n), (y_ref, h_ref, c_ref)):
        assert_close(a, b)
    if grad_mode:
        assert_close(torch.autograd.grad(y.sum(), x)[0], torch.autograd.grad(y_ref.sum(), x)[0])


# The forward refreshes _flat_weights from the parameters export swaps in, as nn.LSTM's
# does (and export warns of it for either).
@pytest.mark.filterwarnings("ignore:The tensor attributes self._flat_weights:UserWarning")
def test_export_records_the_operator():
    ours, ref = module_pair(3, 4, num_layers=2)
    program = torch.export.export(ours, (_x(),))
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert "lstmcy.lstm_forward.default" in targets
    x = _x(seed=2)
    for a, b in zip(torch.utils._pytree.tree_leaves(program.module()(x)),
                    torch.utils._pytree.tree_leaves(ref(x))):
        assert_close(a, b)
    # The module computes with its own weights again afterwards.
    for a, b in zip(torch.utils._pytree.tree_leaves(ours(x)),
                    torch.utils._pytree.tree_leaves(ref(x))):
        assert_close(a, b)


def _operator_arguments(packed, dropout):
    torch.manual_seed(0)
    L, D, H, I, B, T = 2, 2, 3, 2, 3, 4
    weights = []
    for layer in range(L):
        for _ in range(D):
            weights += [torch.randn(4 * H, I if layer == 0 else D * H, dtype=F64),
                        torch.randn(4 * H, H, dtype=F64), torch.randn(4 * H, dtype=F64),
                        torch.randn(4 * H, dtype=F64)]
    weights = [w.requires_grad_() for w in weights]
    x = torch.randn(T, B, I, dtype=F64, requires_grad=True)
    lstm = nn.LSTM(I, H, num_layers=L, bidirectional=True)
    h0, c0 = random_states(lstm, B)
    batch_sizes = None
    if packed:
        data = pack_padded_sequence(x.detach(), torch.tensor([4, 2, 3]), enforce_sorted=False)
        x, batch_sizes = data.data.requires_grad_(), data.batch_sizes
    rows = x.shape[:-1]
    masks = [torch.bernoulli(torch.full((*rows, D * H), 0.6, dtype=F64)) / 0.6] if dropout else []
    return x, batch_sizes, h0, c0, weights, masks, H, L, True, True, False, 0


@pytest.mark.parametrize("packed, dropout", [(False, True), (True, False)])
def test_opcheck(packed, dropout):
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    args = _operator_arguments(packed, dropout)
    torch.library.opcheck(_ops.lstm_forward, args + (True,), test_utils=utils)
    detached = [a.detach() if isinstance(a, torch.Tensor) else
                [t.detach() for t in a] if isinstance(a, list) else a for a in args]
    y, h_n, c_n, saved = _ops.lstm_forward(*detached, True)
    x, batch_sizes, h0, c0, weights, masks = args[:6]
    grad_y = torch.randn_like(y).requires_grad_()
    for mask in ([True, True, True, True], [False, False, False, True]):
        backward_args = (x, batch_sizes, h0, c0, weights, masks, saved, grad_y, None,
                         torch.randn_like(c_n)) + args[6:] + (mask,)
        torch.library.opcheck(_ops.lstm_backward, backward_args, test_utils=utils)


# ---------------------------------------------------------------------------
# torch.fx
# ---------------------------------------------------------------------------

class _WithStates(nn.Module):
    """An LSTM called with given states, returning its three outputs."""

    def __init__(self, lstm):
        super().__init__()
        self.rnn = lstm

    def forward(self, x, h0, c0):
        y, (h_n, c_n) = self.rnn(x, (h0, c0))
        return y, h_n, c_n


def _graph(graph_module):
    return [(node.op, str(node.target)) for node in graph_module.graph.nodes]


def test_fx_symbolic_trace_records_one_call_of_the_module():
    """``torch.fx`` keeps ``nn.LSTM`` whole (a leaf: a module of ``torch.nn``); a model
    holding lstmcy's traces to the same graph, which computes as nn.LSTM does."""
    ours, ref = _models(num_layers=2, dropout=0.5)
    traced = torch.fx.symbolic_trace(ours)
    assert _graph(traced) == _graph(torch.fx.symbolic_trace(ref))
    assert [node.target for node in traced.graph.nodes if node.op == "call_module"] == [
        "rnn", "head"]
    for x in (_x(), _x(T=7, B=3, seed=1)):  # not constants baked from a first input
        _assert_same(_loss_and_grads(traced, traced, x), _loss_and_grads(ref, ref, x))

    ours, ref = module_pair(3, 4, num_layers=2, bidirectional=True)
    traced = torch.fx.symbolic_trace(_WithStates(ours))
    assert _graph(traced) == _graph(torch.fx.symbolic_trace(_WithStates(ref)))
    x = _x(B=3, seed=2).requires_grad_()
    h0, c0 = random_states(ours, 3)
    got, want = traced(x, h0, c0), ref(x, (h0, c0))
    want = (want[0], *want[1])
    gen = torch.Generator().manual_seed(5)
    cotangents = [torch.randn(t.shape, generator=gen, dtype=F64) for t in want]
    for outputs in (got, want):
        outputs += torch.autograd.grad(outputs, [x, h0, c0], cotangents)
    _assert_same(got, want)


def test_fx_symbolic_trace_of_the_module_itself_raises_as_for_nn_lstm():
    ours, ref = module_pair(3, 4)
    with pytest.raises(torch.fx.proxy.TraceError, match="trace a model that holds it"):
        torch.fx.symbolic_trace(ours)
    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(ref)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_fx_graph_mode_dynamic_quantization_leaves_the_module_in_float():
    """FX graph-mode quantization matches modules by their exact type: it converts
    nn.LSTM, and leaves lstmcy's LSTM in float, computed by lstmcy; ``quantize_dynamic``
    then converts it to the module FX gives nn.LSTM."""
    from torch.ao.quantization import QConfigMapping, default_dynamic_qconfig, quantize_dynamic
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    ours, ref = _models(num_layers=2)
    ours, ref = ours.float().eval(), ref.float().eval()
    x = _x().float()
    mapping = QConfigMapping().set_global(default_dynamic_qconfig)
    converted = {name: convert_fx(prepare_fx(model, mapping, (x,)))
                 for name, model in (("ours", ours), ("ref", ref))}
    assert type(converted["ours"].rnn) is lstmcy.torch.LSTM
    assert type(converted["ref"].rnn) is torch.ao.nn.quantized.dynamic.LSTM
    y, (h_n, _) = converted["ours"].rnn(x)
    y_float, (h_float, _) = ref.rnn(x)
    assert_close(y, y_float, rtol=1e-6)
    assert_close(h_n, h_float, rtol=1e-6)
    quantized = quantize_dynamic(converted["ours"], {nn.LSTM})
    assert type(quantized.rnn) is torch.ao.nn.quantized.dynamic.LSTM
    assert torch.equal(quantized(x), converted["ref"](x))
