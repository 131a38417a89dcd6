"""LSTM kernels for one layer and one direction, forward (training) and backward.

Conventions shared by both kernels
----------------------------------
* Time steps run over ``t = 0 .. T-1``; at step ``t`` the rows ``b < batch_sizes[t]``
  are active (sequences sorted by length, longest first, as in PyTorch's
  ``PackedSequence``). Uniform batches simply have ``batch_sizes[t] == B``.
* Internal work buffers (``gates``/``dgates``, ``z``) are *packed*: the active rows of
  step ``t`` are the contiguous rows ``packed_start[t] .. packed_start[t] + batch_sizes[t]``.
  For uniform batches this is the plain time-major ``[T*B, ...]`` layout.
* Caller-layout arrays (input, output, their gradients) are 2-D row tables: the row of
  ``(t, b)`` is ``step_row[t] + b * batch_stride``. Time-major, batch-first, packed and
  padded inputs are all expressed this way without copying.
* Saved activations are time-major ``[T*B, H]``: row ``t*B + b``.
* The previous state of row ``b`` at step ``t`` is the saved state of the step processed
  just before (``t-1`` forward, ``t+1`` reverse) if the row was active there, else the
  initial state; this is what makes each reverse sequence start at its own last step.
"""
from cython cimport floating
from libc.math cimport exp, expf, tanh, tanhf

from lstmcy._blas cimport gemm, NoTrans, Trans


cdef inline floating _sigmoid(floating x) noexcept nogil:
    cdef floating one = 1
    if floating is float:
        return one / (one + expf(-x))
    else:
        return one / (one + exp(-x))


cdef inline floating _tanh(floating x) noexcept nogil:
    if floating is float:
        return tanhf(x)
    else:
        return tanh(x)


cdef inline Py_ssize_t _prev_step(Py_ssize_t t, Py_ssize_t b, Py_ssize_t T,
                                  const Py_ssize_t[::1] batch_sizes,
                                  bint reverse) noexcept nogil:
    """Time step whose saved state feeds row ``b`` at step ``t``, or -1 for the initial state."""
    if reverse:
        if t + 1 < T and b < batch_sizes[t + 1]:
            return t + 1
        return -1
    return t - 1


