"""The object returned by ``lstm_forward`` that carries the saved activations and the call.

Both the Cython-backed core (:mod:`lstmcy._engine.plan`) and the numpy reference
(:mod:`lstmcy.reference`) return an :class:`LSTMCache`, so the two are
interchangeable when feeding ``lstm_backward``. The cache records its forward
(:class:`ForwardCall`), so that :meth:`LSTMCache.backward` needs only the output
gradients, and :func:`check_same_call` refuses a vendor-shaped backward whose settings
disagree with the forward that saved the arrays it is handed.
"""
from typing import NamedTuple

import numpy as np

__all__ = ["LSTMCache", "LSTMGradients", "ForwardCall", "SavedList", "SAVED_NAMES",
           "check_same_call", "refuse_cache"]

#: The saved activations, in the order of ``lstm_backward``'s arguments and of
#: :meth:`LSTMCache.saved`.
SAVED_NAMES = ("i", "g", "f", "o", "h", "c", "tanhc")


class LSTMGradients(NamedTuple):
    """The gradients of a backward: of the input, the initial states and the parameters.

    A tuple, so ``dx, dh0, dc0, dparams = ...`` unpacks it; None where ``output_mask``
    asked for nothing.
    """

    dx: object
    """Shaped like the forward's ``input`` (zero at padded positions)."""
    dh0: object
    """``[L*D, B, P]``: the gradient of ``h0``."""
    dc0: object
    """``[L*D, B, H]``: the gradient of ``c0``."""
    dparams: object
    """A list shaped like ``params`` (``db_ih`` equals ``db_hh``)."""


class SavedList(list):
    """A list of one saved activation's arrays that knows the forward that made it
    (``call``, a :class:`ForwardCall`, or None)."""

    __slots__ = ("call",)

    def __init__(self, arrays, call=None):
        list.__init__(self, arrays)
        self.call = call


class ForwardCall:
    """What a forward was called with: its settings, and references (not copies) to its
    arrays.

    ``config`` is the :class:`~lstmcy.LSTMConfig`; ``input``, ``hx`` (None or the tuple
    ``(h0, c0)``) and ``params`` (a tuple) are the caller's objects as given;
    ``batch_sizes`` the checked lengths (an intp array) or None; ``masks`` the dropout
    masks (None without dropout); ``dtype`` and ``layout`` (``"time_major"``,
    ``"batch_first"``, ``"packed"`` or ``"padded_2d"``) those of the input;
    ``run_backward`` a function with :func:`lstmcy.lstm_backward`'s arguments that
    computes the backward (the forward's plan's, the calling thread's plan's or the
    reference's); ``problem`` the forward's checked
    :class:`~lstmcy._engine.validation.Problem` when it reads the caller's arrays
    themselves (no converted copy), else None: a backward handed these very objects runs
    on it (:func:`lstmcy._engine.saved.forward_problem`).
    """

    __slots__ = ("config", "input", "hx", "params", "batch_sizes", "masks", "dtype", "layout",
                 "run_backward", "problem")

    def __init__(self, config, input, hx, params, batch_sizes, masks, dtype, layout,
                 run_backward, problem=None):
        self.config = config
        self.input = input
        self.hx = None if hx is None else tuple(hx)
        self.params = tuple(params)
        self.batch_sizes = batch_sizes
        self.masks = masks
        self.dtype = dtype
        self.layout = layout
        self.run_backward = run_backward
        self.problem = problem


def _recorded(name, doc):
    """A read-only attribute of a cache: its :class:`ForwardCall`'s ``name``."""
    return property(lambda cache: None if cache._call is None else getattr(cache._call, name),
                    doc=doc)


