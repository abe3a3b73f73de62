/* What the x86-64 kernel sources share (x86_avx2.c, x86_avx512.c, x86_tiles.c): the
 * target attributes, small vector helpers, and the per-type block bodies (BODY_*, X4_*)
 * that each of them builds into its dots, so that one type's unpacking is written once.
 * Not part of the library's ABI. */
#ifndef GC_X86_H
#define GC_X86_H

#include "../quants.h"

#ifdef GC_X86

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

/* hardware half → float inside the SIMD kernels (the scalar h2f is for portable code) */
#define H2F(h) _cvtsh_ss(h)

AVX2 static inline float hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline float hsum8(__m256 v) {
    return hsum4(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

/* signed int8 · signed int8 → 8 int32 partial sums */
AVX2 static inline __m256i dot_i8_avx2(__m256i a, __m256i b) {
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

AVX512 static inline __m256i dot_i8_vnni(__m256i a, __m256i b) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

/* unsigned int8 (< 128) · signed int8 → 8 int32 sums */
AVX2 static inline __m256i dot_u8_avx2(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

AVX512 static inline __m256i dot_u8_vnni(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

/* 32 bits → 32 bytes of 0xFF / 0x00 */
AVX2 static inline __m256i bits_to_bytes(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    const __m256i mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    v = _mm256_or_si256(v, mask);
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

AVX2 static inline __m256i nibbles32(const uint8_t *qs) { /* 16 bytes → 32 nibbles: low ones, then high ones */
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_insertf128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0xF));
}

/* Two blocks per iteration, so that the loads and integer dots of neighbouring blocks
 * overlap; the float sums in one chain in block order, as the four- and eight-row dots
 * make them for each row: a row's product does not depend on the rows beside it in a
 * batch (batch-invariant decode, matmul.c). */
#define DEFINE_DOT32(NAME, TARGET, DOTI8, BLK, BODY)                                                \
    TARGET float NAME(const void *vw, const void *vx, int nb) {                            \
        const act32 *x = vx; const BLK *wb = vw;                                                  \
        __m256 acc = _mm256_setzero_ps();                                                         \
        float extra = 0.f;                                                                        \
        int i0 = 0;                                                                               \
        for (; i0 + 1 < nb; i0 += 2) {                                                            \
            __m256i qa, qb; float da, db;                                                         \
            prefetch_ahead(&wb[i0], 2 * (int)sizeof(BLK));                                        \
            { const int i = i0; __m256i q; float d; BODY; qa = q; da = d; }                       \
            { const int i = i0 + 1; __m256i q; float d; BODY; qb = q; db = d; }                   \
            const __m256i pa = DOTI8(qa, _mm256_loadu_si256((const __m256i *)x[i0].qs));          \
            const __m256i pb = DOTI8(qb, _mm256_loadu_si256((const __m256i *)x[i0 + 1].qs));      \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(da * x[i0].d), _mm256_cvtepi32_ps(pa), acc);     \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(db * x[i0 + 1].d), _mm256_cvtepi32_ps(pb), acc); \
        }                                                                                         \
        for (; i0 < nb; i0++) {                                                                   \
            prefetch_ahead(&wb[i0], (int)sizeof(BLK));                                            \
            const int i = i0; __m256i q; float d; BODY;                                           \
            const __m256i xv = _mm256_loadu_si256((const __m256i *)x[i].qs);                      \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * x[i].d), _mm256_cvtepi32_ps(DOTI8(q, xv)), acc); \
        }                                                                                         \
        return hsum8(acc) + extra;                                                                \
    }

#define BODY_Q8_0 const blk_q8_0 *w = vw; q = _mm256_loadu_si256((const __m256i *)w[i].qs); d = H2F(w[i].d)
#define BODY_Q4_1 const blk_q4_1 *w = vw; q = nibbles32(w[i].qs); d = H2F(w[i].d); extra = fmaf(H2F(w[i].m), x[i].s, extra)
#define BODY_Q5_1                                                                                   \
    const blk_q5_1 *w = vw; uint32_t qh; memcpy(&qh, w[i].qh, 4);                                   \
    q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10))); \
    d = H2F(w[i].d); extra = fmaf(H2F(w[i].m), x[i].s, extra)
