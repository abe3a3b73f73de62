/* The x86-64 kernels: AVX2 and AVX-512 dot products (one activation row, four rows at a
 * time), the tiles for many rows, the repacked Q5_0 eight-row dot, and activation
 * quantization, each compiled with a target attribute and picked at run time
 * (dispatch.c). */

#include "../quants.h"

/* --------------------------------------------------------------- AVX2 dots */
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

DEFINE_DOT32(dot_q8_0_avx2, AVX2, dot_i8_avx2, blk_q8_0, BODY_Q8_0)
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
DEFINE_DOT32(dot_q4_0_avx2, AVX2, dot_u8_avx2, blk_q4_0, BODY_Q4_0_U)
DEFINE_DOT32(dot_q5_0_avx2, AVX2, dot_u8_avx2, blk_q5_0, BODY_Q5_0_U)
DEFINE_DOT32(dot_q4_1_avx2, AVX2, dot_u8_avx2, blk_q4_1, BODY_Q4_1)
DEFINE_DOT32(dot_q5_1_avx2, AVX2, dot_u8_avx2, blk_q5_1, BODY_Q5_1)
DEFINE_DOT32(dot_iq4_nl_avx2, AVX2, dot_i8_avx2, blk_iq4_nl, BODY_IQ4_NL)
DEFINE_DOT32(dot_mxfp4_avx2, AVX2, dot_i8_avx2, blk_mxfp4, BODY_MXFP4)
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

/* Q4_K and Q5_K: per 64 elements, 32 bytes hold sub-block 2c (low nibbles) and 2c+1
 * (high nibbles); Q5_K adds a fifth bit: element 64c + 32h + l takes bit (2c + h) of
 * qh[l]. HIGH(shift) gives those bits (as 0x10) for one half, or zero for Q4_K. */
#define DEFINE_Q45K(NAME, TARGET, BLK, HIGH)                                                        \
    TARGET float NAME(const void *vw, const void *vx, int nb) {                            \
        const BLK *w = vw; const act256 *x = vx;                                                  \
        __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();                              \
        const __m256i m4 = _mm256_set1_epi8(0xF);                                                 \
        for (int i = 0; i < nb; i++) {                                                            \
            prefetch_ahead(&w[i], (int)sizeof(BLK));                                              \
            uint32_t u[4];                                                                        \
            k4_scales_mins(w[i].scales, u);                                                       \
            const uint8_t *sc = (const uint8_t *)u;                                               \
            /* mins · the activation sums of 32: pairs of 16-sums times m duplicated */          \
            const __m128i m8 = _mm_set_epi32(0, 0, (int)u[3], (int)u[2]);                         \
            const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));                 \
            const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x[i].bsums), mins); \
            __m256i sum = _mm256_setzero_si256();                                                 \
            for (int c = 0; c < 4; c++) {                                                         \
                const __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * c));        \
                const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), HIGH(2 * c));          \
                const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), HIGH(2 * c + 1)); \
                const __m256i xl = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * c));       \
                const __m256i xh = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * c + 32));  \
                /* pairs (vpmaddubsw: <= 2 * 31 * 127), then the scale as 16-bit lanes (vpmaddwd) */ \
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_set1_epi16(sc[2 * c]))); \
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), _mm256_set1_epi16(sc[2 * c + 1]))); \
            }                                                                                     \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(H2F(w[i].d) * x[i].d), _mm256_cvtepi32_ps(sum), acc); \
            accm = _mm256_fmadd_ps(_mm256_set1_ps(H2F(w[i].dmin) * x[i].d), _mm256_cvtepi32_ps(msum), accm); \
        }                                                                                         \
        return hsum8(_mm256_sub_ps(acc, accm));                                                   \
    }

#define NO_HIGH(shift) _mm256_setzero_si256()
#define Q5_HIGH(shift) \
    _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)w[i].qh), (shift)), 4), \
                     _mm256_set1_epi8(0x10))

DEFINE_Q45K(dot_q4_K_avx2, AVX2, blk_q4_K, NO_HIGH)
DEFINE_Q45K(dot_q5_K_avx2, AVX2, blk_q5_K, Q5_HIGH)

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

/* Q6_K: q in 0..63 (offset 32): sum((q - 32) x) = sum(q x) - 32 sum(x), per 16 with int8
 * scales. Per half of 128: ql holds the low nibbles of four 32-runs (two loads, low and
 * high nibbles), qh their two high bits each. The scales of a 32-run's two 16-groups come
 * as 16-bit lanes of a byte shuffle of that half's eight scales. */
AVX2 float dot_q6_K_avx2(const void *vw, const void *vx, int nb) {
    const blk_q6_K *w = vw; const act256 *x = vx;
    __m256 acc = _mm256_setzero_ps();
    /* lane 0: 16-bit scale 2s, lane 1: 2s + 1 (of the half's 8) */
    static const int8_t pick[4][32] = {
        {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
        {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
        {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
        {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15},
    };
    const __m256i pk0 = _mm256_loadu_si256((const __m256i *)pick[0]), pk1 = _mm256_loadu_si256((const __m256i *)pick[1]);
    const __m256i pk2 = _mm256_loadu_si256((const __m256i *)pick[2]), pk3 = _mm256_loadu_si256((const __m256i *)pick[3]);
    for (int i = 0; i < nb; i++) {
        prefetch_ahead(&w[i], (int)sizeof(blk_q6_K));
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        /* the offset 32: 32 · Σ scale_j · (sum of activations j), in 8 lanes */
        const __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x[i].bsums), sc16);
        __m256i sum = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
        for (int h = 0; h < 2; h++) {
            const __m256i sch = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11) : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            __m256i q[4];
            q6k_half(&w[i], h, q);
            const __m256i q0 = q[0], q1 = q[1], q2 = q[2], q3 = q[3];
            const int8_t *xs = x[i].qs + 128 * h;
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)xs)),
                                                          _mm256_shuffle_epi8(sch, pk0)));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(xs + 32))),
                                                          _mm256_shuffle_epi8(sch, pk1)));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(q2, _mm256_loadu_si256((const __m256i *)(xs + 64))),
                                                          _mm256_shuffle_epi8(sch, pk2)));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(q3, _mm256_loadu_si256((const __m256i *)(xs + 96))),
                                                          _mm256_shuffle_epi8(sch, pk3)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(H2F(w[i].d) * x[i].d), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum8(acc);
}

