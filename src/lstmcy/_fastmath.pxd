# Branch-free exp, sigmoid and tanh for the forward's elementwise pass.
#
# libm's tanhf goes through expm1f, which dominated the forward in profiles and cannot be
# vectorised. These are the Cephes algorithms (range reduction + polynomial or Pade
# approximant, accurate to ~1-2 ulp), written without calls or branches so that the
# compiler can inline and vectorise them, with fused multiply-adds where the build has
# them. Special values are exact: sigmoid(+-inf) = 1 / 0 and tanh(+-inf) = +-1, as in
# PyTorch, and NaN propagates.
#
# The exp serves only these two, which never need a result below the normal range: in
# 1 / (1 + exp(-x)) such a value vanishes next to 1, and tanh takes exp(2|x|) >= 1. So
# the argument is clamped at the bottom where 2**n is still normal, and 2**n is one
# factor built from bits. At the top it becomes inf a little early (from x = 88.38, or
# 709.44 in double), which only turns sigmoid's subnormal results (below 4e-39, 1e-308)
# into 0.
from cython cimport floating
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

cdef extern from *:
    """
    #include <string.h>
    #include <stdint.h>
    static inline float lstmcy_float_from_bits(int32_t bits) { float f; memcpy(&f, &bits, 4); return f; }
    static inline double lstmcy_double_from_bits(int64_t bits) { double d; memcpy(&d, &bits, 8); return d; }
    /* a * b + c, fused where the build has FMA (one rounding: identical in the AVX2 and
       AVX-512 builds), two roundings otherwise; setup.py's -ffp-contract=off keeps the
       compiler from fusing anything else. */
    #if defined(__FMA__)
    #define lstmcy_fmaf(a, b, c) __builtin_fmaf((a), (b), (c))
    #define lstmcy_fmad(a, b, c) __builtin_fma((a), (b), (c))
    #else
    static inline float lstmcy_fmaf(float a, float b, float c) { return a * b + c; }
    static inline double lstmcy_fmad(double a, double b, double c) { return a * b + c; }
    #endif
    """
    float float_from_bits "lstmcy_float_from_bits"(int32_t bits) noexcept nogil
    double double_from_bits "lstmcy_double_from_bits"(int64_t bits) noexcept nogil
    float fmaf "lstmcy_fmaf"(float a, float b, float c) noexcept nogil
    double fmad "lstmcy_fmad"(double a, double b, double c) noexcept nogil
    float fabsf "__builtin_fabsf"(float x) noexcept nogil
    double fabs "__builtin_fabs"(double x) noexcept nogil
    float copysignf "__builtin_copysignf"(float x, float y) noexcept nogil
    double copysign "__builtin_copysign"(double x, double y) noexcept nogil


cdef inline floating _fma(floating a, floating b, floating c) noexcept nogil:
    if floating is float:
        return fmaf(a, b, c)
    else:
        return fmad(a, b, c)


cdef inline floating fabs_(floating x) noexcept nogil:
    if floating is float:
        return fabsf(x)
    else:
        return fabs(x)


cdef inline floating copysign_(floating x, floating y) noexcept nogil:
    if floating is float:
        return copysignf(x, y)
    else:
        return copysign(x, y)


cdef inline float _expf(float x) noexcept nogil:
    # Clamp so that 2**n stays normal (n >= -126) or is inf (n = 128); written so that
    # NaN passes through both comparisons and on into the result.
    cdef float xc = <float>89.0 if x > <float>89.0 else x
    xc = <float>-87.0 if xc < <float>-87.0 else xc
    # n = round(x / ln2) with the 1.5 * 2**23 trick (exact, vectorisable).
    cdef float n = _fma(xc, <float>1.44269504088896341, <float>12582912.0) - <float>12582912.0
    # r = x - n ln2, ln2 in two parts (n * the first is exact).
    cdef float r = _fma(n, <float>-0.693359375, xc)
    r = _fma(n, <float>2.12194440e-4, r)
    cdef float r2 = r * r
    cdef float p = _fma(<float>1.9875691500e-4, r, <float>1.3981999507e-3)
    p = _fma(p, r, <float>8.3334519073e-3)
    p = _fma(p, r, <float>4.1665795894e-2)
    p = _fma(p, r, <float>1.6666665459e-1)
    p = _fma(p, r, <float>5.0000001201e-1)
    p = _fma(p, r2, r) + <float>1.0
    # Shifted as unsigned: for NaN the conversion gives INT_MIN (the product is NaN
    # anyway), and shifting a negative int is undefined in C.
    return p * float_from_bits(<int32_t>(<uint32_t>(<int32_t>n + 127) << 23))


cdef inline double _exp(double x) noexcept nogil:
    # As _expf: 2**n normal (n >= -1022) or inf (n = 1024).
    cdef double xc = 710.0 if x > 710.0 else x
    xc = -708.0 if xc < -708.0 else xc
    cdef double n = _fma(xc, 1.4426950408889634073599, 6755399441055744.0) - 6755399441055744.0
    cdef double r = _fma(n, -6.93145751953125e-1, xc)
    r = _fma(n, -1.42860682030941723212e-6, r)
    cdef double r2 = r * r
    cdef double px = r * _fma(_fma(1.26177193074810590878e-4, r2, 3.02994407707441961300e-2),
                              r2, 9.99999999999999999910e-1)
    cdef double qx = _fma(_fma(_fma(3.00198505138664455042e-6, r2, 2.52448340349684104192e-3),
                               r2, 2.27265548208155028766e-1), r2, 2.00000000000000000009e0)
    cdef double p = 1.0 + 2.0 * px / (qx - px)
    return p * double_from_bits(<int64_t>(<uint64_t>(<int64_t>n + 1023) << 52))


cdef inline floating activation_exp(floating x) noexcept nogil:
    # exp for sigmoid and tanh only: see the top of this file for what it leaves out.
    if floating is float:
        return _expf(x)
    else:
        return _exp(x)


cdef inline floating fast_sigmoid(floating x) noexcept nogil:
    # PyTorch's formula: 1 / (1 + exp(-x)).
    cdef floating one = 1
    return one / (one + activation_exp(-x))


cdef inline floating fast_tanh(floating x) noexcept nogil:
    # Computed for |x|, the sign copied back at the end (tanh is odd).
    cdef floating one = 1
    cdef floating ax = fabs_(x)
    cdef floating z = x * x
    cdef floating small, large
    if floating is float:
        # |x| < 0.625: odd polynomial (Cephes tanhf).
        small = _fma(<float>-5.70498872745e-3, z, <float>2.06390887954e-2)
        small = _fma(small, z, <float>-5.37397155531e-2)
        small = _fma(small, z, <float>1.33314422036e-1)
        small = _fma(small, z, <float>-3.33332819422e-1)
        small = _fma(small * z, ax, ax)
    else:
        # |x| < 0.625: rational approximation (Cephes tanh).
        small = _fma(ax * z, _fma(_fma(-9.64399179425052238628e-1, z, -9.92877231001918586564e1),
                                  z, -1.61468768441708447952e3)
                     / _fma(_fma(z + 1.12811678491632931402e2, z, 2.23548839060100448583e3),
                            z, 4.84406305325125486048e3), ax)
    # Otherwise 1 - 2 / (exp(2|x|) + 1), which saturates to exactly 1 for large |x|.
    large = one - <floating>2 / (activation_exp(ax + ax) + one)
    # NaN fails the comparison and takes the large branch, which propagates it.
    return copysign_(small if ax < <floating>0.625 else large, x)
