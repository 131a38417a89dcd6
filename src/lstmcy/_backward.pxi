# The backward of one layer (both directions), split between any number of threads.
#
# First the listed tasks (BackwardCall.tasks), in order:
#   1. TASK_PACK: pieces of w_hh packed for the per-step products dh = dgates @ w_hh.
#   2. TASK_RECURRENCE (split by rows): a group of batch rows (a block of consecutive rows,
#      BackwardCall.row_start) runs every step alone, in reverse processing order: the
#      cell's backward writes the four gate gradients of its rows to dgates and updates
#      dc, then a packed GEMM gives dh for the step before. A row's recurrence never reads another row. Each group publishes
#      the steps it has done (BackwardCall.progress).
#   TASK_UNIT_STEP (split by units, for batches too thin for row groups; not listed, see
#      _units.pxi): at each step a part first computes dh of its units, dgates @ w_hh[:,
#      units] over every part's gate gradients of the step before, then runs its units'
#      cells; it publishes its steps as a row group does. Each part packs its own columns
#      of w_hh at its first step.
# Then each thread turns to the gradients the recurrences make ready (_gradients_worker),
# as they become ready, while the recurrences still run on other threads:
#   * TASK_DX: a piece of steps, dx = sum over directions of dgates @ w_ih (taken first:
#     large and independent): OpenBLAS's, or with packed_dx the packed GEMM from w_ih
#     packed once, by the first thread to reach a dx piece (the others do other work
#     meanwhile, or wait for it when there is none);
#   * TASK_WEIGHTS: the next chunk of a chain: a lane (chunks l, l + lanes, ...) of a block
#     of gate rows, [dW_ih | dW_hh] += dgates^T [x | h_{t-1}] (one GEMM: OpenBLAS's, or
#     with panel_weights gemm_tn) and db += sum(dgates) over the chunk's rows into the
#     lane's own sums (its TASK_GATHER first puts the chunk's [x | h_{t-1}] rows in packed
#     order, or with panel_weights lays them out in panels once for every block); with a
#     projection also blocks of its rows, dW_hr += dh^T r (r = o * tanh(c)). A chain has
#     one owner at a time and adds its chunks in processing order; a thread keeps to its
#     chain while it can, so two threads never wait on one chain. The last lane of a block
#     to finish adds the lanes' sums in lane order (TASK_FINISH). Lanes let large blocks
#     (efficient GEMMs) run in parallel.
# Nothing waits for anything that needs a thread it holds, so any number of threads (one
# included) completes the call.
#
# Bits: the recurrence's products of a row, or a column, do not depend on the group or
# part; the chunks, blocks,
# lanes and dx pieces are a function of the shape, each chain adds its chunks in order and
# the lanes are added in order (db in float64, row by row), whichever thread runs them. So
# the results are bitwise identical for any number of threads, groups or parts, and
# either split.


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


cdef inline void _dx_piece_steps(const BackwardCall *bc, Py_ssize_t q, Py_ssize_t *t_lo,
                                 Py_ssize_t *t_hi) noexcept nogil:
    """Time steps [t_lo, t_hi) of dx piece q (the shape's alone: no batch layout read)."""
    t_lo[0] = q * bc.dx_steps
    t_hi[0] = t_lo[0] + bc.dx_steps if t_lo[0] + bc.dx_steps < bc.steps.T else bc.steps.T


cdef inline void _dx_piece_rows(const BackwardCall *bc, Py_ssize_t q, Py_ssize_t *t_lo,
                                Py_ssize_t *t_hi, Py_ssize_t *r0, Py_ssize_t *r1) noexcept nogil:
    """Time steps [t_lo, t_hi) and packed rows [r0, r1) of dx piece q."""
    _dx_piece_steps(bc, q, t_lo, t_hi)
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


cdef inline const floating *_h_prev(const BackwardCall *bc, floating *like, Py_ssize_t d,
                                    Py_ssize_t t, Py_ssize_t b) noexcept nogil:
    """h_{t-1} of row b at step t as the forward read it: the saved h of the step before,
    or h0."""
    cdef Py_ssize_t prev_t = _prev_step(bc, d, t, b)
    if prev_t >= 0:
        return <floating *>bc.saved[d].h + (prev_t * bc.steps.B + b) * bc.P
    return <floating *>bc.h0[d] + b * bc.P


