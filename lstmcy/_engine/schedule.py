"""How a layer's work is cut into tasks, and over how many threads: policy only.

:mod:`lstmcy._engine.plan` runs the layer loops; for each kernel call it asks this module for the
call's schedule. Two kinds of decision are made here, and kept apart:

* **What fixes the bits** is a function of the shape alone (and of whether the BLAS has
  a path for small products, a fact of the process: see SMALL_GEMM): the forward's
  projection pieces, the backward's chunks of steps, its blocks of dW rows and its dx
  pieces (each is one BLAS call or one of lstmcy's own products, and a product's rounding
  depends on how it is cut), and which product takes them. Results therefore never depend
  on the thread count.
* **How many threads, and how the recurrence is split** between them (row groups, or unit
  parts for a batch too thin for row groups) depends on the thread count too, and never
  changes a result: a row's or a column's recurrent products are the same whichever rows
  or columns share a call.

The automatic thread count for a call is ``threads_for_work(flops, cpus)``: one thread per
``FLOPS_PER_THREAD`` of the layer's work, at most the CPUs the process may use (see
:func:`lstmcy._engine.threads.available_cpus`). Below that much work a thread costs more (its
wake-up, its share of the synchronisation) than it saves; the ThreadTuner then moves
small calls to one thread while more are slower.
"""
import functools
import math
from collections import namedtuple
from typing import Callable, NamedTuple

import numpy as np

from lstmcy._engine.results import ALIGN

