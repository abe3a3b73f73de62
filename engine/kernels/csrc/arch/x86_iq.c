/* The x86-64 dots of the types iq.h expands (one and four activation rows from one body,
 * built for the AVX2 and the AVX-512 level), F16 / BF16 against float32 activations, and
 * the blocks as 256 signed bytes for the tiles (x86_tiles.c). A group's words become one
 * 32-byte vector; with the sign trick (|w| . x with x signed as w) vpmaddubsw pairs them
 * with the activations and vpmaddwd applies the halves' scales. */

#include "x86.h"
#include "../iq.h"

#ifdef GC_X86

/* a group as a vector, and its two scales as 16-bit lanes (0-7: the first half's) */
#define IQ_VEC(e) _mm256_set_epi64x((long long)(e).v[3], (long long)(e).v[2], (long long)(e).v[1], (long long)(e).v[0])
#define IQ_SC(e) _mm256_setr_m128i(_mm_set1_epi16((short)(e).s[0]), _mm_set1_epi16((short)(e).s[1]))

/* Q1_0, Q2_0: G groups a block, each meeting its own act32 block */
#define B32_ROWS(t, B, G, TARGET, SFX)                                                               \
    TARGET static inline __attribute__((always_inline)) void t##_rows_##SFX(const void *vw, const act32 *const *X, \
                                                                          const int R, int nb, float *out) { \
        const B *w = vw;                                                                             \
        __m256 acc[4];                                                                               \
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                    \
        for (int i = 0; i < nb; i++) {                                                               \
            prefetch_ahead(&w[i], (int)sizeof(B));                                                   \
            const float d = H2F(w[i].d);                                                             \
            for (int g = 0; g < G; g++) {                                                            \
                iq_group e;                                                                          \
                iqx_##t(&w[i], g, &e);                                                               \
                const __m256i q = IQ_VEC(e), qa = _mm256_sign_epi8(q, q);                            \
                for (int r = 0; r < R; r++) {                                                        \
                    const act32 *xb = &X[r][G * i + g];                                              \
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);                  \
                    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(xv, q)), _mm256_set1_epi16(1)); \
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r]); \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
        for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]);                                          \
    }                                                                                                \
    TARGET float dot_##t##_##SFX(const void *vw, const void *vx, int nb) {                           \
        const act32 *X[1] = {vx};                                                                    \
        float o;                                                                                     \
        t##_rows_##SFX(vw, X, 1, nb, &o);                                                            \
        return o;                                                                                    \
    }                                                                                                \
    TARGET void dot4_##t##_##SFX(const void *vw, const void *const *vx, int nb, float *out) {        \
        t##_rows_##SFX(vw, (const act32 *const *)vx, 4, nb, out);                                    \
    }

/* A group of a grid type as vectors: u the weights' magnitudes (unsigned bytes), sg their
 * signs (bytes whose sign vpsignb puts on the activations), sc the halves' scales. The
 * sign-and-grid types: the grid bytes, and -1 / +1 from the 32 sign bits. IQ1_S, IQ1_M: the
 * bytes 8 g +- 1 made in the vector unit (g's sign on 8, the deltas as -1 / +1 per eight
 * bytes from the four sign bits), then |v| and v. */
#define SPLIT_VECS(t)                                                                                \
    AVX2 static inline void vecs_##t(const void *blk, int g, __m256i *u, __m256i *sg, __m256i *sc) { \
        iq_split e;                                                                                  \
        iqs_##t(blk, g, &e);                                                                         \
        *u = _mm256_set_epi64x((long long)e.g[3], (long long)e.g[2], (long long)e.g[1], (long long)e.g[0]); \
        *sg = _mm256_or_si256(bits_to_bytes(e.sg), _mm256_set1_epi8(1));                            \
        *sc = IQ_SC(e);                                                                              \
    }
#define IQ1_VECS(t)                                                                                  \
    AVX2 static inline void vecs_##t(const void *blk, int g, __m256i *u, __m256i *sg, __m256i *sc) { \
        iq1_split e;                                                                                 \
        iqs_##t(blk, g, &e);                                                                         \
        const __m256i gv = _mm256_set_epi64x((long long)e.g[3], (long long)e.g[2], (long long)e.g[1], (long long)e.g[0]); \
        const __m256i bit = _mm256_setr_epi64x(1, 2, 4, 8);                                          \
        const __m256i neg = _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi64x(e.neg), bit), bit); \
        *sg = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), gv), _mm256_or_si256(neg, _mm256_set1_epi8(1))); \
        *u = _mm256_sign_epi8(*sg, *sg);                                                             \
        *sc = IQ_SC(e);                                                                              \
    }