def forward_layer(
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        bint x_rows_packed,
        const floating[:, ::1] w_ih, const floating[:, ::1] w_hh, const floating[::1] bias,
        const floating[:, ::1] h0, const floating[:, ::1] c0,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start, bint reverse,
        floating[:, ::1] y, const Py_ssize_t[::1] y_step_row, Py_ssize_t y_batch_stride,
        Py_ssize_t y_col,
        floating[:, ::1] h_n, floating[:, ::1] c_n,
        floating[:, ::1] cache_i, floating[:, ::1] cache_f, floating[:, ::1] cache_g,
        floating[:, ::1] cache_o, floating[:, ::1] cache_c, floating[:, ::1] cache_tanhc,
        floating[:, ::1] cache_h, bint store_cache,
        floating[:, ::1] gates, floating[:, ::1] x_packed):
    """Run one direction of one layer forward, storing gate activations.

    Parameters
    ----------
    x : ndarray [rows, I]
        Layer input as a row table (see module docstring).
    x_step_row, x_batch_stride : row of ``(t, b)`` in ``x`` is ``x_step_row[t] + b * x_batch_stride``.
    x_rows_packed : bool
        True when the rows of ``x`` already are in packed order (row ``n`` is packed row ``n``);
        then ``x`` is used in place, else it is gathered into ``x_packed``.
    w_ih, w_hh, bias : ndarray
        ``[4H, I]``, ``[4H, H]`` and ``b_ih + b_hh`` ``[4H]`` (zeros without bias).
    h0, c0 : ndarray [B, H]
        Initial state.
    batch_sizes, packed_start : ndarray [T] of intp
        Active rows per step and the first packed row of each step.
    reverse : bool
        Process steps ``T-1 .. 0``.
    y, y_step_row, y_batch_stride, y_col : output row table; ``h`` of ``(t, b)`` goes to
        ``y[row, y_col:y_col + H]``.
    h_n, c_n : ndarray [B, H]
        Final states (written; also used as the running state).
    cache_* : ndarray [T*B, H]
        Saved activations, written at active rows when ``store_cache``.
    gates : ndarray [N, 4H]
        Workspace, ``N = sum(batch_sizes)``.
    x_packed : ndarray [N, I]
        Workspace for the gathered input (unused when ``x_rows_packed``).
    """
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t B = h0.shape[0]
    cdef Py_ssize_t H = h0.shape[1]
    cdef Py_ssize_t I = w_ih.shape[1]
    cdef Py_ssize_t G = 4 * H
    cdef Py_ssize_t N = gates.shape[0]
    cdef Py_ssize_t s, t, b, j, n, n0, nb, row, xr, yr
    cdef floating a_i, a_f, a_g, a_o, v_i, v_f, v_g, v_o, v_c, v_tc, v_h
    cdef const floating *x_rows = NULL
    cdef const floating *w_ih_ptr = NULL
    cdef const floating *w_hh_ptr = NULL
    cdef floating *gates_ptr = NULL
    cdef floating *h_state = NULL

    if N > 0 and G > 0:
        gates_ptr = &gates[0, 0]
    if G > 0 and I > 0:
        w_ih_ptr = &w_ih[0, 0]
    if G > 0 and H > 0:
        w_hh_ptr = &w_hh[0, 0]
    if B > 0 and H > 0:
        h_state = &h_n[0, 0]

    with nogil:
        for b in range(B):
            for j in range(H):
                h_n[b, j] = h0[b, j]
                c_n[b, j] = c0[b, j]
        if N == 0 or G == 0:
            # Nothing to compute (H == 0 also leaves y untouched: it has no columns).
            pass
        else:
            if I > 0:
                if x_rows_packed:
                    x_rows = &x[0, 0]
                else:
                    for t in range(T):
                        for b in range(batch_sizes[t]):
                            xr = x_step_row[t] + b * x_batch_stride
                            n = packed_start[t] + b
                            for j in range(I):
                                x_packed[n, j] = x[xr, j]
                    x_rows = &x_packed[0, 0]
            # Input projection for all steps at once: gates = x @ w_ih^T.
            gemm(NoTrans, Trans, <int>N, <int>G, <int>I, <floating>1, x_rows, <int>I,
                 w_ih_ptr, <int>I, <floating>0, gates_ptr, <int>G)
            for s in range(T):
                t = T - 1 - s if reverse else s
                nb = batch_sizes[t]
                n0 = packed_start[t]
                # Recurrent projection of the running state: gates += h @ w_hh^T.
                gemm(NoTrans, Trans, <int>nb, <int>G, <int>H, <floating>1, h_state, <int>H,
                     w_hh_ptr, <int>H, <floating>1, gates_ptr + n0 * G, <int>G)
                for b in range(nb):
                    n = n0 + b
                    row = t * B + b
                    yr = y_step_row[t] + b * y_batch_stride
                    for j in range(H):
                        a_i = gates[n, j] + bias[j]
                        a_f = gates[n, H + j] + bias[H + j]
                        a_g = gates[n, 2 * H + j] + bias[2 * H + j]
                        a_o = gates[n, 3 * H + j] + bias[3 * H + j]
                        v_i = _sigmoid(a_i)
                        v_f = _sigmoid(a_f)
                        v_g = _tanh(a_g)
                        v_o = _sigmoid(a_o)
                        v_c = v_f * c_n[b, j] + v_i * v_g
                        v_tc = _tanh(v_c)
                        v_h = v_o * v_tc
                        c_n[b, j] = v_c
                        h_n[b, j] = v_h
                        y[yr, y_col + j] = v_h
                        if store_cache:
                            cache_i[row, j] = v_i
                            cache_f[row, j] = v_f
                            cache_g[row, j] = v_g
                            cache_o[row, j] = v_o
                            cache_c[row, j] = v_c
                            cache_tanhc[row, j] = v_tc
                            cache_h[row, j] = v_h


