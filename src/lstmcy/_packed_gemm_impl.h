/* Body of the packed-panel GEMM, instantiated by _packed_gemm.h once per element type.
   Expects: PG_T, PG_NAME(x), PG_MR, PG_VEC, PG_VL, PG_LOAD, PG_STORE, PG_SET1, PG_ZERO,
   PG_ADD, PG_MULADD (acc + a * b, fused or not per build). */
#define PG_NR (2 * PG_VL)
/* CASE(n) for every block height n = 1 .. PG_MR, for a switch that calls a function
   inlined with a constant n. */
#if PG_MR > 6
#define PG_EVERY_MR(CASE) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) \
    CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
#else
#define PG_EVERY_MR(CASE) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#endif

/* Columns of panel p of an n-column matrix: PG_NR, or fewer in the last panel. */
static inline int
PG_NAME(panel_cols)(ptrdiff_t n, ptrdiff_t p)
{
    return (int)(n - p * PG_NR < PG_NR ? n - p * PG_NR : PG_NR);
}

/* c[:PG_NR] = (lo, hi), or c[:PG_NR] += (lo, hi) when accumulating: one full panel's
   columns of one row. */
static inline __attribute__((always_inline)) void
PG_NAME(put)(PG_T *c, PG_VEC lo, PG_VEC hi, int accumulate)
{
    if (accumulate) {
        lo = PG_ADD(PG_LOAD(c), lo);
        hi = PG_ADD(PG_LOAD(c + PG_VL), hi);
    }
    PG_STORE(c, lo);
    PG_STORE(c + PG_VL, hi);
}

/* Rows r < mr of c[:, :ncols] = acc (or c + acc when accumulating), the last, partial
   panel's columns through a copy. */
static inline __attribute__((always_inline)) void
PG_NAME(put_rows)(const int mr, const PG_VEC *acc0, const PG_VEC *acc1, PG_T *c, ptrdiff_t ldc,
                  int ncols, int accumulate)
{
    for (int r = 0; r < mr; r++) {
        PG_T *cr = c + r * ldc;
        if (ncols == PG_NR) {
            PG_NAME(put)(cr, acc0[r], acc1[r], accumulate);
        } else {
            PG_T tmp[PG_NR];
            PG_STORE(tmp, acc0[r]);
            PG_STORE(tmp + PG_VL, acc1[r]);
            for (int j = 0; j < ncols; j++)
                cr[j] = accumulate ? cr[j] + tmp[j] : tmp[j];
        }
    }
}

/* acc[r] += a(r, k) * panel[k, :PG_NR] for k < K, in increasing k, r < mr: the register-
   blocked multiply of both products, a(r, k) at a[r * row + k * step] (a's rows, or with
   step = lda its columns). Inlined with constant mr and strides, so the accumulators stay
   in registers. */
static inline __attribute__((always_inline)) void
PG_NAME(terms)(const int mr, ptrdiff_t K, const PG_T *a, ptrdiff_t row, ptrdiff_t step,
               const PG_T *panel, PG_VEC *acc0, PG_VEC *acc1)
{
    for (ptrdiff_t k = 0; k < K; k++) {
        PG_VEC b0 = PG_LOAD(panel + k * PG_NR);
        PG_VEC b1 = PG_LOAD(panel + k * PG_NR + PG_VL);
        for (int r = 0; r < mr; r++) {
            PG_VEC av = PG_SET1(a[r * row + k * step]);
            acc0[r] = PG_MULADD(acc0[r], av, b0);
            acc1[r] = PG_MULADD(acc1[r], av, b1);
        }
    }
}

/* c[r, :ncols] (+)= sum_k a[r, k] * panel[k, :ncols] + sum_k a2[r, k] * panel2[k, :ncols]
   for r < mr, one running sum over the first product's terms, then the second's (K2 = 0:
   the first product alone). Inlined with a constant mr, so the 2 * mr accumulators stay in
   registers; called with a literal K2 = 0 the second loop compiles away and keeps no
   operand of it live. Each element is summed over k in increasing order whatever the
   vector width. */
