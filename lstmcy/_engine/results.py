"""Memory for result arrays, reused once the caller has dropped them.

Every call returns fresh arrays (outputs, saved activations, gradients) of megabytes.
Allocated afresh, their pages are mapped and zeroed by the kernel on first touch: glibc
serves such sizes with ``mmap`` or returns them to the system on ``free``, so a training
loop page-faults through its whole working set on every call, which measured up to half
of a small forward's time (50x32x128: 3.1 ms with warm memory, 5-8 ms with page faults).

:class:`ResultMemory` keeps the buffers it handed out. A buffer is free again when no array
made from it is alive: every view numpy makes of it references it as ``base``, so its
reference count says so exactly. The caller sees ordinary arrays (views of one of its buffers,
``base`` set), which stay valid for as long as they are referenced.
"""
import math
import sys
import sysconfig
import threading
from collections import deque

import numpy as np

# Below this, malloc keeps the memory in its heap anyway (its mmap threshold is 128 KiB).
_MIN_BYTES = 64 * 1024
# Buffers kept per ResultMemory; beyond this, free buffers are dropped oldest first.
_MAX_BUFFERS = 64
# Free buffers kept beyond the bytes in use: a training loop finds last call's results
# free again, but memory that once held many results the caller has since dropped goes back
# (once its use has left the window below).
_MAX_FREE_EXTRA_BYTES = 32 * 2**20
# "In use" is the most the caller held at any of the last this many requests (of reused
# sizes): between two training steps everything is free for a moment, and trimming to what
# is held then made a loop whose results pass 32 MB map them afresh every step
# (ptb-medium in float64: 85 MB a step). A few steps of an LSTM loop make this many
# requests. The price: when the shapes change every call, a ResultMemory may keep up to about
# twice the window's peak plus 32 MB, part of it in buffers of sizes no request fits
# (a review's simulation: random sequence lengths, 12 results of 4-20 MB a step, peak
# 281 -> 481 MB, 130 -> 89 MB a step mapped afresh); release_workspaces() gives it back.
_USE_WINDOW = 64
# A free buffer serves a request of at least this share of its size (an array never keeps
# much more memory alive than it covers).
_MIN_FILL = 0.75
# Without the GIL, reference counts read from another thread are not exact: no reuse.
_ENABLED = not sysconfig.get_config_var("Py_GIL_DISABLED")
# Every array handed out starts on a cache line. numpy's allocations are 16-byte aligned,
# and when two threads write the two halves of a row (the split forward by units) or
# alternate rows (by rows), a row start off the line boundary puts both threads' ends in
# one line, which then moves between the cores on every step.
ALIGN = 64


def aligned_offset(buffer):
    """Bytes from the start of ``buffer`` to its first 64-byte boundary."""
    return -buffer.ctypes.data % ALIGN