#define SPLIT_VECS_OF(t, B) SPLIT_VECS(t)
GC_SPLIT_TYPES(SPLIT_VECS_OF)
IQ1_VECS(iq1_s)
IQ1_VECS(iq1_m)

/* R activation rows (act256) against a row of a grid type: out[r] */
#define GRID_ROWS(t, B, TARGET, SFX)                                                                 \
    TARGET static inline __attribute__((always_inline)) void t##_rows_##SFX(const void *vw, const act256 *const *X, \
                                                                          const int R, int nb, float *out) { \
        const B *w = vw;                                                                             \
        float acc[4] = {0.f, 0.f, 0.f, 0.f};                                                         \
        for (int i = 0; i < nb; i++) {                                                               \
            prefetch_ahead(&w[i], (int)sizeof(B));                                                   \
            __m256i sum[4];                                                                          \
            for (int r = 0; r < R; r++) sum[r] = _mm256_setzero_si256();                             \
            for (int g = 0; g < 8; g++) {                                                            \
                __m256i u, sg, sc;                                                                   \
                vecs_##t(&w[i], g, &u, &sg, &sc);                                                    \
                for (int r = 0; r < R; r++) {                                                        \
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)(X[r][i].qs + 32 * g));   \
                    sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(xv, sg)), sc)); \
                }                                                                                    \
            }                                                                                        \
            const float d = iqd_##t(&w[i]);                                                          \
            for (int r = 0; r < R; r++) acc[r] += (d * X[r][i].d) * (float)hsum_i32_avx2(sum[r]);   \
        }                                                                                            \
        for (int r = 0; r < R; r++) out[r] = acc[r];                                                 \
    }                                                                                                \
    DEFINE_ROWS_1_4(TARGET, dot_##t##_##SFX, dot4_##t##_##SFX, t##_rows_##SFX)

#define GRID_AVX2(t, B) GRID_ROWS(t, B, AVX2, avx2)
#define GRID_AVX512(t, B) GRID_ROWS(t, B, AVX512, avx512)
GC_GRID_TYPES(GRID_AVX2)

/* ---- AVX-512: the sign-and-grid and IQ1 types a whole block at a time. The 32 grid
 * points of a block come in four gathers of eight, the signs as four 64-bit masks that
 * one masked subtraction puts on 64 activation bytes, the 16 halves' scales as 16-bit
 * lanes for vpmaddwd: a fifth of the instructions per weight of the group-at-a-time body
 * above. The integer sums are the same, and so is the float step, so the same bits. */
typedef struct {
    __m512i u[4];      /* weights 64c .. 64c + 63: magnitudes (unsigned bytes) */
    __mmask64 neg[4];  /* ...and which of them are negative */
    __m512i sc[4];     /* ...16-bit lanes 8h .. 8h + 7: the scale of weights 64c + 16h .. */
    __m256i s16;       /* the scales of weights 16h .. 16h + 15 of the block */
} blk512;

/* the 16 halves' scales (16-bit lanes) as four vectors for vpmaddwd: lane k of chunk c
 * holds half 4c + k / 8's */
static const int16_t half_of_lane[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};

AVX512 static inline void scales512(__m256i s16, blk512 *o) {
    const __m512i s = _mm512_castsi256_si512(s16), base = _mm512_loadu_si512(half_of_lane);
    o->s16 = s16;
    for (int c = 0; c < 4; c++) o->sc[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16((short)(4 * c))), s);
}

/* two scales of a byte's nibbles, 2 s + 1, for the halves of 8 groups */
AVX512 static inline __m256i nibble_scales(const uint8_t *sc8) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)sc8);
    const __m128i n = _mm_unpacklo_epi8(_mm_and_si128(b, _mm_set1_epi8(15)), _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15)));
    return _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(n), 1), _mm256_set1_epi16(1));
}

