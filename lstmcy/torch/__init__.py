"""PyTorch drop-ins: :class:`LSTM` and :class:`LSTMCell`, ``torch.nn.LSTM`` and
``torch.nn.LSTMCell`` computed by lstmcy's kernels.

This package needs PyTorch (the ``[torch]`` extra) and is only imported when asked for
explicitly (``import lstmcy.torch`` or ``from lstmcy.torch import LSTM``); ``import
lstmcy`` never imports torch.

This file holds the module, :class:`LSTM`, and its routes (so that its public path is
the one pickles, ``weights_only`` allow lists and TorchScript's source lookup see); one
concern per module for the rest: the cell (``_cell``), the bridge to the kernels
(``_engine``: tensors in and out as zero-copy numpy views), the custom operators
(``_ops``), the ``torch.func`` route (``_func``), the differentiable reference
(``_reference``), per-sample gradients and private training (``_per_sample``,
``_privacy``), dynamic quantization (``_quantization``) and the ``state_dict``
conversions (``_state_dict``).

For numpy users, :func:`params_from_state_dict`, :func:`config_from_state_dict` and
:func:`params_to_state_dict` convert between an ``nn.LSTM`` ``state_dict`` and lstmcy's
``params`` list.

:class:`LSTM` subclasses :class:`torch.nn.LSTM`, so its parameters, their names,
initialisation and ``state_dict`` are exactly those of ``torch.nn.LSTM`` (either's
``state_dict`` loads into the other, and under the same ``torch.manual_seed`` both start
from the same weights). Only ``forward`` differs. It runs lstmcy's kernels by one of
four routes, chosen per call:

- plain eager mode: :mod:`lstmcy.torch._engine` directly, through a light
  :class:`torch.autograd.Function`;
- while PyTorch traces the module (``torch.compile``, ``torch.export``,
  ``torch.jit.trace``, fake tensors, dispatch modes, tensor subclasses): the custom
  operators ``torch.ops.lstmcy`` (:mod:`lstmcy.torch._ops`), which those systems see as
  opaque operations;
- under ``torch.func`` transforms (``grad``, ``vmap``, ``jacrev``): the same operators
  inside the autograd functions of :mod:`lstmcy.torch._func`;
- under forward-mode AD (``torch.func.jvp``, ``jacfwd``, ``torch.autograd.forward_ad``):
  the differentiable reference in torch operations (:mod:`lstmcy.torch._reference`),
  since the kernels compute no tangents.

:func:`force_route` runs every call by one route instead (a test and debugging aid).
"""
import contextlib
import math
from typing import Optional, Tuple

try:
    import torch  # absolute: the real PyTorch, not this package
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("lstmcy.torch needs PyTorch: pip install torch "
                      "(from lstmcy's checkout: pip install -e '.[torch]')") from exc
from torch import Tensor, _VF, nn
from torch.autograd import forward_ad
from torch.nn.utils.rnn import PackedSequence

from lstmcy._engine.config import LSTMConfig
from lstmcy.torch import _engine as engine
from lstmcy.torch import _func, _ops, _privacy
from lstmcy.torch import _reference as reference
from lstmcy.torch import _step
from lstmcy.torch._cell import LSTMCell, training_step
from lstmcy.torch._state_dict import (config_from_state_dict, params_from_state_dict,
                                      params_to_state_dict)

__all__ = ["LSTM", "LSTMCell", "StateDtypeError", "params_from_state_dict",
           "config_from_state_dict", "params_to_state_dict"]

_KERNEL_DTYPES = (torch.float32, torch.float64)
# Computed in float32 (inputs, states and weights converted on the way in, results on
# the way out), as lstmcy's numpy API computes them.
_LOW_PRECISION_DTYPES = (torch.float16, torch.bfloat16)


class StateDtypeError(TypeError, RuntimeError):
    """A state (``h0`` or ``c0``) whose dtype is not the input's. ``nn.LSTM`` raises a
    ``RuntimeError`` from its kernel there; this is both, so that code catching either
    works with the clearer message."""


# ---------------------------------------------------------------------------
# eager route
# ---------------------------------------------------------------------------

