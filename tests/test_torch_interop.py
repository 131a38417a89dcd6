"""lstmcy.torch.LSTM with the rest of PyTorch: float16/bfloat16 modules, dynamic
quantization, ``torch.load(weights_only=True)`` and DistributedDataParallel.

Low-precision modules compute in float32: their results must be at least as accurate as
``torch.nn.LSTM``'s in the same dtype (both measured against float64). Quantization must
convert the module as it converts ``nn.LSTM``. DDP on two gloo processes must end with
both ranks' parameters equal to single-process training on the whole batch.
"""
import io
import os
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import lstmcy.torch  # noqa: E402
from lstmcy.torch import LSTM  # noqa: E402
from torch_oracle import assert_close, module_pair, random_states  # noqa: E402
from torch_oracle import single_torch_thread  # noqa: E402,F401  (autouse fixture)

F64 = torch.float64
TESTS = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------
# float16 / bfloat16
# ---------------------------------------------------------------------------

def _outputs_and_grads(module, x, dtype):
    x = x.to(dtype).requires_grad_()
    y, (h_n, c_n) = module(x)
    gen = torch.Generator().manual_seed(3)
    cotangent = torch.randn(y.shape, generator=gen, dtype=F64).to(dtype)
    grads = torch.autograd.grad((y * cotangent).sum() + h_n.sum(), [x] + list(module.parameters()))
    return [y, h_n, c_n] + list(grads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_at_least_as_accurate_as_nn_lstm(dtype):
    ours, ref = module_pair(8, 16, dtype=torch.float32, num_layers=2, bidirectional=True)
    ours, ref = ours.to(dtype), ref.to(dtype)
    exact = nn.LSTM(8, 16, num_layers=2, bidirectional=True, dtype=F64)
    exact.load_state_dict(ours.state_dict())  # the dtype's weights, exactly in float64
    x = torch.randn(12, 4, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
    got = _outputs_and_grads(ours, x, dtype)
    theirs = _outputs_and_grads(ref, x, dtype)
    want = _outputs_and_grads(exact, x, F64)
    names = ["y", "h_n", "c_n", "input"] + [n for n, _ in ours.named_parameters()]
    eps = torch.finfo(dtype).eps
    for name, a, b, w in zip(names, got, theirs, want):
        assert a.dtype == dtype, name
        error = (a.double() - w).abs().max().item()
        error_torch = (b.double() - w).abs().max().item()
        # No worse than nn.LSTM, give or take one rounding of the result.
        assert error <= max(error_torch, eps * w.abs().max().item()), (name, error, error_torch)


def test_low_precision_parameters_receive_low_precision_gradients():
    ours = LSTM(3, 4).to(torch.bfloat16)
    y, _ = ours(torch.randn(5, 2, 3, dtype=torch.bfloat16))
    y.float().sum().backward()
    assert all(p.grad.dtype == torch.bfloat16 for p in ours.parameters())


# ---------------------------------------------------------------------------
# quantize_dynamic
# ---------------------------------------------------------------------------

class Tagger(nn.Module):
    def __init__(self, lstm_class):
        super().__init__()
        self.rnn = lstm_class(3, 4, num_layers=2)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("spec", ["{nn.LSTM}", "default", "{nn.Linear}"])
@pytest.mark.parametrize("dtype", [torch.qint8, torch.float16])
def test_quantize_dynamic_converts_as_for_nn_lstm(spec, dtype):
    from torch.ao.quantization import quantize_dynamic

    torch.manual_seed(0)
    ours, ref = Tagger(LSTM), Tagger(nn.LSTM)
    ref.load_state_dict(ours.state_dict())
    qconfig_spec = {"{nn.LSTM}": {nn.LSTM}, "default": None, "{nn.Linear}": {nn.Linear}}[spec]
    quantized = [quantize_dynamic(model, qconfig_spec, dtype=dtype) for model in (ours, ref)]
    if spec == "{nn.Linear}":  # left in float, as nn.LSTM is
        assert type(quantized[0].rnn) is LSTM and type(quantized[1].rnn) is nn.LSTM
    else:
        assert type(quantized[0].rnn) is type(quantized[1].rnn) is \
            torch.ao.nn.quantized.dynamic.LSTM
    x = torch.randn(5, 2, 3)
    if spec == "{nn.Linear}":  # float32 LSTMs: equal to rounding
        assert_close(quantized[0](x), quantized[1](x), rtol=1e-5)
    else:  # the same quantized module with the same weights
        assert torch.equal(quantized[0](x), quantized[1](x))
    assert type(ours.rnn) is LSTM  # quantize_dynamic copies by default


# ---------------------------------------------------------------------------
# torch.load(weights_only=True)
# ---------------------------------------------------------------------------

@pytest.fixture
def restore_safe_globals():
    saved = torch.serialization.get_safe_globals()
    yield
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(saved)


def test_weights_only_load_with_the_documented_allow_list(restore_safe_globals):
    ours, ref = module_pair(3, 4, num_layers=2)
    buffer = io.BytesIO()
    torch.save(ours, buffer)
    buffer.seek(0)
    with pytest.raises(Exception, match="lstmcy.torch.LSTM"):
        torch.load(buffer, weights_only=True)
    # The recipe of docs/torch.md:
    torch.serialization.add_safe_globals([lstmcy.torch.LSTM])
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert type(loaded) is LSTM
    x = torch.randn(5, 2, 3, dtype=F64)
    assert_close(loaded(x)[0], ref(x)[0])


# ---------------------------------------------------------------------------
# DistributedDataParallel
# ---------------------------------------------------------------------------

DDP_SCRIPT = textwrap.dedent("""
    import datetime, sys
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    sys.path.insert(0, {tests!r})
    from test_torch_interop import train

    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    model = train(DistributedDataParallel, rows=slice(4 * rank, 4 * rank + 4))
    torch.save(model.state_dict(), out)
    dist.destroy_process_group()
""")


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = LSTM(3, 5, num_layers=2, bidirectional=True, batch_first=True, dtype=F64)
        self.head = nn.Linear(10, 4, dtype=F64)

    def forward(self, x):
        _, (h_n, _) = self.rnn(x)
        return self.head(torch.cat([h_n[-2], h_n[-1]], dim=1))


def train(wrap=None, rows=slice(None), steps=3):
    """Train a :class:`Classifier` (wrapped by ``wrap``) on rows ``rows`` of each batch
    of 8 sequences; return it (unwrapped)."""
    torch.manual_seed(0)
    model = Classifier()
    run = model if wrap is None else wrap(model)
    optimizer = torch.optim.SGD(run.parameters(), lr=0.5, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 6, 3, generator=generator, dtype=F64)
        target = torch.randint(4, (8,), generator=generator)
        optimizer.zero_grad()
        nn.functional.cross_entropy(run(x[rows]), target[rows]).backward()
        optimizer.step()
    return model


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ddp_two_gloo_processes_equal_single_process_training(tmp_path):
    port = _free_port()
    script = DDP_SCRIPT.format(tests=TESTS)
    outs = [tmp_path / f"rank{rank}.pt" for rank in range(2)]
    ranks = [subprocess.Popen([sys.executable, "-c", script, str(rank), str(port), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, out in enumerate(outs)]
    try:
        for rank in ranks:
            _, stderr = rank.communicate(timeout=180)
            assert rank.returncode == 0, stderr[-3000:]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    states = [torch.load(out, weights_only=True) for out in outs]
    single = train().state_dict()
    torch.manual_seed(0)
    start = Classifier().state_dict()
    for key, value in single.items():
        assert torch.equal(states[0][key], states[1][key]), key
        assert_close(states[0][key], value, what=key)
        assert not torch.allclose(value, start[key]), f"{key} did not move"


def _negated_view(tensor):
    """``tensor``'s values in a view with the negative bit set (``z.conj().imag`` of a
    complex tensor whose imaginary part is ``-tensor``): its memory holds ``-tensor``."""
    z = torch.complex(torch.zeros_like(tensor), -tensor.detach())
    view = z.conj().imag
    assert view.is_neg() and torch.equal(view, tensor)
    return view


@pytest.mark.parametrize("where", ["input", "h0", "c0", "grad"])
def test_negative_bit_views_are_read_as_their_values(where):
    """Lazily negated views (``conj().imag``) of the input, the states and the incoming
    gradient compute what nn.LSTM computes from the same values."""
    ours, ref = module_pair(3, 4, num_layers=2)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 2, 3, generator=gen, dtype=torch.float64)
    h0, c0 = (s.detach() for s in random_states(ours, 2))
    grad = torch.randn(5, 2, 4, generator=gen, dtype=torch.float64)
    given = dict(input=x, h0=h0, c0=c0, grad=grad)
    given[where] = _negated_view(given[where])
    outputs = []
    for module in (ours, ref):
        xin = given["input"].detach().clone() if where != "input" else given["input"]
        leaf = xin.requires_grad_() if not xin.is_neg() else xin
        y, (h_n, c_n) = module(leaf, (given["h0"], given["c0"]))
        y.backward(given["grad"])
        outputs.append((y, h_n, c_n, [p.grad for p in module.parameters()]))
    (y, h_n, c_n, grads), (y_ref, h_ref, c_ref, grads_ref) = outputs
    for a, b, name in [(y, y_ref, "y"), (h_n, h_ref, "h_n"), (c_n, c_ref, "c_n")]:
        assert_close(a, b, what=name)
    for a, b in zip(grads, grads_ref):
        assert_close(a, b, what="parameter gradient")