class LSTMCache:
    """What a training forward pass leaves for its backward: the saved activations and
    the call.

    The usual use is :meth:`backward`: ``grads = cache.backward(dy)``. The cache records
    the forward's settings (:attr:`config`, :attr:`batch_sizes`) and refers to (does not
    copy) the arrays it was given (:attr:`input`, :attr:`hx`, :attr:`params`): changing
    those arrays in place before the backward changes its gradients, as it would those of
    :func:`lstmcy.lstm_backward` handed them.

    Every array list holds ``D * L`` arrays of shape ``[T, B, H]`` (time-major
    whatever the input layout; ``h`` is ``[T, B, P]``, P the projection's size
    or H), ordered ``layer * D + direction``. Positions that are inactive in a
    variable-length batch hold zeros.

    The arrays have the call's dtype. For float16 and bfloat16 calls, which are
    computed in float32, ``lstmcy.lstm_forward``'s cache also keeps the float32
    values its arrays were rounded from, and ``lstm_backward`` handed these very
    lists uses those: its gradients are then the float32 call's, rounded (through
    a saturated gate, ``1 - sigmoid`` loses all its digits in the rounded
    values). The arrays are read-only so that they cannot drift apart from the
    float32 values; copies (or any other arrays) are used as given. See
    docs/numerics.md.

    Parameters
    ----------
    i, g, f, o : list of ndarray
        Input gate, cell candidate (tanh), forget gate and output gate
        activations.
    h, c : list of ndarray
        Hidden and cell state after each step.
    tanhc : list of ndarray
        ``tanh(c)`` after each step.
    dropout_masks : list of ndarray or None, optional
        ``None``, or ``L - 1`` arrays of shape ``[T, B, D * P]`` holding 0 or
        ``1 / (1 - dropout)``: the multiplier applied to the output of layer
        ``l`` before it enters layer ``l + 1``.
    call : ForwardCall or None, optional
        The forward's record (None: a cache made by hand, which has no
        :meth:`backward`).

    Attributes
    ----------
    i, g, f, o, h, c, tanhc : list of ndarray
        As given.
    dropout_masks : list of ndarray or None
        As given.
    """

    __slots__ = ("i", "g", "f", "o", "h", "c", "tanhc", "dropout_masks", "_call")

    def __init__(self, i, g, f, o, h, c, tanhc, dropout_masks=None, call=None):
        self.i = i
        self.g = g
        self.f = f
        self.o = o
        self.h = h
        self.c = c
        self.tanhc = tanhc
        self.dropout_masks = dropout_masks
        self._call = call

    def backward(self, dy, dh_n=None, dc_n=None, output_mask=None):
        """Gradients of the forward that returned this cache.

        The forward's input, states, parameters and settings (layers, directions,
        layout, lengths, dropout and its masks, projection, dtype) are the cache's: only
        the gradients of the forward's outputs are given here.

        Parameters
        ----------
        dy : ndarray
            Gradient of ``y``, shaped like it (ignored at padded positions).
        dh_n, dc_n : ndarray [L*D, B, P], [L*D, B, H], or None
            Gradients of ``h_n`` and ``c_n`` (None means zeros).
        output_mask : tuple of 4 bool, optional
            Which of ``(dx, dh0, dc0, dparams)`` to compute (default all); False
            gives None there and skips the work.

        Returns
        -------
        LSTMGradients
            ``(dx, dh0, dc0, dparams)``, in the forward's dtype and layouts.

        Raises
        ------
        ValueError
            For a cache made by hand (it records no forward), or gradients of the
            wrong shape.

        Examples
        --------
        >>> y, h_n, c_n, cache = lstmcy.lstm_forward(x, None, params, num_layers=2,
        ...                                          dropout=0.5)  # doctest: +SKIP
        >>> dx, dh0, dc0, dparams = cache.backward(dy)  # doctest: +SKIP
        """
        call = self._call
        if call is None:
            raise ValueError("this LSTMCache records no forward call (it was made by hand): "
                             "use lstm_backward(input, hx, params, dy, dh, dc, "
                             "*cache.saved(), ...) with the forward's arguments")
        if output_mask is None:
            output_mask = (True, True, True, True)
        grads = call.run_backward(
            call.input, call.hx, call.params, dy, dh_n, dc_n, *self.saved(),
            config=call.config, batch_sizes=call.batch_sizes, dropout_masks=call.masks,
            output_mask=output_mask)
        return LSTMGradients(*grads)

    config = _recorded("config", "The forward's :class:`~lstmcy.LSTMConfig` (None for a cache "
                       "made by hand).")
    input = _recorded("input", "The forward's ``input`` (the caller's object, not a copy).")
    hx = _recorded("hx", "The forward's ``(h0, c0)`` (the caller's arrays), or None.")
    params = _recorded("params", "The forward's parameters (a tuple of the caller's arrays).")
    batch_sizes = _recorded("batch_sizes", "The forward's lengths per step (an integer array), "
                            "or None.")

    def saved(self):
        """Return the saved activations in ``lstm_backward``'s argument order.

        Returns
        -------
        tuple of list of ndarray
            ``(i, g, f, o, h, c, tanhc)``, ready to be unpacked into
            ``lstm_backward(input, hx, params, dy, dh, dc, *cache.saved(), ...)``.
        """
        return (self.i, self.g, self.f, self.o, self.h, self.c, self.tanhc)

    def __repr__(self):
        n = len(self.h) if self.h is not None else 0
        shape = tuple(self.h[0].shape) if n else ()
        masks = None if self.dropout_masks is None else len(self.dropout_masks)
        return (f"LSTMCache({n} layer-directions, shape={shape}, "
                f"dropout_masks={masks}, config={self.config})")


