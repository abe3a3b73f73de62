/* The AVX-512 (F, BW, VL, VNNI) kernels: the dot products of every type, one activation
 * row, four (VNNI) and eight (act32x8 blocks) at a time, the k-quants' from one R-row
 * body, and the activation quantizers. Built with a target attribute and picked at run
 * time (dispatch.c); the AVX-512 tiles are x86_tiles.c's. */

#include "x86.h"

#ifdef GC_X86

/* AVX-512 (VL, BW): the fifth bits as a byte mask for a masked add (Q5_0 dot 13.2 -> 12.1
 * ns per 256 weights in L1) */
#define BODY_Q5_0_MASK                                                                              \
    const blk_q5_0 *w = vw; uint32_t qh; memcpy(&qh, w[i].qh, 4);                                   \
    const __m256i q4 = nibbles32(w[i].qs);                                                          \
    q = _mm256_mask_add_epi8(q4, qh, q4, _mm256_set1_epi8(16)); d = H2F(w[i].d); extra = fmaf(-16.f * d, x[i].s, extra)
#define BODY_Q5_1_MASK                                                                              \
    const blk_q5_1 *w = vw; uint32_t qh; memcpy(&qh, w[i].qh, 4);                                   \
    const __m256i q4 = nibbles32(w[i].qs);                                                          \
    q = _mm256_mask_add_epi8(q4, qh, q4, _mm256_set1_epi8(16)); d = H2F(w[i].d); extra = fmaf(H2F(w[i].m), x[i].s, extra)

DEFINE_DOT32(dot_q8_0_avx512, AVX512, dot_i8_vnni, blk_q8_0, BODY_Q8_0)
DEFINE_DOT32(dot_q4_0_avx512, AVX512, dot_u8_vnni, blk_q4_0, BODY_Q4_0_U)
DEFINE_DOT32(dot_q5_0_avx512, AVX512, dot_u8_vnni, blk_q5_0, BODY_Q5_0_MASK)
DEFINE_DOT32(dot_q4_1_avx512, AVX512, dot_u8_vnni, blk_q4_1, BODY_Q4_1)
DEFINE_DOT32(dot_q5_1_avx512, AVX512, dot_u8_vnni, blk_q5_1, BODY_Q5_1_MASK)
DEFINE_DOT32(dot_iq4_nl_avx512, AVX512, dot_i8_vnni, blk_iq4_nl, BODY_IQ4_NL)
DEFINE_DOT32(dot_mxfp4_avx512, AVX512, dot_i8_vnni, blk_mxfp4, BODY_MXFP4)

/* AVX-512 VNNI: the unsigned 32-block types (Q4_0, Q5_0, Q4_1, Q5_1: bytes q_u, their
 * offset or minimum through the activation block sums, sum(w x) = d sum(q_u x) + e s): one
 * vpdpbusd per row and block instead of the sign trick's vpsignb + vpmaddubsw + vpmaddwd.
 * Gemma 3 270M's Q8_0 head (262144 x 640), 2 threads, Zen 5: four rows 8.0 -> 7.0 ms. */
#define DEFINE_DOT32_X4_VNNI(NAME, BLK, BODY)                                                       \
    AVX512 void NAME(const void *vw, const void *const *vx, int nb, float *out) {                   \
        const BLK *w = vw; X4_ROWS(act32);                                                         \
        const __m256i zero = _mm256_setzero_si256();                                               \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                \
        float e0 = 0.f, e1 = 0.f, e2 = 0.f, e3 = 0.f;                                              \
        for (int i = 0; i < nb; i++) {                                                             \
            prefetch_ahead(&w[i], (int)sizeof(BLK));                                               \
            __m256i q; float d, e; BODY;                                                           \
            VNNI_ROW(X0, a0, e0) VNNI_ROW(X1, a1, e1) VNNI_ROW(X2, a2, e2) VNNI_ROW(X3, a3, e3)    \
        }                                                                                          \
        out[0] = hsum8(a0) + e0; out[1] = hsum8(a1) + e1; out[2] = hsum8(a2) + e2; out[3] = hsum8(a3) + e3; \
    }
