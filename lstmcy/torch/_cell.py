"""``lstmcy.torch.LSTMCell``: a ``torch.nn.LSTMCell`` whose steps lstmcy's kernels compute.

A cell step is a one-step, one-layer LSTM call. In plain eager mode a step whose gradient
nothing needs runs on the step kernel object (:mod:`lstmcy.torch._step`); one with
gradients runs as one autograd node (:class:`_CellStep`) on :mod:`lstmcy._engine.step`,
which hands the kernels their arguments from per-shape state (no per-call checks beyond
the module's own, cached numpy views of the weights). Everywhere else (``torch.compile``, ``torch.func``, forward-mode
AD, tensor subclasses, float16/bfloat16) it is a one-step call of
:meth:`lstmcy.torch.LSTM._run`, which picks the route as it does for the LSTM module.
"""
import sys

import torch
from torch import nn

from lstmcy import _threadpool
from lstmcy._engine import step as _step
from lstmcy.torch import _ops
from lstmcy.torch import _reference as reference
from lstmcy.torch import _step as _step_infer
from lstmcy._engine.config import config_of
from lstmcy._engine.plan import _thread_plan
from lstmcy._engine.validation import to_compute

__all__ = ["LSTMCell"]

_KERNEL_DTYPES = (torch.float32, torch.float64)


def _lstm_module():
    """:mod:`lstmcy.torch` (which imports this module: looked up when a call needs it)."""
    return sys.modules["lstmcy.torch"]


def _np(tensor):
    """C-contiguous numpy view of a plain CPU tensor (a copy where it is strided)."""
    return to_compute((tensor.detach() if tensor.requires_grad else tensor).numpy(), None)


class _CellStep(torch.autograd.Function):
    """``(x, h0, c0, w_ih, w_hh, b_ih, b_hh) -> (h1, c1)``: one step of lstmcy's forward,
    its backward from the saved activations. ``arrays``: numpy views of the tensors."""

    @staticmethod
    def forward(ctx, shape, arrays, x, h0, c0, w_ih, w_hh, b_ih, b_hh):
        xa, ha, ca, wia, wha, bias = arrays
        plan = _thread_plan()
        previous = _threadpool.use_omp(True)
        try:
            h1, c1, saved = _step.forward(plan, shape, xa, ha, ca, wia, wha, bias, True)
        finally:
            _threadpool.use_omp(previous)
        ctx.set_materialize_grads(False)
        saved_tensor = torch.from_numpy(saved)
        # As tensors too, so that autograd refuses a backward after an in-place change.
        ctx.save_for_backward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, saved_tensor)
        ctx.shape, ctx.arrays, ctx.saved = shape, (xa, ha, ca, wia, wha), saved
        return torch.from_numpy(h1), torch.from_numpy(c1)

    @staticmethod
    def backward(ctx, dh, dc):
        x, h0, c0, w_ih, w_hh, b_ih, b_hh, saved = ctx.saved_tensors
        needs = ctx.needs_input_grad
        want_dx, want_dparams = needs[2], any(needs[5:])
        if not (any(needs[2:5]) or want_dparams):
            return (None,) * len(needs)
        if (torch.is_grad_enabled() or torch._C._functorch.peek_interpreter_stack() is not None
                or _lstm_module()._legacy_batched(dh, dc)):
            return (None, None) + _differentiable_backward(ctx, x, h0, c0, w_ih, w_hh, b_ih,
                                                           b_hh, saved, dh, dc)
        plan = _thread_plan()
        previous = _threadpool.use_omp(True)
        try:
            dx, dh0, dc0, dw_ih, dw_hh, db = _step.backward(
                plan, ctx.shape, *ctx.arrays, ctx.saved,
                None if dh is None else _np(dh), None if dc is None else _np(dc),
                want_dx, want_dparams)
        finally:
            _threadpool.use_omp(previous)
        grads = [None, None, None if dx is None else torch.from_numpy(dx),
                 torch.from_numpy(dh0) if needs[3] else None,
                 torch.from_numpy(dc0) if needs[4] else None,
                 torch.from_numpy(dw_ih) if needs[5] else None,
                 torch.from_numpy(dw_hh) if needs[6] else None]
        if b_ih is None:
            return tuple(grads) + (None, None)
        db_tensor = torch.from_numpy(db) if want_dparams else None
        return tuple(grads) + (db_tensor if needs[7] else None,
                               db_tensor.clone() if needs[8] else None)


