"""The saved activations of a forward: one flat block, its views, and the cache lists.

A forward saves the seven activations (``SAVED_NAMES``) of every layer and direction in
one flat compute-dtype block: ``[L*D, T*B, H]`` each in that order, h ``[L*D, T*B, P]``.
The numpy API hands them out as an :class:`~lstmcy.LSTMCache`'s seven lists of ``[T, B,
F]`` views (:class:`_BlockViews`), which a backward recognises and reads back without
copying; ``lstmcy.torch`` keeps the block itself and reads it back with
:func:`block_reader`.
"""
import operator

import numpy as np

from lstmcy._engine.cache import SavedList
from lstmcy._engine.validation import SAVED_NAMES, _cached, _read_only, _ready_array

__all__ = ["saved_size", "saved_arrays", "block_reader", "cache_lists", "stacked",
           "forward_problem", "rows_reader", "no_cache"]


class _BlockViews(SavedList):
    """A cache list: the ``[T, B, F]`` pieces of one saved activation, one per layer and
    direction (F is H, or P for h).

    The backward recognises its own cache lists by identity and reads a layer's directions
    from ``rows`` (``[L*D, T*B, F]``, the compute-dtype values) without copying: the saved
    block itself, or for float16/bfloat16 calls the float32 values the (read-only) pieces
    were rounded from. ``call`` is the forward's :class:`~lstmcy._engine.cache.ForwardCall`.
    """

    __slots__ = ("views", "_rows")

    def __init__(self, views, rows, call):
        SavedList.__init__(self, views, call)
        self.views = views
        self._rows = rows

    def rows(self, arrays, dtype):
        """``rows`` if ``arrays`` still are this list's pieces and ``dtype`` is their
        compute dtype, else None."""
        if (self._rows.dtype != dtype or len(arrays) != len(self.views)
                or not all(map(operator.is_, arrays, self.views))):
            return None
        return self._rows


def cache_lists(pieces, saved_rows, LD, call):
    """The seven cache lists of a forward (``call``, its :class:`ForwardCall`): ``pieces``
    holds the ``[T, B, F]`` pieces of the seven activations in ``SAVED_NAMES`` order
    (``LD`` = layers x directions each), ``saved_rows`` their ``[L*D, T*B, F]``
    compute-dtype values."""
    if LD == 1:  # one piece per list (the common case: no slicing)
        return [_BlockViews((piece,), rows, call) for piece, rows in zip(pieces, saved_rows)]
    return [_BlockViews(tuple(pieces[k * LD:(k + 1) * LD]), rows, call)
            for k, rows in enumerate(saved_rows)]


def stacked(given, arrays, layer, D, shape, dtype):
    """The arrays of one layer's directions as one C-contiguous ``[D, *shape]`` array.

    ``given`` is the caller's list, ``arrays`` the validated arrays of it. A cache list
    from :func:`~lstmcy.lstm_forward` is viewed without copying (for float16/bfloat16, its float32
    values); anything else is stacked (and converted) into a new array.
    """
    rows = given.rows(arrays, dtype) if type(given) is _BlockViews else None
    if rows is not None:
        # The whole block when it is this one layer (one less view on small calls).
        return rows if rows.shape[0] == D else rows[layer * D:(layer + 1) * D]
    ks = slice(layer * D, (layer + 1) * D)
    out = np.empty((D,) + tuple(shape), dtype=dtype)  # C order whatever the inputs' order
    for k, a in enumerate(arrays[ks]):
        out[k] = a.reshape(shape)
    return out


