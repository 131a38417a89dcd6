"""Per-sample gradients of lstmcy.torch.LSTM (differentially private training).

Each sequence's weight gradients, computed from the kernels' gate gradients, must equal
the gradients of ``torch.nn.LSTM`` run on that sequence alone (float64, same weights):
through PyTorch's ExpandedWeights (``call_for_per_sample_grads``) for every configuration
the module supports, padded and packed, and through Opacus's ``GradSampleModule`` hooks.
Their norms, which Opacus's ghost clipping asks for instead, must equal the loop's too.
``make_private`` must train with them (hooks, ExpandedWeights and ghost clipping):
without noise and clipping its update is the plain gradient; with clipping, the mean of
the per-sample loop's gradients each clipped to the norm.
"""
import subprocess
import sys
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn.utils._per_sample_grad import call_for_per_sample_grads  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

from lstmcy.torch import LSTM, _per_sample, _privacy  # noqa: E402
from torch_oracle import assert_close, module_pair, random_states  # noqa: E402
from torch_oracle import single_torch_thread  # noqa: E402,F401  (autouse fixture)

F64 = torch.float64
T, B, I, H = 7, 4, 3, 5
LENGTHS = torch.tensor([7, 3, 5, 2])


def _loop_gradients(ref, x, hx, lengths, batch_first, loss_of):
    """Each sequence's parameter gradients from ``nn.LSTM`` run on it alone."""
    grads = []
    for b in range(x.shape[0 if batch_first else 1]):
        n = int(lengths[b])
        xb = x[b:b + 1, :n] if batch_first else x[:n, b:b + 1]
        hxb = None if hx is None else (hx[0][:, b:b + 1], hx[1][:, b:b + 1])
        y, (h_n, c_n) = ref(xb, hxb)
        grads.append(torch.autograd.grad(loss_of(y, h_n, c_n, b), list(ref.parameters())))
    return [torch.stack(g) for g in zip(*grads)]


def _weights_for_loss(ours, seed=5):
    gen = torch.Generator().manual_seed(seed)
    D = 2 if ours.bidirectional else 1
    out = ours.proj_size or ours.hidden_size
    wy = torch.randn(B, T, D * out, generator=gen, dtype=F64)  # batch-major, padded
    wh = torch.randn(ours.num_layers * D, B, out, generator=gen, dtype=F64)
    return wy, wh


CONFIGS = [dict(), dict(num_layers=2), dict(bidirectional=True), dict(batch_first=True),
           dict(num_layers=2, bidirectional=True, batch_first=True), dict(proj_size=2),
           dict(num_layers=2, bidirectional=True, proj_size=3), dict(bias=False)]


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("with_states", [False, True], ids=["zeros", "hx"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()) or "plain")
def test_expanded_weights_equal_per_sample_loop(config, packed, with_states, reduction):
    ours, ref = module_pair(I, H, **config)
    batch_first = config.get("batch_first", False)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn((B, T, I) if batch_first else (T, B, I), generator=gen, dtype=F64)
    hx = random_states(ours, B, requires_grad=False) if with_states else None
    lengths = LENGTHS if packed else torch.full((B,), T)
    wy, wh = _weights_for_loss(ours)

    def loss_of(y, h_n, c_n, b):  # sequence b's loss: a random linear function of y and h_n
        y_b = y.transpose(0, 1) if not batch_first else y
        return (y_b * wy[b:b + 1, :y_b.shape[1]]).sum() + (h_n * wh[:, b:b + 1]).sum()

    if packed:
        args = (pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False),)
    else:
        args = (x,)
    if with_states:
        args += (hx,)
    y, (h_n, _) = call_for_per_sample_grads(ours, batch_size=B, loss_reduction=reduction,
                                            batch_first=batch_first)(*args)
    if packed:
        y, _ = pad_packed_sequence(y, batch_first=True, total_length=T)
    elif not batch_first:
        y = y.transpose(0, 1)
    losses = (y * wy).sum((1, 2)) + (h_n * wh).sum((0, 2))
    (losses.mean() if reduction == "mean" else losses.sum()).backward()
    want = _loop_gradients(ref, x, hx, lengths, batch_first, loss_of)
    for (name, param), expected in zip(ours.named_parameters(), want):
        assert param.grad is None, name  # as ExpandedWeights' own layers: grad_sample only
        assert_close(param.grad_sample, expected, what=name)


