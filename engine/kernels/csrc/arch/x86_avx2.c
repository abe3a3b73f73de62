/* The AVX2 kernels: the dot products of every type, one activation row and four at a
 * time (the k-quants' from one R-row body, so a row's bits do not depend on the rows
 * beside it), and the activation quantizers. Built with a target attribute and picked at
 * run time (dispatch.c); the tiles are x86_tiles.c's. */

#include "x86.h"

#ifdef GC_X86

DEFINE_DOT32(dot_q8_0_avx2, AVX2, dot_i8_avx2, blk_q8_0, BODY_Q8_0)

DEFINE_DOT32(dot_q4_0_avx2, AVX2, dot_u8_avx2, blk_q4_0, BODY_Q4_0_U)
DEFINE_DOT32(dot_q5_0_avx2, AVX2, dot_u8_avx2, blk_q5_0, BODY_Q5_0_U)
DEFINE_DOT32(dot_q4_1_avx2, AVX2, dot_u8_avx2, blk_q4_1, BODY_Q4_1)
DEFINE_DOT32(dot_q5_1_avx2, AVX2, dot_u8_avx2, blk_q5_1, BODY_Q5_1)
DEFINE_DOT32(dot_iq4_nl_avx2, AVX2, dot_i8_avx2, blk_iq4_nl, BODY_IQ4_NL)
DEFINE_DOT32(dot_mxfp4_avx2, AVX2, dot_i8_avx2, blk_mxfp4, BODY_MXFP4)

/* 32-blocks: BODY sets q (int8 weights, unsigned unless SIGNED), d (weight scale) and e
 * (the coefficient of the activation block sum: -offset * d, or the block minimum) */
#define DEFINE_DOT32_X4(NAME, BLK, SIGNED, BODY)                                                    \
    AVX2 void NAME(const void *vw, const void *const *vx, int nb, float *out) {         \
        const BLK *w = vw; X4_ROWS(act32);                                                         \
        const __m256i ones = _mm256_set1_epi16(1);                                                 \
        const int sgn = SIGNED;                                                                    \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                \
        float e0 = 0.f, e1 = 0.f, e2 = 0.f, e3 = 0.f;                                              \
        for (int i = 0; i < nb; i++) {                                                             \
            prefetch_ahead(&w[i], (int)sizeof(BLK));                                               \
            __m256i q; float d, e; BODY;                                                           \
            const __m256i qa = sgn ? _mm256_sign_epi8(q, q) : q;                                   \
            DOT32_ROW(X0, a0, e0) DOT32_ROW(X1, a1, e1) DOT32_ROW(X2, a2, e2) DOT32_ROW(X3, a3, e3) \
        }                                                                                          \
        out[0] = hsum8(a0) + e0; out[1] = hsum8(a1) + e1; out[2] = hsum8(a2) + e2; out[3] = hsum8(a3) + e3; \
    }
#define DOT32_ROW(X, A, E)                                                                          \
    {                                                                                              \
        __m256i xv = _mm256_loadu_si256((const __m256i *)X[i].qs);                                 \
        if (sgn) xv = _mm256_sign_epi8(xv, q);                                                     \
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(qa, xv), ones);                   \
        A = _mm256_fmadd_ps(_mm256_set1_ps(d * X[i].d), _mm256_cvtepi32_ps(p), A);                \
        E = fmaf(e, X[i].s, E);                                                                    \
    }

DEFINE_DOT32_X4(dot4_q8_0_avx2, blk_q8_0, 1, X4_Q8_0)
DEFINE_DOT32_X4(dot4_q4_0_avx2, blk_q4_0, 0, X4_Q4_0)
DEFINE_DOT32_X4(dot4_q5_0_avx2, blk_q5_0, 0, X4_Q5_0)
DEFINE_DOT32_X4(dot4_q4_1_avx2, blk_q4_1, 0, X4_Q4_1)
DEFINE_DOT32_X4(dot4_q5_1_avx2, blk_q5_1, 0, X4_Q5_1)

DEFINE_DOT32_X4(dot4_iq4_nl_avx2, blk_iq4_nl, 1, X4_IQ4_NL)
DEFINE_DOT32_X4(dot4_mxfp4_avx2, blk_mxfp4, 1, X4_MXFP4)

