"""lstmcy's forward and backward as PyTorch custom operators (``torch.ops.lstmcy``).

``lstmcy::lstm_forward`` and ``lstmcy::lstm_backward`` are registered with
:func:`torch.library.custom_op` (Python only), each with

- a fake (meta) implementation, so that ``torch.compile``, ``torch.export`` and
  ``make_fx`` trace them as opaque operations of known output shapes;
- an autograd formula (for autograd, compile and export; ``torch.func`` refuses these,
  and uses :mod:`lstmcy.torch._func` instead): the forward's backward is
  ``lstm_backward``; the backward's own backward (second derivatives,
  ``create_graph=True``) is :func:`lstmcy._reference.second_derivatives`;
- a vmap rule, so that ``torch.func.vmap`` (and per-sample gradients,
  ``vmap(grad(loss))``) maps over them: vmapped sequences with shared weights join the
  batch of one kernel call; anything else runs one call per vmapped slice.

:class:`lstmcy.torch.LSTM` calls them whenever PyTorch is tracing or transforming the
module (compile, ``jit.trace``, export, ``torch.func``, fake tensors, dispatch modes); in
plain eager mode it calls :mod:`lstmcy.torch._engine` directly through a lighter
``torch.autograd.Function``. Both run the same engine calls.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from lstmcy.torch import _engine as engine
from lstmcy._engine.config import config_of
from lstmcy._engine.validation import ArgumentNames, check_array
from lstmcy.torch._reference import second_derivatives

__all__ = ["lstm_forward", "lstm_backward", "layout_arguments"]


def layout_arguments(cfg, hidden_size):
    """The operators' layout arguments ``(hidden_size, num_layers, bidirectional, has_bias,
    batch_first, proj_size)`` of a call of settings ``cfg`` (an :class:`lstmcy.LSTMConfig`):
    an operator's schema takes plain values only."""
    return (hidden_size, cfg.num_layers, cfg.bidirectional, cfg.has_bias, cfg.batch_first,
            cfg.proj_size)


def _config(num_layers, bidirectional, has_bias, batch_first, proj_size):
    """The :class:`lstmcy.LSTMConfig` of an operator call's layout arguments (one shared
    config per layout; dropout and train stay at their defaults: the operators take the
    masks and ``train`` as arguments)."""
    return config_of(None, num_layers=num_layers, bidirectional=bidirectional,
                     batch_first=batch_first, has_bias=has_bias, proj_size=proj_size)


# ---------------------------------------------------------------------------
# argument checks: the operators are public (torch.ops.lstmcy). What only a tensor can get
# wrong (its dtype before it becomes a numpy view, the packed layout, the masks) is checked
# here; everything else by lstmcy's one check of a call (lstmcy._engine.validation), under
# aten::lstm's names.
# ---------------------------------------------------------------------------

_DTYPES = (torch.float32, torch.float64)


class _TorchNames(ArgumentNames):
    """``aten::lstm``'s names of an operator call's arguments, for lstmcy's checks."""

    params = "weights"
    h0 = "h0"
    c0 = "c0"
    dy = "grad_y"
    dh = "grad_h_n"
    dc = "grad_c_n"

    def __init__(self, cfg):
        self.cfg = cfg

    def param(self, shapes, k):
        return f"weights[{k}] ({_weight_names(self.cfg)[k]})"

    def first_weight(self, k, kind):
        return self.param(None, k)


def _check_dtypes(input, tensors, name_of):
    """``input`` is a float32 or float64 tensor and every tensor of ``tensors`` (None
    allowed) has its dtype: a numpy view keeps the dtype, and there is none for bfloat16.
    ``name_of(k)`` names ``tensors[k]``, called only for a message."""
    if input.dtype not in _DTYPES:
        raise TypeError(f"input must be a float32 or float64 tensor, got {input.dtype}")
    for k, value in enumerate(tensors):
        if value is not None and value.dtype != input.dtype:
            raise TypeError(f"{name_of(k)} has dtype {value.dtype}, expected {input.dtype} "
                            f"(input's)")


def _weight_names(cfg):
    """``nn.LSTM._flat_weights_names`` of ``cfg``."""
    kinds = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if cfg.has_bias else [])
    kinds += ["weight_hr"] if cfg.proj_size > 0 else []
    return [f"{kind}_l{layer}{suffix}" for layer in range(cfg.num_layers)
            for suffix in ("", "_reverse")[:cfg.num_directions] for kind in kinds]