/* ---- several activation rows at once (prefill, batched decode): each weight block is
 * unpacked once and multiplied with four activation rows. */

#define X4_ROWS(T) const T *X0 = vx[0], *X1 = vx[1], *X2 = vx[2], *X3 = vx[3]

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

DEFINE_DOT32_X4(dot4_q8_0_avx2, blk_q8_0, 1, X4_Q8_0)
DEFINE_DOT32_X4(dot4_q4_0_avx2, blk_q4_0, 0, X4_Q4_0)
DEFINE_DOT32_X4(dot4_q5_0_avx2, blk_q5_0, 0, X4_Q5_0)
DEFINE_DOT32_X4(dot4_q4_1_avx2, blk_q4_1, 0, X4_Q4_1)
DEFINE_DOT32_X4(dot4_q5_1_avx2, blk_q5_1, 0, X4_Q5_1)
#define X4_MXFP4                                                                                    \
    q = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_mxfp4)), \
                            nibbles32(w[i].qs));                                                   \
    d = e8m0_half(w[i].e); e = 0.f

DEFINE_DOT32_X4(dot4_iq4_nl_avx2, blk_iq4_nl, 1, X4_IQ4_NL)
DEFINE_DOT32_X4(dot4_mxfp4_avx2, blk_mxfp4, 1, X4_MXFP4)

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

#define DEFINE_Q45K_X4(NAME, BLK, HIGH)                                                             \
    AVX2 void NAME(const void *vw, const void *const *vx, int nb, float *out) {         \
        const BLK *w = vw; X4_ROWS(act256);                                                        \
        const act256 *X[4] = {X0, X1, X2, X3};                                                     \
        __m256 acc[4], accm[4];                                                                    \
        for (int r = 0; r < 4; r++) acc[r] = accm[r] = _mm256_setzero_ps();                        \
        const __m256i m4 = _mm256_set1_epi8(0xF);                                                  \
        for (int i = 0; i < nb; i++) {                                                             \
            prefetch_ahead(&w[i], (int)sizeof(BLK));                                               \
            uint32_t u[4];                                                                         \
            k4_scales_mins(w[i].scales, u);                                                        \
            const uint8_t *sc = (const uint8_t *)u;                                                \
            const __m128i m8 = _mm_set_epi32(0, 0, (int)u[3], (int)u[2]);                          \
            const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));                  \
            __m256i sum[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()}; \
            for (int c = 0; c < 4; c++) {                                                          \
                const __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * c));         \
                const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), HIGH(2 * c));           \
                const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), HIGH(2 * c + 1)); \
                const __m256i sl = _mm256_set1_epi16(sc[2 * c]), sh = _mm256_set1_epi16(sc[2 * c + 1]); \
                for (int r = 0; r < 4; r++) {                                                      \
                    const __m256i xl = _mm256_loadu_si256((const __m256i *)(X[r][i].qs + 64 * c)); \
                    const __m256i xh = _mm256_loadu_si256((const __m256i *)(X[r][i].qs + 64 * c + 32)); \
                    sum[r] = _mm256_add_epi32(sum[r], _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), sl), \
                                                                      _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), sh))); \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < 4; r++) { /* as the one-row dot: d x.d sum - dmin x.d (mins . bsums) */ \
                const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)X[r][i].bsums), mins); \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(H2F(w[i].d) * X[r][i].d), _mm256_cvtepi32_ps(sum[r]), acc[r]); \
                accm[r] = _mm256_fmadd_ps(_mm256_set1_ps(H2F(w[i].dmin) * X[r][i].d), _mm256_cvtepi32_ps(msum), accm[r]); \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < 4; r++) out[r] = hsum8(_mm256_sub_ps(acc[r], accm[r]));                \
    }

DEFINE_Q45K_X4(dot4_q4_K_avx2, blk_q4_K, NO_HIGH)
DEFINE_Q45K_X4(dot4_q5_K_avx2, blk_q5_K, Q5_HIGH)

/* r[k] holds eight 4-byte groups of weight row k; out[g] = group g of rows 0..7 (an 8 x 8
 * transpose of 32-bit lanes) */
AVX2 static inline void transpose8x32(const __m256i r[8], __m256i *out) {
    __m256i t[8], u[8];
    for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
        u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    for (int g = 0; g < 4; g++) {
        _mm256_storeu_si256(out + g, _mm256_permute2x128_si256(u[g], u[g + 4], 0x20));
        _mm256_storeu_si256(out + g + 4, _mm256_permute2x128_si256(u[g], u[g + 4], 0x31));
    }
}

