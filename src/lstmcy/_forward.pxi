# The forward of one layer (both directions) as tasks that any number of threads take.
#
# Tasks, in the order threads take them (ForwardCall.tasks):
#   1. TASK_PACK: pieces of w_hh^T packed for the recurrent products (split by rows; with
#      the units split each part packs its own columns in its first step), and of w_ih^T
#      for fused_input (rows split) or packed_projection.
#   2. TASK_PROJECT: gates = x @ w_ih^T for a range of steps, both directions (one BLAS
#      GEMM each, or with packed_projection lstmcy's packed product from w_ih^T packed
#      once), in the order the recurrences need them (two directions: from both ends).
#      With fused_input it only gathers the piece's x rows where they are not in packed
#      order (x_packed).
#   3. TASK_RECURRENCE (split by rows): a group of batch rows (a block of consecutive rows,
#      ForwardCall.row_start) runs every step alone: a packed GEMM adds h_{t-1} @ w_hh^T to
#      its rows' gates (with fused_input: gates = x_t @ w_ih^T + h_{t-1} @ w_hh^T, one
#      packed product), then the cell. A row never reads another row, so groups never wait
#      for each other, only for their steps' projection pieces.
#   TASK_UNIT_STEP (split by units, for a few rows): per step, each part adds the products
#      of its hidden units' columns and runs their cells; a step starts once every part of
#      the previous one is done. A thread takes its own part of each step first, so its
#      columns of w_hh stay in its cache, and another's part only if nobody has taken it.
#
# h_{t-1} is read where the step before wrote h: the saved h (training) or the layer output
# y (inference); rows without a previous step (the first step, and in reverse direction a
# sequence's own last step) read h0. At the end each row's last h goes to h_n; c_state is
# updated in place (each row's units by one task at a time). With a projection (h of size
# P), the cells write r = o * tanh(c) to r_rows and a second packed GEMM per step gives the
# group's h = r @ w_hr^T (the units split is not used then).
#
# fused_input (a function of the shape, _schedule.fused_input) takes x's product inside the
# recurrence: each step's rows multiply w_ih^T's packed panels from cache, where a BLAS
# projection writes every row's gates to memory and the recurrence reads them back.
# packed_projection (also the shape's, _schedule.packed_projection) keeps the projection
# but multiplies w_ih^T packed once by the pack tasks, where each BLAS call of a piece
# would pack it anew.
#
# Bits: every product of a row, or of a column, is the same whichever rows or columns
# share its packed GEMM call, and the projection pieces and their product are functions of
# the shape. So the results are bitwise identical for any number of threads, groups or
# parts, and either split.


cdef inline floating *_h_source(const ForwardCall *fc, floating *like, Py_ssize_t d,
                                Py_ssize_t t, Py_ssize_t b, Py_ssize_t *row_stride) noexcept nogil:
    """Where h_t of row b was written (the saved h, or y), and the stride between rows b
    and b + 1 there."""
    if fc.training:
        row_stride[0] = fc.P
        return <floating *>fc.saved[d].h + (t * fc.steps.B + b) * fc.P
    row_stride[0] = fc.y.batch_stride * fc.y.ld
    return row_of(<floating *>fc.y.data, &fc.y, t, b) + d * fc.P


cdef inline const floating *_x_rows(const ForwardCall *fc, floating *like, Py_ssize_t n,
                                    Py_ssize_t *ld) noexcept nogil:
    """Packed row ``n`` of the layer input (x in place, or its gathered copy) and the
    stride between packed rows there."""
    if fc.x_rows_packed:
        ld[0] = fc.x.ld
        return <floating *>fc.x.data + n * fc.x.ld + fc.x.col
    ld[0] = fc.I
    return <floating *>fc.x_packed + n * fc.I


cdef inline void _step_product(Py_ssize_t m, Py_ssize_t nc, Py_ssize_t I, const floating *x,
                               Py_ssize_t ldx, const floating *packed_x, Py_ssize_t P,
                               const floating *h, Py_ssize_t ldh, const floating *packed,
                               floating *out, Py_ssize_t ldo) noexcept nogil:
    """out[m, nc] += h @ packed, or with ``packed_x`` out = x @ packed_x + h @ packed."""
    if packed_x != NULL:
        packed_gemm2(m, nc, I, x, ldx, packed_x, P, h, ldh, packed, out, ldo)
    else:
        packed_gemm(m, nc, P, h, ldh, packed, out, ldo, True)


