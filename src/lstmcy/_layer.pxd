# What one kernel call (one layer, both directions) gets: sizes, the row tables of the
# caller's arrays, the saved activations, workspaces, the schedule and the trace, in one
# struct per call (ForwardCall, BackwardCall), filled by the entry points in
# _lstm_kernels.pxi and read by reference everywhere below them.
#
# Pointers are untyped (char *): a call is float32 or float64 throughout, and the fused
# kernel functions cast them to their type.
from cython cimport floating

from lstmcy._packed_gemm cimport packed_len
from lstmcy._sync cimport lstmcy_event, now_ns, take_next


cdef enum Split:
    # How the recurrence of one direction is split between threads.
    SPLIT_ROWS = 0   # each group of batch rows runs all steps alone (rows never interact)
    SPLIT_UNITS = 1  # each part runs the hidden units of every step; a step waits for
                     # every part of the previous one (for batches too thin for row groups)


cdef enum TaskKind:
    # The tasks of a call, as listed in its task table and named in its trace.
    TASK_PACK = 0          # i: piece, j: the PackedMatrix, of direction d
    TASK_PROJECT = 1       # i: projection piece (a range of steps, both directions)
    TASK_RECURRENCE = 2    # i: row group of direction d (traced per chunk j of its steps)
    # The backward's gradients are not listed: threads take them as they become ready.
    TASK_UNIT_STEP = 3     # i: step in processing order, j: unit part (units split)
    TASK_GATHER = 4        # i: chunk whose [x | h_{t-1}] rows are gathered (backward)
    TASK_WEIGHTS = 5       # i: chunk, j: block of gate rows of dW and db (backward)
    TASK_DX = 6            # i: dx piece (a range of steps, both directions; backward)
    TASK_FINISH = 7        # i: block whose lanes' sums are added up (backward)


cdef enum PackedMatrix:
    # The weight matrix a TASK_PACK task packs (its j).
    PACK_W_HH = 0
    PACK_W_HR = 1          # the projection (projected calls)
    PACK_W_IH = 2          # the forward's fused_input or packed_projection, the backward's packed_dx


cdef struct Task:
    int kind
    int d
    int i
    int j


cdef enum:
    TRACE_FIELDS = 8       # a trace entry: kind, direction, i, j, worker, start (after the
                           # task's waits), end (ns), its place in the task list (-1: none)


cdef struct Trace:
    # Task timings of one call, when benchmarks ask for them (entries NULL otherwise).
    # A task that runs through many steps (a recurrence) has an entry per chunk of them.
    long long *entries     # [capacity, TRACE_FIELDS]
    int capacity
    int *count             # entries written (atomic)


cdef struct Steps:
    # The batch layout shared by every array of a call: at step t the rows b < sizes[t]
    # are active (longest first) and their packed rows are start[t] + b.
    Py_ssize_t T
    Py_ssize_t B
    Py_ssize_t N                    # sum of sizes: rows of the packed workspaces
    const Py_ssize_t *sizes         # [T]
    const Py_ssize_t *start         # [T]


cdef struct RowTable:
    # A caller-layout 2-D array: the row of (t, b) is step_row[t] + b * batch_stride.
    # Time-major, batch-first, packed and padded layouts are all this, without copies.
    char *data
    Py_ssize_t ld                   # elements per row
    Py_ssize_t col                  # first column this call uses (direction d: + d*H)
    const Py_ssize_t *step_row      # [T]
    Py_ssize_t batch_stride


cdef struct Saved:
    # The forward's saved activations of one direction: [T*B, H] each (h: [T*B, P]), row
    # t*B + b.
    char *i
    char *f
    char *g
    char *o
    char *c
    char *tanhc
    char *h