def _checked_config(hidden_size, num_layers, bidirectional, has_bias, batch_first, proj_size):
    """The :class:`lstmcy.LSTMConfig` of an operator call's layout arguments, after checking
    the sizes as ``nn.LSTM`` checks its own (the config checks its settings' types)."""
    H, L, P = hidden_size, num_layers, proj_size
    if H < 1 or L < 1 or not 0 <= P < H:
        raise ValueError(f"hidden_size and num_layers must be positive and proj_size in "
                         f"[0, hidden_size), got {H}, {L} and {P}")
    return _config(num_layers, bidirectional, has_bias, batch_first, proj_size)


def _checked_problem(input, batch_sizes, h0, c0, weights, masks, cfg, hidden_size):
    """The checked problem of an operator call (and its masks checked against it)."""
    if batch_sizes is not None and (batch_sizes.dtype != torch.int64 or batch_sizes.dim() != 1):
        raise TypeError(f"batch_sizes must be a 1-D int64 tensor, got {batch_sizes.dtype} "
                        f"with shape {tuple(batch_sizes.shape)}")
    if (h0 is None) != (c0 is None):
        raise ValueError("h0 and c0 must be both given or both None")
    names = _TorchNames(cfg)
    per_direction = 2 + 2 * cfg.has_bias + (cfg.proj_size > 0)
    if len(weights) != per_direction * cfg.num_layers * cfg.num_directions:
        expected = _weight_names(cfg)
        raise ValueError(f"weights must be the {len(expected)} tensors {', '.join(expected)}; "
                         f"got {len(weights)}")
    n_weights = len(weights)
    _check_dtypes(input, [h0, c0, *weights, *masks],
                  lambda k: (("h0", "c0")[k] if k < 2 else names.param(None, k - 2)
                             if k < 2 + n_weights else f"masks[{k - 2 - n_weights}]"))
    problem = engine.problem_for(input, batch_sizes, h0, c0, weights, cfg, hidden_size,
                                 names=names)
    if problem.H != hidden_size:
        raise ValueError(f"hidden_size is {hidden_size} but {names.first_weight(1, 'w_hh')} "
                         f"has H = {problem.H} columns")
    L = cfg.num_layers
    if masks and len(masks) != L - 1:
        wanted = ("empty with num_layers=1 (no dropout between layers)" if L == 1 else
                  f"empty or the {L - 1} dropout masks of the outputs of layers 0 to {L - 2}")
        raise ValueError(f"masks must be {wanted}, got {len(masks)}")
    # aten::lstm's layer-output layout: time-major, or packed rows.
    mask_shape = ((problem.N,) if batch_sizes is not None
                  else (problem.T, problem.B)) + (problem.D * problem.P,)
    for k, mask in enumerate(masks):
        check_array(f"masks[{k}]", engine._np(mask), mask_shape, problem.dtype, ndim=None)
    return problem


def _check_gradients(problem, input, saved, grad_y, grad_h_n, grad_c_n, cfg, output_mask):
    """Check a backward call's saved block, output gradients and ``output_mask`` against
    its (checked) problem."""
    if len(output_mask) != 4:
        raise ValueError(f"output_mask must be 4 bools (dx, dh0, dc0, dweights), got "
                         f"{len(output_mask)}")
    _check_dtypes(input, [saved, grad_y, grad_h_n, grad_c_n],
                  ("saved", "grad_y", "grad_h_n", "grad_c_n").__getitem__)
    numel = engine.saved_numel(cfg, problem.H, problem.T, problem.B)
    check_array("saved", engine._np(saved), (numel,), problem.dtype, ndim=None)
    shapes = problem.shapes
    for name, value, shape in (("grad_y", grad_y, problem.output_shape()),
                               ("grad_h_n", grad_h_n, shapes.h_state),
                               ("grad_c_n", grad_c_n, shapes.c_state)):
        if value is not None:
            check_array(name, engine._np(value), shape, problem.dtype, ndim=None)


# ---------------------------------------------------------------------------
# the operators
# ---------------------------------------------------------------------------