class _LSTMFunction(torch.autograd.Function):
    """``(x, h0, c0, *weights) -> (y, h_n, c_n)`` with lstmcy's forward and backward.

    ``h0``/``c0`` may be None (zeros). ``masks`` (dropout multipliers, or None) are drawn
    by the caller from torch's generator. ``cfg`` (an :class:`lstmcy.LSTMConfig`) and
    ``hidden_size`` are the call's settings, as :mod:`lstmcy.torch._engine` takes them.
    """

    @staticmethod
    def forward(ctx, cfg, hidden_size, masks, batch_sizes, x, h0, c0, *weights):
        y, h_n, c_n, saved, problem = engine.forward(x, batch_sizes, h0, c0, weights, masks,
                                                     cfg, hidden_size, True)
        ctx.set_materialize_grads(False)
        # Saved as tensors, so autograd checks their versions and frees them after the
        # backward (a training loop's next forward then reuses the memory).
        masks = masks or ()
        ctx.save_for_backward(x, h0, c0, batch_sizes, saved, *masks, *weights)
        ctx.cfg, ctx.hidden_size = cfg, hidden_size
        ctx.num_masks = len(masks)
        ctx.problem = problem  # the checked call, for the backward (dropped there)
        return y, h_n, c_n

    @staticmethod
    def backward(ctx, dy, dh, dc):
        x, h0, c0, batch_sizes, saved, *rest = ctx.saved_tensors
        masks, weights = rest[:ctx.num_masks], rest[ctx.num_masks:]
        problem, ctx.problem = ctx.problem, None  # a retained graph's next backward rebuilds it
        needs = ctx.needs_input_grad
        output_mask = (needs[4], h0 is not None and needs[5], c0 is not None and needs[6],
                       any(needs[7:]))
        if not any(output_mask):
            return (None,) * len(needs)
        if torch.is_grad_enabled() or torch._C._functorch.peek_interpreter_stack() is not None:
            # create_graph=True: the custom operator's backward is itself differentiable;
            # gradients vmapped by torch.func (is_grads_batched): it has a vmap rule.
            dx, dh0, dc0, dweights = _ops.lstm_backward(
                x, batch_sizes, h0, c0, list(weights), list(masks), saved, dy, dh, dc,
                *_ops.layout_arguments(ctx.cfg, ctx.hidden_size), list(output_mask))
        elif _legacy_batched(dy, dh, dc):
            # The legacy vmap (autograd.functional's vectorize=True) batches only torch's
            # own operations: differentiate the reference.
            dx, dh0, dc0, dweights = reference.gradients(
                ctx.cfg, ctx.hidden_size, x, batch_sizes, h0, c0, weights, masks, dy, dh, dc)
        else:
            if problem is None:
                problem = engine.problem_for(x, batch_sizes, h0, c0, weights, ctx.cfg,
                                             ctx.hidden_size)
            dx, dh0, dc0, dweights = engine.backward(problem, saved, masks, dy, dh, dc,
                                                     output_mask)
        grads = [None, None, None, None,
                 dx if output_mask[0] else None,
                 dh0 if output_mask[1] else None,
                 dc0 if output_mask[2] else None]
        if output_mask[3]:
            grads += [g if need else None for g, need in zip(dweights, needs[7:])]
        else:
            grads += [None] * len(weights)
        return tuple(grads)


def _legacy_batched(*grads):
    """Whether a gradient is vmapped by the legacy vmap (``torch._vmap_internals``)."""
    return any(g is not None and torch._C._functorch.is_legacy_batchedtensor(g) for g in grads)


@torch.compiler.disable  # numpy and the kernels: never traced by dynamo
def _run_eager(cfg, hidden_size, masks, batch_sizes, x, h0, c0, weights, needs_grad):
    if needs_grad:
        return _LSTMFunction.apply(cfg, hidden_size, masks, batch_sizes, x, h0, c0, *weights)
    y, h_n, c_n, _, _ = engine.forward(x, batch_sizes, h0, c0, weights, masks, cfg, hidden_size,
                                       False)
    return y, h_n, c_n


@torch.compiler.disable
def _run_per_sample(per_sample, cfg, hidden_size, masks, batch_sizes, x, h0, c0, weights):
    return _privacy.PerSampleFunction.apply(per_sample, cfg, hidden_size, masks,
                                                  batch_sizes, x, h0, c0, *weights)


# ---------------------------------------------------------------------------
# call settings
# ---------------------------------------------------------------------------

_call_configs = {}


