"""PyTorch drop-in: :class:`LSTM`, a ``torch.nn.LSTM`` computed by lstmcy's kernels.

This module needs PyTorch (the ``lstmcy[torch]`` extra) and is only imported when asked
for explicitly (``import lstmcy.torch`` or ``from lstmcy.torch import LSTM``);
``import lstmcy`` never imports torch.

:class:`LSTM` subclasses :class:`torch.nn.LSTM`, so its parameters, their names,
initialisation and ``state_dict`` are exactly those of ``torch.nn.LSTM`` (either's
``state_dict`` loads into the other, and under the same ``torch.manual_seed`` both start
from the same weights). Only ``forward`` differs: it runs :func:`lstmcy.lstm_forward` and,
through a :class:`torch.autograd.Function`, :func:`lstmcy.lstm_backward`. Tensors are
shared with numpy without copies (``Tensor.numpy`` / ``torch.from_numpy``).

For numpy users, :func:`params_from_state_dict`, :func:`config_from_state_dict` and
:func:`params_to_state_dict` convert between an ``nn.LSTM`` ``state_dict`` and lstmcy's
``params`` list.
"""
# Absolute imports throughout: this module is itself called ``torch`` inside the package.
import functools
from collections import OrderedDict

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("lstmcy.torch needs PyTorch: pip install 'lstmcy[torch]'") from exc
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.utils.rnn import PackedSequence

from lstmcy._core import _block_reader, _thread_plan, lstm_backward, lstm_forward
from lstmcy._validation import trusted_problem

__all__ = ["LSTM", "params_from_state_dict", "config_from_state_dict", "params_to_state_dict"]

_SUPPORTED_DTYPES = (torch.float32, torch.float64)
_GATE_KEYS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


# ---------------------------------------------------------------------------
# numpy side: one forward, one backward, with or without dropout between layers
# ---------------------------------------------------------------------------

class _Config:
    """The static arguments of one call (shared by forward and backward)."""

    __slots__ = ("hidden_size", "num_layers", "bidirectional", "has_bias", "batch_first",
                 "batch_sizes", "num_directions", "per_direction")

    def __init__(self, hidden_size, num_layers, bidirectional, has_bias, batch_first, batch_sizes):
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bidirectional = bidirectional
        self.has_bias = has_bias
        self.batch_first = batch_first
        self.batch_sizes = batch_sizes          # numpy int64 [T] or None
        self.num_directions = 2 if bidirectional else 1
        self.per_direction = 4 if has_bias else 2

    def kwargs(self, num_layers=None):
        """Keyword arguments of ``lstm_forward`` / ``lstm_backward`` (dropout is done here)."""
        return dict(has_bias=self.has_bias,
                    num_layers=self.num_layers if num_layers is None else num_layers,
                    bidirectional=self.bidirectional, batch_first=self.batch_first,
                    batch_sizes=self.batch_sizes)

    def layer_params(self, params, layer):
        width = self.num_directions * self.per_direction
        return params[layer * width:(layer + 1) * width]

    def layer_states(self, state, layer):
        if state is None:
            return None
        D = self.num_directions
        return state[layer * D:(layer + 1) * D]


def _mask_in_output_layout(mask, cfg):
    """A mask drawn in torch's internal layout ([T, B, F] or packed [N, F]) as a numpy
    view in the layout of lstmcy's layer output (batch-first when ``batch_first``)."""
    m = mask.numpy()
    if cfg.batch_first and cfg.batch_sizes is None:
        m = m.transpose(1, 0, 2)
    return m


def _trusted(cfg, masks):
    """Whether a call takes the path without lstmcy's argument checks (padded input, no
    dropout masks): the module has checked every tensor as nn.LSTM does."""
    return masks is None and cfg.batch_sizes is None


