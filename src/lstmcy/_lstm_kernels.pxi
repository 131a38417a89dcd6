# The LSTM kernels, compiled once per instruction set (the _lstm*.pyx that include this
# file; lstmcy/_dispatch.py picks one at import).
#
# Design
# ------
# A kernel call runs one layer, both directions, as a list of tasks that any number of
# threads take in order (lstmcy's thread pool runs the job; the GIL is released for the
# whole call). The recurrences are split by batch rows, since a row's recurrence never
# reads another row (a batch too thin for row groups splits the hidden units instead); the
# batched products (the input projection, dW, dx) are pieces of steps or blocks of gate
# rows. Every piece, chunk and block is a function of the shape and every product of a
# row or column is computed the same way whatever shares its call, so the results are
# bitwise identical for every thread count (and in the AVX2 and AVX-512 builds).
#
# Files, one concern each:
#   _sync.h, _sync.pxd              events a thread waits for, claims, the clock, FP mode
#   _threadpool.h, .pyx, .pxd       the worker threads (one pool per process)
#   _layer.pxd                      ForwardCall / BackwardCall (one struct per layer call),
#                                   task kinds, row tables, the trace
#   _cell.pxd                       the gate math of one cell, forward and backward
#   _packed_gemm.h, .pxd            the per-step recurrent products
#   _blas.pxd, _blas.pyx            BLAS (the batched products)
#   _forward.pxi, _backward.pxi     the tasks of a forward / backward call, their worker loop
#   _units.pxi                      the units split's worker loop (forward and backward)
#   this file                       the entry points: checks, the call struct, the task list

from cython cimport floating
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
import numpy as np

from lstmcy._blas cimport gemm, NoTrans, Trans
from lstmcy._cell cimport backward_cell, forward_cell, forward_cell_inference
from lstmcy._fastmath cimport fast_sigmoid, fast_tanh
from lstmcy._layer cimport (
    BackwardCall, ForwardCall, RowTable, Saved, SPLIT_ROWS, SPLIT_UNITS, Split, Task, TaskKind, Trace,
    TASK_DX, TASK_FINISH, TASK_GATHER, TASK_PACK, TASK_PROJECT, TASK_RECURRENCE,
    TASK_UNIT_STEP, TASK_WEIGHTS, TRACE_FIELDS, UnitsCall, row_of, trace_start, trace_task,
    unit_range, units_packed_offset)
from lstmcy._packed_gemm cimport (gemm_tn, pack, packed_gemm, packed_gemm2, packed_len,
                                  panel_width, pg_d_packed_len, pg_s_packed_len)
from lstmcy._sync cimport (claim, compare_exchange, event_add, event_get, event_set,
                           load_acquire, lstmcy_event, store_release, take_next)
from lstmcy._threadpool cimport job_fn, job_wait, run_job, wait_spin_ns

include "_forward.pxi"
include "_backward.pxi"
include "_units.pxi"

#: The order of the seven saved activations the entry points take (lstmcy's SAVED_NAMES).
SAVED_ORDER = ("i", "g", "f", "o", "h", "c", "tanhc")


cdef inline char *_data2(const floating[:, ::1] a) noexcept:
    return NULL if a.shape[0] == 0 or a.shape[1] == 0 else <char *>&a[0, 0]


cdef inline char *_data3(const floating[:, :, ::1] a, Py_ssize_t k) noexcept:
    return NULL if a.shape[1] == 0 or a.shape[2] == 0 else <char *>&a[k, 0, 0]


cdef inline void _rows(RowTable *table, const floating[:, ::1] a, const Py_ssize_t[::1] step_row,
                       Py_ssize_t batch_stride) noexcept:
    table.data = _data2(a)
    table.ld = a.shape[1]
    table.col = 0
    table.step_row = &step_row[0] if step_row.shape[0] > 0 else NULL
    table.batch_stride = batch_stride


cdef void _set_saved(Saved *saved, tuple arrays, Py_ssize_t D, Py_ssize_t rows,
                     Py_ssize_t H, Py_ssize_t P, floating *like) except *:
    """saved[d] for each direction d < D: the direction-d rows of the seven ``[D, rows, H]``
    arrays (h: ``[D, rows, P]``) of ``arrays``, in SAVED_ORDER (checked)."""
    cdef floating[:, :, ::1] i, g, f, o, h, c, tanhc
    cdef Py_ssize_t d, k
    if len(arrays) != 7:
        raise ValueError(f"saved must hold the 7 activations {SAVED_ORDER}")
    i, g, f, o, h, c, tanhc = arrays
    if not (_dims(&i.shape[0], D, rows, H) and _dims(&g.shape[0], D, rows, H)
            and _dims(&f.shape[0], D, rows, H) and _dims(&o.shape[0], D, rows, H)
            and _dims(&h.shape[0], D, rows, P) and _dims(&c.shape[0], D, rows, H)
            and _dims(&tanhc.shape[0], D, rows, H)):
        for k in range(7):  # name the first wrong one (formatted only when raised)
            width = P if SAVED_ORDER[k] == "h" else H
            if arrays[k].shape != (D, rows, width):
                raise ValueError(f"saved {SAVED_ORDER[k]} must be [{D}, {rows}, {width}], "
                                 f"got {list(arrays[k].shape)}")
    for d in range(D):
        saved[d].i = _data3(i, d)
        saved[d].g = _data3(g, d)
        saved[d].f = _data3(f, d)
        saved[d].o = _data3(o, d)
        saved[d].h = _data3(h, d)
        saved[d].c = _data3(c, d)
        saved[d].tanhc = _data3(tanhc, d)


cdef inline void _add_task(Task *tasks, Py_ssize_t *n, int kind, Py_ssize_t d, Py_ssize_t i,
                           Py_ssize_t j) noexcept:
    tasks[n[0]].kind = kind
    tasks[n[0]].d = <int>d
    tasks[n[0]].i = <int>i
    tasks[n[0]].j = <int>j
    n[0] += 1


