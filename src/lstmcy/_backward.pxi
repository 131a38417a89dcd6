# The backward of one layer (both directions) as tasks that any number of threads take.
#
# Tasks, in the order threads take them (BackwardCall.tasks):
#   1. TASK_PACK: pieces of w_hh packed for the per-step products dh = dgates @ w_hh.
#   2. TASK_RECURRENCE: a group of batch rows (g, g + groups, ...) runs every step alone,
#      in reverse processing order: the cell's backward writes the four gate gradients of
#      its rows to dgates and updates dc, then a packed GEMM gives dh for the step before.
#      A row's recurrence never reads another row. Each group publishes the steps it has
#      done (BackwardCall.progress).
#   3. TASK_GATHER_X (x not in packed row order): x's rows gathered into zx.
#   4. Per chunk of steps, in processing order: TASK_DX pieces that the chunk completes
#      (dx = dgates @ w_ih, both directions summed), TASK_GATHER_H (the chunk's h_{t-1}
#      rows into zh), and TASK_WEIGHTS: per block of gate rows, dW_ih += dgates^T x,
#      dW_hh += dgates^T h_{t-1} and db += sum(dgates) over the chunk's rows.
# A task waits for what it reads (the recurrence's progress, a gather, the block's
# previous chunk); everything it waits for comes earlier in the list, so the threads never
# deadlock, whatever their number, and one thread runs the list in order.
#
# Bits: the recurrence's products of a row do not depend on the group; the chunks, blocks
# and dx pieces are a function of the shape, and each block adds its chunks in processing
# order (db in float64, row by row), whichever thread runs them. So the results are
# bitwise identical for any number of threads or groups.


cdef inline void _chunk_steps(const BackwardCall *bc, Py_ssize_t c, Py_ssize_t *s_lo,
                              Py_ssize_t *s_hi) noexcept nogil:
    """Processing steps [s_lo, s_hi) of chunk c: the first chunk ``first`` long, the
    others ``chunk``."""
    s_lo[0] = 0 if c == 0 else bc.first + (c - 1) * bc.chunk
    s_hi[0] = bc.first + c * bc.chunk
    s_hi[0] = bc.steps.T if s_hi[0] > bc.steps.T else s_hi[0]


cdef inline void _chunk_rows(const BackwardCall *bc, Py_ssize_t d, Py_ssize_t c,
                             Py_ssize_t *t_lo, Py_ssize_t *t_hi, Py_ssize_t *r0,
                             Py_ssize_t *r1) noexcept nogil:
    """Time steps [t_lo, t_hi) and packed rows [r0, r1) of chunk c of direction d (whose
    backward runs from the last step down for d = 0, from step 0 up for d = 1)."""
    cdef Py_ssize_t s_lo, s_hi
    _chunk_steps(bc, c, &s_lo, &s_hi)
    if d == 1:
        t_lo[0] = s_lo
        t_hi[0] = s_hi
    else:
        t_lo[0] = bc.steps.T - s_hi
        t_hi[0] = bc.steps.T - s_lo
    r0[0] = bc.steps.start[t_lo[0]]
    r1[0] = bc.steps.start[t_hi[0] - 1] + bc.steps.sizes[t_hi[0] - 1]


cdef inline void _dx_piece_rows(const BackwardCall *bc, Py_ssize_t q, Py_ssize_t *t_lo,
                                Py_ssize_t *t_hi, Py_ssize_t *r0, Py_ssize_t *r1) noexcept nogil:
    """Time steps [t_lo, t_hi) and packed rows [r0, r1) of dx piece (or zx piece) q."""
    t_lo[0] = q * bc.dx_steps
    t_hi[0] = t_lo[0] + bc.dx_steps if t_lo[0] + bc.dx_steps < bc.steps.T else bc.steps.T
    r0[0] = bc.steps.start[t_lo[0]]
    r1[0] = bc.steps.start[t_hi[0] - 1] + bc.steps.sizes[t_hi[0] - 1]