/* ---- 32-block tiles for many activation rows: eight weight rows unpacked once to bytes
 * and interleaved, four consecutive weights of each row per 4-byte lane of a 32-byte
 * vector (transpose8x32). Unsigned weights (Q4_0, Q4_1, Q5_0, Q5_1): vpmaddubsw with
 * four activation bytes broadcast gives two 16-bit sums per weight row, four of which
 * accumulate before one vpmaddwd (4 x 2 x 31 x 127 < 2^15), so the float work of a block
 * (convert, scale, add) is done once for eight rows instead of once per row. The offset
 * (Q4_0 8, Q5_0 16) or the minimum (Q4_1, Q5_1) goes through the activation block sum:
 * e x.s. Signed weights (Q8_0, IQ4_NL's and MXFP4's table values): t32_dot_signed. */
typedef struct {
    uint8_t q[8][32]; /* [g][4k + j]: weight 4g + j of row k */
    float d[8], e[8]; /* per row: the scale, and the coefficient of the activation sum */
} t32_block;

/* one row's block i as 32 bytes, its scale and e, by the four-row dots' bodies (X4_*) */
#define T32_ROW(BLK, BODY)                                                                          \
    {                                                                                              \
        const BLK *w = (const BLK *)row; __m256i q; float d, e; BODY;                              \
        qv[k] = q; t[i].d[k] = d; t[i].e[k] = e;                                                   \
    }

AVX2 static void t32_pack(int type, const uint8_t *wrows, int64_t row_bytes, int nb, t32_block *t) {
    for (int i = 0; i < nb; i++) {
        __m256i qv[8];
        for (int k = 0; k < 8; k++) {
            const uint8_t *row = wrows + k * row_bytes;
            switch (type) {
            case T_Q8_0: T32_ROW(blk_q8_0, X4_Q8_0) break;     /* signed: t32_dot_signed */
            case T_IQ4_NL: T32_ROW(blk_iq4_nl, X4_IQ4_NL) break; /* signed too, the table's values */
            case T_MXFP4: T32_ROW(blk_mxfp4, X4_MXFP4) break;    /* likewise */
            case T_Q4_0: T32_ROW(blk_q4_0, X4_Q4_0) break;
            case T_Q5_0: T32_ROW(blk_q5_0, X4_Q5_0) break;
            case T_Q4_1: T32_ROW(blk_q4_1, X4_Q4_1) break;
            default: T32_ROW(blk_q5_1, X4_Q5_1) break;
            }
        }
        transpose8x32(qv, (__m256i *)t[i].q);
    }
}

/* out[r][k] = row k of the tile · activation row r, for four activation rows. Signed
 * weights (Q8_0, IQ4_NL): vpmaddubsw takes |w| and the activations with w's signs, and
 * each pair sum (up to 2 x 127 x 127) goes to 32 bits at once; they have no e term. */
AVX2 static inline __attribute__((always_inline)) void t32_dot_as(const t32_block *t, int nb, const act32 *const *X,
                                                                float out[4][8], const int sgn) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        __m256i isum[4];
        for (int r = 0; r < 4; r++) isum[r] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i p[4];
            for (int r = 0; r < 4; r++) p[r] = _mm256_setzero_si256();
            for (int g = 4 * h; g < 4 * h + 4; g++) {
                const __m256i wq = _mm256_loadu_si256((const __m256i *)t[i].q[g]);
                const __m256i wa = sgn ? _mm256_sign_epi8(wq, wq) : wq;
                for (int r = 0; r < 4; r++) {
                    int32_t xv;
                    memcpy(&xv, X[r][i].qs + 4 * g, 4);
                    const __m256i xb = _mm256_set1_epi32(xv);
                    if (sgn)
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xb, wq)), ones));
                    else
                        p[r] = _mm256_add_epi16(p[r], _mm256_maddubs_epi16(wq, xb));
                }
            }
            if (!sgn)
                for (int r = 0; r < 4; r++) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p[r], ones));
        }
        const __m256 vd = _mm256_loadu_ps(t[i].d), ve = _mm256_loadu_ps(t[i].e);
        for (int r = 0; r < 4; r++) {
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(vd, _mm256_set1_ps(X[r][i].d)), _mm256_cvtepi32_ps(isum[r]), acc[r]);
            if (!sgn) acc[r] = _mm256_fmadd_ps(ve, _mm256_set1_ps(X[r][i].s), acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) _mm256_storeu_ps(out[r], acc[r]);
}

AVX2 static void t32_dot(const t32_block *t, int nb, const act32 *const *X, float out[4][8]) {
    t32_dot_as(t, nb, X, out, 0);
}

AVX2 static void t32_dot_signed(const t32_block *t, int nb, const act32 *const *X, float out[4][8]) {
    t32_dot_as(t, nb, X, out, 1);
}

/* Q5_0 x8: lane vector p's low nibbles are the weights 4p.., its high ones 16 + 4p..; the
 * fifth bits of group g (bit g of hb) shifted to 0x10 */
#define X8_LO(v, hb, p) _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4 - (p)), m10))
#define X8_HI(v, hb, p) \
    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_and_si256(_mm256_srli_epi16(hb, p), m10))

/* out[k] = row k of the group · x: unsigned weights, per block four vpmaddubsw sums in 16
 * bits (4 x 2 x 31 x 127 < 2^15) for each half, the offset 16 through the block sums */