def refuse_cache(i):
    """Raise TypeError when a backward is handed a whole :class:`LSTMCache` where its seven
    saved lists belong (``i``: the first of them)."""
    if isinstance(i, LSTMCache):
        raise TypeError("i, g, f, o, h, c, tanhc are the seven saved lists, got the LSTMCache "
                        "itself: call cache.backward(dy, dh_n, dc_n), or pass *cache.saved() "
                        "and dropout_masks=cache.dropout_masks")


def _forward_call(saved):
    """The :class:`ForwardCall` of the forward whose lists ``saved`` holds (None when
    none of them is a forward's own)."""
    calls = [items.call if isinstance(items, SavedList) else None for items in saved]
    found = calls[0]
    for k, call in enumerate(calls):
        if call is not found and call is not None:
            if found is None:
                found = call
                continue
            first = next(j for j, c in enumerate(calls) if c is not None)
            raise ValueError(f"the saved arrays come from different forwards: "
                             f"{SAVED_NAMES[first]} from one, {SAVED_NAMES[k]} from another; "
                             "pass one forward's cache.saved()")
    return found


def _describe_array(value):
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None:
        return type(value).__name__
    return f"an array of shape {tuple(shape)} and dtype {dtype}"


def _same_values(given, recorded):
    """Whether ``given`` is ``recorded`` or an array of the same shape, dtype and values
    (NaN equal to NaN)."""
    if given is recorded:
        return True
    try:
        given = np.asarray(given)
    except Exception:  # not an array at all: certainly not the forward's
        return False
    recorded = np.asarray(recorded)
    if given.shape != recorded.shape or given.dtype != recorded.dtype:
        return False
    try:
        return bool(np.array_equal(given, recorded, equal_nan=True))
    except TypeError:  # dtypes without NaN (ml_dtypes' on some numpy versions)
        return bool(np.array_equal(given, recorded))


def _mismatch(name, given, forward):
    return ValueError(
        f"{name} is {given} but the forward that saved these arrays ran with {forward}: "
        "the backward must describe the same call (cache.backward(dy, ...) takes the "
        "forward's arguments itself)")


def _is_zeros(value):
    try:
        return not np.any(np.asarray(value))
    except Exception:
        return False


