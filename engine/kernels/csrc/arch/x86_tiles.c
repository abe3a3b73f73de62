/* The x86-64 tiles for many activation rows: eight weight rows packed once (32-block
 * types and k-quants, AVX2 and AVX-512 forms) and met by activation rows four at a time,
 * the eight-row repacked layouts' (Q5_0 x8, MXFP4 x8) one-row dots, and the tile entry
 * points matmul.c calls. */

#include "x86.h"
#include "../iq.h"

#ifdef GC_X86

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
/* activation block i of row r: an act32, or with a256 the 32 bytes of an act256 (IQ4_XS's
 * sub-blocks, eight a 256-block, t32_iq4xs) and its scale */
#define T32_XQ(X, r, i, a256) ((a256) ? ((const act256 *)(X)[r])[(i) / 8].qs + 32 * ((i) % 8) : ((const act32 *)(X)[r])[i].qs)
#define T32_XD(X, r, i, a256) ((a256) ? ((const act256 *)(X)[r])[(i) / 8].d : ((const act32 *)(X)[r])[i].d)

AVX2 static inline __attribute__((always_inline)) void t32_dot_as(const t32_block *t, int nb, const void *const *X,
                                                                float out[4][8], const int sgn, const int a256) {
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
                    memcpy(&xv, T32_XQ(X, r, i, a256) + 4 * g, 4);
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
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(vd, _mm256_set1_ps(T32_XD(X, r, i, a256))), _mm256_cvtepi32_ps(isum[r]), acc[r]);
            if (!sgn) acc[r] = _mm256_fmadd_ps(ve, _mm256_set1_ps(((const act32 *)X[r])[i].s), acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) _mm256_storeu_ps(out[r], acc[r]);
}

AVX2 static void t32_dot(const t32_block *t, int nb, const act32 *const *X, float out[4][8]) {
    t32_dot_as(t, nb, (const void *const *)X, out, 0, 0);
}

AVX2 static void t32_dot_signed(const t32_block *t, int nb, const act32 *const *X, float out[4][8]) {
    t32_dot_as(t, nb, (const void *const *)X, out, 1, 0);
}

AVX2 static void t32_dot_iq4xs(const t32_block *t, int nb, const act256 *const *X, float out[4][8]) {
    t32_dot_as(t, nb, (const void *const *)X, out, 1, 1);
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
            int16_t sc16[16];
            if (iq_expand(type, row + i * (row_bytes / nb), (int8_t *)v[k], sc16, &t[i].d[k])) {
                /* the bytes made unsigned, w + off, the offset through the activation sums as
                 * a minimum of off x scale (dmin = d) */
                const int off = iq_offset(type);
                const __m256i s = _mm256_loadu_si256((const __m256i *)sc16);
                const __m256i lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s));
                const __m256i hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(s, 1));
                sc_lo[k] = pair16(lo, lo);
                sc_hi[k] = pair16(hi, hi);
                mn[k] = _mm256_mullo_epi16(s, _mm256_set1_epi16((short)off));
                t[i].dmin[k] = off ? t[i].d[k] : 0.f;
                for (int c = 0; c < 8 && off; c++) {
                    __m256i *p = (__m256i *)(v[k] + 32 * c);
                    _mm256_storeu_si256(p, _mm256_add_epi8(_mm256_loadu_si256(p), _mm256_set1_epi8((char)off)));
                }
                continue;
            }
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

/* out[r][k] = row k of the tile · activation row r, for four activation rows. Up to 63 two
 * vpmaddubsw sums share a 16-bit lane; `big` (bytes to 127: the offset i-quants) takes each
 * to 32 bits on its own. */
