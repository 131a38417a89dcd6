# The one BLAS entry point the kernels use: a row-major GEMM over fused float/double.
from cython cimport floating


cpdef enum BLAS_Trans:
    NoTrans = 110  # ord('n')
    Trans = 116    # ord('t')


cdef void gemm(BLAS_Trans transa, BLAS_Trans transb, int m, int n, int k,
               floating alpha, const floating *a, int lda,
               const floating *b, int ldb,
               floating beta, floating *c, int ldc) noexcept nogil