cdef inline bint _dims(const Py_ssize_t *shape, Py_ssize_t a, Py_ssize_t b,
                       Py_ssize_t c) noexcept:
    """Whether a memoryview's first three extents are (a, b, c) (c < 0: two only)."""
    return shape[0] == a and shape[1] == b and (c < 0 or shape[2] == c)


cdef bint _steps_fit(const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
                     Py_ssize_t B) noexcept:
    """Whether every step has 0 to B rows, and its packed rows follow the step before's."""
    cdef Py_ssize_t t, start = 0
    for t in range(batch_sizes.shape[0]):
        if batch_sizes[t] < 0 or batch_sizes[t] > B or packed_start[t] != start:
            return False
        start += batch_sizes[t]
    return True


cdef bint _rows_fit(const Py_ssize_t[::1] step_row, Py_ssize_t batch_stride,
                    const Py_ssize_t[::1] batch_sizes, Py_ssize_t n_rows) noexcept:
    """Whether the rows a row table names (``step_row[t] + b * batch_stride`` for the
    ``batch_sizes[t]`` active rows b of each step t) all lie within ``n_rows``."""
    cdef Py_ssize_t t, last
    for t in range(batch_sizes.shape[0]):
        if batch_sizes[t] == 0:
            continue
        last = step_row[t] + (batch_sizes[t] - 1) * batch_stride
        if step_row[t] < 0 or last < 0 or step_row[t] >= n_rows or last >= n_rows:
            return False
    return True


cdef void _check_row_tables(const Py_ssize_t[::1] batch_sizes,
                            const Py_ssize_t[::1] packed_start, Py_ssize_t B, Py_ssize_t N,
                            const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
                            Py_ssize_t x_rows, bint x_rows_packed,
                            const Py_ssize_t[::1] out_step_row, Py_ssize_t out_batch_stride,
                            Py_ssize_t out_rows, str out_name) except *:
    """Every row the step tables name, read or written, lies within its array: the layer
    input x (``x_rows`` rows; all N packed rows when ``x_rows_packed``) and ``out_name``
    (y in the forward, dy in the backward), and no step has more rows than B."""
    _need(_steps_fit(batch_sizes, packed_start, B),
          "batch_sizes must be at most B each, and packed_start their running sum")
    if not (_rows_fit(x_step_row, x_batch_stride, batch_sizes, x_rows)
            and _rows_fit(out_step_row, out_batch_stride, batch_sizes, out_rows)
            and (not x_rows_packed or x_rows >= N)):
        raise ValueError(f"x and {out_name} must hold every row their step tables name")


cdef void _need(bint ok, str what) except *:
    if not ok:
        raise ValueError(what)


cdef Py_ssize_t _count(Py_ssize_t total, Py_ssize_t per) noexcept:
    return (total + per - 1) // per if total > 0 else 0


cdef Trace _trace_of(object trace, int *count) except *:
    """The trace of a call (``count``: where its entries are counted)."""
    cdef Trace out
    cdef long long[:, ::1] entries
    out.entries = NULL
    out.capacity = 0
    out.count = count
    if trace is not None:
        entries = trace
        _need(entries.shape[1] == TRACE_FIELDS, f"trace must have {TRACE_FIELDS} columns")
        if entries.shape[0] > 0:
            out.entries = &entries[0, 0]
            out.capacity = <int>min(entries.shape[0], 2 ** 30)
    return out


cdef void _order_dx_pieces(BackwardCall *bc, int *order) noexcept:
    """The dx pieces sorted by the steps the recurrences must do before each can run (one
    direction: the last steps first; two: the middle ones), ties by index."""
    cdef Py_ssize_t n = bc.n_dx_pieces
    cdef Py_ssize_t q, j, d, need, other
    cdef int piece
    for q in range(n):
        order[q] = <int>q
    for q in range(1, n):  # insertion sort: a few dozen pieces
        piece = order[q]
        need = 0
        for d in range(bc.D):
            need = max(need, _dx_steps_needed(bc, d, piece))
        j = q
        while j > 0:
            other = 0
            for d in range(bc.D):
                other = max(other, _dx_steps_needed(bc, d, order[j - 1]))
            if other <= need:
                break
            order[j] = order[j - 1]
            j -= 1
        order[j] = piece
    bc.dx_order = order


cdef void _row_blocks(const Py_ssize_t *sizes, Py_ssize_t T, Py_ssize_t B, Py_ssize_t groups,
                      Py_ssize_t *start) noexcept nogil:
    """Cut the B rows (sorted longest first; ``sizes``: active rows per step) into ``groups``
    blocks of consecutive rows with about as many active steps each: ``start[g]`` is the
    first row of block g, ``start[groups] = B``. Consecutive rather than interleaved
    (g, g + groups, ...), whose threads write neighbouring rows of the same arrays at every
    step: on two threads that ran the forward up to 13 % slower and the backward up to 9 %
    (benchmarks/results/row_blocks.md)."""
    cdef Py_ssize_t b = 0, t, g, done = 0, total = 0
    for t in range(T):
        total += sizes[t]
    t = T
    start[0] = 0
    for g in range(1, groups + 1):
        # rows until the blocks so far hold g / groups of the active steps
        while b < B and done * groups < total * g:
            while t > 0 and sizes[t - 1] <= b:  # row b is active in steps [0, t)
                t -= 1
            done += t
            b += 1
        start[g] = b
    start[groups] = B


cdef Py_ssize_t _packed(Py_ssize_t n, Py_ssize_t k, bint is_double) noexcept:
    return pg_d_packed_len(n, k) if is_double else pg_s_packed_len(n, k)


cdef Py_ssize_t _units_packed(Py_ssize_t H, Py_ssize_t parts, Py_ssize_t K,
                              bint is_double) noexcept:
    """Elements of the four gates' columns of a [K, 4H] matrix packed part by part."""
    if is_double:
        return units_packed_offset(H, parts, parts, 4, K, <double *>NULL)
    return units_packed_offset(H, parts, parts, 4, K, <float *>NULL)