def _forward(x, hx, params, cfg, masks, train):
    """Run the LSTM on numpy arrays.

    ``masks`` is None (no dropout) or one numpy multiplier per layer boundary, shaped like
    a layer's output. Returns ``y, h_n, c_n, saved`` where ``saved`` is what
    :func:`_backward` needs (None when ``train`` is False).
    """
    if _trusted(cfg, masks):
        # The module has checked every tensor as nn.LSTM does: skip lstmcy's argument
        # checks (tens of microseconds a step at small shapes) and keep the problem for
        # the backward, which then needs no checks either (autograd's version counters
        # guard the tensors it views).
        h0, c0 = hx if hx is not None else (None, None)
        problem = trusted_problem(x, h0, c0, params, hidden_size=cfg.hidden_size,
                                  has_bias=cfg.has_bias,
                                  num_layers=cfg.num_layers, bidirectional=cfg.bidirectional,
                                  batch_first=cfg.batch_first)
        y, h_n, c_n, saved_block = _thread_plan()._run_forward(problem, train, None)
        return y, h_n, c_n, (problem, saved_block) if train else None
    if masks is None:
        y, h_n, c_n, cache = lstm_forward(x, hx, params, train=train, **cfg.kwargs())
        return y, h_n, c_n, cache
    # Dropout between layers: run layer by layer, applying torch's masks in between.
    h0, c0 = hx if hx is not None else (None, None)
    layer_inputs, caches, h_parts, c_parts = [], [], [], []
    layer_in = x
    for layer in range(cfg.num_layers):
        layer_hx = None if h0 is None else (cfg.layer_states(h0, layer), cfg.layer_states(c0, layer))
        y, h_n, c_n, cache = lstm_forward(layer_in, layer_hx, cfg.layer_params(params, layer),
                                          train=train, **cfg.kwargs(num_layers=1))
        layer_inputs.append(layer_in)
        caches.append(cache)
        h_parts.append(h_n)
        c_parts.append(c_n)
        if layer < cfg.num_layers - 1:
            layer_in = y * masks[layer]
    h_n = np.concatenate(h_parts) if len(h_parts) > 1 else h_parts[0]
    c_n = np.concatenate(c_parts) if len(c_parts) > 1 else c_parts[0]
    return y, h_n, c_n, (layer_inputs, caches) if train else None


def _backward(x, hx, params, cfg, masks, saved, dy, dh, dc, output_mask):
    """Gradients for :func:`_forward`'s outputs; ``dh``/``dc`` may be None (zeros). On the
    trusted path ``x``, ``hx`` and ``params`` are unused (the forward's problem holds
    them) and may be None."""
    if _trusted(cfg, masks):
        problem, saved_block = saved
        arrays = {"dy": dy}
        if dh is not None:
            arrays["dh"] = dh
        if dc is not None:
            arrays["dc"] = dc
        return _thread_plan()._run_backward(problem, _block_reader(saved_block, problem),
                                            arrays, output_mask)
    if masks is None:
        return lstm_backward(x, hx, params, dy, dh, dc, *saved.saved(),
                             output_mask=output_mask, **cfg.kwargs())
    layer_inputs, caches = saved
    want_dx, want_dh, want_dc, want_dparams = output_mask
    L = cfg.num_layers
    h0, c0 = hx if hx is not None else (None, None)
    dh_parts, dc_parts, dparam_parts = [None] * L, [None] * L, [None] * L
    upper = dy
    dx = None
    for layer in reversed(range(L)):
        layer_hx = None if h0 is None else (cfg.layer_states(h0, layer), cfg.layer_states(c0, layer))
        mask = (want_dx or layer > 0, want_dh, want_dc, want_dparams)
        d_in, dh_parts[layer], dc_parts[layer], dparam_parts[layer] = lstm_backward(
            layer_inputs[layer], layer_hx, cfg.layer_params(params, layer), upper,
            cfg.layer_states(dh, layer), cfg.layer_states(dc, layer), *caches[layer].saved(),
            output_mask=mask, **cfg.kwargs(num_layers=1))
        if layer > 0:
            d_in *= masks[layer - 1]
            upper = d_in
        else:
            dx = d_in
    dh_prev = np.concatenate(dh_parts) if want_dh else None
    dc_prev = np.concatenate(dc_parts) if want_dc else None
    dparams = [g for part in dparam_parts for g in part] if want_dparams else None
    return dx, dh_prev, dc_prev, dparams


# ---------------------------------------------------------------------------
# autograd
# ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=2)  # the last shapes only: a large model's y is megabytes
def _zeros(shape, dtype):
    """A read-only zero gradient (the loss did not use ``y``): shared between calls, since
    a fresh one of this size costs page faults on every step, and lstm_backward only
    reads it."""
    zeros = np.zeros(shape, dtype=dtype)
    zeros.flags.writeable = False
    return zeros


