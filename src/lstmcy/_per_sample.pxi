# Per-sample weight gradients: each sequence's sum over its own steps of the products the
# weight gradient sums over all rows (lstmcy.torch's DP-SGD grad samplers).
#
#     out[b] = scale * (first_grads[b]^T first_values[b]                 (optional)
#                       + sum_k grads[k, b]^T values[k, b])
#     bias[b] = scale * sum_k grads[k, b]                                  (optional)
#
# grads [K, B, G], values [K, B, F], first_grads [B, G], first_values [B, F], out [B, G, F],
# bias [B, G]; the first two dimensions of grads and values may have any strides (views of
# the backward's work buffers, or states shifted by one step), the last is contiguous.
#
# Design
# ------
# A sample's product is a small GEMM (G = 4H rows, F columns, K = T steps), one a sample.
# Here a task is one sample, on lstmcy's pool (or on torch's OpenMP threads, for
# lstmcy.torch's calls): it copies the sample's gradient rows together (their bias sum on
# the way) and packs its values times the scale (K x F multiplications, not G x F) into
# its worker's scratch (pack, as for the weight gradients), and runs gemm_tn (each tile of
# the result in registers over all K steps), writing the result where the caller wants it
# (the result memory). The inputs are read in place, strided views of the backward's work
# buffers included. Samples are independent and each is computed the same way whatever
# the thread count, so the results are bitwise identical for every count. The outputs may
# overlap no input: a sample's results are written while other samples' inputs are read.
# At (T, B, I, H) = (50, 64, 32, 128) the writes of the results (21 MB) bound the products
# (docs/torch.md, "Speed").

cdef struct PerSampleCall:
    Py_ssize_t K, B, G, F
    const char *grads           # [K, B, G]: element strides grads_k, grads_b
    Py_ssize_t grads_k, grads_b
    const char *values          # [K, B, F]: element strides values_k, values_b
    Py_ssize_t values_k, values_b
    const char *first_grads     # [B, G] (NULL: no first term), row stride first_grads_b
    Py_ssize_t first_grads_b
    const char *first_values    # [B, F], row stride first_values_b
    Py_ssize_t first_values_b
    char *out                   # [B, G, F], C-contiguous
    char *bias                  # [B, G], C-contiguous (NULL: not wanted)
    double scale
    char *packed                # scratch_elements a worker: packed values, a sample's rows
    Py_ssize_t packed_elements  # of which the packed values (the rows follow)
    Py_ssize_t scratch_elements
    int next_sample


cdef inline void _scale(floating *x, Py_ssize_t n, floating scale) noexcept nogil:
    """``x[:n] *= scale`` (nothing when scale is 1)."""
    cdef Py_ssize_t e
    if scale != 1:
        for e in range(n):
            x[e] = x[e] * scale


cdef void _sample_products(const PerSampleCall *ps, floating *like, Py_ssize_t b,
                           floating *packed, floating *rows) noexcept nogil:
    """``out[b]`` and ``bias[b]`` of one sample (``packed``, ``rows``: the worker's
    scratch for the packed values and the sample's gradient rows)."""
    cdef Py_ssize_t G = ps.G, F = ps.F, K = ps.K, k, g
    cdef floating *out = <floating *>ps.out + b * G * F
    cdef floating *bias = NULL
    cdef const floating *grads = <const floating *>ps.grads + b * ps.grads_b
    cdef floating *row
    cdef floating scale = <floating>ps.scale
    cdef bint started = False
    # The sample's rows, contiguous: in place they lie B rows apart, a stride that is a
    # multiple of 4 KiB when B * G is, so that all K of them share a set of each cache.
    for k in range(K):
        memcpy(rows + k * G, grads + k * ps.grads_k, G * sizeof(floating))
    if ps.bias != NULL:
        bias = <floating *>ps.bias + b * G
        memset(bias, 0, G * sizeof(floating))
        for k in range(K):
            row = rows + k * G
            for g in range(G):
                bias[g] = bias[g] + row[g]
        for g in range(G):
            bias[g] = bias[g] * scale
    if ps.first_grads != NULL and F > 0:
        pack(<const floating *>ps.first_values + b * ps.first_values_b, F, False, 1, 0, F,
             packed)
        _scale(packed, packed_len(F, 1, packed), scale)
        gemm_tn(G, F, 1, <const floating *>ps.first_grads + b * ps.first_grads_b, G, packed,
                out, F, False)
        started = True
    if K > 0 and F > 0:
        pack(<const floating *>ps.values + b * ps.values_b, ps.values_k, False, K, 0, F, packed)
        _scale(packed, packed_len(F, K, packed), scale)
        gemm_tn(G, F, K, rows, G, packed, out, F, started)
        started = True
    if not started:
        memset(out, 0, G * F * sizeof(floating))


