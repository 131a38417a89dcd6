# The gate math of one LSTM cell over one batch row: the forward (training and
# inference) and the backward elementwise passes. Everything else in the kernels is
# moving rows and products around these three functions.
#
# Forward, gate order [i f g o] (PyTorch's), a = x W_ih^T + h_{t-1} W_hh^T + b:
#     i = sigmoid(a_i)  f = sigmoid(a_f)  g = tanh(a_g)  o = sigmoid(a_o)
#     c_t = f * c_{t-1} + i * g            h_t = o * tanh(c_t)
# (with a projection, o * tanh(c_t) is r_t and h_t = r_t W_hr^T, a GEMM outside the cell).
# Backward (dh, dc: the gradients reaching o * tanh(c_t) and c_t):
#     dc = dh * o * (1 - tanh(c_t)^2) + dc_next
#     do = dh * tanh(c_t) * o (1 - o)      di = dc * g * i (1 - i)
#     dg = dc * i * (1 - g^2)              df = dc * c_{t-1} * f (1 - f)
#     dc_{t-1} = dc * f                    (dh_{t-1} is the GEMM dgates @ W_hh)
from cython cimport floating

from lstmcy._fastmath cimport fast_sigmoid, fast_tanh

# Restrict-qualified pointers for the rows a cell writes: declared restrict, the rows are
# known not to overlap and GCC vectorises the loops as they are. Through plain pointers it
# guards each loop with pairwise overlap checks, run on every call (at H = 64 a third of
# the forward's cell time).
cdef extern from *:
    ctypedef float * float_rp "float * __restrict__"
    ctypedef double * double_rp "double * __restrict__"

ctypedef fused floating_rp:
    float_rp
    double_rp


cdef inline void forward_cell(
        Py_ssize_t w, Py_ssize_t gs, const floating *act, const floating *bias,
        floating_rp c_row, floating_rp out_row, floating_rp ci, floating_rp cf, floating_rp cg,
        floating_rp co, floating_rp cc, floating_rp ctc) noexcept nogil:
    """One row of ``w`` units, training. ``act`` holds the pre-activations without the
    bias (gate q at ``act + q*gs``, likewise ``bias``); ``c_row`` goes from c_{t-1} to c_t
    in place; o * tanh(c_t) goes to ``out_row`` and the activations, c_t and tanh(c_t) to
    the saved rows ``ci .. ctc``. Two loops over the units rather than one short loop per
    quantity, which cost more in set-up than in work at the widths of a split step, and
    rather than one loop with all of it, which runs out of vector registers."""
    cdef Py_ssize_t j
    cdef floating c
    for j in range(w):
        ci[j] = fast_sigmoid(act[j] + bias[j])
        cf[j] = fast_sigmoid(act[gs + j] + bias[gs + j])
        cg[j] = fast_tanh(act[2 * gs + j] + bias[2 * gs + j])
        co[j] = fast_sigmoid(act[3 * gs + j] + bias[3 * gs + j])
    for j in range(w):
        # c = f * c_prev + i * g, as PyTorch: (f * c_prev) + (i * g).
        c = cf[j] * c_row[j] + ci[j] * cg[j]
        ctc[j] = fast_tanh(c)
        cc[j] = c
        c_row[j] = c
        out_row[j] = co[j] * ctc[j]


cdef inline void forward_cell_inference(
        Py_ssize_t w, Py_ssize_t gs, floating_rp act, const floating *bias,
        floating_rp c_row, floating_rp out_row) noexcept nogil:
    """:func:`forward_cell` without saved rows: the activations go back into ``act``, and
    o * tanh(c_t) to ``out_row``."""
    cdef Py_ssize_t j
    cdef floating c
    for j in range(w):
        act[j] = fast_sigmoid(act[j] + bias[j])
        act[gs + j] = fast_sigmoid(act[gs + j] + bias[gs + j])
        act[2 * gs + j] = fast_tanh(act[2 * gs + j] + bias[2 * gs + j])
        act[3 * gs + j] = fast_sigmoid(act[3 * gs + j] + bias[3 * gs + j])
    for j in range(w):
        c = act[gs + j] * c_row[j] + act[j] * act[2 * gs + j]
        c_row[j] = c
        out_row[j] = act[3 * gs + j] * fast_tanh(c)


cdef inline void backward_cell(
        Py_ssize_t w, Py_ssize_t gs, const floating *dh_row, const floating *c_prev,
        const floating *i_row, const floating *f_row, const floating *g_row,
        const floating *o_row, const floating *tc_row, floating_rp dc_row,
        floating_rp dg) noexcept nogil:
    """One row of ``w`` units of the backward: ``dh_row`` is the gradient reaching
    o * tanh(c_t) (dh_t, or with a projection dh_t W_hr); ``dc_row`` goes from dc_t (from
    step t+1) to dc_{t-1}; the four gate gradients go to ``dg`` (gate q at ``dg + q*gs``,
    order ``[i f g o]``). Short loops with few pointers each (one fused loop ran slower in
    float64). Multiplication order follows PyTorch's autograd formulas (tanh_backward,
    sigmoid_backward, mul_backward), so that overflow and NaN appear exactly where float64
    autograd has them."""
    cdef Py_ssize_t j
    cdef floating one = 1
    for j in range(w):  # dc = dh * o * (1 - tanh(c)^2) + dc_next
        dc_row[j] = (dh_row[j] * o_row[j]) * (one - tc_row[j] * tc_row[j]) + dc_row[j]
    for j in range(w):  # do
        dg[3 * gs + j] = (dh_row[j] * tc_row[j]) * (one - o_row[j]) * o_row[j]
    for j in range(w):  # di
        dg[j] = (dc_row[j] * g_row[j]) * (one - i_row[j]) * i_row[j]
    for j in range(w):  # dg
        dg[2 * gs + j] = (dc_row[j] * i_row[j]) * (one - g_row[j] * g_row[j])
    if floating is float:
        # df in double, rounded once: c_{t-1} is unbounded, so dc * c_{t-1} can pass
        # FLT_MAX where the whole product (f (1 - f) <= 1/4) does not; float64 autograd,
        # whose float32 rounding the float32 results follow, has no such intermediate.
        for j in range(w):
            dg[gs + j] = <float>((<double>dc_row[j] * c_prev[j]) * (1.0 - <double>f_row[j])
                                 * f_row[j])
    else:
        for j in range(w):  # df
            dg[gs + j] = (dc_row[j] * c_prev[j]) * (one - f_row[j]) * f_row[j]
    for j in range(w):  # dc_next = dc * f
        dc_row[j] = dc_row[j] * f_row[j]