#define BODY_IQ4_NL                                                                                 \
    const blk_iq4_nl *w = vw;                                                                       \
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl)); \
    q = _mm256_shuffle_epi8(lut, nibbles32(w[i].qs)); d = H2F(w[i].d)
/* MXFP4: IQ4_NL's layout with the doubled E2M1 table and a power-of-two scale */
#define BODY_MXFP4                                                                                  \
    const blk_mxfp4 *w = vw;                                                                        \
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_mxfp4)); \
    q = _mm256_shuffle_epi8(lut, nibbles32(w[i].qs)); d = e8m0_half(w[i].e)

/* AVX2 Q4_0: the weights unsigned (0..15, no sign trick), the offset 8 through the
 * activation block sums: sum((q - 8) x) = sum(q x) - 8 sum(x). Q5_0: signed weights and
 * the sign trick (q - 16 is the low nibble with 0xF0 where the fifth bit is clear): the
 * unsigned form's per-block scalar for the offset became a loop-carried chain through a
 * general register there (one row in L2: 30.4 -> 27.5 ns per 256 weights; for Q4_0 the
 * unsigned form stays ahead, 21.2 vs 22.9). */
#define BODY_Q4_0_U const blk_q4_0 *w = vw; q = nibbles32(w[i].qs); d = H2F(w[i].d); extra = fmaf(-8.f * d, x[i].s, extra)
#define BODY_Q5_0_U                                                                                 \
    const blk_q5_0 *w = vw; uint32_t qh; memcpy(&qh, w[i].qh, 4);                                   \
    q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10))); \
    d = H2F(w[i].d); extra = fmaf(-16.f * d, x[i].s, extra)

/* ---- several activation rows at once (prefill, batched decode): each weight block is
 * unpacked once and multiplied with four activation rows. */

#define X4_ROWS(T) const T *X0 = vx[0], *X1 = vx[1], *X2 = vx[2], *X3 = vx[3]

/* 32-blocks, a four-row or tile body (X4_*): sets q (int8 weights, unsigned unless the
 * type is signed32), d (weight scale) and e (the coefficient of the activation block
 * sum: -offset * d, or the block minimum) */
#define X4_Q8_0 q = _mm256_loadu_si256((const __m256i *)w[i].qs); d = H2F(w[i].d); e = 0.f
#define X4_Q4_0 q = nibbles32(w[i].qs); d = H2F(w[i].d); e = -8.f * d
#define X4_Q5_0                                                                                     \
    uint32_t qh; memcpy(&qh, w[i].qh, 4);                                                          \
    q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10))); \
    d = H2F(w[i].d); e = -16.f * d
#define X4_Q4_1 q = nibbles32(w[i].qs); d = H2F(w[i].d); e = H2F(w[i].m)
#define X4_Q5_1                                                                                     \
    uint32_t qh; memcpy(&qh, w[i].qh, 4);                                                          \
    q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10))); \
    d = H2F(w[i].d); e = H2F(w[i].m)
#define X4_IQ4_NL                                                                                   \
    q = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl)), \
                            nibbles32(w[i].qs));                                                   \
    d = H2F(w[i].d); e = 0.f

#define X4_MXFP4                                                                                    \
    q = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_mxfp4)), \
                            nibbles32(w[i].qs));                                                   \
    d = e8m0_half(w[i].e); e = 0.f

/* ---- Q2_K, Q3_K, IQ4_XS on 32-byte vectors (the same code built for AVX2 and for the
 * AVX-512 level): unsigned weights times signed activations in pairs (vpmaddubsw), then
 * the sub-block scales as 16-bit lanes (vpmaddwd). A 32-byte run of elements covers two
 * sub-blocks of 16: 16-bit lanes 0-7 the first, 8-15 the second. */

