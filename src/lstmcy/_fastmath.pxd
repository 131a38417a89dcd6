# Branch-free exp, sigmoid and tanh for the forward's elementwise pass.
#
# libm's tanhf goes through expm1f, which dominated the forward in profiles and cannot be
# vectorised. These are the Cephes algorithms (range reduction + polynomial or Pade
# approximant, accurate to ~1-2 ulp), written without calls or branches so that the
# compiler can inline and vectorise them. Special values are exact: exp(-inf) = 0,
# exp(+inf) = inf, overflow gives inf, underflow 0, NaN propagates; hence
# sigmoid(+-inf) = 1 / 0 and tanh(+-inf) = +-1, as in PyTorch.
from cython cimport floating
from libc.stdint cimport int32_t, int64_t

cdef extern from *:
    """
    #include <string.h>
    #include <stdint.h>
    static inline float lstmcy_float_from_bits(int32_t bits) { float f; memcpy(&f, &bits, 4); return f; }
    static inline double lstmcy_double_from_bits(int64_t bits) { double d; memcpy(&d, &bits, 8); return d; }
    """
    float float_from_bits "lstmcy_float_from_bits"(int32_t bits) noexcept nogil
    double double_from_bits "lstmcy_double_from_bits"(int64_t bits) noexcept nogil


cdef inline float _expf(float x) noexcept nogil:
    # Clamp so the integer exponent stays in range; beyond it the result is inf or 0 anyway.
    cdef float xc = x if x < <float>89.0 else <float>89.0
    xc = xc if xc > <float>-104.0 else <float>-104.0
    # n = round(x / ln2) with the 1.5 * 2**23 trick (exact, vectorisable).
    cdef float n = (xc * <float>1.44269504088896341 + <float>12582912.0) - <float>12582912.0
    cdef float r = xc - n * <float>0.693359375 - n * <float>-2.12194440e-4
    cdef float r2 = r * r
    cdef float p = ((((<float>1.9875691500e-4 * r + <float>1.3981999507e-3) * r
                      + <float>8.3334519073e-3) * r + <float>4.1665795894e-2) * r
                    + <float>1.6666665459e-1) * r + <float>5.0000001201e-1
    p = p * r2 + r + <float>1.0
    # 2**n as two normal factors, so that results in the subnormal range round correctly.
    cdef int32_t ni = <int32_t>n
    cdef int32_t n1 = ni >> 1
    cdef int32_t n2 = ni - n1
    p = p * float_from_bits((n1 + 127) << 23) * float_from_bits((n2 + 127) << 23)
    return p if x == x else x


cdef inline double _exp(double x) noexcept nogil:
    cdef double xc = x if x < 710.0 else 710.0
    xc = xc if xc > -746.0 else -746.0
    cdef double n = (xc * 1.4426950408889634073599 + 6755399441055744.0) - 6755399441055744.0
    cdef double r = xc - n * 6.93145751953125e-1 - n * 1.42860682030941723212e-6
    cdef double r2 = r * r
    cdef double px = r * ((1.26177193074810590878e-4 * r2 + 3.02994407707441961300e-2) * r2
                          + 9.99999999999999999910e-1)
    cdef double qx = ((3.00198505138664455042e-6 * r2 + 2.52448340349684104192e-3) * r2
                      + 2.27265548208155028766e-1) * r2 + 2.00000000000000000009e0
    cdef double p = 1.0 + 2.0 * px / (qx - px)
    cdef int64_t ni = <int64_t>n
    cdef int64_t n1 = ni >> 1
    cdef int64_t n2 = ni - n1
    p = p * double_from_bits((n1 + 1023) << 52) * double_from_bits((n2 + 1023) << 52)
    return p if x == x else x


cdef inline floating fast_exp(floating x) noexcept nogil:
    if floating is float:
        return _expf(x)
    else:
        return _exp(x)


cdef inline floating fast_sigmoid(floating x) noexcept nogil:
    # PyTorch's formula: 1 / (1 + exp(-x)).
    cdef floating one = 1
    return one / (one + fast_exp(-x))


cdef inline floating fast_tanh(floating x) noexcept nogil:
    cdef floating one = 1
    cdef floating ax = x if x >= 0 else -x
    cdef floating z = x * x
    cdef floating small, large
    if floating is float:
        # |x| < 0.625: odd polynomial (Cephes tanhf).
        small = ((((<float>-5.70498872745e-3 * z + <float>2.06390887954e-2) * z
                   - <float>5.37397155531e-2) * z + <float>1.33314422036e-1) * z
                 - <float>3.33332819422e-1) * z * x + x
    else:
        # |x| < 0.625: rational approximation (Cephes tanh).
        small = x + x * z * (((-9.64399179425052238628e-1 * z - 9.92877231001918586564e1) * z
                              - 1.61468768441708447952e3)
                             / (((z + 1.12811678491632931402e2) * z + 2.23548839060100448583e3) * z
                                + 4.84406305325125486048e3))
    # Otherwise 1 - 2 / (exp(2|x|) + 1), which saturates to exactly 1 for large |x|.
    large = one - <floating>2 / (fast_exp(ax + ax) + one)
    large = large if x >= 0 else -large
    # NaN fails both comparisons and takes the large branch, which propagates it.
    return small if ax < <floating>0.625 else large
