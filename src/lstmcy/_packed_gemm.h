/* GEMM against a matrix packed once: the per-step recurrent products of the LSTM
   (gates += h @ W_hh^T forward, or gates = x @ W_ih^T + h @ W_hh^T in one product;
   dh = dgates @ W_hh backward), and the weight gradients (dW += dgates^T [x | h] over a
   chunk of rows).

   OpenBLAS packs both operands on every call; for these GEMMs (few rows, W_hh of up to
   megabytes, T calls in a row) the packing costs as much as the multiply. Here W_hh is
   packed into column panels once per call and each step runs only the register-blocked
   multiply. Likewise a chunk's [x | h] rows are laid out in panels once, and every block
   of gate rows multiplies them from there (gemm_tn), where each BLAS call would pack them
   again. Every element is summed over k in increasing order with one (fused, where the
   build has FMA) multiply-add per term, so the AVX2 and AVX-512 builds give bitwise
   identical results; the portable build (no FMA) rounds each product separately (setup.py
   compiles with -ffp-contract=off, which keeps the compiler from fusing acc + a * b).

   Functions per type (pg_s_* float, pg_d_* double): pack, gemm, gemm2 (the sum of two
   products) and gemm_tn, plus packed_len(n, K), the elements a packed n-column matrix
   takes. */
#ifndef LSTMCY_PACKED_GEMM_H
#define LSTMCY_PACKED_GEMM_H
#include <stddef.h>
#include <string.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#if defined(__AVX512F__)
#define PG_MR_ 12 /* 24 accumulators of the 32 zmm registers */
#define PG_VF __m512
#define PG_VD __m512d
#define PG_PS(op) _mm512_##op##_ps
#define PG_PD(op) _mm512_##op##_pd
#else
#define PG_MR_ 6  /* 12 accumulators of the 16 ymm registers */
#define PG_VF __m256
#define PG_VD __m256d
#define PG_PS(op) _mm256_##op##_ps
#define PG_PD(op) _mm256_##op##_pd
#endif
#define PG_VLF ((int)(sizeof(PG_VF) / sizeof(float)))
#define PG_VLD ((int)(sizeof(PG_VD) / sizeof(double)))
#define PG_LOADF(p) PG_PS(loadu)(p)
#define PG_LOADD(p) PG_PD(loadu)(p)
#define PG_STOREF(p, v) PG_PS(storeu)(p, v)
#define PG_STORED(p, v) PG_PD(storeu)(p, v)
#define PG_SET1F(x) PG_PS(set1)(x)
#define PG_SET1D(x) PG_PD(set1)(x)
#define PG_ZEROF() PG_PS(setzero)()
#define PG_ZEROD() PG_PD(setzero)()
#define PG_ADDF(a, b) PG_PS(add)(a, b)
#define PG_ADDD(a, b) PG_PD(add)(a, b)
#define PG_MULADDF(acc, a, b) PG_PS(fmadd)(a, b, acc)
#define PG_MULADDD(acc, a, b) PG_PD(fmadd)(a, b, acc)
#else
/* Portable: GCC/Clang vector extensions (SSE2, NEON, ...), multiply then add. */
#define PG_MR_ 6
typedef float lstmcy_pg_vf __attribute__((vector_size(16)));
typedef double lstmcy_pg_vd __attribute__((vector_size(16)));
#define PG_VF lstmcy_pg_vf
#define PG_VD lstmcy_pg_vd
#define PG_VLF 4
#define PG_VLD 2
static inline PG_VF lstmcy_pg_loadf(const float *p) { PG_VF v; memcpy(&v, p, sizeof v); return v; }
static inline PG_VD lstmcy_pg_loadd(const double *p) { PG_VD v; memcpy(&v, p, sizeof v); return v; }
#define PG_LOADF(p) lstmcy_pg_loadf(p)
#define PG_LOADD(p) lstmcy_pg_loadd(p)
#define PG_STOREF(p, v) do { PG_VF v_ = (v); memcpy((p), &v_, sizeof v_); } while (0)
#define PG_STORED(p, v) do { PG_VD v_ = (v); memcpy((p), &v_, sizeof v_); } while (0)
#define PG_SET1F(x) ((PG_VF){(x), (x), (x), (x)})
#define PG_SET1D(x) ((PG_VD){(x), (x)})
#define PG_ZEROF() ((PG_VF){0, 0, 0, 0})
#define PG_ZEROD() ((PG_VD){0, 0})
#define PG_ADDF(a, b) ((a) + (b))
#define PG_ADDD(a, b) ((a) + (b))
#define PG_MULADDF(acc, a, b) ((acc) + (a) * (b))
#define PG_MULADDD(acc, a, b) ((acc) + (a) * (b))
#endif

#define PG_T float
#define PG_NAME(x) pg_s_##x
#define PG_MR PG_MR_
#define PG_VEC PG_VF
#define PG_VL PG_VLF
#define PG_LOAD PG_LOADF
#define PG_STORE PG_STOREF
#define PG_SET1 PG_SET1F
#define PG_ZERO PG_ZEROF
#define PG_ADD PG_ADDF
#define PG_MULADD PG_MULADDF
#include "_packed_gemm_impl.h"
#undef PG_T
#undef PG_NAME
#undef PG_VEC
#undef PG_VL
#undef PG_LOAD
#undef PG_STORE
#undef PG_SET1
#undef PG_ZERO
#undef PG_ADD
#undef PG_MULADD

#define PG_T double
#define PG_NAME(x) pg_d_##x
#define PG_VEC PG_VD
#define PG_VL PG_VLD
#define PG_LOAD PG_LOADD
#define PG_STORE PG_STORED
#define PG_SET1 PG_SET1D
#define PG_ZERO PG_ZEROD
#define PG_ADD PG_ADDD
#define PG_MULADD PG_MULADDD
#include "_packed_gemm_impl.h"
#undef PG_T
#undef PG_NAME
#undef PG_VEC
#undef PG_VL
#undef PG_LOAD
#undef PG_STORE
#undef PG_SET1
#undef PG_ZERO
#undef PG_ADD
#undef PG_MULADD
#undef PG_MR

#endif
