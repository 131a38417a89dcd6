# The entry points of one cell step: one layer, one direction, T = 1, no projection
# (LSTMPlan.step, lstmcy.torch.LSTMCell, the LSTM module's one-step inference; the cell's
# training steps).
#
# Design
# ------
# The arithmetic of a small step (B = 1, I = 16, H = 32: 6k multiply-adds) takes less time
# than binding a typed memoryview, and much less than starting a job on the pool. So the
# step objects bind nothing: they read each argument's type, dtype, shape and flags
# through numpy's C API (a few loads when they fit; None when one does not, and the caller
# runs the full path, whose checks raise), run in the calling thread holding the GIL, and
# return new arrays. The callers give them only steps small enough for one thread and for
# BLAS calls that OpenBLAS runs on one thread (lstmcy._engine.step.fits_step_kernel,
# fits_step_backward).
#
# StepForward computes what ForwardLayer computes for one step, with the same functions in
# the same order (pack w_hh^T, the input product by BLAS or, with fused_input, packed with
# w_ih^T, then the cells), so its results are bitwise the layer call's. It owns its
# scratch (gates, packed weights, bias, a zero state), allocated once for its shape and
# freed in __dealloc__.
#
# StepBackward is a BackwardLayer of one step on one thread, on work buffers of its own:
# its step() binds the arrays into the call struct and runs the layer call's worker
# directly, so its results are the layer call's by construction (the backward's bits do
# not depend on its thread count).
#
# Neither keeps a pointer to a caller's array past a call. Holding the GIL, a call never
# overlaps another on the same object.

cimport numpy as cnp

# numpy's headers include <complex.h>, whose macro I would rename the call structs' field I.
cdef extern from *:
    """
    #undef I
    """

cnp.import_array()


cpdef enum StepLayout:
    # The shapes of a step's x, states and results.
    STEP_CELL = 0            # x [B, I], states [B, H]; returns (h, c)
    STEP_TIME_MAJOR = 1      # x [1, B, I], states [1, B, H]; returns (y [1, B, H], h, c)
    STEP_BATCH_FIRST = 2     # x [B, 1, I], states [1, B, H]; returns (y [B, 1, H], h, c)


cdef inline char *_step_array(object a, int typenum, int ndim, Py_ssize_t d0, Py_ssize_t d1,
                              Py_ssize_t d2, bint writable):
    """The data of ``a`` if it is an exact ndarray of ``typenum`` in native byte order,
    C-contiguous and aligned, of shape ``[d0, d1, d2][:ndim]``; else NULL."""
    cdef cnp.ndarray array
    cdef cnp.npy_intp *dims
    cdef int flags
    if type(a) is not cnp.ndarray:
        return NULL
    array = <cnp.ndarray>a
    if cnp.PyArray_TYPE(array) != typenum or not cnp.PyArray_ISNOTSWAPPED(array):
        return NULL
    dims = cnp.PyArray_DIMS(array)
    if (cnp.PyArray_NDIM(array) != ndim or dims[0] != d0 or (ndim > 1 and dims[1] != d1)
            or (ndim > 2 and dims[2] != d2)):
        return NULL
    flags = cnp.PyArray_FLAGS(array)
    if (flags & cnp.NPY_ARRAY_C_CONTIGUOUS) == 0 or (flags & cnp.NPY_ARRAY_ALIGNED) == 0:
        return NULL
    if writable and (flags & cnp.NPY_ARRAY_WRITEABLE) == 0:
        return NULL
    return cnp.PyArray_BYTES(array)


def ready_array(a, dtype):
    """``a`` itself if it is an exact ndarray, C-contiguous and aligned, whose dtype is
    the object ``dtype`` (any when ``dtype`` is None); else None (lstmcy._engine.validation
    .to_compute converts it). Read from numpy's flags, a few loads."""
    cdef cnp.ndarray array
    cdef int flags
    if type(a) is not cnp.ndarray:
        return None
    array = <cnp.ndarray>a
    if dtype is not None and <object>cnp.PyArray_DESCR(array) is not dtype:
        return None
    flags = cnp.PyArray_FLAGS(array)
    if (flags & cnp.NPY_ARRAY_C_CONTIGUOUS) == 0 or (flags & cnp.NPY_ARRAY_ALIGNED) == 0:
        return None
    return a


