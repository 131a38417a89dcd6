"""``lstmcy.torch.LSTMCell``: a ``torch.nn.LSTMCell`` whose steps lstmcy's kernels compute.

A cell step is a one-step, one-layer LSTM call. In plain eager mode a step whose gradient
nothing needs runs on the step kernel object (:mod:`lstmcy.torch._step`); one with
gradients runs as one autograd node (:class:`_CellStep`) whose forward and backward run on
the step kernel objects too (``StepForward``, ``StepBackward``: checks in C, no job on
the pool) or, for steps larger than one thread's work, on :mod:`lstmcy._engine.step`'s
layer calls; the weights are read through the numpy views :mod:`lstmcy.torch._step`
keeps on the module. Everywhere else (``torch.compile``, ``torch.func``, forward-mode
AD, tensor subclasses, float16/bfloat16) it is a one-step call of
:meth:`lstmcy.torch.LSTM._run`, which picks the route as it does for the LSTM module.
"""
import sys

import numpy as np
import torch
from torch import nn

from lstmcy import _threadpool
from lstmcy._engine import fpmode as _fpmode
from lstmcy._engine import step as _step
from lstmcy.torch import _ops
from lstmcy.torch import _reference as reference
from lstmcy.torch import _step as _torch_step
from lstmcy._engine.config import config_of
from lstmcy._engine.plan import _thread_plan
from lstmcy._engine.validation import to_compute

__all__ = ["LSTMCell", "training_step"]

_is_legacy_batched = torch._C._functorch.is_legacy_batchedtensor


def _lstm_module():
    """:mod:`lstmcy.torch` (which imports this module: looked up when a call needs it)."""
    return sys.modules["lstmcy.torch"]


def _np(tensor):
    """C-contiguous numpy view of a plain CPU tensor (a copy where it is strided;
    ``numpy(force=True)`` detaches in one call)."""
    return to_compute(tensor.numpy(force=True) if tensor.requires_grad else tensor.numpy(),
                      None)


class _StepParameters(torch.autograd.Function):
    """``((I, H), w_ih, w_hh[, b_ih, b_hh]) -> [4H (I + H + 1)]``: the tensor through which
    a module's training steps send its parameters' gradients.

    Each :class:`_CellStep` takes it as one input and returns one gradient for it, the
    step's ``dparams`` (``dw_ih``, ``dw_hh``, ``db`` flattened:
    :func:`lstmcy._engine.step.split_dparams`); autograd sums the steps' at this node,
    whose backward splits the sum into the parameters' gradients (``db`` for either bias).

    Design: one gradient a step for all the parameters costs autograd one output to check
    and one addition a step, where one a parameter costs four of each and a copy of
    ``db``. The module keeps the tensor (:func:`_parameters`) while its parameters are
    the same: the node holds no state, so every backward pass runs it (the sum's split
    costs one copy of the parameters a pass). The tensor's values are never read (one
    element, expanded): the steps read the parameters themselves, and save them, so that
    autograd refuses a backward after they change in place.
    """

    @staticmethod
    def forward(ctx, sizes, *weights):
        ctx.sizes = sizes
        I, H = sizes
        return weights[0].new_empty(1).expand(4 * H * (I + H + 1))

    @staticmethod
    def backward(ctx, dparams):
        # Copies: each parameter's gradient a tensor of its own, as autograd's are (a
        # view's storage would be the whole sum's).
        dw_ih, dw_hh, db = _step.split_dparams(dparams, *ctx.sizes)
        # w_ih, w_hh[, b_ih, b_hh]: zip stops at the weights the module has.
        return (None,) + tuple(g.clone() if need else None for g, need in
                               zip((dw_ih, dw_hh, db, db), ctx.needs_input_grad[1:]))


def _parameters(module, weights, I, H):
    """``module``'s :class:`_StepParameters` tensor of ``weights`` (its two or four
    parameters, whose views :func:`lstmcy.torch._step.weight_views` has just checked):
    the one kept on the module while it is of the same views and ``requires_grad``
    flags, else a new one (kept)."""
    flags = tuple(w.requires_grad for w in weights)
    views = module._step_views
    kept = module.__dict__.get("_step_params")
    if kept is not None and kept[0] is views and kept[1] == flags:
        return kept[2]
    params = _StepParameters.apply((I, H), *weights)
    # In the instance's dict, as lstmcy.torch._step.remember's states.
    module.__dict__["_step_params"] = (views, flags, params)
    return params