AVX512 static inline void blk512_iq2_xs(const blk_iq2_xs *b, blk512 *o) {
    const __m512i q = _mm512_loadu_si512(b->qs);
    const __m512i idx = _mm512_and_si512(q, _mm512_set1_epi16(511));
    o->u[0] = _mm512_i32gather_epi64(_mm256_cvtepu16_epi32(_mm512_extracti32x4_epi32(idx, 0)), grid_iq2xs, 8);
    o->u[1] = _mm512_i32gather_epi64(_mm256_cvtepu16_epi32(_mm512_extracti32x4_epi32(idx, 1)), grid_iq2xs, 8);
    o->u[2] = _mm512_i32gather_epi64(_mm256_cvtepu16_epi32(_mm512_extracti32x4_epi32(idx, 2)), grid_iq2xs, 8);
    o->u[3] = _mm512_i32gather_epi64(_mm256_cvtepu16_epi32(_mm512_extracti32x4_epi32(idx, 3)), grid_iq2xs, 8);
    /* seven sign bits and their parity (ggml's ksigns_iq2xs) */
    const __m512i s = _mm512_srli_epi16(q, 9);
    __m512i p = _mm512_xor_si512(s, _mm512_srli_epi16(s, 4));
    p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 2));
    p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 1));
    uint64_t m[4];
    _mm256_storeu_si256((__m256i *)m, _mm512_cvtepi16_epi8(_mm512_or_si512(s, _mm512_slli_epi16(_mm512_and_si512(p, _mm512_set1_epi16(1)), 7))));
    for (int c = 0; c < 4; c++) o->neg[c] = _cvtu64_mask64(m[c]);
    scales512(nibble_scales(b->scales), o);
}

AVX512 static inline void blk512_iq2_s(const blk_iq2_s *b, blk512 *o) {
    const __m256i sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    for (int c = 0; c < 4; c++) { /* index 8c + j: qs[8c + j] and bits 2 (j % 4) of qh[2c + j / 4], as bits 8, 9 */
        const __m256i h = _mm256_set1_epi32((int)(b->qh[2 * c] | (unsigned)b->qh[2 * c + 1] << 8));
        const __m256i idx = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * c))),
                                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(h, sh), _mm256_set1_epi32(3)), 8));
        o->u[c] = _mm512_i32gather_epi64(idx, grid_iq2s, 8);
        o->neg[c] = _cvtu64_mask64(ld64(b->signs + 8 * c));
    }
    scales512(nibble_scales(b->scales), o);
}

/* IQ1: bytes 8 g +- 1 from the grid points g (-1, 0, 1) and the delta's sign per group;
 * kneg: bit j set where the delta of weights 8j .. 8j + 7 of the chunk is negative */
AVX512 static inline void iq1_chunk(__m512i grid, __mmask8 kneg, blk512 *o, int c) {
    const __m512i v8 = _mm512_and_si512(_mm512_slli_epi16(grid, 3), _mm512_set1_epi8((char)0xF8));
    const __m512i v = _mm512_add_epi8(v8, _mm512_mask_blend_epi64(kneg, _mm512_set1_epi8(1), _mm512_set1_epi8(-1)));
    o->u[c] = _mm512_abs_epi8(v);
    o->neg[c] = _mm512_movepi8_mask(v);
}

AVX512 static inline void blk512_iq1_s(const blk_iq1_s *b, blk512 *o) {
    const __m256i sh = _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9);
    for (int c = 0; c < 4; c++) { /* groups 2c, 2c + 1: index 4 g + l is qs[4 g + l] and bits 3 l of qh[g] as bits 8..10 */
        const unsigned h0 = b->qh[2 * c], h1 = b->qh[2 * c + 1];
        const __m256i h = _mm256_setr_m128i(_mm_set1_epi32((int)h0), _mm_set1_epi32((int)h1));
        const __m256i idx = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * c))),
                                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(h, sh), _mm256_set1_epi32(7)), 8));
        iq1_chunk(_mm512_i32gather_epi64(idx, grid_iq1s, 8), (__mmask8)((h0 & 0x8000 ? 0x0F : 0) | (h1 & 0x8000 ? 0xF0 : 0)), o, c);
    }
    /* both halves of group g: 2 (bits 12..14 of qh[g]) + 1 */
    const __m128i h = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)b->qh), 12), _mm_set1_epi16(7));
    const __m128i s = _mm_add_epi16(_mm_slli_epi16(h, 1), _mm_set1_epi16(1));
    scales512(_mm256_setr_m128i(_mm_unpacklo_epi16(s, s), _mm_unpackhi_epi16(s, s)), o);
}

AVX512 static inline void blk512_iq1_m(const blk_iq1_m *b, blk512 *o) {
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    for (int c = 0; c < 4; c++) { /* index j of chunk c: qs[8c + j] and nibble j of qh[4c..4c+3]: 3 index bits, the delta's sign */
        const __m256i h = _mm256_srlv_epi32(_mm256_set1_epi32((int)ld32(b->qh + 4 * c)), sh);
        const __m256i idx = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * c))),
                                            _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(7)), 8));
        iq1_chunk(_mm512_i32gather_epi64(idx, grid_iq1s, 8), _mm256_test_epi32_mask(h, _mm256_set1_epi32(8)), o, c);
    }
    /* halves 2g, 2g + 1: bits 6 (g % 2) .. of sc[g / 2], three each: 2 s + 1 */
    const uint64_t rep = 0x0001000100010001ull;
    const __m256i sc = _mm256_set_epi64x((long long)(b->sc[3] * rep), (long long)(b->sc[2] * rep), (long long)(b->sc[1] * rep),
                                         (long long)(b->sc[0] * rep));
    const __m256i s = _mm256_and_si256(_mm256_srlv_epi16(sc, _mm256_setr_epi16(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9)),
                                       _mm256_set1_epi16(7));
    scales512(_mm256_add_epi16(_mm256_slli_epi16(s, 1), _mm256_set1_epi16(1)), o);
}