AVX2 static inline __attribute__((always_inline)) void kq_tile_dot_as(const kq_tile_block *t, int nb, const act256 *const *X,
                                                                    float out[4][8], const int big) {
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
                const __m256i p0 = _mm256_maddubs_epi16(w0, _mm256_set1_epi32(x4[0]));
                const __m256i p1 = _mm256_maddubs_epi16(w1, _mm256_set1_epi32(x4[1]));
                const __m256i p2 = _mm256_maddubs_epi16(w2, _mm256_set1_epi32(x4[2]));
                const __m256i p3 = _mm256_maddubs_epi16(w3, _mm256_set1_epi32(x4[3]));
                if (big)
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(
                        _mm256_add_epi32(_mm256_madd_epi16(p0, sc), _mm256_madd_epi16(p1, sc)),
                        _mm256_add_epi32(_mm256_madd_epi16(p2, sc), _mm256_madd_epi16(p3, sc))));
                else
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(p0, p1), sc),
                                                                         _mm256_madd_epi16(_mm256_add_epi16(p2, p3), sc)));
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
                                                                      const void *const *X, float out[4][8], const int sgn,
                                                                      const int a256) {
    const __m512i ones = _mm512_set1_epi16(1), flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const __m512i w0 = _mm512_loadu_si512(t[i].q[0]), w1 = _mm512_loadu_si512(t[i].q[1]);
        const __m512i w2 = _mm512_loadu_si512(t[i].q[2]), w3 = _mm512_loadu_si512(t[i].q[3]);
        const __m512 vd = _mm512_loadu_ps(t[i].d);
        for (int r = 0; r < 4; r++) {
            const int8_t *xq = T32_XQ(X, r, i, a256);
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
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(vd, _mm512_set1_ps(T32_XD(X, r, i, a256))), _mm512_cvtepi32_ps(isum), acc[r]);
            if (!sgn) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(t[i].e), _mm512_set1_ps(((const act32 *)X[r])[i].s), acc[r]);
        }
    }
    pairs_out(acc, out);
}

AVX512 static void t32x512_dot(const t32x512_block *t, int nb, const act32 *const *X, float out[4][8]) {
    t32x512_dot_as(t, nb, (const void *const *)X, out, 0, 0);
}

AVX512 static void t32x512_dot_signed(const t32x512_block *t, int nb, const act32 *const *X, float out[4][8]) {
    t32x512_dot_as(t, nb, (const void *const *)X, out, 1, 0);
}

AVX512 static void t32x512_dot_iq4xs(const t32x512_block *t, int nb, const act256 *const *X, float out[4][8]) {
    t32x512_dot_as(t, nb, (const void *const *)X, out, 1, 1);
}

/* IQ4_XS as 32-block tiles: each sub-block of 32 a signed block of IQ4_NL's table values
 * with the float scale d x (its six-bit scale - 32), met by the act256 rows' 32-byte runs */
AVX2 static void iq4xs_t32_pack(const uint8_t *w, int64_t row_bytes, int i, t32_block *t) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
    __m256i qv[8][8];
    for (int k = 0; k < 8; k++) {
        const blk_iq4_xs *b = (const blk_iq4_xs *)(w + k * row_bytes) + i;
        const float d = H2F(b->d);
        for (int j = 0; j < 8; j++) {
            const int ls = (((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b->scales_h >> (2 * j)) & 3) << 4)) - 32;
            qv[j][k] = _mm256_shuffle_epi8(lut, nibbles32(b->qs + 16 * j));
            t[j].d[k] = d * (float)ls;
            t[j].e[k] = 0.f;
        }
    }
    for (int j = 0; j < 8; j++) transpose8x32(qv[j], (__m256i *)t[j].q);
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

AVX512 static inline __attribute__((always_inline)) void kq512_tile_dot_as(const kq512_tile_block *t, int nb,
                                                                         const act256 *const *X, float out[4][8], const int big) {
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
                const __m512i p0 = _mm512_maddubs_epi16(w0, bcast8(xq)), p1 = _mm512_maddubs_epi16(w1, bcast8(xq + 8));
                if (big) isum[r] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(isum[r], p0, sc), p1, sc);
                else isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_add_epi16(p0, p1), sc);
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

