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

/* Columns [0, width) of one panel of op(W) = W^T (K rows, panel width nr): column j is
   row j of W (leading dimension ldw), read contiguously. With SSE (every x86-64 build)
   blocks of 4 x 4 floats (2 x 2 doubles) are transposed in registers, so that the panel
   is written a vector at a time: the packing of W_hh is most of a small call's time. */
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static inline void
pg_s_transpose(const float *w, ptrdiff_t ldw, ptrdiff_t K, int width, int nr,
                      float *dst)
{
    int j = 0;
#if defined(__SSE2__)
    for (; j + 4 <= width; j += 4) {
        const float *r0 = w + j * ldw, *r1 = r0 + ldw, *r2 = r1 + ldw, *r3 = r2 + ldw;
        ptrdiff_t k = 0;
        for (; k + 4 <= K; k += 4) {
            __m128 a = _mm_loadu_ps(r0 + k), b = _mm_loadu_ps(r1 + k);
            __m128 c = _mm_loadu_ps(r2 + k), d = _mm_loadu_ps(r3 + k);
            _MM_TRANSPOSE4_PS(a, b, c, d);
            _mm_storeu_ps(dst + k * nr + j, a);
            _mm_storeu_ps(dst + (k + 1) * nr + j, b);
            _mm_storeu_ps(dst + (k + 2) * nr + j, c);
            _mm_storeu_ps(dst + (k + 3) * nr + j, d);
        }
        for (; k < K; k++) {
            dst[k * nr + j] = r0[k];
            dst[k * nr + j + 1] = r1[k];
            dst[k * nr + j + 2] = r2[k];
            dst[k * nr + j + 3] = r3[k];
        }
    }
#endif
    for (; j < width; j++) {
        const float *src = w + j * ldw;
        for (ptrdiff_t k = 0; k < K; k++)
            dst[k * nr + j] = src[k];
    }
}

static inline void
pg_d_transpose(const double *w, ptrdiff_t ldw, ptrdiff_t K, int width, int nr,
                      double *dst)
{
    int j = 0;
#if defined(__SSE2__)
    for (; j + 2 <= width; j += 2) {
        const double *r0 = w + j * ldw, *r1 = r0 + ldw;
        ptrdiff_t k = 0;
        for (; k + 2 <= K; k += 2) {
            __m128d a = _mm_loadu_pd(r0 + k), b = _mm_loadu_pd(r1 + k);
            _mm_storeu_pd(dst + k * nr + j, _mm_unpacklo_pd(a, b));
            _mm_storeu_pd(dst + (k + 1) * nr + j, _mm_unpackhi_pd(a, b));
        }
        for (; k < K; k++) {
            dst[k * nr + j] = r0[k];
            dst[k * nr + j + 1] = r1[k];
        }
    }
#endif
    for (; j < width; j++) {
        const double *src = w + j * ldw;
        for (ptrdiff_t k = 0; k < K; k++)
            dst[k * nr + j] = src[k];
    }
}

/* Whether gemm_tn may read a block's rows of a in place, on the builds whose register
   block has 12 rows (see gemm_tn): a property of the core, set once per process by the
   kernel module's set_weights_rows_in_place before any product runs (the rule:
   lstmcy/_engine/schedule.py, weights_rows_in_place). */
static int pg_tn_rows_in_place = 0;

static void pg_set_tn_rows_in_place(int on)
{
    pg_tn_rows_in_place = on;
}

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