/* 16-bit lanes 0-7: lane j of sc16, lanes 8-15: lane j + 1 (j even) */
AVX2 static inline __m256i scale_pair16(__m256i sc16, int j) {
    const __m256i pair = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(j / 2));
    const __m256i bcast = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                           2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(pair, bcast);
}

/* Q2_K: element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]; scales[j] holds the
 * sub-block's scale (low nibble) and min (high nibble): sum(d sc q x) - dmin sum(m bsum). */
#define DEFINE_Q2K(NAME, TARGET)                                                                    \
    TARGET float NAME(const void *vw, const void *vx, int nb) {                            \
        const blk_q2_K *w = vw; const act256 *x = vx;                                             \
        __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();                              \
        const __m256i m3 = _mm256_set1_epi8(3);                                                   \
        const __m128i m4 = _mm_set1_epi8(0xF);                                                    \
        for (int i = 0; i < nb; i++) {                                                            \
            prefetch_ahead(&w[i], (int)sizeof(blk_q2_K));                                         \
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)w[i].scales);                    \
            const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4));                     \
            const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));  \
            const __m256i mins = _mm256_madd_epi16(mn16, _mm256_loadu_si256((const __m256i *)x[i].bsums)); \
            __m256i sum = _mm256_setzero_si256();                                                 \
            for (int h = 0; h < 2; h++) {                                                         \
                const __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * h));        \
                for (int s = 0; s < 4; s++) {                                                     \
                    const __m256i qv = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3);        \
                    const __m256i p = _mm256_maddubs_epi16(qv, _mm256_loadu_si256((const __m256i *)(x[i].qs + 128 * h + 32 * s))); \
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, scale_pair16(sc16, 8 * h + 2 * s))); \
                }                                                                                 \
            }                                                                                     \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(H2F(w[i].d) * x[i].d), _mm256_cvtepi32_ps(sum), acc); \
            accm = _mm256_fmadd_ps(_mm256_set1_ps(H2F(w[i].dmin) * x[i].d), _mm256_cvtepi32_ps(mins), accm); \
        }                                                                                         \
        return hsum8(acc) - hsum8(accm);                                                          \
    }

/* Q3_K: as Q2_K's two bits, plus 4 where bit 4h + s of hmask[l] is set, is q + 4 (0..7):
 * sum(sc q x) = sum(sc (q + 4) x) - 4 sum(sc bsum), with signed six-bit scales. */
#define DEFINE_Q3K(NAME, TARGET)                                                                    \
    TARGET float NAME(const void *vw, const void *vx, int nb) {                            \
        const blk_q3_K *w = vw; const act256 *x = vx;                                             \
        __m256 acc = _mm256_setzero_ps(), accoff = _mm256_setzero_ps();                            \
        const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);                        \
        for (int i = 0; i < nb; i++) {                                                            \
            prefetch_ahead(&w[i], (int)sizeof(blk_q3_K));                                         \
            int sc[16]; int16_t sc_h[16];                                                         \
            q3_scales(w[i].scales, sc);                                                           \
            for (int j = 0; j < 16; j++) sc_h[j] = (int16_t)sc[j];                                \
            const __m256i sc16 = _mm256_loadu_si256((const __m256i *)sc_h);                       \
            const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)x[i].bsums)); \
            const __m256i hm = _mm256_loadu_si256((const __m256i *)w[i].hmask);                   \
            __m256i sum = _mm256_setzero_si256();                                                 \
            for (int h = 0; h < 2; h++) {                                                         \
                const __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * h));        \
                for (int s = 0; s < 4; s++) {                                                     \
                    const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + s)));               \
                    const __m256i hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four); \
                    const __m256i qv = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3), hb); \
                    const __m256i p = _mm256_maddubs_epi16(qv, _mm256_loadu_si256((const __m256i *)(x[i].qs + 128 * h + 32 * s))); \
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, scale_pair16(sc16, 8 * h + 2 * s))); \
                }                                                                                 \
            }                                                                                     \
            const float d = H2F(w[i].d) * x[i].d;                                                 \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sum), acc);              \
            accoff = _mm256_fmadd_ps(_mm256_set1_ps(4.f * d), _mm256_cvtepi32_ps(off), accoff);   \
        }                                                                                         \
        return hsum8(acc) - hsum8(accoff);                                                        \
    }