AVX2 static void kq_tile_dot(const kq_tile_block *t, int nb, const act256 *const *X, float out[4][8]) {
    kq_tile_dot_as(t, nb, X, out, 0);
}
AVX2 static void kq_tile_dot_big(const kq_tile_block *t, int nb, const act256 *const *X, float out[4][8]) {
    kq_tile_dot_as(t, nb, X, out, 1);
}
AVX512 static void kq512_tile_dot(const kq512_tile_block *t, int nb, const act256 *const *X, float out[4][8]) {
    kq512_tile_dot_as(t, nb, X, out, 0);
}
AVX512 static void kq512_tile_dot_big(const kq512_tile_block *t, int nb, const act256 *const *X, float out[4][8]) {
    kq512_tile_dot_as(t, nb, X, out, 1);
}

/* ---- F16 / BF16 tiles: eight weight rows as float32 (converted once), met by float32
 * activation rows: each pass of the AVX-512 loop holds four weight rows against four
 * activation rows in 16 accumulators (loads two per four fused multiply-adds), AVX2 four
 * against two; the last n % 16 (8) columns one at a time. */
static int float_type(int type) { return type == T_F16 || type == T_BF16; }

AVX2 static void ftile_pack(int type, const uint8_t *w, int64_t row_bytes, int n, float *t) {
    for (int k = 0; k < 8; k++) {
        const uint16_t *row = (const uint16_t *)(w + k * row_bytes);
        float *o = t + (int64_t)k * n;
        int j = 0;
        if (type == T_F16)
            for (; j + 8 <= n; j += 8) _mm256_storeu_ps(o + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + j))));
        else
            for (; j + 8 <= n; j += 8)
                _mm256_storeu_ps(o + j, _mm256_castsi256_ps(_mm256_slli_epi32(
                                            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + j))), 16)));
        for (; j < n; j++) {
            if (type == T_F16) o[j] = h2f(row[j]);
            else o[j] = bf2f(row[j]);
        }
    }
}

AVX512 static void ftile_dot512(const float *t, int n, const float *const *X, float out[4][8]) {
    for (int h = 0; h < 2; h++) {
        const float *w = t + (int64_t)4 * h * n;
        __m512 acc[4][4];
        for (int k = 0; k < 4; k++) for (int r = 0; r < 4; r++) acc[k][r] = _mm512_setzero_ps();
        int j = 0;
        for (; j + 16 <= n; j += 16) {
            __m512 xv[4];
            for (int r = 0; r < 4; r++) xv[r] = _mm512_loadu_ps(X[r] + j);
            for (int k = 0; k < 4; k++) {
                const __m512 wv = _mm512_loadu_ps(w + (int64_t)k * n + j);
                for (int r = 0; r < 4; r++) acc[k][r] = _mm512_fmadd_ps(wv, xv[r], acc[k][r]);
            }
        }
        for (int k = 0; k < 4; k++)
            for (int r = 0; r < 4; r++) {
                float s = _mm512_reduce_add_ps(acc[k][r]);
                for (int i = j; i < n; i++) s += w[(int64_t)k * n + i] * X[r][i];
                out[r][4 * h + k] = s;
            }
    }
}

AVX2 static void ftile_dot256(const float *t, int n, const float *const *X, float out[4][8]) {
    for (int h = 0; h < 2; h++)
        for (int rp = 0; rp < 4; rp += 2) {
            const float *w = t + (int64_t)4 * h * n;
            __m256 acc[4][2];
            for (int k = 0; k < 4; k++) acc[k][0] = acc[k][1] = _mm256_setzero_ps();
            int j = 0;
            for (; j + 8 <= n; j += 8) {
                const __m256 x0 = _mm256_loadu_ps(X[rp] + j), x1 = _mm256_loadu_ps(X[rp + 1] + j);
                for (int k = 0; k < 4; k++) {
                    const __m256 wv = _mm256_loadu_ps(w + (int64_t)k * n + j);
                    acc[k][0] = _mm256_fmadd_ps(wv, x0, acc[k][0]);
                    acc[k][1] = _mm256_fmadd_ps(wv, x1, acc[k][1]);
                }
            }
            for (int k = 0; k < 4; k++)
                for (int r = 0; r < 2; r++) {
                    float s = hsum8(acc[k][r]);
                    for (int i = j; i < n; i++) s += w[(int64_t)k * n + i] * X[rp + r][i];
                    out[rp + r][4 * h + k] = s;
                }
        }
}

