# The LSTM kernels, compiled once per instruction set (see the _lstm*.pyx that include
# this file and lstmcy/_dispatch.py, which picks one at import).
#
# LSTM kernels: one layer (both directions) forward and backward.
#
# Conventions
# -----------
# * Time steps ``t = 0 .. T-1``; at step ``t`` rows ``b < batch_sizes[t]`` are active
#   (sequences sorted longest first, as in PyTorch's ``PackedSequence``).
# * Work buffers (``gates``, ``dgates``) are *packed*: the active rows of step ``t`` are the
#   contiguous rows ``packed_start[t] .. packed_start[t] + batch_sizes[t]``. For uniform
#   batches this is the plain time-major ``[T*B, 4H]`` layout.
# * Caller-layout arrays (input, output and their gradients) are 2-D row tables: the row
#   of ``(t, b)`` is ``step_row[t] + b * batch_stride``. Time-major, batch-first, packed
#   and padded layouts are all expressed this way without copies.
# * Per-direction arrays are stacked on a leading axis of length D (direction 1 runs in
#   reverse time). Saved activations are ``[D, T*B, H]``, row ``t*B + b``.
# * The previous state of row ``b`` at step ``t`` is the saved state of the step processed
#   just before (``t-1`` forward, ``t+1`` reverse) if the row was active there, else the
#   initial state: this makes every reverse sequence start at its own last step.
#
# Threads
# -------
# Steps are grouped in fixed chunks (the chunk length depends on the shape only). With two
# threads, either the two directions run side by side, or (one direction) one thread runs
# the sequential recurrence while the other does the batched GEMMs of the chunks already
# finished. Every GEMM is single-threaded and the chunking is the same for any thread
# count, so results are bitwise identical whatever the number of threads.

from cython cimport floating
from cython.parallel cimport parallel, threadid
cimport openmp
from libc.stdlib cimport calloc, free
import numpy as np

from lstmcy._blas cimport gemm, NoTrans, Trans
from lstmcy._fastmath cimport fast_sigmoid, fast_tanh

cdef extern from "_packed_gemm.h" nogil:
    # The per-step recurrent products run against W_hh packed once per call (see the
    # header: OpenBLAS would re-pack W_hh on every step).
    void pg_s_pack(const float *w, Py_ssize_t ldw, int trans, Py_ssize_t K, Py_ssize_t n0,
                   Py_ssize_t n, float *out)
    void pg_d_pack(const double *w, Py_ssize_t ldw, int trans, Py_ssize_t K, Py_ssize_t n0,
                   Py_ssize_t n, double *out)
    void pg_s_gemm(Py_ssize_t M, Py_ssize_t n, Py_ssize_t K, const float *a, Py_ssize_t lda,
                   const float *packed, float *c, Py_ssize_t ldc, int accumulate)
    void pg_d_gemm(Py_ssize_t M, Py_ssize_t n, Py_ssize_t K, const double *a, Py_ssize_t lda,
                   const double *packed, double *c, Py_ssize_t ldc, int accumulate)
    Py_ssize_t pg_s_packed_len(Py_ssize_t n, Py_ssize_t K)
    Py_ssize_t pg_d_packed_len(Py_ssize_t n, Py_ssize_t K)

cdef extern from *:
    """
    static inline Py_ssize_t lstmcy_load_acquire(Py_ssize_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void lstmcy_store_release(Py_ssize_t *p, Py_ssize_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline void lstmcy_cpu_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield");
    #endif
    }
    static inline void lstmcy_prefetch(const void *p) { __builtin_prefetch(p, 0, 3); }
    static inline int lstmcy_compare_exchange(Py_ssize_t *p, Py_ssize_t expected, Py_ssize_t desired) {
        return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    static inline void lstmcy_add_release(Py_ssize_t *p, Py_ssize_t v) { __atomic_add_fetch(p, v, __ATOMIC_RELEASE); }
    """
    bint compare_exchange "lstmcy_compare_exchange"(Py_ssize_t *p, Py_ssize_t expected,
                                                     Py_ssize_t desired) noexcept nogil
    void add_release "lstmcy_add_release"(Py_ssize_t *p, Py_ssize_t v) noexcept nogil
    void prefetch "lstmcy_prefetch"(const void *p) noexcept nogil
    Py_ssize_t load_acquire "lstmcy_load_acquire"(Py_ssize_t *p) noexcept nogil
    void store_release "lstmcy_store_release"(Py_ssize_t *p, Py_ssize_t v) noexcept nogil
    void cpu_relax "lstmcy_cpu_relax"() noexcept nogil

# Restrict-qualified pointers for the elementwise row functions. Their loops read and
# write a dozen rows through raw pointers; declared restrict, the rows are known not to
# overlap and GCC vectorises the loops as they are. Through plain pointers it guards each
# loop with pairwise overlap checks, run on every call: at H = 64 a third of the forward's
# cell time went to them.
cdef extern from *:
    ctypedef float * float_rp "float * __restrict__"
    ctypedef double * double_rp "double * __restrict__"

ctypedef fused floating_rp:
    float_rp
    double_rp


cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<time.h>" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    int nanosleep(const timespec *req, timespec *rem)
    ctypedef int clockid_t
    clockid_t CLOCK_MONOTONIC
    int clock_gettime(clockid_t clk_id, timespec *tp)


# How long (ns) _wait_for spins on PAUSE, then yields, before it sleeps. A time, not a
# count: PAUSE takes ~10 cycles on some CPUs and ~140 on others.
cdef long long _spin_ns = 50000
cdef long long _yield_ns = 1000000


def _set_spin_limits(long long spin_us, long long yield_us):
    """Tuning hook: how long (µs) a wait spins, then yields, before it sleeps."""
    global _spin_ns, _yield_ns
    _spin_ns = spin_us * 1000
    _yield_ns = yield_us * 1000


cdef inline long long _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <long long>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline void _sleep_ns(long long ns) noexcept nogil:
    """Sleep ``ns`` nanoseconds (the long waits, and the start-delay test hook)."""
    cdef timespec pause
    pause.tv_sec = ns // 1000000000
    pause.tv_nsec = ns % 1000000000
    nanosleep(&pause, NULL)


cdef inline void _wait_for(Py_ssize_t *progress, Py_ssize_t chunks) noexcept nogil:
    """Block until the producer has published ``chunks`` finished chunks.

    Spin first (50 µs): on an idle machine the producer is running on the other core and
    the wait is short (the per-step waits last a few microseconds, less than a
    ``sched_yield`` system call costs). If it goes on, yield (1 ms), and then sleep
    briefly: the producer has probably lost its core to another process, so give the core
    back instead of burning it.
    """
    cdef long long spins = 0
    cdef long long start = 0, waited = 0
    while load_acquire(progress) < chunks:
        spins += 1
        if spins % 256 == 1:  # read the clock now and then: it costs more than a PAUSE
            if spins == 1:
                start = _now_ns()
            else:
                waited = _now_ns() - start
        if waited < _spin_ns:
            cpu_relax()
        elif waited < _spin_ns + _yield_ns:
            sched_yield()
        else:
            _sleep_ns(20000)


cdef inline void _pack(const floating *w, Py_ssize_t ldw, bint trans, Py_ssize_t K,
                       Py_ssize_t n0, Py_ssize_t n, floating *out) noexcept nogil:
    """Pack columns ``[n0, n0 + n)`` of ``op(W)`` (``W^T`` when ``trans``) for ``_packed_gemm``."""
    if floating is float:
        pg_s_pack(w, ldw, trans, K, n0, n, out)
    else:
        pg_d_pack(w, ldw, trans, K, n0, n, out)


cdef inline void _packed_gemm(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, const floating *a,
                              Py_ssize_t lda, const floating *packed, floating *c,
                              Py_ssize_t ldc, bint accumulate) noexcept nogil:
    """``C[m, n] = A[m, k] @ P[k, n]`` (``+=`` when ``accumulate``), P packed by ``_pack``."""
    if floating is float:
        pg_s_gemm(m, n, k, a, lda, packed, c, ldc, accumulate)
    else:
        pg_d_gemm(m, n, k, a, lda, packed, c, ldc, accumulate)


def packed_len(Py_ssize_t n, Py_ssize_t k, bint is_double):
    """Elements a ``[k, n]`` matrix takes once packed (panel width depends on the build)."""
    return pg_d_packed_len(n, k) if is_double else pg_s_packed_len(n, k)


cdef inline void _chunk_bounds(Py_ssize_t c, Py_ssize_t chunk, Py_ssize_t T, bint descending,
                               Py_ssize_t *t_lo, Py_ssize_t *t_hi) noexcept nogil:
    """Time range ``[t_lo, t_hi)`` of the ``c``-th chunk in processing order."""
    if descending:
        t_hi[0] = T - c * chunk
        t_lo[0] = T - (c + 1) * chunk if T - (c + 1) * chunk > 0 else 0
    else:
        t_lo[0] = c * chunk
        t_hi[0] = (c + 1) * chunk if (c + 1) * chunk < T else T