class _Recorder(_privacy.PerSample):
    """A forward's per-sample results, kept as the backward hands them over."""

    def deliver(self, per_sample, hook_follows=True):
        if self.unsorted_indices is not None:
            per_sample = [g[self.unsorted_indices] for g in per_sample]
        self.got = per_sample


@pytest.mark.parametrize("method", ["gram", "formed"])
@pytest.mark.parametrize("with_states", [False, True], ids=["zeros", "hx"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()) or "plain")
def test_per_sample_norms_equal_per_sample_loop(config, packed, with_states, method,
                                                monkeypatch):
    """The norms ghost clipping asks for, from Gram matrices or from the per-sample
    gradients formed a few at a time: those of the loop's gradients, per weight. Then a
    second backward with Opacus's hooks disabled, of the losses reweighted per sequence
    (ghost clipping's), formed from the first's gate gradients: the reweighted sum of
    the loop's gradients, and of the input's and states' gradients."""
    monkeypatch.setattr(_per_sample, "_use_gram", lambda T, G, F: method == "gram")
    monkeypatch.setattr(_per_sample, "_CHUNK_BYTES", 1)  # one sequence at a time
    formed = []
    weighted_sums = _per_sample.weighted_sums
    monkeypatch.setattr(_per_sample, "weighted_sums",
                        lambda *args: formed.append(1) or weighted_sums(*args))
    ours, ref = module_pair(I, H, **config)
    batch_first = config.get("batch_first", False)
    x = torch.randn((B, T, I) if batch_first else (T, B, I),
                    generator=torch.Generator().manual_seed(1), dtype=F64, requires_grad=True)
    hx = random_states(ours, B, requires_grad=True) if with_states else None
    lengths = LENGTHS if packed else torch.full((B,), T)
    wy, wh = _weights_for_loss(ours)
    recorder = {}

    def recording(module, weights, input):
        recorder["sink"] = _Recorder(list(weights), None, 2.0, norms=True)
        return recorder["sink"]

    monkeypatch.setattr(_privacy, "per_sample_mode", recording)
    args = (pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
            if packed else x,) + ((hx,) if with_states else ())
    y, (h_n, _) = ours(*args)
    if packed:
        y, _ = pad_packed_sequence(y, batch_first=True, total_length=T)
    elif not batch_first:
        y = y.transpose(0, 1)
    losses = (y * wy).sum((1, 2)) + (h_n * wh).sum((0, 2))
    losses.sum().backward(retain_graph=True)

    def loss_of(y, h_n, c_n, b):
        y_b = y.transpose(0, 1) if not batch_first else y
        return (y_b * wy[b:b + 1, :y_b.shape[1]]).sum() + (h_n * wh[:, b:b + 1]).sum()

    want = _loop_gradients(ref, x.detach(), None if hx is None else [h.detach() for h in hx],
                           lengths, batch_first, loss_of)
    got = recorder["sink"].got
    assert len(got) == len(want)
    for (name, param), norms, expected in zip(ours.named_parameters(), got, want):
        assert param.grad is None, name  # the norms only: no summed gradient
        assert_close(norms, 2.0 * expected.flatten(1).norm(dim=1), what=name)

    # The second backward, as Opacus's hooks being disabled makes it.
    recorder["sink"].owner = type("Hooks", (), {"hooks_enabled": False})()
    inputs = [x] + ([] if hx is None else list(hx))
    for tensor in inputs:
        tensor.grad = None
    factors = torch.tensor([0.5, 0.0, 3.0, 1.25], dtype=F64)
    (factors * losses).sum().backward()
    assert formed == [1]
    for (name, param), expected in zip(ours.named_parameters(), want):
        assert_close(param.grad, (factors.view(-1, *[1] * (expected.dim() - 1)) * expected).sum(0),
                     what=name)
    # The input's and the states' gradients: nn.LSTM's of the reweighted loss.
    ref_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    ref_args = (pack_padded_sequence(ref_inputs[0], lengths, batch_first=batch_first,
                                     enforce_sorted=False) if packed else ref_inputs[0],)
    if with_states:
        ref_args += (tuple(ref_inputs[1:]),)
    y_ref, (h_ref, _) = ref(*ref_args)
    if packed:
        y_ref, _ = pad_packed_sequence(y_ref, batch_first=True, total_length=T)
    elif not batch_first:
        y_ref = y_ref.transpose(0, 1)
    (factors * ((y_ref * wy).sum((1, 2)) + (h_ref * wh).sum((0, 2)))).sum().backward()
    for ours_input, ref_input in zip(inputs, ref_inputs):
        assert_close(ours_input.grad, ref_input.grad, what="input/state gradient")


