"""How a layer's work is cut into tasks, and over how many threads: policy only.

:mod:`lstmcy._core` runs the layer loops; for each kernel call it asks this module for the
call's schedule. Two kinds of decision are made here, and kept apart:

* **What fixes the bits** is a function of the shape alone: the forward's projection
  pieces, the backward's chunks of steps, its blocks of dW rows and its dx pieces (each is
  one BLAS call, and BLAS rounds a product by how it is cut). Results therefore never
  depend on the thread count.
* **How many threads, and how the recurrence is split** between them (row groups, or unit
  parts for a forward with few rows) depends on the thread count too, and never changes a
  result: a row's or a column's recurrent products are the same whichever rows or columns
  share a call.

The automatic thread count for a call is ``threads_for_work(flops, cpus)``: one thread per
``FLOPS_PER_THREAD`` of the layer's work, at most the CPUs the process may use (see
:func:`lstmcy._threads.available_cpus`). Below that much work a thread costs more (its
wake-up, its share of the synchronisation) than it saves; the ThreadTuner then moves
small calls to one thread while more are slower.
"""
import functools
import math
from collections import namedtuple

#: Work (floating-point operations) per thread before another one is worth its start.
FLOPS_PER_THREAD = 1e6
#: Fewest batch rows in one row group of a recurrence: fewer rows leave the packed GEMM
#: of a step mostly loading w_hh.
MIN_GROUP_ROWS = 4
#: A forward too narrow for row groups splits the hidden units of every step between
#: threads once a step's recurrent product per part reaches this (FLOPs), since every
#: step then waits for every part of the previous one.
MIN_UNIT_PART_FLOPS = 1e5
#: Rows (steps x batch) of one projection piece of the forward (a BLAS GEMM of 4H columns).
PROJECTION_ROWS = 256
#: The backward's chunks of steps: about this many rows, and at least T / MAX_CHUNKS steps.
CHUNK_ROWS = 64
MAX_CHUNKS = 8
#: Rows of one dx piece of the backward (a BLAS GEMM that packs w_ih anew).
DX_PIECE_ROWS = 512
#: Gate rows of one block of dW: the blocks are the weight gradients' parallel tasks.
MIN_BLOCK_ROWS = 64
MAX_BLOCKS = 16

# The kernels' split of a forward recurrence (lstmcy._layer.Split).
SPLIT_ROWS = 0
SPLIT_UNITS = 1

ForwardSchedule = namedtuple("ForwardSchedule", "split groups piece_steps pack_pieces")
ForwardSchedule.__doc__ = """The schedule of one forward layer call.

split : SPLIT_ROWS or SPLIT_UNITS
groups : row groups (or unit parts) per direction
piece_steps : steps per projection piece (shape only)
pack_pieces : pieces of the packing of w_hh per direction
"""
BackwardSchedule = namedtuple("BackwardSchedule",
                              "groups first chunk block_rows dx_steps pack_pieces")
BackwardSchedule.__doc__ = """The schedule of one backward layer call.

groups : row groups per direction
first, chunk : steps of the first chunk and of the others (shape only)
block_rows : gate rows per block of dW (shape only)
dx_steps : steps per dx piece (shape only)
pack_pieces : pieces of the packing of w_hh per direction
"""


def threads_for_work(flops, cpus):
    """The automatic thread count of a call of ``flops`` work on ``cpus`` usable CPUs."""
    return max(1, min(cpus, int(flops // FLOPS_PER_THREAD)))


def _row_groups(B, D, n_threads):
    """Row groups per direction: a share of the threads, each group some rows."""
    return max(1, min(n_threads // D, B // MIN_GROUP_ROWS))


def _pack_pieces(columns, n_threads):
    """Pieces of a packing of ``columns`` columns (at least 64 columns each)."""
    return max(1, min(n_threads, math.ceil(columns / 64)))


@functools.lru_cache(maxsize=512)
def chunk_steps(T, B):
    """Steps per chunk of the backward (shape only)."""
    if T == 0:
        return 1
    return min(T, max(math.ceil(T / MAX_CHUNKS), math.ceil(CHUNK_ROWS / max(B, 1))))


@functools.lru_cache(maxsize=512)
def forward_schedule(T, B, H, D, n_threads):
    """The :class:`ForwardSchedule` of a layer of ``T`` steps, ``B`` rows, ``H`` units and
    ``D`` directions on ``n_threads`` threads."""
    piece_steps = max(1, min(max(T, 1), math.ceil(PROJECTION_ROWS / max(B, 1))))
    per_direction = max(1, n_threads // D)
    groups = _row_groups(B, D, n_threads)
    if groups == 1 and per_direction >= 2:
        parts = min(per_direction, H // 16, int(8.0 * B * H * H // MIN_UNIT_PART_FLOPS))
        if parts >= 2:
            return ForwardSchedule(SPLIT_UNITS, parts, piece_steps, 1)
    return ForwardSchedule(SPLIT_ROWS, groups, piece_steps, _pack_pieces(4 * H, n_threads))


@functools.lru_cache(maxsize=512)
def backward_schedule(T, B, H, D, n_threads):
    """The :class:`BackwardSchedule` of a layer on ``n_threads`` threads. The first chunk
    is short with one direction, so that the weight gradients can start early on threads
    the recurrence leaves free."""
    chunk = chunk_steps(T, B)
    first = chunk if D == 2 else max(1, math.ceil(chunk / 4))
    dx_steps = max(1, math.ceil(DX_PIECE_ROWS / max(B, 1)))
    block_rows = max(MIN_BLOCK_ROWS, math.ceil(4 * H / MAX_BLOCKS / 16) * 16)
    return BackwardSchedule(_row_groups(B, D, n_threads), first, chunk, block_rows, dx_steps,
                            _pack_pieces(H, n_threads))
