# The LSTM kernels, compiled once per instruction set (the _lstm*.pyx that include this
# file; lstmcy/_engine/dispatch.py picks one at import and tells it the CPU's facts).
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
#   _layer_call.pxi                 the entry points: ForwardLayer / BackwardLayer, one object
#                                   per kind of layer call (struct, buffers, tasks, checks)
#   _step_call.pxi                  StepForward: one cell step in the calling thread
#   _per_sample.pxi                 per-sample weight gradients (sums over a sequence's steps)
#   this file                       the helpers of the entry points, sizes, the two
#                                   process-wide settings of the CPU's facts
#                                   (set_weights_rows_in_place, set_tanh_one_from),
#                                   probes for tests

from cython cimport floating
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
import numpy as np

from lstmcy._blas cimport gemm, NoTrans, Trans
from lstmcy._cell cimport backward_cell, forward_cell, forward_cell_inference
from lstmcy._fastmath cimport (fast_sigmoid, fast_tanh, tanh_one_from,
                               set_tanh_one_from as _set_tanh_one_from)
from lstmcy._layer cimport (
    BackwardCall, ForwardCall, PackedMatrix, PACK_W_HH, PACK_W_HR, PACK_W_IH, RowTable, Saved,
    SPLIT_ROWS, SPLIT_UNITS, Split, Task, TaskKind, Trace,
    TASK_DX, TASK_FINISH, TASK_GATHER, TASK_PACK, TASK_PROJECT, TASK_RECURRENCE,
    TASK_UNIT_STEP, TASK_WEIGHTS, TRACE_FIELDS, UnitsCall, row_of, trace_start, trace_task,
    unit_range, units_packed_offset)
from lstmcy._packed_gemm cimport (gemm_tn, pack, packed_gemm, packed_gemm2, packed_len,
                                  panel_width, pg_d_packed_len, pg_s_packed_len,
                                  pg_set_tn_rows_in_place)
from lstmcy._sync cimport (claim, compare_exchange, event_add, event_get, event_set,
                           flush_denormals_mode, load_acquire, lstmcy_event,
                           restore_fp_mode, store_release, take_next)
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
    direction: the last steps first; two: the middle ones), ties by index. A function of
    the call's sizes and schedule only (set up before any batch layout is bound)."""
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
    (docs/benchmarks.md, "Schedule rules")."""
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
                       Py_ssize_t groups, bint fused_input, bint is_double,
                       bint packed_projection=False):
    """Elements of one direction's packed weights in a forward: w_hh^T for the rows split
    (then w_hr^T with a projection), or each of ``groups`` unit parts' columns; then with
    ``fused_input`` w_ih^T (``I`` input features) in the same way, or with
    ``packed_projection`` w_ih^T's 4H columns in panels (either split; never more than
    ``fused_input`` takes)."""
    cdef Py_ssize_t n = _forward_ih_offset(H, P, projected, split, groups, is_double)
    if fused_input and split == SPLIT_UNITS:
        return n + _units_packed(H, groups, I, is_double)
    if fused_input or packed_projection:
        return n + _packed(4 * H, I, is_double)
    return n


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


def set_tanh_one_from(double x):
    """Make the float64 tanh exactly 1 from ``x`` on (below it, 1 - 2**-53 at most), as
    PyTorch's is on this CPU (lstmcy._engine.saturation); the float32 tanh is unchanged.
    Process-wide: set it at import, or in a test while no call runs."""
    # From the first double whose correctly rounded tanh is 1 (saturation's
    # CORRECTLY_ROUNDED_TANH_ONE_FROM): below it "exactly 1 from x on" could not hold.
    if not 19.061547465398498 <= x < 20.0:
        raise ValueError(f"x: expected a point from 19.061547465398498 (where the correctly "
                         f"rounded tanh reaches 1) to 20, got {x!r}")
    _set_tanh_one_from(x)


def get_tanh_one_from():
    """The point from which the float64 tanh is exactly 1 (see set_tanh_one_from)."""
    return tanh_one_from


def set_weights_rows_in_place(bint on):
    """Let the weight-gradient product read the gate gradients in place where its rule
    allows (``on``; a fact of the core: see lstmcy._engine.schedule.weights_rows_in_place),
    or copy every block's rows together first. Process-wide: set it at import, or in a
    test while no call runs. Results are bitwise the same either way."""
    pg_set_tn_rows_in_place(on)


def packed_elements(Py_ssize_t n, Py_ssize_t k, bint is_double):
    """Elements a ``[k, n]`` matrix takes once packed (the panel width depends on the build)."""
    return pg_d_packed_len(n, k) if is_double else pg_s_packed_len(n, k)


include "_layer_call.pxi"
include "_step_call.pxi"
include "_per_sample.pxi"


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