def aligned_empty(shape, dtype, buffer=None, offset=None):
    """An uninitialised C-contiguous array starting on a 64-byte boundary: a view of
    ``buffer`` (a uint8 array of at least ``nbytes + ALIGN - 1`` bytes; ``offset`` is its
    ``aligned_offset`` if known) or of a new one."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if buffer is None:
        buffer = np.empty(nbytes + ALIGN - 1, np.uint8)
    if offset is None:
        offset = aligned_offset(buffer)
    if buffer.nbytes < offset + nbytes:
        raise ValueError(f"buffer of {buffer.nbytes} bytes too small for {nbytes} bytes aligned")
    return np.ndarray(shape, dtype, buffer, offset)  # a view: its base is the buffer


def _free_refcount():
    """``sys.getrefcount`` of a buffer held only by the list of a ResultMemory, measured the way
    ``ResultMemory`` reads it, ``getrefcount(buffers[index])`` (interpreters differ in the
    references the call itself adds).
    Any array made from a buffer holds one more reference (its ``base``)."""
    probe = [np.empty(1, np.uint8)]
    return sys.getrefcount(probe[0])


_FREE_REFCOUNT = _free_refcount()


class ResultMemory:
    """Hands out result arrays backed by reusable buffers (see the module docstring).

    Parameters
    ----------
    max_free_extra_bytes : int, default 32 MiB
        Free bytes kept beyond the most bytes in use at any of the last ``_USE_WINDOW``
        requests; free buffers beyond them are dropped, oldest first.

    Attributes
    ----------
    trims : int
        Passes over the buffers that looked for free ones to drop.
    """

    def __init__(self, max_free_extra_bytes=_MAX_FREE_EXTRA_BYTES):
        self._lock = threading.Lock()
        self.max_free_extra_bytes = max_free_extra_bytes
        self.trims = 0
        self.clear()

    @property
    def nbytes(self):
        """Bytes held, in use or free."""
        return self._total

    def empty(self, shape, dtype):
        """An uninitialised C-contiguous array, like ``np.empty(shape, dtype)``."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < _MIN_BYTES or not _ENABLED:
            # Not reused, and not aligned either: aligning costs microseconds, and small
            # results are the frequent ones. A kernel that needs a small array aligned
            # asks aligned_empty for it.
            return np.empty(shape, dtype)
        need = nbytes + ALIGN - 1
        getrefcount = sys.getrefcount
        with self._lock:
            # One pass (a request costs ~1 µs, a call makes several): the smallest free
            # buffer that fits, and how many bytes are free.
            buffers, sizes = self._buffers, self._sizes
            best, free_bytes = -1, 0
            for index in range(len(buffers)):
                if getrefcount(buffers[index]) == _FREE_REFCOUNT:
                    size = sizes[index]
                    free_bytes += size
                    if need <= size and need >= _MIN_FILL * size and (best < 0 or size < sizes[best]):
                        best = index
            if best >= 0:
                # Move it to the end: the lists stay in order of last use.
                buffer, size, offset = buffers.pop(best), sizes.pop(best), self._offsets.pop(best)
                free_bytes -= size
            else:
                buffer = np.empty(need, np.uint8)
                size, offset = need, aligned_offset(buffer)
                self._total += size
            buffers.append(buffer)
            sizes.append(size)
            self._offsets.append(offset)
            used = self._total - free_bytes
            self._recent_use.append(used)
            # The same bound as _trim's (the window's peak use), so that a loop whose results
            # pass the allowance does not run a trim that drops nothing at every step; the
            # cheap test first, as the window's peak is never below the use now.
            extra = self.max_free_extra_bytes
            if len(buffers) > _MAX_BUFFERS or (
                    free_bytes > used + extra and free_bytes > max(self._recent_use) + extra):
                self._trim()
        return np.ndarray(shape, dtype, buffer, offset)  # a view: its base is the buffer

    def zeros(self, shape, dtype):
        """Like ``np.zeros(shape, dtype)``."""
        array = self.empty(shape, dtype)
        array.fill(0)
        return array

    def clear(self):
        """Forget every buffer (arrays in use stay valid: they hold their buffer)."""
        with self._lock:
            # Parallel lists, in order of last use: the buffers, their sizes in bytes and
            # the offset of their first 64-byte boundary.
            self._buffers, self._sizes, self._offsets = [], [], []
            self._total = 0
            self._recent_use = deque(maxlen=_USE_WINDOW)  # bytes in use at each request

    def _trim(self):
        """Drop free buffers, oldest first, beyond ``_MAX_BUFFERS`` buffers or beyond
        ``max_free_extra_bytes`` more free bytes than the most bytes in use at any of the
        last ``_USE_WINDOW`` requests."""
        self.trims += 1
        free = [index for index in range(len(self._buffers))
                if sys.getrefcount(self._buffers[index]) == _FREE_REFCOUNT]
        free_bytes = sum(self._sizes[index] for index in free)
        used_bytes = max(self._total - free_bytes, max(self._recent_use, default=0))
        excess = len(self._buffers) - _MAX_BUFFERS
        drop = []
        for index in free:  # oldest first: the list is in order of last use
            if excess <= 0 and free_bytes <= used_bytes + self.max_free_extra_bytes:
                break
            drop.append(index)
            excess -= 1
            free_bytes -= self._sizes[index]
        for index in reversed(drop):
            self._total -= self._sizes[index]
            del self._buffers[index], self._sizes[index], self._offsets[index]
