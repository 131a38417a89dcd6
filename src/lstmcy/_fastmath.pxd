# Branch-free exp, sigmoid and tanh for the forward's elementwise pass.
#
# libm's tanhf goes through expm1f, which dominated the forward in profiles and cannot be
# vectorised. These are written without calls or branches so that the compiler can inline
# and vectorise them, with fused multiply-adds where the build has them.
#
# Both activations take e = exp(-|x|) (tanh: exp(-2|x|)), which lies in [0, 1], and
# s = e / (1 + e) = sigmoid(-|x|), with a relative error of at most ~2 eps. Then sigmoid(x)
# is s for x < 0 and 1 - s for x >= 0, and tanh(|x|) is 1 - 2s (from |x| = 0.625 on; below,
# a polynomial). Near 1 the subtraction rounds once and the error of s is a small fraction
# of the result's ulp: |error| <= ulp/2 + 2 eps (1 - |result|), so the saturated ends are
# correctly rounded but for results that close to a tie. (The textbook 1 / (1 + exp(-x))
# rounds 1 + exp(-x) to a grid twice as coarse as the result's, and makes float32 sigmoid
# exactly 1 from x = 16.6 on instead of 17.3.) Special values are exact: sigmoid(+-inf) =
# 1 / 0, tanh(+-inf) = +-1, sigmoid(+-0) = 0.5, tanh(+-0) = +-0, and NaN propagates.
#
# In float64 the saturated ends are moved to PyTorch's, because there an exact 0 or 1
# decides whether an infinite factor in the backward ((1 - f) f times an infinite
# dc * c_{t-1}) gives NaN or Inf, and float64 autograd is the reference for which:
# sigmoid is exactly 1 from SIGMOID_ONE_FROM = 53 ln2 on (where 1 + exp(-x) rounds to 1),
# at least the smallest normal number above SIGMOID_NONZERO_FROM (where exp(-x) has not
# yet overflowed, so PyTorch's result is not 0; a subnormal would be flushed), and tanh
# is not 1 below tanh_one_from (PyTorch's tanh reaches 1 later than the correctly rounded
# one, by how much depends on the CPU: lstmcy/_engine/saturation.py gives the point, which
# the kernel module's set_tanh_one_from sets once per process at import). Each moves
# results by at most one ulp, or below the smallest normal number, and only within those
# windows; the end points were bisected on torch.sigmoid and torch.tanh (float64), and
# tests/test_nonfinite.py checks them against PyTorch.
#
# The exp serves only these, on arguments <= 0 (or NaN). Its 2**n is one factor built from
# bits; the argument is clamped at the bottom where that factor's biased exponent is 0, so
# the factor is +0 and results below ~1e-38 (float) / ~1e-308 (double) are 0 or a nearby
# subnormal: sigmoid's results that far below the normal range are never more than the
# smallest normal number off.
#
# Every operation is an IEEE operation of the build's vector unit (add, multiply, divide,
# fused multiply-add, compare and select, sign-bit logic) or integer arithmetic on the bits:
# each rounds alike at any vector width, so the AVX2 and AVX-512 builds give the same bits.
from cython cimport floating
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