class _CellStep(torch.autograd.Function):
    """``(x, h0, c0, params) -> (h1, c1)``: one step of lstmcy's forward, its backward from
    the saved activations; ``params`` is the module's :class:`_StepParameters` tensor.

    ``step`` is ``(shape, x, h0, c0, views, kernel, plan, weights)``: the step's
    :class:`~lstmcy._engine.step.StepShape`, numpy views of the tensors (``views``: the
    module's two or four parameters'), the plan's ``StepForward`` of the shape (None where
    the step does not fit one), that plan, whose ``StepBackward`` takes the backward where
    the step fits one, and the parameters. Elsewhere the step runs as the calling thread's
    plan's layer call (``lstmcy._engine.step.forward`` / ``backward``), with the same
    bits."""

    @staticmethod
    def forward(ctx, step, x, h0, c0, params):
        return _forward(ctx, _torch_step._CELL, step, x, h0, c0)

    @staticmethod
    def backward(ctx, dh, dc):
        return _backward(ctx, dh, dc)


class _SequenceStep(_CellStep):
    """:class:`_CellStep` of a one-step sequence call of the LSTM module: ``(x, h0, c0,
    params) -> (y, h_n, c_n)``, ``x`` ``[1, B, I]`` (:class:`_BatchFirstStep`: ``[B, 1,
    I]``), the states ``[1, B, H]``, ``y`` a copy of ``h_n`` in ``x``'s layout (the
    step's arrays in ``step`` have these shapes too)."""

    @staticmethod
    def forward(ctx, step, x, h0, c0, params):
        return _forward(ctx, _torch_step._TIME_MAJOR, step, x, h0, c0)

    @staticmethod
    def backward(ctx, dy, dh_n, dc_n):
        # h1 is both y and h_n: its gradient is their sum (of two terms: the bits of
        # either order, as autograd's sum of the two uses of h1 would be).
        if dy is not None:
            dy = dy.reshape(dy.shape[0] * dy.shape[1], dy.shape[2])
        dh = dy if dh_n is None else dh_n[0] if dy is None else dy + dh_n[0]
        return _backward(ctx, dh, None if dc_n is None else dc_n[0])


class _BatchFirstStep(_SequenceStep):
    """:class:`_SequenceStep` of a batch-first module: ``x`` and ``y`` ``[B, 1, I]``."""

    @staticmethod
    def forward(ctx, step, x, h0, c0, params):
        return _forward(ctx, _torch_step._BATCH_FIRST, step, x, h0, c0)


def _forward(ctx, layout, step, x, h0, c0):
    """A step's new tensors: ``(h1, c1)`` for the cell's ``layout``, else ``(y, h_n,
    c_n)``."""
    shape, xa, ha, ca, views, kernel, plan, weights = step
    out = None
    if kernel is not None:
        saved = np.empty(shape.saved_size, shape.dtype)
        out = kernel.run(xa, (ha, ca), views, len(views), saved, _fpmode._flush, layout)
    if out is None:  # the layer call
        bias = (views[2] + views[3] if len(views) == 4
                else _step._zeros(1, 4 * shape.H, shape.dtype)[0])
        B, I, H = shape.B, shape.I, shape.H
        previous = _threadpool.use_omp(True)
        try:
            h1, c1, saved = _step.forward(_thread_plan(), shape, xa.reshape(B, I),
                                          ha.reshape(B, H), ca.reshape(B, H), views[0],
                                          views[1], bias, True)
        finally:
            _threadpool.use_omp(previous)
        out = (h1, c1) if layout == _torch_step._CELL else (
            h1.reshape(xa.shape[:2] + (H,)), h1.copy()[None], c1[None])
    ctx.set_materialize_grads(False)
    # Saved so that autograd refuses a backward after an in-place change (the parameters
    # too: the backward reads them).
    ctx.save_for_backward(x, h0, c0, *weights)
    ctx.step, ctx.saved = step, saved
    return tuple(torch.from_numpy(a) for a in out)