AVX2 void dot8_q5_0x8_avx2(const void *vw, const void *vx, int nb, float *out) {
    const blk_q5_0x8 *w = vw; const act32 *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0xF), m10 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps(), eacc = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        prefetch_ahead(&w[i], (int)sizeof(blk_q5_0x8));
        const uint8_t *xq = (const uint8_t *)x[i].qs;
        const __m256i hb = _mm256_loadu_si256((const __m256i *)w[i].hb);
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
#define X8_STEP(p)                                                                                  \
        {                                                                                          \
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * (p)));           \
            int32_t a, b;                                                                          \
            memcpy(&a, xq + 4 * (p), 4); memcpy(&b, xq + 16 + 4 * (p), 4);                         \
            lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(X8_LO(v, hb, p), _mm256_set1_epi32(a)));  \
            hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(X8_HI(v, hb, p), _mm256_set1_epi32(b)));  \
        }
        X8_STEP(0) X8_STEP(1) X8_STEP(2) X8_STEP(3)
#undef X8_STEP
        const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w[i].d));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(x[i].d)), _mm256_cvtepi32_ps(sum), acc);
        eacc = _mm256_fmadd_ps(dw, _mm256_set1_ps(x[i].s), eacc);
    }
    _mm256_storeu_ps(out, _mm256_fnmadd_ps(_mm256_set1_ps(16.f), eacc, acc));
}

/* MXFP4 x8: out[k] = row k of the group · x. Per block the four lane vectors' nibbles
 * looked up in the unsigned table (0..24) and met by broadcast activation bytes, four
 * vpmaddubsw sums a half in 16 bits (4 x 2 x 24 x 127 < 2^15), the offset 12 through the
 * block sums; the eight exponents to float scales at once. */
AVX2 static inline __m256 e8m0_half8(const uint8_t *e) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v); /* e < 2: the subnormals */
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), v)));
}

AVX2 void dot8_mxfp4x8_avx2(const void *vw, const void *vx, int nb, float *out) {
    const blk_mxfp4x8 *w = vw; const act32 *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi16(1);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_mxfp4_u));
    __m256 acc = _mm256_setzero_ps(), eacc = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        prefetch_ahead(&w[i], (int)sizeof(blk_mxfp4x8));
        const uint8_t *xq = (const uint8_t *)x[i].qs;
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
#define MX8_STEP(p)                                                                                 \
        {                                                                                          \
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * (p)));           \
            int32_t a, b;                                                                          \
            memcpy(&a, xq + 4 * (p), 4); memcpy(&b, xq + 16 + 4 * (p), 4);                         \
            lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4)), \
                                                           _mm256_set1_epi32(a)));                 \
            hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(_mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)), \
                                                           _mm256_set1_epi32(b)));                 \
        }
        MX8_STEP(0) MX8_STEP(1) MX8_STEP(2) MX8_STEP(3)
#undef MX8_STEP
        const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
        const __m256 dw = e8m0_half8(w[i].e);
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(x[i].d)), _mm256_cvtepi32_ps(sum), acc);
        eacc = _mm256_fmadd_ps(dw, _mm256_set1_ps(x[i].s), eacc);
    }
    _mm256_storeu_ps(out, _mm256_fnmadd_ps(_mm256_set1_ps(12.f), eacc, acc));
}

/* an MXFP4 x8 group as a tile: the lanes are the tile's; values from the unsigned table,
 * the offset 12 as e = -12 d (the tile's unsigned dot) */
AVX2 static void mx8_tile_pack(const uint8_t *wg, int nb, t32_block *t) {
    const blk_mxfp4x8 *w = (const blk_mxfp4x8 *)wg;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_mxfp4_u));
    for (int i = 0; i < nb; i++) {
        for (int p = 0; p < 4; p++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * p));
            _mm256_storeu_si256((__m256i *)t[i].q[p], _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4)));
            _mm256_storeu_si256((__m256i *)t[i].q[p + 4],
                                _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)));
        }
        const __m256 d = e8m0_half8(w[i].e);
        _mm256_storeu_ps(t[i].d, d);
        _mm256_storeu_ps(t[i].e, _mm256_mul_ps(d, _mm256_set1_ps(-12.f)));
    }
}

/* a Q5_0 x8 group as a tile (unpacking only: the lanes are already the tile's) */
AVX2 static void x8_tile_pack(const uint8_t *wg, int nb, t32_block *t) {
    const blk_q5_0x8 *w = (const blk_q5_0x8 *)wg;
    const __m256i m4 = _mm256_set1_epi8(0xF), m10 = _mm256_set1_epi8(0x10);
    for (int i = 0; i < nb; i++) {
        const __m256i hb = _mm256_loadu_si256((const __m256i *)w[i].hb);
#define X8_TILE(p)                                                                                  \
        {                                                                                          \
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * (p)));           \
            _mm256_storeu_si256((__m256i *)t[i].q[p], X8_LO(v, hb, p));                            \
            _mm256_storeu_si256((__m256i *)t[i].q[(p) + 4], X8_HI(v, hb, p));                      \
        }
        X8_TILE(0) X8_TILE(1) X8_TILE(2) X8_TILE(3)
#undef X8_TILE
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w[i].d));
        _mm256_storeu_ps(t[i].d, d);
        _mm256_storeu_ps(t[i].e, _mm256_mul_ps(d, _mm256_set1_ps(-16.f)));
    }
}

/* ---- k-quant tiles (Q4_K, Q5_K, Q6_K), the same scheme: eight weight rows unpacked to
 * bytes (0..15, 0..31, 0..63) and interleaved four weights per row and lane; per 16
 * weights, two pairs of vpmaddubsw sums (2 x 2 x 63 x 127 < 2^15) meet the sixteen-bit
 * sub-block scales in vpmaddwd (a 32-weight sub-block of Q4_K / Q5_K as two of 16 with
 * the same scale). The minimum (Q4_K, Q5_K) or the offset 32 (Q6_K, as a minimum of 32
 * with dmin = 32 d and the scale) goes through the activation sums of 16:
 * x.d (d sum(sc q x) - dmin sum(m bsum)). */