cdef struct ForwardCall:
    Steps steps
    Py_ssize_t D, I, H
    Py_ssize_t P                    # size of h: H, or the projection's (proj_size)
    bint projected                  # h_t = (o * tanh(c_t)) @ w_hr^T
    bint training                   # save the activations (else y only)
    RowTable x                      # layer input [rows, I]
    bint x_rows_packed              # x row n is packed row n (else gathered into x_packed)
    RowTable y                      # layer output, direction d at columns d*P ..
    char *w_ih[2]                   # [4H, I] per direction
    char *w_hh[2]                   # [4H, P]
    char *bias[2]                   # [4H]: b_ih + b_hh
    char *w_hr[2]                   # [P, H] (projected)
    char *h0[2]                     # [B, P]: the initial state (read only)
    char *h_n[2]                    # [B, P]: the final state (written at the end)
    char *c_state[2]                # [B, H]: in c0, out c_n
    Saved saved[2]
    char *gates[2]                  # workspace [N, ldg]: pre-activations (4H of each row)
    Py_ssize_t ldg                  # elements between rows of gates (4H, or padded)
    char *r_rows[2]                 # workspace [N, H]: o * tanh(c_t) (projected)
    char *x_packed                  # workspace [N, I]
    char *w_packed[2]               # workspace: packed w_hh^T, then w_hr^T (projected),
                                    # then w_ih^T (fused_input or packed_projection)
    Py_ssize_t hr_offset            # where w_hr^T starts in w_packed
    Py_ssize_t ih_offset            # where w_ih^T starts in w_packed
    bint fused_input                # x @ w_ih^T in the recurrence's product, not projected
    bint packed_projection          # the projection pieces from w_ih^T packed once (all
                                    # 4H columns in panels, either split), not by BLAS
    # schedule (a function of the shape, but for groups and split: of the thread count)
    Split split
    Py_ssize_t groups               # row groups or unit parts per direction
    Py_ssize_t *row_start           # [groups + 1]: row group g is the rows [row_start[g],
                                    # row_start[g + 1]) (rows split)
    Py_ssize_t piece_steps          # steps per projection piece
    Py_ssize_t n_pieces
    Py_ssize_t pack_pieces          # pieces of each packing task's matrix per direction
    int packs_per_direction         # TASK_PACK tasks per direction (pack_done's full count)
    # the tasks, in the order threads take them, and the synchronisation (per call)
    Task *tasks
    int n_tasks
    int *next_task
    lstmcy_event *piece_done        # [n_pieces]
    lstmcy_event *pack_done         # [2]: pack pieces done per direction
    int *unit_claims                # [D, T, groups] (units split)
    lstmcy_event *step_done         # [2]: unit parts done per direction (units split)
    long long spin_ns
    Trace trace


cdef struct BackwardCall:
    Steps steps
    Py_ssize_t D, I, H
    Py_ssize_t P                    # size of h: H, or the projection's
    bint projected
    RowTable x                      # layer input [rows, I]; dx has the same rows
    bint x_rows_packed
    RowTable dy                     # gradient of the layer output, direction d at d*P ..
    RowTable dx                     # written at active rows when want_dx
    bint want_dx, want_dparams
    char *w_ih[2]                   # [4H, I]
    char *w_hh[2]                   # [4H, P]
    char *w_hr[2]                   # [P, H] (projected)
    char *h0[2]                     # [B, P]
    char *c0[2]                     # [B, H]
    Saved saved[2]
    char *dh_state[2]               # [B, P]: in the gradient of h_n, out that of h0
    char *dc_state[2]               # [B, H]: likewise for c
    char *dw_ih[2]                  # [4H, I] results
    char *dw_hh[2]                  # [4H, P]
    char *dw_hr[2]                  # [P, H] (projected)
    char *db[2]                     # [4H]
    char *dgates[2]                 # workspace [N, ldg]: gate gradients (4H of each row)
    Py_ssize_t ldg                  # elements between rows of dgates (4H, or padded)
    char *dh_rows[2]                # workspace [N, P]: dh_t of every row (projected)
    char *dr_rows[2]                # workspace [N, H]: dh_t @ w_hr (projected)
    char *z[2]                      # workspace [N, z_width]: [x | h_{t-1} (| r_t)] rows,
                                    # or with panel_weights each chunk's [x | h_{t-1}]
                                    # packed (its rows r0..r1 from z + r0 * z_width)
    Py_ssize_t z_width              # I + P, + H when projected; the panels' width
    bint panel_weights              # dW by gemm_tn from z's panels (else OpenBLAS)
    char *dw[2]                     # workspace [lanes, 4H, I + P]: [dW_ih | dW_hh] per lane
    double *db_acc[2]               # workspace [lanes, 4H]: db per lane, in float64
    char *dw_hr_acc[2]              # workspace [lanes, P, H]: dW_hr per lane (projected)
    char *dx_packed                 # workspace [N, I]: dx in packed row order (if not packed)
    char *w_packed[2]               # workspace: packed w_hh, then w_hr (projected), then
                                    # w_ih (packed_dx)
    Py_ssize_t hr_offset            # where w_hr starts in w_packed
    Py_ssize_t ih_offset            # where w_ih starts in w_packed (packed_dx)
    bint packed_dx                  # dx by packed_gemm from w_ih packed once (else OpenBLAS)
    # schedule: chunks of processing steps (the first `first` long, then `chunk`), dW in
    # blocks of `block_rows` gate rows (then dW_hr in blocks of as many of its P rows) and
    # `lanes` lanes of chunks, dx in pieces of `dx_steps` time steps, the recurrence in
    # `groups` row groups (or unit parts) per direction
    Split split
    Py_ssize_t groups
    Py_ssize_t *row_start           # [groups + 1]: row group g is the rows [row_start[g],
                                    # row_start[g + 1]) (rows split)
    Py_ssize_t first, chunk, n_chunks
    Py_ssize_t block_rows, n_blocks  # n_blocks: per direction, dW's and then dW_hr's
    Py_ssize_t n_gate_blocks         # dW's blocks (the others are dW_hr's)
    Py_ssize_t lanes                 # chunks c go to lane c % lanes, each with its own sums
    Py_ssize_t dx_steps, n_dx_pieces
    Py_ssize_t pack_pieces
    # the tasks, in the order threads take them, and the synchronisation (per call)
    Task *tasks
    int n_tasks
    int *next_task
    lstmcy_event *pack_done         # [2]
    lstmcy_event *progress          # [2, groups]: steps done by each row group (unit part)
    int *unit_claims                # [D, T + 1, groups] (units split)
    lstmcy_event *step_done         # [2]: unit parts done per direction (units split)
    lstmcy_event *gathered          # [2, n_chunks]
    int *gather_claims              # [2, n_chunks]
    int *block_next                 # [2, lanes, n_blocks]: chunks each chain has added
    int *block_busy                 # [2, lanes, n_blocks]: whether a thread holds the chain
    int *lanes_done                 # [2, n_blocks]: lanes of each block finished
    int *dx_next                    # how many dx pieces are taken
    int *ih_pack_claim              # whether a thread has taken the packing of w_ih
    lstmcy_event *ih_packed         # set once w_ih is packed (packed_dx)
    const int *dx_order             # [n_dx_pieces]: the pieces in the order they get ready
    long long spin_ns
    Trace trace