def _backward(ctx, dh, dc):
    """A step's gradients ``(None, dx, dh0, dc0, dparams)`` from those of its new states
    ``dh``, ``dc`` ``[B, H]`` (None: zeros), in the shapes of its inputs."""
    x, h0, c0, *weights = ctx.saved_tensors
    needs = ctx.needs_input_grad  # step, x, h0, c0, params
    want_dx, want_dparams = needs[1], needs[4]
    if not (needs[1] or needs[2] or needs[3] or want_dparams):
        return (None,) * 5
    shape = ctx.step[0]
    B, I, H = shape.B, shape.I, shape.H
    if (torch.is_grad_enabled() or _torch_step._transforms() is not None
            or (dh is not None and _is_legacy_batched(dh))
            or (dc is not None and _is_legacy_batched(dc))):
        dx, dh0, dc0, dparams = _differentiable_backward(
            H, needs[1:], x.reshape(B, I), h0.reshape(B, H), c0.reshape(B, H), weights,
            torch.from_numpy(ctx.saved), dh, dc)
        return (None, None if dx is None else dx.reshape(x.shape),
                None if dh0 is None else dh0.reshape(h0.shape),
                None if dc0 is None else dc0.reshape(c0.shape), dparams)
    _, xa, ha, ca, views, _, plan, _ = ctx.step
    xa, ha, ca = xa.reshape(B, I), ha.reshape(B, H), ca.reshape(B, H)
    dh, dc = None if dh is None else _np(dh), None if dc is None else _np(dc)
    # The module's plan's kernel object, else the calling thread's plan.
    out = _step.backward_on_kernel(plan, shape, xa, ha, ca, views[0], views[1], ctx.saved,
                                   dh, dc, want_dx, want_dparams)
    if out is None:
        previous = _threadpool.use_omp(True)
        try:
            out = _step.backward(_thread_plan(), shape, xa, ha, ca, views[0], views[1],
                                 ctx.saved, dh, dc, want_dx, want_dparams)
        finally:
            _threadpool.use_omp(previous)
    dx, dh0, dc0, dparams = out
    return (None, None if dx is None else torch.from_numpy(dx.reshape(x.shape)),
            torch.from_numpy(dh0.reshape(h0.shape)) if needs[2] else None,
            torch.from_numpy(dc0.reshape(c0.shape)) if needs[3] else None,
            None if dparams is None else torch.from_numpy(dparams))


# Function.apply's Python part does, for a Function without setup_context, functorch's
# check (plain_eager's, made first) and the unwrapping of dead functorch wrappers
# (training_step's): the autograd node's own apply, bound once, saves that part's
# microseconds on every step.
_APPLY = {layout: super(torch.autograd.Function, node).apply
          for layout, node in ((None, _CellStep), (False, _SequenceStep),
                               (True, _BatchFirstStep))}
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def training_step(module, x, h0, c0, weights, views, batch_first=None):
    """One step with gradients as one autograd node: ``(h1, c1)`` ``[B, H]``
    (:class:`_CellStep`), or with ``batch_first`` given ``(y, h_n, c_n)``
    (:class:`_SequenceStep`, :class:`_BatchFirstStep`).

    ``module`` is the cell, or a one-layer, one-direction LSTM module without projection
    stepped at ``T = 1`` (its kernel object is kept on it); ``x [B, I]``, ``h0``, ``c0``
    ``[B, H]`` (None: zeros) plain CPU tensors of the weights' dtype (with
    ``batch_first``: ``x [1, B, I]``, ``[B, 1, I]`` batch first, the states ``[1, B,
    H]``), ``weights`` the module's two or four parameters and ``views`` their arrays
    (:func:`lstmcy.torch._step.weight_views`): the caller has checked them all, in plain
    eager mode."""
    I, H = module.input_size, module.hidden_size
    B = x.shape[0] if batch_first is None or batch_first else x.shape[1]
    dtype = views[0].dtype
    shape = _step.step_shape(B, I, H, dtype)
    x = _unwrap_if_dead(x)
    if h0 is None:
        h0 = c0 = torch.zeros((B, H) if batch_first is None else (1, B, H), dtype=x.dtype)
    else:
        h0, c0 = _unwrap_if_dead(h0), _unwrap_if_dead(c0)
    if shape.kernel_key is not None:
        kernel = _torch_step._kernel(module, B, I, H, dtype)
        plan = module._step_kernel[3]
    else:
        kernel, plan = None, _thread_plan()
    return _APPLY[batch_first]((shape, _np(x), _np(h0), _np(c0), views, kernel, plan, weights),
                               x, h0, c0, _parameters(module, weights, I, H))