def forward_problem(saved, config, input, hx, params, batch_sizes, dropout_masks):
    """The checked problem of a backward handed its forward's own objects, and the reader
    of its saved activations; None for any other backward (which is checked in full).

    That is: the seven ``saved`` lists are one forward's cache lists with every piece in
    place, the forward kept its :class:`~lstmcy._engine.validation.Problem` (it reads the
    caller's arrays), and ``config``, ``input``, ``hx`` and ``params`` are that forward's
    (the arrays by identity), without lengths or dropout masks. Such a backward's only
    new arrays are its output gradients.

    Returns
    -------
    (problem, saved_of) or None
        ``saved_of`` as :func:`rows_reader` gives it.
    """
    first = saved[0]
    if type(first) is not _BlockViews or batch_sizes is not None or dropout_masks is not None:
        return None
    call = first.call
    p = call.problem
    if (p is None or call.masks is not None or input is not call.input
            or (config is not call.config and config != call.config)):
        return None
    recorded = call.hx
    if hx is None:
        if recorded is not None:
            return None
    elif (recorded is None or type(hx) not in (tuple, list) or len(hx) != 2
          or hx[0] is not recorded[0] or hx[1] is not recorded[1]):
        return None
    if (type(params) not in (tuple, list) or len(params) != len(call.params)
            or not all(map(operator.is_, params, call.params))):
        return None
    # The same objects, still as the forward checked them (a shape, dtype or strides set
    # in place since is the full checks' to judge).
    cdt, shapes = p.compute_dtype, p.shapes
    if not _intact(input, p.input_shape, cdt) or (hx is not None and not (
            _intact(hx[0], shapes.h_state, cdt) and _intact(hx[1], shapes.c_state, cdt))):
        return None
    for array, shape in zip(params, shapes.params):
        if not _intact(array, shape, cdt):
            return None
    rows = []
    for items in saved:
        if type(items) is not _BlockViews or items.call is not call:
            return None
        block = items.rows(items, p.compute_dtype)
        if block is None:
            return None
        rows.append(block)
    return p, rows_reader(rows, p)


def _intact(array, shape, dtype):
    """Whether ``array`` still has ``shape`` and is a C-contiguous, aligned ndarray of
    ``dtype`` (as the forward read it)."""
    return array.shape == shape and _ready_array(array, dtype) is array


def rows_reader(rows, p):
    """``saved_of`` for :func:`lstmcy._engine.layer_loops.run_backward`: ``saved_of(layer)``
    is the seven ``[D, T*B, F]`` saved activations of ``layer``'s directions,
    ``saved_of(layer, name)`` the one of ``name``: views of ``rows`` (the seven ``[L*D,
    T*B, F]`` arrays, in ``SAVED_NAMES`` order)."""
    D = p.D
    whole = tuple(rows) if p.L == 1 else None  # the one layer's: the same tuple every time

    def saved_of(layer, name=None):
        if name is not None:
            return rows[_SAVED_INDEX[name]][layer * D:(layer + 1) * D]
        if whole is not None:
            return whole
        return tuple([r[layer * D:(layer + 1) * D] for r in rows])
    return saved_of


_SAVED_INDEX = {name: k for k, name in enumerate(SAVED_NAMES)}


def saved_size(p):
    """Elements of a forward's saved block: the seven activations of every layer and
    direction, ``[L*D, T*B, H]`` each in ``SAVED_NAMES`` order, h ``[L*D, T*B, P]``."""
    return p.L * p.D * p.T * p.B * (6 * p.H + p.P)


def saved_arrays(block, p, by_step=False):
    """The seven ``[L*D, T*B, F]`` views (F = H, for h P) of a flat saved block, in
    ``SAVED_NAMES`` order; with ``by_step``, ``[L*D, T, B, F]``."""
    rows = (p.T, p.B) if by_step else (p.T * p.B,)
    if p.P == p.H:
        # One reshape for all seven (small calls make several of these lists).
        return list(block.reshape((len(SAVED_NAMES), p.L * p.D) + rows + (p.H,)))
    count = p.L * p.D * p.T * p.B
    views, start = [], 0
    for name in SAVED_NAMES:
        width = p.P if name == "h" else p.H
        views.append(block[start:start + count * width].reshape((p.L * p.D,) + rows + (width,)))
        start += count * width
    return views


def block_reader(block, p):
    """``saved_of`` for :func:`lstmcy._engine.layer_loops.run_backward` from the block
    :func:`~lstmcy._engine.layer_loops.run_forward` returns: views, no copies or checks (for callers
    that hand back the forward's own block, as ``lstmcy.torch`` does)."""
    return rows_reader(saved_arrays(block, p), p)


_NO_CACHE = {}
def no_cache(D, H, P, dtype):
    """The empty ``[D, 0, F]`` saved arrays of an inference call (shared, read-only)."""
    key = (D, H, P, dtype)
    arrays = _NO_CACHE.get(key)
    if arrays is None:
        arrays = _cached(_NO_CACHE, key, tuple(
            _read_only(np.empty((D, 0, P if name == "h" else H), dtype=dtype))
            for name in SAVED_NAMES))
    return arrays