cdef extern from *:
    """
    #include <string.h>
    #include <stdint.h>
    static inline float lstmcy_float_from_bits(int32_t bits) { float f; memcpy(&f, &bits, 4); return f; }
    static inline double lstmcy_double_from_bits(int64_t bits) { double d; memcpy(&d, &bits, 8); return d; }
    static inline uint32_t lstmcy_bits_of_float(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
    static inline uint64_t lstmcy_bits_of_double(double d) { uint64_t b; memcpy(&b, &d, 8); return b; }
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
    uint32_t bits_of_float "lstmcy_bits_of_float"(float f) noexcept nogil
    uint64_t bits_of_double "lstmcy_bits_of_double"(double d) noexcept nogil
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


cdef inline float _expf_nonpositive(float x) noexcept nogil:
    # Clamped at -88, where n = -127 and 2**n built from bits is +0. NaN fails the
    # comparison and passes on into the result.
    cdef float xc = <float>-88.0 if x < <float>-88.0 else x
    # n = round(x / ln2): adding 1.5 * 2**23 rounds to an integer, which then sits in the
    # low mantissa bits of shifted.
    cdef float shifted = _fma(xc, <float>1.44269504088896341, <float>12582912.0)
    cdef float n = shifted - <float>12582912.0
    # r = x - n ln2, ln2 in two parts (n * the first is exact).
    cdef float r = _fma(n, <float>-0.693359375, xc)
    r = _fma(n, <float>2.12194440e-4, r)
    cdef float r2 = r * r
    # Cephes expf's polynomial.
    cdef float p = _fma(<float>1.9875691500e-4, r, <float>1.3981999507e-3)
    p = _fma(p, r, <float>8.3334519073e-3)
    p = _fma(p, r, <float>4.1665795894e-2)
    p = _fma(p, r, <float>1.6666665459e-1)
    p = _fma(p, r, <float>5.0000001201e-1)
    p = _fma(p, r2, r) + <float>1.0
    # 2**n has the biased exponent n + 127 in bits 23-30: the shift keeps the low 9 bits of
    # shifted's bits + 127, which are those of n + 127 (0 to 127). Integer arithmetic on
    # the bits rather than a float-to-int conversion, which AVX2 lacks for doubles; for
    # NaN the bits are garbage, but p is NaN.
    return p * float_from_bits(<int32_t>((bits_of_float(shifted) + <uint32_t>127) << 23))


cdef inline double _exp_nonpositive(double x) noexcept nogil:
    # As _expf_nonpositive: clamped at -709, where n = -1023 and 2**n is +0.
    cdef double xc = -709.0 if x < -709.0 else x
    cdef double shifted = _fma(xc, 1.4426950408889634073599, 6755399441055744.0)
    cdef double n = shifted - 6755399441055744.0
    cdef double r = _fma(n, -6.93145751953125e-1, xc)
    r = _fma(n, -1.42860682030941723212e-6, r)
    cdef double r2 = r * r
    # Cephes exp's Pade approximant.
    cdef double px = r * _fma(_fma(1.26177193074810590878e-4, r2, 3.02994407707441961300e-2),
                              r2, 9.99999999999999999910e-1)
    cdef double qx = _fma(_fma(_fma(3.00198505138664455042e-6, r2, 2.52448340349684104192e-3),
                               r2, 2.27265548208155028766e-1), r2, 2.00000000000000000009e0)
    cdef double p = 1.0 + 2.0 * px / (qx - px)
    # Bits 52-62: the low 12 bits of shifted's bits + 1023, those of n + 1023 (0 to 1023).
    return p * double_from_bits(<int64_t>((bits_of_double(shifted) + <uint64_t>1023) << 52))


cdef inline floating _sigmoid_of_nonpositive(floating x) noexcept nogil:
    # sigmoid(x) = e / (1 + e), e = exp(x), for x <= 0: in [0, 1/2], relative error ~2 ulp.
    cdef floating e
    if floating is float:
        e = _expf_nonpositive(x)
    else:
        e = _exp_nonpositive(x)
    return e / (<floating>1 + e)


cdef extern from *:
    """
    #define LSTMCY_SIGMOID_ONE_FROM 36.73680056967711     /* the first double above 53 ln2 */
    #define LSTMCY_SIGMOID_NONZERO_FROM -709.782712893384  /* exp(-x) is finite from here */
    /* PyTorch's float64 tanh is 1 from here on: set at import (set_tanh_one_from) */
    static double lstmcy_tanh_one_from = 19.061547465468465;
    static inline void lstmcy_set_tanh_one_from(double x) { lstmcy_tanh_one_from = x; }
    #define LSTMCY_SMALLEST_NORMAL 2.2250738585072014e-308
    #define LSTMCY_BELOW_ONE 0.99999999999999988898        /* 1 - 2**-53 */
    """
    const double SIGMOID_ONE_FROM "LSTMCY_SIGMOID_ONE_FROM"
    const double SIGMOID_NONZERO_FROM "LSTMCY_SIGMOID_NONZERO_FROM"
    double tanh_one_from "lstmcy_tanh_one_from"
    void set_tanh_one_from "lstmcy_set_tanh_one_from"(double x) noexcept nogil
    const double SMALLEST_NORMAL "LSTMCY_SMALLEST_NORMAL"
    const double BELOW_ONE "LSTMCY_BELOW_ONE"


cdef inline floating fast_sigmoid(floating x) noexcept nogil:
    cdef floating s = _sigmoid_of_nonpositive(-fabs_(x))
    if floating is double:  # PyTorch's saturated ends (see the top of this file)
        s = 0.0 if x >= SIGMOID_ONE_FROM else s
        s = (SMALLEST_NORMAL if x < 0 and x >= SIGMOID_NONZERO_FROM and s < SMALLEST_NORMAL
             else s)
    # NaN fails the comparisons and keeps s (NaN); -0 takes 1 - s = 0.5 like +0.
    return <floating>1 - s if x >= 0 else s


cdef inline floating fast_tanh(floating x) noexcept nogil:
    # Computed for |x|, the sign copied back at the end (tanh is odd).
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
    # Otherwise tanh(|x|) = 1 - 2 sigmoid(-2|x|), which reaches exactly 1 where the
    # correctly rounded value does.
    large = <floating>1 - <floating>2 * _sigmoid_of_nonpositive(-(ax + ax))
    if floating is double:  # PyTorch's tanh is not yet 1 (see the top of this file)
        large = BELOW_ONE if large == 1.0 and ax < tanh_one_from else large
    # NaN fails the comparison and takes the large branch, which propagates it.
    return copysign_(small if ax < <floating>0.625 else large, x)
