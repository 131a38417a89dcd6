"""A plan's work buffers: one per name, grown to the largest call, viewed in each call's
shapes.

The kernels' work buffers (the gates, ``[x | h]`` rows, the weight gradients' lanes, the
packed weights, ...) are named by what they hold (:func:`lstmcy._engine.layers.layer_workspace`
lists them). Calls of different shapes share one buffer of a name: it grows when a call
needs more and is never shrunk (a plan is dropped to give the memory back).
"""
import math

import numpy as np

from lstmcy._engine.results import ALIGN, aligned_empty, aligned_offset

__all__ = ["WorkBuffers"]


class WorkBuffers:
    """The named work buffers of one plan.

    Attributes
    ----------
    nbytes : int
        Bytes held.
    generation : int
        Counts replaced buffers. A view of a replaced buffer would keep its memory alive:
        whoever keeps views between calls (the plan's layer setups) drops them when this
        changes.
    """

    __slots__ = ("_buffers", "_offsets", "_last_views", "generation")

    def __init__(self):
        self._buffers = {}     # name -> uint8 array
        self._offsets = {}     # name -> aligned_offset of that buffer
        self._last_views = {}  # name -> the view take() last returned of that buffer
        self.generation = 0

    @property
    def nbytes(self):
        return sum(buffer.nbytes for buffer in self._buffers.values())

    def take(self, name, shape, dtype):
        """A C-contiguous ``shape`` view into the named buffer (grown if too small),
        starting on a cache line as the results do (see :data:`lstmcy._engine.results.ALIGN`)."""
        # Repeated calls of one shape reuse the last view (cheaper than slicing anew); one
        # view per name, so a grown buffer's old memory is not kept alive.
        view = self._last_views.get(name)
        if (view is not None and view.shape == shape and view.dtype == dtype
                and view.base is self._buffers[name]):
            return view
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize + ALIGN - 1
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < nbytes:
            buffer = np.empty(nbytes, dtype=np.uint8)
            self._buffers[name] = buffer
            self._offsets[name] = aligned_offset(buffer)
            self.generation += 1
        # The forward and the backward take some buffers in different shapes, so this
        # runs on most calls.
        view = self._last_views[name] = aligned_empty(shape, dtype, buffer, self._offsets[name])
        return view

    def current(self, name):
        """``(buffer, offset)``: the named buffer's memory (uint8) and where its aligned
        data starts, as the last call that took it left it."""
        return self._buffers[name], self._offsets[name]

    def arrays(self):
        """The buffers held (uint8 arrays), by name."""
        return dict(self._buffers)