#: Work (floating-point operations) per thread before another one is worth its start.
FLOPS_PER_THREAD = 1e6
#: Kernel calls whose time step is at most this much work (FLOPs) may be moved to one
#: thread by the ThreadTuner (the small shapes: (B, I, H) = (32, 64, 128) has 6 MFLOP a
#: step forward, 13 backward). Beyond it the threads' synchronisation is a small part of a
#: step, and each try of one thread would cost a long call.
TUNED_STEP_FLOPS = 1.6e7
#: OpenBLAS runs a GEMM on one thread when m*n*k <= 65536 * GEMM_MULTITHREAD_THRESHOLD (4):
#: a call whose largest GEMM is that small needs no cap on BLAS threads (which costs tens
#: of microseconds).
SINGLE_THREADED_GEMM = 65536 * 4
#: Fewest batch rows in one row group of a recurrence: with fewer, a step's packed GEMM
#: mostly loads w_hh. A narrow w_hh (small H) is loaded fastest, so it wants more rows:
#: at least GROUP_ROW_UNITS / H in the backward, FORWARD_GROUP_ROW_UNITS / H in the
#: forward, whose threads have only the input projection to work on beside the
#: recurrence where the backward's have the weight gradients and dx (docs/benchmarks.md,
#: "Schedule rules").
MIN_GROUP_ROWS = 4
GROUP_ROW_UNITS = 512
FORWARD_GROUP_ROW_UNITS = 256
#: A batch too thin for row groups splits the hidden units of every step between threads
#: instead (not with a projection, whose product needs every unit of a step): each part
#: computes its units for every row against its own columns of w_hh, which stay in its
#: core's cache, but every step waits for every part of the previous one (a wait of a few
#: microseconds between cores, more on a loaded machine) and reads the other cores' gate
#: gradients (backward) or h (forward) of the step before. Row groups never wait for each
#: other but each streams all of w_hh every step. The units split is chosen, where it
#: gives at least as many parts as there would be groups, when:
#:
#: * there would be one group (a part has at least MIN_UNIT_PART_FLOPS of recurrent
#:   product per step and 16 units);
#: * w_hh is large (H >= HEAVY_UNITS: 4 MiB in float32) and the groups would have fewer
#:   than UNIT_SPLIT_ROWS rows.
#:
#: Below HEAVY_UNITS thin row groups win (docs/benchmarks.md, "Schedule rules").
MIN_UNIT_PART_FLOPS = 1e6
UNIT_SPLIT_ROWS = 32
HEAVY_UNITS = 512
#: Rows (steps x batch) of one projection piece of the forward (a GEMM of 4H columns: a BLAS
#: call, or lstmcy's packed product with packed_projection).
PROJECTION_ROWS = 256
#: The backward's chunks of steps: about this many rows, and at least T / MAX_CHUNKS steps.
CHUNK_ROWS = 64
MAX_CHUNKS = 8
#: Rows of one dx piece of the backward (a BLAS GEMM that packs w_ih anew, which costs
#: about 6 % of its work at this size; or a piece of lstmcy's product, see
#: PACKED_DX_FEATURES).
DX_PIECE_ROWS = 256
#: Gate rows of one block of dW: a block's GEMM over a chunk re-packs the chunk's
#: [x | h_{t-1}] rows, so a block has at least MIN_BLOCK_ROWS rows (fewer lose a
#: noticeable share of a GEMM's time to that packing) and is at least BLOCK_FLOPS of work
#: (smaller ones lose much of it to BLAS's per-call cost); a layer has at most MAX_BLOCKS.
MIN_BLOCK_ROWS = 256
MAX_BLOCKS = 16
BLOCK_FLOPS = 2e6
#: OpenBLAS's AVX-512 builds (its SkylakeX, Cooperlake and SapphireRapids kernels, which it
#: also runs on AMD Zen 4 and 5) multiply a GEMM of at most SMALL_GEMM = m * n * k straight
#: from its operands, without the packing of its general path. Where the BLAS has that
#: path (``small_gemms``), a backward whose chunks of ~CHUNK_ROWS rows allow blocks of dW
#: of at least MIN_SMALL_BLOCK_ROWS gate rows within it is cut that way, and its dx pieces
#: too where a step's rows fit. Without that path the same cuts would pack the operands
#: for every small GEMM, so the other rules stay (docs/benchmarks.md, "Schedule rules").
SMALL_GEMM = 1e6
MIN_SMALL_BLOCK_ROWS = 64
#: Lanes of the weight gradients: chunk c adds into lane c % lanes's own sums, which are
#: added up at the end, so that as many threads add consecutive chunks of one block at
#: once. At most MAX_LANES, at most the chunks, and at most LANE_BYTES of sums per
#: direction (in float64; the sums' final addition reads them all once).
MAX_LANES = 4
LANE_BYTES = 32 << 20
#: A layer of at least PANEL_WEIGHTS_COLUMNS columns of dW (I + P, no projection) adds its
#: weight gradients with lstmcy's own product (``gemm_tn`` in _packed_gemm_impl.h) instead
#: of OpenBLAS: the gathered ``[x | h_{t-1}]`` rows of a chunk are laid out in panels once,
#: and every block of gate rows multiplies them from there, where each BLAS call packs them
#: anew. Narrower layers keep OpenBLAS: a panel is 32 columns wide (AVX-512, float32), and
#: a last panel of a few columns would cost a whole panel's work (docs/benchmarks.md,
#: "Schedule rules").
PANEL_WEIGHTS_COLUMNS = 256
#: The cores whose AVX-512 weight-gradient product reads a block of gate-gradient rows in
#: place, panel by panel, for chunks of more than 128 rows or products of fewer than 8
#: panels (``pg_tn_rows_in_place`` in _packed_gemm.h): (vendor, CPU family) pairs. AMD's
#: family 0x19 (Zen 4, whose 512-bit multiply-adds run as two 256-bit halves) ran braun's
#: and large-256's weight gradients at 101-104 GF/s a thread in place against 87-92
#: copied. Elsewhere every block's rows are copied together first: on Intel's AVX-512
#: cores (two 512-bit multiply-add ports) braun 160-165 GF/s against 117-133 in place and
#: large-256 166-181 against 130-144, and in the AVX2 builds 93-104 against 79-87
#: (tools/backward_tasks.py, 2 threads; docs/benchmarks.md, "Schedule rules").
WEIGHTS_ROWS_IN_PLACE_CORES = frozenset({("AuthenticAMD", 0x19)})
#: A backward layer of at least PACKED_DX_FEATURES input features and PACKED_DX_UNITS
#: units takes dx = dgates @ w_ih with lstmcy's own product (``packed_dx``): w_ih is packed
#: once per call, by the first thread to reach a dx piece, and every piece multiplies it
#: from there, where each OpenBLAS call packs it anew. Narrower layers keep OpenBLAS, which
#: multiplies their small pieces without packing them where the BLAS has that path
#: (SMALL_GEMM; docs/benchmarks.md, "Schedule rules").
PACKED_DX_FEATURES = 64
PACKED_DX_UNITS = 128
#: Rows this many bytes apart (or a multiple) fall in the same few sets of a core's L1
#: cache. The packed products read or write a block of rows at once, so the gates and the
#: gate gradients get one cache line of padding per row where 4H values would be that long
#: (gate_row_stride; docs/benchmarks.md, "Schedule rules").
ALIASED_ROW_BYTES = 4096