cdef void _pack_piece_bwd(const BackwardCall *bc, floating *like, Py_ssize_t d,
                          Py_ssize_t piece, PackedMatrix which) noexcept nogil:
    """TASK_PACK: panels of w_hh (its P columns, K = 4H) or of w_hr (its H columns, K = P)
    for piece ``piece`` of ``pack_pieces``."""
    cdef Py_ssize_t nr = panel_width(like)
    cdef Py_ssize_t columns = bc.P if which == PACK_W_HH else bc.H
    cdef Py_ssize_t K = 4 * bc.H if which == PACK_W_HH else bc.P
    cdef Py_ssize_t panels = (columns + nr - 1) // nr
    cdef Py_ssize_t per = (panels + bc.pack_pieces - 1) // bc.pack_pieces
    cdef Py_ssize_t p0 = piece * per
    cdef Py_ssize_t p1 = p0 + per if p0 + per < panels else panels
    cdef Py_ssize_t c1 = p1 * nr if p1 * nr < columns else columns
    cdef const floating *w = <floating *>(bc.w_hh[d] if which == PACK_W_HH else bc.w_hr[d])
    cdef floating *out = <floating *>bc.w_packed[d] + (0 if which == PACK_W_HH else bc.hr_offset)
    if p1 <= p0 or K == 0:
        return
    pack(w, columns, False, K, p0 * nr, c1 - p0 * nr, out + p0 * nr * K)


cdef void _cells_bwd(const BackwardCall *bc, floating *like, Py_ssize_t d, Py_ssize_t t,
                     Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t u0, Py_ssize_t w) noexcept nogil:
    """The cells' backward of units [u0, u0 + w) of the active rows of [r0, r1) at
    step t: their gate gradients to dgates, dc_state from dc_t to dc_{t-1}. What reaches
    o * tanh(c_t) is dh_t = dy_t + dh_state (kept in dh_state), or with a projection the
    row of dr_rows."""
    cdef Py_ssize_t H = bc.H
    cdef Py_ssize_t P = bc.P
    cdef Py_ssize_t B = bc.steps.B
    cdef Py_ssize_t n0 = bc.steps.start[t]
    cdef Py_ssize_t nb = bc.steps.sizes[t] if bc.steps.sizes[t] < r1 else r1
    cdef const Saved *sv = &bc.saved[d]
    cdef floating *dh_state = <floating *>bc.dh_state[d]
    cdef Py_ssize_t b, r, j, prev_t
    cdef const floating *c_prev
    cdef const floating *dy_row
    cdef const floating *cell_in
    cdef floating *dh_t
    for b in range(r0, nb):
        r = (t * B + b) * H + u0
        if bc.projected:
            cell_in = <floating *>bc.dr_rows[d] + (n0 + b) * H + u0
        else:
            dy_row = row_of(<floating *>bc.dy.data, &bc.dy, t, b) + d * P + u0
            dh_t = dh_state + b * P + u0
            for j in range(w):  # dh = dy + dh_next
                dh_t[j] = dy_row[j] + dh_t[j]
            cell_in = dh_t
        prev_t = _prev_step(bc, d, t, b)
        c_prev = (<floating *>sv.c + (prev_t * B + b) * H + u0 if prev_t >= 0
                  else <floating *>bc.c0[d] + b * H + u0)
        backward_cell(w, H, cell_in, c_prev, <floating *>sv.i + r, <floating *>sv.f + r,
                      <floating *>sv.g + r, <floating *>sv.o + r, <floating *>sv.tanhc + r,
                      <floating *>bc.dc_state[d] + b * H + u0,
                      <floating *>bc.dgates[d] + (n0 + b) * bc.ldg + u0)


