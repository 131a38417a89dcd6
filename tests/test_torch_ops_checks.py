"""The custom operators ``torch.ops.lstmcy.*`` called directly, with bad arguments.

The module checks its tensors as ``torch.nn.LSTM`` does before it calls the engine, but
the operators are public: called directly they must refuse what the module would
refuse, with an error naming the argument, never read past a tensor or return garbage.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import lstmcy.torch  # noqa: E402,F401  (registers the operators)
from lstmcy import LSTMConfig  # noqa: E402
from lstmcy._engine import layer_loops as _engine  # noqa: E402
from lstmcy.torch import _engine as torch_engine  # noqa: E402

T, B, I, H = 5, 3, 4, 6


def _call(num_layers=1, dtype=torch.float32, **changes):
    g = torch.Generator().manual_seed(0)
    weights = []
    for layer in range(num_layers):
        weights += [torch.randn(4 * H, I if layer == 0 else H, generator=g, dtype=dtype) * 0.1,
                    torch.randn(4 * H, H, generator=g, dtype=dtype) * 0.1,
                    torch.zeros(4 * H, dtype=dtype), torch.zeros(4 * H, dtype=dtype)]
    kwargs = dict(input=torch.randn(T, B, I, generator=g, dtype=dtype), batch_sizes=None,
                  h0=None, c0=None, weights=weights, masks=[], hidden_size=H,
                  num_layers=num_layers, bidirectional=False, has_bias=True, batch_first=False,
                  proj_size=0)
    kwargs.update(changes)
    return kwargs


def _backward(kwargs, **grads):
    _, _, _, saved = torch.ops.lstmcy.lstm_forward(
        **{k: v for k, v in kwargs.items()}, train=True)
    args = dict(saved=saved, grad_y=torch.ones(T, B, H, dtype=kwargs["input"].dtype),
                grad_h_n=None, grad_c_n=None, output_mask=[True] * 4)
    args.update(grads)
    return torch.ops.lstmcy.lstm_backward(**kwargs, **args)


def test_a_valid_call_runs():
    dx, dh0, dc0, dweights = _backward(_call())
    assert dx.shape == (T, B, I) and torch.isfinite(dx).all()
    assert len(dweights) == 4


@pytest.mark.parametrize("grad, shape", [("grad_y", (1, B, H)), ("grad_y", (T + 1, B, H)),
                                         ("grad_y", (T, B, H + 1)), ("grad_h_n", (1, B + 1, H)),
                                         ("grad_c_n", (2, B, H))])
def test_backward_refuses_gradients_of_the_wrong_shape(grad, shape):
    # Unchecked, a grad_y shorter than the output would be read past its end.
    with pytest.raises(ValueError, match=rf"{grad} must have shape"):
        _backward(_call(), **{grad: torch.ones(shape)})


@pytest.mark.parametrize("grad", ["grad_y", "grad_h_n", "grad_c_n"])
def test_backward_refuses_gradients_of_another_dtype(grad):
    shape = (T, B, H) if grad == "grad_y" else (1, B, H)
    with pytest.raises(TypeError, match=rf"{grad} has dtype torch.float64, expected torch.float32"):
        _backward(_call(), **{grad: torch.ones(shape, dtype=torch.float64)})


def test_backward_refuses_a_saved_block_of_another_call():
    _, _, _, saved = torch.ops.lstmcy.lstm_forward(**_call(), train=True)
    with pytest.raises(ValueError, match="saved must have shape"):
        _backward(_call(), saved=saved[:-1])
    with pytest.raises(ValueError, match="output_mask must be 4 bools"):
        _backward(_call(), output_mask=[True] * 3)


@pytest.mark.parametrize("change, error, message", [
    (dict(input=torch.zeros(T, B, I, dtype=torch.int64)), TypeError,
     "input must be a float32 or float64 tensor, got torch.int64"),
    (dict(input=torch.zeros(T * B, I)), ValueError, r"input must be 3-D \[T, B, I\]"),
    (dict(h0=torch.zeros(1, B, H, dtype=torch.float64), c0=torch.zeros(1, B, H)), TypeError,
     "h0 has dtype torch.float64"),
    (dict(h0=torch.zeros(1, B, H), c0=torch.zeros(1, B, H, dtype=torch.float16)), TypeError,
     "c0 has dtype torch.float16"),
    (dict(h0=torch.zeros(1, B + 1, H), c0=torch.zeros(1, B + 1, H)), ValueError,
     "h0 must have shape"),
    (dict(h0=torch.zeros(1, B, H), c0=None), ValueError, "h0 and c0 must be both given"),
    (dict(masks=[torch.ones(T, B, H)]), ValueError, "masks must be empty with num_layers=1"),
    (dict(hidden_size=-6), ValueError, "hidden_size and num_layers must be positive"),
    (dict(proj_size=H), ValueError, r"proj_size in \[0, hidden_size\)"),
    # T * B rows of packed data are not read in another (padded) layout.
    (dict(input=torch.zeros(6, I), batch_sizes=torch.tensor([2, 1, 1])), ValueError,
     r"packed input must be \[sum\(batch_sizes\) = 4, I\], got shape \(6, 4\)"),
])
def test_forward_refuses_bad_arguments(change, error, message):
    with pytest.raises(error, match=message):
        torch.ops.lstmcy.lstm_forward(**_call(**change), train=True)


def test_forward_refuses_weights_of_another_dtype_or_shape():
    kwargs = _call()
    weights = list(kwargs["weights"])
    weights[0] = weights[0].double()
    with pytest.raises(TypeError, match=r"weights\[0\] \(weight_ih_l0\) has dtype torch.float64"):
        torch.ops.lstmcy.lstm_forward(**dict(kwargs, weights=weights), train=True)
    weights[0] = torch.zeros(4 * H, I + 1)
    with pytest.raises(ValueError, match=r"weights\[0\] \(weight_ih_l0\) must have shape"):
        torch.ops.lstmcy.lstm_forward(**dict(kwargs, weights=weights), train=True)
    with pytest.raises(ValueError, match="weights must be the 4 tensors weight_ih_l0"):
        torch.ops.lstmcy.lstm_forward(**dict(kwargs, weights=weights[:3]), train=True)


def test_forward_refuses_dropout_masks_of_the_wrong_count_or_shape():
    kwargs = _call(num_layers=3)
    with pytest.raises(ValueError, match="the 2 dropout masks"):
        torch.ops.lstmcy.lstm_forward(**dict(kwargs, masks=[torch.ones(T, B, H)] * 3),
                                      train=True)
    with pytest.raises(ValueError, match=r"masks\[1\] must have shape"):
        torch.ops.lstmcy.lstm_forward(
            **dict(kwargs, masks=[torch.ones(T, B, H), torch.ones(T, B, H + 1)]), train=True)


def test_engine_backward_checks_the_gradients_a_trusted_problem_is_given():
    # The engine trusts a problem's own arrays, not the gradients handed with it.
    x = torch.randn(T, B, I, dtype=torch.float64)
    weights = [torch.randn(4 * H, I, dtype=torch.float64), torch.randn(4 * H, H, dtype=torch.float64)]
    cfg = LSTMConfig(has_bias=False)
    _, _, _, saved, problem = torch_engine.forward(x, None, None, None, weights, None, cfg, H,
                                                    True)
    block = saved.numpy()
    with pytest.raises(ValueError, match=r"dy must have shape \(5, 3, 6\) \(like the output y\), got \(1, 3, 6\)"):
        _engine.backward(problem, block, np.ones((1, B, H)))
    with pytest.raises(ValueError, match=r"dh must have shape \(1, 3, 6\)"):
        _engine.backward(problem, block, np.ones((T, B, H)), dh=np.ones((1, 2, H)))
    with pytest.raises(ValueError, match=r"dc must have shape \(1, 3, 6\)"):
        _engine.backward(problem, block, np.ones((T, B, H)), dc=np.ones((2, B, H)))
    with pytest.raises(ValueError, match="masks must be 0 arrays"):
        _engine.backward(problem, block, np.ones((T, B, H)), masks=[np.ones((T, B, H))])