def _call_config(module, padded):
    """The :class:`lstmcy.LSTMConfig` of a call of ``module`` (an ``nn.LSTM``, or a cell
    with the same attributes) on padded input or not.

    ``batch_first`` applies to padded input only (packed input is time-ordered rows). The
    module draws its dropout masks itself from torch's generator, so the config keeps the
    defaults ``dropout=0.0`` and ``train=True``, which the torch engine does not read
    (``nn.LSTM`` allows ``p = 1``, which an ``LSTMConfig`` refuses).
    """
    if torch.compiler.is_compiling():
        # Made afresh while dynamo traces: a look-up in a shared dict would guard the
        # graph on the dict's contents, and adding to it within the traced frame fails
        # those guards.
        return _new_call_config(module, padded)
    # Eager calls share one config per settings: a dict look-up costs less per call than
    # building and checking one.
    key = (module.num_layers, module.bidirectional, module.batch_first and padded, module.bias,
           module.proj_size)
    cfg = _call_configs.get(key)
    if cfg is None:
        if len(_call_configs) >= 64:
            _call_configs.clear()
        cfg = _call_configs[key] = _new_call_config(module, padded)
    return cfg


def _new_call_config(module, padded):
    # bool(): the flags as nn.LSTM reads them (it checks bias and batch_first when made,
    # bidirectional never).
    return LSTMConfig(num_layers=module.num_layers, bidirectional=bool(module.bidirectional),
                      batch_first=bool(module.batch_first and padded), has_bias=bool(module.bias),
                      proj_size=module.proj_size)


# ---------------------------------------------------------------------------
# route choice
# ---------------------------------------------------------------------------

_EAGER, _OPERATOR, _FUNC, _REFERENCE = "eager", "operator", "func", "reference"
_ROUTES = (_EAGER, _OPERATOR, _FUNC, _REFERENCE)
_forced_route = None  # the route of every call (force_route), or None: chosen per call
# Types of the tensors (or None) that the eager route reads as numpy arrays.
_PLAIN_TYPES = frozenset((torch.Tensor, nn.Parameter, type(None)))


def _forward_mode_ad_active():
    if forward_ad._current_level >= 0:
        return True
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    return any(interpreter.key() == torch._C._functorch.TransformType.Jvp
               for interpreter in retrieve_all_functorch_interpreters())


def _route(tensors):
    """Which route runs a call on ``tensors`` (see the module docstring)."""
    if torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None:
        return _OPERATOR
    transformed = torch._C._functorch.peek_interpreter_stack() is not None
    if (transformed or forward_ad._current_level >= 0) and _forward_mode_ad_active():
        return _REFERENCE
    if transformed:
        return _FUNC
    if torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack():
        return _OPERATOR
    if not _PLAIN_TYPES.issuperset(map(type, tensors)):
        return _OPERATOR  # tensor subclasses
    return _EAGER


@contextlib.contextmanager
def force_route(route):
    """Run every :class:`LSTM` call inside the block by ``route``, whatever the context: a
    test and debugging aid (every route gives nn.LSTM's values and gradients where it can
    run; "eager" cannot run while PyTorch traces). It holds for the whole process; the ONNX
    export of a projected LSTM still takes the reference (standard operators).

    Parameters
    ----------
    route : {"eager", "operator", "func", "reference"}
        The autograd function over the kernels, the custom operators ``torch.ops.lstmcy``,
        the ``torch.func`` autograd functions over them, or the differentiable reference in
        torch operations (see the module docstring).
    """
    global _forced_route
    if route not in _ROUTES:
        raise ValueError(f"route must be one of {', '.join(map(repr, _ROUTES))}, got {route!r}")
    previous = _forced_route
    _forced_route = route
    try:
        yield
    finally:
        _forced_route = previous


# ---------------------------------------------------------------------------
# input read as nn.LSTM reads it
# ---------------------------------------------------------------------------

def _values_readable(tensor):
    """Whether the values of ``tensor`` can be read here: not while compiling, tracing,
    under a dispatch mode (fake tensors) or from a vmapped tensor."""
    return not (torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None
                or torch._C._len_torch_dispatch_stack() or type(tensor) is not torch.Tensor
                or torch._C._functorch.is_batchedtensor(tensor))


def _packed_rows(data, batch_sizes):
    """The rows of a packed sequence's ``data`` that ``nn.LSTM`` reads: the first
    ``sum(batch_sizes)`` (``aten::lstm`` ignores any beyond them and refuses fewer).
    Where the sizes cannot be read, ``data`` is passed on whole and the kernels refuse a
    row count other than their sum."""
    if not _values_readable(batch_sizes):
        return data
    rows = int(batch_sizes.sum())
    if data.shape[0] < rows:
        raise RuntimeError(f"PackedSequence data has {data.shape[0]} rows, fewer than "
                           f"sum(batch_sizes) = {rows}")
    return data[:rows] if data.shape[0] > rows else data