typedef struct {
    uint8_t q[64][32];  /* [G][4k + j]: weight 4G + j of row k */
    int16_t sc[16][16]; /* [j]: the scale of the 16 weights 16j.. of row k at lanes 2k, 2k + 1 */
    int16_t mn[8][16];  /* [p]: lanes 2k, 2k + 1 the minimums of weights 32p.. and 32p + 16.. of row k */
    float d[8], dmin[8];
} kq_tile_block;

/* the 256 weights of a Q4_K / Q5_K block as bytes, in order */
AVX2 static void q45k_unpack(const uint8_t *qs, const uint8_t *qh, uint8_t out[256]) {
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

AVX2 static void q6k_unpack(const blk_q6_K *b, uint8_t out[256]) {
    for (int h = 0; h < 2; h++) {
        __m256i q[4];
        q6k_half(b, h, q);
        for (int j = 0; j < 4; j++) _mm256_storeu_si256((__m256i *)(out + 128 * h + 32 * j), q[j]);
    }
}

/* sixteen-bit x and y as the two halves of each 32-bit lane */
AVX2 static inline __m256i pair16(__m256i x, __m256i y) {
    return _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(y, 16));
}

AVX2 static void kq_tile_pack(int type, const uint8_t *w, int64_t row_bytes, int nb, kq_tile_block *t) {
    for (int i = 0; i < nb; i++) {
        uint8_t v[8][256];
        /* per row, 32-bit lanes: scales of the 16-weight groups 0..7 and 8..15 (each twice),
         * and the pairs of minimums of groups (2p, 2p + 1) */
        __m256i sc_lo[8], sc_hi[8], mn[8];
        for (int k = 0; k < 8; k++) {
            const uint8_t *row = w + k * row_bytes;
            if (type == T_Q6_K) {
                const blk_q6_K *b = (const blk_q6_K *)row + i;
                q6k_unpack(b, v[k]);
                const __m128i s8 = _mm_loadu_si128((const __m128i *)b->scales);
                const __m256i lo = _mm256_cvtepi8_epi32(s8), hi = _mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8));
                sc_lo[k] = pair16(lo, lo);
                sc_hi[k] = pair16(hi, hi);
                const __m256i s16 = _mm256_cvtepi8_epi16(s8); /* the pairs (2p, 2p + 1) are its 32-bit lanes */
                mn[k] = s16;
                t[i].d[k] = H2F(b->d);
                t[i].dmin[k] = 32.f * t[i].d[k];
                continue;
            }
            const uint16_t *dd;
            const uint8_t *scales;
            if (type == T_Q4_K) {
                const blk_q4_K *b = (const blk_q4_K *)row + i;
                q45k_unpack(b->qs, NULL, v[k]); dd = &b->d; scales = b->scales;
            } else {
                const blk_q5_K *b = (const blk_q5_K *)row + i;
                q45k_unpack(b->qs, b->qh, v[k]); dd = &b->d; scales = b->scales;
            }
            uint32_t u[4];
            k4_scales_mins(scales, u); /* bytes: 8 scales, then 8 mins, of the 32-weight sub-blocks */
            const __m128i sm = _mm_loadu_si128((const __m128i *)u);
            const __m256i s32 = _mm256_cvtepu8_epi32(sm), m32 = _mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8));
            /* group j of 16 has sub-block j / 2's scale: lanes 0..7 = sub-blocks 0,0,1,1,2,2,3,3 */
            const __m256i lo_idx = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), hi_idx = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
            const __m256i sl = _mm256_permutevar8x32_epi32(s32, lo_idx), sh = _mm256_permutevar8x32_epi32(s32, hi_idx);
            sc_lo[k] = pair16(sl, sl);
            sc_hi[k] = pair16(sh, sh);
            mn[k] = pair16(m32, m32); /* groups 2p and 2p + 1 share sub-block p's minimum */
            t[i].d[k] = H2F(dd[0]);
            t[i].dmin[k] = H2F(dd[1]);
        }
        for (int c = 0; c < 8; c++) { /* 32 weights of each row at a time */
            __m256i r[8];
            for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_si256((const __m256i *)(v[k] + 32 * c));
            transpose8x32(r, (__m256i *)t[i].q[8 * c]);
        }
        transpose8x32(sc_lo, (__m256i *)t[i].sc[0]);
        transpose8x32(sc_hi, (__m256i *)t[i].sc[8]);
        transpose8x32(mn, (__m256i *)t[i].mn[0]);
    }
}

