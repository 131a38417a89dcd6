"""Row-major GEMM on top of ``scipy.linalg.cython_blas``.

BLAS is column-major. A row-major matrix is the transpose of the same
memory read column-major, so ``C = op(A) @ op(B)`` in row-major is computed
as ``C^T = op(B)^T @ op(A)^T`` in column-major: swap the operands and their
dimensions, keep the transpose flags (the trick used by scikit-learn's
``_cython_blas``).
"""
from scipy.linalg.cython_blas cimport sgemm, dgemm


cdef void gemm(BLAS_Trans transa, BLAS_Trans transb, int m, int n, int k,
               floating alpha, const floating *a, int lda,
               const floating *b, int ldb,
               floating beta, floating *c, int ldc) noexcept nogil:
    """``C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C`` (row-major).

    Empty products are handled here rather than in BLAS: some BLAS builds
    reject leading dimensions of 0, and with ``k == 0`` the product is zero.
    """
    cdef char ta = <char>transa
    cdef char tb = <char>transb
    cdef Py_ssize_t row, col
    if m <= 0 or n <= 0:
        return
    if k <= 0:
        # op(A) @ op(B) is an empty sum; C = beta * C, and beta == 0 must not
        # read C (BLAS semantics: NaN in an uninitialised C is overwritten).
        for row in range(m):
            for col in range(n):
                if beta == 0:
                    c[row * ldc + col] = 0
                else:
                    c[row * ldc + col] = beta * c[row * ldc + col]
        return
    if floating is float:
        sgemm(&tb, &ta, &n, &m, &k, &alpha, <float *>b, &ldb,
              <float *>a, &lda, &beta, c, &ldc)
    else:
        dgemm(&tb, &ta, &n, &m, &k, &alpha, <double *>b, &ldb,
              <double *>a, &lda, &beta, c, &ldc)
