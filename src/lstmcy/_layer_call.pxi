# The entry points: one object per kind of layer call (ForwardLayer, BackwardLayer).
#
# Design
# ------
# What a layer call derives from its sizes, its schedule and its thread count is set once,
# when the object is built (LSTMPlan builds one per kind of call and thread count): the
# call struct's sizes and schedule, its work buffers, its task list, the order of its dx
# pieces and its synchronisation arrays, each a named field of the object. ``run`` then
# binds the few arrays that change from call to call (the layer's input and output, its
# weights, states and saved activations, the batch layout), zeroes the synchronisation
# and runs the job. The object owns what it allocates and frees it in ``__dealloc__``; it
# holds the work buffers it points into, so they outlive every call that uses them.
#
# The checks stay here as a second line behind the Python layer's: a wrong shape is a
# ValueError, never a read or write outside an array.


cdef struct ForwardSync:
    # A forward call's counters and events that are not arrays (zeroed before each call).
    # Allocated apart from the call struct, which every thread reads throughout the call:
    # threads write these, and on the struct's cache lines they would evict its fields.
    lstmcy_event next_task
    lstmcy_event pack_done[2]
    lstmcy_event step_done[2]
    int trace_count


cdef struct BackwardSync:
    # As ForwardSync, for a backward call.
    lstmcy_event next_task
    lstmcy_event pack_done[2]
    lstmcy_event step_done[2]
    lstmcy_event ih_packed
    int dx_next
    int ih_pack_claim
    int trace_count


cdef class ForwardLayer:
    """The forward of one kind of layer call (one layer, both directions).

    Parameters
    ----------
    sizes : tuple of int
        ``(T, B, N, D, I, H, P)``: steps, batch rows, packed rows (the sum of the batch
        sizes), directions, input features, hidden units and the size of h (``P < H``
        with a projection, else ``H``).
    training : bool
        Save the activations (else y only).
    x_rows_packed : bool
        Row ``n`` of the layer input is packed row ``n`` (read in place, else gathered
        into ``x_packed``).
    schedule : ForwardSchedule
        ``split`` (0 rows, 1 units), ``groups`` (row groups or unit parts per
        direction), ``piece_steps`` (steps per projection piece), ``pack_pieces``,
        ``fused_input``, ``packed_projection``.
    workspace : tuple of ndarray
        ``(gates [D, N, ldg], r_rows [D, N, H], x_packed [N, I], w_packed)``: the gates,
        4H of each row of ``ldg >= 4H``; with a projection o * tanh(c) of every row (else
        ``[D, 0, H]``); the gathered input rows (``[0, I]`` when ``x_rows_packed``); the
        packed weights, ``D * forward_packed_len(...)`` elements. All of one dtype,
        float32 or float64, which is the call's.
    n_threads : int
        Threads to run on (at most; the pool may give fewer when others use it).

    Attributes
    ----------
    schedule, n_threads, workspace
        As given.
    n_workers : int
        The threads that ran the last call.
    running : bool
        Whether a call is running: a second one meanwhile (from another thread) raises
        RuntimeError.
    """
    cdef ForwardCall fc
    cdef readonly object schedule
    cdef readonly int n_threads
    cdef readonly int n_workers
    cdef readonly tuple workspace
    cdef readonly bint running       # a call is running (see run)
    cdef bint is_double
    cdef bint empty                  # no steps, rows or packed rows: a call does nothing
    # owned: the task list and the synchronisation, zeroed before each call
    cdef Task *tasks
    cdef Py_ssize_t *row_start       # [groups + 1]
    cdef lstmcy_event *piece_done    # [n_pieces]
    cdef int *unit_claims            # [n_unit_claims]: D * T * groups (units split)
    cdef Py_ssize_t n_unit_claims
    cdef ForwardSync *sync

    def __init__(self, tuple sizes, bint training, bint x_rows_packed, schedule,
                 tuple workspace, int n_threads):
        _need(self.row_start == NULL and self.schedule is None, "a ForwardLayer is set up once")
        _need(len(sizes) == 7 and len(workspace) == 4,
              "sizes must be (T, B, N, D, I, H, P), workspace (gates, r_rows, x_packed, w_packed)")
        _need(n_threads >= 1, "n_threads must be at least 1")
        self.schedule = schedule
        self.n_threads = n_threads
        self.workspace = workspace
        self.is_double = workspace[0].dtype == np.float64
        gates, r_rows, x_packed, w_packed = workspace
        if self.is_double:
            _forward_setup[double](self, sizes, training, x_rows_packed, gates, r_rows,
                                   x_packed, w_packed)
        else:
            _forward_setup[float](self, sizes, training, x_rows_packed, gates, r_rows,
                                  x_packed, w_packed)

    def __dealloc__(self):
        free(self.tasks)
        free(self.row_start)
        free(self.piece_done)
        free(self.unit_claims)
        free(self.sync)

    def run(self, tuple x, tuple y, tuple weights, tuple states, tuple saved, tuple steps,
            bint flush_denormals=True, trace=None):
        """Run one call on these arrays.

        Parameters
        ----------
        x : tuple
            ``(rows [rows, I], step_row [T] of intp, batch_stride)``: the layer input as
            a row table (the row of ``(t, b)`` is ``step_row[t] + b * batch_stride``).
        y : tuple
            The output ``[rows, D*P]`` as a row table; direction ``d`` writes columns
            ``d*P .. (d+1)*P``.
        weights : tuple of ndarray
            ``(w_ih [D, 4H, I], w_hh [D, 4H, P], bias [D, 4H], w_hr [D, P, H])``: bias is
            ``b_ih + b_hh`` (zeros without bias), w_hr ``[D, 0, H]`` without a projection.
        states : tuple of ndarray
            ``(h0 [D, B, P], h_n [D, B, P], c_state [D, B, H])``: the initial h; out, the
            final h (untouched when there are no steps); in c0, out c_n.
        saved : tuple of 7 ndarray [D, T*B, H] (h: [D, T*B, P])
            The activations in ``SAVED_ORDER``, written when training (else
            ``[D, 0, .]``).
        steps : tuple of ndarray
            ``(batch_sizes [T], packed_start [T])`` of intp: active rows per step
            (longest first) and the first packed row of each step.
        flush_denormals : bool
            Run with subnormal numbers flushed to zero (the caller's mode is restored).
        trace : ndarray [capacity, TRACE_FIELDS] of int64, optional
            Receives an entry per task (kind, direction, i, j, worker, start, end,
            place in the task list).

        Returns
        -------
        n_trace : int
            The trace entries written.
        """
        cdef int n_trace
        _need(len(x) == 3 and len(y) == 3 and len(weights) == 4 and len(states) == 3
              and len(steps) == 2, "x and y must be (rows, step_row, batch_stride), weights "
              "(w_ih, w_hh, bias, w_hr), states (h0, h_n, c_state), steps (batch_sizes, "
              "packed_start)")
        if self.running:
            raise RuntimeError("this ForwardLayer is already running a call (in another thread): "
                               "a kernel object serves one call at a time")
        self.running = True  # checked and set under the GIL, with nothing between
        try:
            x_rows, x_step_row, x_stride = x
            y_rows, y_step_row, y_stride = y
            w_ih, w_hh, bias, w_hr = weights
            h0, h_n, c_state = states
            batch_sizes, packed_start = steps
            if self.is_double:
                n_trace = _forward_run[double](
                    self, x_rows, x_step_row, x_stride, y_rows, y_step_row, y_stride, w_ih,
                    w_hh, bias, w_hr, h0, h_n, c_state, saved, batch_sizes, packed_start,
                    flush_denormals, trace)
            else:
                n_trace = _forward_run[float](
                    self, x_rows, x_step_row, x_stride, y_rows, y_step_row, y_stride, w_ih,
                    w_hh, bias, w_hr, h0, h_n, c_state, saved, batch_sizes, packed_start,
                    flush_denormals, trace)
        finally:
            self.running = False
        return n_trace