#define VNNI_ROW(X, A, E)                                                                           \
    {                                                                                              \
        const __m256i p = _mm256_dpbusd_epi32(zero, q, _mm256_loadu_si256((const __m256i *)X[i].qs)); \
        A = _mm256_fmadd_ps(_mm256_set1_ps(d * X[i].d), _mm256_cvtepi32_ps(p), A);                \
        E = fmaf(e, X[i].s, E);                                                                    \
    }

/* Signed weights (Q8_0, IQ4_NL's and MXFP4's values) the other way round: the activations
 * made unsigned (x ^ 0x80 = x + 128) and the weights' block sums taken back in the integer
 * sum (one vpdpbusd against ones per weight block, shared by the rows): exact, where the
 * offset of 128 on the weights through the activation sums came back as a float, d 128 s,
 * and cancelled against the float of d sum((q + 128) x): with activations of one sign
 * (sum(x) near 32 * 127), results were off by up to 1e-3 of their scale (MXFP4's values,
 * at most 12, by 2 % with that offset, and still by some with an offset of 12). */
#define DEFINE_DOT32_X4_VNNI_S(NAME, BLK, BODY)                                                     \
    AVX512 void NAME(const void *vw, const void *const *vx, int nb, float *out) {                   \
        const BLK *w = vw; X4_ROWS(act32);                                                         \
        const __m256i zero = _mm256_setzero_si256(), ones = _mm256_set1_epi8(1), flip = _mm256_set1_epi8((char)0x80); \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                \
        for (int i = 0; i < nb; i++) {                                                             \
            prefetch_ahead(&w[i], (int)sizeof(BLK));                                               \
            __m256i q; float d, e; BODY; (void)e;                                                  \
            const __m256i corr = _mm256_slli_epi32(_mm256_dpbusd_epi32(zero, ones, q), 7);         \
            VNNI_SROW(X0, a0) VNNI_SROW(X1, a1) VNNI_SROW(X2, a2) VNNI_SROW(X3, a3)                \
        }                                                                                          \
        out[0] = hsum8(a0); out[1] = hsum8(a1); out[2] = hsum8(a2); out[3] = hsum8(a3);            \
    }
#define VNNI_SROW(X, A)                                                                             \
    {                                                                                              \
        const __m256i xu = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)X[i].qs), flip);   \
        const __m256i p = _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, xu, q), corr);                \
        A = _mm256_fmadd_ps(_mm256_set1_ps(d * X[i].d), _mm256_cvtepi32_ps(p), A);                \
    }

DEFINE_DOT32_X4_VNNI_S(dot4_q8_0_avx512, blk_q8_0, X4_Q8_0)
DEFINE_DOT32_X4_VNNI(dot4_q4_0_avx512, blk_q4_0, X4_Q4_0)
DEFINE_DOT32_X4_VNNI(dot4_q5_0_avx512, blk_q5_0, X4_Q5_0)
DEFINE_DOT32_X4_VNNI(dot4_q4_1_avx512, blk_q4_1, X4_Q4_1)
DEFINE_DOT32_X4_VNNI(dot4_q5_1_avx512, blk_q5_1, X4_Q5_1)
DEFINE_DOT32_X4_VNNI_S(dot4_iq4_nl_avx512, blk_iq4_nl, X4_IQ4_NL)
DEFINE_DOT32_X4_VNNI_S(dot4_mxfp4_avx512, blk_mxfp4, X4_MXFP4)

/* Eight activation rows against one weight row (batched decode: eight sequences' rows
 * against the output head), from act32x8 blocks (gc_pack_x8): per block the weight bytes
 * are unpacked once and broadcast to both halves of a 512-bit register, and one vpdpbusd
 * takes two rows (their 64 bytes lie together); the rows' scales times the weight's
 * scale go in per lane, and the lanes are summed once per weight row, not per block.
 * Gemma 3 270M's Q8_0 head (262144 x 640), 8 rows, 2 threads, Zen 5: 14.6 ms with the
 * four-row dots twice. */