#: A forward layer of at least FUSED_INPUT_ROWS sequences whose w_ih takes at most
#: FUSED_INPUT_BYTES takes x's product inside the recurrence (``fused_input``): each step's
#: packed GEMM gives x_t @ w_ih^T + h_{t-1} @ w_hh^T, with w_ih^T packed once beside
#: w_hh^T, instead of a BLAS projection writing every row's gates to memory for the
#: recurrence to read back. With fewer rows a step's product is a matrix-vector one, and
#: a larger w_ih makes the forward slower (docs/benchmarks.md, "Schedule rules").
FUSED_INPUT_ROWS = 4
FUSED_INPUT_BYTES = 1 << 20
#: A float32 forward layer of at least PACKED_PROJECTION_FEATURES input features and
#: PACKED_PROJECTION_UNITS units whose x product is not fused and takes more than one
#: projection piece projects with lstmcy's own product from w_ih^T packed once per call
#: (``packed_projection``), where each BLAS call of a piece packs w_ih anew; in float64
#: OpenBLAS's projection was faster (docs/benchmarks.md, "Schedule rules"). With one piece
#: OpenBLAS packs w_ih once too, and the bits stay those of a one-step call
#: (``LSTMPlan.step``).
PACKED_PROJECTION_FEATURES = 64
PACKED_PROJECTION_UNITS = 128

# The kernels' split of a forward recurrence (lstmcy._layer.Split).
SPLIT_ROWS = 0
SPLIT_UNITS = 1

ForwardSchedule = namedtuple("ForwardSchedule",
                             "split groups piece_steps pack_pieces fused_input packed_projection",
                             defaults=(False, False))
ForwardSchedule.__doc__ = """The schedule of one forward layer call.

split : SPLIT_ROWS or SPLIT_UNITS
groups : row groups (or unit parts) per direction
piece_steps : steps per projection piece (shape only)
pack_pieces : pieces of each packing of a weight matrix per direction (rows split, or
    packed_projection)
fused_input : x's product inside the recurrence's packed GEMM, not a BLAS projection
    (shape only; see FUSED_INPUT_ROWS)
packed_projection : the projection pieces by lstmcy's own product from w_ih^T packed once
    (shape only; see PACKED_PROJECTION_FEATURES)
"""
BackwardSchedule = namedtuple(
    "BackwardSchedule",
    "split groups first chunk block_rows lanes dx_steps pack_pieces panel_weights packed_dx",
    defaults=(False, False))
BackwardSchedule.__doc__ = """The schedule of one backward layer call.

split : SPLIT_ROWS or SPLIT_UNITS
groups : row groups (or unit parts) per direction
first, chunk : steps of the first chunk and of the others (shape only)
block_rows : gate rows per block of dW (shape only)
lanes : lanes of chunks of dW, each with its own sums (shape only)
dx_steps : steps per dx piece (shape only)
pack_pieces : pieces of the packing of w_hh per direction
panel_weights : the weight gradients by lstmcy's own product from chunks laid out in
    panels, not by OpenBLAS (shape only; see PANEL_WEIGHTS_COLUMNS)
packed_dx : dx by lstmcy's own product from w_ih packed once, not by OpenBLAS (shape only;
    see PACKED_DX_FEATURES; lstmcy._engine.plan turns it off for a call that computes no dx, whose
    workspace then has no room for the packed w_ih)
"""