def _differentiable_backward(ctx, x, h0, c0, w_ih, w_hh, b_ih, b_hh, saved, dh, dc):
    """The step's gradients as the LSTM module's eager backward gives them where they must
    be differentiable or vmapped: the custom operator's backward (second derivatives,
    ``torch.func``), or the reference for the legacy vmap."""
    needs = ctx.needs_input_grad
    weights = [w_ih, w_hh] if b_ih is None else [w_ih, w_hh, b_ih, b_hh]
    cfg = config_of(None, has_bias=b_ih is not None)  # one layer, one direction
    x3, h3, c3 = x.unsqueeze(0), h0.unsqueeze(0), c0.unsqueeze(0)
    # h1 is both the step's output y and h_n: its gradient goes in as dy.
    dy = None if dh is None else dh.unsqueeze(0)
    dc3 = None if dc is None else dc.unsqueeze(0)
    output_mask = [needs[2], needs[3], needs[4], any(needs[5:])]
    if _lstm_module()._legacy_batched(dh, dc):
        dx, dh0, dc0, dweights = reference.gradients(cfg, ctx.shape.H, x3, None, h3, c3,
                                                     weights, (), dy, None, dc3)
    else:
        dx, dh0, dc0, dweights = _ops.lstm_backward(
            x3, None, h3, c3, weights, [], saved, dy, None, dc3,
            *_ops.layout_arguments(cfg, ctx.shape.H), output_mask)
    grads = (None if dx is None or not needs[2] else dx[0],
             None if dh0 is None or not needs[3] else dh0[0],
             None if dc0 is None or not needs[4] else dc0[0])
    if dweights is None:
        return grads + (None,) * 4
    dweights = list(dweights) + [None] * (4 - len(dweights))
    return grads + tuple(g if need else None for g, need in zip(dweights, needs[5:]))


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
        self._views = None  # per weight: (tensor, data pointer, shape, numpy view)
        self._step_views = None  # the same for the step kernel (lstmcy.torch._step)
        self._step_last = None  # the last inference step's states (lstmcy.torch._step)
        self._step_kernel = None  # the last inference step's kernel (lstmcy.torch._step)

    def __getstate__(self):
        # The numpy views are of this instance's tensors: a copy (deepcopy, pickle) makes
        # its own.
        state = dict(super().__getstate__())
        state["_views"] = state["_step_views"] = state["_step_last"] = None
        state["_step_kernel"] = None
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

    def _weight_views(self, weights):
        """Numpy views of ``weights``, kept while they are the same tensors over the same
        memory (a weight's values may change in place: the views read them)."""
        views = self._views
        if views is not None and len(views) == len(weights):
            for w, (tensor, ptr, size, _) in zip(weights, views):
                if w is not tensor or w.data_ptr() != ptr or w.shape != size:
                    break
            else:
                return [view[3] for view in views]
        self._views = [(w, w.data_ptr(), w.shape, _np(w)) for w in weights]
        return [view[3] for view in self._views]

    def forward(self, input, hx=None):
        """One step; same arguments and results as :meth:`torch.nn.LSTMCell.forward`."""
        if not torch.is_grad_enabled() and type(input) is torch.Tensor and input.dim() == 2:
            # Inference on the step kernel object, which checks the arrays' dtypes and
            # shapes (None: the call is not its case).
            out = _step_infer.cell_step(self, input, hx)
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
        if type(input) is not torch.Tensor or input.dim() != 2:
            return None
        weights = self._weights()
        dtype = weights[0].dtype
        B = input.shape[0]
        H = self.hidden_size
        if (input.dtype is not dtype or dtype not in _KERNEL_DTYPES or not input.is_cpu
                or input.shape[1] != self.input_size or B == 0):
            return None
        if hx is None:
            h0 = c0 = None
        else:
            if type(hx) is not tuple or len(hx) != 2:
                return None
            h0, c0 = hx
            for state in hx:
                if (type(state) is not torch.Tensor or state.dtype is not dtype
                        or not state.is_cpu or state.shape != (B, H)):
                    return None
        for w in weights:
            if type(w) is not nn.Parameter or w.dtype is not dtype or not w.is_cpu:
                return None
        if (torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None
                or torch._C._functorch.peek_interpreter_stack() is not None
                or torch.autograd.forward_ad._current_level >= 0
                or torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack()):
            return None
        arrays = self._weight_views(weights)
        needs_grad = torch.is_grad_enabled() and (
            input.requires_grad or any(w.requires_grad for w in weights)
            or (h0 is not None and (h0.requires_grad or c0.requires_grad)))
        wia, wha = arrays[0], arrays[1]
        bias = arrays[2] + arrays[3] if self.bias else _step._zeros(1, 4 * H, wia.dtype)[0]
        shape = _step.step_shape(B, self.input_size, H, wia.dtype)
        if h0 is None:
            h0 = c0 = torch.zeros(B, H, dtype=dtype)
        xa, ha, ca = _np(input), _np(h0), _np(c0)
        if needs_grad:
            b_ih, b_hh = (weights[2], weights[3]) if self.bias else (None, None)
            return _CellStep.apply(shape, (xa, ha, ca, wia, wha, bias), input, h0, c0,
                                   weights[0], weights[1], b_ih, b_hh)
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