cdef void _per_sample_worker(PerSampleCall *ps, floating *like, int worker) noexcept nogil:
    """One thread's part: samples in order until none is left."""
    cdef int b
    cdef floating *packed = <floating *>ps.packed + worker * ps.scratch_elements
    while True:
        b = take_next(&ps.next_sample)
        if b >= ps.B:
            break
        _sample_products(ps, like, b, packed, packed + ps.packed_elements)


cdef void _per_sample_job_float(void *ctx, int worker, int n_workers) noexcept nogil:
    _per_sample_worker(<PerSampleCall *>ctx, <float *>NULL, worker)


cdef void _per_sample_job_double(void *ctx, int worker, int n_workers) noexcept nogil:
    _per_sample_worker(<PerSampleCall *>ctx, <double *>NULL, worker)


cdef Py_ssize_t _element_stride(object array, int axis, Py_ssize_t itemsize, str name) except -1:
    """``array.strides[axis]`` in elements (a non-negative multiple of the item size; 0 for
    an axis of one element or an empty array, whose strides numpy leaves free)."""
    cdef Py_ssize_t stride = array.strides[axis]
    if array.shape[axis] <= 1 or array.size == 0:
        return 0
    if stride < 0 or stride % itemsize:
        raise ValueError(f"{name}: stride {stride} of axis {axis} is not a non-negative "
                         f"multiple of the item size {itemsize}")
    return stride // itemsize


cdef const char *_strided_data(object array, tuple shape, object dtype, str name) except NULL:
    """The data of ``array`` (an ndarray of ``dtype`` and ``shape``, its last axis
    contiguous, aligned), or a ValueError naming ``name``."""
    if not isinstance(array, np.ndarray) or array.dtype != dtype:
        raise ValueError(f"{name}: expected an ndarray of {np.dtype(dtype)}, got "
                         f"{getattr(array, 'dtype', type(array).__name__)}")
    if array.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {array.shape}")
    if not array.flags.aligned:
        raise ValueError(f"{name}: expected aligned data")
    cdef Py_ssize_t last = len(shape) - 1  # (the kernels are compiled without wraparound)
    if array.size and shape[last] > 1 and array.strides[last] != array.itemsize:
        raise ValueError(f"{name}: expected a contiguous last axis")
    return <const char *><size_t>array.__array_interface__["data"][0]


cdef _check_output(a, str name):
    """Raise ValueError unless ``a`` is an ndarray the kernels may write as it lies."""
    if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError(f"{name}: expected a writeable C-contiguous ndarray")