/* ---- the k-quants: R activation rows (1 or 4) from one body, the weights unpacked once
 * for all; the one-row and four-row dots are its two instances, so each row's arithmetic
 * is the same whatever R is and batched decode gives a row the bits it gets alone (as
 * x86_avx512.c's). */

/* Q4_K and Q5_K: per 64 elements, 32 bytes hold sub-block 2c (low nibbles) and 2c+1
 * (high nibbles); Q5_K adds a fifth bit: element 64c + 32h + l takes bit (2c + h) of
 * qh[l]. HIGH(shift) gives those bits (as 0x10) for one half, or zero for Q4_K. Per
 * row: d x.d sum - dmin x.d (mins . the activation sums of 32, pairs of 16-sums). */
#define DEFINE_Q45K(NAME, NAME4, BLK, HIGH)                                                        \
    AVX2 static inline __attribute__((always_inline)) void NAME##_rows(const BLK *w, const act256 *const *X, \
                                                                      const int R, int nb, float *out) { \
        __m256 acc[4], accm[4];                                                                    \
        for (int r = 0; r < R; r++) acc[r] = accm[r] = _mm256_setzero_ps();                        \
        const __m256i m4 = _mm256_set1_epi8(0xF);                                                  \
        for (int i = 0; i < nb; i++) {                                                             \
            prefetch_ahead(&w[i], (int)sizeof(BLK));                                               \
            uint32_t u[4];                                                                         \
            k4_scales_mins(w[i].scales, u);                                                        \
            const uint8_t *sc = (const uint8_t *)u;                                                \
            const __m128i m8 = _mm_set_epi32(0, 0, (int)u[3], (int)u[2]);                          \
            const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));                  \
            __m256i sum[4];                                                                        \
            for (int r = 0; r < R; r++) sum[r] = _mm256_setzero_si256();                           \
            for (int c = 0; c < 4; c++) {                                                          \
                const __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * c));         \
                const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), HIGH(2 * c));           \
                const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), HIGH(2 * c + 1)); \
                const __m256i sl = _mm256_set1_epi16(sc[2 * c]), sh = _mm256_set1_epi16(sc[2 * c + 1]); \
                for (int r = 0; r < R; r++) { /* pairs (vpmaddubsw: <= 2 * 31 * 127), then the scale (vpmaddwd) */ \
                    const __m256i xl = _mm256_loadu_si256((const __m256i *)(X[r][i].qs + 64 * c)); \
                    const __m256i xh = _mm256_loadu_si256((const __m256i *)(X[r][i].qs + 64 * c + 32)); \
                    sum[r] = _mm256_add_epi32(sum[r], _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), sl), \
                                                                      _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), sh))); \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < R; r++) {                                                          \
                const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)X[r][i].bsums), mins); \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(H2F(w[i].d) * X[r][i].d), _mm256_cvtepi32_ps(sum[r]), acc[r]); \
                accm[r] = _mm256_fmadd_ps(_mm256_set1_ps(H2F(w[i].dmin) * X[r][i].d), _mm256_cvtepi32_ps(msum), accm[r]); \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < R; r++) out[r] = hsum8(_mm256_sub_ps(acc[r], accm[r]));                \
    }                                                                                              \
    DEFINE_ROWS_1_4(AVX2, NAME, NAME4, NAME##_rows)

#define NO_HIGH(shift) _mm256_setzero_si256()
#define Q5_HIGH(shift) \
    _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)w[i].qh), (shift)), 4), \
                     _mm256_set1_epi8(0x10))

DEFINE_Q45K(dot_q4_K_avx2, dot4_q4_K_avx2, blk_q4_K, NO_HIGH)
DEFINE_Q45K(dot_q5_K_avx2, dot4_q5_K_avx2, blk_q5_K, Q5_HIGH)

/* Q6_K: q in 0..63 (offset 32): sum((q - 32) x) = sum(q x) - 32 sum(x), per 16 with int8
 * scales. Per half of 128: ql holds the low nibbles of four 32-runs (two loads, low and
 * high nibbles), qh their two high bits each (q6k_half). The scales of a 32-run's two
 * 16-groups come as 16-bit lanes of a byte shuffle of that half's eight scales. */