#define DEFINE_DOT32_X8_VNNI(NAME, BLK, BODY)                                                       \
    AVX512 void NAME(const void *vw, const act32x8 *x, int nb, float *out) {                         \
        const BLK *w = vw;                                                                          \
        const __m512i zero = _mm512_setzero_si512();                                                \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                 \
        __m256 ea = _mm256_setzero_ps();                                                            \
        for (int i = 0; i < nb; i++) {                                                              \
            prefetch_ahead(&w[i], (int)sizeof(BLK));                                                \
            __m256i q; float d, e; BODY;                                                            \
            const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);                \
            const __m512 dv = _mm512_set1_ps(d);                                                    \
            const act32x8 *b = &x[i];                                                               \
            X8_PAIR(0, a0) X8_PAIR(1, a1) X8_PAIR(2, a2) X8_PAIR(3, a3)                             \
            ea = _mm256_fmadd_ps(_mm256_set1_ps(e), _mm256_loadu_ps(b->s), ea);                     \
        }                                                                                           \
        float lo[8];                                                                                \
        _mm256_storeu_ps(lo, ea);                                                                   \
        X8_OUT(0, a0) X8_OUT(1, a1) X8_OUT(2, a2) X8_OUT(3, a3)                                     \
    }
/* signed weights: as the four-row dots above, the activations unsigned and the weights'
 * block sums taken back in the integer sums */
#define DEFINE_DOT32_X8_VNNI_S(NAME, BLK, BODY)                                                     \
    AVX512 void NAME(const void *vw, const act32x8 *x, int nb, float *out) {                         \
        const BLK *w = vw;                                                                          \
        const __m512i zero = _mm512_setzero_si512(), flip = _mm512_set1_epi8((char)0x80);           \
        const __m256i ones = _mm256_set1_epi8(1);                                                   \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                 \
        for (int i = 0; i < nb; i++) {                                                              \
            prefetch_ahead(&w[i], (int)sizeof(BLK));                                                \
            __m256i q; float d, e; BODY; (void)e;                                                   \
            const __m256i c = _mm256_slli_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q), 7); \
            const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);                 \
            const __m512i corr = _mm512_inserti64x4(_mm512_castsi256_si512(c), c, 1);               \
            const __m512 dv = _mm512_set1_ps(d);                                                    \
            const act32x8 *b = &x[i];                                                               \
            X8_SPAIR(0, a0) X8_SPAIR(1, a1) X8_SPAIR(2, a2) X8_SPAIR(3, a3)                         \
        }                                                                                           \
        const float lo[8] = {0};                                                                    \
        X8_OUT(0, a0) X8_OUT(1, a1) X8_OUT(2, a2) X8_OUT(3, a3)                                     \
    }
#define X8_SPAIR(J, A)                                                                              \
    {                                                                                               \
        const __m512i xu = _mm512_xor_si512(_mm512_loadu_si512((const void *)b->qs[2 * (J)]), flip); \
        const __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, xu, qq), corr);                \
        A = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dv, _mm512_loadu_ps(b->dx[J])), A); \
    }
#define X8_PAIR(J, A)                                                                               \
    {                                                                                               \
        const __m512i p = _mm512_dpbusd_epi32(zero, qq, _mm512_loadu_si512((const void *)b->qs[2 * (J)])); \
        A = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dv, _mm512_loadu_ps(b->dx[J])), A); \
    }
#define X8_OUT(J, A)                                                                                \
    out[2 * (J)] = hsum8(_mm512_castps512_ps256(A)) + lo[2 * (J)];                                  \
    out[2 * (J) + 1] = hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(A), 1))) + lo[2 * (J) + 1];

DEFINE_DOT32_X8_VNNI_S(dotx8_q8_0_avx512, blk_q8_0, X4_Q8_0)
DEFINE_DOT32_X8_VNNI(dotx8_q4_0_avx512, blk_q4_0, X4_Q4_0)
DEFINE_DOT32_X8_VNNI(dotx8_q5_0_avx512, blk_q5_0, X4_Q5_0)
DEFINE_DOT32_X8_VNNI(dotx8_q4_1_avx512, blk_q4_1, X4_Q4_1)
DEFINE_DOT32_X8_VNNI(dotx8_q5_1_avx512, blk_q5_1, X4_Q5_1)
DEFINE_DOT32_X8_VNNI_S(dotx8_iq4_nl_avx512, blk_iq4_nl, X4_IQ4_NL)
DEFINE_DOT32_X8_VNNI_S(dotx8_mxfp4_avx512, blk_mxfp4, X4_MXFP4)