def _differentiable_backward(H, needs, x, h0, c0, weights, saved, dh, dc):
    """The step's gradients ``(dx, dh0, dc0, dparams)`` as the LSTM module's eager backward
    gives them where they must be differentiable or vmapped: the custom operator's
    backward (second derivatives, ``torch.func``), or the reference for the legacy vmap.
    ``needs``: whether each of those is wanted; ``dparams`` flat, as
    :class:`_StepParameters` takes it (zeros for a cell without biases' ``db``)."""
    has_bias = len(weights) == 4
    cfg = config_of(None, has_bias=has_bias)  # one layer, one direction
    x3, h3, c3 = x.unsqueeze(0), h0.unsqueeze(0), c0.unsqueeze(0)
    # h1 is both the step's output y and h_n: its gradient goes in as dy.
    dy = None if dh is None else dh.unsqueeze(0)
    dc3 = None if dc is None else dc.unsqueeze(0)
    output_mask = list(needs)
    if _lstm_module()._legacy_batched(dh, dc):
        dx, dh0, dc0, dweights = reference.gradients(cfg, H, x3, None, h3, c3,
                                                     weights, (), dy, None, dc3)
    else:
        dx, dh0, dc0, dweights = _ops.lstm_backward(
            x3, None, h3, c3, weights, [], saved, dy, None, dc3,
            *_ops.layout_arguments(cfg, H), output_mask)
    grads = (None if dx is None or not needs[0] else dx[0],
             None if dh0 is None or not needs[1] else dh0[0],
             None if dc0 is None or not needs[2] else dc0[0])
    if dweights is None or not needs[3]:
        return grads + (None,)
    dweights = [torch.zeros_like(w) if g is None else g for g, w in zip(dweights, weights)]
    db = dweights[2] if has_bias else weights[0].new_zeros(4 * H)
    return grads + (torch.cat([dweights[0].reshape(-1), dweights[1].reshape(-1), db]),)