cdef inline void unit_range(Py_ssize_t H, Py_ssize_t parts, Py_ssize_t u, Py_ssize_t *u0,
                            Py_ssize_t *u1) noexcept nogil:
    """Units [u0, u1) of part u of a units split: cut at multiples of 16, so that with rows
    on cache lines (H a multiple of 16) no line holds two parts' units."""
    u0[0] = (H * u // parts + 15) // 16 * 16
    u1[0] = (H * (u + 1) // parts + 15) // 16 * 16
    u0[0] = H if u0[0] > H else u0[0]
    u1[0] = H if (u1[0] > H or u == parts - 1) else u1[0]


cdef inline Py_ssize_t units_packed_offset(Py_ssize_t H, Py_ssize_t parts, Py_ssize_t u,
                                           Py_ssize_t copies, Py_ssize_t K,
                                           floating *like) noexcept nogil:
    """Where part u's packed columns start in a units split whose parts each pack
    ``copies`` matrices of their units' columns (K rows) one after another (forward: the
    four gates' columns of w_hh^T; backward: the units' columns of w_hh). Part ``parts``:
    the elements of all of them."""
    cdef Py_ssize_t v, u0, u1
    cdef Py_ssize_t offset = 0
    for v in range(u):
        unit_range(H, parts, v, &u0, &u1)
        offset += copies * packed_len(u1 - u0, K, like)
    return offset


ctypedef fused UnitsCall:
    # The calls whose recurrence may be split by units (see _units.pxi).
    ForwardCall
    BackwardCall


cdef inline void trace_task(const Trace *trace, int kind, Py_ssize_t d, Py_ssize_t i, Py_ssize_t j,
                            int worker, long long start, int order) noexcept nogil:
    """Record a task that ran from ``start`` until now, if this call is traced."""
    cdef int k
    cdef long long *entry
    if trace.entries == NULL:
        return
    k = take_next(trace.count)
    if k >= trace.capacity:
        return
    entry = trace.entries + k * TRACE_FIELDS
    entry[0] = kind
    entry[1] = d
    entry[2] = i
    entry[3] = j
    entry[4] = worker
    entry[5] = start
    entry[6] = now_ns()
    entry[7] = order


cdef inline long long trace_start(const Trace *trace) noexcept nogil:
    """The start time of a task, if this call is traced."""
    return now_ns() if trace.entries != NULL else 0


cdef inline floating *row_of(floating *base, const RowTable *table, Py_ssize_t t,
                             Py_ssize_t b) noexcept nogil:
    """Row ``(t, b)`` of ``table``, whose data is ``base``, from its first column."""
    return base + (table.step_row[t] + b * table.batch_stride) * table.ld + table.col