cdef int _forward_setup(ForwardLayer layer, tuple sizes, bint training, bint x_rows_packed,
                        floating[:, :, ::1] gates, floating[:, :, ::1] r_rows,
                        floating[:, ::1] x_packed, floating[::1] w_packed) except -1:
    """Fill ``layer``'s call struct with what its sizes and schedule decide, and build its
    task list and synchronisation."""
    cdef ForwardCall *fc = &layer.fc
    cdef Py_ssize_t T, B, N, D, I, H, P
    T, B, N, D, I, H, P = sizes
    schedule = layer.schedule
    cdef bint projected = P != H
    cdef int split = schedule.split
    cdef Py_ssize_t groups = schedule.groups
    cdef Py_ssize_t piece_steps = schedule.piece_steps
    cdef Py_ssize_t pack_pieces = schedule.pack_pieces
    cdef bint fused_input = schedule.fused_input
    cdef bint packed_projection = schedule.packed_projection
    cdef bint packs[3]  # which matrices TASK_PACK packs (PackedMatrix order)
    cdef Py_ssize_t n_pieces, plen, n_tasks, n_matrices, d, j, g, q, which
    _need(T >= 0 and B >= 0 and N >= 0 and I >= 0 and H >= 0 and 1 <= D <= 2
          and 0 <= P <= H and N <= T * B, "sizes must be (T, B, N, D, I, H, P), D 1 or 2, "
          "N <= T*B and P <= H")
    if not (groups >= 1 and piece_steps >= 1 and pack_pieces >= 1
            and (split == SPLIT_ROWS or (split == SPLIT_UNITS and not projected))
            and not (fused_input and packed_projection)):
        raise ValueError(f"bad schedule {schedule!r}")  # formatted only when raised
    _need(_dims(&gates.shape[0], D, N, -1) and gates.shape[2] >= 4 * H,
          "gates must be [D, N, ldg], ldg >= 4H")
    _need(not projected or _dims(&r_rows.shape[0], D, N, H), "r_rows must be [D, N, H]")
    _need(x_rows_packed or (x_packed.shape[0] >= N and x_packed.shape[1] == I),
          "x_packed must be [N, I]")
    plen = forward_packed_len(H, P, I, projected, split, groups, fused_input,
                              floating is double, packed_projection)
    _need(w_packed.shape[0] >= D * plen, "w_packed is too small")
    n_pieces = _count(T, piece_steps)

    memset(fc, 0, sizeof(ForwardCall))
    fc.steps.T = T
    fc.steps.B = B
    fc.steps.N = N
    fc.D = D
    fc.I = I
    fc.H = H
    fc.P = P
    fc.projected = projected
    fc.training = training
    fc.x_rows_packed = x_rows_packed
    fc.hr_offset = packed_len(4 * H, P, <floating *>NULL)
    fc.ih_offset = _forward_ih_offset(H, P, projected, split, groups, floating is double)
    fc.fused_input = fused_input
    fc.packed_projection = packed_projection
    for d in range(D):
        fc.gates[d] = _data3(gates, d)
        fc.r_rows[d] = _data3(r_rows, d) if projected else NULL
        fc.w_packed[d] = <char *>&w_packed[d * plen] if plen > 0 else NULL
    fc.x_packed = _data2(x_packed) if not x_rows_packed else NULL
    fc.ldg = gates.shape[2]
    fc.split = <Split>split
    fc.groups = groups
    fc.piece_steps = piece_steps
    fc.n_pieces = n_pieces
    fc.pack_pieces = pack_pieces
    fc.spin_ns = wait_spin_ns(layer.n_threads)
    layer.empty = T == 0 or B == 0 or N == 0
    if layer.empty:
        return 0

    # The task list: packing (w_hh^T and w_hr^T with the rows split, whose unit parts
    # pack their own columns; w_ih^T for fused_input with the rows split, or for
    # packed_projection), the projection pieces in the order the recurrences use them
    # (two directions: from both ends), the row groups.
    packs[<int>PACK_W_HH] = split == SPLIT_ROWS and H > 0
    packs[<int>PACK_W_HR] = split == SPLIT_ROWS and H > 0 and projected
    packs[<int>PACK_W_IH] = H > 0 and I > 0 and (
        (split == SPLIT_ROWS and fused_input) or packed_projection)
    n_matrices = packs[0] + packs[1] + packs[2]
    fc.packs_per_direction = <int>(pack_pieces * n_matrices)
    n_tasks = D * pack_pieces * n_matrices + n_pieces + D * groups
    layer.n_unit_claims = D * T * groups if split == SPLIT_UNITS else 0
    layer.tasks = <Task *>calloc(n_tasks, sizeof(Task))
    layer.row_start = <Py_ssize_t *>calloc(groups + 1, sizeof(Py_ssize_t))
    layer.piece_done = <lstmcy_event *>calloc(max(n_pieces, 1), sizeof(lstmcy_event))
    layer.unit_claims = <int *>calloc(max(layer.n_unit_claims, 1), sizeof(int))
    layer.sync = <ForwardSync *>calloc(1, sizeof(ForwardSync))
    if (layer.tasks == NULL or layer.row_start == NULL or layer.piece_done == NULL
            or layer.unit_claims == NULL or layer.sync == NULL):
        raise MemoryError()  # __dealloc__ frees what was allocated
    n_tasks = 0
    for d in range(D):
        for which in range(3):
            if packs[which]:
                for q in range(pack_pieces):
                    _add_task(layer.tasks, &n_tasks, TASK_PACK, d, q, which)
    for j in range(n_pieces):
        q = j if D == 1 else (j // 2 if j % 2 == 0 else n_pieces - 1 - j // 2)
        _add_task(layer.tasks, &n_tasks, TASK_PROJECT, 0, q, 0)
    if split == SPLIT_ROWS:
        for g in range(groups):
            for d in range(D):
                _add_task(layer.tasks, &n_tasks, TASK_RECURRENCE, d, g, 0)
    fc.tasks = layer.tasks
    fc.n_tasks = <int>n_tasks
    fc.row_start = layer.row_start
    fc.piece_done = layer.piece_done
    fc.unit_claims = layer.unit_claims
    fc.next_task = &layer.sync.next_task.value
    fc.pack_done = layer.sync.pack_done
    fc.step_done = layer.sync.step_done
    return 0


cdef int _forward_run(ForwardLayer layer,
                      const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row,
                      Py_ssize_t x_batch_stride,
                      floating[:, ::1] y, const Py_ssize_t[::1] y_step_row,
                      Py_ssize_t y_batch_stride,
                      const floating[:, :, ::1] w_ih, const floating[:, :, ::1] w_hh,
                      const floating[:, ::1] bias, const floating[:, :, ::1] w_hr,
                      const floating[:, :, ::1] h0, floating[:, :, ::1] h_n,
                      floating[:, :, ::1] c_state, tuple saved,
                      const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
                      bint flush_denormals, trace) except -1:
    """:meth:`ForwardLayer.run` in the call's dtype: check the arrays, bind them, run."""
    cdef ForwardCall *fc = &layer.fc
    cdef Py_ssize_t T = fc.steps.T, B = fc.steps.B, N = fc.steps.N
    cdef Py_ssize_t D = fc.D, I = fc.I, H = fc.H, P = fc.P
    cdef Py_ssize_t d
    cdef bint projected = fc.projected
    cdef int n_trace = 0
    _need(_dims(&w_ih.shape[0], D, 4 * H, I) and _dims(&w_hh.shape[0], D, 4 * H, P)
          and _dims(&bias.shape[0], D, 4 * H, -1)
          and _dims(&w_hr.shape[0], D, P if projected else 0, H),
          "weights must be [D, 4H, I], [D, 4H, P], bias [D, 4H], w_hr [D, P, H] or [D, 0, H]")
    _need(x.shape[1] == I and y.shape[1] >= D * P, "x must be [rows, I] and y [rows, D*P]")
    _need(_dims(&h0.shape[0], D, B, P) and _dims(&h_n.shape[0], D, B, P)
          and _dims(&c_state.shape[0], D, B, H),
          "h0 and h_n must be [D, B, P], c_state [D, B, H]")
    _need(batch_sizes.shape[0] == T and packed_start.shape[0] == T
          and x_step_row.shape[0] == T and y_step_row.shape[0] == T,
          "batch_sizes, packed_start and the step rows must have T entries")
    _need(N == (packed_start[T - 1] + batch_sizes[T - 1] if T > 0 else 0),
          "batch_sizes must add up to the call's N packed rows")
    _check_row_tables(batch_sizes, packed_start, B, N, x_step_row, x_batch_stride, x.shape[0],
                      fc.x_rows_packed, y_step_row, y_batch_stride, y.shape[0], "y")
    if fc.training:
        _set_saved(fc.saved, saved, D, T * B, H, P, <floating *>NULL)
    if layer.empty:
        layer.n_workers = 1
        return 0

    fc.steps.sizes = &batch_sizes[0]
    fc.steps.start = &packed_start[0]
    _rows(&fc.x, x, x_step_row, x_batch_stride)
    _rows(&fc.y, y, y_step_row, y_batch_stride)
    for d in range(D):
        fc.w_ih[d] = _data3(w_ih, d)
        fc.w_hh[d] = _data3(w_hh, d)
        fc.bias[d] = <char *>&bias[d, 0] if H > 0 else NULL
        fc.w_hr[d] = _data3(w_hr, d) if projected else NULL
        fc.h0[d] = _data3(h0, d)
        fc.h_n[d] = _data3(h_n, d)
        fc.c_state[d] = _data3(c_state, d)
    _row_blocks(fc.steps.sizes, T, B, fc.groups, layer.row_start)
    memset(layer.sync, 0, sizeof(ForwardSync))
    memset(layer.piece_done, 0, max(fc.n_pieces, 1) * sizeof(lstmcy_event))
    memset(layer.unit_claims, 0, max(layer.n_unit_claims, 1) * sizeof(int))
    fc.trace = _trace_of(trace, &layer.sync.trace_count)
    with nogil:
        layer.n_workers = run_job(layer.n_threads,
                                  _forward_job_float if floating is float else _forward_job_double,
                                  <void *>fc, flush_denormals)
    n_trace = min(layer.sync.trace_count, fc.trace.capacity)
    fc.trace.entries = NULL  # the trace array is the caller's: not kept past the call
    return n_trace


cdef class BackwardLayer:
    """The backward of one kind of layer call (one layer, both directions).

    Parameters
    ----------
    sizes : tuple of int
        ``(T, B, N, D, I, H, P)``, as for :class:`ForwardLayer`.
    want_dx, want_dparams : bool
        Compute the input gradient (written at active rows) and the parameter gradients.
    x_rows_packed : bool
        Row ``n`` of the layer input (and of dx) is packed row ``n``.
    schedule : BackwardSchedule
        ``split`` (0 rows, 1 units: not with a projection), ``groups`` (row groups or
        unit parts per direction), ``first`` and ``chunk`` (steps of the first chunk and
        of the others), ``block_rows`` (gate rows per block of dW, and rows of the
        projection's per block of dW_hr), ``lanes`` (chunk c adds to lane
        ``c % lanes``'s sums), ``dx_steps`` (steps per dx piece), ``pack_pieces``,
        ``panel_weights`` (dW from packed panels of ``[x | h_{t-1}]``), ``packed_dx``
        (dx by the packed product from w_ih packed once).
    workspace : tuple of ndarray
        ``(dgates [D, N, ldg], dh_rows [D, N, P], dr_rows [D, N, H], z [D, N, Z],
        dw [D, lanes*4H, I + P], db_acc [D, lanes*4H] of float64,
        dw_hr_acc [D, lanes*P, H], dx_packed [N, I], w_packed)``: the gate gradients (4H
        of each row of ``ldg >= 4H``); with a projection dh_t of every row and dh_t @ w_hr
        (else ``[D, 0, .]``); ``[x | h_{t-1} (| o * tanh(c_t))]`` in packed row order
        (``Z = I + P (+ H)``) or, with ``panel_weights``, in packed panels; the lanes'
        sums of ``[dW_ih | dW_hh]``, db and dW_hr (when ``want_dparams``); dx in packed
        row order (``want_dx`` and not ``x_rows_packed``); the packed weights,
        ``D * backward_packed_len(...)`` elements.
    n_threads : int

    Attributes
    ----------
    schedule, n_threads, workspace, n_workers, running
        As for :class:`ForwardLayer`.
    """
    cdef BackwardCall bc
    cdef readonly object schedule
    cdef readonly int n_threads
    cdef readonly int n_workers
    cdef readonly tuple workspace
    cdef readonly bint running
    cdef bint is_double
    cdef bint empty
    cdef Py_ssize_t n_dx_pieces      # the call's dx pieces (bc.n_dx_pieces is 0 without dx)
    # owned: the task list, the dx pieces' order and the synchronisation (zeroed per call)
    cdef Task *tasks
    cdef Py_ssize_t *row_start       # [groups + 1]
    cdef int *dx_order               # [n_dx_pieces]
    cdef lstmcy_event *progress      # [D, groups]
    cdef lstmcy_event *gathered      # [D, n_chunks]
    cdef int *gather_claims          # [D, n_chunks]
    cdef int *block_next             # [D, lanes, n_blocks]
    cdef int *block_busy             # [D, lanes, n_blocks]
    cdef int *lanes_done             # [D, n_blocks]
    cdef int *unit_claims            # [D, T + 1, groups] (units split)
    cdef Py_ssize_t n_gathers, n_chains, n_lane_blocks, n_unit_claims, n_progress
    cdef BackwardSync *sync

    def __init__(self, tuple sizes, bint want_dx, bint want_dparams, bint x_rows_packed,
                 schedule, tuple workspace, int n_threads):
        _need(self.row_start == NULL and self.schedule is None, "a BackwardLayer is set up once")
        _need(len(sizes) == 7 and len(workspace) == 9,
              "sizes must be (T, B, N, D, I, H, P), workspace (dgates, dh_rows, dr_rows, z, "
              "dw, db_acc, dw_hr_acc, dx_packed, w_packed)")
        _need(n_threads >= 1, "n_threads must be at least 1")
        self.schedule = schedule
        self.n_threads = n_threads
        self.workspace = workspace
        self.is_double = workspace[0].dtype == np.float64
        dgates, dh_rows, dr_rows, z, dw, db_acc, dw_hr_acc, dx_packed, w_packed = workspace
        if self.is_double:
            _backward_setup[double](self, sizes, want_dx, want_dparams, x_rows_packed, dgates,
                                    dh_rows, dr_rows, z, dw, db_acc, dw_hr_acc, dx_packed,
                                    w_packed)
        else:
            _backward_setup[float](self, sizes, want_dx, want_dparams, x_rows_packed, dgates,
                                   dh_rows, dr_rows, z, dw, db_acc, dw_hr_acc, dx_packed,
                                   w_packed)

    def __dealloc__(self):
        free(self.tasks)
        free(self.row_start)
        free(self.dx_order)
        free(self.progress)
        free(self.gathered)
        free(self.gather_claims)
        free(self.block_next)
        free(self.block_busy)
        free(self.lanes_done)
        free(self.unit_claims)
        free(self.sync)

    def run(self, tuple x, tuple dy, dx, tuple weights, tuple states, tuple saved,
            tuple grads, tuple steps, bint flush_denormals=True, trace=None):
        """Run one call on these arrays.

        Parameters
        ----------
        x : tuple
            ``(rows [rows, I], step_row [T] of intp, batch_stride)``: the layer input as a
            row table; ``dx`` has the same rows.
        dy : tuple
            The gradient of the layer output ``[rows, D*P]`` as a row table (direction
            ``d`` reads columns ``d*P .. (d+1)*P``).
        dx : ndarray [rows, I]
            The input gradient, written at active rows when ``want_dx`` (padded rows
            untouched; ``[0, I]`` otherwise).
        weights : tuple of ndarray
            ``(w_ih [D, 4H, I], w_hh [D, 4H, P], w_hr [D, P, H])``, w_hr ``[D, 0, H]``
            without a projection.
        states : tuple of ndarray
            ``(h0 [D, B, P], c0 [D, B, H], dh_state [D, B, P], dc_state [D, B, H])``: the
            forward's initial states; in, the gradients of h_n and c_n, out those of h0
            and c0.
        saved : tuple of 7 ndarray [D, T*B, H] (h: [D, T*B, P])
            The forward's activations, in ``SAVED_ORDER``.
        grads : tuple of ndarray
            ``(dw_ih [D, 4H, I], dw_hh [D, 4H, P], db [D, 4H], dw_hr [D, P, H])``, written
            when ``want_dparams`` (else ``[D, 0, .]``; dw_hr ``[D, 0, H]`` without a
            projection).
        steps : tuple of ndarray
            ``(batch_sizes [T], packed_start [T])`` of intp.
        flush_denormals, trace
            As for :meth:`ForwardLayer.run`.

        Returns
        -------
        n_trace : int
        """
        cdef int n_trace
        _need(len(x) == 3 and len(dy) == 3 and len(weights) == 3 and len(states) == 4
              and len(grads) == 4 and len(steps) == 2,
              "x and dy must be (rows, step_row, batch_stride), weights (w_ih, w_hh, w_hr), "
              "states (h0, c0, dh_state, dc_state), grads (dw_ih, dw_hh, db, dw_hr), steps "
              "(batch_sizes, packed_start)")
        if self.running:
            raise RuntimeError("this BackwardLayer is already running a call (in another thread): "
                               "a kernel object serves one call at a time")
        self.running = True  # checked and set under the GIL, with nothing between
        try:
            x_rows, x_step_row, x_stride = x
            dy_rows, dy_step_row, dy_stride = dy
            w_ih, w_hh, w_hr = weights
            h0, c0, dh_state, dc_state = states
            dw_ih, dw_hh, db, dw_hr = grads
            batch_sizes, packed_start = steps
            if self.is_double:
                n_trace = _backward_run[double](
                    self, x_rows, x_step_row, x_stride, dy_rows, dy_step_row, dy_stride, dx,
                    w_ih, w_hh, w_hr, h0, c0, dh_state, dc_state, saved, dw_ih, dw_hh, db,
                    dw_hr, batch_sizes, packed_start, flush_denormals, trace)
            else:
                n_trace = _backward_run[float](
                    self, x_rows, x_step_row, x_stride, dy_rows, dy_step_row, dy_stride, dx,
                    w_ih, w_hh, w_hr, h0, c0, dh_state, dc_state, saved, dw_ih, dw_hh, db,
                    dw_hr, batch_sizes, packed_start, flush_denormals, trace)
        finally:
            self.running = False
        return n_trace


cdef int _backward_setup(BackwardLayer layer, tuple sizes, bint want_dx, bint want_dparams,
                         bint x_rows_packed, floating[:, :, ::1] dgates,
                         floating[:, :, ::1] dh_rows, floating[:, :, ::1] dr_rows,
                         floating[:, :, ::1] z, floating[:, :, ::1] dw,
                         double[:, ::1] db_acc, floating[:, :, ::1] dw_hr_acc,
                         floating[:, ::1] dx_packed, floating[::1] w_packed) except -1:
    """Fill ``layer``'s call struct with what its sizes and schedule decide, and build its
    task list, the order of its dx pieces and its synchronisation."""
    cdef BackwardCall *bc = &layer.bc
    cdef Py_ssize_t T, B, N, D, I, H, P
    T, B, N, D, I, H, P = sizes
    schedule = layer.schedule
    cdef bint projected = P != H
    cdef Py_ssize_t G4 = 4 * H
    cdef Py_ssize_t Z = I + P + (H if projected else 0)
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
    cdef Py_ssize_t n_chunks, n_blocks, n_tasks, d, g, q, plen, which
    _need(T >= 0 and B >= 0 and N >= 0 and I >= 0 and H >= 0 and 1 <= D <= 2
          and 0 <= P <= H and N <= T * B, "sizes must be (T, B, N, D, I, H, P), D 1 or 2, "
          "N <= T*B and P <= H")
    if not (groups >= 1 and first >= 1 and chunk >= 1 and block_rows >= 1 and lanes >= 1
            and dx_steps >= 1 and pack_pieces >= 1
            and (split == SPLIT_ROWS or (split == SPLIT_UNITS and not projected))
            and not (panel_weights and projected)):
        raise ValueError(f"bad schedule {schedule!r}")  # formatted only when raised
    if panel_weights:  # each chunk's rows as packed panels of I + P columns
        Z = packed_len(I + P, 1, <floating *>NULL)
    _need(_dims(&dgates.shape[0], D, N, -1) and dgates.shape[2] >= G4,
          "dgates must be [D, N, ldg], ldg >= 4H")
    _need(not want_dx or x_rows_packed or (dx_packed.shape[0] >= N and dx_packed.shape[1] == I),
          "dx_packed must be [N, I]")
    _need(not want_dparams or (_dims(&z.shape[0], D, N, Z)
                               and _dims(&dw.shape[0], D, lanes * G4, I + P)
                               and _dims(&db_acc.shape[0], D, lanes * G4, -1)
                               and _dims(&dw_hr_acc.shape[0], D,
                                         lanes * P if projected else 0, H)),
          "z must be [D, N, I + P (+ H), or the panels' width]; dw, db_acc, dw_hr_acc "
          "[D, lanes*4H, I + P], [D, lanes*4H], [D, lanes*P, H]")
    _need(not projected or (_dims(&dh_rows.shape[0], D, N, P)
                            and _dims(&dr_rows.shape[0], D, N, H)),
          "dh_rows and dr_rows must be [D, N, P] and [D, N, H]")
    plen = backward_packed_len(H, P, I, projected, split, groups, packed_dx, floating is double)
    _need(w_packed.shape[0] >= D * plen, "w_packed is too small")
    n_chunks = 0 if T == 0 else (1 if T <= first else 1 + _count(T - first, chunk))

    memset(bc, 0, sizeof(BackwardCall))
    bc.steps.T = T
    bc.steps.B = B
    bc.steps.N = N
    bc.D = D
    bc.I = I
    bc.H = H
    bc.P = P
    bc.projected = projected
    bc.x_rows_packed = x_rows_packed
    bc.want_dx = want_dx
    bc.want_dparams = want_dparams
    bc.z_width = Z
    bc.panel_weights = panel_weights
    bc.hr_offset = packed_len(P, G4, <floating *>NULL)
    bc.ih_offset = _backward_ih_offset(H, P, projected, split, groups, floating is double)
    bc.ldg = dgates.shape[2]
    bc.packed_dx = packed_dx
    for d in range(D):
        bc.dgates[d] = _data3(dgates, d)
        bc.w_packed[d] = <char *>&w_packed[d * plen] if plen > 0 else NULL
        if projected:
            bc.dh_rows[d] = _data3(dh_rows, d)
            bc.dr_rows[d] = _data3(dr_rows, d)
        if want_dparams and G4 > 0:
            bc.db_acc[d] = &db_acc[d, 0]
            bc.z[d] = _data3(z, d)
            bc.dw[d] = _data3(dw, d)
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
    layer.n_dx_pieces = bc.n_dx_pieces = _count(T, dx_steps)
    bc.pack_pieces = pack_pieces
    bc.spin_ns = wait_spin_ns(layer.n_threads)
    layer.empty = T == 0 or B == 0
    if layer.empty:
        return 0

    n_tasks = D * pack_pieces * (2 if projected else 1) + D * groups
    layer.n_progress = D * groups
    layer.n_gathers = D * n_chunks
    layer.n_chains = D * lanes * n_blocks
    layer.n_lane_blocks = D * n_blocks
    layer.n_unit_claims = D * (T + 1) * groups if split == SPLIT_UNITS else 0
    layer.tasks = <Task *>calloc(n_tasks, sizeof(Task))
    layer.row_start = <Py_ssize_t *>calloc(groups + 1, sizeof(Py_ssize_t))
    layer.dx_order = <int *>calloc(max(layer.n_dx_pieces, 1), sizeof(int))
    layer.progress = <lstmcy_event *>calloc(layer.n_progress, sizeof(lstmcy_event))
    layer.gathered = <lstmcy_event *>calloc(max(layer.n_gathers, 1), sizeof(lstmcy_event))
    layer.gather_claims = <int *>calloc(max(layer.n_gathers, 1), sizeof(int))
    layer.block_next = <int *>calloc(max(layer.n_chains, 1), sizeof(int))
    layer.block_busy = <int *>calloc(max(layer.n_chains, 1), sizeof(int))
    layer.lanes_done = <int *>calloc(max(layer.n_lane_blocks, 1), sizeof(int))
    layer.unit_claims = <int *>calloc(max(layer.n_unit_claims, 1), sizeof(int))
    layer.sync = <BackwardSync *>calloc(1, sizeof(BackwardSync))
    if (layer.tasks == NULL or layer.row_start == NULL or layer.dx_order == NULL
            or layer.progress == NULL or layer.gathered == NULL or layer.gather_claims == NULL
            or layer.block_next == NULL or layer.block_busy == NULL
            or layer.lanes_done == NULL or layer.unit_claims == NULL or layer.sync == NULL):
        raise MemoryError()  # __dealloc__ frees what was allocated
    _order_dx_pieces(bc, layer.dx_order)
    if not want_dx:
        bc.n_dx_pieces = 0

    # The task list (see _backward.pxi): packing and the row groups' recurrences (rows
    # split; with the units split the threads take the steps' parts after the list); the
    # gradients follow as the recurrences make them ready.
    n_tasks = 0
    if split == SPLIT_ROWS:
        if H > 0:
            for d in range(D):
                for which in range(2 if projected else 1):  # PACK_W_HH, and PACK_W_HR
                    for q in range(pack_pieces):
                        _add_task(layer.tasks, &n_tasks, TASK_PACK, d, q, which)
        for g in range(groups):
            for d in range(D):
                _add_task(layer.tasks, &n_tasks, TASK_RECURRENCE, d, g, 0)
    bc.tasks = layer.tasks
    bc.n_tasks = <int>n_tasks
    bc.row_start = layer.row_start
    bc.next_task = &layer.sync.next_task.value
    bc.pack_done = layer.sync.pack_done
    bc.step_done = layer.sync.step_done
    bc.progress = layer.progress
    bc.gathered = layer.gathered
    bc.ih_packed = &layer.sync.ih_packed
    bc.gather_claims = layer.gather_claims
    bc.block_next = layer.block_next
    bc.block_busy = layer.block_busy
    bc.lanes_done = layer.lanes_done
    bc.dx_next = &layer.sync.dx_next
    bc.unit_claims = layer.unit_claims
    bc.ih_pack_claim = &layer.sync.ih_pack_claim
    return 0


cdef void _zero_backward_sync(BackwardLayer layer) noexcept:
    """Zero ``layer``'s synchronisation (counters, events, claims) before a call."""
    memset(layer.sync, 0, sizeof(BackwardSync))
    memset(layer.progress, 0, layer.n_progress * sizeof(lstmcy_event))
    memset(layer.gathered, 0, max(layer.n_gathers, 1) * sizeof(lstmcy_event))
    memset(layer.gather_claims, 0, max(layer.n_gathers, 1) * sizeof(int))
    memset(layer.block_next, 0, max(layer.n_chains, 1) * sizeof(int))
    memset(layer.block_busy, 0, max(layer.n_chains, 1) * sizeof(int))
    memset(layer.lanes_done, 0, max(layer.n_lane_blocks, 1) * sizeof(int))
    memset(layer.unit_claims, 0, max(layer.n_unit_claims, 1) * sizeof(int))


cdef int _backward_run(BackwardLayer layer,
                       const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row,
                       Py_ssize_t x_batch_stride,
                       const floating[:, ::1] dy, const Py_ssize_t[::1] dy_step_row,
                       Py_ssize_t dy_batch_stride, floating[:, ::1] dx,
                       const floating[:, :, ::1] w_ih, const floating[:, :, ::1] w_hh,
                       const floating[:, :, ::1] w_hr,
                       const floating[:, :, ::1] h0, const floating[:, :, ::1] c0,
                       floating[:, :, ::1] dh_state, floating[:, :, ::1] dc_state, tuple saved,
                       floating[:, :, ::1] dw_ih, floating[:, :, ::1] dw_hh, floating[:, ::1] db,
                       floating[:, :, ::1] dw_hr,
                       const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start,
                       bint flush_denormals, trace) except -1:
    """:meth:`BackwardLayer.run` in the call's dtype: check the arrays, bind them, run."""
    cdef BackwardCall *bc = &layer.bc
    cdef Py_ssize_t T = bc.steps.T, B = bc.steps.B, N = bc.steps.N
    cdef Py_ssize_t D = bc.D, I = bc.I, H = bc.H, P = bc.P, G4 = 4 * bc.H
    cdef Py_ssize_t hr = P if bc.projected else 0
    cdef Py_ssize_t d
    cdef bint want_dparams = bc.want_dparams
    cdef int n_trace = 0
    _need(_dims(&w_ih.shape[0], D, G4, I) and _dims(&w_hh.shape[0], D, G4, P)
          and _dims(&w_hr.shape[0], D, hr, H),
          "weights must be [D, 4H, I], [D, 4H, P], w_hr [D, P, H] or [D, 0, H]")
    _need(_dims(&h0.shape[0], D, B, P) and _dims(&c0.shape[0], D, B, H)
          and _dims(&dh_state.shape[0], D, B, P) and _dims(&dc_state.shape[0], D, B, H),
          "h0 and dh_state must be [D, B, P], c0 and dc_state [D, B, H]")
    _need(x.shape[1] == I and dy.shape[1] >= D * P, "x must be [rows, I] and dy [rows, D*P]")
    _need(batch_sizes.shape[0] == T and packed_start.shape[0] == T
          and x_step_row.shape[0] == T and dy_step_row.shape[0] == T,
          "batch_sizes, packed_start and the step rows must have T entries")
    _need(N == (packed_start[T - 1] + batch_sizes[T - 1] if T > 0 else 0),
          "batch_sizes must add up to the call's N packed rows")
    _check_row_tables(batch_sizes, packed_start, B, N, x_step_row, x_batch_stride, x.shape[0],
                      bc.x_rows_packed, dy_step_row, dy_batch_stride, dy.shape[0], "dy")
    _need(not bc.want_dx or (dx.shape[0] == x.shape[0] and dx.shape[1] == I),
          "dx must be shaped like x")
    _need(not want_dparams or (_dims(&dw_ih.shape[0], D, G4, I) and _dims(&dw_hh.shape[0], D, G4, P)
                               and _dims(&db.shape[0], D, G4, -1)
                               and _dims(&dw_hr.shape[0], D, hr, H)),
          "dw_ih, dw_hh, db, dw_hr must be [D, 4H, I], [D, 4H, P], [D, 4H], [D, P, H]")
    _set_saved(bc.saved, saved, D, T * B, H, P, <floating *>NULL)
    if want_dparams and (bc.n_chunks == 0 or B == 0):
        # No steps, or no rows: no product adds anything.
        dw_ih[...] = 0
        dw_hh[...] = 0
        db[...] = 0
        dw_hr[...] = 0
    if layer.empty:
        layer.n_workers = 1
        return 0

    bc.steps.sizes = &batch_sizes[0]
    bc.steps.start = &packed_start[0]
    _rows(&bc.x, x, x_step_row, x_batch_stride)
    _rows(&bc.dy, dy, dy_step_row, dy_batch_stride)
    _rows(&bc.dx, dx, x_step_row, x_batch_stride)
    for d in range(D):
        bc.w_ih[d] = _data3(w_ih, d)
        bc.w_hh[d] = _data3(w_hh, d)
        bc.h0[d] = _data3(h0, d)
        bc.c0[d] = _data3(c0, d)
        bc.dh_state[d] = _data3(dh_state, d)
        bc.dc_state[d] = _data3(dc_state, d)
        bc.w_hr[d] = _data3(w_hr, d) if bc.projected else NULL
        if want_dparams and G4 > 0:
            bc.dw_ih[d] = _data3(dw_ih, d)
            bc.dw_hh[d] = _data3(dw_hh, d)
            bc.db[d] = <char *>&db[d, 0]
            bc.dw_hr[d] = _data3(dw_hr, d) if bc.projected else NULL
    _row_blocks(bc.steps.sizes, T, B, bc.groups, layer.row_start)
    _zero_backward_sync(layer)
    bc.trace = _trace_of(trace, &layer.sync.trace_count)
    with nogil:
        layer.n_workers = run_job(layer.n_threads,
                                  _backward_job_float if floating is float else _backward_job_double,
                                  <void *>bc, flush_denormals)
    n_trace = min(layer.sync.trace_count, bc.trace.capacity)
    bc.trace.entries = NULL  # the trace array is the caller's: not kept past the call
    return n_trace