/* seven sign bits per byte of t (bit 7 clear) completed with their parity (ggml's
 * ksigns_iq2xs), as the 64-bit masks of four chunks */
AVX512 static inline void ksigns512(__m256i t, blk512 *o) {
    const __m256i n4 = _mm256_set1_epi8(0x0F);
    __m256i p = _mm256_xor_si256(t, _mm256_and_si256(_mm256_srli_epi32(t, 4), n4));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    uint64_t m[4];
    _mm256_storeu_si256((__m256i *)m, _mm256_or_si256(t, _mm256_slli_epi32(_mm256_and_si256(p, _mm256_set1_epi8(1)), 7)));
    for (int c = 0; c < 4; c++) o->neg[c] = _cvtu64_mask64(m[c]);
}

/* 8 words (one a group) holding four 7-bit sign fields and a 4-bit scale on top: bytes
 * 4g + l the fields, and the groups' scales 2 s + 1 for both halves */
AVX512 static inline void packed_signs512(__m256i w, blk512 *o) {
    const __m256i m7 = _mm256_set1_epi32(127);
    const __m256i t = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(w, m7), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w, 7), m7), 8)),
                                      _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w, 14), m7), 16),
                                                      _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w, 21), m7), 24)));
    ksigns512(t, o);
    const __m256i s = _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(w, 28), 1), _mm256_set1_epi32(1));
    /* each group's scale in both 16-bit halves of its lane: the halves 2g, 2g + 1 */
    scales512(_mm256_or_si256(s, _mm256_slli_epi32(s, 16)), o);
}

AVX512 static inline void blk512_iq2_xxs(const blk_iq2_xxs *b, blk512 *o) {
    /* group g: words 2g (four grid indices) and 2g + 1 (signs and scale) */
    const __m512i w = _mm512_loadu_si512(b->qs);
    const __m256i idx = _mm512_cvtepi64_epi32(_mm512_and_si512(w, _mm512_set1_epi64(0xFFFFFFFF)));
    const __m256i sg = _mm512_cvtepi64_epi32(_mm512_srli_epi64(w, 32));
    uint64_t ix[4];
    _mm256_storeu_si256((__m256i *)ix, idx);
    for (int c = 0; c < 4; c++)
        o->u[c] = _mm512_i32gather_epi64(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)ix[c])), grid_iq2xxs, 8);
    packed_signs512(sg, o);
}

AVX512 static inline void blk512_iq3_xxs(const blk_iq3_xxs *b, blk512 *o) {
    for (int c = 0; c < 4; c++) /* 16 indices of four bytes each */
        o->u[c] = _mm512_i32gather_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16 * c))), grid_iq3xxs, 4);
    packed_signs512(_mm256_loadu_si256((const __m256i *)b->ss), o);
}

AVX512 static inline void blk512_iq3_s(const blk_iq3_s *b, blk512 *o) {
    const __m512i sh = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int c = 0; c < 4; c++) { /* index 16c + m: qs[16c + m] and bit m of qh[2c] | qh[2c + 1] << 8 as bit 8 */
        const __m512i h = _mm512_set1_epi32((int)(b->qh[2 * c] | (unsigned)b->qh[2 * c + 1] << 8));
        const __m512i idx = _mm512_or_si512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16 * c))),
                                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(h, sh), _mm512_set1_epi32(1)), 8));
        o->u[c] = _mm512_i32gather_epi32(idx, grid_iq3s, 4);
        o->neg[c] = _cvtu64_mask64(ld64(b->signs + 8 * c));
    }
    /* group g (both halves): 1 + 2 (nibble g % 2 of scales[g / 2]) */
    const __m128i sb = _mm_cvtsi32_si128((int)ld32(b->scales));
    const __m128i n = _mm_unpacklo_epi8(_mm_and_si128(sb, _mm_set1_epi8(15)), _mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(15)));
    const __m128i s = _mm_add_epi16(_mm_slli_epi16(_mm_cvtepu8_epi16(n), 1), _mm_set1_epi16(1));
    scales512(_mm256_setr_m128i(_mm_unpacklo_epi16(s, s), _mm_unpackhi_epi16(s, s)), o);
}