AVX2 static inline __attribute__((always_inline)) void q6k_rows(const blk_q6_K *w, const act256 *const *X, const int R,
                                                              int nb, float *out) {
    /* lane 0: 16-bit scale 2s, lane 1: 2s + 1 (of the half's 8) */
    static const int8_t pick[4][32] = {
        {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
        {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
        {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
        {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15},
    };
    __m256i pk[4];
    for (int j = 0; j < 4; j++) pk[j] = _mm256_loadu_si256((const __m256i *)pick[j]);
    __m256 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        prefetch_ahead(&w[i], (int)sizeof(blk_q6_K));
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        __m256i sum[4];
        for (int r = 0; r < R; r++) /* the offset 32: 32 · Σ scale_j · (sum of activations j), in 8 lanes */
            sum[r] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                      _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)X[r][i].bsums), sc16), 5));
        for (int h = 0; h < 2; h++) {
            const __m256i sch = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11) : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            __m256i q[4], s[4];
            q6k_half(&w[i], h, q);
            for (int j = 0; j < 4; j++) s[j] = _mm256_shuffle_epi8(sch, pk[j]);
            for (int r = 0; r < R; r++) {
                const int8_t *xr = X[r][i].qs + 128 * h;
                for (int j = 0; j < 4; j++)
                    sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(q[j], _mm256_loadu_si256((const __m256i *)(xr + 32 * j))), s[j]));
            }
        }
        const float d = H2F(w[i].d);
        for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * X[r][i].d), _mm256_cvtepi32_ps(sum[r]), acc[r]);
    }
    for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]);
}

DEFINE_ROWS_1_4(AVX2, dot_q6_K_avx2, dot4_q6_K_avx2, q6k_rows)

DEFINE_Q2K(dot_q2_K_avx2, AVX2)
DEFINE_Q3K(dot_q3_K_avx2, AVX2)
DEFINE_IQ4XS(dot_iq4_xs_avx2, AVX2)

AVX2 void quantize_act32_avx2(const float *x, act32 *y, int64_t k) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int64_t i = 0; i < k / 32; i++) {
        const float *xb = x + 32 * i;
        const __m256 a0 = _mm256_loadu_ps(xb), a1 = _mm256_loadu_ps(xb + 8);
        const __m256 a2 = _mm256_loadu_ps(xb + 16), a3 = _mm256_loadu_ps(xb + 24);
        const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, a0), _mm256_andnot_ps(sign, a1)),
                                       _mm256_max_ps(_mm256_andnot_ps(sign, a2), _mm256_andnot_ps(sign, a3)));
        const float d = hmax_ps_avx2(m) / 127.f, id = d ? 1.f / d : 0.f;
        const __m256 vid = _mm256_set1_ps(id);
        const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(a0, vid)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(a1, vid));
        const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(a2, vid)), q3 = _mm256_cvtps_epi32(_mm256_mul_ps(a3, vid));
        _mm256_storeu_si256((__m256i *)y[i].qs, pack32_i8(q0, q1, q2, q3));
        y[i].d = d;
        y[i].s = d * (float)hsum_i32_avx2(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
    }
}

AVX2 void quantize_act256_avx2(const float *x, act256 *y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float *xb = x + QK_K * i;
        __m256 vmax = _mm256_loadu_ps(xb), vmin = vmax;
        for (int j = 8; j < QK_K; j += 8) {
            const __m256 v = _mm256_loadu_ps(xb + j);
            vmax = _mm256_max_ps(vmax, v);
            vmin = _mm256_min_ps(vmin, v);
        }
        const float hi = hmax_ps_avx2(vmax), lo = -hmax_ps_avx2(_mm256_sub_ps(_mm256_setzero_ps(), vmin));
        const float amax = fmaxf(hi, -lo);
        if (amax == 0.f) {
            memset(&y[i], 0, sizeof(act256));
            continue;
        }
        const float max = hi >= -lo ? hi : lo; /* the extreme maps to -127, as the scalar code */
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int l = 0; l < 4; l++)
                q[l] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8 * l), vs)), top);
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), pack32_i8(q[0], q[1], q[2], q[3]));
            y[i].bsums[j / 16] = (int16_t)hsum_i32_avx2(_mm256_add_epi32(q[0], q[1]));
            y[i].bsums[j / 16 + 1] = (int16_t)hsum_i32_avx2(_mm256_add_epi32(q[2], q[3]));
        }
        y[i].d = 1.f / iscale;
    }
}

#endif /* GC_X86 */