def _np(tensor):
    """Zero-copy numpy view of a CPU tensor (None stays None)."""
    return None if tensor is None else tensor.detach().numpy()


class _LSTMFunction(torch.autograd.Function):
    """``(x, h0, c0, *weights) -> (y, h_n, c_n)`` with lstmcy's forward and backward.

    ``h0``/``c0`` may be None (zeros). ``masks`` (numpy dropout multipliers or None) are
    drawn by the caller so that they come from torch's generator.
    """

    @staticmethod
    def forward(ctx, cfg, masks, x, h0, c0, *weights):
        params = [w.detach().numpy() for w in weights]
        hx = None if h0 is None else (_np(h0), _np(c0))
        x_np = x.detach().numpy()
        y, h_n, c_n, saved = _forward(x_np, hx, params, cfg, masks, train=True)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, h0, c0, *weights)
        ctx.cfg = cfg
        ctx.masks = masks
        ctx.saved = saved
        ctx.y_shape = y.shape
        ctx.y_dtype = y.dtype
        return torch.from_numpy(y), torch.from_numpy(h_n), torch.from_numpy(c_n)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh, dc):
        x, h0, c0, *weights = ctx.saved_tensors
        needs = ctx.needs_input_grad
        want_dx = needs[2]
        want_dh = h0 is not None and needs[3]
        want_dc = c0 is not None and needs[4]
        want_dparams = any(needs[5:])
        if not (want_dx or want_dh or want_dc or want_dparams):
            return (None,) * len(needs)
        if _trusted(ctx.cfg, ctx.masks):
            x_np = hx = params = None  # in the forward's problem (saved_tensors checked them)
        else:
            x_np = _np(x)
            params = [_np(w) for w in weights]
            hx = None if h0 is None else (_np(h0), _np(c0))
        dy_np = _zeros(ctx.y_shape, ctx.y_dtype) if dy is None else _np(dy)
        dx, dh0, dc0, dparams = _backward(
            x_np, hx, params, ctx.cfg, ctx.masks, ctx.saved, dy_np, _np(dh), _np(dc),
            (want_dx, want_dh, want_dc, want_dparams))
        grads = [None, None,
                 torch.from_numpy(dx) if want_dx else None,
                 torch.from_numpy(dh0) if want_dh else None,
                 torch.from_numpy(dc0) if want_dc else None]
        if want_dparams:
            grads += [torch.from_numpy(g) if need else None for g, need in zip(dparams, needs[5:])]
        else:
            grads += [None] * len(weights)
        return tuple(grads)


# ---------------------------------------------------------------------------
# the module
# ---------------------------------------------------------------------------

