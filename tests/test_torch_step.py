"""One-step inference of ``lstmcy.torch.LSTMCell`` and ``lstmcy.torch.LSTM`` (T = 1) on the
step kernel objects (:mod:`lstmcy.torch._step`).

Such a step must give bitwise the module's other routes' results (the eager route with
gradients, the operator route), in new memory, and leave every call it does not take to
the full path: its results, its errors.
"""
import copy
import io
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lstmcy.torch as lt  # noqa: E402
from lstmcy._engine.plan import _thread_plan  # noqa: E402

SIZES = [(1, 16, 32), (3, 5, 7), (8, 3, 40)]


def _kernel_runs():
    """Number of step kernel objects of this thread's plan (each made on first use)."""
    return len(_thread_plan()._step_kernels)


@pytest.mark.parametrize("B, I, H", SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_cell_inference_step_is_the_autograd_steps(B, I, H, dtype, bias):
    torch.manual_seed(0)
    cell = lt.LSTMCell(I, H, bias=bias, dtype=dtype)
    x = torch.randn(B, I, dtype=dtype)
    hx = (torch.randn(B, H, dtype=dtype), torch.randn(B, H, dtype=dtype))
    h_ref, c_ref = cell(x, hx)  # with grad: the autograd node
    assert h_ref.requires_grad
    for state in (hx, None):
        with torch.no_grad():
            h1, c1 = cell(x, state)
        if state is None:
            h_ref, c_ref = cell(x)
        assert not h1.requires_grad and h1.dtype == dtype and h1.shape == (B, H)
        assert torch.equal(h1, h_ref.detach()) and torch.equal(c1, c_ref.detach())
    h_ref, c_ref = cell(x, hx)
    with torch.inference_mode():
        h2, c2 = cell(x, hx)
    assert torch.equal(h2, h_ref.detach()) and torch.equal(c2, c_ref.detach())
    ref = torch.nn.LSTMCell(I, H, bias=bias, dtype=dtype)
    ref.load_state_dict(cell.state_dict())
    with torch.no_grad():
        h3, c3 = cell(x, hx)
        hr, cr = ref(x, hx)
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    assert torch.allclose(h3, hr, atol=tol, rtol=0) and torch.allclose(c3, cr, atol=tol, rtol=0)


@pytest.mark.parametrize("B, I, H", SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch_first", [False, True])
def test_lstm_one_step_inference_is_the_operator_route(B, I, H, dtype, batch_first):
    torch.manual_seed(1)
    lstm = lt.LSTM(I, H, batch_first=batch_first, dtype=dtype)
    x = torch.randn((B, 1, I) if batch_first else (1, B, I), dtype=dtype)
    hx = (torch.randn(1, B, H, dtype=dtype), torch.randn(1, B, H, dtype=dtype))
    for state in (hx, None):
        with torch.no_grad():
            y, (h_n, c_n) = lstm(x, state)
            with lt.force_route("operator"):
                y_ref, (h_ref, c_ref) = lstm(x, state)
        assert y.shape == y_ref.shape and h_n.shape == h_ref.shape == (1, B, H)
        assert torch.equal(y, y_ref) and torch.equal(h_n, h_ref) and torch.equal(c_n, c_ref)
        assert y.data_ptr() != h_n.data_ptr()  # two tensors, as aten::lstm's
    ref = torch.nn.LSTM(I, H, batch_first=batch_first, dtype=dtype)
    ref.load_state_dict(lstm.state_dict())
    with torch.no_grad():
        y, (h_n, c_n) = lstm(x, hx)
        y_ref, (h_ref, c_ref) = ref(x, hx)
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    assert torch.allclose(y, y_ref, atol=tol, rtol=0)
    assert torch.allclose(c_n, c_ref, atol=tol, rtol=0)


def test_one_step_inference_runs_on_the_step_kernel():
    """The steps above are the step kernel's (not the full path's): the thread's plan made
    one kernel object for their shape."""
    B, I, H = 2, 9, 11
    before = _kernel_runs()
    with torch.no_grad():
        lt.LSTMCell(I, H)(torch.randn(B, I))
    assert _kernel_runs() == before + 1
    with torch.no_grad():
        lt.LSTM(I, H)(torch.randn(1, B, I))  # the same shape: the same object
    assert _kernel_runs() == before + 1


def test_one_step_inference_reads_weights_changed_in_place():
    torch.manual_seed(2)
    lstm, cell = lt.LSTM(4, 6), lt.LSTMCell(4, 6)
    x = torch.randn(1, 2, 4)
    with torch.no_grad():
        lstm(x), cell(x[0])
        for p in list(lstm.parameters()) + list(cell.parameters()):
            p.mul_(0.5)
        y, (h_n, c_n) = lstm(x)
        h1, c1 = cell(x[0])
        with lt.force_route("operator"):
            y_ref, _ = lstm(x)
    assert torch.equal(y, y_ref)
    h_ref, c_ref = cell(x[0])
    assert torch.equal(h1, h_ref.detach()) and torch.equal(c1, c_ref.detach())
    # Parameters replaced by .double(): new views.
    lstm.double()
    with torch.no_grad():
        y, _ = lstm(x.double())
        with lt.force_route("operator"):
            y_ref, _ = lstm(x.double())
    assert y.dtype == torch.float64 and torch.equal(y, y_ref)


@pytest.mark.parametrize("case", ["bidirectional", "two layers", "projection", "two steps",
                                  "float16", "unbatched", "requires-grad state",
                                  "strided input", "big"])
def test_other_calls_take_the_full_path(case):
    """Calls the step kernel does not take give the full path's results."""
    torch.manual_seed(3)
    kwargs, T, B, I, H = {}, 1, 2, 5, 7
    dtype = torch.float32
    if case == "bidirectional":
        kwargs["bidirectional"] = True
    elif case == "two layers":
        kwargs["num_layers"] = 2
    elif case == "projection":
        kwargs["proj_size"] = 3
    elif case == "two steps":
        T = 2
    elif case == "float16":
        dtype = torch.float16
    elif case == "big":
        B, I, H = 64, 128, 256
    lstm = lt.LSTM(I, H, **kwargs).to(dtype)
    x = torch.randn(T, B, I).to(dtype)
    if case == "unbatched":
        x = x[:, 0]
    if case == "strided input":
        x = torch.randn(1, B, 2 * I)[:, :, ::2]
    state = None
    if case == "requires-grad state":
        state = (torch.randn(1, B, H, requires_grad=True), torch.randn(1, B, H))
    before = _kernel_runs()
    with torch.no_grad():
        y, (h_n, c_n) = lstm(x, state)
        with lt.force_route("operator"):
            y_ref, (h_ref, c_ref) = lstm(x, state)
    assert torch.equal(y, y_ref) and torch.equal(h_n, h_ref) and torch.equal(c_n, c_ref)
    if case in ("bidirectional", "two layers", "projection", "two steps", "float16",
                "unbatched", "big"):
        assert _kernel_runs() == before


def _one_step_training(lstm, x, hx, grads_out, inputs):
    """Outputs and every gradient of one step of ``lstm`` (``grads_out``: the outputs'
    gradients, None for an output the loss does not use)."""
    y, (h_n, c_n) = lstm(x, hx)
    outputs = [(o, g) for o, g in zip((y, h_n, c_n), grads_out) if g is not None]
    grads = torch.autograd.grad([o for o, _ in outputs], inputs, [g for _, g in outputs])
    return (y, h_n, c_n) + grads


@pytest.mark.parametrize("B, I, H", SIZES + [(64, 16, 32), (512, 16, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_lstm_one_step_training_is_the_eager_route(B, I, H, dtype, batch_first, bias):
    """A one-step call with gradients runs as one autograd node, with the eager route's
    values and gradients, bitwise (B = 64: its backward on the layer call; B = 512: its
    forward too)."""
    torch.manual_seed(4)
    lstm = lt.LSTM(I, H, bias=bias, batch_first=batch_first, dtype=dtype)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn((B, 1, I) if batch_first else (1, B, I), generator=gen, dtype=dtype,
                    requires_grad=True)
    hx = tuple(torch.randn(1, B, H, generator=gen, dtype=dtype, requires_grad=True)
               for _ in range(2))
    dy = torch.randn(x.shape[:2] + (H,), generator=gen, dtype=dtype)
    dh, dc = (torch.randn(1, B, H, generator=gen, dtype=dtype) for _ in range(2))
    for state in (hx, None):
        inputs = [x] + (list(hx) if state else []) + list(lstm.parameters())
        for grads_out in ((dy, dh, dc), (dy, None, None), (None, dh, None), (None, None, dc)):
            ours = _one_step_training(lstm, x, state, grads_out, inputs)
            with lt.force_route("eager"):
                full = _one_step_training(lstm, x, state, grads_out, inputs)
            for a, b in zip(ours, full):
                assert a.shape == b.shape and torch.equal(a, b)
    y, (h_n, c_n) = lstm(x, hx)
    # One node, whose outputs are the call's three tensors.
    assert type(h_n.grad_fn).__name__ == ("_BatchFirstStepBackward" if batch_first
                                          else "_SequenceStepBackward")
    assert y.grad_fn is h_n.grad_fn is c_n.grad_fn
    assert y.shape == x.shape[:2] + (H,) and h_n.shape == c_n.shape == (1, B, H)
    assert y.data_ptr() != h_n.data_ptr()  # two tensors, as aten::lstm's
    with torch.no_grad():
        y.mul_(2)
    assert not torch.equal(y.reshape(B, H), h_n[0])
    if dtype == torch.float64:  # nn.LSTM's values and gradients
        ref = torch.nn.LSTM(I, H, bias=bias, batch_first=batch_first, dtype=dtype)
        ref.load_state_dict(lstm.state_dict())
        inputs = [x, *hx]
        ours = _one_step_training(lstm, x, hx, (dy, dh, dc), inputs + list(lstm.parameters()))
        theirs = _one_step_training(ref, x, hx, (dy, dh, dc), inputs + list(ref.parameters()))
        for a, b in zip(ours, theirs):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_lstm_one_step_training_leaves_per_sample_gradients_to_the_full_path():
    """ExpandedWeights' per-sample gradients of one step: those of each sample's own call."""
    from torch.nn.utils._per_sample_grad import call_for_per_sample_grads
    torch.manual_seed(6)
    lstm = lt.LSTM(3, 4, dtype=torch.float64)
    x = torch.randn(1, 5, 3, dtype=torch.float64)
    out, _ = call_for_per_sample_grads(lstm, batch_size=5, loss_reduction="sum",
                                      batch_first=False)(x)
    out.sum().backward()
    for k in range(5):
        expected = torch.autograd.grad(lstm(x[:, k:k + 1])[0].sum(), lstm.weight_hh_l0)[0]
        assert torch.allclose(lstm.weight_hh_l0.grad_sample[k], expected, rtol=1e-12)


@pytest.mark.parametrize("case", ["input size", "state batch", "state dtype", "hx length"])
def test_one_step_errors_are_the_full_paths(case):
    """A one-step call that is wrong raises the full path's error (nn.LSTM raises too)."""
    lstm = lt.LSTM(5, 7)
    ref = torch.nn.LSTM(5, 7)
    x, hx = torch.randn(1, 2, 5), (torch.randn(1, 2, 7), torch.randn(1, 2, 7))
    if case == "input size":
        x = torch.randn(1, 2, 4)
    elif case == "state batch":
        hx = (torch.randn(1, 3, 7), torch.randn(1, 3, 7))
    elif case == "state dtype":
        hx = (hx[0].double(), hx[1])
    elif case == "hx length":
        hx = (hx[0],)
    with torch.no_grad():
        with pytest.raises(Exception) as ours:
            lstm(x, hx)
        with pytest.raises(Exception) as full, lt.force_route("operator"):
            lstm(x, hx)
        with pytest.raises(Exception):
            ref(x, hx)  # nn.LSTM refuses it too
    assert type(ours.value) is type(full.value) and str(ours.value) == str(full.value)


def test_copies_do_not_share_the_weight_views():
    lstm = lt.LSTM(3, 4)
    x = torch.randn(1, 2, 3)
    with torch.no_grad():
        lstm(x)
        twin = copy.deepcopy(lstm)
        for p in twin.parameters():
            p.zero_()
        y_twin, _ = twin(x)
        y, _ = lstm(x)
        with lt.force_route("operator"):
            y_ref, _ = lstm(x)
    assert torch.equal(y, y_ref) and not torch.equal(y, y_twin)
    restored = pickle.loads(pickle.dumps(lstm))
    buffer = io.BytesIO()
    torch.save(lstm.state_dict(), buffer)
    with torch.no_grad():
        assert torch.equal(restored(x)[0], y)
    assert np.isfinite(y.numpy()).all()


@pytest.mark.parametrize("case", ["three states", "one state", "state size", "input size",
                                  "state dtype", "scalar input", "3-D input"])
def test_cell_inference_errors_are_the_full_paths(case):
    """A wrong call under no_grad raises what it raises with gradients on (the full
    path, nn.LSTMCell's checks)."""
    cell = lt.LSTMCell(5, 7)
    x, hx = torch.randn(2, 5), (torch.randn(2, 7), torch.randn(2, 7))
    if case == "three states":
        hx = (hx[0], hx[1], hx[1])
    elif case == "one state":
        hx = (hx[0],)
    elif case == "state size":
        hx = (torch.randn(2, 6), torch.randn(2, 6))
    elif case == "input size":
        x = torch.randn(2, 4)
    elif case == "state dtype":
        hx = (hx[0].double(), hx[1])
    elif case == "scalar input":
        x = torch.tensor(1.0)
    elif case == "3-D input":
        x = torch.randn(1, 2, 5)
    with pytest.raises(Exception) as full:
        cell(x, hx)
    with torch.no_grad(), pytest.raises(Exception) as ours:
        cell(x, hx)
    with pytest.raises(Exception) as theirs:
        torch.nn.LSTMCell(5, 7)(x, hx)
    assert type(ours.value) is type(full.value) and str(ours.value) == str(full.value)
    assert isinstance(ours.value, type(theirs.value))