cdef void _recurrence_rows_bwd(const BackwardCall *bc, floating *like, Py_ssize_t d,
                               Py_ssize_t g, int worker, int order) noexcept nogil:
    """TASK_RECURRENCE: every step of row group g of direction d: dh_t = dy_t
    + the gradient from step t+1 (with a projection kept in dh_rows, and dh_t @ w_hr, the
    gradient of o * tanh(c_t), in dr_rows), the cell's backward, then dh for the step
    before, dgates_t @ w_hh."""
    cdef Py_ssize_t T = bc.steps.T
    cdef Py_ssize_t H = bc.H
    cdef Py_ssize_t P = bc.P
    cdef Py_ssize_t G4 = 4 * H
    cdef Py_ssize_t r0 = bc.row_start[g]
    cdef Py_ssize_t r1 = bc.row_start[g + 1]
    cdef floating *dgates = <floating *>bc.dgates[d]
    cdef floating *dh_state = <floating *>bc.dh_state[d]
    cdef floating *dh_rows = <floating *>bc.dh_rows[d]
    cdef Py_ssize_t s, t, k, m, b, n0, c_end, j
    cdef Py_ssize_t c = 0
    cdef const floating *dy_row
    cdef floating *dh_t
    cdef long long start
    if H > 0:
        job_wait(&bc.pack_done[d], <int>(bc.pack_pieces * (2 if bc.projected else 1)), bc.spin_ns)
    start = trace_start(&bc.trace)
    c_end = bc.first if bc.first < T else T
    for s in range(T):
        t = s if d == 1 else T - 1 - s
        n0 = bc.steps.start[t]
        m = _rows_below(bc.steps.sizes[t], r0, r1)
        if H > 0 and m > 0:
            if bc.projected:
                for k in range(m):
                    b = r0 + k
                    dy_row = row_of(<floating *>bc.dy.data, &bc.dy, t, b) + d * P
                    dh_t = dh_rows + (n0 + b) * P
                    for j in range(P):
                        dh_t[j] = dy_row[j] + dh_state[b * P + j]
                packed_gemm(m, H, P, dh_rows + (n0 + r0) * P, P,
                            <floating *>bc.w_packed[d] + bc.hr_offset,
                            <floating *>bc.dr_rows[d] + (n0 + r0) * H, H, False)
            _cells_bwd(bc, like, d, t, r0, r1, 0, H)
            # dh for the step before: dgates_t @ w_hh over the group's rows.
            packed_gemm(m, P, G4, dgates + (n0 + r0) * bc.ldg, bc.ldg,
                        <floating *>bc.w_packed[d], dh_state + r0 * P, P, False)
        event_set(&bc.progress[d * bc.groups + g], <int>(s + 1))
        if s + 1 == c_end:
            trace_task(&bc.trace, TASK_RECURRENCE, d, g, c, worker, start, order)
            start = trace_start(&bc.trace)
            c += 1
            c_end = c_end + bc.chunk if c_end + bc.chunk < T else T


cdef void _unit_step_bwd(const BackwardCall *bc, floating *like, Py_ssize_t d, Py_ssize_t s,
                         Py_ssize_t u, int worker) noexcept nogil:
    """TASK_UNIT_STEP: the units of part u at processing step s of direction d (no
    projection): dh of its units from every part's gate gradients of step s - 1 (for the
    rows active there; the others keep theirs), then its units' cells. Step s == T only
    gives dh of h0; step 0 packs the part's columns of w_hh first. The previous step is
    done (the caller waited)."""
    cdef Py_ssize_t T = bc.steps.T
    cdef Py_ssize_t H = bc.H
    cdef Py_ssize_t G4 = 4 * H
    cdef Py_ssize_t u0, u1, w, t_prev
    cdef floating *packed
    cdef long long start = trace_start(&bc.trace)
    unit_range(H, bc.groups, u, &u0, &u1)
    w = u1 - u0
    packed = <floating *>bc.w_packed[d] + units_packed_offset(H, bc.groups, u, 1, G4, like)
    if w > 0:
        if s == 0:
            pack(<floating *>bc.w_hh[d], H, False, G4, u0, w, packed)
        else:
            t_prev = s - 1 if d == 1 else T - s
            packed_gemm(bc.steps.sizes[t_prev], w, G4,
                        <floating *>bc.dgates[d] + bc.steps.start[t_prev] * bc.ldg, bc.ldg, packed,
                        <floating *>bc.dh_state[d] + u0, H, False)
        if s < T:
            _cells_bwd(bc, like, d, s if d == 1 else T - 1 - s, 0, bc.steps.B, u0, w)
    if s < T:
        event_set(&bc.progress[d * bc.groups + u], <int>(s + 1))
    event_add(&bc.step_done[d], 1)
    trace_task(&bc.trace, TASK_UNIT_STEP, d, s, u, worker, start, -1)