cdef inline Py_ssize_t _bwd_n_chunks(Py_ssize_t T, Py_ssize_t first, Py_ssize_t chunk) noexcept nogil:
    """Chunks of the backward: the first of ``first`` steps, the others of ``chunk``."""
    if T == 0:
        return 0
    if T <= first:
        return 1
    return 1 + (T - first + chunk - 1) // chunk


cdef inline Py_ssize_t _bwd_chunk_end(Py_ssize_t c, Py_ssize_t T, Py_ssize_t first,
                                      Py_ssize_t chunk) noexcept nogil:
    """Steps (in processing order) done once the backward's chunk ``c`` is finished."""
    cdef Py_ssize_t end = first + c * chunk
    return end if end < T else T


cdef inline void _bwd_chunk_rows(
        Py_ssize_t c, Py_ssize_t T, Py_ssize_t first, Py_ssize_t chunk, bint reverse,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        Py_ssize_t *t_lo, Py_ssize_t *t_hi, Py_ssize_t *r0, Py_ssize_t *r1) noexcept nogil:
    """Time range ``[t_lo, t_hi)`` and packed rows ``[r0, r1)`` of the backward's chunk ``c``
    (the backward of direction 0 runs from the last step down, direction 1 from step 0 up)."""
    cdef Py_ssize_t s_lo = 0 if c == 0 else _bwd_chunk_end(c - 1, T, first, chunk)
    cdef Py_ssize_t s_hi = _bwd_chunk_end(c, T, first, chunk)
    if reverse:
        t_lo[0] = s_lo
        t_hi[0] = s_hi
    else:
        t_lo[0] = T - s_hi
        t_hi[0] = T - s_lo
    r0[0] = packed_start[t_lo[0]]
    r1[0] = packed_start[t_hi[0] - 1] + batch_sizes[t_hi[0] - 1]


cdef inline Py_ssize_t _prev_step(Py_ssize_t t, Py_ssize_t b, Py_ssize_t T,
                                  const Py_ssize_t[::1] batch_sizes, bint reverse) noexcept nogil:
    """Time step whose saved state feeds row ``b`` at step ``t``, or -1 for the initial state."""
    if reverse:
        if t + 1 < T and b < batch_sizes[t + 1]:
            return t + 1
        return -1
    return t - 1


# ----------------------------------------------------------------------------- forward

cdef void _forward_projection(
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        bint x_rows_packed, const floating[:, ::1] w_ih,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start, bint reverse,
        floating[:, ::1] gates, floating[:, ::1] x_packed,
        Py_ssize_t chunk, Py_ssize_t *progress) noexcept nogil:
    """``gates = x @ w_ih^T`` chunk by chunk, in the order the recurrence consumes them."""
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t I = w_ih.shape[1]
    cdef Py_ssize_t G = w_ih.shape[0]
    cdef Py_ssize_t n_chunks = (T + chunk - 1) // chunk
    cdef Py_ssize_t c, t, b, j, t_lo, t_hi, r0, r1, xr, n
    cdef const floating *a
    for c in range(n_chunks):
        _chunk_bounds(c, chunk, T, reverse, &t_lo, &t_hi)
        r0 = packed_start[t_lo]
        r1 = packed_start[t_hi - 1] + batch_sizes[t_hi - 1]
        if r1 == r0:
            store_release(progress, c + 1)
            continue
        a = NULL
        if I > 0:
            if x_rows_packed:
                a = &x[r0, 0]
            else:
                for t in range(t_lo, t_hi):
                    for b in range(batch_sizes[t]):
                        xr = x_step_row[t] + b * x_batch_stride
                        n = packed_start[t] + b
                        for j in range(I):
                            x_packed[n, j] = x[xr, j]
                a = &x_packed[r0, 0]
        if G > 0:
            gemm(NoTrans, Trans, <int>(r1 - r0), <int>G, <int>I, <floating>1, a, <int>I,
                 &w_ih[0, 0] if I > 0 else NULL, <int>I, <floating>0, &gates[r0, 0], <int>G)
        store_release(progress, c + 1)