/* out[r][k] = row k of the tile · activation row r, for four activation rows */
AVX2 static void kq_tile_dot(const kq_tile_block *t, int nb, const act256 *const *X, float out[4][8]) {
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const __m256 vdmin = _mm256_loadu_ps(t[i].dmin);
        for (int r = 0; r < 4; r++) {
            __m256i msum = _mm256_setzero_si256();
            for (int p = 0; p < 8; p++) {
                int32_t pair;
                memcpy(&pair, &X[r][i].bsums[2 * p], 4);
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)t[i].mn[p]), _mm256_set1_epi32(pair)));
            }
            acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(vdmin, _mm256_set1_ps(X[r][i].d)), _mm256_cvtepi32_ps(msum), acc[r]);
        }
        __m256i isum[4];
        for (int r = 0; r < 4; r++) isum[r] = _mm256_setzero_si256();
        for (int j = 0; j < 16; j++) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)t[i].q[4 * j]);
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)t[i].q[4 * j + 1]);
            const __m256i w2 = _mm256_loadu_si256((const __m256i *)t[i].q[4 * j + 2]);
            const __m256i w3 = _mm256_loadu_si256((const __m256i *)t[i].q[4 * j + 3]);
            const __m256i sc = _mm256_loadu_si256((const __m256i *)t[i].sc[j]);
            for (int r = 0; r < 4; r++) {
                int32_t x4[4];
                memcpy(x4, X[r][i].qs + 16 * j, 16);
                const __m256i pa = _mm256_add_epi16(_mm256_maddubs_epi16(w0, _mm256_set1_epi32(x4[0])),
                                                    _mm256_maddubs_epi16(w1, _mm256_set1_epi32(x4[1])));
                const __m256i pb = _mm256_add_epi16(_mm256_maddubs_epi16(w2, _mm256_set1_epi32(x4[2])),
                                                    _mm256_maddubs_epi16(w3, _mm256_set1_epi32(x4[3])));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_madd_epi16(pa, sc), _mm256_madd_epi16(pb, sc)));
            }
        }
        const __m256 vd = _mm256_loadu_ps(t[i].d);
        for (int r = 0; r < 4; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(vd, _mm256_set1_ps(X[r][i].d)), _mm256_cvtepi32_ps(isum[r]), acc[r]);
    }
    for (int r = 0; r < 4; r++) _mm256_storeu_ps(out[r], acc[r]);
}

/* ---- the 32-block tiles on AVX-512: as the k-quant ones below, two 4-byte lanes per weight
 * row in a 64-byte vector, so an 8-byte broadcast of activations meets 8 weights of all
 * eight rows. Unsigned weights: four vpmaddubsw sums in 16 bits (as the AVX2 tile), one
 * vpmaddwd. Signed ones (Q8_0, IQ4_NL, MXFP4): the activations made unsigned (x + 128,
 * an XOR) meet the signed weights in vpdpbusd, and 128 times each lane's weight sum, kept
 * as an integer by the packing, is taken back: exact. Lane pairs are summed at the end;
 * the activation-sum term (e) sits in the even lanes only. */
typedef struct {
    uint8_t q[4][64];     /* [m]: lane 2k + e = weights 8m + 4e .. + 3 of row k */
    float d[16], e[16];   /* lanes 2k, 2k + 1: row k's scale; lane 2k: its e, 2k + 1: 0 */
    int32_t w128[16];     /* signed types: 128 x the lane's weight sum */
} t32x512_block;

AVX512 static void t32x512_from(const t32_block *b, t32x512_block *t, int sgn) {
    const __m512i mix = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512i ws = _mm512_setzero_si512();
    for (int m = 0; m < 4; m++) {
        const __m512i v = _mm512_permutex2var_epi32(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b->q[2 * m])), mix,
                                                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b->q[2 * m + 1])));
        _mm512_storeu_si512(t->q[m], v);
        if (sgn) ws = _mm512_dpbusd_epi32(ws, _mm512_set1_epi8(1), v); /* the lane's four signed bytes summed */
    }
    _mm512_storeu_si512(t->w128, _mm512_slli_epi32(ws, 7));
    _mm512_storeu_ps(t->d, _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_loadu_ps(b->d))));
    _mm512_storeu_ps(t->e, _mm512_maskz_permutexvar_ps(0x5555, twice, _mm512_castps256_ps512(_mm256_loadu_ps(b->e))));
}

/* eight bytes of activations in every pair of 4-byte lanes */
AVX512 static inline __m512i bcast8(const int8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return _mm512_set1_epi64(v);
}

/* the 16 lanes of four accumulators summed in pairs: out[r][k] */
AVX512 static inline void pairs_out(const __m512 acc[4], float out[4][8]) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int r = 0; r < 4; r++)
        _mm256_storeu_ps(out[r], _mm512_castps512_ps256(_mm512_add_ps(_mm512_permutexvar_ps(even, acc[r]),
                                                                      _mm512_permutexvar_ps(odd, acc[r]))));
}

AVX512 static inline __attribute__((always_inline)) void t32x512_dot_as(const t32x512_block *t, int nb,
                                                                      const act32 *const *X, float out[4][8], const int sgn) {
    const __m512i ones = _mm512_set1_epi16(1), flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const __m512i w0 = _mm512_loadu_si512(t[i].q[0]), w1 = _mm512_loadu_si512(t[i].q[1]);
        const __m512i w2 = _mm512_loadu_si512(t[i].q[2]), w3 = _mm512_loadu_si512(t[i].q[3]);
        const __m512 vd = _mm512_loadu_ps(t[i].d);
        for (int r = 0; r < 4; r++) {
            const int8_t *xq = X[r][i].qs;
            __m512i isum;
            if (sgn) {
                isum = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(t[i].w128));
                isum = _mm512_dpbusd_epi32(isum, _mm512_xor_si512(bcast8(xq), flip), w0);
                isum = _mm512_dpbusd_epi32(isum, _mm512_xor_si512(bcast8(xq + 8), flip), w1);
                isum = _mm512_dpbusd_epi32(isum, _mm512_xor_si512(bcast8(xq + 16), flip), w2);
                isum = _mm512_dpbusd_epi32(isum, _mm512_xor_si512(bcast8(xq + 24), flip), w3);
            } else {
                const __m512i p = _mm512_add_epi16(
                    _mm512_add_epi16(_mm512_maddubs_epi16(w0, bcast8(xq)), _mm512_maddubs_epi16(w1, bcast8(xq + 8))),
                    _mm512_add_epi16(_mm512_maddubs_epi16(w2, bcast8(xq + 16)), _mm512_maddubs_epi16(w3, bcast8(xq + 24))));
                isum = _mm512_madd_epi16(p, ones);
            }
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(vd, _mm512_set1_ps(X[r][i].d)), _mm512_cvtepi32_ps(isum), acc[r]);
            if (!sgn) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(t[i].e), _mm512_set1_ps(X[r][i].s), acc[r]);
        }
    }
    pairs_out(acc, out);
}