cdef void _gather(const BackwardCall *bc, floating *like, Py_ssize_t d,
                  Py_ssize_t c) noexcept nogil:
    """TASK_GATHER: z[d][packed rows of chunk c] = [x | h_{t-1}] of each row (h_{t-1} the
    saved h of the step before, or h0), and with a projection [... | o * tanh(c_t)]."""
    cdef Py_ssize_t I = bc.I
    cdef Py_ssize_t H = bc.H
    cdef Py_ssize_t P = bc.P
    cdef Py_ssize_t B = bc.steps.B
    cdef Py_ssize_t t_lo, t_hi, r0, r1, t, b, j, row
    cdef const floating *x_row
    cdef const floating *h_prev
    cdef const floating *o_row
    cdef const floating *tc_row
    cdef floating *dst
    _chunk_rows(bc, d, c, &t_lo, &t_hi, &r0, &r1)
    if bc.panel_weights:
        _gather_panels(bc, like, d, t_lo, t_hi, r0, r1)
        return
    for t in range(t_lo, t_hi):
        for b in range(bc.steps.sizes[t]):
            dst = <floating *>bc.z[d] + (bc.steps.start[t] + b) * bc.z_width
            x_row = row_of(<floating *>bc.x.data, &bc.x, t, b)
            for j in range(I):
                dst[j] = x_row[j]
            h_prev = _h_prev(bc, like, d, t, b)
            for j in range(P):
                dst[I + j] = h_prev[j]
            if bc.projected:  # r = o * tanh(c), as the forward computed it
                row = (t * B + b) * H
                o_row = <floating *>bc.saved[d].o + row
                tc_row = <floating *>bc.saved[d].tanhc + row
                for j in range(H):
                    dst[I + P + j] = o_row[j] * tc_row[j]