cdef inline void _sum_into(floating *out, const floating *a, const floating *b,
                           Py_ssize_t n) noexcept nogil:
    """out = a + b (n elements)."""
    cdef Py_ssize_t j
    for j in range(n):
        out[j] = a[j] + b[j]


cdef class StepForward:
    """The forward of one cell step of shape ``(B, I, H)`` in one dtype.

    Parameters
    ----------
    B, I, H : int
        Rows, input features and hidden units, each at least 1.
    dtype : numpy dtype
        float32 or float64.
    fused_input : bool
        Take x's product with w_ih^T packed, inside the step's product (the layer call's
        schedule for these sizes: lstmcy._engine.schedule.fused_input).
    """

    cdef readonly Py_ssize_t B, I, H
    cdef readonly bint fused_input, is_double
    cdef int typenum
    cdef char *gates      # [B, 4H] pre-activations, then activations
    cdef char *packed_hh  # w_hh^T packed (4H columns, K = H)
    cdef char *packed_ih  # w_ih^T packed (4H columns, K = I), with fused_input
    cdef char *bias       # [4H]: b_ih + b_hh, zeros without biases
    cdef char *zeros      # [B, H]: the zero state of hx=None

    def __cinit__(self, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, dtype, bint fused_input):
        cdef size_t item
        _need(B >= 1 and I >= 1 and H >= 1, "B, I and H must be at least 1")
        dtype = np.dtype(dtype)
        _need(dtype in (np.float32, np.float64), "dtype must be float32 or float64")
        self.B, self.I, self.H = B, I, H
        self.fused_input = fused_input
        self.is_double = dtype == np.float64
        self.typenum = cnp.NPY_DOUBLE if self.is_double else cnp.NPY_FLOAT
        item = 8 if self.is_double else 4
        self.gates = <char *>calloc(B * 4 * H, item)
        self.packed_hh = <char *>calloc(
            pg_d_packed_len(4 * H, H) if self.is_double else pg_s_packed_len(4 * H, H), item)
        self.packed_ih = <char *>calloc(
            (pg_d_packed_len(4 * H, I) if self.is_double else pg_s_packed_len(4 * H, I))
            if fused_input else 1, item)
        self.bias = <char *>calloc(4 * H, item)
        self.zeros = <char *>calloc(B * H, item)
        if (self.gates == NULL or self.packed_hh == NULL or self.packed_ih == NULL
                or self.bias == NULL or self.zeros == NULL):
            raise MemoryError()  # __dealloc__ frees what was allocated

    def __dealloc__(self):
        free(self.gates)
        free(self.packed_hh)
        free(self.packed_ih)
        free(self.bias)
        free(self.zeros)

    def run(self, x, hx, params, Py_ssize_t n_params, saved=None, bint flush_denormals=True,
            StepLayout layout=STEP_CELL):
        """One step, or None where an argument is not what this object takes.

        Parameters
        ----------
        x : ndarray [B, I] (``layout``: [1, B, I] or [B, 1, I])
        hx : tuple or list of two ndarray [B, H] ([1, B, H]), or None (zeros)
            ``(h0, c0)``.
        params : tuple or list of ndarray
            ``(w_ih [4H, I], w_hh [4H, H])``, then ``b_ih [4H], b_hh [4H]`` or their sum
            ``bias [4H]`` or nothing (no biases).
        n_params : int
            The length ``params`` must have: 4, 3 or 2.
        saved : ndarray [7 * B * H] or None
            Receives the activations ``[7, B, H]`` in SAVED_ORDER (training); None for
            inference.
        flush_denormals : bool
            Run with subnormal numbers flushed to zero (the caller's mode is restored).
        layout : StepLayout
            The shapes of x, the states and the results (a one-step sequence's have a
            step axis of 1; their memory is the cell's).

        Every array must be an exact ndarray of this object's dtype, C-contiguous and
        aligned (``saved`` writable).

        Returns
        -------
        (h, c) : tuple of ndarray [B, H], or None
            New arrays; with a sequence layout ``(y, h_n, c_n)``, ``h_n`` and ``c_n``
            ``[1, B, H]`` and ``y`` a copy of ``h_n`` in the input's layout.
        """
        cdef Py_ssize_t B = self.B, I = self.I, H = self.H
        cdef int typenum = self.typenum
        cdef const char *x_data
        cdef const char *h0_data
        cdef const char *c0_data
        cdef const char *w_ih_data
        cdef const char *w_hh_data
        cdef const char *b_ih_data = NULL
        cdef const char *b_hh_data = NULL
        cdef char *saved_data = NULL
        cdef cnp.npy_intp dims[3]
        cdef cnp.ndarray h_out, c_out, y_out
        cdef unsigned mode = 0
        cdef int state_rank = 2 if layout == STEP_CELL else 3
        cdef size_t state_bytes = B * H * (8 if self.is_double else 4)
        if layout == STEP_CELL:
            x_data = _step_array(x, typenum, 2, B, I, 0, False)
        elif layout == STEP_TIME_MAJOR:
            x_data = _step_array(x, typenum, 3, 1, B, I, False)
        elif layout == STEP_BATCH_FIRST:
            x_data = _step_array(x, typenum, 3, B, 1, I, False)
        else:
            return None
        if x_data == NULL:
            return None
        if hx is None:
            h0_data = c0_data = self.zeros
        elif (type(hx) is tuple or type(hx) is list) and len(hx) == 2:
            if state_rank == 2:
                h0_data = _step_array(hx[0], typenum, 2, B, H, 0, False)
                c0_data = _step_array(hx[1], typenum, 2, B, H, 0, False)
            else:
                h0_data = _step_array(hx[0], typenum, 3, 1, B, H, False)
                c0_data = _step_array(hx[1], typenum, 3, 1, B, H, False)
            if h0_data == NULL or c0_data == NULL:
                return None
        else:
            return None
        if not ((type(params) is tuple or type(params) is list) and 2 <= n_params <= 4
                and len(params) == n_params):
            return None
        w_ih_data = _step_array(params[0], typenum, 2, 4 * H, I, 0, False)
        w_hh_data = _step_array(params[1], typenum, 2, 4 * H, H, 0, False)
        if n_params >= 3:
            b_ih_data = _step_array(params[2], typenum, 1, 4 * H, 0, 0, False)
            if b_ih_data == NULL:
                return None
        if n_params == 4:
            b_hh_data = _step_array(params[3], typenum, 1, 4 * H, 0, 0, False)
            if b_hh_data == NULL:
                return None
        if w_ih_data == NULL or w_hh_data == NULL:
            return None
        if saved is not None:
            saved_data = _step_array(saved, typenum, 1, 7 * B * H, 0, 0, True)
            if saved_data == NULL:
                return None
        if state_rank == 2:
            dims[0], dims[1] = B, H
        else:
            dims[0], dims[1], dims[2] = 1, B, H
        h_out = cnp.PyArray_EMPTY(state_rank, dims, typenum, 0)
        c_out = cnp.PyArray_EMPTY(state_rank, dims, typenum, 0)
        memcpy(cnp.PyArray_BYTES(c_out), c0_data, state_bytes)
        # The bias as the layer call takes it: b_ih + b_hh, one rounding per element.
        if n_params == 2:
            memset(self.bias, 0, 4 * H * (8 if self.is_double else 4))
        elif n_params == 3:
            memcpy(self.bias, b_ih_data, 4 * H * (8 if self.is_double else 4))
        elif self.is_double:
            _sum_into(<double *>self.bias, <const double *>b_ih_data,
                      <const double *>b_hh_data, 4 * H)
        else:
            _sum_into(<float *>self.bias, <const float *>b_ih_data,
                      <const float *>b_hh_data, 4 * H)
        if flush_denormals:
            mode = flush_denormals_mode()
        if self.is_double:
            _step_rows(self, <double *>NULL, x_data, h0_data, cnp.PyArray_BYTES(c_out),
                       w_ih_data, w_hh_data, cnp.PyArray_BYTES(h_out), saved_data)
        else:
            _step_rows(self, <float *>NULL, x_data, h0_data, cnp.PyArray_BYTES(c_out),
                       w_ih_data, w_hh_data, cnp.PyArray_BYTES(h_out), saved_data)
        if flush_denormals:
            restore_fp_mode(mode)
        if layout == STEP_CELL:
            return h_out, c_out
        if layout == STEP_BATCH_FIRST:
            dims[0], dims[1] = B, 1
        y_out = cnp.PyArray_EMPTY(3, dims, typenum, 0)
        memcpy(cnp.PyArray_BYTES(y_out), cnp.PyArray_BYTES(h_out), state_bytes)
        return y_out, h_out, c_out