AVX512 static void t32x512_dot(const t32x512_block *t, int nb, const act32 *const *X, float out[4][8]) {
    t32x512_dot_as(t, nb, X, out, 0);
}

AVX512 static void t32x512_dot_signed(const t32x512_block *t, int nb, const act32 *const *X, float out[4][8]) {
    t32x512_dot_as(t, nb, X, out, 1);
}

/* ---- the k-quant tiles on AVX-512: 64-byte vectors holding two 4-byte lanes per weight row,
 * so one 8-byte broadcast of activations meets 16 weights of all eight rows in 2 vpmaddubsw;
 * the sub-block scales go in with one vpdpwssd (VNNI) per 16 weights. Lane 2k + e of a vector
 * is row k, the e-th of two consecutive 4-weight groups; its results are summed in pairs at
 * the end. The same values as the AVX2 tile, rearranged as the AVX2 packing leaves them. */
typedef struct {
    uint8_t q[16][2][64]; /* [j][m]: lane 2k + e = weights 16j + 8m + 4e .. + 3 of row k */
    int16_t sc[16][32];   /* [j]: 16-bit lanes 4k .. 4k + 3 the scale of weights 16j .. of row k */
    int16_t mn[4][32];    /* [v]: lane 2k + e the minimums of row k's weights 64v + 32e .. (two of 16) */
    float d[16], dmin[16]; /* lanes 2k, 2k + 1: row k's */
} kq512_tile_block;

AVX512 static void kq512_tile_pack(int type, const uint8_t *w, int64_t row_bytes, int nb, kq512_tile_block *t) {
    const __m512i mix = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (int i = 0; i < nb; i++) {
        kq_tile_block b;
        kq_tile_pack(type, w + i * (row_bytes / nb), row_bytes, 1, &b);
#define KQ512_MIX(A, B) _mm512_permutex2var_epi32(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(A))), mix, \
                                                   _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(B))))
        for (int j = 0; j < 16; j++) {
            for (int m = 0; m < 2; m++) _mm512_storeu_si512(t[i].q[j][m], KQ512_MIX(b.q[4 * j + 2 * m], b.q[4 * j + 2 * m + 1]));
            _mm512_storeu_si512(t[i].sc[j], _mm512_permutexvar_epi32(twice, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b.sc[j]))));
        }
        for (int v = 0; v < 4; v++) _mm512_storeu_si512(t[i].mn[v], KQ512_MIX(b.mn[2 * v], b.mn[2 * v + 1]));
#undef KQ512_MIX
        _mm512_storeu_ps(t[i].d, _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_loadu_ps(b.d))));
        _mm512_storeu_ps(t[i].dmin, _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_loadu_ps(b.dmin))));
    }
}

AVX512 static void kq512_tile_dot(const kq512_tile_block *t, int nb, const act256 *const *X, float out[4][8]) {
    __m512 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        __m512i isum[4], msum[4];
        for (int r = 0; r < 4; r++) {
            isum[r] = _mm512_setzero_si512();
            msum[r] = _mm512_setzero_si512();
            for (int v = 0; v < 4; v++) /* bsums 4v, 4v + 1 (weights 64v..) and 4v + 2, 4v + 3 */
                msum[r] = _mm512_dpwssd_epi32(msum[r], _mm512_loadu_si512(t[i].mn[v]), bcast8((const int8_t *)(X[r][i].bsums + 4 * v)));
        }
        for (int j = 0; j < 16; j++) {
            const __m512i w0 = _mm512_loadu_si512(t[i].q[j][0]), w1 = _mm512_loadu_si512(t[i].q[j][1]);
            const __m512i sc = _mm512_loadu_si512(t[i].sc[j]);
            for (int r = 0; r < 4; r++) {
                const int8_t *xq = X[r][i].qs + 16 * j;
                const __m512i p = _mm512_add_epi16(_mm512_maddubs_epi16(w0, bcast8(xq)), _mm512_maddubs_epi16(w1, bcast8(xq + 8)));
                isum[r] = _mm512_dpwssd_epi32(isum[r], p, sc);
            }
        }
        const __m512 vd = _mm512_loadu_ps(t[i].d), vdmin = _mm512_loadu_ps(t[i].dmin);
        for (int r = 0; r < 4; r++) {
            const __m512 xd = _mm512_set1_ps(X[r][i].d);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(vd, xd), _mm512_cvtepi32_ps(isum[r]), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_mul_ps(vdmin, xd), _mm512_cvtepi32_ps(msum[r]), acc[r]);
        }
    }
    pairs_out(acc, out);
}