def test_expanded_weights_with_dropout_sum_to_the_batch_gradient():
    """Dropout masks are drawn per batch as nn.LSTM draws them: the per-sample gradients
    add up to nn.LSTM's batch gradient under the same seed."""
    ours, ref = module_pair(I, H, num_layers=3, dropout=0.4, bidirectional=True)
    x = torch.randn(T, B, I, dtype=F64)
    torch.manual_seed(11)
    y, _ = call_for_per_sample_grads(ours, batch_size=B, loss_reduction="sum",
                                     batch_first=False)(x)
    (y ** 2).sum().backward()
    torch.manual_seed(11)
    y_ref, _ = ref(x)
    assert_close(y, y_ref)
    want = torch.autograd.grad((y_ref ** 2).sum(), list(ref.parameters()))
    for (name, param), expected in zip(ours.named_parameters(), want):
        assert param.grad_sample.shape == (B,) + param.shape, name
        assert_close(param.grad_sample.sum(0), expected, what=name)


def test_per_sample_gradients_under_create_graph():
    """A backward with ``create_graph=True`` (an input that needs a gradient, as under a
    gradient penalty): ExpandedWeights and Opacus's hooks give the per-sample gradients of
    the plain backward."""
    opacus = _opacus()
    x = torch.randn(T, B, I, dtype=F64)
    got = []
    for create_graph in (False, True):
        ours, _ = module_pair(I, H, num_layers=2)
        xx = x.clone().requires_grad_(True)
        y, _ = call_for_per_sample_grads(ours, batch_size=B, loss_reduction="sum",
                                         batch_first=False)(xx)
        (y ** 2).sum().backward(create_graph=create_graph)
        got.append([p.grad_sample.detach() for p in ours.parameters()])
    for plain, graphed in zip(*got):
        assert_close(graphed, plain)
    got = []
    for create_graph in (False, True):
        model, _ = _classifiers("output", True)
        wrapped = opacus.GradSampleModule(model, loss_reduction="sum")
        data, target = _data()
        loss = nn.functional.cross_entropy(wrapped(data), target, reduction="sum")
        loss.backward(create_graph=create_graph)
        got.append([p.grad_sample.detach() for p in model.lstm.parameters()])
    for plain, graphed in zip(*got):
        assert_close(graphed, plain)


def test_expanded_weights_float32():
    ours, ref = module_pair(I, H, dtype=torch.float32, num_layers=2)
    x = torch.randn(T, B, I)
    y, _ = call_for_per_sample_grads(ours, batch_first=False)(x)
    y.sum().backward()
    want = _loop_gradients(ref, x, None, torch.full((B,), T), False,
                           lambda y, h, c, b: y.sum())
    for (name, param), expected in zip(ours.named_parameters(), want):
        assert param.grad_sample.dtype == torch.float32
        assert_close(param.grad_sample, expected, rtol=1e-5, what=name)


# ---------------------------------------------------------------------------
# Opacus
# ---------------------------------------------------------------------------