cdef void _gather_panels(const BackwardCall *bc, floating *like, Py_ssize_t d, Py_ssize_t t_lo,
                         Py_ssize_t t_hi, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """_gather with panel_weights: the chunk's [x | h_{t-1}] rows (packed rows r0..r1) as
    ``pack`` lays out a matrix of r1 - r0 rows, columns past I + P zero: row k's columns
    p*nr .. (p+1)*nr at panel p's row k."""
    cdef Py_ssize_t I = bc.I
    cdef Py_ssize_t P = bc.P
    cdef Py_ssize_t nr = panel_width(like)
    cdef Py_ssize_t rows = r1 - r0
    cdef Py_ssize_t panels = bc.z_width // nr
    cdef Py_ssize_t t, b, j, p, c0, c1
    cdef const floating *x_row
    cdef const floating *h_prev
    cdef floating *dst
    cdef floating *row_start = <floating *>bc.z[d] + r0 * bc.z_width
    for t in range(t_lo, t_hi):
        for b in range(bc.steps.sizes[t]):
            x_row = row_of(<floating *>bc.x.data, &bc.x, t, b)
            h_prev = _h_prev(bc, like, d, t, b)
            for p in range(panels):
                c0 = p * nr
                c1 = c0 + nr
                dst = row_start + p * rows * nr
                if c1 <= I:  # whole panels of x, then of h, copied as blocks
                    memcpy(dst, x_row + c0, nr * sizeof(floating))
                elif c0 >= I and c1 <= I + P:
                    memcpy(dst, h_prev + (c0 - I), nr * sizeof(floating))
                else:
                    for j in range(c0, c1):
                        dst[j - c0] = x_row[j] if j < I else (h_prev[j - I] if j < I + P else 0)
            row_start += nr


cdef inline void _block_rows(const BackwardCall *bc, Py_ssize_t k, Py_ssize_t *k0,
                             Py_ssize_t *kb) noexcept nogil:
    """The rows [k0, k0 + kb) of block k: of the gate rows (k < n_gate_blocks), else of
    the projection's P rows."""
    cdef Py_ssize_t rows = bc.P if k >= bc.n_gate_blocks else 4 * bc.H
    k0[0] = (k - bc.n_gate_blocks if k >= bc.n_gate_blocks else k) * bc.block_rows
    kb[0] = bc.block_rows if k0[0] + bc.block_rows < rows else rows - k0[0]


cdef long long _weights(const BackwardCall *bc, floating *like, Py_ssize_t d, Py_ssize_t lane,
                        Py_ssize_t c, Py_ssize_t k) noexcept nogil:
    """TASK_WEIGHTS: chunk c added to lane ``lane``'s sums of block k (the lane's first
    chunk overwrites). A block of gate rows (k < n_gate_blocks) takes [dW_ih | dW_hh] +=
    dgates^T [x | h_{t-1}] and db (in float64), a block of the projection's rows dW_hr +=
    dh^T r. The caller holds the chain and the recurrences have done the chunk. Returns
    when the work started (for the trace: after the wait for the chunk's gathered rows)."""
    cdef Py_ssize_t H = bc.H
    cdef Py_ssize_t P = bc.P
    cdef Py_ssize_t K = bc.I + P
    cdef Py_ssize_t Z = bc.z_width
    cdef Py_ssize_t G4 = 4 * H
    cdef Py_ssize_t ldg = bc.ldg
    cdef Py_ssize_t k0, kb, t_lo, t_hi, r0, r1, n, j
    cdef const floating *dg = <floating *>bc.dgates[d]
    cdef const floating *z = <floating *>bc.z[d]
    cdef floating beta = 0 if c < bc.lanes else 1
    cdef double *db_acc
    cdef long long start
    _block_rows(bc, k, &k0, &kb)
    _chunk_rows(bc, d, c, &t_lo, &t_hi, &r0, &r1)
    job_wait(&bc.gathered[d * bc.n_chunks + c], 1, bc.spin_ns)  # maybe another block's owner
    start = trace_start(&bc.trace)
    if k >= bc.n_gate_blocks:
        gemm(Trans, NoTrans, <int>kb, <int>H, <int>(r1 - r0), <floating>1,
             <floating *>bc.dh_rows[d] + r0 * P + k0, <int>P, z + r0 * Z + K, <int>Z, beta,
             <floating *>bc.dw_hr_acc[d] + (lane * P + k0) * H, <int>H)
        return start
    if bc.panel_weights:
        gemm_tn(kb, K, r1 - r0, dg + r0 * ldg + k0, ldg, z + r0 * Z,
                <floating *>bc.dw[d] + (lane * G4 + k0) * K, K, c >= bc.lanes)
    else:
        gemm(Trans, NoTrans, <int>kb, <int>K, <int>(r1 - r0), <floating>1, dg + r0 * ldg + k0,
             <int>ldg, z + r0 * Z, <int>Z, beta, <floating *>bc.dw[d] + (lane * G4 + k0) * K,
             <int>K)
    db_acc = bc.db_acc[d] + lane * G4 + k0
    if c < bc.lanes:
        for j in range(kb):
            db_acc[j] = 0
    for n in range(r0, r1):  # in row order: the same sum whichever thread adds it
        for j in range(kb):
            db_acc[j] += dg[n * ldg + k0 + j]
    return start


cdef inline void _add_lanes(floating *out, const floating *acc, Py_ssize_t n,
                            Py_ssize_t lanes, Py_ssize_t lane_stride) noexcept nogil:
    """out[:n] = acc[:n] + acc[lane_stride:][:n] + ..., lane by lane: each element's sum
    in lane order, over whole rows (vectorised)."""
    cdef Py_ssize_t j, lane
    cdef const floating *row
    for j in range(n):
        out[j] = acc[j]
    for lane in range(1, lanes):
        row = acc + lane * lane_stride
        for j in range(n):
            out[j] = out[j] + row[j]


cdef void _finish_block(const BackwardCall *bc, floating *like, Py_ssize_t d,
                        Py_ssize_t k) noexcept nogil:
    """Block k's results from its lanes' sums, added in lane order: dW_ih, dW_hh and db
    (the sum of the float64 sums), or dW_hr."""
    cdef Py_ssize_t I = bc.I
    cdef Py_ssize_t H = bc.H
    cdef Py_ssize_t P = bc.P
    cdef Py_ssize_t K = I + P
    cdef Py_ssize_t G4 = 4 * H
    cdef Py_ssize_t lanes = bc.lanes if bc.lanes < bc.n_chunks else bc.n_chunks
    cdef Py_ssize_t k0, kb, q, lane
    cdef const floating *acc
    cdef double total
    _block_rows(bc, k, &k0, &kb)
    if k >= bc.n_gate_blocks:
        for q in range(k0, k0 + kb):
            _add_lanes(<floating *>bc.dw_hr[d] + q * H, <floating *>bc.dw_hr_acc[d] + q * H, H,
                       lanes, P * H)
        return
    for q in range(k0, k0 + kb):
        total = bc.db_acc[d][q]
        for lane in range(1, lanes):
            total = total + bc.db_acc[d][lane * G4 + q]
        (<floating *>bc.db[d])[q] = <floating>total
        acc = <floating *>bc.dw[d] + q * K
        _add_lanes(<floating *>bc.dw_ih[d] + q * I, acc, I, lanes, G4 * K)
        _add_lanes(<floating *>bc.dw_hh[d] + q * P, acc + I, P, lanes, G4 * K)


cdef void _pack_w_ih(const BackwardCall *bc, floating *like) noexcept nogil:
    """With packed_dx: w_ih of every direction packed (its I columns, K = 4H) by the first
    thread to get here; a thread that gets here meanwhile waits until it is done (the
    packer waits for nothing). Threads that have other work do it first (_dx_ready)."""
    cdef Py_ssize_t d
    if claim(bc.ih_pack_claim):
        for d in range(bc.D):
            pack(<floating *>bc.w_ih[d], bc.I, False, 4 * bc.H, 0, bc.I,
                 <floating *>bc.w_packed[d] + bc.ih_offset)
        event_set(bc.ih_packed, 1)
    else:
        job_wait(bc.ih_packed, 1, bc.spin_ns)


cdef long long _dx_piece(const BackwardCall *bc, floating *like, Py_ssize_t q) noexcept nogil:
    """TASK_DX: dx[rows of piece q] = sum over directions of dgates[d] @ w_ih[d], written
    into dx directly when its rows are packed, else through dx_packed. The recurrences
    have done its steps. Returns when the work started (with packed_dx, the packing of
    w_ih that the first piece does counts as its work)."""
    cdef Py_ssize_t I = bc.I
    cdef Py_ssize_t G4 = 4 * bc.H
    cdef Py_ssize_t t_lo, t_hi, r0, r1, d, t, b, j, ld
    cdef floating *target
    cdef const floating *src
    cdef floating *dst
    cdef long long start = trace_start(&bc.trace)
    _dx_piece_rows(bc, q, &t_lo, &t_hi, &r0, &r1)
    if r1 == r0 or I == 0:
        return start
    if bc.x_rows_packed:
        target = <floating *>bc.dx.data + r0 * bc.dx.ld + bc.dx.col
        ld = bc.dx.ld
    else:
        target = <floating *>bc.dx_packed + r0 * I
        ld = I
    if bc.packed_dx:
        _pack_w_ih(bc, like)
        for d in range(bc.D):
            packed_gemm(r1 - r0, I, G4, <floating *>bc.dgates[d] + r0 * bc.ldg, bc.ldg,
                        <floating *>bc.w_packed[d] + bc.ih_offset, target, ld, d > 0)
    else:
        for d in range(bc.D):
            gemm(NoTrans, NoTrans, <int>(r1 - r0), <int>I, <int>G4, <floating>1,
                 <floating *>bc.dgates[d] + r0 * bc.ldg, <int>bc.ldg, <floating *>bc.w_ih[d],
                 <int>I, <floating>(0 if d == 0 else 1), target, <int>ld)
    if not bc.x_rows_packed:
        for t in range(t_lo, t_hi):
            for b in range(bc.steps.sizes[t]):
                src = <floating *>bc.dx_packed + (bc.steps.start[t] + b) * I
                dst = row_of(<floating *>bc.dx.data, &bc.dx, t, b)
                for j in range(I):
                    dst[j] = src[j]
    return start


cdef inline bint _steps_done(const BackwardCall *bc, Py_ssize_t d, Py_ssize_t steps) noexcept nogil:
    """Whether every row group of direction d has done ``steps`` steps."""
    cdef Py_ssize_t g
    for g in range(bc.groups):
        if event_get(&bc.progress[d * bc.groups + g]) < steps:
            return False
    return True


cdef inline Py_ssize_t _dx_steps_needed(const BackwardCall *bc, Py_ssize_t d, Py_ssize_t q) noexcept nogil:
    """Steps direction d must have done before dx piece q can run."""
    cdef Py_ssize_t t_lo, t_hi
    _dx_piece_steps(bc, q, &t_lo, &t_hi)
    return bc.steps.T - t_lo if d == 0 else t_hi


cdef inline bint _packing_w_ih(const BackwardCall *bc) noexcept nogil:
    """Whether a thread is packing w_ih for the dx pieces (packed_dx) and has not done."""
    return load_acquire(bc.ih_pack_claim) != 0 and event_get(bc.ih_packed) == 0


cdef inline bint _dx_ready(const BackwardCall *bc) noexcept nogil:
    """Whether the next dx piece can run."""
    cdef int next_piece = load_acquire(bc.dx_next)
    cdef Py_ssize_t d
    if next_piece >= bc.n_dx_pieces:
        return False
    if bc.packed_dx and _packing_w_ih(bc):
        return False  # other work first, rather than a wait for the packer
    for d in range(bc.D):
        if not _steps_done(bc, d, _dx_steps_needed(bc, d, bc.dx_order[next_piece])):
            return False
    return True


cdef bint _take_dx_piece(BackwardCall *bc, floating *like, int worker) noexcept nogil:
    """Run the next dx piece (in the order the recurrences complete them) if its steps are
    done; whether one ran (or another thread took it meanwhile)."""
    cdef int next_piece = load_acquire(bc.dx_next)
    cdef Py_ssize_t d, q
    cdef long long start
    if not _dx_ready(bc):
        return False
    q = bc.dx_order[next_piece]
    if not compare_exchange(bc.dx_next, next_piece, next_piece + 1):
        return True  # another thread took it: look again
    start = _dx_piece(bc, like, q)
    trace_task(&bc.trace, TASK_DX, 0, q, 0, worker, start, -1)
    return True


cdef void _chain_chunk(BackwardCall *bc, floating *like, Py_ssize_t d, Py_ssize_t lane,
                       Py_ssize_t k, Py_ssize_t c, int worker) noexcept nogil:
    """Chunk c of lane ``lane`` of block k of direction d, the chunk's [x | h_{t-1}] rows
    gathered first (by whichever chain gets there first); the block's results once it was
    the last chunk of the block's last lane to finish."""
    cdef Py_ssize_t slot = d * bc.n_chunks + c
    cdef Py_ssize_t lanes = bc.lanes if bc.lanes < bc.n_chunks else bc.n_chunks
    cdef long long start
    if claim(&bc.gather_claims[slot]):
        start = trace_start(&bc.trace)
        _gather(bc, like, d, c)
        event_set(&bc.gathered[slot], 1)
        trace_task(&bc.trace, TASK_GATHER, d, c, 0, worker, start, -1)
    start = _weights(bc, like, d, lane, c, k)
    trace_task(&bc.trace, TASK_WEIGHTS, d, c, k, worker, start, -1)
    if c + bc.lanes >= bc.n_chunks and take_next(&bc.lanes_done[d * bc.n_blocks + k]) == lanes - 1:
        start = trace_start(&bc.trace)
        _finish_block(bc, like, d, k)
        trace_task(&bc.trace, TASK_FINISH, d, k, 0, worker, start, -1)


cdef void _gradients_worker(BackwardCall *bc, floating *like, int worker) noexcept nogil:
    """A thread's part of the gradients: ready dx pieces first, then the next chunk of a
    chain (a lane of a block) nobody holds, its own chain first (held while its chunks are
    ready), waiting for the recurrences when nothing is ready; it returns once every dx
    piece is taken and every chain with chunks left is held by another thread. Chain b is
    direction b // (lanes * n_blocks), lane b // n_blocks % lanes, block b % n_blocks; lane
    l adds chunks l, l + lanes, ..."""
    cdef Py_ssize_t per_direction = bc.lanes * bc.n_blocks
    cdef Py_ssize_t n_chains = bc.D * per_direction if bc.want_dparams else 0
    cdef Py_ssize_t own = worker % n_chains if n_chains > 0 else 0
    cdef Py_ssize_t j, b, d, k, c, lane, s_lo, s_hi, g, q
    cdef Py_ssize_t need[2]
    cdef bint ran, free_left, waited
    cdef int next_piece
    while True:
        if bc.want_dx and _take_dx_piece(bc, like, worker):
            continue
        ran = False
        free_left = False
        need[0] = need[1] = bc.steps.T + 1  # steps each direction must reach for more work
        for j in range(n_chains):
            b = (own + j) % n_chains
            d = b // per_direction
            lane = b // bc.n_blocks % bc.lanes
            k = b % bc.n_blocks
            c = lane + bc.lanes * load_acquire(&bc.block_next[b])
            if c >= bc.n_chunks or load_acquire(&bc.block_busy[b]) != 0:
                continue
            free_left = True
            _chunk_steps(bc, c, &s_lo, &s_hi)
            if not _steps_done(bc, d, s_hi):
                if s_hi < need[d]:
                    need[d] = s_hi
                continue
            if not claim(&bc.block_busy[b]):
                continue
            # The chain is this thread's: its chunks while they are ready and no dx piece
            # is (the chain is let go before a dx piece, so others may take it). What was
            # read before the claim is looked at again: meanwhile another holder may have
            # run the chain's next chunks, its last one included.
            while True:
                c = lane + bc.lanes * bc.block_next[b]
                if c >= bc.n_chunks:
                    break
                _chunk_steps(bc, c, &s_lo, &s_hi)
                if not _steps_done(bc, d, s_hi):
                    break
                _chain_chunk(bc, like, d, lane, k, c, worker)
                store_release(&bc.block_next[b], bc.block_next[b] + 1)
                ran = True
                if bc.want_dx and _dx_ready(bc):
                    break
            store_release(&bc.block_busy[b], 0)
            if ran:
                own = b
                break
        if ran:
            continue
        if not free_left and not (bc.want_dx and load_acquire(bc.dx_next) < bc.n_dx_pieces):
            return
        # Something is left but not ready: wait until a row group that is behind has done
        # the steps the nearest piece of work needs (not just its next step: with more
        # threads than cores, waking at every step would take the cores from the
        # recurrences).
        if bc.want_dx:
            next_piece = load_acquire(bc.dx_next)
            if next_piece < bc.n_dx_pieces:
                q = bc.dx_order[next_piece]
                for d in range(bc.D):
                    s_hi = _dx_steps_needed(bc, d, q)
                    if s_hi < need[d] and not _steps_done(bc, d, s_hi):
                        need[d] = s_hi
        waited = False
        for d in range(bc.D):
            if need[d] > bc.steps.T:
                continue
            for g in range(bc.groups):
                j = d * bc.groups + g
                if event_get(&bc.progress[j]) < need[d]:
                    job_wait(&bc.progress[j], <int>need[d], bc.spin_ns)
                    waited = True
                    break
            if waited:
                break
        if not waited and bc.want_dx and bc.packed_dx and _packing_w_ih(bc):
            job_wait(bc.ih_packed, 1, bc.spin_ns)  # nothing else to do meanwhile


cdef void _backward_worker(BackwardCall *bc, floating *like, int worker) noexcept nogil:
    """One thread's part of a backward call: tasks from the shared list until none is left,
    (units split) the per-step tasks, then the gradients."""
    cdef int k
    cdef const Task *task
    cdef long long start
    while True:
        k = take_next(bc.next_task)
        if k >= bc.n_tasks:
            break
        task = &bc.tasks[k]
        if task.kind == TASK_PACK:
            start = trace_start(&bc.trace)
            _pack_piece_bwd(bc, like, task.d, task.i, <PackedMatrix>task.j)
            event_add(&bc.pack_done[task.d], 1)
            trace_task(&bc.trace, task.kind, task.d, task.i, task.j, worker, start, k)
        else:
            _recurrence_rows_bwd(bc, like, task.d, task.i, worker, k)  # traced per chunk
    if bc.split == SPLIT_UNITS:
        units_worker(bc, like, worker)
    _gradients_worker(bc, like, worker)


cdef void _backward_job_float(void *ctx, int worker, int n_workers) noexcept nogil:
    _backward_worker(<BackwardCall *>ctx, <float *>NULL, worker)


cdef void _backward_job_double(void *ctx, int worker, int n_workers) noexcept nogil:
    _backward_worker(<BackwardCall *>ctx, <double *>NULL, worker)
