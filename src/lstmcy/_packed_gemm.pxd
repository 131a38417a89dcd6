# The per-step recurrent products against a matrix packed once per call (see
# _packed_gemm.h), as fused float/double functions for the kernels.
from cython cimport floating

cdef extern from "_packed_gemm.h" nogil:
    void pg_s_pack(const float *w, Py_ssize_t ldw, int trans, Py_ssize_t K, Py_ssize_t n0,
                   Py_ssize_t n, float *out)
    void pg_d_pack(const double *w, Py_ssize_t ldw, int trans, Py_ssize_t K, Py_ssize_t n0,
                   Py_ssize_t n, double *out)
    void pg_s_gemm(Py_ssize_t M, Py_ssize_t n, Py_ssize_t K, const float *a, Py_ssize_t lda,
                   const float *packed, float *c, Py_ssize_t ldc, int accumulate)
    void pg_d_gemm(Py_ssize_t M, Py_ssize_t n, Py_ssize_t K, const double *a, Py_ssize_t lda,
                   const double *packed, double *c, Py_ssize_t ldc, int accumulate)
    void pg_s_gemm2(Py_ssize_t M, Py_ssize_t n, Py_ssize_t K, const float *a, Py_ssize_t lda,
                    const float *packed, Py_ssize_t K2, const float *a2, Py_ssize_t lda2,
                    const float *packed2, float *c, Py_ssize_t ldc, int accumulate)
    void pg_d_gemm2(Py_ssize_t M, Py_ssize_t n, Py_ssize_t K, const double *a, Py_ssize_t lda,
                    const double *packed, Py_ssize_t K2, const double *a2, Py_ssize_t lda2,
                    const double *packed2, double *c, Py_ssize_t ldc, int accumulate)
    void pg_s_gemm_tn(Py_ssize_t M, Py_ssize_t n, Py_ssize_t K, const float *a, Py_ssize_t lda,
                      const float *packed, float *c, Py_ssize_t ldc, int accumulate)
    void pg_d_gemm_tn(Py_ssize_t M, Py_ssize_t n, Py_ssize_t K, const double *a, Py_ssize_t lda,
                      const double *packed, double *c, Py_ssize_t ldc, int accumulate)
    Py_ssize_t pg_s_packed_len(Py_ssize_t n, Py_ssize_t K)
    Py_ssize_t pg_d_packed_len(Py_ssize_t n, Py_ssize_t K)
    void pg_set_tn_rows_in_place(int on)


cdef inline void pack(const floating *w, Py_ssize_t ldw, bint trans, Py_ssize_t K,
                      Py_ssize_t n0, Py_ssize_t n, floating *out) noexcept nogil:
    """Pack columns ``[n0, n0 + n)`` of ``op(W)`` (``W^T`` when ``trans``; ``K`` rows) into
    ``out`` in panels; a panel's columns and their place in ``out`` depend only on the
    panel's index, so pieces of the columns may be packed apart (see panel_width)."""
    if floating is float:
        pg_s_pack(w, ldw, trans, K, n0, n, out)
    else:
        pg_d_pack(w, ldw, trans, K, n0, n, out)


cdef inline void packed_gemm(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, const floating *a,
                             Py_ssize_t lda, const floating *packed, floating *c,
                             Py_ssize_t ldc, bint accumulate) noexcept nogil:
    """``C[m, n] = A[m, k] @ P[k, n]`` (``+=`` when ``accumulate``), P packed by ``pack``.
    A row's result does not depend on the other rows of the call, nor a column's on the
    other columns: calls may split the rows or the columns any way. Empty products are
    the caller's to skip."""
    if floating is float:
        pg_s_gemm(m, n, k, a, lda, packed, c, ldc, accumulate)
    else:
        pg_d_gemm(m, n, k, a, lda, packed, c, ldc, accumulate)


cdef inline void packed_gemm2(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, const floating *a,
                              Py_ssize_t lda, const floating *packed, Py_ssize_t k2,
                              const floating *a2, Py_ssize_t lda2, const floating *packed2,
                              floating *c, Py_ssize_t ldc) noexcept nogil:
    """``C[m, n] = A[m, k] @ P[k, n] + A2[m, k2] @ P2[k2, n]``, both packed by ``pack``:
    each element one running sum over the first product's terms, then the second's. As
    :func:`packed_gemm`, calls may split the rows or the columns any way."""
    if floating is float:
        pg_s_gemm2(m, n, k, a, lda, packed, k2, a2, lda2, packed2, c, ldc, False)
    else:
        pg_d_gemm2(m, n, k, a, lda, packed, k2, a2, lda2, packed2, c, ldc, False)


cdef inline void gemm_tn(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, const floating *a,
                         Py_ssize_t lda, const floating *packed, floating *c, Py_ssize_t ldc,
                         bint accumulate) noexcept nogil:
    """``C[m, n] = A[k, m]^T @ P[k, n]`` (``C +`` that when ``accumulate``), A row-major as
    it lies, P packed by ``pack`` (not transposed): the weight gradients, dW += dgates^T z.
    Each element is a running sum from C (or 0) over k in increasing order, so calls may
    split the rows, the columns or k (accumulating) any way and give the same bits."""
    if floating is float:
        pg_s_gemm_tn(m, n, k, a, lda, packed, c, ldc, accumulate)
    else:
        pg_d_gemm_tn(m, n, k, a, lda, packed, c, ldc, accumulate)


cdef inline Py_ssize_t packed_len(Py_ssize_t n, Py_ssize_t k, floating *like) noexcept nogil:
    """Elements a ``[k, n]`` matrix takes once packed, for the type of ``like``."""
    if floating is float:
        return pg_s_packed_len(n, k)
    else:
        return pg_d_packed_len(n, k)


cdef inline Py_ssize_t panel_width(floating *like) noexcept nogil:
    """Columns of one packed panel (the panel of columns ``[p*w, (p+1)*w)`` starts at
    element ``p * w * k`` of the packed matrix)."""
    return packed_len(1, 1, like)