def _opacus():
    return pytest.importorskip("opacus", reason="the Opacus tests need opacus "
                               "(pip install opacus, or lstmcy's [privacy] extra)")


class Classifier(nn.Module):
    """An LSTM classifier over the last output, or over ``h_n`` (``output`` unused), with
    an optional embedding before it (an LSTM input that needs a gradient)."""

    def __init__(self, lstm, head="output", embed=False):
        super().__init__()
        self.embed = nn.Linear(I, I, dtype=F64) if embed else None
        self.lstm = lstm
        D = 2 if lstm.bidirectional else 1
        out = lstm.proj_size or lstm.hidden_size
        self.fc = nn.Linear(out if head == "h_n" else D * out, 2, dtype=F64)
        self.head = head

    def forward(self, x):
        if self.embed is not None:
            x = torch.tanh(self.embed(x))
        y, (h_n, _) = self.lstm(x)
        return self.fc(h_n[-1] if self.head == "h_n" else y[:, -1])


def _classifiers(head, embed, **kwargs):
    ours, ref = module_pair(I, H, batch_first=True, **kwargs)
    torch.manual_seed(3)
    model = Classifier(ours, head, embed)
    reference = Classifier(ref, head, embed)
    reference.load_state_dict(model.state_dict())
    return model, reference


def _data(n=B, seed=2):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, T, I, generator=gen, dtype=F64), torch.randint(0, 2, (n,), generator=gen)


def _loop_model_gradients(reference, x, target):
    """Each sample's gradients of the whole reference model (its loss alone)."""
    grads = [torch.autograd.grad(nn.functional.cross_entropy(reference(x[b:b + 1]), target[b:b + 1]),
                                 list(reference.parameters())) for b in range(x.shape[0])]
    return [torch.stack(g) for g in zip(*grads)]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("head,embed", [("output", False), ("h_n", False), ("h_n", True),
                                        ("output", True)])
def test_opacus_hooks_equal_per_sample_loop(head, embed, reduction):
    """Opacus's hook fires before the module's backward (input without gradient), after
    it (an embedding before the LSTM), or not at all (``output`` unused): the
    grad_sample of every parameter is the per-sample loop's."""
    opacus = _opacus()
    model, reference = _classifiers(head, embed, num_layers=2)
    wrapped = opacus.GradSampleModule(model, loss_reduction=reduction)
    x, target = _data()
    loss = nn.functional.cross_entropy(wrapped(x), target, reduction=reduction)
    loss.backward()
    want = _loop_model_gradients(reference, x, target)
    for (name, param), expected in zip(model.named_parameters(), want):
        assert_close(param.grad_sample, expected, what=name)
    # Twice more: nothing is left over from the previous step.
    for _ in range(2):
        wrapped.zero_grad(set_to_none=True)
        for p in model.parameters():
            p.grad_sample = None
        nn.functional.cross_entropy(wrapped(x), target, reduction=reduction).backward()
    for (name, param), expected in zip(model.named_parameters(), want):
        assert_close(param.grad_sample, expected, what=name)


@pytest.mark.parametrize("head", ["output", "h_n"])
def test_opacus_hooks_on_one_step_calls(head):
    """A one-layer LSTM called on one time step (which plain training runs as the cell's
    autograd node) still gives Opacus every sample's gradients."""
    opacus = _opacus()
    model, reference = _classifiers(head, False)
    wrapped = opacus.GradSampleModule(model, loss_reduction="sum")
    x, target = _data()
    x = x[:, :1]
    nn.functional.cross_entropy(wrapped(x), target, reduction="sum").backward()
    want = _loop_model_gradients(reference, x, target)
    for (name, param), expected in zip(model.named_parameters(), want):
        assert_close(param.grad_sample, expected, what=name)