cdef Py_ssize_t _forward_ih_offset(Py_ssize_t H, Py_ssize_t P, bint projected, int split,
                                   Py_ssize_t groups, bint is_double) noexcept:
    """Where w_ih^T's panels start in one direction's packed weights of a forward (after
    w_hh^T's, and w_hr^T's with a projection)."""
    if split == SPLIT_ROWS:
        return _packed(4 * H, P, is_double) + (_packed(P, H, is_double) if projected else 0)
    return _units_packed(H, groups, H, is_double)


def forward_packed_len(Py_ssize_t H, Py_ssize_t P, Py_ssize_t I, bint projected, int split,
                       Py_ssize_t groups, bint fused_input, bint is_double):
    """Elements of one direction's packed weights in a forward: w_hh^T for the rows split
    (then w_hr^T with a projection), or each of ``groups`` unit parts' columns; then with
    ``fused_input`` w_ih^T (``I`` input features) in the same way."""
    cdef Py_ssize_t n = _forward_ih_offset(H, P, projected, split, groups, is_double)
    if not fused_input:
        return n
    if split == SPLIT_ROWS:
        return n + _packed(4 * H, I, is_double)
    return n + _units_packed(H, groups, I, is_double)


cdef Py_ssize_t _backward_ih_offset(Py_ssize_t H, Py_ssize_t P, bint projected, int split,
                                    Py_ssize_t groups, bint is_double) noexcept:
    """Where w_ih's panels start in one direction's packed weights of a backward (after
    w_hh's, and w_hr's with a projection)."""
    if split == SPLIT_ROWS:
        return _packed(P, 4 * H, is_double) + (_packed(H, P, is_double) if projected else 0)
    if is_double:
        return units_packed_offset(H, groups, groups, 1, 4 * H, <double *>NULL)
    return units_packed_offset(H, groups, groups, 1, 4 * H, <float *>NULL)


def backward_packed_len(Py_ssize_t H, Py_ssize_t P, Py_ssize_t I, bint projected, int split,
                        Py_ssize_t groups, bint packed_dx, bint is_double):
    """Elements of one direction's packed weights in a backward: w_hh (its P columns, K =
    4H; split by units, each of ``groups`` parts' columns), then w_hr (its H columns, K =
    P) with a projection, then with ``packed_dx`` w_ih (its ``I`` columns, K = 4H)."""
    cdef Py_ssize_t n = _backward_ih_offset(H, P, projected, split, groups, is_double)
    return n + (_packed(I, 4 * H, is_double) if packed_dx else 0)


def packed_elements(Py_ssize_t n, Py_ssize_t k, bint is_double):
    """Elements a ``[k, n]`` matrix takes once packed (the panel width depends on the build)."""
    return pg_d_packed_len(n, k) if is_double else pg_s_packed_len(n, k)