cdef inline Py_ssize_t _rows_below(Py_ssize_t n_active, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """How many of the rows [r0, r1) are below ``n_active``."""
    if n_active > r1:
        n_active = r1
    return n_active - r0 if n_active > r0 else 0


cdef void _add_recurrent_products(const ForwardCall *fc, floating *like, Py_ssize_t d,
                                  Py_ssize_t s, Py_ssize_t t, Py_ssize_t r0, Py_ssize_t r1,
                                  Py_ssize_t m, Py_ssize_t c0, Py_ssize_t nc,
                                  const floating *packed, const floating *packed_x) noexcept nogil:
    """gates[rows, c0:c0+nc] += h_{t-1}[rows] @ op(w_hh)[:, c0:c0+nc] for the ``m`` active
    rows of [r0, r1) at step t (step ``s`` in processing order); ``packed`` holds
    those columns. With ``packed_x`` (those columns of w_ih^T packed: fused_input) the
    gates are x_t[rows] @ w_ih^T + h_{t-1}[rows] @ w_hh^T instead. Rows active at the
    previous step read its h, the others h0."""
    cdef Py_ssize_t P = fc.P
    cdef Py_ssize_t n0 = fc.steps.start[t]
    cdef Py_ssize_t m_prev = 0
    cdef Py_ssize_t t_prev, stride, ldx
    cdef const floating *src
    cdef const floating *x = _x_rows(fc, like, n0 + r0, &ldx)
    cdef Py_ssize_t ldg = fc.ldg
    cdef floating *out = <floating *>fc.gates[d] + (n0 + r0) * ldg + c0
    if m == 0 or nc == 0 or P == 0:
        return
    if s > 0:
        t_prev = t + 1 if d == 1 else t - 1
        m_prev = _rows_below(fc.steps.sizes[t_prev], r0, r1)
        m_prev = m if m_prev > m else m_prev
    if m_prev > 0:
        src = _h_source(fc, like, d, t_prev, r0, &stride)
        _step_product(m_prev, nc, fc.I, x, ldx, packed_x, P, src, stride, packed, out, ldg)
    if m > m_prev:
        src = <floating *>fc.h0[d] + (r0 + m_prev) * P
        _step_product(m - m_prev, nc, fc.I, x + m_prev * ldx, ldx, packed_x, P, src, P, packed,
                      out + m_prev * ldg, ldg)


cdef void _cells(const ForwardCall *fc, floating *like, Py_ssize_t d, Py_ssize_t t,
                 Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t u0, Py_ssize_t w) noexcept nogil:
    """The cells of units [u0, u0 + w) of the active rows of [r0, r1) at step t. Their
    o * tanh(c) is h (saved and copied to y, or y alone in inference), or with a projection
    r (to r_rows, for _project_h)."""
    cdef Py_ssize_t H = fc.H
    cdef Py_ssize_t P = fc.P
    cdef Py_ssize_t B = fc.steps.B
    cdef Py_ssize_t n0 = fc.steps.start[t]
    cdef Py_ssize_t nb = fc.steps.sizes[t] if fc.steps.sizes[t] < r1 else r1
    cdef const floating *bias = <floating *>fc.bias[d] + u0
    cdef floating *c_state = <floating *>fc.c_state[d]
    cdef floating *gates = <floating *>fc.gates[d]
    cdef floating *act
    cdef floating *y_row
    cdef floating *out_row
    cdef Py_ssize_t b, r, j
    cdef const Saved *sv = &fc.saved[d]
    if w == 0:
        return
    for b in range(r0, nb):
        act = gates + (n0 + b) * fc.ldg + u0
        y_row = row_of(<floating *>fc.y.data, &fc.y, t, b) + d * P + u0
        if fc.projected:
            out_row = <floating *>fc.r_rows[d] + (n0 + b) * H + u0
        elif fc.training:
            out_row = <floating *>sv.h + (t * B + b) * P + u0
        else:
            out_row = y_row
        if fc.training:
            r = (t * B + b) * H + u0
            forward_cell(w, H, act, bias, c_state + b * H + u0, out_row,
                         <floating *>sv.i + r, <floating *>sv.f + r, <floating *>sv.g + r,
                         <floating *>sv.o + r, <floating *>sv.c + r, <floating *>sv.tanhc + r)
            if not fc.projected:
                for j in range(w):
                    y_row[j] = out_row[j]
        else:
            forward_cell_inference(w, H, act, bias, c_state + b * H + u0, out_row)


cdef void _project_h(const ForwardCall *fc, floating *like, Py_ssize_t d, Py_ssize_t t,
                     Py_ssize_t r0, Py_ssize_t m) noexcept nogil:
    """With a projection: h = r @ w_hr^T for the m active rows r0, r0 + 1, ... of step t,
    into the saved h (then copied to y) or y."""
    cdef Py_ssize_t H = fc.H
    cdef Py_ssize_t P = fc.P
    cdef Py_ssize_t n0 = fc.steps.start[t]
    cdef Py_ssize_t stride, k, b, j
    cdef floating *h_out
    cdef floating *y_row
    if m == 0 or P == 0:
        return
    h_out = _h_source(fc, like, d, t, r0, &stride)
    if H > 0:
        packed_gemm(m, P, H, <floating *>fc.r_rows[d] + (n0 + r0) * H, H,
                    <floating *>fc.w_packed[d] + fc.hr_offset, h_out, stride, False)
    else:
        for k in range(m):
            for j in range(P):
                h_out[k * stride + j] = 0
    if fc.training:
        for k in range(m):
            b = r0 + k
            y_row = row_of(<floating *>fc.y.data, &fc.y, t, b) + d * P
            for j in range(P):
                y_row[j] = h_out[k * stride + j]


cdef void _final_h(const ForwardCall *fc, floating *like, Py_ssize_t d, Py_ssize_t r0,
                   Py_ssize_t r1, Py_ssize_t u0, Py_ssize_t w) noexcept nogil:
    """h_n[b, u0:u0+w] = h at row b's last step, for the rows b of [r0, r1) (in reverse
    direction every row ends at step 0; in time order at its own last step)."""
    cdef Py_ssize_t T = fc.steps.T
    cdef Py_ssize_t t = T - 1
    cdef Py_ssize_t b, j, stride
    cdef const floating *src
    cdef floating *dst
    if T == 0:
        return
    for b in range(r0, r1):
        if d == 1:
            t = 0
        else:
            while t > 0 and fc.steps.sizes[t] <= b:  # rows sorted longest first
                t -= 1
        src = _h_source(fc, like, d, t, b, &stride) + u0
        dst = <floating *>fc.h_n[d] + b * fc.P + u0
        for j in range(w):
            dst[j] = src[j]


cdef inline void _step_range(Py_ssize_t piece, Py_ssize_t piece_steps, Py_ssize_t T,
                             Py_ssize_t *t_lo, Py_ssize_t *t_hi) noexcept nogil:
    t_lo[0] = piece * piece_steps
    t_hi[0] = t_lo[0] + piece_steps if t_lo[0] + piece_steps < T else T


cdef long long _project(const ForwardCall *fc, floating *like, Py_ssize_t piece) noexcept nogil:
    """TASK_PROJECT: gates[d] = x @ w_ih[d]^T over the packed rows of the piece's steps
    (with fused_input only the gathering of x's rows, where they are not packed). Returns
    when the work started (for the trace: after the wait for w_ih^T's packing)."""
    cdef Py_ssize_t I = fc.I
    cdef Py_ssize_t G4 = 4 * fc.H
    cdef Py_ssize_t t_lo, t_hi, r0, r1, t, b, j, d, lda
    cdef const floating *a
    cdef const floating *x_row
    cdef floating *dst
    cdef long long start
    cdef bint from_packed = fc.packed_projection and I > 0 and G4 > 0
    if from_packed:
        # The pack tasks precede every projection piece in the list: their threads are
        # running them, and wait for nothing.
        for d in range(fc.D):
            job_wait(&fc.pack_done[d], fc.packs_per_direction, fc.spin_ns)
    start = trace_start(&fc.trace)
    _step_range(piece, fc.piece_steps, fc.steps.T, &t_lo, &t_hi)
    r0 = fc.steps.start[t_lo]
    r1 = fc.steps.start[t_hi - 1] + fc.steps.sizes[t_hi - 1]
    if r1 == r0 or G4 == 0:
        return start
    if not fc.x_rows_packed:
        for t in range(t_lo, t_hi):
            for b in range(fc.steps.sizes[t]):
                x_row = row_of(<floating *>fc.x.data, &fc.x, t, b)
                dst = <floating *>fc.x_packed + (fc.steps.start[t] + b) * I
                for j in range(I):
                    dst[j] = x_row[j]
    if fc.fused_input:
        return start
    a = _x_rows(fc, like, r0, &lda)
    for d in range(fc.D):
        if from_packed:
            packed_gemm(r1 - r0, G4, I, a, lda, <floating *>fc.w_packed[d] + fc.ih_offset,
                        <floating *>fc.gates[d] + r0 * fc.ldg, fc.ldg, False)
        else:
            gemm(NoTrans, Trans, <int>(r1 - r0), <int>G4, <int>I, <floating>1, a, <int>lda,
                 <floating *>fc.w_ih[d], <int>I, <floating>0,
                 <floating *>fc.gates[d] + r0 * fc.ldg, <int>fc.ldg)
    return start


cdef void _pack_piece(const ForwardCall *fc, floating *like, Py_ssize_t d, Py_ssize_t piece,
                      PackedMatrix which) noexcept nogil:
    """TASK_PACK: panels of w_hh^T (4H columns, K = P; split by rows), of w_hr^T (P
    columns, K = H) or of w_ih^T (4H columns, K = I) for piece ``piece`` of
    ``pack_pieces``."""
    cdef Py_ssize_t nr = panel_width(like)
    cdef Py_ssize_t columns = fc.P if which == PACK_W_HR else 4 * fc.H
    cdef Py_ssize_t K = fc.P if which == PACK_W_HH else (fc.H if which == PACK_W_HR else fc.I)
    cdef Py_ssize_t panels = (columns + nr - 1) // nr
    cdef Py_ssize_t per = (panels + fc.pack_pieces - 1) // fc.pack_pieces
    cdef Py_ssize_t p0 = piece * per
    cdef Py_ssize_t p1 = p0 + per if p0 + per < panels else panels
    cdef Py_ssize_t c1 = p1 * nr if p1 * nr < columns else columns
    cdef const floating *w = <floating *>(
        fc.w_hh[d] if which == PACK_W_HH else (fc.w_hr[d] if which == PACK_W_HR else fc.w_ih[d]))
    cdef floating *out = <floating *>fc.w_packed[d] + (
        0 if which == PACK_W_HH else (fc.hr_offset if which == PACK_W_HR else fc.ih_offset))
    if p1 <= p0 or K == 0:
        return
    pack(w, K, True, K, p0 * nr, c1 - p0 * nr, out + p0 * nr * K)


cdef void _recurrence_rows(const ForwardCall *fc, floating *like, Py_ssize_t d,
                           Py_ssize_t g, int worker, int order) noexcept nogil:
    """TASK_RECURRENCE: every step of row group g of direction d."""
    cdef Py_ssize_t T = fc.steps.T
    cdef Py_ssize_t r0 = fc.row_start[g]
    cdef Py_ssize_t r1 = fc.row_start[g + 1]
    cdef Py_ssize_t s, t, m, piece
    cdef Py_ssize_t last_piece = -1
    cdef long long start = 0
    cdef const floating *packed_x = NULL
    if fc.fused_input:
        packed_x = <floating *>fc.w_packed[d] + fc.ih_offset
    if fc.H > 0:
        job_wait(&fc.pack_done[d], fc.packs_per_direction, fc.spin_ns)
    for s in range(T):
        t = T - 1 - s if d == 1 else s
        piece = t // fc.piece_steps
        if piece != last_piece:
            # Traced per piece of steps, from after the wait for the piece.
            if last_piece >= 0:
                trace_task(&fc.trace, TASK_RECURRENCE, d, g, last_piece, worker, start, order)
            job_wait(&fc.piece_done[piece], 1, fc.spin_ns)
            start = trace_start(&fc.trace)
            last_piece = piece
        m = _rows_below(fc.steps.sizes[t], r0, r1)
        _add_recurrent_products(fc, like, d, s, t, r0, r1, m, 0, 4 * fc.H,
                                <floating *>fc.w_packed[d], packed_x)
        _cells(fc, like, d, t, r0, r1, 0, fc.H)
        if fc.projected:
            _project_h(fc, like, d, t, r0, m)
    _final_h(fc, like, d, r0, r1, 0, fc.P)
    if last_piece >= 0:
        trace_task(&fc.trace, TASK_RECURRENCE, d, g, last_piece, worker, start, order)


cdef void _unit_step(const ForwardCall *fc, floating *like, Py_ssize_t d, Py_ssize_t s,
                     Py_ssize_t u, int worker) noexcept nogil:
    """TASK_UNIT_STEP: the units of part u at step s (processing order) of direction d."""
    cdef Py_ssize_t H = fc.H
    cdef Py_ssize_t T = fc.steps.T
    cdef Py_ssize_t t = T - 1 - s if d == 1 else s
    cdef Py_ssize_t I = fc.I
    cdef Py_ssize_t u0, u1, w, q, plen, plen_x
    cdef long long start
    cdef floating *packed
    cdef floating *packed_x = NULL
    job_wait(&fc.piece_done[t // fc.piece_steps], 1, fc.spin_ns)
    start = trace_start(&fc.trace)
    unit_range(H, fc.groups, u, &u0, &u1)
    w = u1 - u0
    packed = <floating *>fc.w_packed[d] + units_packed_offset(H, fc.groups, u, 4, H, like)
    plen = packed_len(w, H, like)
    plen_x = packed_len(w, I, like)
    if fc.fused_input:
        packed_x = (<floating *>fc.w_packed[d] + fc.ih_offset
                    + units_packed_offset(H, fc.groups, u, 4, I, like))
    if s == 0 and w > 0 and H > 0:
        for q in range(4):
            pack(<floating *>fc.w_hh[d], H, True, H, q * H + u0, w, packed + q * plen)
            if fc.fused_input:
                pack(<floating *>fc.w_ih[d], I, True, I, q * H + u0, w, packed_x + q * plen_x)
    if w > 0:
        for q in range(4):
            _add_recurrent_products(fc, like, d, s, t, 0, fc.steps.B, fc.steps.sizes[t],
                                    q * H + u0, w, packed + q * plen,
                                    packed_x + q * plen_x if fc.fused_input else NULL)
        _cells(fc, like, d, t, 0, fc.steps.B, u0, w)
        if s == T - 1:
            _final_h(fc, like, d, 0, fc.steps.B, u0, w)
    event_add(&fc.step_done[d], 1)
    trace_task(&fc.trace, TASK_UNIT_STEP, d, s, u, worker, start, -1)


cdef void _forward_worker(ForwardCall *fc, floating *like, int worker) noexcept nogil:
    """One thread's part of a forward call: tasks from the shared list until none is left,
    then (units split) the per-step tasks."""
    cdef int k
    cdef const Task *task
    cdef long long start
    while True:
        k = take_next(fc.next_task)
        if k >= fc.n_tasks:
            break
        task = &fc.tasks[k]
        start = trace_start(&fc.trace)
        if task.kind == TASK_PACK:
            _pack_piece(fc, like, task.d, task.i, <PackedMatrix>task.j)
            event_add(&fc.pack_done[task.d], 1)
            trace_task(&fc.trace, TASK_PACK, task.d, task.i, task.j, worker, start, k)
        elif task.kind == TASK_PROJECT:
            start = _project(fc, like, task.i)
            event_set(&fc.piece_done[task.i], 1)
            trace_task(&fc.trace, TASK_PROJECT, 0, task.i, 0, worker, start, k)
        else:
            _recurrence_rows(fc, like, task.d, task.i, worker, k)
    if fc.split == SPLIT_UNITS:
        units_worker(fc, like, worker)


cdef void _forward_job_float(void *ctx, int worker, int n_workers) noexcept nogil:
    _forward_worker(<ForwardCall *>ctx, <float *>NULL, worker)


cdef void _forward_job_double(void *ctx, int worker, int n_workers) noexcept nogil:
    _forward_worker(<ForwardCall *>ctx, <double *>NULL, worker)
