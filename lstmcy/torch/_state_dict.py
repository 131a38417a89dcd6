"""Conversion between an ``nn.LSTM`` ``state_dict`` and lstmcy's ``params`` list.

:func:`params_from_state_dict`, :func:`config_from_state_dict` and
:func:`params_to_state_dict`, re-exported by :mod:`lstmcy.torch`, move weights between
PyTorch and lstmcy's numpy API.
"""
from collections import OrderedDict

import numpy as np
import torch

__all__ = ["params_from_state_dict", "config_from_state_dict", "params_to_state_dict"]

_GATE_KEYS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def _layer_keys(layer, direction, has_bias, projected):
    """One direction's keys, in ``_flat_weights`` order (``weight_hr`` after the biases)."""
    suffix = f"_l{layer}" + ("_reverse" if direction else "")
    keys = list(_GATE_KEYS if has_bias else _GATE_KEYS[:2]) + (["weight_hr"] if projected else [])
    return [key + suffix for key in keys]


def _strip_prefix(state_dict, prefix):
    if not hasattr(state_dict, "keys"):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
    return {key[len(prefix):]: value for key, value in state_dict.items() if key.startswith(prefix)}


def config_from_state_dict(state_dict, *, prefix=""):
    """The layout of an ``nn.LSTM`` ``state_dict``, as keyword arguments of lstmcy.

    Parameters
    ----------
    state_dict : mapping of str to tensor or ndarray
        ``nn.LSTM(...).state_dict()`` (or :class:`lstmcy.torch.LSTM`'s), possibly inside a larger
        model's ``state_dict``.
    prefix : str, default ""
        Prefix of the LSTM's keys in ``state_dict``, e.g. ``"encoder.rnn."``.

    Returns
    -------
    dict
        ``{"num_layers": int, "bidirectional": bool, "has_bias": bool, "proj_size": int}``
        (``proj_size`` 0 without projections), ready to pass as ``**kwargs`` to
        :func:`lstmcy.lstm_forward` / :func:`lstmcy.lstm_backward`.

    Raises
    ------
    ValueError
        If the keys are not those of an ``nn.LSTM`` (missing or extra layers or weights).
    """
    entries = _strip_prefix(state_dict, prefix)
    keys = set(entries)
    num_layers = 0
    while f"weight_ih_l{num_layers}" in keys:
        num_layers += 1
    if num_layers == 0:
        raise ValueError(f"state_dict has no key {prefix}weight_ih_l0: not an nn.LSTM state_dict "
                         f"(check prefix={prefix!r})")
    bidirectional = "weight_ih_l0_reverse" in keys
    has_bias = "bias_ih_l0" in keys
    projected = "weight_hr_l0" in keys
    expected = {key for layer in range(num_layers) for direction in range(2 if bidirectional else 1)
                for key in _layer_keys(layer, direction, has_bias, projected)}
    lstm_keys = {key for key in keys if key.split("_l")[0] in _GATE_KEYS + ("weight_hr",)}
    if lstm_keys != expected:
        missing = sorted(expected - lstm_keys)
        extra = sorted(lstm_keys - expected)
        raise ValueError(f"state_dict is not a consistent nn.LSTM state_dict: missing {missing}, "
                         f"unexpected {extra}")
    proj_size = int(np.shape(entries["weight_hr_l0"])[0]) if projected else 0
    return {"num_layers": num_layers, "bidirectional": bidirectional, "has_bias": has_bias,
            "proj_size": proj_size}


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
        ``nn.LSTM(...).state_dict()`` (or :class:`lstmcy.torch.LSTM`'s, or a larger model's).
    prefix : str, default ""
        Prefix of the LSTM's keys, e.g. ``"encoder.rnn."``.
    copy : bool, default True
        Return copies. With False, CPU tensors are returned as numpy views sharing their
        memory (writes to either show in the other).

    Returns
    -------
    list of ndarray
        Per layer, forward direction then reverse: ``w_ih, w_hh[, b_ih, b_hh][, w_hr]``,
        the order of :func:`lstmcy.lstm_forward`'s ``params``. Use
        :func:`config_from_state_dict` for the matching ``num_layers``, ``bidirectional``,
        ``has_bias`` and ``proj_size``.

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
            for key in _layer_keys(layer, direction, config["has_bias"], config["proj_size"] > 0):
                params.append(_to_numpy(entries[key], prefix + key, copy))
    return params


def params_to_state_dict(params, *, num_layers=1, bidirectional=False, has_bias=True, proj_size=0,
                         prefix=""):
    """An ``nn.LSTM`` ``state_dict`` (of new tensors) from lstmcy's ``params`` list.

    Parameters
    ----------
    params : list of ndarray
        As given to :func:`lstmcy.lstm_forward`: per layer, forward direction then
        reverse, ``w_ih [4H, I_l], w_hh [4H, P]``, if ``has_bias`` ``b_ih, b_hh [4H]`` and,
        if ``proj_size`` ``w_hr [P, H]`` (``P = proj_size``, else ``H``; ``I_l`` is the
        input size for the first layer, ``D * P`` after).
    num_layers, bidirectional, has_bias, proj_size
        The layout of ``params`` (as for :func:`lstmcy.lstm_forward`).
    prefix : str, default ""
        Prepended to every key.

    Returns
    -------
    collections.OrderedDict of str to torch.Tensor
        Keys ``weight_ih_l{k}[_reverse]`` etc. in ``nn.LSTM``'s order; the tensors are
        copies. Load it with ``module.load_state_dict(...)`` into ``torch.nn.LSTM`` or
        :class:`lstmcy.torch.LSTM` built with the same sizes.

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
    if isinstance(proj_size, bool) or not isinstance(proj_size, int) or proj_size < 0:
        raise ValueError(f"proj_size must be an int >= 0, got {proj_size!r}")
    if not isinstance(params, (list, tuple)):
        raise TypeError(f"params must be a list of arrays, got {type(params).__name__}")
    D = 2 if bidirectional else 1
    projected = proj_size > 0
    per_direction = (4 if has_bias else 2) + (1 if projected else 0)
    if len(params) != num_layers * D * per_direction:
        raise ValueError(f"params must hold {num_layers * D * per_direction} arrays for "
                         f"num_layers={num_layers}, bidirectional={bidirectional}, "
                         f"has_bias={has_bias}, proj_size={proj_size}, got {len(params)}")
    state_dict = OrderedDict()
    index = 0
    hidden = None
    for layer in range(num_layers):
        for direction in range(D):
            for key in _layer_keys(layer, direction, has_bias, projected):
                array = params[index]
                if not isinstance(array, np.ndarray):
                    raise TypeError(f"params[{index}] ({key}) must be an ndarray, "
                                    f"got {type(array).__name__}")
                if hidden is None:
                    hidden = array.shape[0] // 4 if array.ndim >= 1 else 0
                out = proj_size if projected else hidden
                if key.startswith("weight_hr"):
                    expected = (proj_size, hidden)
                elif key.startswith("weight_hh"):
                    expected = (4 * hidden, out)
                elif key.startswith("weight_ih"):
                    expected = (4 * hidden, array.shape[1] if layer == 0 else D * out)
                else:
                    expected = (4 * hidden,)
                if array.shape != expected:
                    raise ValueError(f"params[{index}] ({key}) has shape {array.shape}, expected "
                                     f"{expected} for hidden size {hidden}"
                                     + (f" and proj_size {proj_size}" if projected else ""))
                if array.dtype.name == "bfloat16":
                    tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
                else:
                    tensor = torch.from_numpy(np.array(array, copy=True))
                state_dict[prefix + key] = tensor
                index += 1
    return state_dict