def forward_layer(
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        bint x_rows_packed,
        const floating[:, :, ::1] w_ih, const floating[:, :, ::1] w_hh,
        const floating[:, ::1] bias, const floating[:, :, ::1] w_hr,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        floating[:, ::1] y, const Py_ssize_t[::1] y_step_row, Py_ssize_t y_batch_stride,
        const floating[:, :, ::1] h0, floating[:, :, ::1] h_n, floating[:, :, ::1] c_state,
        tuple saved, bint training,
        floating[:, :, ::1] gates, floating[:, :, ::1] r_rows, floating[:, ::1] x_packed,
        floating[::1] w_packed, schedule, int n_threads, bint flush_denormals=True, trace=None):
    """Run one layer forward, both directions.

    Parameters
    ----------
    x, x_step_row, x_batch_stride, x_rows_packed
        Layer input ``[rows, I]`` as a row table; ``x_rows_packed`` says row ``n`` of ``x``
        is packed row ``n`` (then ``x`` is read in place, else gathered into ``x_packed``).
    w_ih, w_hh : ndarray [D, 4H, I], [D, 4H, P]
        P is the size of h: H, or with a projection its size.
    bias : ndarray [D, 4H]
        ``b_ih + b_hh`` (zeros without bias).
    w_hr : ndarray [D, P, H]
        The projection (``h_t = (o * tanh(c_t)) @ w_hr^T``), or ``[D, 0, H]`` for none.
    batch_sizes, packed_start : ndarray [T] of intp
        Active rows per step (longest first) and the first packed row of each step.
    y, y_step_row, y_batch_stride
        Output ``[rows, D*P]`` as a row table; direction ``d`` writes columns
        ``d*P .. (d+1)*P``.
    h0 : ndarray [D, B, P]
        The initial hidden state.
    h_n : ndarray [D, B, P]
        Out: the final hidden state (untouched when there are no steps).
    c_state : ndarray [D, B, H]
        In: the initial cell state. Out: the final one.
    saved : tuple of 7 ndarray [D, T*B, H] (h: [D, T*B, P])
        The activations in ``SAVED_ORDER``, written when ``training`` (else ``[D, 0, .]``).
    training : bool
    gates : ndarray [D, N, ldg]
        Workspace (N: packed rows): the gates, 4H of each row of ``ldg >= 4H`` (padded
        where rows of 4H would fall in the same cache sets).
    r_rows : ndarray [D, N, H]
        Workspace with a projection (else ``[D, 0, H]``).
    x_packed : ndarray [N, I]
        Workspace, when not ``x_rows_packed`` (else ``[0, I]``).
    w_packed : ndarray
        Workspace of ``D * forward_packed_len(H, P, I, projected, split, groups,
        fused_input, is_double)`` elements.
    schedule
        ``split`` (0 rows, 1 units), ``groups`` (row groups or unit parts per direction),
        ``piece_steps`` (steps per projection piece), ``pack_pieces``, ``fused_input``.
    n_threads : int
        Threads to run on (at most; the pool may give fewer when others use it).
    flush_denormals : bool
        Run with subnormal numbers flushed to zero (the caller's mode is restored).
    trace : ndarray [capacity, TRACE_FIELDS] of int64, optional
        Receives an entry per task (kind, direction, i, j, worker, start, end, 0).

    Returns
    -------
    (n_workers, n_trace)
        The threads that ran the call and the trace entries written.
    """
    cdef ForwardCall fc
    cdef Py_ssize_t D = w_ih.shape[0]
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t B = h0.shape[1]
    cdef Py_ssize_t P = h0.shape[2]
    cdef Py_ssize_t H = c_state.shape[2]
    cdef Py_ssize_t I = w_ih.shape[2]
    cdef Py_ssize_t N = gates.shape[1]
    cdef bint projected = w_hr.shape[1] > 0
    cdef Py_ssize_t d, j, g, q, n_tasks, which, n_matrices
    cdef int split = schedule.split
    cdef Py_ssize_t groups = schedule.groups
    cdef Py_ssize_t piece_steps = schedule.piece_steps
    cdef Py_ssize_t pack_pieces = schedule.pack_pieces
    cdef Py_ssize_t n_pieces = _count(T, piece_steps) if piece_steps > 0 else 0
    cdef Py_ssize_t plen
    cdef job_fn job
    cdef int n_workers, n_trace
    _need(1 <= D <= 2 and w_hh.shape[0] == D and bias.shape[0] == D and w_hr.shape[0] == D,
          "D must be 1 or 2")
    _need(w_ih.shape[1] == 4 * H and w_hh.shape[1] == 4 * H and w_hh.shape[2] == P
          and bias.shape[1] == 4 * H and w_hr.shape[2] == H
          and (w_hr.shape[1] == P if projected else P == H),
          "weights must be [D, 4H, I], [D, 4H, P], bias [D, 4H], w_hr [D, P, H] or [D, 0, H]")
    _need(x.shape[1] == I and y.shape[1] >= D * P, "x must be [rows, I] and y [rows, D*P]")
    _need(h0.shape[0] == D and _dims(&h_n.shape[0], D, B, P)
          and _dims(&c_state.shape[0], D, B, H),
          "h0 and h_n must be [D, B, P], c_state [D, B, H]")
    _need(not projected or _dims(&r_rows.shape[0], D, N, H), "r_rows must be [D, N, H]")
    _need(packed_start.shape[0] == T and x_step_row.shape[0] == T and y_step_row.shape[0] == T,
          "batch_sizes, packed_start and the step rows must have T entries")
    _need(N == (packed_start[T - 1] + batch_sizes[T - 1] if T > 0 else 0) and gates.shape[0] >= D
          and gates.shape[2] >= 4 * H, "gates must be [D, N, ldg], ldg >= 4H")
    _check_row_tables(batch_sizes, packed_start, B, N, x_step_row, x_batch_stride, x.shape[0],
                      x_rows_packed, y_step_row, y_batch_stride, y.shape[0], "y")
    _need(x_rows_packed or (x_packed.shape[0] >= N and x_packed.shape[1] == I),
          "x_packed must be [N, I]")
    if not (groups >= 1 and piece_steps >= 1 and pack_pieces >= 1
            and (split == SPLIT_ROWS or (split == SPLIT_UNITS and not projected))):
        raise ValueError(f"bad schedule {schedule!r}")  # formatted only when raised
    plen = forward_packed_len(H, P, I, projected, split, groups, schedule.fused_input,
                              floating is double)
    _need(w_packed.shape[0] >= D * plen, "w_packed is too small")
    memset(&fc, 0, sizeof(fc))
    if training:
        _set_saved(fc.saved, saved, D, T * B, H, P, <floating *>NULL)
    if T == 0 or B == 0 or N == 0:
        return 1, 0

    fc.steps.T = T
    fc.steps.B = B
    fc.steps.N = N
    fc.steps.sizes = &batch_sizes[0]
    fc.steps.start = &packed_start[0]
    fc.D = D
    fc.I = I
    fc.H = H
    fc.P = P
    fc.projected = projected
    fc.hr_offset = packed_len(4 * H, P, <floating *>NULL)
    fc.ih_offset = _forward_ih_offset(H, P, projected, split, groups, floating is double)
    fc.fused_input = schedule.fused_input
    fc.training = training
    _rows(&fc.x, x, x_step_row, x_batch_stride)
    fc.x_rows_packed = x_rows_packed
    _rows(&fc.y, y, y_step_row, y_batch_stride)
    for d in range(2):
        fc.w_ih[d] = _data3(w_ih, d) if d < D else NULL
        fc.w_hh[d] = _data3(w_hh, d) if d < D else NULL
        fc.bias[d] = <char *>&bias[d, 0] if d < D and H > 0 else NULL
        fc.h0[d] = _data3(h0, d) if d < D else NULL
        fc.h_n[d] = _data3(h_n, d) if d < D else NULL
        fc.c_state[d] = _data3(c_state, d) if d < D else NULL
        fc.gates[d] = _data3(gates, d) if d < D else NULL
        fc.w_hr[d] = _data3(w_hr, d) if d < D and projected else NULL
        fc.r_rows[d] = _data3(r_rows, d) if d < D and projected else NULL
        fc.w_packed[d] = <char *>&w_packed[d * plen] if d < D and plen > 0 else NULL
    fc.x_packed = _data2(x_packed) if not x_rows_packed else NULL
    fc.ldg = gates.shape[2]
    fc.split = <Split>split
    fc.groups = groups
    fc.piece_steps = piece_steps
    fc.n_pieces = n_pieces
    fc.pack_pieces = pack_pieces
    fc.spin_ns = wait_spin_ns(n_threads)

    # The task list: packing (rows split), the projection pieces in the order the
    # recurrences use them (two directions: from both ends), the row groups.
    n_matrices = 1 + projected + fc.fused_input  # w_hh, w_hr, w_ih
    n_tasks = D * pack_pieces * n_matrices + n_pieces + D * groups
    cdef Task *tasks = <Task *>calloc(n_tasks, sizeof(Task))
    cdef lstmcy_event *events = <lstmcy_event *>calloc(n_pieces + 6, sizeof(lstmcy_event))
    cdef int *claims = <int *>calloc(D * T * groups if split == SPLIT_UNITS else 1, sizeof(int))
    cdef Py_ssize_t *row_start = <Py_ssize_t *>calloc(groups + 1, sizeof(Py_ssize_t))
    if tasks == NULL or events == NULL or claims == NULL or row_start == NULL:
        free(tasks)
        free(events)
        free(claims)
        free(row_start)
        raise MemoryError()
    _row_blocks(&batch_sizes[0], T, B, groups, row_start)
    n_tasks = 0
    if split == SPLIT_ROWS and H > 0:
        for d in range(D):
            for which in range(3):
                if (which == 1 and not projected) or (which == 2 and not fc.fused_input):
                    continue
                for q in range(pack_pieces):
                    _add_task(tasks, &n_tasks, TASK_PACK, d, q, which)
    for j in range(n_pieces):
        q = j if D == 1 else (j // 2 if j % 2 == 0 else n_pieces - 1 - j // 2)
        _add_task(tasks, &n_tasks, TASK_PROJECT, 0, q, 0)
    if split == SPLIT_ROWS:
        for g in range(groups):
            for d in range(D):
                _add_task(tasks, &n_tasks, TASK_RECURRENCE, d, g, 0)
    fc.tasks = tasks
    fc.n_tasks = <int>n_tasks
    fc.next_task = &events[n_pieces].value
    fc.pack_done = &events[n_pieces + 1]
    fc.step_done = &events[n_pieces + 3]
    fc.piece_done = events
    fc.row_start = row_start
    fc.unit_claims = claims
    fc.trace = _trace_of(trace, &events[n_pieces + 5].value)
    job = _forward_job_float if floating is float else _forward_job_double
    try:
        with nogil:
            n_workers = run_job(n_threads, job, &fc, flush_denormals)
        # The trace's count lives in `events`: read it before `events` is freed.
        n_trace = min(fc.trace.count[0], fc.trace.capacity)
    finally:
        free(tasks)
        free(events)
        free(claims)
        free(row_start)
    return n_workers, n_trace


def backward_layer(
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        bint x_rows_packed,
        const floating[:, ::1] dy, const Py_ssize_t[::1] dy_step_row, Py_ssize_t dy_batch_stride,
        const floating[:, :, ::1] w_ih, const floating[:, :, ::1] w_hh,
        const floating[:, :, ::1] w_hr,
        const floating[:, :, ::1] h0, const floating[:, :, ::1] c0, tuple saved,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        floating[:, :, ::1] dh_state, floating[:, :, ::1] dc_state,
        floating[:, ::1] dx, bint want_dx,
        floating[:, :, ::1] dw_ih, floating[:, :, ::1] dw_hh, floating[:, ::1] db,
        floating[:, :, ::1] dw_hr, bint want_dparams,
        floating[:, :, ::1] dgates, floating[:, :, ::1] dh_rows, floating[:, :, ::1] dr_rows,
        floating[:, :, ::1] z, floating[:, :, ::1] dw,
        double[:, ::1] db_acc, floating[:, :, ::1] dw_hr_acc,
        floating[:, ::1] dx_packed, floating[::1] w_packed,
        schedule, int n_threads, bint flush_denormals=True, trace=None):
    """Backpropagate through one layer, both directions.

    Parameters
    ----------
    x, x_step_row, x_batch_stride, x_rows_packed
        Layer input ``[rows, I]`` as a row table; ``dx`` has the same rows.
    dy, dy_step_row, dy_batch_stride
        Gradient of the layer output (direction ``d`` reads columns ``d*P .. (d+1)*P``).
    w_ih, w_hh : ndarray [D, 4H, I], [D, 4H, P]
        P is the size of h: H, or with a projection its size.
    w_hr : ndarray [D, P, H]
        The projection, or ``[D, 0, H]`` for none.
    h0, c0 : ndarray [D, B, P], [D, B, H]
        Initial states of the forward.
    saved : tuple of 7 ndarray [D, T*B, H] (h: [D, T*B, P])
        The forward's activations, in ``SAVED_ORDER``.
    batch_sizes, packed_start : ndarray [T] of intp
    dh_state, dc_state : ndarray [D, B, P], [D, B, H]
        In: gradients of ``h_n``, ``c_n``. Out: gradients of ``h0``, ``c0``.
    dx : ndarray [rows, I]
        Input gradient, written at active rows when ``want_dx`` (padded rows untouched).
    dw_ih, dw_hh, db, dw_hr : ndarray [D, 4H, I], [D, 4H, P], [D, 4H], [D, P, H]
        Parameter gradients, written when ``want_dparams`` (else ``[D, 0, .]``; dw_hr
        ``[D, 0, H]`` without a projection).
    dgates : ndarray [D, N, ldg]
        Workspace: the gate gradients, 4H of each row of ``ldg >= 4H`` (padded where rows
        of 4H would fall in the same cache sets).
    dh_rows, dr_rows : ndarray [D, N, P], [D, N, H]
        Workspaces with a projection: dh_t of every row and dh_t @ w_hr (else ``[D, 0, .]``).
    z : ndarray [D, N, I + P] (with a projection [D, N, I + P + H])
        Workspace: ``[x | h_{t-1} (| o * tanh(c_t))]`` in packed row order (when
        ``want_dparams``).
    dw : ndarray [D, lanes*4H, I + P]
        Workspace: ``[dW_ih | dW_hh]`` summed over each lane's chunks (when
        ``want_dparams``).
    db_acc : ndarray [D, lanes*4H] of float64
        Workspace: db summed over each lane's chunks, in float64.
    dw_hr_acc : ndarray [D, lanes*P, H]
        Workspace with a projection: dW_hr summed over each lane's chunks (else
        ``[D, 0, H]``).
    dx_packed : ndarray [N, I]
        Workspace: dx in packed row order (``want_dx`` and not ``x_rows_packed``).
    w_packed : ndarray
        Workspace of ``D * backward_packed_len(H, P, I, projected, split, groups, packed_dx,
        is_double)`` elements.
    schedule
        ``split`` (0 rows, 1 units: not with a projection), ``groups`` (row groups or unit
        parts per direction), ``first`` and ``chunk`` (steps of the first
        chunk and of the others), ``block_rows`` (gate rows per block of dW, and rows of
        the projection's per block of dW_hr), ``lanes`` (chunk c adds to lane
        ``c % lanes``'s sums), ``dx_steps`` (steps per dx piece), ``pack_pieces``,
        ``panel_weights``, ``packed_dx`` (dx by the packed product from w_ih packed once).
    n_threads, flush_denormals, trace
        As for :func:`forward_layer`.

    Returns
    -------
    (n_workers, n_trace)
    """
    cdef BackwardCall bc
    cdef Py_ssize_t D = w_ih.shape[0]
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t B = h0.shape[1]
    cdef Py_ssize_t P = h0.shape[2]
    cdef Py_ssize_t H = c0.shape[2]
    cdef Py_ssize_t I = w_ih.shape[2]
    cdef bint projected = w_hr.shape[1] > 0
    cdef Py_ssize_t Z = I + P + (H if projected else 0)
    cdef Py_ssize_t G4 = 4 * H
    cdef Py_ssize_t N = dgates.shape[1]
    cdef int split = schedule.split
    cdef Py_ssize_t groups = schedule.groups
    cdef Py_ssize_t first = schedule.first
    cdef Py_ssize_t chunk = schedule.chunk
    cdef Py_ssize_t block_rows = schedule.block_rows
    cdef Py_ssize_t lanes = schedule.lanes
    cdef Py_ssize_t dx_steps = schedule.dx_steps
    cdef Py_ssize_t pack_pieces = schedule.pack_pieces
    cdef bint panel_weights = schedule.panel_weights
    cdef bint packed_dx = schedule.packed_dx
    cdef Py_ssize_t n_chunks, n_blocks, n_dx, n_tasks, d, g, q, c, k, plen, which
    cdef job_fn job
    cdef int n_workers, n_trace
    _need(1 <= D <= 2 and w_hh.shape[0] == D and w_hr.shape[0] == D, "D must be 1 or 2")
    _need(w_ih.shape[1] == G4 and w_hh.shape[1] == G4 and w_hh.shape[2] == P
          and w_hr.shape[2] == H and (w_hr.shape[1] == P if projected else P == H),
          "weights must be [D, 4H, I], [D, 4H, P], w_hr [D, P, H] or [D, 0, H]")
    _need(_dims(&h0.shape[0], D, B, P) and _dims(&c0.shape[0], D, B, H)
          and _dims(&dh_state.shape[0], D, B, P) and _dims(&dc_state.shape[0], D, B, H),
          "h0 and dh_state must be [D, B, P], c0 and dc_state [D, B, H]")
    _need(x.shape[1] == I and dy.shape[1] >= D * P, "x must be [rows, I] and dy [rows, D*P]")
    _need(packed_start.shape[0] == T and x_step_row.shape[0] == T and dy_step_row.shape[0] == T,
          "batch_sizes, packed_start and the step rows must have T entries")
    _need(N == (packed_start[T - 1] + batch_sizes[T - 1] if T > 0 else 0) and dgates.shape[0] >= D
          and dgates.shape[2] >= G4, "dgates must be [D, N, ldg], ldg >= 4H")
    _check_row_tables(batch_sizes, packed_start, B, N, x_step_row, x_batch_stride, x.shape[0],
                      x_rows_packed, dy_step_row, dy_batch_stride, dy.shape[0], "dy")
    if not (groups >= 1 and first >= 1 and chunk >= 1 and block_rows >= 1 and lanes >= 1
            and dx_steps >= 1 and pack_pieces >= 1
            and (split == SPLIT_ROWS or (split == SPLIT_UNITS and not projected))
            and not (panel_weights and projected)):
        raise ValueError(f"bad schedule {schedule!r}")  # formatted only when raised
    if panel_weights:  # each chunk's rows as packed panels of I + P columns
        Z = packed_len(I + P, 1, <floating *>NULL)
    _need(not want_dx or (dx.shape[0] == x.shape[0] and dx.shape[1] == I
                          and (x_rows_packed or (dx_packed.shape[0] >= N and dx_packed.shape[1] == I))),
          "dx must be shaped like x, and dx_packed [N, I]")
    _need(not want_dparams or (_dims(&dw_ih.shape[0], D, G4, I) and _dims(&dw_hh.shape[0], D, G4, P)
                               and _dims(&db.shape[0], D, G4, -1)
                               and _dims(&dw_hr.shape[0], D, w_hr.shape[1], H)
                               and _dims(&z.shape[0], D, N, Z)
                               and _dims(&dw.shape[0], D, lanes * G4, I + P)
                               and _dims(&db_acc.shape[0], D, lanes * G4, -1)
                               and _dims(&dw_hr_acc.shape[0], D, lanes * w_hr.shape[1], H)),
          "dw_ih, dw_hh, db, dw_hr must be [D, 4H, I], [D, 4H, P], [D, 4H], [D, P, H]; "
          "z [D, N, I + P (+ H), or the panels' width]; dw, db_acc, dw_hr_acc "
          "[D, lanes*4H, I + P], [D, lanes*4H], [D, lanes*P, H]")
    _need(not projected or (_dims(&dh_rows.shape[0], D, N, P)
                            and _dims(&dr_rows.shape[0], D, N, H)),
          "dh_rows and dr_rows must be [D, N, P] and [D, N, H]")
    plen = backward_packed_len(H, P, I, projected, split, groups, packed_dx, floating is double)
    _need(w_packed.shape[0] >= D * plen, "w_packed is too small")
    memset(&bc, 0, sizeof(bc))
    _set_saved(bc.saved, saved, D, T * B, H, P, <floating *>NULL)
    n_chunks = 0 if T == 0 else (1 if T <= first else 1 + _count(T - first, chunk))
    if want_dparams and (n_chunks == 0 or B == 0):
        # No steps, or no rows: no product adds anything.
        dw_ih[...] = 0
        dw_hh[...] = 0
        db[...] = 0
        dw_hr[...] = 0
    if T == 0 or B == 0:
        return 1, 0

    bc.steps.T = T
    bc.steps.B = B
    bc.steps.N = N
    bc.steps.sizes = &batch_sizes[0]
    bc.steps.start = &packed_start[0]
    bc.D = D
    bc.I = I
    bc.H = H
    bc.P = P
    bc.projected = projected
    bc.z_width = Z
    bc.panel_weights = panel_weights
    bc.hr_offset = packed_len(P, G4, <floating *>NULL)
    bc.ih_offset = _backward_ih_offset(H, P, projected, split, groups, floating is double)
    bc.ldg = dgates.shape[2]
    bc.packed_dx = packed_dx
    _rows(&bc.x, x, x_step_row, x_batch_stride)
    bc.x_rows_packed = x_rows_packed
    _rows(&bc.dy, dy, dy_step_row, dy_batch_stride)
    _rows(&bc.dx, dx, x_step_row, x_batch_stride)
    bc.want_dx = want_dx
    bc.want_dparams = want_dparams
    for d in range(2):
        bc.w_ih[d] = _data3(w_ih, d) if d < D else NULL
        bc.w_hh[d] = _data3(w_hh, d) if d < D else NULL
        bc.h0[d] = _data3(h0, d) if d < D else NULL
        bc.c0[d] = _data3(c0, d) if d < D else NULL
        bc.dh_state[d] = _data3(dh_state, d) if d < D else NULL
        bc.dc_state[d] = _data3(dc_state, d) if d < D else NULL
        bc.dgates[d] = _data3(dgates, d) if d < D else NULL
        bc.w_packed[d] = <char *>&w_packed[d * plen] if d < D and plen > 0 else NULL
        if projected and d < D:
            bc.w_hr[d] = _data3(w_hr, d)
            bc.dh_rows[d] = _data3(dh_rows, d)
            bc.dr_rows[d] = _data3(dr_rows, d)
        if want_dparams and d < D and G4 > 0:
            bc.dw_ih[d] = _data3(dw_ih, d)
            bc.dw_hh[d] = _data3(dw_hh, d)
            bc.db[d] = <char *>&db[d, 0]
            bc.db_acc[d] = &db_acc[d, 0]
            bc.z[d] = _data3(z, d)
            bc.dw[d] = _data3(dw, d)
            bc.dw_hr[d] = _data3(dw_hr, d) if projected else NULL
            bc.dw_hr_acc[d] = _data3(dw_hr_acc, d) if projected else NULL
    bc.dx_packed = _data2(dx_packed) if want_dx and not x_rows_packed else NULL
    bc.split = <Split>split
    bc.groups = groups
    bc.first = first
    bc.chunk = chunk
    bc.n_chunks = n_chunks
    bc.block_rows = block_rows
    bc.n_gate_blocks = _count(G4, block_rows)
    n_blocks = bc.n_blocks = bc.n_gate_blocks + (_count(P, block_rows) if projected else 0)
    bc.lanes = lanes
    bc.dx_steps = dx_steps
    n_dx = bc.n_dx_pieces = _count(T, dx_steps)
    bc.pack_pieces = pack_pieces
    bc.spin_ns = wait_spin_ns(n_threads)

    n_tasks = D * pack_pieces * (2 if projected else 1) + D * groups
    cdef Task *tasks = <Task *>calloc(n_tasks, sizeof(Task))
    # next_task, pack_done[2], step_done[2], progress[D*groups], gathered[D*n_chunks],
    # ih_packed, the trace's count
    cdef Py_ssize_t n_events = 7 + D * groups + D * n_chunks
    cdef lstmcy_event *events = <lstmcy_event *>calloc(n_events, sizeof(lstmcy_event))
    # gather claims [D*n_chunks], block_next and block_busy [D*lanes*n_blocks], lanes_done
    # [D*n_blocks], dx_next, dx_order, unit claims [D*(T+1)*groups] (units split),
    # ih_pack_claim
    cdef Py_ssize_t n_chains = D * lanes * n_blocks
    cdef Py_ssize_t n_unit_claims = D * (T + 1) * groups if split == SPLIT_UNITS else 0
    cdef int *flags = <int *>calloc(D * n_chunks + 2 * n_chains + D * n_blocks + 1 + n_dx
                                    + n_unit_claims + 1, sizeof(int))
    cdef Py_ssize_t *row_start = <Py_ssize_t *>calloc(groups + 1, sizeof(Py_ssize_t))
    if tasks == NULL or events == NULL or flags == NULL or row_start == NULL:
        free(tasks)
        free(events)
        free(flags)
        free(row_start)
        raise MemoryError()
    _row_blocks(&batch_sizes[0], T, B, groups, row_start)
    bc.row_start = row_start
    bc.next_task = &events[0].value
    bc.pack_done = &events[1]
    bc.step_done = &events[3]
    bc.progress = &events[5]
    bc.gathered = &events[5 + D * groups]
    bc.ih_packed = &events[n_events - 2]
    bc.trace = _trace_of(trace, &events[n_events - 1].value)
    bc.gather_claims = flags
    bc.block_next = flags + D * n_chunks
    bc.block_busy = bc.block_next + n_chains
    bc.lanes_done = bc.block_busy + n_chains
    bc.dx_next = bc.lanes_done + D * n_blocks
    _order_dx_pieces(&bc, bc.dx_next + 1)
    bc.unit_claims = bc.dx_next + 1 + n_dx
    bc.ih_pack_claim = bc.unit_claims + n_unit_claims
    if not want_dx:
        bc.n_dx_pieces = 0

    # The task list (see _backward.pxi): packing and the row groups' recurrences (rows
    # split; with the units split the threads take the steps' parts after the list); the
    # gradients follow as the recurrences make them ready.
    n_tasks = 0
    if split == SPLIT_ROWS:
        if H > 0:
            for d in range(D):
                for which in range(2 if projected else 1):  # w_hh, and w_hr
                    for q in range(pack_pieces):
                        _add_task(tasks, &n_tasks, TASK_PACK, d, q, which)
        for g in range(groups):
            for d in range(D):
                _add_task(tasks, &n_tasks, TASK_RECURRENCE, d, g, 0)
    bc.tasks = tasks
    bc.n_tasks = <int>n_tasks
    job = _backward_job_float if floating is float else _backward_job_double
    try:
        with nogil:
            n_workers = run_job(n_threads, job, &bc, flush_denormals)
        # The trace's count lives in `events`: read it before `events` is freed.
        n_trace = min(bc.trace.count[0], bc.trace.capacity)
    finally:
        free(tasks)
        free(events)
        free(flags)
        free(row_start)
    return n_workers, n_trace


def _packed_matmul(const floating[:, ::1] a, const floating[:, ::1] w, bint trans,
                   floating[:, ::1] c, bint accumulate, Py_ssize_t n0=0, Py_ssize_t n=-1):
    """Probe of the packed GEMM (tests): ``c (+)= a @ op(w)[:, n0:n0+n]`` through ``pack``
    and ``packed_gemm`` (``op(w)`` is ``w.T`` when ``trans``)."""
    cdef Py_ssize_t K = a.shape[1]
    if n < 0:
        n = (w.shape[0] if trans else w.shape[1]) - n0
    if (w.shape[1] if trans else w.shape[0]) != K or c.shape[0] != a.shape[0] or c.shape[1] != n:
        raise ValueError("shapes do not match")
    if n0 < 0 or n0 + n > (w.shape[0] if trans else w.shape[1]):
        raise ValueError("column range out of bounds")
    if a.shape[0] == 0 or n == 0 or K == 0:
        raise ValueError("empty products are not handled by the packed GEMM")
    cdef floating[::1] packed
    if floating is float:
        packed = np.empty(pg_s_packed_len(n, K), dtype=np.float32)
    else:
        packed = np.empty(pg_d_packed_len(n, K), dtype=np.float64)
    with nogil:
        pack(&w[0, 0], w.shape[1], trans, K, n0, n, &packed[0])
        packed_gemm(a.shape[0], n, K, &a[0, 0], a.shape[1], &packed[0], &c[0, 0], c.shape[1],
                    accumulate)


def _packed_matmul2(const floating[:, ::1] a, const floating[:, ::1] w,
                    const floating[:, ::1] a2, const floating[:, ::1] w2, floating[:, ::1] c):
    """Probe of the sum of two packed products (tests): ``c = a @ w.T + a2 @ w2.T`` through
    ``pack`` and ``packed_gemm2``."""
    cdef Py_ssize_t M = a.shape[0], n = w.shape[0], K = a.shape[1], K2 = a2.shape[1]
    if (w.shape[1] != K or w2.shape[1] != K2 or a2.shape[0] != M or w2.shape[0] != n
            or c.shape[0] != M or c.shape[1] != n):
        raise ValueError("shapes do not match")
    if M == 0 or n == 0 or K == 0 or K2 == 0:
        raise ValueError("empty products are not handled by the packed GEMM")
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] packed = np.empty(packed_len(n, K, &c[0, 0]), dtype=dtype)
    cdef floating[::1] packed2 = np.empty(packed_len(n, K2, &c[0, 0]), dtype=dtype)
    with nogil:
        pack(&w[0, 0], K, True, K, 0, n, &packed[0])
        pack(&w2[0, 0], K2, True, K2, 0, n, &packed2[0])
        packed_gemm2(M, n, K, &a[0, 0], K, &packed[0], K2, &a2[0, 0], K2, &packed2[0],
                     &c[0, 0], n)