cdef void _step_rows(StepForward k, floating *like, const char *x_data, const char *h0_data,
                     char *c_data, const char *w_ih_data, const char *w_hh_data,
                     char *h_data, char *saved_data) noexcept nogil:
    """One step of ``k``'s shape: gates = x @ w_ih^T + h0 @ w_hh^T, then each row's cell
    (c in place from c0 to c1; h to ``h_data``; with ``saved_data``, the seven activations
    ``[7, B, H]`` in SAVED_ORDER)."""
    cdef Py_ssize_t B = k.B, I = k.I, H = k.H, G4 = 4 * k.H
    cdef const floating *x = <const floating *>x_data
    cdef const floating *h0 = <const floating *>h0_data
    cdef const floating *w_ih = <const floating *>w_ih_data
    cdef floating *gates = <floating *>k.gates
    cdef floating *packed_hh = <floating *>k.packed_hh
    cdef floating *packed_ih = <floating *>k.packed_ih
    cdef const floating *bias = <const floating *>k.bias
    cdef floating *c = <floating *>c_data
    cdef floating *h = <floating *>h_data
    cdef floating *sv = <floating *>saved_data
    cdef Py_ssize_t BH = B * H
    cdef Py_ssize_t b, r, j
    pack(<const floating *>w_hh_data, H, True, H, 0, G4, packed_hh)
    if k.fused_input:
        pack(w_ih, I, True, I, 0, G4, packed_ih)
        packed_gemm2(B, G4, I, x, I, packed_ih, H, h0, H, packed_hh, gates, G4)
    else:
        gemm(NoTrans, Trans, <int>B, <int>G4, <int>I, <floating>1, x, <int>I, w_ih, <int>I,
             <floating>0, gates, <int>G4)
        packed_gemm(B, G4, H, h0, H, packed_hh, gates, G4, True)
    for b in range(B):
        if sv == NULL:
            forward_cell_inference(H, H, gates + b * G4, bias, c + b * H, h + b * H)
        else:
            r = b * H
            forward_cell(H, H, gates + b * G4, bias, c + r, sv + 4 * BH + r, sv + r,
                         sv + 2 * BH + r, sv + BH + r, sv + 3 * BH + r, sv + 5 * BH + r,
                         sv + 6 * BH + r)
            for j in range(H):
                h[r + j] = sv[4 * BH + r + j]