AVX2 void dot4_q6_K_avx2(const void *vw, const void *const *vx, int nb, float *out) {
    const blk_q6_K *w = vw; X4_ROWS(act256);
    const act256 *X[4] = {X0, X1, X2, X3};
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    static const int8_t pick[4][32] = {
        {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
        {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
        {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
        {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15},
    };
    for (int i = 0; i < nb; i++) {
        prefetch_ahead(&w[i], (int)sizeof(blk_q6_K));
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        __m256i sum[4];
        for (int r = 0; r < 4; r++) /* the offset 32 through the activation sums, as the one-row dot */
            sum[r] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                      _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)X[r][i].bsums), sc16), 5));
        for (int h = 0; h < 2; h++) {
            const __m256i sch = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11) : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            __m256i q[4], s[4];
            q6k_half(&w[i], h, q);
            for (int j = 0; j < 4; j++) s[j] = _mm256_shuffle_epi8(sch, _mm256_loadu_si256((const __m256i *)pick[j]));
            for (int r = 0; r < 4; r++) {
                const int8_t *xr = X[r][i].qs + 128 * h;
                for (int j = 0; j < 4; j++)
                    sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(q[j], _mm256_loadu_si256((const __m256i *)(xr + 32 * j))), s[j]));
            }
        }
        const float d = H2F(w[i].d);
        for (int r = 0; r < 4; r++) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * X[r][i].d), _mm256_cvtepi32_ps(sum[r]), acc[r]);
    }
    for (int r = 0; r < 4; r++) out[r] = hsum8(acc[r]);
}

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

DEFINE_Q2K(dot_q2_K_avx2, AVX2)
DEFINE_Q3K(dot_q3_K_avx2, AVX2)
DEFINE_IQ4XS(dot_iq4_xs_avx2, AVX2)
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
    AVX512 float NAME(const void *vw, const void *vx, int nb) {                                    \
        const act256 *X[1] = {vx};                                                                 \
        float o;                                                                                   \
        NAME##_rows(vw, X, 1, nb, &o);                                                             \
        return o;                                                                                  \
    }                                                                                              \
    AVX512 void NAME4(const void *vw, const void *const *vx, int nb, float *out) {                 \
        NAME##_rows(vw, (const act256 *const *)vx, 4, nb, out);                                    \
    }

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

AVX512 float dot_q6_K_avx512(const void *vw, const void *vx, int nb) {
    const act256 *X[1] = {vx};
    float o;
    q6k512_rows(vw, X, 1, nb, &o);
    return o;
}

AVX512 void dot4_q6_K_avx512(const void *vw, const void *const *vx, int nb, float *out) {
    q6k512_rows(vw, (const act256 *const *)vx, 4, nb, out);
}

/* ---- AVX-512 activation quantization: the scalar functions' arithmetic, 16 lanes at a
 * time (vcvtps2dq rounds to nearest even, as lrintf does in the default mode). */
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


/* ---- the tiles as matmul.c uses them */
static int kq_type(int type) { return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K; }

/* the types whose rows go through the tiles */
int tile_type(int type) {
    return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K || type == T_Q4_0 || type == T_Q4_1 || type == T_Q5_0 ||
           type == T_Q5_1 || type == T_Q8_0 || type == T_IQ4_NL || type == T_MXFP4 || type == T_Q5_0_X8 ||
           type == T_MXFP4_X8;
}

/* bytes of one packed tile (eight weight rows) */
/* bytes of one packed tile (eight weight rows); AVX-512 has its own layouts */
size_t tile_bytes(int type, int nb) {
    const int wide = gc_isa() >= ISA_AVX512;
    const size_t per = kq_type(type) ? (wide ? sizeof(kq512_tile_block) : sizeof(kq_tile_block))
                                     : (wide ? sizeof(t32x512_block) : sizeof(t32_block));
    return per * (size_t)nb;
}

/* the AVX2 packing of one 32-block type, block i */
static void t32_pack_one(int type, const uint8_t *w, int64_t row_bytes, int nb, int i, t32_block *b) {
    const int64_t bb = row_bytes / nb;
    if (type == T_Q5_0_X8) x8_tile_pack(w + i * (int64_t)sizeof(blk_q5_0x8), 1, b);
    else if (type == T_MXFP4_X8) mx8_tile_pack(w + i * (int64_t)sizeof(blk_mxfp4x8), 1, b);
    else t32_pack(type, w + i * bb, row_bytes, 1, b);
}

void tile_pack(int type, const uint8_t *w, int64_t row_bytes, int nb, void *t) {
    if (kq_type(type) && gc_isa() >= ISA_AVX512) kq512_tile_pack(type, w, row_bytes, nb, t);
    else if (kq_type(type)) kq_tile_pack(type, w, row_bytes, nb, t);
    else if (gc_isa() >= ISA_AVX512)
        for (int i = 0; i < nb; i++) {
            t32_block b;
            t32_pack_one(type, w, row_bytes, nb, i, &b);
            t32x512_from(&b, (t32x512_block *)t + i, signed32(type));
        }
    else if (type == T_Q5_0_X8) x8_tile_pack(w, nb, t);
    else if (type == T_MXFP4_X8) mx8_tile_pack(w, nb, t);
    else t32_pack(type, w, row_bytes, nb, t);
}

void tile_dot(int type, const void *t, int nb, const void *const *xs, float o[4][8]) {
    const int wide = gc_isa() >= ISA_AVX512;
    if (kq_type(type)) {
        if (wide) kq512_tile_dot(t, nb, (const act256 *const *)xs, o);
        else kq_tile_dot(t, nb, (const act256 *const *)xs, o);
    } else if (signed32(type)) {
        if (wide) t32x512_dot_signed(t, nb, (const act32 *const *)xs, o);
        else t32_dot_signed(t, nb, (const act32 *const *)xs, o);
    } else if (wide) t32x512_dot(t, nb, (const act32 *const *)xs, o);
    else t32_dot(t, nb, (const act32 *const *)xs, o);
}

#endif /* GC_X86 */
