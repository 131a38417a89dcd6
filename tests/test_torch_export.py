"""Deployment of models holding lstmcy.torch.LSTM: ONNX export (both exporters) run by
onnxruntime, and ``torch.jit.script``.

A model holding ``lstmcy.torch.LSTM`` must export to the graph ``torch.nn.LSTM``'s model
exports to (ONNX's ``LSTM`` operator), and onnxruntime must compute on it what it computes
on ``nn.LSTM``'s export, for batch and sequence lengths other than the exported ones. A
projected LSTM, which ONNX's operator cannot express, must raise an error naming
``proj_size``. A scripted model must equal ``nn.LSTM``'s, also after ``torch.jit.save``
and a load in a fresh process.
"""
import os
import subprocess
import sys
import textwrap
from typing import Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

from lstmcy.torch import LSTM  # noqa: E402
from torch_oracle import assert_close, module_pair, random_states  # noqa: E402
from torch_oracle import single_torch_thread  # noqa: E402,F401  (autouse fixture)

F32 = torch.float32
TESTS = os.path.dirname(os.path.abspath(__file__))


class Tagger(nn.Module):
    """An LSTM with a linear head on every step; ``hx`` optional."""

    def __init__(self, lstm):
        super().__init__()
        self.lstm = lstm
        features = (lstm.proj_size or lstm.hidden_size) * (2 if lstm.bidirectional else 1)
        self.head = nn.Linear(features, 3,
                              dtype=lstm.weight_ih_l0.dtype)

    def forward(self, x, h0: Optional[torch.Tensor] = None, c0: Optional[torch.Tensor] = None):
        if h0 is None or c0 is None:
            y, (h_n, c_n) = self.lstm(x)
        else:
            y, (h_n, c_n) = self.lstm(x, (h0, c0))
        return self.head(y), h_n, c_n


def _models(dtype=F32, seed=0, **kwargs):
    """The same :class:`Tagger` with ``lstmcy.torch.LSTM`` and with ``nn.LSTM``."""
    ours, ref = module_pair(4, 6, dtype=dtype, seed=seed, **kwargs)
    ours_model = Tagger(ours).eval()
    ref_model = Tagger(ref).eval()
    ref_model.head.load_state_dict(ours_model.head.state_dict())
    return ours_model, ref_model


# ---------------------------------------------------------------------------
# ONNX
# ---------------------------------------------------------------------------

CONFIGS = [dict(num_layers=1), dict(num_layers=2, bidirectional=True),
           dict(num_layers=2, batch_first=True), dict(num_layers=1, bidirectional=True,
                                                      batch_first=True)]


def _export(model, args, path, dynamo, batch_first, with_states):
    onnx = pytest.importorskip("onnx", reason="ONNX export tests need onnx (pip install onnx)")
    if dynamo:
        pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    names = ["x", "h0", "c0"][:len(args)]
    t_axis, b_axis = (1, 0) if batch_first else (0, 1)
    if dynamo:
        batch, time = torch.export.Dim("batch", min=1), torch.export.Dim("time", min=1)
        shapes = [{b_axis: batch, t_axis: time}] + [{1: batch}] * (len(args) - 1)
        program = torch.onnx.export(model, args, dynamo=True, input_names=names,
                                    output_names=["y", "h_n", "c_n"],
                                    dynamic_shapes=tuple(shapes), verbose=False)
        program.save(path)
    else:
        axes = {"x": {b_axis: "batch", t_axis: "time"}, "y": {b_axis: "batch", t_axis: "time"}}
        if with_states:
            axes.update(h0={1: "batch"}, c0={1: "batch"})
        torch.onnx.export(model, args, path, dynamo=False, input_names=names,
                          output_names=["y", "h_n", "c_n"], dynamic_axes=axes)
    return [node.op_type for node in onnx.load(path).graph.node]