def backward_layer(
        const floating[:, ::1] x, const Py_ssize_t[::1] x_step_row, Py_ssize_t x_batch_stride,
        bint x_rows_packed,
        const floating[:, ::1] dy, const Py_ssize_t[::1] dy_step_row, Py_ssize_t dy_batch_stride,
        Py_ssize_t dy_col,
        const floating[:, ::1] w_ih, const floating[:, ::1] w_hh,
        const floating[:, ::1] h0, const floating[:, ::1] c0,
        const floating[:, ::1] cache_i, const floating[:, ::1] cache_f,
        const floating[:, ::1] cache_g, const floating[:, ::1] cache_o,
        const floating[:, ::1] cache_c, const floating[:, ::1] cache_tanhc,
        const floating[:, ::1] cache_h,
        const Py_ssize_t[::1] batch_sizes, const Py_ssize_t[::1] packed_start, bint reverse,
        floating[:, ::1] dh_state, floating[:, ::1] dc_state,
        floating[:, ::1] dx, bint want_dx, bint dx_accumulate,
        floating[:, ::1] dw_ih, floating[:, ::1] dw_hh, floating[::1] db, bint want_dparams,
        floating[:, ::1] dgates, floating[:, ::1] z, floating[:, ::1] dw,
        floating[:, ::1] dx_packed):
    """Backpropagate through one direction of one layer.

    Parameters
    ----------
    x, x_step_row, x_batch_stride, x_rows_packed
        The layer input as a row table (see ``forward_layer``); ``dx`` uses the same rows.
    dy, dy_step_row, dy_batch_stride, dy_col
        Gradient of this direction's output: ``dy[row, dy_col:dy_col + H]``.
    w_ih, w_hh : ndarray
        Weights ``[4H, I]``, ``[4H, H]``.
    h0, c0 : ndarray [B, H]
        Initial state of the forward pass.
    cache_* : ndarray [T*B, H]
        Saved activations i, f, g, o, c, tanh(c), h (time-major).
    batch_sizes, packed_start, reverse
        As in ``forward_layer``.
    dh_state, dc_state : ndarray [B, H]
        In: gradients of ``h_n``, ``c_n``. Out: gradients of ``h0``, ``c0``.
    dx : ndarray [rows, I]
        Gradient of the input (written at active rows; assigned, or added when
        ``dx_accumulate``). Untouched unless ``want_dx``.
    dw_ih, dw_hh, db : ndarray
        Weight and bias gradients (overwritten) when ``want_dparams``.
    dgates : ndarray [N, 4H]
        Workspace for the gate gradients of every step.
    z : ndarray [N, I + H]
        Workspace holding ``[x_t, h_{t-1}]`` rows, so that ``dW = dgates^T z`` is one GEMM.
    dw : ndarray [4H, I + H]
        Workspace for that product.
    dx_packed : ndarray [N, I]
        Workspace for ``dx`` in packed order (unused when ``x_rows_packed``).
    """
    cdef Py_ssize_t T = batch_sizes.shape[0]
    cdef Py_ssize_t B = h0.shape[0]
    cdef Py_ssize_t H = h0.shape[1]
    cdef Py_ssize_t I = w_ih.shape[1]
    cdef Py_ssize_t G = 4 * H
    cdef Py_ssize_t K = I + H
    cdef Py_ssize_t N = dgates.shape[0]
    cdef Py_ssize_t s, t, b, j, k, n, n0, nb, row, prev_row, prev_t, xr, dyr
    cdef floating v_dh, v_dc, v_i, v_f, v_g, v_o, v_tc, v_cprev
    cdef floating one = 1
    cdef floating *dgates_ptr = NULL
    cdef const floating *w_ih_ptr = NULL
    cdef const floating *w_hh_ptr = NULL
    cdef floating *dh_ptr = NULL
    cdef floating *z_ptr = NULL
    cdef floating *dw_ptr = NULL
    cdef floating *dx_target = NULL

    if N > 0 and G > 0:
        dgates_ptr = &dgates[0, 0]
    if G > 0 and I > 0:
        w_ih_ptr = &w_ih[0, 0]
    if G > 0 and H > 0:
        w_hh_ptr = &w_hh[0, 0]
    if B > 0 and H > 0:
        dh_ptr = &dh_state[0, 0]
    if want_dparams and N > 0 and K > 0:
        z_ptr = &z[0, 0]
    if want_dparams and G > 0 and K > 0:
        dw_ptr = &dw[0, 0]
    if want_dx and N > 0 and I > 0:
        dx_target = &dx[0, 0] if x_rows_packed else &dx_packed[0, 0]

    with nogil:
        # Sequential part: the recurrence of dh and dc through time.
        for s in range(T):
            t = s if reverse else T - 1 - s
            nb = batch_sizes[t]
            n0 = packed_start[t]
            for b in range(nb):
                n = n0 + b
                row = t * B + b
                dyr = dy_step_row[t] + b * dy_batch_stride
                prev_t = _prev_step(t, b, T, batch_sizes, reverse)
                prev_row = prev_t * B + b
                for j in range(H):
                    v_i = cache_i[row, j]
                    v_f = cache_f[row, j]
                    v_g = cache_g[row, j]
                    v_o = cache_o[row, j]
                    v_tc = cache_tanhc[row, j]
                    v_cprev = cache_c[prev_row, j] if prev_t >= 0 else c0[b, j]
                    # Multiplication order follows PyTorch's autograd formulas
                    # (tanh_backward, sigmoid_backward, mul_backward), so that
                    # overflow and NaN appear exactly where float64 autograd has them.
                    v_dh = dy[dyr, dy_col + j] + dh_state[b, j]
                    v_dc = (v_dh * v_o) * (one - v_tc * v_tc) + dc_state[b, j]
                    dgates[n, j] = (v_dc * v_g) * (one - v_i) * v_i
                    dgates[n, H + j] = (v_dc * v_cprev) * (one - v_f) * v_f
                    dgates[n, 2 * H + j] = (v_dc * v_i) * (one - v_g * v_g)
                    dgates[n, 3 * H + j] = (v_dh * v_tc) * (one - v_o) * v_o
                    dc_state[b, j] = v_dc * v_f
            # dh of the previous step: dgates_t @ w_hh.
            gemm(NoTrans, NoTrans, <int>nb, <int>H, <int>G, one, dgates_ptr + n0 * G, <int>G,
                 w_hh_ptr, <int>H, <floating>0, dh_ptr, <int>H)

        # Batched part: every step's gate gradients are known.
        if want_dparams:
            for t in range(T):
                for b in range(batch_sizes[t]):
                    n = packed_start[t] + b
                    xr = x_step_row[t] + b * x_batch_stride
                    for j in range(I):
                        z[n, j] = x[xr, j]
                    prev_t = _prev_step(t, b, T, batch_sizes, reverse)
                    if prev_t >= 0:
                        prev_row = prev_t * B + b
                        for j in range(H):
                            z[n, I + j] = cache_h[prev_row, j]
                    else:
                        for j in range(H):
                            z[n, I + j] = h0[b, j]
            # [dW_ih | dW_hh] = dgates^T @ [x | h_prev] over all steps at once.
            gemm(Trans, NoTrans, <int>G, <int>K, <int>N, one, dgates_ptr, <int>G,
                 z_ptr, <int>K, <floating>0, dw_ptr, <int>K)
            for k in range(G):
                for j in range(I):
                    dw_ih[k, j] = dw[k, j]
                for j in range(H):
                    dw_hh[k, j] = dw[k, I + j]
            # Fixed-order reduction, so results are bitwise reproducible.
            for k in range(G):
                db[k] = 0
            for n in range(N):
                for k in range(G):
                    db[k] += dgates[n, k]

        if want_dx and N > 0 and I > 0:
            # dx = dgates @ w_ih, straight into dx when its rows are in packed order.
            gemm(NoTrans, NoTrans, <int>N, <int>I, <int>G, one, dgates_ptr, <int>G,
                 w_ih_ptr, <int>I, <floating>(1 if (dx_accumulate and x_rows_packed) else 0),
                 dx_target, <int>I)
            if not x_rows_packed:
                for t in range(T):
                    for b in range(batch_sizes[t]):
                        n = packed_start[t] + b
                        xr = x_step_row[t] + b * x_batch_stride
                        if dx_accumulate:
                            for j in range(I):
                                dx[xr, j] += dx_packed[n, j]
                        else:
                            for j in range(I):
                                dx[xr, j] = dx_packed[n, j]