def _fx_proxy(values):
    """The first ``torch.fx.Proxy`` in ``values`` (tuples, lists and PackedSequences
    searched), or None."""
    for value in values:
        if isinstance(value, torch.fx.Proxy):
            return value
        if isinstance(value, (tuple, list)):
            found = _fx_proxy(value)
            if found is not None:
                return found
    return None


# ---------------------------------------------------------------------------
# the module
# ---------------------------------------------------------------------------

class LSTM(nn.LSTM):
    r"""Multi-layer LSTM with lstmcy's CPU kernels: a drop-in for :class:`torch.nn.LSTM`.

    Same constructor, parameters (``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
    ``bias_hh_l{k}`` and their ``_reverse`` twins), initialisation, ``state_dict`` and
    ``forward`` signature and results as ``torch.nn.LSTM``; an instance *is* a
    ``torch.nn.LSTM`` (subclass).

    Parameters
    ----------
    input_size : int
        Features of the input ``x``.
    hidden_size : int
        Features of the hidden state ``h``.
    num_layers : int, default 1
        Stacked LSTM layers.
    bias : bool, default True
        Whether the layers have ``b_ih`` and ``b_hh``.
    batch_first : bool, default False
        Input and output are ``[B, T, F]`` instead of ``[T, B, F]`` (not the states).
    dropout : float in [0, 1], default 0.0
        Dropout on each layer's output except the last, in training mode. The masks are
        drawn from torch's default generator exactly as ``torch.nn.LSTM`` draws them, so
        ``torch.manual_seed`` makes runs reproducible (and, in float64, equal to
        ``torch.nn.LSTM``'s).
    bidirectional : bool, default False
        Run a reverse direction too; outputs are concatenated on the feature axis.
    proj_size : int, default 0
        If positive, each layer's output is projected to ``proj_size`` features
        (``h_t = W_hr (o_t * tanh(c_t))``, LSTMP), as in ``torch.nn.LSTM``: ``h0`` and
        ``h_n`` have ``proj_size`` features, ``c0`` and ``c_n`` ``hidden_size``.
    device, dtype
        As for ``torch.nn.LSTM``. Only the CPU runs forward; float32 and float64 are
        computed natively, float16 and bfloat16 in float32 (results rounded to the
        module's dtype).

    Notes
    -----
    ``forward(input, hx=None)`` takes a tensor (``[T, B, I]``, ``[B, T, I]`` if
    ``batch_first``, or unbatched ``[T, I]``) or a
    :class:`~torch.nn.utils.rnn.PackedSequence` (sorted or not), and ``hx = (h0, c0)``
    each ``[num_layers * D, B, H]``; it returns ``output, (h_n, c_n)`` as
    ``torch.nn.LSTM`` does. Tensors on another device raise ``ValueError``, integer or
    complex ones ``TypeError``, and a sequence of length 0 ``RuntimeError``, as
    ``torch.nn.LSTM``'s.

    Gradients of any order: second derivatives (``create_graph=True``,
    ``torch.func.hessian``) and forward-mode derivatives are computed through a
    differentiable LSTM in torch operations (:mod:`lstmcy.torch._reference`), first
    derivatives by lstmcy's kernels. ``torch.compile``, ``torch.export``,
    ``torch.jit.trace`` and ``torch.func`` see the kernels as the custom operators
    ``torch.ops.lstmcy.lstm_forward`` and ``lstm_backward``; ``torch.fx.symbolic_trace``
    records the module as one ``call_module`` node, as it records ``torch.nn.LSTM``.

    The weights computed with are ``_flat_weights``, as for ``torch.nn.LSTM``: a list
    assigned or edited directly, tensors swapped in by ``torch.func.functional_call``,
    pruned and parametrized weights are used.

    Examples
    --------
    >>> import torch
    >>> from lstmcy.torch import LSTM
    >>> lstm = LSTM(8, 16, num_layers=2, batch_first=True)
    >>> out, (h_n, c_n) = lstm(torch.randn(4, 10, 8))
    >>> out.shape, h_n.shape
    (torch.Size([4, 10, 16]), torch.Size([2, 4, 16]))
    """

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__(input_size, hidden_size, num_layers=num_layers, bias=bias,
                         batch_first=batch_first, dropout=dropout, bidirectional=bidirectional,
                         proj_size=proj_size, device=device, dtype=dtype)
        self._step_views = None  # numpy views of the weights (lstmcy.torch._step.weight_views)
        self._step_last = None  # the last one-step inference's states (lstmcy.torch._step)
        self._step_kernel = None  # and its kernel object

    def __getstate__(self):
        # The numpy views are of this instance's tensors: a copy (deepcopy, pickle) makes
        # its own.
        state = dict(super().__getstate__())
        state["_step_views"] = state["_step_last"] = state["_step_kernel"] = None
        state.pop("_step_params", None)  # a non-leaf tensor: kept only for these views
        return state

    def _weights(self):
        """The tensors ``nn.LSTM`` computes with: its ``_flat_weights``, first brought up to
        date as ``nn.LSTM.forward`` does (``_update_flat_weights``).

        The list is rebuilt from the attributes it names when one of them is no longer the
        tensor it was built from (``torch.func.functional_call``, a parametrization such as
        weight norm); ``nn.LSTM.__setattr__`` and ``_apply`` keep it in step with assigned
        weights, pruning's recomputed ones and ``.to()``. A list assigned or edited directly
        is used as it is, as ``nn.LSTM`` uses it. (The attributes are read from
        ``_parameters`` where they are there: cheaper than ``Module.__getattr__``.)
        """
        params = self._parameters
        for name, ref in zip(self._flat_weights_names, self._flat_weight_refs, strict=True):
            weight = params[name] if name in params else getattr(self, name, None)
            if weight is not None and ref is not None and ref() is not weight:
                self._init_flat_weights()
                break
        return self._flat_weights

    def _check_state_sizes(self, hx, batch):
        """``nn.LSTM``'s check of ``hx``'s sizes, the batch only if given."""
        states = self.num_layers * (2 if self.bidirectional else 1)
        for k, (state, size) in enumerate(zip(hx, (self.proj_size or self.hidden_size,
                                                   self.hidden_size))):
            if (state.size(0) != states or state.size(2) != size
                    or (batch is not None and state.size(1) != batch)):
                raise RuntimeError(f"Expected hidden[{k}] size "
                                   f"({states}, {'batch' if batch is None else batch}, {size}), "
                                   f"got {list(state.size())}")

    def _check_runnable(self, input, hx, weights):
        if not input.is_cpu:
            raise ValueError(f"input is on {input.device}: lstmcy.torch.LSTM runs on the CPU only "
                             f"(use torch.nn.LSTM, with the same state_dict, on other devices)")
        dtype = input.dtype
        if dtype not in _KERNEL_DTYPES and dtype not in _LOW_PRECISION_DTYPES:
            raise TypeError(f"input has dtype {input.dtype}: lstmcy.torch.LSTM supports "
                            f"torch.float32 and torch.float64 (and float16 / bfloat16, "
                            f"computed in float32)")
        for name, weight in zip(self._flat_weights_names, weights):
            if not weight.is_cpu:
                raise ValueError(f"parameter {name} is on {weight.device}: lstmcy.torch.LSTM "
                                 f"runs on the CPU only")
            if weight.dtype != dtype:
                raise TypeError(f"parameter {name} has dtype {weight.dtype} but input has "
                                f"{input.dtype}: convert one of them")
        if hx is not None:
            for name, state in zip(("hx[0] (h0)", "hx[1] (c0)"), hx):
                if not state.is_cpu:
                    raise ValueError(f"{name} is on {state.device}: lstmcy.torch.LSTM runs on "
                                     f"the CPU only")
                if state.dtype != dtype:
                    raise StateDtypeError(f"{name} has dtype {state.dtype} but input has "
                                          f"{input.dtype}")

    # The signatures TorchScript compiles ``forward`` for, as ``nn.LSTM`` declares them.
    @torch._jit_internal._overload_method
    def forward(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]] = None
                ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        pass

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: PackedSequence, hx: Optional[Tuple[Tensor, Tensor]] = None
                ) -> Tuple[PackedSequence, Tuple[Tensor, Tensor]]:
        pass

    def forward(self, input, hx=None):  # noqa: F811
        """Run the LSTM; same arguments and results as :meth:`torch.nn.LSTM.forward`."""
        if torch.jit.is_scripting():
            # TorchScript compiles this branch alone: a scripted module computes with
            # PyTorch's LSTM kernel (aten::lstm), as a scripted nn.LSTM does.
            return self._scripted_forward(input, hx)
        step = self._one_step(input, hx)  # plain eager only: never while exporting
        if step is not None:
            return step
        if torch.onnx.is_in_onnx_export() and self.proj_size == 0:
            # Exported as nn.LSTM is: ONNX's LSTM operator (which has no projection; a
            # projected LSTM is exported from the torch-operations LSTM, see _run).
            return super().forward(input, hx)
        proxy = _fx_proxy((input, hx))
        if proxy is not None:
            return self._fx_call(proxy.tracer, input, hx)
        if isinstance(hx, (tuple, list)) and len(hx) != 2:
            raise RuntimeError("lstm expects two hidden states")  # as torch.nn.LSTM
        weights = self._weights()
        packed = isinstance(input, PackedSequence)
        # Per-sample gradients (ExpandedWeights, Opacus): the weights unwrapped.
        per_sample = _privacy.per_sample_mode(self, weights, input)
        if per_sample is not None:
            weights = per_sample.weights
        sorted_indices = unsorted_indices = None
        is_batched = True
        if packed:
            data, batch_sizes, sorted_indices, unsorted_indices = input
            data = _packed_rows(data, batch_sizes)
            if hx is not None:
                if hx[0].dim() != 3 or hx[1].dim() != 3:
                    raise RuntimeError("For a PackedSequence, hx and cx should be 3-D but got "
                                       f"({hx[0].dim()}-D, {hx[1].dim()}-D) tensors")
                if torch.compiler.is_compiling():
                    # nn.LSTM's check compares the states' batch with batch_sizes[0], a
                    # value dynamo cannot read: the batch is checked against the sorting
                    # permutation's length (a shape) if there is one, else by the operator
                    # when it runs.
                    self.check_input(data, batch_sizes)
                    self._check_state_sizes(
                        hx, None if sorted_indices is None else sorted_indices.size(0))
                else:
                    self.check_forward_args(data, hx, batch_sizes)
                hx = self.permute_hidden(hx, sorted_indices)
            else:
                self.check_input(data, batch_sizes)
        else:
            if input.dim() not in (2, 3):
                raise ValueError(f"LSTM: Expected input to be 2D or 3D, got {input.dim()}D instead")
            data, batch_sizes = input, None
            is_batched = input.dim() == 3
            if not is_batched:
                data = input.unsqueeze(0 if self.batch_first else 1)
            if hx is None:
                self.check_input(data, None)
            else:
                want = 3 if is_batched else 2
                if hx[0].dim() != want or hx[1].dim() != want:
                    kind = "batched 3-D" if is_batched else "unbatched 2-D"
                    raise RuntimeError(f"For {kind} input, hx and cx should also be {want}-D but "
                                       f"got ({hx[0].dim()}-D, {hx[1].dim()}-D) tensors")
                if not is_batched:
                    hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
                self.check_forward_args(data, hx, None)
        self._check_runnable(data, hx, weights)

        if per_sample is not None and packed:
            per_sample.unsorted_indices = unsorted_indices
        output, h_n, c_n = self._run(data, batch_sizes, hx, weights, per_sample)

        if packed:
            output = PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices)
            return output, self.permute_hidden((h_n, c_n), unsorted_indices)
        if not is_batched:
            output = output.squeeze(0 if self.batch_first else 1)
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return output, (h_n, c_n)

    @torch._jit_internal._overload_method
    def _scripted_forward(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]]
                          ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        pass

    @torch._jit_internal._overload_method  # noqa: F811
    def _scripted_forward(self, input: PackedSequence, hx: Optional[Tuple[Tensor, Tensor]]
                          ) -> Tuple[PackedSequence, Tuple[Tensor, Tensor]]:
        pass

    def _scripted_forward(self, input, hx):  # noqa: F811
        """``nn.LSTM.forward`` in TorchScript: ``aten::lstm`` on ``_flat_weights``
        (compiled by ``torch.jit.script`` only; never run in Python)."""
        self._update_flat_weights()
        orig_input = input
        batch_sizes: Optional[Tensor] = None
        sorted_indices: Optional[Tensor] = None
        unsorted_indices: Optional[Tensor] = None
        is_batched = True
        # isinstance in a condition: TorchScript refines the type in each overload.
        if isinstance(orig_input, PackedSequence):
            input, batch_sizes, sorted_indices, unsorted_indices = input
            batch = int(batch_sizes[0])
        else:
            if input.dim() not in (2, 3):
                raise ValueError(f"LSTM: Expected input to be 2D or 3D, got {input.dim()}D instead")
            is_batched = input.dim() == 3
            if not is_batched:
                input = input.unsqueeze(0 if self.batch_first else 1)
            batch = input.size(0) if self.batch_first else input.size(1)
        if hx is None:
            states = self.num_layers * (2 if self.bidirectional else 1)
            h_size = self.proj_size if self.proj_size > 0 else self.hidden_size
            hx = (torch.zeros(states, batch, h_size, dtype=input.dtype, device=input.device),
                  torch.zeros(states, batch, self.hidden_size, dtype=input.dtype,
                              device=input.device))
        else:
            want = 3 if is_batched else 2
            if hx[0].dim() != want or hx[1].dim() != want:
                raise RuntimeError(f"hx and cx should be {want}-D tensors, got "
                                   f"({hx[0].dim()}-D, {hx[1].dim()}-D)")
            if not is_batched:
                hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
            self.check_forward_args(input, hx, batch_sizes)
            hx = self.permute_hidden(hx, sorted_indices)
        if batch_sizes is None:
            result = _VF.lstm(input, hx, self._flat_weights, self.bias, self.num_layers,
                              self.dropout, self.training, self.bidirectional, self.batch_first)
        else:
            result = _VF.lstm(input, batch_sizes, hx, self._flat_weights, self.bias,
                              self.num_layers, self.dropout, self.training, self.bidirectional)
        output = result[0]
        hidden = (result[1], result[2])
        if isinstance(orig_input, PackedSequence):
            return (PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices),
                    self.permute_hidden(hidden, unsorted_indices))
        if not is_batched:
            return (output.squeeze(0 if self.batch_first else 1),
                    (hidden[0].squeeze(1), hidden[1].squeeze(1)))
        return output, hidden

    def _fx_call(self, tracer, input, hx):
        """The ``call_module`` node ``torch.fx`` records for ``nn.LSTM``, which its
        default rule keeps whole as a module of ``torch.nn``: the graph calls this module,
        which runs as it does outside the graph."""
        if tracer.root is self:
            raise torch.fx.proxy.TraceError(
                "lstmcy.torch.LSTM is traced as torch.nn.LSTM is, as one call of the module: "
                "trace a model that holds it")
        args = (input,) if hx is None else (input, hx)
        return tracer.create_proxy("call_module", tracer.path_of_module(self), args, {})

    def _one_step(self, input, hx):
        """A one-step call of a one-layer, one-direction LSTM without projection on the
        step kernel objects: ``(output, (h_n, c_n))``, or None for any other call (which
        runs the full path, with its checks). Inference runs on :mod:`lstmcy.torch._step`,
        a step that autograd records as one node whose outputs are the call's three
        tensors (:func:`lstmcy.torch._cell.training_step`)."""
        if (type(input) is not torch.Tensor or input.dim() != 3 or self.num_layers != 1
                or self.bidirectional or self.proj_size or _forced_route is not None):
            return None
        batch_first = self.batch_first
        B, T = (input.shape[0], input.shape[1]) if batch_first else (input.shape[1],
                                                                    input.shape[0])
        H = self.hidden_size
        if T != 1 or B == 0 or input.shape[2] != self.input_size:
            return None
        if not _step.plain_eager():
            return None
        if _step.recording():
            return self._training_step(input, hx, B, H)
        views = _step.weight_views(self, self._weights())
        if views is None:
            return None
        out = _step.infer(self, views, input, hx, B, self.input_size, H, batch_first)
        if out is None:
            return None
        y, h1, c1 = out  # y: h_n's copy, as aten::lstm's are two tensors
        h_n, c_n = torch.from_numpy(h1), torch.from_numpy(c1)
        _step.remember(self, h_n, h1, c_n, c1)
        return torch.from_numpy(y), (h_n, c_n)

    def _training_step(self, input, hx, B, H):
        """:meth:`_one_step` with gradients (``input`` one step of ``B`` rows): one
        autograd node (:class:`lstmcy.torch._cell._SequenceStep`) whose three outputs
        are ``output``, ``h_n`` and ``c_n``, or None where the call is not the plain
        case."""
        if self._backward_hooks:  # Opacus's per-sample hooks, among others: the full path
            return None
        weights = self._weights()
        views = _step.weight_views(self, weights)  # None for ExpandedWeights, among others
        if views is None or input.dtype is not weights[0].dtype or not input.is_cpu:
            return None
        states = _step.plain_states(hx, input.dtype, (1, B, H))
        if states is None:
            return None
        h0, c0 = states
        output, h_n, c_n = training_step(self, input, h0, c0, weights, views,
                                         bool(self.batch_first))
        return output, (h_n, c_n)

    def _run(self, data, batch_sizes, hx, weights, per_sample=None):
        cfg = _call_config(self, batch_sizes is None)
        hidden_size = self.hidden_size
        masks = self._dropout_masks(data, cfg)
        h0, c0 = (None, None) if hx is None else hx
        dtype = data.dtype
        if dtype in _LOW_PRECISION_DTYPES:
            # Differentiable conversions: autograd rounds the gradients back to dtype.
            data, h0, c0 = (None if t is None else t.float() for t in (data, h0, c0))
            weights = [w.float() for w in weights]
            masks = None if masks is None else [m.float() for m in masks]
        # ONNX export of a projected LSTM: standard operators, step by step.
        route = (_REFERENCE if torch.onnx.is_in_onnx_export()
                 else _forced_route or _route([data, h0, c0, *weights]))
        if route == _REFERENCE:
            y, h_n, c_n = reference.lstm(
                data, None if h0 is None else (h0, c0), weights, hidden_size=hidden_size,
                num_layers=cfg.num_layers, bidirectional=cfg.bidirectional,
                has_bias=cfg.has_bias, batch_first=cfg.batch_first, batch_sizes=batch_sizes,
                masks=masks, proj_size=cfg.proj_size)
        else:
            needs_grad = (data.requires_grad or any(w.requires_grad for w in weights)
                          or (h0 is not None and (h0.requires_grad or c0.requires_grad)))
            # A trace records the operator for use with and without grad (and jit.trace
            # checks it by tracing again under no_grad): keep the activations whenever
            # something requires grad. Inference mode records nothing, even with grad
            # mode on.
            needs_grad = needs_grad and (_step.recording() or torch.jit.is_tracing())
            if per_sample is not None and needs_grad and route == _EAGER:
                y, h_n, c_n = _run_per_sample(per_sample, cfg, hidden_size, masks, batch_sizes,
                                              data, h0, c0, weights)
            elif route == _FUNC and needs_grad:
                y, h_n, c_n = _func.lstm(cfg, hidden_size, data, batch_sizes, h0, c0,
                                               weights, masks)
            elif route != _EAGER:
                y, h_n, c_n, _ = _ops.lstm_forward(
                    data, batch_sizes, h0, c0, weights, masks or [],
                    *_ops.layout_arguments(cfg, hidden_size), needs_grad)
            else:
                y, h_n, c_n = _run_eager(cfg, hidden_size, masks, batch_sizes, data, h0, c0,
                                         weights, needs_grad)
        if dtype in _LOW_PRECISION_DTYPES:
            y, h_n, c_n = y.to(dtype), h_n.to(dtype), c_n.to(dtype)
        return y, h_n, c_n

    def _dropout_masks(self, data, cfg):
        """Dropout multipliers drawn from torch's generator exactly as ``aten::lstm``
        draws them (or None: no dropout).

        ``aten::lstm`` applies ``at::dropout`` to every layer output but the last: for
        ``0 < p < 1``, ``noise = empty_like(output).bernoulli_(1 - p).div_(1 - p)``, where
        ``output`` is the packed data ``[N, D*H]`` or the time-major ``[T, B, D*H]`` layer
        output; for ``p = 1`` it multiplies by zero and draws nothing; an empty output is
        left as it is. Drawing tensors of the same shapes and dtype in the same order
        consumes torch's random stream identically.
        """
        p = float(self.dropout)
        if not (self.training and p > 0 and self.num_layers > 1):
            return None
        features = cfg.num_directions * (cfg.proj_size or self.hidden_size)
        if data.dim() == 2:  # packed
            shape = (data.shape[0], features)
        elif cfg.batch_first:
            shape = (data.shape[1], data.shape[0], features)
        else:
            shape = (data.shape[0], data.shape[1], features)
        if math.prod(shape) == 0:
            return None
        if p >= 1.0:
            return [torch.zeros(shape, dtype=data.dtype) for _ in range(self.num_layers - 1)]
        masks = []
        for _ in range(self.num_layers - 1):
            noise = torch.empty(shape, dtype=data.dtype)
            noise.bernoulli_(1.0 - p).div_(1.0 - p)
            masks.append(noise)
        return masks


try:  # eager-mode quantization (deprecated in PyTorch, which may drop it)
    from lstmcy.torch._quantization import register_for_dynamic_quantization
except ImportError:  # pragma: no cover - depends on the PyTorch version
    pass
else:
    register_for_dynamic_quantization(LSTM)

_privacy.register_opacus(LSTM)