def _run_onnx(path, args):
    ort = pytest.importorskip("onnxruntime",
                              reason="ONNX export tests need onnxruntime (pip install onnxruntime)")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {inp.name: a.numpy() for inp, a in zip(session.get_inputs(), args)}
    return session.run(None, feeds)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("with_states", [False, True], ids=["zeros", "hx"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_onnx_export_equals_nn_lstm_export(tmp_path, config, with_states, dynamo):
    if dynamo and config != CONFIGS[1]:
        pytest.skip("the dynamo exporter is slow (10 s an export): two cases cover it")
    ours, ref = _models(**config)
    batch_first = config.get("batch_first", False)

    def inputs(T, B, seed):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn((B, T, 4) if batch_first else (T, B, 4), generator=gen)
        if not with_states:
            return (x,)
        h0, c0 = random_states(ours.lstm, B, seed=seed, requires_grad=False, dtype=F32)
        return (x, h0, c0)

    example = inputs(5, 3, 0)
    ops = _export(ours, example, str(tmp_path / "ours.onnx"), dynamo, batch_first, with_states)
    ref_ops = _export(ref, example, str(tmp_path / "ref.onnx"), dynamo, batch_first, with_states)
    assert ops == ref_ops
    assert ops.count("LSTM") == config["num_layers"]
    # Other batch and sequence lengths than the exported ones (dynamic axes). The dynamo
    # exporter's translation of aten::lstm fixes the sequence length (nn.LSTM's too).
    for T, B in [(5, 3), (5, 7)] if dynamo else [(5, 3), (9, 2), (2, 7)]:
        args = inputs(T, B, T * 10 + B)
        got = _run_onnx(str(tmp_path / "ours.onnx"), args)
        want = _run_onnx(str(tmp_path / "ref.onnx"), args)
        with torch.no_grad():
            eager = ref(*args)
        for name, a, b, e in zip(("y", "h_n", "c_n"), got, want, eager):
            assert a.shape == tuple(e.shape), (name, a.shape, e.shape)
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(a, e.numpy(), rtol=0, atol=2e-6, err_msg=name)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_onnx_export_of_projection(tmp_path, dynamo):
    """ONNX's LSTM operator has no projection (nn.LSTM's export raises, or with dynamo
    gives a model onnxruntime refuses): a projected LSTM exports as standard operators
    unrolled over the exported sequence length, with a dynamic batch."""
    ours, ref = _models(num_layers=2, bidirectional=True, proj_size=2)
    x, (h0, c0) = torch.randn(5, 3, 4), random_states(ours.lstm, 3, requires_grad=False, dtype=F32)
    ops = _export(ours, (x, h0, c0), str(tmp_path / "p.onnx"), dynamo, False, True)
    assert "LSTM" not in ops and ("MatMul" in ops or "Gemm" in ops), ops
    for B in (3, 6):
        gen = torch.Generator().manual_seed(B)
        args = (torch.randn(5, B, 4, generator=gen),
                *random_states(ours.lstm, B, seed=B, requires_grad=False, dtype=F32))
        got = _run_onnx(str(tmp_path / "p.onnx"), args)
        with torch.no_grad():
            want = ref(*args)
        for name, a, e in zip(("y", "h_n", "c_n"), got, want):
            np.testing.assert_allclose(a, e.numpy(), rtol=0, atol=2e-6, err_msg=name)


def test_onnx_export_leaves_the_module_on_lstmcy(tmp_path):
    """After an export the module computes with lstmcy's kernels again."""
    ours, _ = _models(dtype=torch.float64)
    _export(ours, (torch.randn(5, 3, 4, dtype=torch.float64),), str(tmp_path / "m.onnx"),
            False, False, False)
    assert not torch.onnx.is_in_onnx_export()
    with torch.autograd.profiler.profile() as prof:
        ours.lstm(torch.randn(5, 3, 4, dtype=torch.float64))
    names = {event.name for event in prof.function_events}
    assert not any("aten::lstm" in n for n in names), names


# ---------------------------------------------------------------------------
# TorchScript
# ---------------------------------------------------------------------------

class PackedTagger(nn.Module):
    """An LSTM on a packed batch, unpacked for the head."""

    def __init__(self, lstm):
        super().__init__()
        self.lstm = lstm

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        y, (h_n, c_n) = self.lstm(packed)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(y)
        return out, h_n, c_n


class Unbatched(nn.Module):
    def __init__(self, lstm):
        super().__init__()
        self.lstm = lstm

    def forward(self, x, h0, c0):
        y, (h_n, c_n) = self.lstm(x, (h0, c0))
        return y, h_n, c_n


@pytest.mark.parametrize("config", CONFIGS + [dict(num_layers=2, proj_size=3, bidirectional=True)],
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_script_equals_nn_lstm(config):
    ours, ref = _models(dtype=torch.float64, **config)
    scripted = torch.jit.script(ours)
    assert type(ours.lstm) is LSTM  # scripting leaves the eager model as it was
    batch_first = config.get("batch_first", False)
    x = torch.randn((3, 7, 4) if batch_first else (7, 3, 4), dtype=torch.float64)
    h0, c0 = random_states(ours.lstm, 3, requires_grad=False)
    for args in [(x,), (x, h0, c0)]:
        got, want = scripted(*args), ref(*args)
        for a, b in zip(got, want):
            assert_close(a, b, rtol=1e-12)
    # Packed input, sorted by the module, and unbatched input.
    lengths = torch.tensor([7, 3, 5])
    x_tm = x.transpose(0, 1) if batch_first else x
    got = torch.jit.script(PackedTagger(ours.lstm))(x_tm, lengths)
    want = PackedTagger(ref.lstm)(x_tm, lengths)
    for a, b in zip(got, want):
        assert_close(a, b, rtol=1e-12)
    got = torch.jit.script(Unbatched(ours.lstm))(x_tm[:, 0], h0[:, 0], c0[:, 0])
    want = Unbatched(ref.lstm)(x_tm[:, 0], h0[:, 0], c0[:, 0])
    for a, b in zip(got, want):
        assert_close(a, b, rtol=1e-12)


def test_script_is_trainable_and_eager_model_unchanged():
    """Gradients flow through the scripted module to the shared parameters; the eager
    model keeps computing with lstmcy."""
    ours, ref = _models(dtype=torch.float64, num_layers=2)
    scripted = torch.jit.script(ours)
    ours.train(), ref.train(), scripted.train()
    x = torch.randn(6, 2, 4, dtype=torch.float64)
    scripted(x)[0].sum().backward()
    ref(x)[0].sum().backward()
    for (name, a), b in zip(ours.named_parameters(), ref.parameters()):
        assert_close(a.grad, b.grad, what=name)
    for a, b in zip(ours(x), ref(x)):
        assert_close(a, b)


LOAD_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    model = torch.jit.load(sys.argv[1])
    x, h0, c0 = torch.load(sys.argv[2])
    y, h_n, c_n = model(x, h0, c0)
    torch.save([y, h_n, c_n], sys.argv[3])
    print("lstmcy" in sys.modules)
""")


def test_script_save_load_in_fresh_process(tmp_path):
    """A scripted model loads and runs without lstmcy (nothing of it is imported)."""
    ours, ref = _models(dtype=torch.float64, num_layers=2, bidirectional=True)
    torch.jit.save(torch.jit.script(ours), str(tmp_path / "model.pt"))
    x = torch.randn(8, 3, 4, dtype=torch.float64)
    h0, c0 = random_states(ours.lstm, 3, requires_grad=False)
    torch.save([x, h0, c0], str(tmp_path / "inputs.pt"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(tmp_path / "model.pt"),
                             str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
                            capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    got = torch.load(str(tmp_path / "out.pt"))
    for a, b in zip(got, ref(x, h0, c0)):
        assert_close(a, b, rtol=1e-12)