def _gemm_tn(const floating[:, ::1] a, const floating[:, ::1] b, floating[:, ::1] c,
             bint accumulate):
    """Probe of the weight-gradient product (tests): ``c (+)= a.T @ b`` through ``pack``
    (of b) and ``gemm_tn``."""
    cdef Py_ssize_t K = a.shape[0]
    if b.shape[0] != K or c.shape[0] != a.shape[1] or c.shape[1] != b.shape[1]:
        raise ValueError("shapes do not match")
    if c.shape[0] == 0 or c.shape[1] == 0 or K == 0:
        raise ValueError("empty products are not handled by the packed GEMM")
    cdef floating[::1] packed = np.empty(packed_len(b.shape[1], K, &c[0, 0]),
                                         dtype=np.float32 if floating is float else np.float64)
    with nogil:
        pack(&b[0, 0], b.shape[1], False, K, 0, b.shape[1], &packed[0])
        gemm_tn(c.shape[0], c.shape[1], K, &a[0, 0], a.shape[1], &packed[0], &c[0, 0],
                c.shape[1], accumulate)


def _vector_sigmoid(const floating[::1] x, floating[::1] out):
    """Probe of the activations (tests): ``out = sigmoid(x)`` as the kernels compute it."""
    cdef Py_ssize_t k
    with nogil:
        for k in range(x.shape[0]):
            out[k] = fast_sigmoid(x[k])


def _vector_tanh(const floating[::1] x, floating[::1] out):
    """Probe of the activations (tests): ``out = tanh(x)`` as the kernels compute it."""
    cdef Py_ssize_t k
    with nogil:
        for k in range(x.shape[0]):
            out[k] = fast_tanh(x[k])