def threads_for_work(flops, cpus):
    """The automatic thread count of a call of ``flops`` work on ``cpus`` usable CPUs."""
    return max(1, min(cpus, int(flops // FLOPS_PER_THREAD)))


def _row_groups(B, H, D, n_threads, row_units):
    """Row groups per direction: a share of the threads, each group enough rows (at least
    ``row_units / H``)."""
    rows = max(MIN_GROUP_ROWS, math.ceil(row_units / max(H, 1)))
    return max(1, min(n_threads // D, B // rows))


def _pack_pieces(columns, n_threads):
    """Pieces of a packing of ``columns`` columns (at least 64 columns each)."""
    return max(1, min(n_threads, math.ceil(columns / 64)))


def _small_cuts(T, B, I, H):
    """``(chunk, block_rows, dx_steps)`` of a backward whose GEMMs stay within SMALL_GEMM,
    or None where the blocks of dW would be thinner than MIN_SMALL_BLOCK_ROWS. dx_steps is
    0 where a step's rows do not fit (the dx pieces then follow DX_PIECE_ROWS)."""
    G4 = 4 * H
    chunk = max(1, min(T, math.ceil(CHUNK_ROWS / max(B, 1))))
    fit = int(SMALL_GEMM // max(1, (I + H) * chunk * B)) // 16 * 16
    if fit < MIN_SMALL_BLOCK_ROWS:
        return None
    blocks = max(1, math.ceil(G4 / fit))  # as few blocks as fit, of even sizes
    block_rows = max(16, math.ceil(G4 / blocks / 16) * 16)
    dx_steps = int(SMALL_GEMM // max(1, I * G4 * B))
    return chunk, block_rows, min(dx_steps, max(T, 1))


@functools.lru_cache(maxsize=512)
def chunk_steps(T, B, I=0, H=0, small_gemms=False):
    """Steps per chunk of the backward (shape only; ``small_gemms``: the BLAS has a path for
    small products, see SMALL_GEMM)."""
    if T == 0:
        return 1
    small = _small_cuts(T, B, I, H) if small_gemms else None
    if small is not None:
        return small[0]
    return min(T, max(math.ceil(T / MAX_CHUNKS), math.ceil(CHUNK_ROWS / max(B, 1))))


def _split(B, H, D, n_threads, row_units, projected):
    """``(split, groups)``: row groups (each at least ``row_units / H`` rows), or unit parts
    where those would be too thin (see UNIT_SPLIT_ROWS)."""
    groups = _row_groups(B, H, D, n_threads, row_units)
    per_direction = max(1, n_threads // D)
    if per_direction < 2 or projected:
        return SPLIT_ROWS, groups
    thin = groups == 1 or (H >= HEAVY_UNITS and B // groups < UNIT_SPLIT_ROWS)
    parts = min(per_direction, H // 16, int(8.0 * B * H * H // MIN_UNIT_PART_FLOPS))
    if thin and parts >= max(2, groups):
        return SPLIT_UNITS, parts
    return SPLIT_ROWS, groups


@functools.lru_cache(maxsize=512)
def forward_schedule(T, B, I, H, D, n_threads, projected=False, itemsize=4):
    """The :class:`ForwardSchedule` of a layer of ``T`` steps, ``B`` rows, input size ``I``,
    ``H`` units and ``D`` directions on ``n_threads`` threads (``projected``: with a
    projection; ``itemsize``: bytes of the computed floats)."""
    piece_steps = max(1, min(max(T, 1), math.ceil(PROJECTION_ROWS / max(B, 1))))
    split, groups = _split(B, H, D, n_threads, FORWARD_GROUP_ROW_UNITS, projected)
    fused = fused_input(B, I, H, itemsize)
    packed = not fused and T > piece_steps and packed_projection(I, H, itemsize)
    pack_pieces = _pack_pieces(4 * H, n_threads) if split == SPLIT_ROWS or packed else 1
    return ForwardSchedule(split, groups, piece_steps, pack_pieces, fused, packed)


def fused_input(B, I, H, itemsize=4):
    """Whether a forward layer of ``B`` sequences, ``I`` input features and ``H`` units
    takes x's product inside the recurrence (shape only; see FUSED_INPUT_ROWS)."""
    return B >= FUSED_INPUT_ROWS and I >= 1 and 4 * H * I * itemsize <= FUSED_INPUT_BYTES


def _block_rows(I, H, chunk_rows):
    """Gate rows per block of dW (a multiple of 16)."""
    rows = max(MIN_BLOCK_ROWS, BLOCK_FLOPS / (2.0 * max(I + H, 1) * max(chunk_rows, 1)),
               4 * H / MAX_BLOCKS)
    return int(min(math.ceil(rows / 16) * 16, max(16, math.ceil(4 * H / 16) * 16)))


@functools.lru_cache(maxsize=512)
def backward_lanes(T, B, I, H, small_gemms=False):
    """Lanes of the backward's weight gradients (shape only): the workspace of the
    gradients' sums is ``lanes`` times ``[4H, I + H]`` per direction."""
    chunk = chunk_steps(T, B, I, H, small_gemms)
    n_chunks = 1 if T <= chunk else 1 + math.ceil((T - chunk) / chunk)
    by_memory = LANE_BYTES // max(8 * 4 * H * (I + H), 1)
    return int(max(1, min(MAX_LANES, n_chunks, by_memory)))


@functools.lru_cache(maxsize=512)
def backward_schedule(T, B, I, H, D, n_threads, projected=False, small_gemms=False):
    """The :class:`BackwardSchedule` of a layer of input size ``I`` on ``n_threads``
    threads (``small_gemms``: the BLAS has a path for small products, see SMALL_GEMM). The
    first chunk is short with one direction, so that the weight gradients can start early
    on threads the recurrence leaves free."""
    chunk = chunk_steps(T, B, I, H, small_gemms)
    first = chunk if D == 2 else max(1, math.ceil(chunk / 4))
    dx_steps = max(1, math.ceil(DX_PIECE_ROWS / max(B, 1)))
    block_rows = _block_rows(I, H, chunk * B)
    small = _small_cuts(T, B, I, H) if small_gemms and T > 0 else None
    if small is not None:
        block_rows = small[1]
        dx_steps = small[2] or dx_steps
    split, groups = _split(B, H, D, n_threads, GROUP_ROW_UNITS, projected)
    pack_pieces = _pack_pieces(H, n_threads) if split == SPLIT_ROWS else 1
    return BackwardSchedule(split, groups, first, chunk, block_rows,
                            backward_lanes(T, B, I, H, small_gemms), dx_steps, pack_pieces,
                            panel_weights(I, H, projected), packed_dx(I, H))


def panel_weights(I, P, projected=False):
    """Whether a backward layer of ``I`` input features and h of size ``P`` adds its weight
    gradients with lstmcy's own product (shape only; see PANEL_WEIGHTS_COLUMNS)."""
    return not projected and I + P >= PANEL_WEIGHTS_COLUMNS


def weights_rows_in_place(kernels, vendor, family):
    """Whether the ``kernels`` build (``"avx512"``, ``"avx2"``, ``"baseline"``) on a CPU of
    ``vendor`` (CPUID's, e.g. ``"GenuineIntel"``; None if unknown) and ``family`` reads the
    gate gradients in place in the weight-gradient product where that measured faster (a
    fact of the process, not of a call; see WEIGHTS_ROWS_IN_PLACE_CORES). The results'
    bits are the same either way."""
    return kernels == "avx512" and (vendor, family) in WEIGHTS_ROWS_IN_PLACE_CORES


def packed_projection(I, H, itemsize=4):
    """Whether a forward layer of ``I`` input features and ``H`` units in floats of
    ``itemsize`` bytes, whose x product is not fused and takes more than one piece,
    projects from w_ih^T packed once (shape only; see PACKED_PROJECTION_FEATURES)."""
    return (itemsize == 4 and I >= PACKED_PROJECTION_FEATURES
            and H >= PACKED_PROJECTION_UNITS)


def packed_dx(I, H):
    """Whether a backward layer of ``I`` input features and ``H`` units takes dx with
    lstmcy's own product from w_ih packed once (shape only; see PACKED_DX_FEATURES)."""
    return I >= PACKED_DX_FEATURES and H >= PACKED_DX_UNITS


@functools.lru_cache(maxsize=256)
def gate_row_stride(H, dtype):
    """Elements between two rows of the gates (forward) or gate gradients (backward): 4H,
    and one cache line more where 4H values are a multiple of ALIASED_ROW_BYTES long (rows
    that far apart fall in the same few cache sets, and the packed products read or write
    a block of rows at once)."""
    itemsize = np.dtype(dtype).itemsize
    if H > 0 and (4 * H * itemsize) % ALIASED_ROW_BYTES == 0:
        return 4 * H + ALIGN // itemsize
    return 4 * H


class SchedulePolicy(NamedTuple):
    """How an :class:`~lstmcy.LSTMPlan` schedules its layer calls: the seam for tests and
    benchmarks that run other schedules (the default is lstmcy's own).

    ``forward(T, B, I, H, D, n_threads, projected, itemsize=...)`` and ``backward(T, B, I,
    H, D, n_threads, projected, small_gemms=...)`` return a call's :class:`ForwardSchedule` /
    :class:`BackwardSchedule` (as :func:`forward_schedule` and :func:`backward_schedule`
    do); ``cap_at_cpus``: they see the call's thread count capped at the process's CPUs
    (threads beyond them cannot run the recurrence's groups at once), else as given;
    ``row_stride(H, dtype)``: the elements between two rows of the gates and their
    gradients (:func:`gate_row_stride`).
    """

    forward: Callable = forward_schedule
    backward: Callable = backward_schedule
    cap_at_cpus: bool = True
    row_stride: Callable = gate_row_stride


#: lstmcy's own schedules.
DEFAULT_POLICY = SchedulePolicy()