/* ---- the tiles as matmul.c uses them */
/* the types expanded to signed bytes (iq_expand), tiled as k-quants with an offset */
static int sk_type(int type) {
    return type == T_IQ2_XXS || type == T_IQ2_XS || type == T_IQ2_S || type == T_IQ3_XXS || type == T_IQ3_S ||
           type == T_IQ1_S || type == T_IQ1_M || type == T_TQ1_0 || type == T_TQ2_0;
}

static int kq_type(int type) { return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K || sk_type(type); }

/* the types whose rows go through the tiles */
int tile_type(int type) {
    return kq_type(type) || float_type(type) || type == T_IQ4_XS || type == T_Q4_0 || type == T_Q4_1 || type == T_Q5_0 ||
           type == T_Q5_1 || type == T_Q8_0 || type == T_IQ4_NL || type == T_MXFP4 || type == T_Q5_0_X8 ||
           type == T_MXFP4_X8;
}

/* bytes of one packed tile (eight weight rows) */
/* bytes of one packed tile (eight weight rows); AVX-512 has its own layouts */
size_t tile_bytes(int type, int nb) {
    const int wide = gc_isa() >= ISA_AVX512;
    if (float_type(type)) return 8 * sizeof(float) * (size_t)nb; /* nb: the row's columns */
    if (type == T_IQ4_XS) return (wide ? sizeof(t32x512_block) : sizeof(t32_block)) * 8 * (size_t)nb;
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
    if (float_type(type)) ftile_pack(type, w, row_bytes, nb, t);
    else if (type == T_IQ4_XS)
        for (int i = 0; i < nb; i++) {
            t32_block b[8];
            iq4xs_t32_pack(w, row_bytes, i, gc_isa() >= ISA_AVX512 ? b : (t32_block *)t + 8 * i);
            for (int j = 0; j < 8 && gc_isa() >= ISA_AVX512; j++) t32x512_from(&b[j], (t32x512_block *)t + 8 * i + j, 1);
        }
    else if (kq_type(type) && gc_isa() >= ISA_AVX512) kq512_tile_pack(type, w, row_bytes, nb, t);
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
    if (float_type(type)) {
        if (wide) ftile_dot512(t, nb, (const float *const *)xs, o);
        else ftile_dot256(t, nb, (const float *const *)xs, o);
    } else if (type == T_IQ4_XS) {
        if (wide) t32x512_dot_iq4xs(t, 8 * nb, (const act256 *const *)xs, o);
        else t32_dot_iq4xs(t, 8 * nb, (const act256 *const *)xs, o);
    } else if (kq_type(type)) {
        const act256 *const *X = (const act256 *const *)xs;
        const int off = sk_type(type) ? iq_offset(type) : 0;
        if (off > 31) {
            if (wide) kq512_tile_dot_big(t, nb, X, o);
            else kq_tile_dot_big(t, nb, X, o);
        } else if (wide) {
            kq512_tile_dot(t, nb, X, o);
        } else {
            kq_tile_dot(t, nb, X, o);
        }
    } else if (signed32(type)) {
        if (wide) t32x512_dot_signed(t, nb, (const act32 *const *)xs, o);
        else t32_dot_signed(t, nb, (const act32 *const *)xs, o);
    } else if (wide) t32x512_dot(t, nb, (const act32 *const *)xs, o);
    else t32_dot(t, nb, (const act32 *const *)xs, o);
}

#endif /* GC_X86 */