cdef inline Py_ssize_t _prev_step(const BackwardCall *bc, Py_ssize_t d, Py_ssize_t t,
                                  Py_ssize_t b) noexcept nogil:
    """The step whose saved state fed row b at step t in the forward, or -1 for h0/c0 (a
    reverse sequence starts at its own last step)."""
    if d == 1:
        if t + 1 < bc.steps.T and b < bc.steps.sizes[t + 1]:
            return t + 1
        return -1
    return t - 1


cdef inline void _wait_groups(const BackwardCall *bc, Py_ssize_t d, Py_ssize_t steps) noexcept nogil:
    """Until every row group of direction d has done ``steps`` steps."""
    cdef Py_ssize_t g
    for g in range(bc.groups):
        event_wait(&bc.progress[d * bc.groups + g], <int>steps, bc.spin_ns)


cdef void _pack_piece_bwd(const BackwardCall *bc, floating *like, Py_ssize_t d,
                          Py_ssize_t piece) noexcept nogil:
    """TASK_PACK: panels [p0, p1) of w_hh (its H columns, K = 4H)."""
    cdef Py_ssize_t H = bc.H
    cdef Py_ssize_t nr = panel_width(like)
    cdef Py_ssize_t panels = (H + nr - 1) // nr
    cdef Py_ssize_t per = (panels + bc.pack_pieces - 1) // bc.pack_pieces
    cdef Py_ssize_t p0 = piece * per
    cdef Py_ssize_t p1 = p0 + per if p0 + per < panels else panels
    cdef Py_ssize_t c1 = p1 * nr if p1 * nr < H else H
    if p1 <= p0:
        return
    pack(<floating *>bc.w_hh[d], H, False, 4 * H, p0 * nr, c1 - p0 * nr,
         <floating *>bc.w_packed[d] + p0 * nr * 4 * H)


cdef void _recurrence_rows_bwd(const BackwardCall *bc, floating *like, Py_ssize_t d,
                               Py_ssize_t g, int worker, int order) noexcept nogil:
    """TASK_RECURRENCE: every step of the rows g, g + groups, ... of direction d."""
    cdef Py_ssize_t T = bc.steps.T
    cdef Py_ssize_t B = bc.steps.B
    cdef Py_ssize_t H = bc.H
    cdef Py_ssize_t G4 = 4 * H
    cdef Py_ssize_t groups = bc.groups
    cdef const Saved *sv = &bc.saved[d]
    cdef floating *dgates = <floating *>bc.dgates[d]
    cdef floating *dh_state = <floating *>bc.dh_state[d]
    cdef floating *dc_state = <floating *>bc.dc_state[d]
    cdef Py_ssize_t s, t, k, m, b, n0, r, prev_t, c_end
    cdef Py_ssize_t c = 0
    cdef const floating *c_prev
    cdef long long start = trace_start(&bc.trace)
    if H > 0:
        event_wait(&bc.pack_done[d], <int>bc.pack_pieces, bc.spin_ns)
    c_end = bc.first if bc.first < T else T
    for s in range(T):
        t = s if d == 1 else T - 1 - s
        n0 = bc.steps.start[t]
        m = _group_rows(bc.steps.sizes[t], g, groups)
        if H > 0:
            for k in range(m):
                b = g + k * groups
                r = (t * B + b) * H
                prev_t = _prev_step(bc, d, t, b)
                c_prev = (<floating *>sv.c + (prev_t * B + b) * H if prev_t >= 0
                          else <floating *>bc.c0[d] + b * H)
                backward_cell(H, row_of(<floating *>bc.dy.data, &bc.dy, t, b) + d * H, c_prev,
                              <floating *>sv.i + r, <floating *>sv.f + r, <floating *>sv.g + r,
                              <floating *>sv.o + r, <floating *>sv.tanhc + r,
                              dh_state + b * H, dc_state + b * H, dgates + (n0 + b) * G4)
            if m > 0:
                # dh for the step before: dgates_t @ w_hh over the group's rows.
                packed_gemm(m, H, G4, dgates + (n0 + g) * G4, groups * G4,
                            <floating *>bc.w_packed[d], dh_state + g * H, groups * H, False)
        event_set(&bc.progress[d * groups + g], <int>(s + 1))
        if s + 1 == c_end:
            trace_task(&bc.trace, TASK_RECURRENCE, d, g, c, worker, start, order)
            start = trace_start(&bc.trace)
            c += 1
            c_end = c_end + bc.chunk if c_end + bc.chunk < T else T