#define GRID512_ROWS(t, B)                                                                           \
    AVX512 static inline __attribute__((always_inline)) void t##_rows_avx512(const void *vw, const act256 *const *X, \
                                                                           const int R, int nb, float *out) { \
        const B *w = vw;                                                                             \
        float acc[4] = {0.f, 0.f, 0.f, 0.f};                                                         \
        for (int i = 0; i < nb; i++) {                                                               \
            prefetch_ahead(&w[i], (int)sizeof(B));                                                   \
            blk512 k;                                                                                \
            blk512_##t(&w[i], &k);                                                                   \
            __m512i sum[4];                                                                          \
            for (int r = 0; r < R; r++) sum[r] = _mm512_setzero_si512();                             \
            for (int c = 0; c < 4; c++)                                                              \
                for (int r = 0; r < R; r++) {                                                        \
                    const __m512i x = _mm512_loadu_si512(X[r][i].qs + 64 * c);                       \
                    const __m512i xs = _mm512_mask_sub_epi8(x, k.neg[c], _mm512_setzero_si512(), x); \
                    sum[r] = _mm512_add_epi32(sum[r], _mm512_madd_epi16(_mm512_maddubs_epi16(k.u[c], xs), k.sc[c])); \
                }                                                                                    \
            const float d = iqd_##t(&w[i]);                                                          \
            for (int r = 0; r < R; r++) acc[r] += (d * X[r][i].d) * (float)_mm512_reduce_add_epi32(sum[r]); \
        }                                                                                            \
        for (int r = 0; r < R; r++) out[r] = acc[r];                                                 \
    }                                                                                                \
    DEFINE_ROWS_1_4(AVX512, dot_##t##_avx512, dot4_##t##_avx512, t##_rows_avx512)
GC_GRID_TYPES(GRID512_ROWS)

/* a block as iq_expand gives it (for the tiles and AMX's strips) */
#define T_iq2_xxs T_IQ2_XXS
#define T_iq2_xs T_IQ2_XS
#define T_iq2_s T_IQ2_S
#define T_iq3_xxs T_IQ3_XXS
#define T_iq3_s T_IQ3_S
#define T_iq1_s T_IQ1_S
#define T_iq1_m T_IQ1_M
AVX512 static int iq_expand512(int type, const void *blk, int8_t *q, int16_t *sc, float *d) {
    blk512 k;
    switch (type) {
#define EXPAND512(t, B) case T_##t: blk512_##t(blk, &k); *d = iqd_##t(blk); break;
        GC_GRID_TYPES(EXPAND512)
    default:
        return 0;
    }
    for (int c = 0; c < 4; c++) _mm512_storeu_si512(q + 64 * c, _mm512_mask_sub_epi8(k.u[c], k.neg[c], _mm512_setzero_si512(), k.u[c]));
    _mm256_storeu_si256((__m256i *)sc, k.s16);
    return 1;
}

/* ---- TQ1_0, TQ2_0: a group's digits (0..2, the weights + 1) unpacked in the vector unit,
 * unsigned for vpmaddubsw; the offset 1 through the activation sums */

/* (q x mul mod 256) x 3 >> 8 for each byte of q: mul per 16-bit lane, for its two bytes */
AVX2 static inline __m256i trits32(__m256i q, __m256i mul) {
    const __m256i lo = _mm256_set1_epi16(0xFF), three = _mm256_set1_epi16(768);
    const __m256i e = _mm256_mulhi_epu16(_mm256_and_si256(_mm256_mullo_epi16(_mm256_and_si256(q, lo), mul), lo), three);
    const __m256i o = _mm256_mulhi_epu16(_mm256_and_si256(_mm256_mullo_epi16(_mm256_srli_epi16(q, 8), mul), lo), three);
    return _mm256_or_si256(e, _mm256_slli_epi16(o, 8));
}

AVX2 static inline __m256i tq1_0_group(const blk_tq1_0 *b, int g) {
    if (g < 5) return trits32(_mm256_loadu_si256((const __m256i *)b->qs), _mm256_set1_epi16(pow3[g]));
    const __m128i hi = _mm_loadu_si128((const __m128i *)(b->qs + 32));
    if (g < 7) {
        const int j0 = 2 * (g - 5);
        return trits32(_mm256_setr_m128i(hi, hi), _mm256_setr_m128i(_mm_set1_epi16(pow3[j0]), _mm_set1_epi16(pow3[j0 + 1])));
    }
    /* qs[32..47]'s last digit, then digit j of qh[m] for weights 240 + 4j + m */
    const __m256i q = _mm256_setr_m128i(hi, _mm_set1_epi32((int)ld32(b->qh)));
    return trits32(q, _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27));
}