class LSTM(nn.LSTM):
    r"""Multi-layer LSTM with lstmcy's CPU kernels: a drop-in for :class:`torch.nn.LSTM`.

    Same constructor, parameters (``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
    ``bias_hh_l{k}`` and their ``_reverse`` twins), initialisation, ``state_dict`` and
    ``forward`` signature and results as ``torch.nn.LSTM``; an instance *is* a
    ``torch.nn.LSTM`` (subclass). Forward and backward are computed by
    :func:`lstmcy.lstm_forward` and :func:`lstmcy.lstm_backward`.

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
    dropout : float, default 0.0
        Dropout on each layer's output except the last, in training mode. The masks are
        drawn from torch's default generator exactly as ``torch.nn.LSTM`` draws them, so
        ``torch.manual_seed`` makes runs reproducible (and, in float64, equal to
        ``torch.nn.LSTM``'s).
    bidirectional : bool, default False
        Run a reverse direction too; outputs are concatenated on the feature axis.
    proj_size : int, default 0
        Must be 0: projections are not supported.
    device, dtype
        As for ``torch.nn.LSTM``; only the CPU and float32 / float64 can run forward.

    Notes
    -----
    ``forward(input, hx=None)`` takes a tensor (``[T, B, I]``, ``[B, T, I]`` if
    ``batch_first``, or unbatched ``[T, I]``) or a
    :class:`~torch.nn.utils.rnn.PackedSequence` (sorted or not), and ``hx = (h0, c0)``
    each ``[num_layers * D, B, H]``; it returns ``output, (h_n, c_n)`` as
    ``torch.nn.LSTM`` does. Tensors on another device, or with a dtype other than
    float32 / float64, raise ``ValueError`` / ``TypeError``. Double backward is not
    supported.

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
        if proj_size != 0:
            raise ValueError(f"proj_size must be 0: lstmcy.torch.LSTM has no projections "
                             f"(got proj_size={proj_size}); use torch.nn.LSTM")
        super().__init__(input_size, hidden_size, num_layers=num_layers, bias=bias,
                         batch_first=batch_first, dropout=dropout, bidirectional=bidirectional,
                         proj_size=0, device=device, dtype=dtype)

    def _weights(self):
        """The flat weights, in ``_flat_weights_names`` order, read as ``nn.LSTM`` reads
        them: tensors swapped in by ``torch.func.functional_call`` and attributes that
        replace a parameter (weight norm) included. (Cheaper than ``nn.LSTM``'s
        ``_update_flat_weights``, which goes through ``Module.__getattr__`` twice per
        weight on every call.)"""
        params = self._parameters
        return [params[name] if name in params else getattr(self, name)
                for name in self._flat_weights_names]

    def _check_runnable(self, input, hx, weights):
        if not input.is_cpu:
            raise ValueError(f"input is on {input.device}: lstmcy.torch.LSTM runs on the CPU only "
                             f"(use torch.nn.LSTM, with the same state_dict, on other devices)")
        dtype = input.dtype
        if dtype not in _SUPPORTED_DTYPES:
            raise TypeError(f"input has dtype {input.dtype}: lstmcy.torch.LSTM supports "
                            f"torch.float32 and torch.float64")
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
                    raise TypeError(f"{name} has dtype {state.dtype} but input has {input.dtype}")

    def forward(self, input, hx=None):
        """Run the LSTM; same arguments and results as :meth:`torch.nn.LSTM.forward`."""
        weights = self._weights()
        packed = isinstance(input, PackedSequence)
        sorted_indices = unsorted_indices = None
        is_batched = True
        if packed:
            data, batch_sizes, sorted_indices, unsorted_indices = input
            if hx is not None:
                if hx[0].dim() != 3 or hx[1].dim() != 3:
                    raise RuntimeError("For a PackedSequence, hx and cx should be 3-D but got "
                                       f"({hx[0].dim()}-D, {hx[1].dim()}-D) tensors")
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

        output, h_n, c_n = self._run(data, batch_sizes, hx, weights)

        if packed:
            output = PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices)
            return output, self.permute_hidden((h_n, c_n), unsorted_indices)
        if not is_batched:
            output = output.squeeze(0 if self.batch_first else 1)
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return output, (h_n, c_n)

    def _run(self, data, batch_sizes, hx, weights):
        cfg = _Config(self.hidden_size, self.num_layers, self.bidirectional, self.bias,
                      self.batch_first and batch_sizes is None,
                      None if batch_sizes is None else batch_sizes.numpy())
        masks = None
        if self.training and self.dropout > 0 and self.num_layers > 1:
            masks = _draw_masks(_internal_output_shape(data, cfg, self.hidden_size), data.dtype,
                                cfg, float(self.dropout))
        h0, c0 = (None, None) if hx is None else hx
        needs_grad = torch.is_grad_enabled() and (
            data.requires_grad or any(w.requires_grad for w in weights)
            or (hx is not None and (h0.requires_grad or c0.requires_grad)))
        if needs_grad:
            return _LSTMFunction.apply(cfg, masks, data, h0, c0, *weights)
        # Inference (or nothing requires grad): no activations kept.
        hx_np = None if hx is None else (_np(h0), _np(c0))
        y, h_n, c_n, _ = _forward(_np(data), hx_np, [_np(w) for w in weights], cfg, masks,
                                  train=False)
        return torch.from_numpy(y), torch.from_numpy(h_n), torch.from_numpy(c_n)


def _internal_output_shape(data, cfg, hidden_size):
    """Shape of a layer's output inside ``aten::lstm`` (packed, or time-major)."""
    features = cfg.num_directions * hidden_size
    if cfg.batch_sizes is not None:
        return (data.shape[0], features)
    if cfg.batch_first:
        return (data.shape[1], data.shape[0], features)
    return (data.shape[0], data.shape[1], features)