cdef void _gather_x(const BackwardCall *bc, floating *like, Py_ssize_t q) noexcept nogil:
    """TASK_GATHER_X: zx[packed rows of piece q] = x's rows."""
    cdef Py_ssize_t I = bc.I
    cdef Py_ssize_t t_lo, t_hi, r0, r1, t, b, j
    cdef const floating *src
    cdef floating *dst
    _dx_piece_rows(bc, q, &t_lo, &t_hi, &r0, &r1)
    for t in range(t_lo, t_hi):
        for b in range(bc.steps.sizes[t]):
            src = row_of(<floating *>bc.x.data, &bc.x, t, b)
            dst = <floating *>bc.zx + (bc.steps.start[t] + b) * I
            for j in range(I):
                dst[j] = src[j]


cdef void _gather_h(const BackwardCall *bc, floating *like, Py_ssize_t d,
                    Py_ssize_t c) noexcept nogil:
    """TASK_GATHER_H: zh[d][packed rows of chunk c] = h_{t-1} of each row (saved h or h0)."""
    cdef Py_ssize_t H = bc.H
    cdef Py_ssize_t B = bc.steps.B
    cdef Py_ssize_t t_lo, t_hi, r0, r1, t, b, j, prev_t
    cdef const floating *src
    cdef floating *dst
    _chunk_rows(bc, d, c, &t_lo, &t_hi, &r0, &r1)
    for t in range(t_lo, t_hi):
        for b in range(bc.steps.sizes[t]):
            prev_t = _prev_step(bc, d, t, b)
            src = (<floating *>bc.saved[d].h + (prev_t * B + b) * H if prev_t >= 0
                   else <floating *>bc.h0[d] + b * H)
            dst = <floating *>bc.zh[d] + (bc.steps.start[t] + b) * H
            for j in range(H):
                dst[j] = src[j]


cdef void _weights(const BackwardCall *bc, floating *like, Py_ssize_t d, Py_ssize_t c,
                   Py_ssize_t k) noexcept nogil:
    """TASK_WEIGHTS: block k's gate rows of dW_ih, dW_hh and db, chunk c added (the first
    chunk overwrites); the last chunk writes db."""
    cdef Py_ssize_t I = bc.I
    cdef Py_ssize_t H = bc.H
    cdef Py_ssize_t G4 = 4 * H
    cdef Py_ssize_t k0 = k * bc.block_rows
    cdef Py_ssize_t kb = bc.block_rows if k0 + bc.block_rows < G4 else G4 - k0
    cdef Py_ssize_t t_lo, t_hi, r0, r1, s_lo, s_hi, n, j, ldx
    cdef const floating *dg = <floating *>bc.dgates[d]
    cdef const floating *xr
    cdef double *db_acc = bc.db_acc[d] + k0
    cdef floating *db = <floating *>bc.db[d] + k0
    cdef floating beta = 0 if c == 0 else 1
    _chunk_steps(bc, c, &s_lo, &s_hi)
    _chunk_rows(bc, d, c, &t_lo, &t_hi, &r0, &r1)
    _wait_groups(bc, d, s_hi)
    event_wait(&bc.h_gathered[d * bc.n_chunks + c], 1, bc.spin_ns)
    if bc.x_rows_packed:
        xr = <floating *>bc.x.data + r0 * bc.x.ld + bc.x.col
        ldx = bc.x.ld
    else:
        event_wait(bc.x_gathered, <int>bc.n_x_gathers, bc.spin_ns)
        xr = <floating *>bc.zx + r0 * I
        ldx = I
    event_wait(&bc.block_done[d * bc.n_blocks + k], <int>c, bc.spin_ns)
    gemm(Trans, NoTrans, <int>kb, <int>I, <int>(r1 - r0), <floating>1, dg + r0 * G4 + k0,
         <int>G4, xr, <int>ldx, beta, <floating *>bc.dw_ih[d] + k0 * I, <int>I)
    gemm(Trans, NoTrans, <int>kb, <int>H, <int>(r1 - r0), <floating>1, dg + r0 * G4 + k0,
         <int>G4, <floating *>bc.zh[d] + r0 * H, <int>H, beta, <floating *>bc.dw_hh[d] + k0 * H,
         <int>H)
    if c == 0:
        for j in range(kb):
            db_acc[j] = 0
    for n in range(r0, r1):  # in row order: the same sum whichever thread adds it
        for j in range(kb):
            db_acc[j] += dg[n * G4 + k0 + j]
    if c == bc.n_chunks - 1:
        for j in range(kb):
            db[j] = <floating>db_acc[j]
    event_set(&bc.block_done[d * bc.n_blocks + k], <int>(c + 1))