class LSTMCell(nn.LSTMCell):
    r"""An LSTM cell with lstmcy's CPU kernels: a drop-in for :class:`torch.nn.LSTMCell`.

    Same constructor, parameters (``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``),
    initialisation, ``state_dict`` and ``forward`` as ``torch.nn.LSTMCell``; an instance
    *is* a ``torch.nn.LSTMCell`` (subclass).

    Parameters
    ----------
    input_size : int
        Features of the input ``x``.
    hidden_size : int
        Features of the states ``h`` and ``c``.
    bias : bool, default True
        Whether the cell has ``bias_ih`` and ``bias_hh``.
    device, dtype
        As for ``torch.nn.LSTMCell``. Only the CPU runs forward; float32 and float64 are
        computed natively, float16 and bfloat16 in float32.

    Notes
    -----
    ``forward(input, hx=None)`` takes ``input`` ``[B, I]`` (or unbatched ``[I]``) and
    ``hx = (h, c)``, each ``[B, H]`` (``[H]``), None for zeros, and returns ``(h', c')``.
    In eager mode a step is one autograd node computed by lstmcy's kernels, with gradients
    to the input, both states and every parameter. ``torch.compile``, ``torch.func``,
    second and forward-mode derivatives run the step as a one-step
    :class:`lstmcy.torch.LSTM` call on the same routes as that module.

    Examples
    --------
    >>> import torch
    >>> from lstmcy.torch import LSTMCell
    >>> cell = LSTMCell(8, 16)
    >>> h = c = torch.zeros(4, 16)
    >>> for x in torch.randn(5, 4, 8):
    ...     h, c = cell(x, (h, c))
    >>> h.shape
    torch.Size([4, 16])
    """

    # What lstmcy.torch.LSTM._run reads of a module, for the step as a one-layer LSTM.
    num_layers = 1
    bidirectional = False
    batch_first = False
    proj_size = 0
    dropout = 0.0

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias=bias, device=device, dtype=dtype)
        self._step_views = None  # numpy views of the weights (lstmcy.torch._step)
        self._step_last = None  # the last inference step's states (lstmcy.torch._step)
        self._step_kernel = None  # the last inference step's kernel (lstmcy.torch._step)

    def __getstate__(self):
        # The numpy views are of this instance's tensors: a copy (deepcopy, pickle) makes
        # its own.
        state = dict(super().__getstate__())
        state["_step_views"] = state["_step_last"] = None
        state["_step_kernel"] = None
        state.pop("_step_params", None)  # a non-leaf tensor: kept only for these views
        return state

    @property
    def _flat_weights_names(self):
        """The parameters' names in ``_weights`` order (for the LSTM module's checks)."""
        return ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if self.bias else [])

    def _dropout_masks(self, data, cfg):
        """No dropout in a cell (what :meth:`lstmcy.torch.LSTM._run` asks a module for)."""
        return None

    def _weights(self):
        params = self._parameters
        weights = [params["weight_ih"], params["weight_hh"]]
        if self.bias:
            weights += [params["bias_ih"], params["bias_hh"]]
        return weights

    def forward(self, input, hx=None):
        """One step; same arguments and results as :meth:`torch.nn.LSTMCell.forward`."""
        if not _torch_step.recording() and type(input) is torch.Tensor and input.dim() == 2:
            # Inference on the step kernel object, which checks the arrays' dtypes and
            # shapes (None: the call is not its case).
            out = _torch_step.cell_step(self, input, hx)
            if out is not None:
                return out
        fast = self._fast_step(input, hx)
        if fast is not None:
            return fast
        return self._general_step(input, hx)

    def _fast_step(self, input, hx):
        """The step on :class:`_CellStep` when the call is the plain case (eager mode,
        plain CPU tensors of the weights' float32/float64 dtype and the expected shapes),
        else None."""
        if type(input) is not torch.Tensor or input.dim() != 2 or not _torch_step.plain_eager():
            return None
        weights = self._weights()
        # Views of plain contiguous CPU parameters of one kernel dtype (checked once).
        views = _torch_step.weight_views(self, weights)
        if views is None:
            return None
        dtype = weights[0].dtype
        B = input.shape[0]
        H = self.hidden_size
        if (input.dtype is not dtype or not input.is_cpu or input.shape[1] != self.input_size
                or B == 0):
            return None
        states = _torch_step.plain_states(hx, dtype, (B, H))
        if states is None:
            return None
        h0, c0 = states
        if _torch_step.recording() and (
                input.requires_grad or (h0 is not None and (h0.requires_grad or c0.requires_grad))
                or weights[0].requires_grad or weights[1].requires_grad
                or (self.bias and (weights[2].requires_grad or weights[3].requires_grad))):
            return training_step(self, input, h0, c0, weights, views)
        shape = _step.step_shape(B, self.input_size, H, views[0].dtype)
        if h0 is None:
            h0 = c0 = torch.zeros(B, H, dtype=dtype)
        xa, ha, ca = _np(input), _np(h0), _np(c0)
        wia, wha = views[0], views[1]
        bias = views[2] + views[3] if self.bias else _step._zeros(1, 4 * H, wia.dtype)[0]
        previous = _threadpool.use_omp(True)
        try:
            h1, c1, _ = _step.forward(_thread_plan(), shape, xa, ha, ca, wia, wha, bias, False)
        finally:
            _threadpool.use_omp(previous)
        return torch.from_numpy(h1), torch.from_numpy(c1)

    def _general_step(self, input, hx):
        """``torch.nn.LSTMCell.forward``'s checks, then the step as a one-step
        :class:`lstmcy.torch.LSTM` call on that module's routes."""
        lstm = _lstm_module()
        proxy = lstm._fx_proxy((input, hx))
        if proxy is not None:
            return lstm.LSTM._fx_call(self, proxy.tracer, input, hx)
        if input.dim() not in (1, 2):
            raise ValueError(f"LSTMCell: Expected input to be 1D or 2D, got {input.dim()}D instead")
        if hx is not None:
            for idx, value in enumerate(hx):
                if value.dim() not in (1, 2):
                    raise ValueError(f"LSTMCell: Expected hx[{idx}] to be 1D or 2D, got "
                                     f"{value.dim()}D instead")
            if len(hx) != 2:
                raise RuntimeError("lstm_cell expects two hidden states")  # as nn.LSTMCell
        given = hx
        is_batched = input.dim() == 2
        data = input if is_batched else input.unsqueeze(0)
        if hx is None:
            zeros = torch.zeros(data.size(0), self.hidden_size, dtype=data.dtype,
                                device=data.device)
            hx = (zeros, zeros)
        elif not is_batched:
            hx = (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        weights = self._weights()
        B = data.size(0)
        if (data.size(1) != self.input_size or hx[0].dim() != 2 or hx[1].dim() != 2
                or tuple(hx[0].shape) != (B, self.hidden_size)
                or tuple(hx[1].shape) != (B, self.hidden_size)
                or any(w.dtype != data.dtype for w in weights)):
            # torch.nn.LSTMCell's own error for sizes or dtypes it refuses.
            super().forward(input, given)
            raise RuntimeError(f"LSTMCell: input {tuple(data.shape)} and states "
                               f"{tuple(hx[0].shape)}, {tuple(hx[1].shape)} do not fit "
                               f"input_size={self.input_size}, hidden_size={self.hidden_size}")
        states = (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        lstm.LSTM._check_runnable(self, data.unsqueeze(0), states, weights)
        _, h_n, c_n = lstm.LSTM._run(self, data.unsqueeze(0), None, states, weights)
        h1, c1 = h_n[0], c_n[0]
        if not is_batched:
            h1, c1 = h1.squeeze(0), c1.squeeze(0)
        return h1, c1
