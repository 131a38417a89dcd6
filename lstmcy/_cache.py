"""The object returned by ``lstm_forward`` that carries the saved activations.

Both the Cython-backed core (:mod:`lstmcy._core`) and the numpy reference
(:mod:`lstmcy.reference`) return an :class:`LSTMCache`, so the two are
interchangeable when feeding ``lstm_backward``.
"""

__all__ = ["LSTMCache", "SAVED_NAMES"]

#: The saved activations, in the order of ``lstm_backward``'s arguments and of
#: :meth:`LSTMCache.saved`.
SAVED_NAMES = ("i", "g", "f", "o", "h", "c", "tanhc")


class LSTMCache:
    """Activations saved by a training forward pass, needed by the backward.

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

    Attributes
    ----------
    i, g, f, o, h, c, tanhc : list of ndarray
        As given.
    dropout_masks : list of ndarray or None
        As given.
    """

    __slots__ = ("i", "g", "f", "o", "h", "c", "tanhc", "dropout_masks")

    def __init__(self, i, g, f, o, h, c, tanhc, dropout_masks=None):
        self.i = i
        self.g = g
        self.f = f
        self.o = o
        self.h = h
        self.c = c
        self.tanhc = tanhc
        self.dropout_masks = dropout_masks

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
                f"dropout_masks={masks})")