cdef void _dx_piece(const BackwardCall *bc, floating *like, Py_ssize_t q) noexcept nogil:
    """TASK_DX: dx[rows of piece q] = sum over directions of dgates[d] @ w_ih[d], written
    into dx directly when its rows are packed, else through dx_packed."""
    cdef Py_ssize_t I = bc.I
    cdef Py_ssize_t G4 = 4 * bc.H
    cdef Py_ssize_t t_lo, t_hi, r0, r1, d, t, b, j, ld
    cdef floating *target
    cdef const floating *src
    cdef floating *dst
    _dx_piece_rows(bc, q, &t_lo, &t_hi, &r0, &r1)
    for d in range(bc.D):
        _wait_groups(bc, d, bc.steps.T - t_lo if d == 0 else t_hi)
    if r1 == r0 or I == 0:
        return
    if bc.x_rows_packed:
        target = <floating *>bc.dx.data + r0 * bc.dx.ld + bc.dx.col
        ld = bc.dx.ld
    else:
        target = <floating *>bc.dx_packed + r0 * I
        ld = I
    for d in range(bc.D):
        gemm(NoTrans, NoTrans, <int>(r1 - r0), <int>I, <int>G4, <floating>1,
             <floating *>bc.dgates[d] + r0 * G4, <int>G4, <floating *>bc.w_ih[d], <int>I,
             <floating>(0 if d == 0 else 1), target, <int>ld)
    if not bc.x_rows_packed:
        for t in range(t_lo, t_hi):
            for b in range(bc.steps.sizes[t]):
                src = <floating *>bc.dx_packed + (bc.steps.start[t] + b) * I
                dst = row_of(<floating *>bc.dx.data, &bc.dx, t, b)
                for j in range(I):
                    dst[j] = src[j]


cdef void _backward_worker(BackwardCall *bc, floating *like, int worker) noexcept nogil:
    """One thread's part of a backward call: tasks from the shared list until none is left."""
    cdef int k
    cdef const Task *task
    cdef long long start
    while True:
        k = take_next(bc.next_task)
        if k >= bc.n_tasks:
            return
        task = &bc.tasks[k]
        start = trace_start(&bc.trace)
        if task.kind == TASK_PACK:
            _pack_piece_bwd(bc, like, task.d, task.i)
            event_add(&bc.pack_done[task.d], 1)
        elif task.kind == TASK_RECURRENCE:
            _recurrence_rows_bwd(bc, like, task.d, task.i, worker, k)
            continue  # traced per chunk
        elif task.kind == TASK_GATHER_X:
            _gather_x(bc, like, task.i)
            event_add(bc.x_gathered, 1)
        elif task.kind == TASK_GATHER_H:
            _gather_h(bc, like, task.d, task.i)
            event_set(&bc.h_gathered[task.d * bc.n_chunks + task.i], 1)
        elif task.kind == TASK_WEIGHTS:
            _weights(bc, like, task.d, task.i, task.j)
        else:
            _dx_piece(bc, like, task.i)
        trace_task(&bc.trace, task.kind, task.d, task.i, task.j, worker, start, k)


cdef void _backward_job_float(void *ctx, int worker, int n_workers) noexcept nogil:
    _backward_worker(<BackwardCall *>ctx, <float *>NULL, worker)


cdef void _backward_job_double(void *ctx, int worker, int n_workers) noexcept nogil:
    _backward_worker(<BackwardCall *>ctx, <double *>NULL, worker)