AVX2 static inline __m256i tq2_0_group(const blk_tq2_0 *b, int g) {
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * (g / 4)));
    return _mm256_and_si256(_mm256_srli_epi16(q, 2 * (g % 4)), _mm256_set1_epi8(3));
}

#define TQ_ROWS(t, B, TARGET, SFX)                                                                   \
    TARGET static inline __attribute__((always_inline)) void t##_rows_##SFX(const void *vw, const act256 *const *X, \
                                                                          const int R, int nb, float *out) { \
        const B *w = vw;                                                                             \
        const __m256i ones = _mm256_set1_epi16(1);                                                   \
        float acc[4] = {0.f, 0.f, 0.f, 0.f};                                                         \
        for (int i = 0; i < nb; i++) {                                                               \
            prefetch_ahead(&w[i], (int)sizeof(B));                                                   \
            __m256i sum[4]; /* 16-bit: eight groups of two products of up to 2 x 127 */              \
            for (int r = 0; r < R; r++) sum[r] = _mm256_setzero_si256();                             \
            for (int g = 0; g < 8; g++) {                                                            \
                const __m256i u = t##_group(&w[i], g);                                               \
                for (int r = 0; r < R; r++)                                                          \
                    sum[r] = _mm256_add_epi16(sum[r], _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(X[r][i].qs + 32 * g)))); \
            }                                                                                        \
            const float d = iqd_##t(&w[i]);                                                          \
            for (int r = 0; r < R; r++) {                                                            \
                const __m256i bs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)X[r][i].bsums), ones); \
                const int isum = hsum_i32_avx2(_mm256_sub_epi32(_mm256_madd_epi16(sum[r], ones), bs)); \
                acc[r] += (d * X[r][i].d) * (float)isum;                                             \
            }                                                                                        \
        }                                                                                            \
        for (int r = 0; r < R; r++) out[r] = acc[r];                                                 \
    }                                                                                                \
    DEFINE_ROWS_1_4(TARGET, dot_##t##_##SFX, dot4_##t##_##SFX, t##_rows_##SFX)

TQ_ROWS(tq1_0, blk_tq1_0, AVX2, avx2)

/* TQ1_0 on AVX-512: two groups' digits a vector (the AVX2 body's base-3 unpacking, 64
 * bytes at once), summed against the activations by vpdpbusd: the same block sum, so
 * the same bits */
AVX512 static inline __m512i trits64(__m512i q, __m512i mul) {
    const __m512i lo = _mm512_set1_epi16(0xFF), three = _mm512_set1_epi16(768);
    const __m512i e = _mm512_mulhi_epu16(_mm512_and_si512(_mm512_mullo_epi16(_mm512_and_si512(q, lo), mul), lo), three);
    const __m512i o = _mm512_mulhi_epu16(_mm512_and_si512(_mm512_mullo_epi16(_mm512_srli_epi16(q, 8), mul), lo), three);
    return _mm512_or_si512(e, _mm512_slli_epi16(o, 8));
}

AVX512 static inline __m512i two256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

AVX512 static inline __attribute__((always_inline)) void tq1_0_rows_avx512(const void *vw, const act256 *const *X,
                                                                           const int R, int nb, float *out) {
    const blk_tq1_0 *w = vw;
    const __m512i ones = _mm512_set1_epi16(1);
    /* the multipliers of the four pairs of groups (digit j of a byte: 3^j) */
    const __m256i p[5] = {_mm256_set1_epi16(pow3[0]), _mm256_set1_epi16(pow3[1]), _mm256_set1_epi16(pow3[2]),
                          _mm256_set1_epi16(pow3[3]), _mm256_set1_epi16(pow3[4])};
    const __m512i m01 = two256(p[0], p[1]), m23 = two256(p[2], p[3]);
    const __m512i m45 = two256(p[4], _mm256_setr_m128i(_mm256_castsi256_si128(p[0]), _mm256_castsi256_si128(p[1])));
    const __m512i m67 = two256(_mm256_setr_m128i(_mm256_castsi256_si128(p[2]), _mm256_castsi256_si128(p[3])),
                               _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27));
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = 0; i < nb; i++) {
        prefetch_ahead(&w[i], (int)sizeof(blk_tq1_0));
        const __m256i q = _mm256_loadu_si256((const __m256i *)w[i].qs);
        const __m128i hi = _mm_loadu_si128((const __m128i *)(w[i].qs + 32));
        const __m256i hh = _mm256_setr_m128i(hi, hi);
        __m512i u[4];
        u[0] = trits64(two256(q, q), m01);
        u[1] = trits64(two256(q, q), m23);
        u[2] = trits64(two256(q, hh), m45);
        u[3] = trits64(two256(hh, _mm256_setr_m128i(hi, _mm_set1_epi32((int)ld32(w[i].qh)))), m67);
        __m512i sum[4];
        for (int r = 0; r < R; r++) sum[r] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++)
            for (int r = 0; r < R; r++)
                sum[r] = _mm512_dpbusd_epi32(sum[r], u[c], _mm512_loadu_si512(X[r][i].qs + 64 * c));
        const float d = iqd_tq1_0(&w[i]);
        for (int r = 0; r < R; r++) {
            const __m256i bs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)X[r][i].bsums), _mm512_castsi512_si256(ones));
            const int isum = _mm512_reduce_add_epi32(sum[r]) - hsum_i32_avx2(bs);
            acc[r] += (d * X[r][i].d) * (float)isum;
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}
DEFINE_ROWS_1_4(AVX512, dot_tq1_0_avx512, dot4_tq1_0_avx512, tq1_0_rows_avx512)
TQ_ROWS(tq2_0, blk_tq2_0, AVX2, avx2)
TQ_ROWS(tq2_0, blk_tq2_0, AVX512, avx512)
#define B32_AVX2(t, B, G) B32_ROWS(t, B, G, AVX2, avx2)
#define B32_AVX512(t, B, G) B32_ROWS(t, B, G, AVX512, avx512)
GC_B32_TYPES(B32_AVX2)
B32_AVX512(q2_0, blk_q2_0, 2)