/* the eight-row dot for a 32-block type, or NULL */
dotx8_fn dotx8_for(int type) {
    switch (type) {
    case T_Q8_0: return dotx8_q8_0_avx512;
    case T_Q4_0: return dotx8_q4_0_avx512;
    case T_Q5_0: return dotx8_q5_0_avx512;
    case T_Q4_1: return dotx8_q4_1_avx512;
    case T_Q5_1: return dotx8_q5_1_avx512;
    case T_IQ4_NL: return dotx8_iq4_nl_avx512;
    case T_MXFP4: return dotx8_mxfp4_avx512;
    default: return NULL;
    }
}

/* eight act32 rows (xs[r] at x + r * row_bytes, nb blocks each) as act32x8 blocks */
void pack_x8(const uint8_t *x, size_t row_bytes, int nb, act32x8 *out) {
    for (int i = 0; i < nb; i++) {
        act32x8 *o = &out[i];
        for (int r = 0; r < 8; r++) {
            const act32 *a = (const act32 *)(x + r * row_bytes) + i;
            for (int l = 0; l < 8; l++) o->dx[r / 2][(r % 2) * 8 + l] = a->d;
            o->s[r] = a->s;
            memcpy(o->qs[r], a->qs, 32);
        }
    }
}

DEFINE_Q2K(dot_q2_K_avx512, AVX512)
DEFINE_Q3K(dot_q3_K_avx512, AVX512)
DEFINE_IQ4XS(dot_iq4_xs_avx512, AVX512)

/* ---- AVX-512 k-quants: 64 weight bytes per vector. Unsigned weights times signed
 * activations in pairs (vpmaddubsw, no saturation for these ranges), then a multiply-add
 * with the sub-block scales as 16-bit lanes (vpmaddwd), so the scales cost one
 * permute per vector instead of a 32-bit multiply. */

/* two 32-byte pieces as one vector */
AVX512 static inline __m512i load_2x32(const void *lo, const void *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                              _mm256_loadu_si256((const __m256i *)hi), 1);
}

/* 16-bit lanes 0-15 take lane a of a permuted vector, lanes 16-31 lane b */
AVX512 static inline __m512i lanes_2x16(int a, int b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)a)), _mm256_set1_epi16((short)b), 1);
}

/* 16-bit lanes 8g..8g+7 take lane first+g (g = 0..3) */
AVX512 static inline __m512i lanes_4x8(int first) {
    return _mm512_cvtepu8_epi16(_mm256_setr_epi64x(0x0101010101010101LL * first, 0x0101010101010101LL * (first + 1),
                                                  0x0101010101010101LL * (first + 2), 0x0101010101010101LL * (first + 3)));
}

AVX512 static inline float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

/* Q4_K / Q5_K scales: the 12 bytes as 8 six-bit scales (bytes 0-7) and 8 mins (8-15) */

/* A 64-byte load of qs holds chunks 2p and 2p+1: low nibbles are sub-blocks 4p and 4p+2
 * (activations 128p and 128p+64), high nibbles 4p+1 and 4p+3. Q5_K's fifth bit of
 * element 64c + 32h + l is bit 2c + h of qh[l]. */
/* R activation rows (1 or 4), each row's arithmetic the same whatever R is (the weights
 * unpacked once for all): the one-row and four-row dots are its two instances, so batched
 * decode gives each row the bits it gets alone */