def _draw_masks(shape, dtype, cfg, dropout):
    """Dropout multipliers drawn from torch's generator, exactly as ``aten::lstm`` does.

    ``aten::lstm`` on the CPU applies ``at::dropout`` to every layer output but the last:
    ``noise = empty_like(output).bernoulli_(1 - p).div_(1 - p)`` where ``output`` is the
    packed data ``[N, D*H]`` or the time-major ``[T, B, D*H]`` layer output. Drawing
    tensors of the same shapes and dtype in the same order consumes torch's random stream
    identically. Returned as numpy views in the layout of lstmcy's layer outputs.
    """
    masks = []
    for _ in range(cfg.num_layers - 1):
        noise = torch.empty(shape, dtype=dtype)
        noise.bernoulli_(1.0 - dropout).div_(1.0 - dropout)
        masks.append(_mask_in_output_layout(noise, cfg))
    return masks


# ---------------------------------------------------------------------------
# state_dict <-> params
# ---------------------------------------------------------------------------

def _layer_keys(layer, direction, has_bias):
    suffix = f"_l{layer}" + ("_reverse" if direction else "")
    return [key + suffix for key in (_GATE_KEYS if has_bias else _GATE_KEYS[:2])]


def _strip_prefix(state_dict, prefix):
    if not hasattr(state_dict, "keys"):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
    return {key[len(prefix):]: value for key, value in state_dict.items() if key.startswith(prefix)}


def config_from_state_dict(state_dict, *, prefix=""):
    """The layout of an ``nn.LSTM`` ``state_dict``, as keyword arguments of lstmcy.

    Parameters
    ----------
    state_dict : mapping of str to tensor or ndarray
        ``nn.LSTM(...).state_dict()`` (or :class:`LSTM`'s), possibly inside a larger
        model's ``state_dict``.
    prefix : str, default ""
        Prefix of the LSTM's keys in ``state_dict``, e.g. ``"encoder.rnn."``.

    Returns
    -------
    dict
        ``{"num_layers": int, "bidirectional": bool, "has_bias": bool}``, ready to pass as
        ``**kwargs`` to :func:`lstmcy.lstm_forward` / :func:`lstmcy.lstm_backward`.

    Raises
    ------
    ValueError
        If the keys are not those of an ``nn.LSTM`` (missing layers, projections).
    """
    keys = set(_strip_prefix(state_dict, prefix))
    if any(key.startswith("weight_hr_l") for key in keys):
        raise ValueError("state_dict has projection weights (weight_hr_l*, proj_size > 0), "
                         "which lstmcy does not support")
    num_layers = 0
    while f"weight_ih_l{num_layers}" in keys:
        num_layers += 1
    if num_layers == 0:
        raise ValueError(f"state_dict has no key {prefix}weight_ih_l0: not an nn.LSTM state_dict "
                         f"(check prefix={prefix!r})")
    bidirectional = "weight_ih_l0_reverse" in keys
    has_bias = "bias_ih_l0" in keys
    expected = {key for layer in range(num_layers) for direction in range(2 if bidirectional else 1)
                for key in _layer_keys(layer, direction, has_bias)}
    lstm_keys = {key for key in keys if key.split("_l")[0] in _GATE_KEYS + ("weight_hr",)}
    if lstm_keys != expected:
        missing = sorted(expected - lstm_keys)
        extra = sorted(lstm_keys - expected)
        raise ValueError(f"state_dict is not a consistent nn.LSTM state_dict: missing {missing}, "
                         f"unexpected {extra}")
    return {"num_layers": num_layers, "bidirectional": bidirectional, "has_bias": has_bias}


def _to_numpy(value, name, copy):
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if tensor.dtype == torch.bfloat16:
            import ml_dtypes  # lstmcy's lowp extra
            array = tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            array = tensor.numpy()
    elif isinstance(value, np.ndarray):
        array = value
    else:
        raise TypeError(f"{name} must be a tensor or an ndarray, got {type(value).__name__}")
    return array.copy() if copy else array