/* Q1_0 on AVX-512: a group's 32 bits as the mask that negates the activations, their
 * four-byte sums by vpdpbusd against ones: the integer lanes (and so the bits) of the
 * AVX2 body's vpmaddubsw / vpmaddwd, without the bytes made from the bits */
AVX512 static inline __attribute__((always_inline)) void q1_0_rows_avx512(const void *vw, const act32 *const *X, const int R,
                                                                          int nb, float *out) {
    const blk_q1_0 *w = vw;
    const __m256i ones = _mm256_set1_epi8(1);
    __m256 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        prefetch_ahead(&w[i], (int)sizeof(blk_q1_0));
        const float d = H2F(w[i].d);
        for (int g = 0; g < 4; g++) {
            const __mmask32 neg = _cvtu32_mask32(~ld32(w[i].qs + 4 * g)); /* a clear bit: -d */
            for (int r = 0; r < R; r++) {
                const act32 *xb = &X[r][4 * i + g];
                const __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
                const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, _mm256_mask_sub_epi8(xv, neg, _mm256_setzero_si256(), xv));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]);
}

AVX512 float dot_q1_0_avx512(const void *vw, const void *vx, int nb) {
    const act32 *X[1] = {vx};
    float o;
    q1_0_rows_avx512(vw, X, 1, nb, &o);
    return o;
}

AVX512 void dot4_q1_0_avx512(const void *vw, const void *const *vx, int nb, float *out) {
    q1_0_rows_avx512(vw, (const act32 *const *)vx, 4, nb, out);
}

/* ---- F16 / BF16 rows against float32 activations: 32 weights a step in four (AVX2) or
 * two (AVX-512) partial sums, the last n % 32 one at a time (in the same order for one
 * row or four) */
AVX2 static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
AVX2 static inline __m256 f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
AVX512 static inline __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
AVX512 static inline __m512 f16x16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

#define F_ROWS_AVX2(t, LOAD8, CVT1)                                                                  \
    AVX2 static inline __attribute__((always_inline)) void t##_rows_avx2(const void *vw, const float *const *X, const int R, \
                                                                       int n, float *out) {          \
        const uint16_t *w = vw;                                                                      \
        __m256 acc[4][4];                                                                            \
        for (int r = 0; r < R; r++) for (int k = 0; k < 4; k++) acc[r][k] = _mm256_setzero_ps();     \
        int j = 0;                                                                                   \
        for (; j + 32 <= n; j += 32) {                                                               \
            prefetch_ahead(w + j, 64);                                                               \
            __m256 wv[4];                                                                            \
            for (int k = 0; k < 4; k++) wv[k] = LOAD8(w + j + 8 * k);                                \
            for (int r = 0; r < R; r++)                                                              \
                for (int k = 0; k < 4; k++) acc[r][k] = _mm256_fmadd_ps(wv[k], _mm256_loadu_ps(X[r] + j + 8 * k), acc[r][k]); \
        }                                                                                            \
        for (int r = 0; r < R; r++) {                                                                \
            float s = hsum8(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]))); \
            for (int k = j; k < n; k++) s += CVT1(w[k]) * X[r][k];                                   \
            out[r] = s;                                                                              \
        }                                                                                            \
    }