@torch.library.custom_op("lstmcy::lstm_forward", mutates_args=(), device_types="cpu")
def lstm_forward(input: Tensor, batch_sizes: Optional[Tensor], h0: Optional[Tensor],
                 c0: Optional[Tensor], weights: List[Tensor], masks: List[Tensor],
                 hidden_size: int, num_layers: int, bidirectional: bool, has_bias: bool,
                 batch_first: bool, proj_size: int, train: bool
                 ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(y, h_n, c_n, saved)`` of :func:`lstmcy._engine.layer_loops.forward` (``saved`` is empty
    unless ``train``); ``masks`` is empty without dropout."""
    cfg = _checked_config(hidden_size, num_layers, bidirectional, has_bias, batch_first,
                          proj_size)
    problem = _checked_problem(input, batch_sizes, h0, c0, weights, masks, cfg, hidden_size)
    y, h_n, c_n, saved, _ = engine.forward(input, batch_sizes, h0, c0, weights, masks or None,
                                           cfg, hidden_size, train, problem=problem)
    return y, h_n, c_n, saved


@torch.library.custom_op("lstmcy::lstm_backward", mutates_args=(), device_types="cpu")
def lstm_backward(input: Tensor, batch_sizes: Optional[Tensor], h0: Optional[Tensor],
                  c0: Optional[Tensor], weights: List[Tensor], masks: List[Tensor],
                  saved: Tensor, grad_y: Optional[Tensor], grad_h_n: Optional[Tensor],
                  grad_c_n: Optional[Tensor], hidden_size: int, num_layers: int,
                  bidirectional: bool, has_bias: bool, batch_first: bool, proj_size: int,
                  output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
    """``(dx, dh0, dc0, dweights)`` of :func:`lstmcy._engine.layer_loops.backward`; an output
    that ``output_mask`` does not ask for is an empty tensor (an empty list for
    ``dweights``)."""
    cfg = _checked_config(hidden_size, num_layers, bidirectional, has_bias, batch_first,
                          proj_size)
    problem = _checked_problem(input, batch_sizes, h0, c0, weights, masks, cfg, hidden_size)
    _check_gradients(problem, input, saved, grad_y, grad_h_n, grad_c_n, cfg, output_mask)
    dx, dh0, dc0, dweights = engine.backward(problem, saved, masks or None, grad_y, grad_h_n,
                                             grad_c_n, tuple(output_mask))
    # A distinct empty tensor for each output not asked for (outputs may not alias).
    return (input.new_empty(0) if dx is None else dx, input.new_empty(0) if dh0 is None else dh0,
            input.new_empty(0) if dc0 is None else dc0, [] if dweights is None else dweights)


# ---------------------------------------------------------------------------
# fake implementations: output shapes and dtypes
# ---------------------------------------------------------------------------

def _sizes(input, batch_sizes, h0, batch_first):
    """``(T, B)`` of a call; with packed input and no ``h0``, B is data-dependent."""
    if batch_sizes is not None:
        B = h0.shape[1] if h0 is not None else torch.library.get_ctx().new_dynamic_size()
        return batch_sizes.shape[0], B
    if batch_first:
        return input.shape[1], input.shape[0]
    return input.shape[0], input.shape[1]


@lstm_forward.register_fake
def _lstm_forward_fake(input, batch_sizes, h0, c0, weights, masks, hidden_size, num_layers,
                       bidirectional, has_bias, batch_first, proj_size, train):
    D = 2 if bidirectional else 1
    out_size = proj_size if proj_size > 0 else hidden_size
    T, B = _sizes(input, batch_sizes, h0, batch_first)
    y = input.new_empty(tuple(input.shape[:-1]) + (D * out_size,))
    h_n = input.new_empty((num_layers * D, B, out_size))
    c_n = input.new_empty((num_layers * D, B, hidden_size))
    cfg = _config(num_layers, bidirectional, has_bias, batch_first, proj_size)
    saved = input.new_empty(engine.saved_numel(cfg, hidden_size, T, B) if train else 0)
    return y, h_n, c_n, saved


@lstm_backward.register_fake
def _lstm_backward_fake(input, batch_sizes, h0, c0, weights, masks, saved, grad_y, grad_h_n,
                        grad_c_n, hidden_size, num_layers, bidirectional, has_bias, batch_first,
                        proj_size, output_mask):
    want_dx, want_dh, want_dc, want_dw = output_mask
    D = 2 if bidirectional else 1
    out_size = proj_size if proj_size > 0 else hidden_size
    if want_dh or want_dc:  # (asked for only when h0 is given: B is known)
        _, B = _sizes(input, batch_sizes, h0, batch_first)
    return (torch.empty_like(input) if want_dx else input.new_empty(0),
            input.new_empty((num_layers * D, B, out_size)) if want_dh else input.new_empty(0),
            input.new_empty((num_layers * D, B, hidden_size)) if want_dc else input.new_empty(0),
            [torch.empty_like(w) for w in weights] if want_dw else [])


# ---------------------------------------------------------------------------
# autograd
# ---------------------------------------------------------------------------

def _forward_setup_context(ctx, inputs, output):
    input, batch_sizes, h0, c0, weights, masks, *static = inputs
    ctx.static = tuple(static[:-1])  # hidden_size ... proj_size (not train)
    ctx.num_weights = len(weights)
    ctx.num_masks = len(masks)
    ctx.save_for_backward(input, batch_sizes, h0, c0, *weights, *masks, output[3])
    ctx.mark_non_differentiable(output[3])
    ctx.set_materialize_grads(False)


def _forward_backward(ctx, grad_y, grad_h_n, grad_c_n, _grad_saved):
    input, batch_sizes, h0, c0, *rest = ctx.saved_tensors
    weights = rest[:ctx.num_weights]
    masks = rest[ctx.num_weights:ctx.num_weights + ctx.num_masks]
    saved = rest[-1]
    needs = ctx.needs_input_grad  # (input, batch_sizes, h0, c0, [weights], [masks], ...)
    weight_needs = list(needs[4])
    output_mask = [bool(needs[0]), h0 is not None and bool(needs[2]),
                   c0 is not None and bool(needs[3]), any(weight_needs)]
    no_weights = [None] * len(weights)
    if not any(output_mask):
        return (None, None, None, None, no_weights, [None] * len(masks)) + (None,) * 7
    dx, dh0, dc0, dweights = lstm_backward(input, batch_sizes, h0, c0, weights, masks, saved,
                                           grad_y, grad_h_n, grad_c_n, *ctx.static, output_mask)
    dweights = ([g if need else None for g, need in zip(dweights, weight_needs)]
                if output_mask[3] else no_weights)
    return ((dx if output_mask[0] else None), None, (dh0 if output_mask[1] else None),
            (dc0 if output_mask[2] else None), dweights, [None] * len(masks)) + (None,) * 7


lstm_forward.register_autograd(_forward_backward, setup_context=_forward_setup_context)


def _backward_setup_context(ctx, inputs, output):
    (input, batch_sizes, h0, c0, weights, masks, saved, grad_y, grad_h_n, grad_c_n,
     *static) = inputs
    ctx.hidden_size = static[0]
    ctx.cfg = _config(*static[1:-1])
    ctx.output_mask = tuple(static[-1])
    ctx.num_weights = len(weights)
    ctx.save_for_backward(input, batch_sizes, h0, c0, grad_y, grad_h_n, grad_c_n, *weights,
                          *masks)
    ctx.set_materialize_grads(False)


def _backward_backward(ctx, grad_dx, grad_dh0, grad_dc0, grad_dweights):
    input, batch_sizes, h0, c0, grad_y, grad_h_n, grad_c_n, *rest = ctx.saved_tensors
    weights, masks = rest[:ctx.num_weights], rest[ctx.num_weights:]
    grad_dweights = list(grad_dweights) if ctx.output_mask[3] else [None] * len(weights)
    d_input, d_h0, d_c0, d_weights, d_y, d_h_n, d_c_n = second_derivatives(
        ctx.cfg, ctx.hidden_size, ctx.output_mask, input, batch_sizes, h0, c0, weights, masks,
        grad_y, grad_h_n, grad_c_n, [grad_dx, grad_dh0, grad_dc0, *grad_dweights])
    return (d_input, None, d_h0, d_c0, d_weights, [None] * len(masks), None,
            d_y, d_h_n, d_c_n) + (None,) * 7


lstm_backward.register_autograd(_backward_backward, setup_context=_backward_setup_context)


# ---------------------------------------------------------------------------
# vmap
# ---------------------------------------------------------------------------

def _slice(value, dim, index):
    """``value``'s slice ``index`` along its vmapped ``dim`` (lists element-wise)."""
    if isinstance(value, (list, tuple)):
        dims = dim if isinstance(dim, (list, tuple)) else [dim] * len(value)
        return [_slice(v, d, index) for v, d in zip(value, dims)]
    if dim is None or not isinstance(value, Tensor):
        return value
    return value.select(dim, index)


def _stack(results):
    """Stack per-slice results (tuples of tensors and lists of tensors) along dim 0."""
    first = results[0]
    if isinstance(first, (list, tuple)):
        stacked = [_stack([r[k] for r in results]) for k in range(len(first))]
        return type(first)(stacked) if isinstance(first, tuple) else stacked
    return torch.stack(results)


def _out_dims_zero(result):
    if isinstance(result, (list, tuple)):
        dims = [_out_dims_zero(r) for r in result]
        return tuple(dims) if isinstance(result, tuple) else dims
    return 0


def _vmap_by_slices(op, info, in_dims, args):
    """Run ``op`` once per vmapped slice and stack the results (out_dims 0)."""
    results = [op(*[_slice(a, d, n) for a, d in zip(args, in_dims)])
               for n in range(info.batch_size)]
    stacked = _stack(results)
    return stacked, _out_dims_zero(stacked)


def _join_batch(tensor, dim, axis, size):
    """Physical ``tensor`` with the vmapped dimension ``dim`` (None: not vmapped, so
    broadcast to ``size``) moved before logical axis ``axis`` and merged into it."""
    if dim is None:
        tensor = tensor.unsqueeze(axis).expand(*tensor.shape[:axis], size, *tensor.shape[axis:])
    else:
        tensor = tensor.movedim(dim, axis)
    shape = tensor.shape
    return tensor.reshape(*shape[:axis], shape[axis] * shape[axis + 1], *shape[axis + 2:])


@lstm_forward.register_vmap
def _lstm_forward_vmap(info, in_dims, input, batch_sizes, h0, c0, weights, masks, hidden_size,
                       num_layers, bidirectional, has_bias, batch_first, proj_size, train):
    args = (input, batch_sizes, h0, c0, weights, masks, hidden_size, num_layers, bidirectional,
            has_bias, batch_first, proj_size, train)
    x_dim, bs_dim, h_dim, c_dim, w_dims, m_dims = in_dims[:6]
    shared_weights = all(d is None for d in w_dims)
    if batch_sizes is not None or bs_dim is not None or not shared_weights:
        return _vmap_by_slices(lstm_forward, info, in_dims, args)
    # Sequences vmapped with shared weights: one call on a batch of N * B sequences.
    N = info.batch_size
    batch_axis = 0 if batch_first else 1
    x = _join_batch(input, x_dim, batch_axis, N)
    if h0 is not None:
        h0 = _join_batch(h0, h_dim, 1, N)
        c0 = _join_batch(c0, c_dim, 1, N)
    masks = [_join_batch(m, d, 1, N) for m, d in zip(masks, m_dims or [None] * len(masks))]
    y, h_n, c_n, saved = lstm_forward(x, None, h0, c0, weights, masks, hidden_size, num_layers,
                                      bidirectional, has_bias, batch_first, proj_size, train)

    def split(tensor, axis):
        return tensor.unflatten(axis, (N, tensor.shape[axis] // N))
    if train:
        # Each sample's own saved block (as an unbatched call would save it), stacked.
        cfg = _config(num_layers, bidirectional, has_bias, batch_first, proj_size)
        T, NB = (x.shape[1], x.shape[0]) if batch_first else x.shape[:2]
        saved = torch.cat([part.unflatten(2, (N, NB // N)).movedim(2, 0).reshape(N, -1)
                           for part in engine.saved_parts(saved, cfg, hidden_size, T, NB)],
                          dim=1)
    out = (split(y, batch_axis), split(h_n, 1), split(c_n, 1), saved)
    return out, (batch_axis, 1, 1, 0 if train else None)


@lstm_backward.register_vmap
def _lstm_backward_vmap(info, in_dims, *args):
    # Per-sample weight gradients are separate sums: one backward per vmapped slice.
    return _vmap_by_slices(lstm_backward, info, in_dims, args)