class TwoCalls(nn.Module):
    """One LSTM called on both halves of the sequence: each on its own (``fed`` False) or
    the second on its half plus the first's last output (its input then needs a
    gradient: Opacus's hook runs after that call's backward); the head reads the sum of
    both calls' outputs (``head="output"``) or of their ``h_n``."""

    def __init__(self, lstm, head, embed, fed):
        super().__init__()
        self.embed = nn.Linear(I, I, dtype=F64) if embed else None
        self.lstm = lstm
        self.fc = nn.Linear(H, 2, dtype=F64)
        self.head, self.fed = head, fed

    def forward(self, x):
        if self.embed is not None:
            x = torch.tanh(self.embed(x))
        y1, (h1, _) = self.lstm(x[:, :3])
        x2 = x[:, 3:] + y1[:, -1:, :I] if self.fed else x[:, 3:]
        y2, (h2, _) = self.lstm(x2)
        if self.head == "output":
            return self.fc(y1[:, -1] + y2[:, -1])
        return self.fc(h1[-1] + h2[-1])


@pytest.mark.parametrize("fed", [False, True], ids=["apart", "fed"])
@pytest.mark.parametrize("head,embed", [("output", False), ("h_n", False), ("h_n", True)])
def test_opacus_hooks_on_a_module_called_twice(head, embed, fed):
    """A module called twice in one forward (Opacus adds both calls' per-sample
    gradients, then moves them to ``grad_sample``), with Opacus's hook before each
    backward, after it, or called by it: every ``grad_sample`` is the per-sample loop's,
    also over two steps accumulated without an optimizer step (a list of two)."""
    opacus = _opacus()
    ours, ref = module_pair(I, H, batch_first=True)
    torch.manual_seed(5)
    model = TwoCalls(ours, head, embed, fed)
    reference = TwoCalls(ref, head, embed, fed)
    reference.load_state_dict(model.state_dict())
    wrapped = opacus.GradSampleModule(model, loss_reduction="sum")
    x, target = _data()
    want = _loop_model_gradients(reference, x, target)
    for step in range(2):
        nn.functional.cross_entropy(wrapped(x), target, reduction="sum").backward()
    for (name, param), expected in zip(model.named_parameters(), want):
        assert isinstance(param.grad_sample, list) and len(param.grad_sample) == 2, name
        for stored in param.grad_sample:
            assert_close(stored, expected, what=name)


@pytest.mark.parametrize("embed", [False, True])
def test_opacus_hooks_on_a_second_call_on_fewer_sequences(embed):
    """A second call on the batch's first sequences only: its per-sample gradients add to
    those rows (as Opacus adds a call's), so each ``grad_sample`` still sums to the
    batch's gradient."""
    opacus = _opacus()

    class FewerSecond(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(I, I, dtype=F64) if embed else None
            self.lstm = LSTM(I, H, batch_first=True, dtype=F64)
            self.fc = nn.Linear(H, 2, dtype=F64)

        def forward(self, x):
            if self.embed is not None:
                x = torch.tanh(self.embed(x))
            y1, _ = self.lstm(x)
            y2, _ = self.lstm(x[:2])
            last = y1[:, -1] + nn.functional.pad(y2[:, -1], (0, 0, 0, x.shape[0] - 2))
            return self.fc(last)

    torch.manual_seed(6)
    model = FewerSecond()
    wrapped = opacus.GradSampleModule(model, loss_reduction="sum")
    x, target = _data()
    nn.functional.cross_entropy(wrapped(x), target, reduction="sum").backward()
    for name, param in model.lstm.named_parameters():
        assert param.grad_sample.shape == (B,) + param.shape, name
        assert_close(param.grad_sample.sum(0), param.grad, what=name)


def _made_private(model, x, target, mode, max_grad_norm):
    """``make_private`` of ``model`` for SGD (lr 1, no noise) on one batch of ``x``:
    ``(module, optimizer, criterion, loader)``; ghost mode's criterion is Opacus's, whose
    backward runs both passes."""
    opacus = _opacus()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, target),
                                         batch_size=len(x))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus's warnings about secure RNG and accounting
        made = opacus.PrivacyEngine().make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=0.0,
            max_grad_norm=max_grad_norm, poisson_sampling=False, grad_sample_mode=mode,
            criterion=nn.CrossEntropyLoss())
    criterion = made[2] if mode == "ghost" else nn.CrossEntropyLoss()
    return made[0], made[1], criterion, made[-1]