cdef class StepBackward(BackwardLayer):
    """The backward of one cell step of shape ``(B, I, H)``: a :class:`BackwardLayer` of
    one step (``T = 1``, ``D = 1``, rows packed) whose :meth:`step` takes its arrays
    through numpy's C API and runs the layer call's worker in the calling thread.

    Built as a :class:`BackwardLayer` (same arguments, ``sizes = (1, B, B, 1, I, H, H)``,
    ``x_rows_packed`` true, ``n_threads`` 1), on work buffers of its own: its results are
    the layer call's, bitwise (the backward's bits do not depend on its thread count).
    """

    cdef Py_ssize_t one_step[3]  # batch_sizes [1] = B, packed_start [1] = 0, step_row [1] = 0
    cdef char *zeros             # [B, H]: the zero gradient of dh=None or dc=None

    def __init__(self, tuple sizes, bint want_dx, bint want_dparams, bint x_rows_packed,
                 schedule, tuple workspace, int n_threads):
        _need(len(sizes) == 7 and sizes[0] == 1 and sizes[3] == 1 and sizes[1] >= 1
              and sizes[2] == sizes[1] and sizes[5] >= 1 and sizes[6] == sizes[5]
              and x_rows_packed and n_threads == 1,
              "a StepBackward is one step of one direction: sizes (1, B, B, 1, I, H, H), "
              "B and H at least 1, rows packed, one thread")
        BackwardLayer.__init__(self, sizes, want_dx, want_dparams, x_rows_packed, schedule,
                               workspace, n_threads)
        self.one_step[0] = self.bc.steps.B
        self.one_step[1] = 0
        self.one_step[2] = 0
        self.zeros = <char *>calloc(self.bc.steps.B * self.bc.H, 8 if self.is_double else 4)
        if self.zeros == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.zeros)  # then BackwardLayer's __dealloc__

    def step(self, x, h0, c0, w_ih, w_hh, saved, dh, dc, bint flush_denormals=True):
        """The gradients of one step, or None where an argument is not what this object
        takes.

        Parameters
        ----------
        x : ndarray [B, I]
        h0, c0 : ndarray [B, H]
            The step's input and initial states.
        w_ih, w_hh : ndarray [4H, I], [4H, H]
        saved : ndarray [7 * B * H]
            The step's activations ``[7, B, H]`` in SAVED_ORDER (the forward's ``saved``).
        dh, dc : ndarray [B, H] or None
            The gradients of the new states ``h`` (also the step's output) and ``c``; None
            for zeros.
        flush_denormals : bool
            As for :meth:`StepForward.run`.

        Every array must be an exact ndarray of this object's dtype, C-contiguous and
        aligned.

        Returns
        -------
        (dx, dh0, dc0, dparams) or None
            New arrays: ``dx [B, I]`` (None unless ``want_dx``), ``dh0``, ``dc0 [B, H]``,
            and ``dparams [4H (I + H + 1)]``, the gradients ``dw_ih [4H, I]``, ``dw_hh
            [4H, H]`` and ``db [4H]`` (that of either bias) flattened one after the other
            (None unless ``want_dparams``).
        """
        cdef BackwardCall *bc = &self.bc
        cdef Py_ssize_t B = bc.steps.B, I = bc.I, H = bc.H, BH = bc.steps.B * bc.H
        cdef int typenum = cnp.NPY_DOUBLE if self.is_double else cnp.NPY_FLOAT
        cdef size_t item = 8 if self.is_double else 4
        cdef char *x_data = _step_array(x, typenum, 2, B, I, 0, False)
        cdef char *h0_data = _step_array(h0, typenum, 2, B, H, 0, False)
        cdef char *c0_data = _step_array(c0, typenum, 2, B, H, 0, False)
        cdef char *w_ih_data = _step_array(w_ih, typenum, 2, 4 * H, I, 0, False)
        cdef char *w_hh_data = _step_array(w_hh, typenum, 2, 4 * H, H, 0, False)
        cdef char *saved_data = _step_array(saved, typenum, 1, 7 * BH, 0, 0, False)
        cdef char *dh_data = self.zeros
        cdef char *dc_data = self.zeros
        cdef cnp.npy_intp dims[2]
        cdef object dx_out = None, dparams_out = None
        cdef char *dparams_data
        cdef cnp.ndarray dh0_out, dc0_out
        cdef unsigned mode = 0
        if (x_data == NULL or h0_data == NULL or c0_data == NULL or w_ih_data == NULL
                or w_hh_data == NULL or saved_data == NULL):
            return None
        if dh is not None:
            dh_data = _step_array(dh, typenum, 2, B, H, 0, False)
            if dh_data == NULL:
                return None
        if dc is not None:
            dc_data = _step_array(dc, typenum, 2, B, H, 0, False)
            if dc_data == NULL:
                return None
        dims[0], dims[1] = B, H
        dh0_out = cnp.PyArray_EMPTY(2, dims, typenum, 0)
        dc0_out = cnp.PyArray_EMPTY(2, dims, typenum, 0)
        # In: the gradients of h_n (zero: h's arrives as the output's, dy) and of c_n.
        memset(cnp.PyArray_BYTES(dh0_out), 0, BH * item)
        memcpy(cnp.PyArray_BYTES(dc0_out), dc_data, BH * item)
        bc.x.data, bc.x.ld, bc.x.col = x_data, I, 0
        bc.dy.data, bc.dy.ld, bc.dy.col = dh_data, H, 0
        bc.x.step_row = bc.dy.step_row = bc.dx.step_row = &self.one_step[2]
        bc.x.batch_stride = bc.dy.batch_stride = bc.dx.batch_stride = 1
        bc.dx.data, bc.dx.ld, bc.dx.col = NULL, I, 0
        if bc.want_dx:
            dims[1] = I
            dx_out = cnp.PyArray_EMPTY(2, dims, typenum, 0)
            bc.dx.data = cnp.PyArray_BYTES(<cnp.ndarray>dx_out)
        if bc.want_dparams:
            # One array, as one gradient goes back for all the parameters.
            dims[0] = 4 * H * (I + H + 1)
            dparams_out = cnp.PyArray_EMPTY(1, dims, typenum, 0)
            dparams_data = cnp.PyArray_BYTES(<cnp.ndarray>dparams_out)
            bc.dw_ih[0] = dparams_data
            bc.dw_hh[0] = dparams_data + 4 * H * I * item
            bc.db[0] = dparams_data + 4 * H * (I + H) * item
        bc.steps.sizes = &self.one_step[0]
        bc.steps.start = &self.one_step[1]
        bc.w_ih[0] = w_ih_data
        bc.w_hh[0] = w_hh_data
        bc.w_hr[0] = NULL
        bc.h0[0] = h0_data
        bc.c0[0] = c0_data
        bc.dh_state[0] = cnp.PyArray_BYTES(dh0_out)
        bc.dc_state[0] = cnp.PyArray_BYTES(dc0_out)
        bc.saved[0].i = saved_data
        bc.saved[0].g = saved_data + BH * item
        bc.saved[0].f = saved_data + 2 * BH * item
        bc.saved[0].o = saved_data + 3 * BH * item
        bc.saved[0].h = saved_data + 4 * BH * item
        bc.saved[0].c = saved_data + 5 * BH * item
        bc.saved[0].tanhc = saved_data + 6 * BH * item
        _row_blocks(bc.steps.sizes, 1, B, bc.groups, self.row_start)
        _zero_backward_sync(self)
        bc.trace = _trace_of(None, &self.sync.trace_count)
        if flush_denormals:
            mode = flush_denormals_mode()
        if self.is_double:
            _backward_worker(bc, <double *>NULL, 0)
        else:
            _backward_worker(bc, <float *>NULL, 0)
        if flush_denormals:
            restore_fp_mode(mode)
        # Nothing of the caller's is kept past the call.
        bc.x.data = bc.dy.data = bc.dx.data = NULL
        bc.w_ih[0] = bc.w_hh[0] = bc.h0[0] = bc.c0[0] = NULL
        bc.dh_state[0] = bc.dc_state[0] = bc.dw_ih[0] = bc.dw_hh[0] = bc.db[0] = NULL
        memset(&bc.saved[0], 0, sizeof(Saved))
        return dx_out, dh0_out, dc0_out, dparams_out