static inline __attribute__((always_inline)) void
PG_NAME(block)(const int mr, ptrdiff_t K, const PG_T *a, ptrdiff_t lda, const PG_T *panel,
               ptrdiff_t K2, const PG_T *a2, ptrdiff_t lda2, const PG_T *panel2,
               PG_T *c, ptrdiff_t ldc, int ncols, int accumulate)
{
    PG_VEC acc0[PG_MR], acc1[PG_MR];
    for (int r = 0; r < mr; r++) {
        acc0[r] = PG_ZERO();
        acc1[r] = PG_ZERO();
    }
    PG_NAME(terms)(mr, K, a, lda, 1, panel, acc0, acc1);
    PG_NAME(terms)(mr, K2, a2, lda2, 1, panel2, acc0, acc1);
    PG_NAME(put_rows)(mr, acc0, acc1, c, ldc, ncols, accumulate);
}

/* acc[q] += sum_k a[k] * panels[q][k, :PG_NR] for q < np, in increasing k. */
static inline __attribute__((always_inline)) void
PG_NAME(row_terms)(const int np, ptrdiff_t K, const PG_T *a, const PG_T *panels,
                   PG_VEC *acc0, PG_VEC *acc1)
{
    const ptrdiff_t stride = K * PG_NR;  /* elements of one panel */
    for (ptrdiff_t k = 0; k < K; k++) {
        PG_VEC av = PG_SET1(a[k]);
        for (int q = 0; q < np; q++) {
            const PG_T *b = panels + q * stride + k * PG_NR;
            acc0[q] = PG_MULADD(acc0[q], av, PG_LOAD(b));
            acc1[q] = PG_MULADD(acc1[q], av, PG_LOAD(b + PG_VL));
        }
    }
}

/* One row against np (2 to 4) full panels at once (and against those of the second
   product, K2 > 0): 2 * np accumulators instead of block's 2 for a single row, so that
   the multiply-adds do not wait on each other's latency (a single row has no other rows
   to interleave). Each element gets the same terms in the same order as in block: the
   same bits. */
static inline __attribute__((always_inline)) void
PG_NAME(row_panels)(const int np, ptrdiff_t K, const PG_T *a, const PG_T *panels,
                    ptrdiff_t K2, const PG_T *a2, const PG_T *panels2, PG_T *c, int accumulate)
{
    PG_VEC acc0[4], acc1[4];
    for (int q = 0; q < np; q++) {
        acc0[q] = PG_ZERO();
        acc1[q] = PG_ZERO();
    }
    PG_NAME(row_terms)(np, K, a, panels, acc0, acc1);
    if (K2 > 0)
        PG_NAME(row_terms)(np, K2, a2, panels2, acc0, acc1);
    for (int q = 0; q < np; q++)
        PG_NAME(put)(c + q * PG_NR, acc0[q], acc1[q], accumulate);
}

/* The weight-gradient products: c[r, :ncols] = c (accumulate) or 0, plus
   sum_k a[k, r] * panel[k, :ncols] for r < mr, a running sum over k in increasing order.
   a is read where it lies (a[k, r] at a[k * lda + r]: the mr broadcasts of a step come
   from one gate-gradient row), the panel as pack writes it. */
static inline __attribute__((always_inline)) void
PG_NAME(tblock)(const int mr, ptrdiff_t K, const PG_T *a, ptrdiff_t lda, const PG_T *panel,
                PG_T *c, ptrdiff_t ldc, int ncols, int accumulate)
{
    PG_VEC acc0[PG_MR], acc1[PG_MR];
    PG_T tmp[PG_NR];
    for (int r = 0; r < mr; r++) {
        if (!accumulate) {
            acc0[r] = PG_ZERO();
            acc1[r] = PG_ZERO();
        } else if (ncols == PG_NR) {
            acc0[r] = PG_LOAD(c + r * ldc);
            acc1[r] = PG_LOAD(c + r * ldc + PG_VL);
        } else {
            for (int j = 0; j < PG_NR; j++)
                tmp[j] = j < ncols ? c[r * ldc + j] : 0;
            acc0[r] = PG_LOAD(tmp);
            acc1[r] = PG_LOAD(tmp + PG_VL);
        }
    }
    PG_NAME(terms)(mr, K, a, 1, lda, panel, acc0, acc1);
    PG_NAME(put_rows)(mr, acc0, acc1, c, ldc, ncols, 0);
}

/* block (tn = 0: a[r, k] at a[r * lda + k], and with K2 > 0 the second product) or tblock
   (tn = 1: a[k, r] at a[k * lda + r]) with a constant block height mr. */