def params_from_state_dict(state_dict, *, prefix="", copy=True):
    """lstmcy's ``params`` list from an ``nn.LSTM`` ``state_dict``.

    Parameters
    ----------
    state_dict : mapping of str to tensor or ndarray
        ``nn.LSTM(...).state_dict()`` (or :class:`LSTM`'s, or a larger model's).
    prefix : str, default ""
        Prefix of the LSTM's keys, e.g. ``"encoder.rnn."``.
    copy : bool, default True
        Return copies. With False, CPU tensors are returned as numpy views sharing their
        memory (writes to either show in the other).

    Returns
    -------
    list of ndarray
        Per layer, forward direction then reverse: ``w_ih, w_hh[, b_ih, b_hh]``, the order
        of :func:`lstmcy.lstm_forward`'s ``params``. Use :func:`config_from_state_dict` for
        the matching ``num_layers``, ``bidirectional`` and ``has_bias``.

    Examples
    --------
    >>> import numpy as np, torch, lstmcy
    >>> from lstmcy.torch import params_from_state_dict, config_from_state_dict
    >>> sd = torch.nn.LSTM(3, 5, num_layers=2).state_dict()
    >>> params, kw = params_from_state_dict(sd), config_from_state_dict(sd)
    >>> y, h_n, c_n, _ = lstmcy.lstm_forward(np.zeros((7, 2, 3), np.float32), None, params,
    ...                                      train=False, **kw)
    >>> y.shape
    (7, 2, 5)
    """
    config = config_from_state_dict(state_dict, prefix=prefix)
    entries = _strip_prefix(state_dict, prefix)
    params = []
    for layer in range(config["num_layers"]):
        for direction in range(2 if config["bidirectional"] else 1):
            for key in _layer_keys(layer, direction, config["has_bias"]):
                params.append(_to_numpy(entries[key], prefix + key, copy))
    return params


def params_to_state_dict(params, *, num_layers=1, bidirectional=False, has_bias=True, prefix=""):
    """An ``nn.LSTM`` ``state_dict`` (of new tensors) from lstmcy's ``params`` list.

    Parameters
    ----------
    params : list of ndarray
        As given to :func:`lstmcy.lstm_forward`: per layer, forward direction then
        reverse, ``w_ih [4H, I_l], w_hh [4H, H]`` and, if ``has_bias``, ``b_ih, b_hh [4H]``.
    num_layers, bidirectional, has_bias
        The layout of ``params`` (as for :func:`lstmcy.lstm_forward`).
    prefix : str, default ""
        Prepended to every key.

    Returns
    -------
    collections.OrderedDict of str to torch.Tensor
        Keys ``weight_ih_l{k}[_reverse]`` etc. in ``nn.LSTM``'s order; the tensors are
        copies. Load it with ``module.load_state_dict(...)`` into ``torch.nn.LSTM`` or
        :class:`LSTM` built with the same sizes.

    Raises
    ------
    TypeError, ValueError
        If ``params`` does not match the layout or the shapes are inconsistent.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be an int >= 1, got {num_layers!r}")
    if not isinstance(bidirectional, bool):
        raise TypeError(f"bidirectional must be a bool, got {bidirectional!r}")
    if not isinstance(has_bias, bool):
        raise TypeError(f"has_bias must be a bool, got {has_bias!r}")
    if not isinstance(params, (list, tuple)):
        raise TypeError(f"params must be a list of arrays, got {type(params).__name__}")
    D = 2 if bidirectional else 1
    per_direction = 4 if has_bias else 2
    if len(params) != num_layers * D * per_direction:
        raise ValueError(f"params must hold {num_layers * D * per_direction} arrays for "
                         f"num_layers={num_layers}, bidirectional={bidirectional}, "
                         f"has_bias={has_bias}, got {len(params)}")
    state_dict = OrderedDict()
    index = 0
    hidden = None
    for layer in range(num_layers):
        for direction in range(D):
            for key in _layer_keys(layer, direction, has_bias):
                array = params[index]
                if not isinstance(array, np.ndarray):
                    raise TypeError(f"params[{index}] ({key}) must be an ndarray, "
                                    f"got {type(array).__name__}")
                if hidden is None:
                    hidden = array.shape[0] // 4 if array.ndim >= 1 else 0
                rows = 4 * hidden
                expected_ndim = 2 if key.startswith("weight") else 1
                if array.ndim != expected_ndim or array.shape[0] != rows or (
                        key.startswith("weight_hh") and array.shape[1] != hidden) or (
                        key.startswith("weight_ih") and layer > 0 and array.shape[1] != D * hidden):
                    raise ValueError(f"params[{index}] ({key}) has shape {array.shape}, which does "
                                     f"not fit hidden size {hidden}")
                if array.dtype.name == "bfloat16":
                    tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
                else:
                    tensor = torch.from_numpy(np.array(array, copy=True))
                state_dict[prefix + key] = tensor
                index += 1
    return state_dict