#define DEFINE_Q45K_512(NAME, NAME4, BLK, FIVE)                                                     \
    AVX512 static inline __attribute__((always_inline)) void NAME##_rows(const BLK *w, const act256 *const *X, \
                                                                        const int R, int nb, float *out) { \
        const __m512i m4 = _mm512_set1_epi8(0xF);                                                  \
        const __m512i sel[4] = {lanes_2x16(0, 2), lanes_2x16(1, 3), lanes_2x16(4, 6), lanes_2x16(5, 7)}; \
        __m512 acc[4]; __m128 accm[4];                                                              \
        for (int r = 0; r < R; r++) { acc[r] = _mm512_setzero_ps(); accm[r] = _mm_setzero_ps(); }  \
        for (int i = 0; i < nb; i++) {                                                             \
            prefetch_ahead(&w[i], (int)sizeof(BLK));                                               \
            uint32_t sm[4];                                                                        \
            k4_scales_mins(w[i].scales, sm);                                                        \
            const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)sm));       \
            const __m512i sc = _mm512_castsi256_si512(sm16);                                       \
            __m512i wl[2], wh[2], sl[2], sh[2];                                                    \
            for (int p = 0; p < 2; p++) {                                                          \
                const __m512i q = _mm512_loadu_si512((const void *)(w[i].qs + 64 * p));            \
                __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4); \
                FIVE                                                                               \
                wl[p] = lo; wh[p] = hi;                                                            \
                sl[p] = _mm512_permutexvar_epi16(sel[2 * p], sc);                                  \
                sh[p] = _mm512_permutexvar_epi16(sel[2 * p + 1], sc);                              \
            }                                                                                      \
            for (int r = 0; r < R; r++) {                                                          \
                const __m256i bs = _mm256_loadu_si256((const __m256i *)X[r][i].bsums);             \
                const __m128i bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)); \
                const __m128i mins = _mm_madd_epi16(_mm256_extracti128_si256(sm16, 1), bs32);      \
                __m512i sum = _mm512_setzero_si512();                                              \
                for (int p = 0; p < 2; p++) {                                                      \
                    const int8_t *xq = X[r][i].qs + 128 * p;                                       \
                    const __m512i pl = _mm512_maddubs_epi16(wl[p], load_2x32(xq, xq + 64));        \
                    const __m512i ph = _mm512_maddubs_epi16(wh[p], load_2x32(xq + 32, xq + 96));   \
                    sum = _mm512_add_epi32(sum, _mm512_madd_epi16(pl, sl[p]));                     \
                    sum = _mm512_add_epi32(sum, _mm512_madd_epi16(ph, sh[p]));                     \
                }                                                                                  \
                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(H2F(w[i].d) * X[r][i].d), _mm512_cvtepi32_ps(sum), acc[r]); \
                accm[r] = _mm_fmadd_ps(_mm_set1_ps(H2F(w[i].dmin) * X[r][i].d), _mm_cvtepi32_ps(mins), accm[r]); \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < R; r++) out[r] = hsum16(acc[r]) - hsum4(accm[r]);                       \
    }                                                                                              \
    DEFINE_ROWS_1_4(AVX512, NAME, NAME4, NAME##_rows)

#define Q5_FIVE                                                                                     \
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)w[i].qh));      \
    const __m512i b16 = _mm512_set1_epi8(0x10);                                                   \
    lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, lanes_bits(4 * p, 4 * p + 2)), lo, b16); \
    hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, lanes_bits(4 * p + 1, 4 * p + 3)), hi, b16);

/* bytes 0-31: bit a, bytes 32-63: bit b */
AVX512 static inline __m512i lanes_bits(int a, int b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi8((char)(1 << a))), _mm256_set1_epi8((char)(1 << b)), 1);
}

DEFINE_Q45K_512(dot_q4_K_avx512, dot4_q4_K_avx512, blk_q4_K, )
DEFINE_Q45K_512(dot_q5_K_avx512, dot4_q5_K_avx512, blk_q5_K, Q5_FIVE)


/* Q6_K: a 64-byte load of ql (half h) gives, from its low nibbles, elements 128h..+63 and
 * from its high nibbles 128h+64..+63; qh adds bits 4-5 from bit pairs 0/2 and 4/6.
 * q is 0..63 with offset 32: sum((q - 32) x) = sum(q x) - 32 sum(x) per 16 (bsums). */
/* R activation rows (1 or 4) from one body, as DEFINE_Q45K_512: each row's arithmetic is
 * the same whatever R is */