@pytest.mark.parametrize("max_grad_norm", [1e6, 0.05], ids=["unclipped", "clipped"])
@pytest.mark.parametrize("mode", ["hooks", "ew", "ghost"])
def test_make_private_step_is_the_clipped_mean(mode, max_grad_norm):
    """One DP-SGD step without noise: Opacus's update is the mean of the per-sample
    gradients (the loop's), each clipped to ``max_grad_norm`` (all parameters together)."""
    model, reference = _classifiers("h_n", False, num_layers=2, bidirectional=True)
    x, target = _data(8)
    private, optimizer, criterion, loader = _made_private(model, x, target, mode,
                                                          max_grad_norm)
    before = [p.detach().clone() for p in model.parameters()]
    for xb, yb in loader:
        optimizer.zero_grad()
        criterion(private(xb), yb).backward()
        optimizer.step()
    per_sample = _loop_model_gradients(reference, x, target)
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in per_sample]).norm(dim=0)
    factor = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
    for (name, param), old, grads in zip(model.named_parameters(), before, per_sample):
        step = (grads * factor.view(-1, *[1] * (grads.dim() - 1))).sum(0) / len(x)
        assert_close(old - param.detach(), step, rtol=1e-9, what=name)
    if max_grad_norm < 1:
        assert (factor < 1).all()  # the clipping was exercised