cdef void _forward_recurrence(
        const floating[:, ::1] w_hh, const floating[::1] bias,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start, bint reverse,
        floating[:, ::1] gates, floating[:, ::1] h_state, floating[:, ::1] c_state,
        floating[:, ::1] y, const Py_ssize_t[::1] y_step_row, Py_ssize_t y_batch_stride,
        Py_ssize_t y_col,
        floating[:, ::1] cache_i, floating[:, ::1] cache_f, floating[:, ::1] cache_g,
        floating[:, ::1] cache_o, floating[:, ::1] cache_c, floating[:, ::1] cache_tanhc,
        floating[:, ::1] cache_h, bint store_cache, floating[::1] w_packed,
        Py_ssize_t chunk, Py_ssize_t *progress) noexcept nogil:
    """The sequential part of the forward: per step one GEMM (against ``w_hh^T`` packed
    into ``w_packed`` first) and the fused elementwise pass."""
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t B = h_state.shape[0]
    cdef Py_ssize_t H = h_state.shape[1]
    cdef Py_ssize_t G = 4 * H
    cdef Py_ssize_t s, t, n0, nb
    if H == 0 or B == 0:
        return
    _pack(&w_hh[0, 0], H, True, H, 0, G, &w_packed[0])
    for s in range(T):
        if s % chunk == 0:
            _wait_for(progress, s // chunk + 1)
        t = T - 1 - s if reverse else s
        nb = batch_sizes[t]
        n0 = packed_start[t]
        # gates += h @ w_hh^T for the active rows.
        _packed_gemm(nb, G, H, &h_state[0, 0], H, &w_packed[0], &gates[n0, 0], G, True)
        _forward_elementwise(0, H, 0, 1, t, bias, batch_sizes, packed_start, gates, &h_state[0, 0],
                             c_state, y, y_step_row, y_batch_stride, y_col, cache_i, cache_f,
                             cache_g, cache_o, cache_c, cache_tanhc, cache_h, store_cache)


cdef void _forward_direction(
        Py_ssize_t d,
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        bint x_rows_packed,
        const floating[:, :, ::1] w_ih, const floating[:, :, ::1] w_hh, const floating[:, ::1] bias,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        floating[:, ::1] y, const Py_ssize_t[::1] y_step_row, Py_ssize_t y_batch_stride,
        floating[:, :, ::1] h_n, floating[:, :, ::1] c_n,
        floating[:, :, ::1] cache_i, floating[:, :, ::1] cache_f, floating[:, :, ::1] cache_g,
        floating[:, :, ::1] cache_o, floating[:, :, ::1] cache_c, floating[:, :, ::1] cache_tanhc,
        floating[:, :, ::1] cache_h, bint store_cache,
        floating[:, :, ::1] gates, floating[:, :, ::1] x_packed, floating[:, ::1] w_packed,
        Py_ssize_t chunk, Py_ssize_t *progress) noexcept nogil:
    """Direction ``d``: the input projection, then the recurrence."""
    cdef bint reverse = d == 1
    cdef Py_ssize_t s = d if store_cache else 0
    _forward_projection(x, x_step_row, x_batch_stride, x_rows_packed, w_ih[d],
                        batch_sizes, packed_start, reverse, gates[d], x_packed[d],
                        chunk, progress)
    _forward_recurrence(w_hh[d], bias[d], batch_sizes, packed_start, reverse, gates[d],
                        h_n[d], c_n[d], y, y_step_row, y_batch_stride, d * h_n.shape[2],
                        cache_i[s], cache_f[s], cache_g[s], cache_o[s], cache_c[s],
                        cache_tanhc[s], cache_h[s], store_cache, w_packed[d], chunk, progress)


def forward_layer(
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        bint x_rows_packed,
        const floating[:, :, ::1] w_ih, const floating[:, :, ::1] w_hh,
        const floating[:, ::1] bias,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        floating[:, ::1] y, const Py_ssize_t[::1] y_step_row, Py_ssize_t y_batch_stride,
        floating[:, :, ::1] h_n, floating[:, :, ::1] c_n,
        floating[:, :, ::1] cache_i, floating[:, :, ::1] cache_f, floating[:, :, ::1] cache_g,
        floating[:, :, ::1] cache_o, floating[:, :, ::1] cache_c, floating[:, :, ::1] cache_tanhc,
        floating[:, :, ::1] cache_h, bint store_cache,
        floating[:, :, ::1] gates, floating[:, :, ::1] x_packed, floating[:, ::1] w_packed,
        Py_ssize_t chunk, int n_threads):
    """Run the directions of one layer forward, storing gate activations.

    With two directions and two threads, each thread runs one direction. (A one-direction
    layer is better served by ``forward_direction_split``.)

    Parameters
    ----------
    x, x_step_row, x_batch_stride, x_rows_packed
        Layer input as a row table; ``x_rows_packed`` says row ``n`` of ``x`` is packed row
        ``n`` (then ``x`` is used in place, else gathered into ``x_packed``).
    w_ih, w_hh : ndarray [D, 4H, I], [D, 4H, H]
    bias : ndarray [D, 4H]
        ``b_ih + b_hh`` (zeros without bias).
    batch_sizes, packed_start : ndarray [T] of intp
    y, y_step_row, y_batch_stride
        Output row table; direction ``d`` writes columns ``d*H .. (d+1)*H``.
    h_n, c_n : ndarray [D, B, H]
        In: initial states. Out: final states (they are the running state).
    cache_* : ndarray [D, T*B, H]
        Saved activations i, f, g, o, c, tanh(c), h (written when ``store_cache``).
    gates, x_packed : ndarray [D, N, 4H], [D, N, I]
        Workspaces.
    w_packed : ndarray [D, packed_len(4H, H)]
        Workspace for each direction's packed ``w_hh^T``.
    chunk : int
        Steps per chunk (fixed by the shape).
    n_threads : int
        1 or 2.
    """
    cdef Py_ssize_t D = w_ih.shape[0]
    cdef Py_ssize_t progress[2]
    cdef Py_ssize_t d
    cdef int tid, nt
    progress[0] = 0
    progress[1] = 0
    with nogil:
        if n_threads >= 2 and D == 1:
            # One direction: thread 1 projects the input chunk by chunk ahead of the
            # recurrence on thread 0 (the same calls as one thread makes in turn).
            with parallel(num_threads=2):
                tid = threadid()
                nt = openmp.omp_get_num_threads()
                if nt < 2 or tid == 1:
                    _forward_projection(x, x_step_row, x_batch_stride, x_rows_packed, w_ih[0],
                                        batch_sizes, packed_start, False, gates[0], x_packed[0],
                                        chunk, &progress[0])
                if nt < 2 or tid == 0:
                    _forward_recurrence(w_hh[0], bias[0], batch_sizes, packed_start, False,
                                        gates[0], h_n[0], c_n[0], y, y_step_row, y_batch_stride,
                                        0, cache_i[0], cache_f[0], cache_g[0], cache_o[0],
                                        cache_c[0], cache_tanhc[0], cache_h[0], store_cache,
                                        w_packed[0], chunk, &progress[0])
        elif n_threads < 2 or D < 2:
            for d in range(D):
                _forward_direction(d, x, x_step_row, x_batch_stride, x_rows_packed, w_ih, w_hh,
                                   bias, batch_sizes, packed_start, y, y_step_row, y_batch_stride,
                                   h_n, c_n, cache_i, cache_f, cache_g, cache_o, cache_c,
                                   cache_tanhc, cache_h, store_cache, gates, x_packed, w_packed, chunk,
                                   &progress[d])
        else:
            with parallel(num_threads=2):
                tid = threadid()
                nt = openmp.omp_get_num_threads()
                if nt < 2:
                    _forward_direction(0, x, x_step_row, x_batch_stride, x_rows_packed,
                                       w_ih, w_hh, bias, batch_sizes, packed_start, y,
                                       y_step_row, y_batch_stride, h_n, c_n, cache_i, cache_f,
                                       cache_g, cache_o, cache_c, cache_tanhc, cache_h,
                                       store_cache, gates, x_packed, w_packed, chunk, &progress[0])
                    _forward_direction(1, x, x_step_row, x_batch_stride, x_rows_packed,
                                       w_ih, w_hh, bias, batch_sizes, packed_start, y,
                                       y_step_row, y_batch_stride, h_n, c_n, cache_i, cache_f,
                                       cache_g, cache_o, cache_c, cache_tanhc, cache_h,
                                       store_cache, gates, x_packed, w_packed, chunk, &progress[1])
                else:
                    _forward_direction(tid, x, x_step_row, x_batch_stride, x_rows_packed,
                                       w_ih, w_hh, bias, batch_sizes, packed_start, y,
                                       y_step_row, y_batch_stride, h_n, c_n, cache_i, cache_f,
                                       cache_g, cache_o, cache_c, cache_tanhc, cache_h,
                                       store_cache, gates, x_packed, w_packed, chunk, &progress[tid])

# Forward of one direction with its work split between two threads, in one of two ways.
# The gates stay in the caller's order [i f g o], and each half first projects half of the
# rows with one GEMM over all 4H columns. Split by batch rows (from 8 rows on), the even
# rows are one half and the odd rows the other: each half runs every step of its rows
# (four packed GEMMs against all of w_hh, packed once, then the elementwise pass), and as
# no row reads another the halves never wait for each other. Split by hidden units (fewer
# rows), the units are cut in two halves [0, split) and [split, H), and per step each
# half adds h_{t-1} @ w_hh^T to the four column blocks of its units (four packed GEMMs
# against its rows of w_hh) and runs the elementwise pass of its units; a step starts once
# both halves of the previous step are done. The work comes as tasks a thread takes with
# an atomic flag: per half a set-up (the projection, the packing), then per half one task
# for all steps (rows) or one per step (units). A thread takes its own half's task first
# and then the other half's if nobody has taken it, so a thread that starts late (a
# sleeping OpenMP worker takes tens of microseconds to wake) or loses its core for a
# while holds up only the tasks it already took. The same calls run whichever thread
# runs them, and one thread runs every task in order, so results are bitwise identical
# for 1 or 2 threads; a row's or a column's products do not depend on which rows or
# columns share a packed GEMM call, so the two ways give the same bits too.

cdef void _forward_split_half_rows(
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        bint x_rows_packed, const floating[:, ::1] w_ih,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        floating[:, ::1] gates, floating[:, ::1] x_packed, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """``gates[r0:r1] = x[r0:r1] @ w_ih^T`` (packed rows), one GEMM."""
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t I = w_ih.shape[1]
    cdef Py_ssize_t G = w_ih.shape[0]
    cdef Py_ssize_t t, b, j, n, xr
    cdef const floating *a = NULL
    if r1 <= r0 or G == 0:
        return
    if I > 0:
        if x_rows_packed:
            a = &x[r0, 0]
        else:
            for t in range(T):
                for b in range(batch_sizes[t]):
                    n = packed_start[t] + b
                    if n < r0 or n >= r1:
                        continue
                    xr = x_step_row[t] + b * x_batch_stride
                    for j in range(I):
                        x_packed[n, j] = x[xr, j]
            a = &x_packed[r0, 0]
    gemm(NoTrans, Trans, <int>(r1 - r0), <int>G, <int>I, <floating>1, a, <int>I,
         &w_ih[0, 0] if I > 0 else NULL, <int>I, <floating>0, &gates[r0, 0], <int>G)


cdef inline void _forward_cell_row(
        Py_ssize_t w, Py_ssize_t gs, const floating *act, const floating *bias,
        floating_rp c_row, floating_rp h_row, floating_rp y_row, floating_rp ci,
        floating_rp cf, floating_rp cg, floating_rp co, floating_rp cc, floating_rp ctc,
        floating_rp ch) noexcept nogil:
    """One row of ``w`` units, training: ``act`` holds their pre-activations ``[i f g o]``
    (gate q at ``act + q*gs``, likewise ``bias``); ``c_row``/``h_row`` go from step t-1 to
    t, and the activations, c, tanh(c) and h go to the cache rows ``ci .. ch``. Two loops
    over the units rather than one short loop per quantity, which cost more in set-up than
    in work at the widths of a split step (32 units: two AVX-512 vectors), and rather than
    one loop with all of it, which runs out of vector registers. The rows written are
    distinct arrays (restrict), except that ``h_row`` may be ``ch`` (h kept in the cache),
    in which case only ``ch`` is used."""
    cdef Py_ssize_t j
    cdef floating c, h
    for j in range(w):
        ci[j] = fast_sigmoid(act[j] + bias[j])
        cf[j] = fast_sigmoid(act[gs + j] + bias[gs + j])
        cg[j] = fast_tanh(act[2 * gs + j] + bias[2 * gs + j])
        co[j] = fast_sigmoid(act[3 * gs + j] + bias[3 * gs + j])
    for j in range(w):
        # c = f * c_prev + i * g, as PyTorch: (f * c_prev) + (i * g).
        c = cf[j] * c_row[j] + ci[j] * cg[j]
        ctc[j] = fast_tanh(c)
        h = co[j] * ctc[j]
        cc[j] = c
        ch[j] = h
        c_row[j] = c
        y_row[j] = h
    if h_row != ch:  # h_t goes to a separate state buffer (not read from the cache)
        for j in range(w):
            h_row[j] = ch[j]


cdef inline void _forward_cell_row_inference(
        Py_ssize_t w, Py_ssize_t gs, floating_rp act, const floating *bias,
        floating_rp c_row, floating_rp h_row, floating_rp y_row) noexcept nogil:
    """:func:`_forward_cell_row` without a cache: the activations go back into ``act``."""
    cdef Py_ssize_t j
    cdef floating c, h
    for j in range(w):
        act[j] = fast_sigmoid(act[j] + bias[j])
        act[gs + j] = fast_sigmoid(act[gs + j] + bias[gs + j])
        act[2 * gs + j] = fast_tanh(act[2 * gs + j] + bias[2 * gs + j])
        act[3 * gs + j] = fast_sigmoid(act[3 * gs + j] + bias[3 * gs + j])
    for j in range(w):
        c = act[gs + j] * c_row[j] + act[j] * act[2 * gs + j]
        h = act[3 * gs + j] * fast_tanh(c)
        c_row[j] = c
        h_row[j] = h
        y_row[j] = h


cdef void _forward_elementwise(
        Py_ssize_t u0, Py_ssize_t w, Py_ssize_t b_first, Py_ssize_t b_step, Py_ssize_t t,
        const floating[::1] bias,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        floating[:, ::1] gates, floating *h, floating[:, ::1] c_state,
        floating[:, ::1] y, const Py_ssize_t[::1] y_step_row, Py_ssize_t y_batch_stride,
        Py_ssize_t y_col,
        floating[:, ::1] cache_i, floating[:, ::1] cache_f, floating[:, ::1] cache_g,
        floating[:, ::1] cache_o, floating[:, ::1] cache_c, floating[:, ::1] cache_tanhc,
        floating[:, ::1] cache_h, bint store_cache) noexcept nogil:
    """The activations and state update of units ``[u0, u0 + w)`` of batch rows
    ``b_first, b_first + b_step, ...`` at step ``t``; their gate columns are ``q*H + u0 ..
    q*H + u0 + w`` of ``gates`` (gate order ``[i f g o]``). ``h`` is the ``[B, H]`` buffer
    that receives h_t (shaped like ``c_state``)."""
    cdef Py_ssize_t B = c_state.shape[0]
    cdef Py_ssize_t H = c_state.shape[1]
    cdef Py_ssize_t nb = batch_sizes[t]
    cdef Py_ssize_t n0 = packed_start[t]
    cdef Py_ssize_t b, row
    if w == 0:
        return
    b = b_first
    while b < nb:
        row = t * B + b
        if store_cache:
            _forward_cell_row(w, H, &gates[n0 + b, u0], &bias[u0], &c_state[b, u0],
                              h + b * H + u0, &y[y_step_row[t] + b * y_batch_stride, y_col + u0],
                              &cache_i[row, u0], &cache_f[row, u0], &cache_g[row, u0],
                              &cache_o[row, u0], &cache_c[row, u0], &cache_tanhc[row, u0],
                              &cache_h[row, u0])
        else:
            _forward_cell_row_inference(w, H, &gates[n0 + b, u0], &bias[u0], &c_state[b, u0],
                                        h + b * H + u0,
                                        &y[y_step_row[t] + b * y_batch_stride, y_col + u0])
        b += b_step


# Test hooks: how long (ns) each thread of a two-thread kernel sleeps before it starts, so
# that tests can make the other thread take its tasks (the split forward's; the backward's
# weight-gradient tasks and dx pieces).
cdef long long _split_start_delay_ns[2]
cdef long long _backward_start_delay_ns[2]


cdef _set_start_delay(long long *delays_ns, int thread, long long delay_us):
    if thread != 0 and thread != 1:
        raise ValueError(f"thread must be 0 or 1, got {thread}")
    delays_ns[thread] = delay_us * 1000


cdef inline void _start_delay(const long long *delays_ns, int thread) noexcept nogil:
    if delays_ns[thread] > 0:
        _sleep_ns(delays_ns[thread])


def _set_split_start_delay(int thread, long long delay_us):
    """Test hook: make ``thread`` (0 or 1) of the split forward start ``delay_us`` late."""
    _set_start_delay(_split_start_delay_ns, thread, delay_us)


def _set_backward_start_delay(int thread, long long delay_us):
    """Test hook: make ``thread`` (0 or 1) of the two-thread backward start ``delay_us``
    late."""
    _set_start_delay(_backward_start_delay_ns, thread, delay_us)


cdef inline bint _claim(Py_ssize_t *flag) noexcept nogil:
    """Take the task of ``flag`` (0 while nobody has): whether this thread got it."""
    return load_acquire(flag) == 0 and compare_exchange(flag, 0, 1)


cdef inline Py_ssize_t _split_step(
        Py_ssize_t s, bint reverse, bint h_in_cache, const Py_ssize_t[::1] batch_sizes,
        floating[:, ::1] h_state, floating[:, ::1] h_other, floating[:, ::1] cache_h,
        floating **h_prev, floating **h_next, Py_ssize_t *nb_before) noexcept nogil:
    """Step ``s`` of the split forward: returns its time index t and sets the ``[B, H]``
    rows it reads h_{t-1} from and writes h_t to, and ``nb_before``, the rows active at the
    previous step. Rows active then but not at step t keep their h: the caller carries
    it into the buffer this step writes (with h in the cache, rows only ever leave, and
    their last h is gathered at the end, so there ``nb_before`` is t's own count)."""
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t B = h_state.shape[0]
    cdef Py_ssize_t t = T - 1 - s if reverse else s
    if h_in_cache:
        h_prev[0] = &h_state[0, 0] if s == 0 else &cache_h[(t - 1) * B, 0]
        h_next[0] = &cache_h[t * B, 0]
    else:
        h_prev[0] = &h_state[0, 0] if s % 2 == 0 else &h_other[0, 0]
        h_next[0] = &h_other[0, 0] if s % 2 == 0 else &h_state[0, 0]
    nb_before[0] = (batch_sizes[t + 1 if reverse else t - 1] if s > 0 and not h_in_cache
                    else batch_sizes[t])
    return t


cdef void _forward_units(
        int own, Py_ssize_t *tasks, Py_ssize_t *done, bint two_threads, bint reverse,
        bint h_in_cache, Py_ssize_t split, Py_ssize_t plen0, Py_ssize_t plen1,
        const floating[:, ::1] w_hh, const floating[::1] bias,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        floating[:, ::1] y, const Py_ssize_t[::1] y_step_row, Py_ssize_t y_batch_stride,
        floating[:, ::1] h_state, floating[:, ::1] c_state,
        floating[:, ::1] cache_i, floating[:, ::1] cache_f, floating[:, ::1] cache_g,
        floating[:, ::1] cache_o, floating[:, ::1] cache_c, floating[:, ::1] cache_tanhc,
        floating[:, ::1] cache_h, bint store_cache,
        floating[:, ::1] gates, floating[::1] w_packed, floating[:, ::1] h_other) noexcept nogil:
    """The split forward's steps with the hidden units cut at ``split``: per step two tasks
    (one per half of the units), a step's tasks once both of the previous step's are done
    (``done`` counts them after the two set-ups). ``w_packed`` holds half 0's four gates
    (``plen0`` elements each), then half 1's (``plen1``)."""
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t H = h_state.shape[1]
    cdef Py_ssize_t s, t, nb, n0, u0, w, b, j, q, nb_before, plen
    cdef floating *h_prev
    cdef floating *h_next
    cdef int k, half
    for s in range(T):
        t = _split_step(s, reverse, h_in_cache, batch_sizes, h_state, h_other, cache_h,
                        &h_prev, &h_next, &nb_before)
        nb = batch_sizes[t]
        n0 = packed_start[t]
        if s > 0:
            _wait_for(done, 2 + 2 * s)  # h_{t-1} is complete
            if two_threads and load_acquire(&tasks[2 + 2 * s + own]) == 0:
                # The other half of h_{t-1} is probably in the other core's cache: ask for
                # all of its lines at once, rather than one by one as the GEMM reaches
                # them (each a ~0.2-0.3 µs round trip).
                u0 = split if own == 0 else 0
                w = H - split if own == 0 else split
                for b in range(nb):
                    j = u0
                    while j < u0 + w:
                        prefetch(h_prev + b * H + j)
                        j += 64 // sizeof(floating)
        for k in range(2):
            half = own if k == 0 else 1 - own
            if not _claim(&tasks[2 + 2 * s + half]):
                continue
            u0 = 0 if half == 0 else split
            w = split if half == 0 else H - split
            if w > 0:
                plen = plen0 if half == 0 else plen1
                for q in range(4):  # gate q of the half's units
                    _packed_gemm(nb, w, H, h_prev, H,
                                 &w_packed[(0 if half == 0 else 4 * plen0) + q * plen],
                                 &gates[n0, q * H + u0], 4 * H, True)
            for b in range(nb, nb_before):
                for j in range(u0, u0 + w):
                    h_next[b * H + j] = h_prev[b * H + j]
            _forward_elementwise(u0, w, 0, 1, t, bias, batch_sizes, packed_start, gates, h_next,
                                 c_state, y, y_step_row, y_batch_stride, 0, cache_i, cache_f,
                                 cache_g, cache_o, cache_c, cache_tanhc, cache_h, store_cache)
            add_release(done, 1)


cdef void _forward_rows(
        int half, bint reverse, bint h_in_cache,
        const floating[:, ::1] w_hh, const floating[::1] bias,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        floating[:, ::1] y, const Py_ssize_t[::1] y_step_row, Py_ssize_t y_batch_stride,
        floating[:, ::1] h_state, floating[:, ::1] c_state,
        floating[:, ::1] cache_i, floating[:, ::1] cache_f, floating[:, ::1] cache_g,
        floating[:, ::1] cache_o, floating[:, ::1] cache_c, floating[:, ::1] cache_tanhc,
        floating[:, ::1] cache_h, bint store_cache,
        floating[:, ::1] gates, const floating[::1] w_packed, Py_ssize_t plen_all,
        floating[:, ::1] h_other) noexcept nogil:
    """Every step of the batch rows ``half, half + 2, ...``: their recurrent products (all
    of ``w_hh``, packed gate by gate, ``plen_all`` elements each) and their elementwise
    pass. A row's h, c and gates depend on no other row, so the two halves never wait for
    each other; alternate rows keep the halves even when rows leave (sorted lengths)."""
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t H = h_state.shape[1]
    cdef Py_ssize_t s, t, nb, n0, m, b, j, q, nb_before
    cdef floating *h_prev
    cdef floating *h_next
    for s in range(T):
        t = _split_step(s, reverse, h_in_cache, batch_sizes, h_state, h_other, cache_h,
                        &h_prev, &h_next, &nb_before)
        nb = batch_sizes[t]
        n0 = packed_start[t]
        m = (nb - half + 1) // 2 if nb > half else 0  # the half's rows active at step t
        if m > 0:
            for q in range(4):
                _packed_gemm(m, H, H, h_prev + half * H, 2 * H, &w_packed[q * plen_all],
                             &gates[n0 + half, q * H], 8 * H, True)
        # The half's rows that left at this step keep their h (see _split_step).
        b = nb + ((nb - half) & 1)
        while b < nb_before:
            for j in range(H):
                h_next[b * H + j] = h_prev[b * H + j]
            b += 2
        _forward_elementwise(0, H, half, 2, t, bias, batch_sizes, packed_start, gates, h_next,
                             c_state, y, y_step_row, y_batch_stride, 0, cache_i, cache_f,
                             cache_g, cache_o, cache_c, cache_tanhc, cache_h, store_cache)


cdef void _forward_split(
        int own, Py_ssize_t *tasks, Py_ssize_t *done, bint two_threads, bint reverse,
        Py_ssize_t split, bint by_rows,
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        bint x_rows_packed,
        const floating[:, ::1] w_ih, const floating[:, ::1] w_hh, const floating[::1] bias,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        floating[:, ::1] y, const Py_ssize_t[::1] y_step_row, Py_ssize_t y_batch_stride,
        floating[:, ::1] h_state, floating[:, ::1] c_state,
        floating[:, ::1] cache_i, floating[:, ::1] cache_f, floating[:, ::1] cache_g,
        floating[:, ::1] cache_o, floating[:, ::1] cache_c, floating[:, ::1] cache_tanhc,
        floating[:, ::1] cache_h, bint store_cache,
        floating[:, ::1] gates, floating[:, ::1] x_packed, floating[::1] w_packed,
        floating[:, ::1] h_other) noexcept nogil:
    """One thread's part of the split forward: the tasks it takes, its own half's (``own``)
    first. ``tasks``: ``max(4, 2 * (T + 1))`` flags, zero on entry (the two set-ups, then
    the halves' tasks); ``done``: the count of finished tasks, zero on entry. With
    ``by_rows`` the halves are the even and the odd batch rows, one task each for all
    steps (:func:`_forward_rows`), and the set-ups pack all of ``w_hh`` gate by gate
    (``packed_len(H, H)`` elements a gate). Otherwise the halves are the hidden units cut at
    ``split``, two tasks per step (:func:`_forward_units`), and each half's set-up packs its
    rows of ``w_hh`` (``q*H + u0 ..`` for each gate q), gate by gate: ``packed_len(split,
    H)`` elements a gate for half 0, then half 1's. Thread 0 (``own`` 0) writes the final
    state once every task is done.

    Without the cache (inference), ``h`` is double-buffered (``h_state`` and ``h_other``,
    ``[B, H]``): step ``s`` reads one and writes the other. Split by units, no task of step
    ``s + 1`` starts before step ``s`` is done, so nobody still reads the buffer it
    overwrites; split by rows, each half reads and writes only its own rows. With the
    cache, h lives in the saved rows (below)."""
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t B = h_state.shape[0]
    cdef Py_ssize_t H = h_state.shape[1]
    cdef Py_ssize_t N = gates.shape[0]
    cdef Py_ssize_t t, u0, w, b, j
    cdef Py_ssize_t q, plen0, plen1, plen, plen_all, n_tasks
    cdef int k, half
    if floating is float:
        plen0 = pg_s_packed_len(split, H)
        plen1 = pg_s_packed_len(H - split, H)
        plen_all = pg_s_packed_len(H, H)
    else:
        plen0 = pg_d_packed_len(split, H)
        plen1 = pg_d_packed_len(H - split, H)
        plen_all = pg_d_packed_len(H, H)
    for k in range(2):
        half = own if k == 0 else 1 - own
        if not _claim(&tasks[half]):
            continue
        # Half 0 projects rows [0, N/2) of the input, half 1 rows [N/2, N).
        _forward_split_half_rows(x, x_step_row, x_batch_stride, x_rows_packed, w_ih,
                                 batch_sizes, packed_start, gates, x_packed,
                                 0 if half == 0 else N // 2, N // 2 if half == 0 else N)
        if by_rows:
            # All of w_hh, gate by gate (gates 0-1 in half 0's set-up, 2-3 in half 1's),
            # and the initial state of the half's rows in the second h buffer.
            if H > 0:
                for q in range(2 * half, 2 * half + 2):
                    _pack(&w_hh[0, 0], H, True, H, q * H, H, &w_packed[q * plen_all])
            for b in range(half, B, 2):
                for j in range(H):
                    h_other[b, j] = h_state[b, j]
            add_release(done, 1)
            continue
        u0 = 0 if half == 0 else split
        w = split if half == 0 else H - split
        if H > 0 and w > 0:
            plen = plen0 if half == 0 else plen1
            for q in range(4):
                _pack(&w_hh[0, 0], H, True, H, q * H + u0, w,
                      &w_packed[(0 if half == 0 else 4 * plen0) + q * plen])
            # Both h buffers start as the initial state: a row joining later (reverse
            # direction) reads its initial state from whichever buffer is current.
            for b in range(B):
                for j in range(u0, u0 + w):
                    h_other[b, j] = h_state[b, j]
        add_release(done, 1)
    _wait_for(done, 2)  # every row projected, w_hh packed
    if H == 0 or B == 0:
        return
    # In time order with the cache stored, step t reads h_{t-1} from the saved h of step
    # t-1 and writes h_t into its own saved rows: lines no thread has read before. In a
    # double buffer each step's writes land on lines the other thread read the step
    # before (split by units), and every one of them waits for the other core to drop
    # its copy (~0.3 µs a cache-line round trip between the two cores here).
    cdef bint h_in_cache = store_cache and not reverse
    if by_rows:
        for k in range(2):
            half = own if k == 0 else 1 - own
            if not _claim(&tasks[2 + half]):
                continue
            _forward_rows(half, reverse, h_in_cache, w_hh, bias, batch_sizes, packed_start,
                          y, y_step_row, y_batch_stride, h_state, c_state, cache_i, cache_f,
                          cache_g, cache_o, cache_c, cache_tanhc, cache_h, store_cache, gates,
                          w_packed, plen_all, h_other)
            add_release(done, 1)
        n_tasks = 4
    else:
        _forward_units(own, tasks, done, two_threads, reverse, h_in_cache, split, plen0,
                       plen1, w_hh, bias, batch_sizes, packed_start, y, y_step_row,
                       y_batch_stride, h_state, c_state, cache_i, cache_f, cache_g, cache_o,
                       cache_c, cache_tanhc, cache_h, store_cache, gates, w_packed, h_other)
        n_tasks = 2 + 2 * T
    if own != 0:
        return
    _wait_for(done, n_tasks)
    if h_in_cache:
        # Row b's final h is the saved h of its last step: rows are sorted longest first,
        # so that step only moves back as b grows.
        t = T - 1
        for b in range(B):
            while t >= 0 and batch_sizes[t] <= b:
                t -= 1
            if t >= 0:
                for j in range(H):
                    h_state[b, j] = cache_h[t * B + b, j]
    elif T % 2 == 1:  # the final state is in h_other
        for b in range(B):
            for j in range(H):
                h_state[b, j] = h_other[b, j]


def forward_direction_split(
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        bint x_rows_packed,
        const floating[:, ::1] w_ih, const floating[:, ::1] w_hh, const floating[::1] bias,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start, bint reverse,
        Py_ssize_t split, bint by_rows,
        floating[:, ::1] y, const Py_ssize_t[::1] y_step_row, Py_ssize_t y_batch_stride,
        floating[:, ::1] h_state, floating[:, ::1] c_state,
        floating[:, ::1] cache_i, floating[:, ::1] cache_f, floating[:, ::1] cache_g,
        floating[:, ::1] cache_o, floating[:, ::1] cache_c, floating[:, ::1] cache_tanhc,
        floating[:, ::1] cache_h, bint store_cache,
        floating[:, ::1] gates, floating[:, ::1] x_packed, floating[::1] w_packed,
        floating[:, ::1] h_other, int n_threads):
    """Forward of one direction (a one-direction layer) with its work split over threads.

    Parameters are those of ``forward_layer`` for a single direction, except that ``y`` is
    written from column 0, ``h_state``/``c_state`` hold the initial state on entry and the
    final state on return. With ``by_rows`` the two threads take the even and the odd
    batch rows; otherwise each step's hidden units are cut at ``split``. The results are
    the same bits either way. ``w_packed`` is a workspace of ``4 * (packed_len(split, H) +
    packed_len(H - split, H))`` elements (at least ``4 * packed_len(H, H)``), ``h_other``
    one of ``[B, H]``.
    """
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t done = 0
    cdef Py_ssize_t *tasks = <Py_ssize_t *> calloc(max(4, 2 * (T + 1)), sizeof(Py_ssize_t))
    cdef int tid
    if tasks == NULL:
        raise MemoryError()
    try:
        with nogil:
            if n_threads < 2:
                _forward_split(0, tasks, &done, False, reverse, split, by_rows, x, x_step_row,
                               x_batch_stride, x_rows_packed, w_ih, w_hh, bias, batch_sizes,
                               packed_start, y, y_step_row, y_batch_stride, h_state, c_state,
                               cache_i, cache_f, cache_g, cache_o, cache_c, cache_tanhc,
                               cache_h, store_cache, gates, x_packed, w_packed, h_other)
            else:
                with parallel(num_threads=2):
                    tid = threadid()
                    _start_delay(_split_start_delay_ns, tid)
                    # With one thread granted (an OpenMP limit), it takes every task.
                    _forward_split(tid, tasks, &done, openmp.omp_get_num_threads() > 1,
                                   reverse, split, by_rows, x, x_step_row, x_batch_stride,
                                   x_rows_packed, w_ih, w_hh, bias, batch_sizes, packed_start,
                                   y, y_step_row, y_batch_stride, h_state, c_state, cache_i,
                                   cache_f, cache_g, cache_o, cache_c, cache_tanhc, cache_h,
                                   store_cache, gates, x_packed, w_packed, h_other)
    finally:
        free(tasks)


# ---------------------------------------------------------------------------- backward

cdef inline void _backward_cell_row(
        Py_ssize_t H, const floating *dy_row, const floating *c_prev, const floating *i_row,
        const floating *f_row, const floating *g_row, const floating *o_row,
        const floating *tc_row, floating_rp dh_row, floating_rp dc_row,
        floating_rp dg) noexcept nogil:
    """The backward's elementwise pass over one row: the four gate gradients into ``dg``
    (``[i f g o]``, ``4H``) and ``dc_row`` from dc_t to dc_{t-1}; ``dh_row`` (free until
    the GEMM overwrites it) takes dh_t. The rows written are restrict: they overlap
    nothing else here. Short loops with few pointers each (one fused loop ran slower in
    float64). Multiplication order follows PyTorch's autograd formulas (tanh_backward,
    sigmoid_backward, mul_backward), so that overflow and NaN appear exactly where float64
    autograd has them."""
    cdef Py_ssize_t j
    cdef floating one = 1
    for j in range(H):  # dh = dy + dh_next
        dh_row[j] = dy_row[j] + dh_row[j]
    for j in range(H):  # dc = dh * o * (1 - tanh(c)^2) + dc_next
        dc_row[j] = (dh_row[j] * o_row[j]) * (one - tc_row[j] * tc_row[j]) + dc_row[j]
    for j in range(H):  # do
        dg[3 * H + j] = (dh_row[j] * tc_row[j]) * (one - o_row[j]) * o_row[j]
    for j in range(H):  # di
        dg[j] = (dc_row[j] * g_row[j]) * (one - i_row[j]) * i_row[j]
    for j in range(H):  # dg
        dg[2 * H + j] = (dc_row[j] * i_row[j]) * (one - g_row[j] * g_row[j])
    for j in range(H):  # df
        dg[H + j] = (dc_row[j] * c_prev[j]) * (one - f_row[j]) * f_row[j]
    for j in range(H):  # dc_next = dc * f
        dc_row[j] = dc_row[j] * f_row[j]


cdef void _backward_recurrence(
        const floating[:, ::1] dy, const Py_ssize_t[::1] dy_step_row, Py_ssize_t dy_batch_stride,
        Py_ssize_t dy_col,
        const floating[:, ::1] w_hh, const floating[:, ::1] c0,
        const floating[:, ::1] cache_i, const floating[:, ::1] cache_f,
        const floating[:, ::1] cache_g, const floating[:, ::1] cache_o,
        const floating[:, ::1] cache_c, const floating[:, ::1] cache_tanhc,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start, bint reverse,
        floating[:, ::1] dh_state, floating[:, ::1] dc_state, floating[:, ::1] dgates,
        floating[::1] w_packed, Py_ssize_t first, Py_ssize_t chunk,
        Py_ssize_t *progress) noexcept nogil:
    """The sequential part of the backward: per step one fused elementwise pass writing the
    four gate gradients and updating dc, then one GEMM for dh (against ``w_hh`` packed into
    ``w_packed`` first). Publishes in ``progress`` how many chunks are finished."""
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t B = dh_state.shape[0]
    cdef Py_ssize_t H = dh_state.shape[1]
    cdef Py_ssize_t G = 4 * H
    cdef Py_ssize_t s, t, b, n, n0, nb, row, prev_t, dyr
    cdef const floating *c_prev
    cdef const floating *dy_row
    cdef const floating *i_row
    cdef const floating *f_row
    cdef const floating *g_row
    cdef const floating *o_row
    cdef const floating *tc_row
    cdef floating *dh_row
    cdef floating *dc_row
    cdef floating *dg
    cdef Py_ssize_t done = 0
    cdef Py_ssize_t done_end = _bwd_chunk_end(0, T, first, chunk)
    if H == 0 or B == 0:
        store_release(progress, _bwd_n_chunks(T, first, chunk))
        return
    _pack(&w_hh[0, 0], H, False, G, 0, H, &w_packed[0])
    for s in range(T):
        t = s if reverse else T - 1 - s
        nb = batch_sizes[t]
        n0 = packed_start[t]
        for b in range(nb):
            n = n0 + b
            row = t * B + b
            dyr = dy_step_row[t] + b * dy_batch_stride
            prev_t = _prev_step(t, b, T, batch_sizes, reverse)
            c_prev = &cache_c[prev_t * B + b, 0] if prev_t >= 0 else &c0[b, 0]
            dy_row = &dy[dyr, dy_col]
            i_row = &cache_i[row, 0]
            f_row = &cache_f[row, 0]
            g_row = &cache_g[row, 0]
            o_row = &cache_o[row, 0]
            tc_row = &cache_tanhc[row, 0]
            dh_row = &dh_state[b, 0]
            dc_row = &dc_state[b, 0]
            dg = &dgates[n, 0]
            _backward_cell_row(H, dy_row, c_prev, i_row, f_row, g_row, o_row, tc_row, dh_row,
                               dc_row, dg)
        # dh for the previous step: dgates_t @ w_hh.
        _packed_gemm(nb, H, G, &dgates[n0, 0], G, &w_packed[0], &dh_state[0, 0], H, False)
        if s + 1 == done_end:
            done += 1
            store_release(progress, done)
            done_end = _bwd_chunk_end(done, T, first, chunk)


cdef void _backward_weights(
        int role, const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row,
        Py_ssize_t x_batch_stride, const floating[:, ::1] h0, const floating[:, ::1] cache_h,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start, bint reverse,
        const floating[:, ::1] dgates, floating[:, ::1] z, floating[:, ::1] dw,
        double[::1] db_acc, Py_ssize_t first, Py_ssize_t chunk, Py_ssize_t dx_group,
        Py_ssize_t *progress, Py_ssize_t *next_task, Py_ssize_t *finished,
        bint help_dx, const floating[:, ::1] w_ih, floating[:, ::1] dx,
        Py_ssize_t *dx_claimed) noexcept nogil:
    """``dw = sum over chunks of dgates^T [x | h_prev]`` and ``db_acc = sum(dgates)``, as
    tasks ``(half, chunk)``: half 0 is the rows of gates i and f of ``dw`` (``2H`` rows),
    half 1 those of g and o. A task is one GEMM over the chunk's rows, added to its half
    (the first chunk's overwrites it). Each half's tasks run in chunk order, whichever
    thread runs them (``next_task[h]``: the next chunk to claim; ``finished[h]``: chunks
    done), so results do not depend on threads. ``db`` is summed over up to T*B rows, in
    double: float32 would drift by ~1e-5 at a million rows.

    Claims go to the half with fewer tasks taken, ties to half 0 (``role`` 0, 2) or half 1
    (``role`` 1). So one thread alone takes both halves of each chunk in turn (one copy of
    its ``[x | h_prev]`` rows into ``z``), and two threads settle on one half each: the
    helper (role 2) starts as soon as the recurrence finishes a chunk, the recurrence
    thread (role 1) joins once it is done, and they finish together however fast each one
    runs. With ``help_dx`` (the helper, when dx is wanted), ready ``dx`` pieces
    (``_backward_dx``) come before the next task, and waits for a chunk go to them too."""
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t B = h0.shape[0]
    cdef Py_ssize_t H = h0.shape[1]
    cdef Py_ssize_t G = dw.shape[0]
    cdef Py_ssize_t K = dw.shape[1]
    cdef Py_ssize_t I = K - H
    cdef Py_ssize_t G2 = G // 2
    cdef Py_ssize_t n_chunks = _bwd_n_chunks(T, first, chunk)
    cdef Py_ssize_t c, c0, c1, t, b, j, k, n, t_lo, t_hi, r0, r1, xr, prev_t, k0
    cdef Py_ssize_t z_chunk = -1
    cdef int half
    cdef const floating *h_prev
    cdef const floating *x_row
    cdef floating *z_row
    cdef const floating *dg
    cdef floating one = 1
    cdef floating beta
    if G == 0:
        return
    while True:
        if help_dx:
            # Ready dx pieces first: they are large and independent, while the weight
            # gradients come in small tasks that two threads share evenly at the end.
            while _backward_dx(dgates, w_ih, dx, T, first, chunk, dx_group, reverse, batch_sizes,
                               packed_start, progress, dx_claimed, False):
                pass
        c0 = load_acquire(&next_task[0])
        c1 = load_acquire(&next_task[1])
        if c0 >= n_chunks and c1 >= n_chunks:
            return
        if c1 >= n_chunks or c0 < c1 or (c0 == c1 and role != 1):
            half, c = 0, c0
        else:
            half, c = 1, c1
        if not compare_exchange(&next_task[half], c, c + 1):
            continue  # the other thread took it
        if help_dx:
            while (load_acquire(progress) < c + 1
                   and _backward_dx(dgates, w_ih, dx, T, first, chunk, dx_group, reverse, batch_sizes,
                                    packed_start, progress, dx_claimed, False)):
                pass
        _wait_for(progress, c + 1)
        _bwd_chunk_rows(c, T, first, chunk, reverse, batch_sizes, packed_start,
                        &t_lo, &t_hi, &r0, &r1)
        if z_chunk != c and r1 > r0:
            for t in range(t_lo, t_hi):
                for b in range(batch_sizes[t]):
                    z_row = &z[packed_start[t] + b - r0, 0]
                    xr = x_step_row[t] + b * x_batch_stride
                    if I > 0:
                        x_row = &x[xr, 0]
                        for j in range(I):
                            z_row[j] = x_row[j]
                    prev_t = _prev_step(t, b, T, batch_sizes, reverse)
                    h_prev = &cache_h[prev_t * B + b, 0] if prev_t >= 0 else &h0[b, 0]
                    for j in range(H):
                        z_row[I + j] = h_prev[j]
            z_chunk = c
        k0 = half * G2
        _wait_for(&finished[half], c)  # the half's previous chunk, maybe on the other thread
        if c == 0:
            for k in range(k0, k0 + G2):
                db_acc[k] = 0
        if r1 > r0:
            beta = 0 if c == 0 else 1
            gemm(Trans, NoTrans, <int>G2, <int>K, <int>(r1 - r0), one, &dgates[r0, k0], <int>G,
                 &z[0, 0], <int>K, beta, &dw[k0, 0], <int>K)
            for n in range(r0, r1):
                dg = &dgates[n, 0]
                for k in range(k0, k0 + G2):
                    db_acc[k] += dg[k]
        elif c == 0:  # no rows (B == 0): nothing to add, ever
            for k in range(k0, k0 + G2):
                for j in range(K):
                    dw[k, j] = 0
        store_release(&finished[half], c + 1)


cdef bint _backward_dx(
        const floating[:, ::1] dgates, const floating[:, ::1] w_ih, floating[:, ::1] dx,
        Py_ssize_t T, Py_ssize_t first, Py_ssize_t chunk, Py_ssize_t dx_group, bint reverse,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        Py_ssize_t *progress, Py_ssize_t *claimed, bint run_all) noexcept nogil:
    """``dx = dgates @ w_ih`` in pieces of ``dx_group`` chunks (rows in packed order;
    each call packs ``w_ih`` anew, so a piece should have some hundreds of rows): claims
    the next piece in ``claimed`` and runs it. With ``run_all``, claims pieces until none
    is left (waiting for the recurrence where needed); otherwise runs at most one piece
    the recurrence has finished, and returns whether it did. A piece is the same GEMM
    call whichever thread runs it, so results do not depend on threads."""
    cdef Py_ssize_t n_chunks = _bwd_n_chunks(T, first, chunk)
    cdef Py_ssize_t n_pieces = (n_chunks + dx_group - 1) // dx_group
    cdef Py_ssize_t G = dgates.shape[1]
    cdef Py_ssize_t I = w_ih.shape[1]
    cdef Py_ssize_t c, c_last, t_lo, t_hi, r0, r1, r0_last, r1_last
    while True:
        c = load_acquire(claimed)
        if c >= n_pieces:
            return False
        c_last = (c + 1) * dx_group if (c + 1) * dx_group < n_chunks else n_chunks
        if not run_all and load_acquire(progress) < c_last:
            return False
        if not compare_exchange(claimed, c, c + 1):
            continue  # the other thread took it
        _wait_for(progress, c_last)
        # The piece's chunks are consecutive in time, so their rows are one range.
        _bwd_chunk_rows(c * dx_group, T, first, chunk, reverse, batch_sizes, packed_start,
                        &t_lo, &t_hi, &r0, &r1)
        _bwd_chunk_rows(c_last - 1, T, first, chunk, reverse, batch_sizes, packed_start,
                        &t_lo, &t_hi, &r0_last, &r1_last)
        r0 = r0 if r0 < r0_last else r0_last
        r1 = r1 if r1 > r1_last else r1_last
        if r1 > r0 and I > 0:
            gemm(NoTrans, NoTrans, <int>(r1 - r0), <int>I, <int>G, <floating>1,
                 &dgates[r0, 0] if G > 0 else NULL, <int>G, &w_ih[0, 0] if G > 0 else NULL,
                 <int>I, <floating>0, &dx[r0, 0], <int>I)
        if not run_all:
            return True


cdef void _backward_direction(
        int part, Py_ssize_t d,
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        const floating[:, ::1] dy, const Py_ssize_t[::1] dy_step_row, Py_ssize_t dy_batch_stride,
        const floating[:, :, ::1] w_ih, const floating[:, :, ::1] w_hh,
        const floating[:, :, ::1] h0, const floating[:, :, ::1] c0,
        const floating[:, :, ::1] cache_i, const floating[:, :, ::1] cache_f,
        const floating[:, :, ::1] cache_g, const floating[:, :, ::1] cache_o,
        const floating[:, :, ::1] cache_c, const floating[:, :, ::1] cache_tanhc,
        const floating[:, :, ::1] cache_h,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        floating[:, :, ::1] dh_state, floating[:, :, ::1] dc_state,
        bint want_dx, floating[:, ::1] dx_target,
        bint want_dparams, floating[:, :, ::1] dgates, floating[:, ::1] z,
        floating[:, :, ::1] dw, double[:, ::1] db_acc, floating[:, ::1] w_packed,
        Py_ssize_t first, Py_ssize_t chunk, Py_ssize_t dx_group,
        Py_ssize_t *progress, Py_ssize_t *next_task, Py_ssize_t *finished,
        Py_ssize_t *dx_claimed) noexcept nogil:
    """Direction ``d``. ``part`` 0: all of it. With two threads on one direction, ``part``
    1 (thread 0) is the recurrence, then weight-gradient tasks, then ``dx`` pieces;
    ``part`` 2 (thread 1) weight-gradient tasks as the recurrence finishes their chunks,
    taking ready ``dx`` pieces first, then the remaining ``dx`` pieces. ``z``: this
    thread's ``[x | h_prev]`` rows. ``next_task``/``finished``: the direction's two
    counters each (see ``_backward_weights``)."""
    cdef bint reverse = d == 1
    if part != 2:
        _backward_recurrence(dy, dy_step_row, dy_batch_stride, d * dh_state.shape[2],
                             w_hh[d], c0[d], cache_i[d], cache_f[d], cache_g[d], cache_o[d],
                             cache_c[d], cache_tanhc[d], batch_sizes, packed_start, reverse,
                             dh_state[d], dc_state[d], dgates[d], w_packed[d], first, chunk,
                             progress)
    if want_dparams:
        _backward_weights(part, x, x_step_row, x_batch_stride, h0[d], cache_h[d], batch_sizes,
                          packed_start, reverse, dgates[d], z, dw[d], db_acc[d], first, chunk,
                          dx_group, progress, next_task, finished, part == 2 and want_dx,
                          w_ih[d], dx_target, dx_claimed)
    if want_dx:
        _backward_dx(dgates[d], w_ih[d], dx_target, batch_sizes.shape[0], first, chunk,
                     dx_group, reverse, batch_sizes, packed_start, progress, dx_claimed, True)


def backward_layer(
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        bint x_rows_packed,
        const floating[:, ::1] dy, const Py_ssize_t[::1] dy_step_row, Py_ssize_t dy_batch_stride,
        const floating[:, :, ::1] w_ih, const floating[:, :, ::1] w_hh,
        const floating[:, :, ::1] h0, const floating[:, :, ::1] c0,
        const floating[:, :, ::1] cache_i, const floating[:, :, ::1] cache_f,
        const floating[:, :, ::1] cache_g, const floating[:, :, ::1] cache_o,
        const floating[:, :, ::1] cache_c, const floating[:, :, ::1] cache_tanhc,
        const floating[:, :, ::1] cache_h,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
        floating[:, :, ::1] dh_state, floating[:, :, ::1] dc_state,
        floating[:, ::1] dx, bint want_dx,
        floating[:, :, ::1] dw_ih, floating[:, :, ::1] dw_hh, floating[:, ::1] db,
        bint want_dparams,
        floating[:, :, ::1] dgates, floating[:, :, ::1] z, floating[:, :, ::1] dw,
        double[:, ::1] db_acc, floating[:, :, ::1] dx_packed, floating[:, ::1] w_packed,
        Py_ssize_t first, Py_ssize_t chunk, Py_ssize_t dx_group, int n_threads):
    """Backpropagate through both directions of one layer.

    Parameters
    ----------
    x, x_step_row, x_batch_stride, x_rows_packed
        Layer input as a row table; ``dx`` has the same rows.
    dy, dy_step_row, dy_batch_stride
        Gradient of the layer output (direction ``d`` reads columns ``d*H .. (d+1)*H``).
    w_ih, w_hh : ndarray [D, 4H, I], [D, 4H, H]
    h0, c0 : ndarray [D, B, H]
        Initial states of the forward.
    cache_* : ndarray [D, T*B, H]
        Saved activations i, f, g, o, c, tanh(c), h.
    batch_sizes, packed_start : ndarray [T] of intp
    dh_state, dc_state : ndarray [D, B, H]
        In: gradients of ``h_n``, ``c_n``. Out: gradients of ``h0``, ``c0``.
    dx : ndarray [rows, I]
        Input gradient, written at active rows when ``want_dx`` (padded rows untouched).
    dw_ih, dw_hh, db : ndarray [D, 4H, I], [D, 4H, H], [D, 4H]
        Parameter gradients, written when ``want_dparams``.
    dgates : ndarray [D, N, 4H]
        Workspace: the gate gradients.
    z : ndarray [max(D, 2), chunk rows, I + H]
        Each thread's ``[x | h_prev]`` rows of a chunk (two threads share one direction's
        weight gradients when D is 1).
    dw, db_acc : ndarray [D, 4H, I + H], [D, 4H]
        Accumulators of the weight gradients (``db_acc`` is float64 whatever the dtype).
    dx_packed : ndarray [D, N, I]
        Each direction's dx in packed order, summed into ``dx`` at the end; with one
        direction and packed rows, the caller passes ``dx`` itself (as ``[1, N, I]``).
    w_packed : ndarray [D, packed_len(H, 4H)]
        Workspace for each direction's packed ``w_hh``.
    first, chunk : int
        Steps of the first chunk and of the others (fixed by the shape: a short first
        chunk lets the weight gradients start early).
    dx_group : int
        Chunks per piece of ``dx`` (fixed by the shape).
    n_threads : int
        1 or 2.
    """
    cdef Py_ssize_t D = w_ih.shape[0]
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t I = w_ih.shape[2]
    cdef Py_ssize_t H = w_hh.shape[2]
    cdef Py_ssize_t G = 4 * H
    cdef Py_ssize_t progress[2]
    cdef Py_ssize_t dx_claimed[2]
    cdef Py_ssize_t next_task[4]  # per direction, per half of dw (see _backward_weights)
    cdef Py_ssize_t finished[4]
    cdef Py_ssize_t d, t, b, j, k, n, xr
    cdef int tid, nt
    # With one direction and packed rows, dx_packed is dx itself; otherwise each direction
    # writes its own part, summed into dx in a fixed order below.
    cdef bint direct_dx = D == 1 and x_rows_packed
    if first < 1 or chunk < 1 or dx_group < 1:
        raise ValueError(f"bad schedule: first={first}, chunk={chunk}, dx_group={dx_group}")
    if want_dparams and (z.shape[0] < 2 or z.shape[1] < (first if first > chunk else chunk) * h0.shape[1]
                         or z.shape[2] != I + H):
        raise ValueError("z must hold two workspaces of I + H columns with room for the rows of "
                         "the longest chunk")
    if want_dparams and (dw.shape[0] < D or dw.shape[1] != G or dw.shape[2] != I + H
                         or db_acc.shape[0] < D or db_acc.shape[1] != G):
        raise ValueError("dw and db_acc must be [D, 4H, I + H] and [D, 4H]")
    for k in range(4):
        next_task[k] = 0
        finished[k] = 0
    progress[0] = 0
    progress[1] = 0
    dx_claimed[0] = 0
    dx_claimed[1] = 0
    if want_dparams and _bwd_n_chunks(T, first, chunk) == 0:  # no steps: no task writes them
        dw[...] = 0
        db_acc[...] = 0
    with nogil:
        if n_threads < 2:
            for d in range(D):
                _backward_direction(0, d, x, x_step_row, x_batch_stride, dy, dy_step_row,
                                    dy_batch_stride, w_ih, w_hh, h0, c0, cache_i, cache_f, cache_g,
                                    cache_o, cache_c, cache_tanhc, cache_h, batch_sizes,
                                    packed_start, dh_state, dc_state, want_dx, dx_packed[d],
                                    want_dparams, dgates, z[d], dw, db_acc, w_packed,
                                    first, chunk, dx_group, &progress[d], &next_task[2 * d],
                                    &finished[2 * d], &dx_claimed[d])
        else:
            with parallel(num_threads=2):
                tid = threadid()
                nt = openmp.omp_get_num_threads()
                _start_delay(_backward_start_delay_ns, tid)
                if nt < 2:
                    for d in range(D):
                        _backward_direction(0, d, x, x_step_row, x_batch_stride, dy, dy_step_row,
                                            dy_batch_stride, w_ih, w_hh, h0, c0, cache_i,
                                            cache_f, cache_g, cache_o, cache_c, cache_tanhc,
                                            cache_h, batch_sizes, packed_start, dh_state,
                                            dc_state, want_dx, dx_packed[d], want_dparams,
                                            dgates, z[d], dw, db_acc, w_packed, first, chunk,
                                            dx_group, &progress[d], &next_task[2 * d],
                                            &finished[2 * d], &dx_claimed[d])
                elif D == 2:
                    _backward_direction(0, tid, x, x_step_row, x_batch_stride, dy, dy_step_row,
                                        dy_batch_stride, w_ih, w_hh, h0, c0, cache_i, cache_f,
                                        cache_g, cache_o, cache_c, cache_tanhc, cache_h,
                                        batch_sizes, packed_start, dh_state, dc_state, want_dx,
                                        dx_packed[tid], want_dparams, dgates, z[tid], dw, db_acc,
                                        w_packed, first, chunk, dx_group, &progress[tid],
                                        &next_task[2 * tid], &finished[2 * tid], &dx_claimed[tid])
                else:
                    _backward_direction(tid + 1, 0, x, x_step_row, x_batch_stride, dy,
                                        dy_step_row, dy_batch_stride, w_ih, w_hh, h0, c0,
                                        cache_i, cache_f, cache_g, cache_o, cache_c, cache_tanhc,
                                        cache_h, batch_sizes, packed_start, dh_state, dc_state,
                                        want_dx, dx_packed[0], want_dparams, dgates, z[tid], dw,
                                        db_acc, w_packed, first, chunk, dx_group, &progress[0],
                                        &next_task[0], &finished[0], &dx_claimed[0])
        if want_dparams and G > 0:
            # Split into dW_ih and dW_hh.
            for d in range(D):
                for k in range(G):
                    db[d, k] = <floating>db_acc[d, k]
                    for j in range(I):
                        dw_ih[d, k, j] = dw[d, k, j]
                    for j in range(H):
                        dw_hh[d, k, j] = dw[d, k, I + j]
        if want_dx and not direct_dx and I > 0:
            for t in range(T):
                for b in range(batch_sizes[t]):
                    n = packed_start[t] + b
                    xr = x_step_row[t] + b * x_batch_stride
                    if D == 2:
                        for j in range(I):
                            dx[xr, j] = dx_packed[0, n, j] + dx_packed[1, n, j]
                    else:
                        for j in range(I):
                            dx[xr, j] = dx_packed[0, n, j]


def _packed_matmul(const floating[:, ::1] a, const floating[:, ::1] w, bint trans,
                   floating[:, ::1] c, bint accumulate, Py_ssize_t n0=0, Py_ssize_t n=-1):
    """Test hook: ``c (+)= a @ op(w)[:, n0:n0+n]`` through ``_pack`` and ``_packed_gemm``
    (``op(w)`` is ``w.T`` when ``trans``)."""
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
        _pack(&w[0, 0], w.shape[1], trans, K, n0, n, &packed[0])
        _packed_gemm(a.shape[0], n, K, &a[0, 0], a.shape[1], &packed[0], &c[0, 0], c.shape[1],
                     accumulate)


def _vector_sigmoid(const floating[::1] x, floating[::1] out):
    """Test hook: ``out = sigmoid(x)`` with the kernels' own implementation."""
    cdef Py_ssize_t k
    with nogil:
        for k in range(x.shape[0]):
            out[k] = fast_sigmoid(x[k])


def _vector_tanh(const floating[::1] x, floating[::1] out):
    """Test hook: ``out = tanh(x)`` with the kernels' own implementation."""
    cdef Py_ssize_t k
    with nogil:
        for k in range(x.shape[0]):
            out[k] = fast_tanh(x[k])


def omp_max_threads():
    """``omp_get_max_threads()``: honours OMP_NUM_THREADS and threadpoolctl's OpenMP limits."""
    return openmp.omp_get_max_threads()