#define F_ROWS_AVX512(t, LOAD16, CVT1)                                                               \
    AVX512 static inline __attribute__((always_inline)) void t##_rows_avx512(const void *vw, const float *const *X, const int R, \
                                                                           int n, float *out) {      \
        const uint16_t *w = vw;                                                                      \
        __m512 acc[4][2];                                                                            \
        for (int r = 0; r < R; r++) for (int k = 0; k < 2; k++) acc[r][k] = _mm512_setzero_ps();     \
        int j = 0;                                                                                   \
        for (; j + 32 <= n; j += 32) {                                                               \
            prefetch_ahead(w + j, 64);                                                               \
            const __m512 w0 = LOAD16(w + j), w1 = LOAD16(w + j + 16);                                \
            for (int r = 0; r < R; r++) {                                                            \
                acc[r][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(X[r] + j), acc[r][0]);               \
                acc[r][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(X[r] + j + 16), acc[r][1]);          \
            }                                                                                        \
        }                                                                                            \
        for (int r = 0; r < R; r++) {                                                                \
            float s = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));                     \
            for (int k = j; k < n; k++) s += CVT1(w[k]) * X[r][k];                                   \
            out[r] = s;                                                                              \
        }                                                                                            \
    }

#define F_DOTS(t, TARGET, SFX)                                                                       \
    TARGET float dot_##t##_##SFX(const void *vw, const void *vx, int n) {                            \
        const float *X[1] = {vx};                                                                    \
        float o;                                                                                     \
        t##_rows_##SFX(vw, X, 1, n, &o);                                                             \
        return o;                                                                                    \
    }                                                                                                \
    TARGET void dot4_##t##_##SFX(const void *vw, const void *const *vx, int n, float *out) {         \
        t##_rows_##SFX(vw, (const float *const *)vx, 4, n, out);                                     \
    }

F_ROWS_AVX2(f16, f16x8, _cvtsh_ss)
F_ROWS_AVX2(bf16, bf16x8, bf2f)
F_ROWS_AVX512(f16, f16x16, _cvtsh_ss)
F_ROWS_AVX512(bf16, bf16x16, bf2f)
F_DOTS(f16, AVX2, avx2)
F_DOTS(bf16, AVX2, avx2)
F_DOTS(f16, AVX512, avx512)
F_DOTS(bf16, AVX512, avx512)

/* ---- a block for the tiles: 256 signed bytes, 16 scales of 16, the factor (each type's
 * expander inlined into its own loop) */
#define IQ_EXPAND(t, B)                                                                              \
    static void expand_##t(const void *blk, int8_t *q, int16_t *sc) {                               \
        for (int g = 0; g < 8; g++) {                                                                \
            iq_group e;                                                                              \
            iqx_##t(blk, g, &e);                                                                     \
            for (int l = 0; l < 4; l++) memcpy(q + 32 * g + 8 * l, &e.v[l], 8); /* no 32-byte reload */ \
            sc[2 * g] = (int16_t)e.s[0];                                                             \
            sc[2 * g + 1] = (int16_t)e.s[1];                                                         \
        }                                                                                            \
    }
GC_IQ_TYPES(IQ_EXPAND)

int iq_expand(int type, const void *blk, int8_t *q, int16_t *sc, float *d) {
    if (gc_isa() >= ISA_AVX512 && iq_expand512(type, blk, q, sc, d)) return 1;
    switch (type) {
#define IQ_CASE(t, B) case T_##t: expand_##t(blk, q, sc); *d = iqd_##t(blk); return 1;
#define T_tq1_0 T_TQ1_0
#define T_tq2_0 T_TQ2_0
        GC_IQ_TYPES(IQ_CASE)
    default:
        return 0;
    }
}

int iq_offset(int type) {
    switch (type) {
    case T_IQ2_XXS: case T_IQ2_XS: case T_IQ2_S: return 43; /* the grids' 8, 25, 43 */
    case T_IQ3_XXS: return 62;
    case T_IQ3_S: return 15;
    case T_IQ1_S: case T_IQ1_M: return 9; /* 8 g +- 1 */
    case T_TQ1_0: case T_TQ2_0: return 1;
    default: return 0;
    }
}

#endif /* GC_X86 */