static void
PG_NAME(rows)(int tn, int mr, ptrdiff_t K, const PG_T *a, ptrdiff_t lda, const PG_T *panel,
              ptrdiff_t K2, const PG_T *a2, ptrdiff_t lda2, const PG_T *panel2,
              PG_T *c, ptrdiff_t ldc, int ncols, int accumulate)
{
    if (tn) {
        switch (mr) {
#define PG_CASE(n) case n: PG_NAME(tblock)(n, K, a, lda, panel, c, ldc, ncols, accumulate); break;
        PG_EVERY_MR(PG_CASE)
#undef PG_CASE
        }
        return;
    }
    if (K2 > 0) {
        switch (mr) {
#define PG_CASE(n) case n: PG_NAME(block)(n, K, a, lda, panel, K2, a2, lda2, panel2, c, ldc, \
                                          ncols, accumulate); break;
        PG_EVERY_MR(PG_CASE)
#undef PG_CASE
        }
        return;
    }
    switch (mr) {  /* one product: the literal K2 = 0 leaves block's second loop out */
#define PG_CASE(n) case n: PG_NAME(block)(n, K, a, lda, panel, 0, NULL, 0, NULL, c, ldc, ncols, \
                                          accumulate); break;
    PG_EVERY_MR(PG_CASE)
#undef PG_CASE
    }
}

/* Pack columns [n0, n0 + n) of op(W) (W row-major with leading dimension ldw; op(W)[k, j]
   is W[j, k] when trans, else W[k, j]) into panels of PG_NR columns, k-major inside a
   panel, the last panel zero-padded. out holds PG_NAME(packed_len)(n, K) elements. */
static void
PG_NAME(pack)(const PG_T *w, ptrdiff_t ldw, int trans, ptrdiff_t K, ptrdiff_t n0,
              ptrdiff_t n, PG_T *out)
{
    if (!trans) {
        /* Row k of every panel is a contiguous piece of row k of W: W is read once, row
           by row as it lies, each row's pieces going to row k of every panel (a panel at a
           time would read a few cache lines of each row of W, a row apart, and runs up to
           twice as long where W is not in L2; docs/benchmarks.md, "Schedule rules"). */
        ptrdiff_t full = n / PG_NR;
        int rest = (int)(n - full * PG_NR);
        for (ptrdiff_t k = 0; k < K; k++) {
            const PG_T *src = w + k * ldw + n0;
            for (ptrdiff_t p = 0; p < full; p++)
                memcpy(out + (p * K + k) * PG_NR, src + p * PG_NR, PG_NR * sizeof(PG_T));
            if (rest > 0) {
                PG_T *dst = out + (full * K + k) * PG_NR;
                for (int j = 0; j < PG_NR; j++)
                    dst[j] = j < rest ? src[full * PG_NR + j] : 0;
            }
        }
        return;
    }
    ptrdiff_t npanel = (n + PG_NR - 1) / PG_NR;
    for (ptrdiff_t p = 0; p < npanel; p++) {
        /* column j of the panel is row n0 + col of W: read it contiguously */
        PG_T *dst = out + p * K * PG_NR;
        int width = PG_NAME(panel_cols)(n, p);
        PG_NAME(transpose)(w + (n0 + p * PG_NR) * ldw, ldw, K, width, PG_NR, dst);
        for (int j = width; j < PG_NR; j++)
            for (ptrdiff_t k = 0; k < K; k++)
                dst[k * PG_NR + j] = 0;
    }
}

/* c[M, n] = a[M, K] @ packed[K, n] + a2[M, K2] @ packed2[K2, n] (accumulate: c += ...;
   K2 = 0: the first product alone; a2 and packed2 are then not read), each element one
   running sum over the first product's terms, then the second's. Panel-outer, so one panel
   (K x PG_NR, and K2 x PG_NR) stays in cache while all M rows pass over it. The rows go in
   as few blocks as PG_MR allows, of even sizes (16 rows: 8 + 8, not 12 + 4, whose 4-row
   block loads almost as much as it computes); a row's result does not depend on its
   block. */