/* IQ4_XS: per sub-block of 32, IQ4_NL's nibble layout and table, a signed six-bit scale */
#define DEFINE_IQ4XS(NAME, TARGET)                                                                  \
    TARGET float NAME(const void *vw, const void *vx, int nb) {                            \
        const blk_iq4_xs *w = vw; const act256 *x = vx;                                           \
        const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl)); \
        __m256 acc = _mm256_setzero_ps();                                                         \
        for (int i = 0; i < nb; i++) {                                                            \
            prefetch_ahead(&w[i], (int)sizeof(blk_iq4_xs));                                       \
            __m256i sum = _mm256_setzero_si256();                                                 \
            for (int ib = 0; ib < 8; ib++) {                                                      \
                const int ls = (((w[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((w[i].scales_h >> (2 * ib)) & 3) << 4)) - 32; \
                const __m256i q = _mm256_shuffle_epi8(lut, nibbles32(w[i].qs + 16 * ib));        \
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * ib));      \
                const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q)); \
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, _mm256_set1_epi16((short)ls)));  \
            }                                                                                     \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(H2F(w[i].d) * x[i].d), _mm256_cvtepi32_ps(sum), acc); \
        }                                                                                         \
        return hsum8(acc);                                                                        \
    }

/* the AVX2 activation quantizers: the scalar arithmetic (round to nearest even, as
 * lrintf), eight lanes at a time; 32 products packed back into element order */
AVX2 static inline __m256i pack32_i8(__m256i q0, __m256i q1, __m256i q2, __m256i q3) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2 static inline int hsum_i32_avx2(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

AVX2 static inline float hmax_ps_avx2(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* the 256 weights of a Q4_K / Q5_K block as bytes, in order */
AVX2 static inline void q45k_unpack(const uint8_t *qs, const uint8_t *qh, uint8_t out[256]) {
    const __m256i m4 = _mm256_set1_epi8(0xF), b4 = _mm256_set1_epi8(0x10);
    const __m256i h = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(h, 2 * c), 4), b4));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                           _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(h, 2 * c + 1), 4), b4));
        _mm256_storeu_si256((__m256i *)(out + 64 * c), lo);
        _mm256_storeu_si256((__m256i *)(out + 64 * c + 32), hi);
    }
}

/* the 128 weights of half h of a Q6_K block as bytes (0..63), four runs of 32 in order */
AVX2 static inline void q6k_half(const blk_q6_K *b, int h, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
    const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
    q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_slli_epi16(m2, 2)), 2));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, _mm256_slli_epi16(m2, 4)));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                           _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_slli_epi16(m2, 6)), 2));
}

/* the one-row and four-row dots of a type from its R-row body ROWS(w, X, R, nb, out):
 * NAME(w, x, nb) and NAME4(w, xs, nb, out) */
#define DEFINE_ROWS_1_4(TARGET, NAME, NAME4, ROWS)                                                  \
    TARGET float NAME(const void *vw, const void *vx, int nb) {                                    \
        const act256 *X[1] = {vx};                                                                 \
        float o;                                                                                   \
        ROWS(vw, X, 1, nb, &o);                                                                    \
        return o;                                                                                  \
    }                                                                                              \
    TARGET void NAME4(const void *vw, const void *const *vx, int nb, float *out) {                 \
        ROWS(vw, (const act256 *const *)vx, 4, nb, out);                                           \
    }

#endif /* GC_X86 */

#endif