def per_sample_products(grads, values, out, double scale, int n_threads, first_grads=None,
                        first_values=None, bias=None, bint flush_denormals=True):
    """Per-sample sums of products: ``out[b] = scale * (first_grads[b]^T first_values[b] +
    sum_k grads[k, b]^T values[k, b])`` and ``bias[b] = scale * sum_k grads[k, b]``.

    Parameters
    ----------
    grads : ndarray [K, B, G]
        float32 or float64; the last axis contiguous, the others any non-negative strides.
    values : ndarray [K, B, F]
        Same dtype and layout rules.
    out : ndarray [B, G, F]
        C-contiguous, written; overlapping no other argument.
    scale : float
    n_threads : int
        Threads of lstmcy's pool (the results do not depend on it).
    first_grads, first_values : ndarray [B, G] and [B, F], or None
        A first term of each sum (both or neither; rows contiguous).
    bias : ndarray [B, G] or None
        C-contiguous, written; overlapping no other argument.
    flush_denormals : bool
        Subnormal numbers flushed to zero during the call (lstmcy._engine.fpmode).
    """
    if not isinstance(grads, np.ndarray) or grads.ndim != 3:
        raise ValueError("grads: expected an ndarray [K, B, G]")
    dtype = grads.dtype
    if dtype != np.float32 and dtype != np.float64:
        raise ValueError(f"grads: expected float32 or float64, got {dtype}")
    if not isinstance(values, np.ndarray) or values.ndim != 3:
        raise ValueError("values: expected an ndarray [K, B, F]")
    cdef Py_ssize_t K = grads.shape[0], B = grads.shape[1], G = grads.shape[2]
    cdef Py_ssize_t F = values.shape[2], itemsize = dtype.itemsize
    cdef PerSampleCall ps
    memset(&ps, 0, sizeof(ps))
    ps.grads = _strided_data(grads, (K, B, G), dtype, "grads")
    ps.values = _strided_data(values, (K, B, F), dtype, "values")
    _check_output(out, "out")
    ps.out = <char *>_strided_data(out, (B, G, F), dtype, "out")
    if (first_grads is None) != (first_values is None):
        raise ValueError("first_grads and first_values: give both or neither")
    if first_grads is not None:
        ps.first_grads = _strided_data(first_grads, (B, G), dtype, "first_grads")
        ps.first_values = _strided_data(first_values, (B, F), dtype, "first_values")
        ps.first_grads_b = _element_stride(first_grads, 0, itemsize, "first_grads")
        ps.first_values_b = _element_stride(first_values, 0, itemsize, "first_values")
    if bias is not None:
        _check_output(bias, "bias")
        ps.bias = <char *>_strided_data(bias, (B, G), dtype, "bias")
    # The outputs are written while other samples' inputs are still read.
    for name, written in (("out", out), ("bias", bias)):
        for other_name, other in (("grads", grads), ("values", values),
                                  ("first_grads", first_grads),
                                  ("first_values", first_values), ("out", out)):
            if (written is not None and other is not None and other is not written
                    and np.may_share_memory(written, other)):
                raise ValueError(f"{name}: overlaps {other_name}")
    if B == 0 or G == 0 or (F == 0 and bias is None):
        return  # (F == 0 with a bias: the bias sums only)
    ps.K, ps.B, ps.G, ps.F = K, B, G, F
    ps.grads_k = _element_stride(grads, 0, itemsize, "grads")
    ps.grads_b = _element_stride(grads, 1, itemsize, "grads")
    ps.values_k = _element_stride(values, 0, itemsize, "values")
    ps.values_b = _element_stride(values, 1, itemsize, "values")
    ps.scale = scale
    n_threads = max(1, min(n_threads, B))
    # A worker's scratch: the packed values, then (a multiple of 64 bytes on) the rows.
    cdef Py_ssize_t line = 64 // itemsize
    ps.packed_elements = (_packed(max(F, 1), max(K, 1), itemsize == 8) + line - 1) // line * line
    ps.scratch_elements = (ps.packed_elements + K * G + line - 1) // line * line
    packed = np.empty(n_threads * ps.scratch_elements, dtype=dtype)
    ps.packed = <char *><size_t>packed.__array_interface__["data"][0]
    with nogil:
        run_job(n_threads, _per_sample_job_float if itemsize == 4 else _per_sample_job_double,
                <void *>&ps, flush_denormals)