@pytest.mark.parametrize("head", ["output", "h_n"])
@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_make_private_step_on_an_empty_batch(mode, head):
    """Poisson sampling draws empty batches now and then: a DP-SGD step on one runs as it
    does for Opacus's own layers (per-sample gradients of no rows; no noise here, so the
    parameters stay as they are), then a step on a full batch."""
    model, _ = _classifiers(head, False, num_layers=2, bidirectional=True)
    x, target = _data(8)
    private, optimizer, criterion, _ = _made_private(model, x, target, mode, 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad()
    criterion(private(x[:0]), target[:0]).backward()
    optimizer.step()
    for (name, param), old in zip(model.named_parameters(), before):
        assert torch.equal(param.detach(), old), name
    optimizer.zero_grad()
    criterion(private(x), target).backward()
    optimizer.step()
    assert any(not torch.equal(p.detach(), old) for p, old in zip(model.parameters(), before))


GHOST_CONFIGS = [dict(num_layers=2, bidirectional=True), dict(proj_size=3),
                 dict(num_layers=2, proj_size=2, bias=False)]


@pytest.mark.parametrize("config", GHOST_CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("head,embed", [("output", False), ("h_n", False), ("output", True)])
def test_opacus_ghost_norms_equal_per_sample_loop(head, embed, config):
    """Ghost clipping (GradSampleModuleFastGradientClipping): every parameter's per-sample
    norm, and the whole model's, are those of the loop's gradients, whether Opacus's hook
    runs before the module's backward or after it (an embedding before the LSTM)."""
    opacus = _opacus()
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    model, reference = _classifiers(head, embed, **config)
    wrapped = GradSampleModuleFastGradientClipping(model, max_grad_norm=1.0,
                                                   use_ghost_clipping=True)
    x, target = _data()
    want = _loop_model_gradients(reference, x, target)
    for _ in range(2):  # nothing is left over from the previous step
        loss = nn.functional.cross_entropy(wrapped(x), target)
        loss.backward()
        for (name, param), expected in zip(model.named_parameters(), want):
            assert_close(param._norm_sample, expected.flatten(1).norm(dim=1), what=name)
        norms = torch.stack([g.flatten(1).norm(dim=1) for g in want]).norm(dim=0)
        assert_close(wrapped.get_norm_sample(), norms, what="model")
        assert opacus is not None and "_lstmcy_norm_samples" not in model.lstm.__dict__
        wrapped.zero_grad(set_to_none=True)


@pytest.mark.parametrize("config", GHOST_CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("head,embed", [("output", True), ("h_n", False)])
@pytest.mark.parametrize("second", ["reweighted", "other"])
def test_opacus_ghost_second_backward_is_the_plain_gradient(second, head, embed, config,
                                                            monkeypatch):
    """With Opacus's hooks disabled (ghost clipping's second backward) the backward gives
    the summed gradients of the loss it is given: for the first loss reweighted per
    sample (as Opacus's criterion does), formed from the first backward's gate gradients;
    for another loss, from the kernels again."""
    _opacus()
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    formed = []
    weighted_sums = _per_sample.weighted_sums
    monkeypatch.setattr(_per_sample, "weighted_sums",
                        lambda *args: formed.append(1) or weighted_sums(*args))
    model, reference = _classifiers(head, embed, **config)
    wrapped = GradSampleModuleFastGradientClipping(model, max_grad_norm=1.0)
    x, target = _data()
    weights = torch.tensor([0.3, 1.0, 0.0, 2.5], dtype=F64)

    def loss_of(out):  # the second backward's loss
        if second == "reweighted":
            return (weights * nn.functional.cross_entropy(out, target, reduction="none")).sum()
        return (weights * out[:, 0]).sum()

    out = wrapped(x)
    nn.functional.cross_entropy(out, target).backward(retain_graph=True)
    assert all(p.grad is None for p in model.lstm.parameters())  # the norm pass
    wrapped.zero_grad(set_to_none=True)  # as Opacus's criterion does between the two
    wrapped.disable_hooks()
    loss_of(out).backward()
    wrapped.enable_hooks()
    want = torch.autograd.grad(loss_of(reference(x)), list(reference.parameters()))
    for (name, param), expected in zip(model.named_parameters(), want):
        assert_close(param.grad, expected, what=name)
    assert formed == ([1] if second == "reweighted" else [])
    assert "_lstmcy_norm_samples" not in model.lstm.__dict__


def test_make_private_trains_packed_with_expanded_weights():
    """Packed input and initial states (which Opacus's hooks cannot read as a module's
    input) train through grad_sample_mode="ew"."""
    opacus = _opacus()

    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = LSTM(I, H, batch_first=True, dtype=F64)
            self.fc = nn.Linear(H, 2, dtype=F64)

        def forward(self, x):
            lengths = torch.tensor([7, 3, 5, 2] * (x.shape[0] // 4))
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            h0 = torch.zeros(1, x.shape[0], H, dtype=F64)
            _, (h_n, _) = self.lstm(packed, (h0, h0))
            return self.fc(h_n[-1])

    model = Packed()
    x, target = _data(8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, target), batch_size=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = opacus.PrivacyEngine()
        private, optimizer, loader = engine.make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=0.5,
            max_grad_norm=1.0, poisson_sampling=False, grad_sample_mode="ew")
    before = model.lstm.weight_hh_l0.detach().clone()
    for xb, yb in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(private(xb), yb).backward()
        assert model.lstm.weight_hh_l0.grad_sample.shape == (8, 4 * H, H)
        optimizer.step()
    assert not torch.equal(before, model.lstm.weight_hh_l0.detach())
    assert engine.get_epsilon(1e-5) > 0


REGISTRATION = textwrap.dedent("""
    import sys
    if sys.argv[1] == "opacus-first":
        import opacus
        import lstmcy.torch
    else:
        import lstmcy.torch
        assert "opacus" not in sys.modules  # lstmcy.torch does not import it
        import opacus
    from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping
    print(lstmcy.torch.LSTM in GradSampleModule.GRAD_SAMPLERS,
          lstmcy.torch.LSTM in GradSampleModuleFastGradientClipping.NORM_SAMPLERS)
""")


@pytest.mark.parametrize("order", ["opacus-first", "lstmcy-first"])
def test_opacus_grad_sampler_registered_in_either_import_order(order):
    _opacus()
    result = subprocess.run([sys.executable, "-c", REGISTRATION, order], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True True"