AVX512 static inline __attribute__((always_inline)) void q6k512_rows(const blk_q6_K *w, const act256 *const *X,
                                                                    const int R, int nb, float *out) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    const __m512i sel[4] = {lanes_4x8(0), lanes_4x8(4), lanes_4x8(8), lanes_4x8(12)};
    const __m512i shl = lanes_2x16(4, 2), shr = lanes_2x16(0, 2);
    __m512 acc[4]; __m256 accoff[4];
    for (int r = 0; r < R; r++) { acc[r] = _mm512_setzero_ps(); accoff[r] = _mm256_setzero_ps(); }
    for (int i = 0; i < nb; i++) {
        prefetch_ahead(&w[i], (int)sizeof(blk_q6_K));
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        const __m512i sc = _mm512_castsi256_si512(sc16);
        __m512i lo[2], hi[2], s[4];
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512((const void *)(w[i].ql + 64 * h));
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h)));
            lo[h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
            hi[h] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                    _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
            s[2 * h] = _mm512_permutexvar_epi16(sel[2 * h], sc);
            s[2 * h + 1] = _mm512_permutexvar_epi16(sel[2 * h + 1], sc);
        }
        const float d = H2F(w[i].d);
        for (int r = 0; r < R; r++) {
            const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)X[r][i].bsums));
            __m512i sum = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                const int8_t *xq = X[r][i].qs + 128 * h;
                const __m512i pl = _mm512_maddubs_epi16(lo[h], _mm512_loadu_si512((const void *)xq));
                const __m512i ph = _mm512_maddubs_epi16(hi[h], _mm512_loadu_si512((const void *)(xq + 64)));
                sum = _mm512_add_epi32(sum, _mm512_madd_epi16(pl, s[2 * h]));
                sum = _mm512_add_epi32(sum, _mm512_madd_epi16(ph, s[2 * h + 1]));
            }
            const float dx = d * X[r][i].d;
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(dx), _mm512_cvtepi32_ps(sum), acc[r]);
            accoff[r] = _mm256_fmadd_ps(_mm256_set1_ps(32.f * dx), _mm256_cvtepi32_ps(off), accoff[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum16(acc[r]) - hsum8(accoff[r]);
}

DEFINE_ROWS_1_4(AVX512, dot_q6_K_avx512, dot4_q6_K_avx512, q6k512_rows)

/* ---- AVX-512 activation quantization: the scalar functions' arithmetic, 16 lanes at a
 * time (vcvtps2dq rounds to nearest even, as lrintf does in the default mode). */

AVX512 void quantize_act32_avx512(const float *x, act32 *y, int64_t k) {
    for (int64_t i = 0; i < k / 32; i++) {
        const __m512 a = _mm512_loadu_ps(x + 32 * i), b = _mm512_loadu_ps(x + 32 * i + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        const float d = amax / 127.f, id = d ? 1.f / d : 0.f;
        const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(id)));
        const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(id)));
        _mm_storeu_si128((__m128i *)y[i].qs, _mm512_cvtsepi32_epi8(qa));
        _mm_storeu_si128((__m128i *)(y[i].qs + 16), _mm512_cvtsepi32_epi8(qb));
        y[i].d = d;
        y[i].s = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    }
}

AVX512 void quantize_act256_avx512(const float *x, act256 *y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float *xb = x + QK_K * i;
        __m512 vmax = _mm512_loadu_ps(xb), vmin = vmax;
        for (int j = 16; j < QK_K; j += 16) {
            const __m512 v = _mm512_loadu_ps(xb + j);
            vmax = _mm512_max_ps(vmax, v);
            vmin = _mm512_min_ps(vmin, v);
        }
        const float hi = _mm512_reduce_max_ps(vmax), lo = _mm512_reduce_min_ps(vmin);
        const float amax = fmaxf(hi, -lo);
        if (amax == 0.f) {
            memset(&y[i], 0, sizeof(act256));
            continue;
        }
        /* the extreme maps to -127; when +a and -a tie, either sign gives the same products */
        const float max = hi >= -lo ? hi : lo;
        const float iscale = -127.f / max;
        const __m512 vs = _mm512_set1_ps(iscale);
        for (int j = 0; j < 16; j++) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * j), vs));
            q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * j), _mm512_cvtsepi32_epi8(q));
            y[i].bsums[j] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        y[i].d = 1.f / iscale;
    }
}

#endif /* GC_X86 */