def check_same_call(saved, config, input, hx, params, batch_sizes, dropout_masks):
    """Raise ValueError when ``saved`` (the seven lists handed to a backward) are a
    forward's own and the backward's arguments describe another call: a setting of
    ``config`` (an :class:`~lstmcy.LSTMConfig`), the lengths, the input, states,
    parameters or dropout masks differ from that forward's. The message names the
    argument and the forward's value. Lists from elsewhere are not checked.

    Arrays are compared by identity, and only when they are other objects by shape,
    dtype and values (as cheap as one pass over them, beside a backward's many).
    """
    call = _forward_call(saved)
    if call is None:
        return
    forward = call.config
    if config is not forward:  # (configs of plain keywords are shared)
        for name in ("num_layers", "bidirectional", "batch_first", "has_bias", "proj_size",
                     "dropout", "train"):
            given, recorded = getattr(config, name), getattr(forward, name)
            if given != recorded:
                raise _mismatch(name, f"{given!r}", f"{name}={recorded!r}")
    if batch_sizes is not None or call.batch_sizes is not None:
        _check_same_lengths(call, batch_sizes)
    if input is not call.input and not _same_values(input, call.input):
        raise _mismatch("input", _describe_array(input),
                        f"{_describe_array(call.input)} as input (other values or shape)")
    if hx is not call.hx:
        _check_same_states(call, hx)
    if params is None or len(params) != len(call.params):
        count = "None" if params is None else f"a list of {len(params)} arrays"
        raise _mismatch("params", count, f"{len(call.params)} params")
    for k, (given, recorded) in enumerate(zip(params, call.params)):
        if given is not recorded and not _same_values(given, recorded):
            raise _mismatch(f"params[{k}]", _describe_array(given),
                            f"{_describe_array(recorded)} as params[{k}] (other values or "
                            "shape)")
    masks = call.masks
    if masks is None or dropout_masks is masks:
        return  # (masks given without dropout are refused by the argument checks)
    if dropout_masks is None or len(dropout_masks) != len(masks) or not all(
            _same_values(m, r) for m, r in zip(dropout_masks, masks)):
        raise _mismatch("dropout_masks", "not the forward's masks",
                        f"the {len(masks)} masks in cache.dropout_masks")


def _check_same_lengths(call, batch_sizes):
    recorded = call.batch_sizes
    if batch_sizes is None and recorded is None:
        return
    if batch_sizes is not None and recorded is not None:
        try:
            if np.array_equal(np.asarray(batch_sizes), recorded):
                return
        except Exception:  # not an array of lengths: certainly not the forward's
            pass

    def show(sizes):
        if sizes is None:
            return "None"
        try:
            return np.array2string(np.asarray(sizes), separator=", ", threshold=16)
        except Exception:
            return type(sizes).__name__
    raise _mismatch("batch_sizes", show(batch_sizes), f"batch_sizes={show(recorded)}")


def _check_same_states(call, hx):
    recorded = call.hx
    if hx is None and recorded is None:
        return
    # None means zeros: zeros given where the forward had None (or the other way round)
    # describe the same call.
    if hx is None:
        if all(_is_zeros(a) for a in recorded):
            return
        raise _mismatch("hx", "None (zeros)", "the states hx=(h0, c0) it was given")
    if not isinstance(hx, (list, tuple)) or len(hx) != 2:
        raise _mismatch("hx", type(hx).__name__, "hx=None" if recorded is None
                        else "the states hx=(h0, c0) it was given")
    if recorded is None:
        if all(_is_zeros(a) for a in hx):
            return
        raise _mismatch("hx", "(h0, c0) with nonzero values", "hx=None (zeros)")
    for k, label in enumerate(("h0", "c0")):
        if not _same_values(hx[k], recorded[k]):
            raise _mismatch(f"hx[{k}] ({label})", _describe_array(hx[k]),
                            f"{_describe_array(recorded[k])} as {label} (other values or "
                            "shape)")