static void
PG_NAME(gemm2)(ptrdiff_t M, ptrdiff_t n, ptrdiff_t K, const PG_T *a, ptrdiff_t lda,
               const PG_T *packed, ptrdiff_t K2, const PG_T *a2, ptrdiff_t lda2,
               const PG_T *packed2, PG_T *c, ptrdiff_t ldc, int accumulate)
{
    ptrdiff_t npanel = (n + PG_NR - 1) / PG_NR;
    ptrdiff_t nblock = (M + PG_MR - 1) / PG_MR;
    ptrdiff_t p = 0;
    if (M == 1) {  /* full panels two to four at a time (see row_panels) */
        ptrdiff_t full = n / PG_NR;
        while (full - p >= 2) {
            int np = full - p >= 4 ? 4 : (int)(full - p);
            const PG_T *panels = packed + p * K * PG_NR;
            const PG_T *panels2 = K2 > 0 ? packed2 + p * K2 * PG_NR : NULL;
            PG_T *cp = c + p * PG_NR;
            if (np == 4)
                PG_NAME(row_panels)(4, K, a, panels, K2, a2, panels2, cp, accumulate);
            else if (np == 3)
                PG_NAME(row_panels)(3, K, a, panels, K2, a2, panels2, cp, accumulate);
            else
                PG_NAME(row_panels)(2, K, a, panels, K2, a2, panels2, cp, accumulate);
            p += np;
        }
    }
    for (; p < npanel; p++) {
        int ncols = PG_NAME(panel_cols)(n, p);
        const PG_T *panel = packed + p * K * PG_NR;
        const PG_T *panel2 = K2 > 0 ? packed2 + p * K2 * PG_NR : NULL;
        ptrdiff_t m0 = 0;
        for (ptrdiff_t b = 0; b < nblock; b++) {
            /* rows left / blocks left: at most PG_MR, since nblock blocks of PG_MR cover M */
            int mr = (int)((M - m0) / (nblock - b));
            PG_NAME(rows)(0, mr, K, a + m0 * lda, lda, panel, K2,
                          K2 > 0 ? a2 + m0 * lda2 : NULL, lda2, panel2,
                          c + m0 * ldc + p * PG_NR, ldc, ncols, accumulate);
            m0 += mr;
        }
    }
}

/* c[M, n] = a[M, K] @ packed[K, n] (accumulate: c += ...). */
static void
PG_NAME(gemm)(ptrdiff_t M, ptrdiff_t n, ptrdiff_t K, const PG_T *a, ptrdiff_t lda,
              const PG_T *packed, PG_T *c, ptrdiff_t ldc, int accumulate)
{
    PG_NAME(gemm2)(M, n, K, a, lda, packed, 0, NULL, 0, NULL, c, ldc, accumulate);
}

/* Asks the cache for c[r, :ncols] for r < mr (rows ldc apart, every cache line of each),
   to be written: the sums a later call of gemm_tn's copying loop starts from. */
static inline void
PG_NAME(prefetch_rows)(int mr, const PG_T *c, ptrdiff_t ldc, int ncols)
{
    for (int r = 0; r < mr; r++) {
        const char *row = (const char *)(c + r * ldc);
        for (int off = 0; off < ncols * (int)sizeof(PG_T); off += 64)
            __builtin_prefetch(row + off, 1, 3);
        __builtin_prefetch(c + r * ldc + ncols - 1, 1, 3);
    }
}

/* Steps of k per pass of a block of rows over the panels, when its values of a are copied
   together first (see gemm_tn). */
#define PG_TN_KC 128
/* Panels a product of at most PG_TN_KC steps needs for its blocks' values of a to be
   copied together where the core reads them in place otherwise (see gemm_tn; the
   measurements: docs/benchmarks.md, "Schedule rules"). */
#define PG_TN_COPY_PANELS 8
/* Panels ahead whose sums gemm_tn's copying loop asks the cache for: a block of rows'
   sums outgrow L2 when the gradients' accumulators do (a block of 256 gate rows of a
   1,300-column dW is 1.3 MB, read and written again for every chunk), and without the
   prefetch each call waits for its sums from L3. 12 / PG_MR panels: about the same time
   ahead on the AVX2 and AVX-512 builds, whose calls of PG_MR rows take time in proportion
   to PG_MR (the measurements: docs/benchmarks.md, "Schedule rules"). */
#define PG_TN_PREFETCH (12 / PG_MR)

