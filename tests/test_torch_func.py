"""lstmcy.torch.LSTM under torch.func transforms, against torch.nn.LSTM (float64).

``grad``, ``vjp``-based ``jacrev``, ``jvp``, ``jacfwd`` and ``hessian`` are compared with
the same transforms of ``nn.LSTM``; ``vmap`` (which ``nn.LSTM`` cannot do) with a loop of
``nn.LSTM`` calls, including per-sample gradients ``vmap(grad(loss))`` over unbatched
sequences and a vmapped ensemble of weights.
"""
import pytest

torch = pytest.importorskip("torch")
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, jvp, vmap  # noqa: E402

from torch_oracle import assert_close, module_pair  # noqa: E402
from torch_oracle import single_torch_thread  # noqa: E402,F401  (autouse fixture)

F64 = torch.float64


def _randn(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _params(module):
    return {name: p.detach() for name, p in module.named_parameters()}


def _assert_trees_close(got, want):
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert_close(a, b)


def _loss(module):
    def loss(params, x, target):
        y, (h_n, c_n) = functional_call(module, params, (x,))
        return ((y - target) ** 2).mean() + h_n.sum() * c_n.mean()
    return loss


def test_grad_matches_nn_lstm():
    ours, ref = module_pair(3, 4, num_layers=2, bidirectional=True)
    x, target = _randn(5, 2, 3), _randn(5, 2, 8, seed=1)
    _assert_trees_close(grad(_loss(ours))(_params(ours), x, target),
                        grad(_loss(ref))(_params(ref), x, target))


@pytest.mark.parametrize("batch_first", [False, True])
def test_per_sample_gradients_match_a_loop(batch_first):
    """vmap(grad(loss)) over unbatched sequences: what differentially private training
    needs, and what nn.LSTM's vmap cannot do."""
    ours, ref = module_pair(3, 4, num_layers=2, bidirectional=True, batch_first=batch_first)
    xs, targets = _randn(6, 5, 3), _randn(6, 5, 8, seed=1)
    per_sample = vmap(grad(_loss(ours)), in_dims=(None, 0, 0))(_params(ours), xs, targets)
    loop = [grad(_loss(ref))(_params(ref), x, t) for x, t in zip(xs, targets)]
    for name, value in per_sample.items():
        assert value.shape == (6,) + ref.get_parameter(name).shape
        assert_close(value, torch.stack([g[name] for g in loop]), what=name)


def test_vmap_forward_with_batched_and_shared_states():
    ours, ref = module_pair(3, 4, num_layers=2)
    xs = _randn(4, 5, 2, 3)  # 4 batches of [T=5, B=2, I=3]
    h0s, c0 = _randn(4, 2, 2, 4, seed=1), _randn(2, 2, 4, seed=2)
    got = vmap(lambda x, h0: ours(x, (h0, c0)), in_dims=(0, 0))(xs, h0s)
    want = [ref(x, (h0, c0)) for x, h0 in zip(xs, h0s)]
    _assert_trees_close(got, [torch.stack(parts) for parts in zip(*[
        (y, h_n, c_n) for y, (h_n, c_n) in want])])


def test_vmap_over_an_ensemble_of_weights():
    """Batched weights run one kernel call per member (the weights differ)."""
    ours, ref = module_pair(3, 4)
    members = [module_pair(3, 4, seed=seed)[0] for seed in range(3)]
    stacked = {name: torch.stack([m.get_parameter(name).detach() for m in members])
               for name, _ in ours.named_parameters()}
    x = _randn(5, 2, 3)
    got = vmap(lambda p: functional_call(ours, p, (x,))[0])(stacked)
    want = torch.stack([functional_call(ref, {n: v[k] for n, v in stacked.items()}, (x,))[0]
                        for k in range(3)])
    assert_close(got, want)


def test_jacrev_matches_nn_lstm():
    ours, ref = module_pair(2, 3, bidirectional=True)
    x = _randn(4, 2)  # unbatched
    _assert_trees_close(jacrev(lambda x: ours(x)[0])(x), jacrev(lambda x: ref(x)[0])(x))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_forward_mode_matches_nn_lstm():
    ours, ref = module_pair(2, 3, num_layers=2)
    x, tangent = _randn(4, 2), _randn(4, 2, seed=1)
    _assert_trees_close(jvp(lambda x: ours(x)[1][0], (x,), (tangent,)),
                        jvp(lambda x: ref(x)[1][0], (x,), (tangent,)))
    _assert_trees_close(jacfwd(lambda x: ours(x)[0])(x), jacfwd(lambda x: ref(x)[0])(x))


def test_second_order_transforms_match_nn_lstm():
    ours, ref = module_pair(2, 3)
    x = _randn(3, 2)
    _assert_trees_close(hessian(lambda x: ours(x)[0].pow(2).sum())(x),
                        hessian(lambda x: ref(x)[0].pow(2).sum())(x))

    def grad_of_grad(module):
        inner = grad(lambda x: (module(x)[0] ** 2).sum())
        return grad(lambda x: (inner(x) ** 2).sum())(x)
    _assert_trees_close(grad_of_grad(ours), grad_of_grad(ref))


def test_vmap_with_dropout_shares_one_mask():
    """randomness="same": one mask for every vmapped sample, drawn as nn.LSTM draws it."""
    ours, ref = module_pair(3, 4, num_layers=3, dropout=0.5)
    xs = _randn(4, 5, 3)
    torch.manual_seed(7)
    got = vmap(lambda x: ours(x)[0], randomness="same")(xs)
    want = []
    for x in xs:
        torch.manual_seed(7)
        want.append(ref(x)[0])
    assert_close(got, torch.stack(want))


def test_batched_gradients_match_nn_lstm():
    """autograd.grad(..., is_grads_batched=True) (torch.func's vmap) and
    autograd.functional.jacobian(vectorize=True) (the legacy vmap)."""
    ours, ref = module_pair(2, 3, num_layers=2)
    x = _randn(4, 1, 2).requires_grad_()
    cotangents = _randn(3, 4, 1, 3, seed=1)
    got, want = [torch.autograd.grad(module(x)[0], x, cotangents, is_grads_batched=True)[0]
                 for module in (ours, ref)]
    assert_close(got, want)
    got, want = [torch.autograd.functional.jacobian(lambda x: module(x)[0], x, vectorize=True)
                 for module in (ours, ref)]
    assert_close(got, want)