/* c[M, n] = a[K, M]^T @ packed[K, n] (accumulate: c + ...): a row-major as it lies (the
   gate gradients of a chunk of rows, for a block of gate rows), packed by pack (the
   chunk's [x | h] rows). Every element is a running sum from c (or 0) over k in
   increasing order, so calls may cut M, n or K (accumulating) any way, and the two orders
   of the loops below give the same bits. */
static void
PG_NAME(gemm_tn)(ptrdiff_t M, ptrdiff_t n, ptrdiff_t K, const PG_T *a, ptrdiff_t lda,
                 const PG_T *packed, PG_T *c, ptrdiff_t ldc, int accumulate)
{
    PG_T apack[PG_TN_KC * PG_MR];
    ptrdiff_t npanel = (n + PG_NR - 1) / PG_NR;
    ptrdiff_t nblock = (M + PG_MR - 1) / PG_MR;
    if (K == 0) {  /* an empty sum: c, or 0 */
        for (ptrdiff_t i = 0; i < M && !accumulate; i++)
            for (ptrdiff_t j = 0; j < n; j++)
                c[i * ldc + j] = 0;
        return;
    }
    if (pg_tn_rows_in_place && PG_MR >= 12 && (lda * (ptrdiff_t)sizeof(PG_T)) % 4096 != 0
            && (K > PG_TN_KC || npanel < PG_TN_COPY_PANELS)) {
        /* Panel by panel, every block of rows reading a in place: a panel stays in cache
           while the blocks pass over it. Only where the core is set to (AVX-512 on AMD's
           Zen 4, pg_tn_rows_in_place), and there only for products of more than
           PG_TN_KC steps or fewer than PG_TN_COPY_PANELS panels, where it measured faster
           than copying (schedule.weights_rows_in_place; docs/benchmarks.md, "Schedule
           rules"), and never for rows of a a multiple of 4 KiB apart, which all fall in
           the same few cache sets. Elsewhere each pass reads a few bytes of every cache
           line of a it fetches, a row apart, and the copy below runs faster. */
        for (ptrdiff_t p = 0; p < npanel; p++) {
            int ncols = PG_NAME(panel_cols)(n, p);
            ptrdiff_t m0 = 0;
            for (ptrdiff_t blk = 0; blk < nblock; blk++) {
                int mr = (int)((M - m0) / (nblock - blk));
                PG_NAME(rows)(1, mr, K, a + m0, lda, packed + p * K * PG_NR, 0, NULL, 0, NULL,
                              c + m0 * ldc + p * PG_NR, ldc, ncols, accumulate);
                m0 += mr;
            }
        }
        return;
    }
    /* Block by block, PG_TN_KC steps of its values of a are copied together first, then
       multiplied by every panel: each block's values are fetched once and serve every
       panel, and the panels are read as one stream. */
    for (ptrdiff_t k0 = 0; k0 < K; k0 += PG_TN_KC) {
        ptrdiff_t kc = K - k0 < PG_TN_KC ? K - k0 : PG_TN_KC;
        int acc = accumulate || k0 > 0;
        ptrdiff_t m0 = 0;
        for (ptrdiff_t blk = 0; blk < nblock; blk++) {
            int mr = (int)((M - m0) / (nblock - blk));
            for (ptrdiff_t k = 0; k < kc; k++)
                for (int r = 0; r < mr; r++)
                    apack[k * mr + r] = a[(k0 + k) * lda + m0 + r];
            for (ptrdiff_t p = 0; p < npanel; p++) {
                int ncols = PG_NAME(panel_cols)(n, p);
                ptrdiff_t ahead = p + PG_TN_PREFETCH;
                if (acc && ahead < npanel)
                    PG_NAME(prefetch_rows)(mr, c + m0 * ldc + ahead * PG_NR, ldc,
                                           PG_NAME(panel_cols)(n, ahead));
                PG_NAME(rows)(1, mr, kc, apack, mr, packed + (p * K + k0) * PG_NR, 0, NULL,
                              0, NULL, c + m0 * ldc + p * PG_NR, ldc, ncols, acc);
            }
            m0 += mr;
        }
    }
}
#undef PG_TN_KC
#undef PG_TN_COPY_PANELS
#undef PG_TN_PREFETCH

static ptrdiff_t PG_NAME(packed_len)(ptrdiff_t n, ptrdiff_t K)
{
    return (n + PG_NR - 1) / PG_NR * PG_NR * K;
}
#undef PG_NR
#undef PG_EVERY_MR
