/* Prompt-sized products on AVX-512 without AMX (Zen 4 / Zen 5, Ice Lake, and AMX CPUs with
 * a float32 prefill), weight rows in strips of eight met by activation rows sixteen to a
 * vector (a lane each), so that nothing is summed across lanes.
 *
 * Integer strips (VNNI): the 256-block types' weight rows unpacked eight at a time
 * to signed bytes with a float scale per run of 16 or 32 (and a minimum where the type
 * has one), the activation rows (act256) regrouped once per call sixteen to a vector, one
 * 4-byte lane per row (the bytes + 128, unsigned), so that each VPDPBUSD takes four
 * weights of one weight row, broadcast from memory, against sixteen activation rows: 64
 * products per instruction and nothing else in the inner loop. A run's integer sum starts
 * at -128 x its weights' sum (kept by the unpacking), which takes the + 128 back exactly;
 * the scale and the minimum go in once per run in float32, the activation scale once per
 * 256-block. The tiles of arch/x86_tiles.c spend two instructions (VPMADDUBSW, VPDPWSSD)
 * per 64 products and transpose the weights first.
 *
 * Numerics: the integer sums are exact; the float work sums runs in block order per row,
 * another order than the row-wise dots' (tested against them within the tiles'
 * tolerance). */

#include "x86.h"
#include "../iq.h"

#ifdef GC_X86

/* Float strips (F16, BF16): the eight rows converted once to float32, a record per 16
 * columns ([row][16]); the activation rows transposed once per call (column k of sixteen
 * rows a vector); each weight broadcast from the record meets two such vectors in two
 * fused multiply-adds, sixteen accumulators in all: the FMA units' peak, against the
 * four-by-four float tiles' 48 % (their horizontal sums and weights reloaded per pair of
 * activation rows). */

/* weights per run (the scale's reach) and whether the type has a minimum; 0: not taken */
static int vnni_sub(int type) {
    switch (type) {
    case T_Q4_K: case T_Q5_K: case T_IQ4_XS: case T_IQ2_XXS: case T_IQ3_XXS: case T_IQ3_S: case T_IQ1_S:
    case T_TQ1_0: case T_TQ2_0: case T_Q1_0: case T_Q2_0:
        return 32;
    case T_Q6_K: case T_IQ2_XS: case T_IQ2_S: case T_IQ1_M:
        return 16;
    default:
        return 0;
    }
}

static int vnni_min(int type) { return type == T_Q4_K || type == T_Q5_K; }

int vnni_type(int type) { return vnni_sub(type) != 0; }

/* ---- activations: per group of 16 rows (the last padded with zeros), n_cols x 16 bytes of
 * codes (4-byte lane l of vector k/4: row l's bytes 4(k/4) .. + 3, each + 128), then the
 * rows' scales per 256-block, their sums per 16 and per 32 (floats, [block][lane]) */
static size_t group_bytes(int64_t n_cols) { return (size_t)n_cols * 16 + 64 * (size_t)(n_cols / 256 + n_cols / 16 + n_cols / 32); }

size_t vnni_act_bytes(int64_t n_x, int64_t n_cols) { return (size_t)((n_x + 15) / 16) * group_bytes(n_cols); }

typedef struct {
    const uint8_t *xq;
    size_t row_bytes;
    int64_t n_x, n_cols;
    uint8_t *xv;
} vact_ctx;

static void vact_task(void *vctx, int64_t start, int64_t end) {
    const vact_ctx *c = vctx;
    const int64_t nb = c->n_cols / 256, K = c->n_cols;
    for (int64_t g = start; g < end; g++) {
        uint8_t *base = c->xv + g * group_bytes(K);
        uint32_t *codes = (uint32_t *)base;
        float *xd = (float *)(base + K * 16), *bs16 = xd + 16 * nb, *bs32 = bs16 + 16 * (K / 16);
        for (int l = 0; l < 16; l++) {
            const int64_t r = 16 * g + l;
            const act256 *x = r < c->n_x ? (const act256 *)(c->xq + r * c->row_bytes) : NULL;
            for (int64_t i = 0; i < nb; i++) {
                xd[16 * i + l] = x ? x[i].d : 0.f;
                for (int j = 0; j < 16; j++) bs16[16 * (16 * i + j) + l] = x ? (float)x[i].bsums[j] : 0.f;
                for (int j = 0; j < 8; j++)
                    bs32[16 * (8 * i + j) + l] = x ? (float)(x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]) : 0.f;
                for (int k = 0; k < 64; k++) codes[16 * (64 * i + k) + l] = x ? ld32(x[i].qs + 4 * k) ^ 0x80808080u : 0x80808080u;
            }
        }
    }
}

void vnni_act_pack(const uint8_t *xq, size_t row_bytes, int64_t n_x, int64_t n_cols, uint8_t *xv, int n_threads) {
    vact_ctx c = {xq, row_bytes, n_x, n_cols, xv};
    gc_parallel_for(n_threads, (n_x + 15) / 16, 1, vact_task, &c);
}

/* ---- weights: a strip of eight rows, a record per 256-block: the rows' weights as signed
 * bytes ([row][256]), then per row and run (up to 16 a block, [row][16]) its float scale,
 * float minimum and -128 x the sum of its bytes. Every address the product reads is a
 * record's base plus a constant. */
#define REC_Q 0
#define REC_SF 2048
#define REC_MF (2048 + 512)
#define REC_WS (2048 + 1024)
#define REC_BYTES (2048 + 1536)

size_t vnni_strip_bytes(int64_t n_cols) { return (size_t)(n_cols / 256) * REC_BYTES; }

/* -128 x the sum of each run of `sub` signed bytes of q[0..256) (16 or 8 of them) */
AVX512 static inline void run_sums(const int8_t *q, int sub, int32_t *out) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m256i d[4]; /* sums of eight bytes + 128 each */
    for (int c = 0; c < 4; c++)
        d[c] = _mm512_cvtepi64_epi32(_mm512_sad_epu8(_mm512_xor_si512(_mm512_loadu_si512(q + 64 * c), flip), _mm512_setzero_si512()));
    __m512i v0 = _mm512_inserti64x4(_mm512_castsi256_si512(d[0]), d[1], 1);
    __m512i v1 = _mm512_inserti64x4(_mm512_castsi256_si512(d[2]), d[3], 1);
    v0 = _mm512_add_epi32(v0, _mm512_shuffle_epi32(v0, (_MM_PERM_ENUM)0xB1));
    v1 = _mm512_add_epi32(v1, _mm512_shuffle_epi32(v1, (_MM_PERM_ENUM)0xB1));
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    __m512i r = _mm512_permutex2var_epi32(v0, even, v1); /* the 16 runs of 16 */
    if (sub == 32) r = _mm512_permutexvar_epi32(even, _mm512_add_epi32(r, _mm512_shuffle_epi32(r, (_MM_PERM_ENUM)0xB1)));
    r = _mm512_sub_epi32(r, _mm512_set1_epi32(sub * 128));
    r = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(r, 7));
    if (sub == 32) _mm256_storeu_si256((__m256i *)out, _mm512_castsi512_si256(r));
    else _mm512_storeu_si512(out, r);
}

/* row t of the strip from weight row w */
AVX512 static void unpack_row(int type, const uint8_t *w, int64_t K, uint8_t *strip, int t) {
    const int sub = vnni_sub(type);
    const int64_t nb = K / 256;
#define REC(i) (strip + (i) * REC_BYTES)
#define RQ(i) ((int8_t *)(REC(i) + REC_Q + 256 * t))
#define RSF(i) ((float *)(REC(i) + REC_SF + 64 * t))
#define RMF(i) ((float *)(REC(i) + REC_MF + 64 * t))
    switch (type) {
    case T_Q4_K: case T_Q5_K:
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *scales;
            const uint16_t *dd;
            if (type == T_Q4_K) {
                const blk_q4_K *b = (const blk_q4_K *)w + i;
                q45k_unpack(b->qs, NULL, (uint8_t *)RQ(i)); scales = b->scales; dd = &b->d;
            } else {
                const blk_q5_K *b = (const blk_q5_K *)w + i;
                q45k_unpack(b->qs, b->qh, (uint8_t *)RQ(i)); scales = b->scales; dd = &b->d;
            }
            uint8_t sc[8], mn[8];
            unpack_scale_min_k4(scales, sc, mn);
            const float d = H2F(dd[0]), dmin = H2F(dd[1]);
            for (int j = 0; j < 8; j++) {
                RSF(i)[j] = d * sc[j];
                RMF(i)[j] = dmin * mn[j];
            }
        }
        break;
    case T_Q6_K:
        for (int64_t i = 0; i < nb; i++) {
            const blk_q6_K *b = (const blk_q6_K *)w + i;
            const float d = H2F(b->d);
            for (int h = 0; h < 2; h++) {
                __m256i v[4];
                q6k_half(b, h, v);
                for (int j = 0; j < 4; j++)
                    _mm256_storeu_si256((__m256i *)(RQ(i) + 128 * h + 32 * j), _mm256_sub_epi8(v[j], _mm256_set1_epi8(32)));
            }
            for (int j = 0; j < 16; j++) RSF(i)[j] = d * b->scales[j];
        }
        break;
    case T_IQ4_XS: {
        const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
        for (int64_t i = 0; i < nb; i++) {
            const blk_iq4_xs *b = (const blk_iq4_xs *)w + i;
            const float d = H2F(b->d);
            for (int j = 0; j < 8; j++) {
                const int ls = (((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b->scales_h >> (2 * j)) & 3) << 4)) - 32;
                _mm256_storeu_si256((__m256i *)(RQ(i) + 32 * j), _mm256_shuffle_epi8(lut, nibbles32(b->qs + 16 * j)));
                RSF(i)[j] = d * (float)ls;
            }
        }
        break;
    }
    case T_Q1_0: /* 128 weights of one bit: +d or -d */
        for (int64_t i = 0; i < K / 128; i++) {
            const blk_q1_0 *b = (const blk_q1_0 *)w + i;
            for (int g = 0; g < 4; g++) {
                _mm256_storeu_si256((__m256i *)(RQ(i / 2) + 128 * (i % 2) + 32 * g),
                                    _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_or_si256(bits_to_bytes(ld32(b->qs + 4 * g)),
                                                                                            _mm256_set1_epi8(1))));
                RSF(i / 2)[4 * (i % 2) + g] = H2F(b->d);
            }
        }
        break;
    case T_Q2_0: /* 64 weights of two bits, low bits first: (q - 1) d */
        for (int64_t i = 0; i < K / 64; i++) {
            const blk_q2_0 *b = (const blk_q2_0 *)w + i;
            for (int g = 0; g < 2; g++) {
                uint32_t *o = (uint32_t *)(RQ(i / 4) + 64 * (i % 4) + 32 * g);
                for (int k = 0; k < 8; k++) o[k] = q2_0_bytes[b->qs[8 * g + k]];
                RSF(i / 4)[2 * (i % 4) + g] = H2F(b->d);
            }
        }
        break;
    default: { /* the i-quants: signed bytes x integer scales of 16 x one factor per 256 */
        const int64_t bb = (int64_t)find(type)->bytes;
        for (int64_t i = 0; i < nb; i++) {
            int16_t sc[16];
            float d;
            iq_expand(type, w + i * bb, RQ(i), sc, &d);
            if (sub == 16)
                for (int j = 0; j < 16; j++) RSF(i)[j] = d * (float)sc[j];
            else
                for (int j = 0; j < 8; j++) RSF(i)[j] = d * (float)sc[2 * j];
        }
    }
    }
    for (int64_t i = 0; i < nb; i++) run_sums(RQ(i), sub, (int32_t *)(REC(i) + REC_WS + 64 * t));
#undef REC
#undef RQ
#undef RSF
#undef RMF
}

/* out[t][l] = strip row t · activation row l of the group, for the 8 rows and 16 lanes */
AVX512 static inline __attribute__((always_inline)) void micro(const uint8_t *strip, int64_t K, const uint8_t *xg,
                                                              float out[8][16], const int sub, const int min) {
    const int64_t nb = K / 256;
    const uint8_t *codes = xg;
    const float *xd = (const float *)(xg + K * 16), *bs16 = xd + 16 * nb, *bs32 = bs16 + 16 * (K / 16);
    const float *bs = sub == 16 ? bs16 : bs32;
    __m512 tot[8];
    for (int t = 0; t < 8; t++) tot[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, codes += 16 * 256, bs += 16 * (256 / sub)) {
        const uint8_t *rec = strip + i * REC_BYTES;
        const int8_t *q = (const int8_t *)(rec + REC_Q);
        const float *sf = (const float *)(rec + REC_SF), *mf = (const float *)(rec + REC_MF);
        const int32_t *ws = (const int32_t *)(rec + REC_WS);
        __m512 blk[8];
        for (int t = 0; t < 8; t++) blk[t] = _mm512_setzero_ps();
        for (int r = 0; r < 256 / sub; r++) {
            __m512i acc[8];
            for (int t = 0; t < 8; t++) acc[t] = _mm512_set1_epi32(ws[16 * t + r]);
            for (int g = 0; g < sub / 4; g++) {
                const __m512i a = _mm512_loadu_si512(codes + 16 * (sub * r + 4 * g));
                for (int t = 0; t < 8; t++)
                    acc[t] = _mm512_dpbusd_epi32(acc[t], a, _mm512_set1_epi32((int)ld32(q + 256 * t + sub * r + 4 * g)));
            }
            for (int t = 0; t < 8; t++) blk[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_set1_ps(sf[16 * t + r]), blk[t]);
            if (min) {
                const __m512 b = _mm512_loadu_ps(bs + 16 * r);
                for (int t = 0; t < 8; t++) blk[t] = _mm512_fnmadd_ps(b, _mm512_set1_ps(mf[16 * t + r]), blk[t]);
            }
        }
        const __m512 xdv = _mm512_loadu_ps(xd + 16 * i);
        for (int t = 0; t < 8; t++) tot[t] = _mm512_fmadd_ps(blk[t], xdv, tot[t]);
    }
    for (int t = 0; t < 8; t++) _mm512_storeu_ps(out[t], tot[t]);
}

AVX512 static void micro16(const uint8_t *s, int64_t K, const uint8_t *xg, float out[8][16]) { micro(s, K, xg, out, 16, 0); }
AVX512 static void micro32(const uint8_t *s, int64_t K, const uint8_t *xg, float out[8][16]) { micro(s, K, xg, out, 32, 0); }
AVX512 static void micro32_min(const uint8_t *s, int64_t K, const uint8_t *xg, float out[8][16]) { micro(s, K, xg, out, 32, 1); }

/* y[b][r] for activation rows b < n_x and weight rows [start, end), eight at a time */
void vnni_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t n_cols, const uint8_t *xv, int64_t n_x, float *y,
               int64_t y_stride, int64_t start, int64_t end, uint8_t *strip) {
    const int64_t K = n_cols, groups = (n_x + 15) / 16;
    void (*fn)(const uint8_t *, int64_t, const uint8_t *, float[8][16]) =
        vnni_sub(type) == 16 ? micro16 : vnni_min(type) ? micro32_min : micro32;
    for (int64_t r0 = start; r0 < end; r0 += 8) {
        const int n = end - r0 < 8 ? (int)(end - r0) : 8;
        if (n < 8) memset(strip, 0, vnni_strip_bytes(K)); /* rows past the end: zero weights, scales and sums */
        for (int t = 0; t < n; t++) unpack_row(type, w + (r0 + t) * row_bytes, K, strip, t);
        for (int64_t g = 0; g < groups; g++) {
            float o[8][16];
            fn(strip, K, xv + g * group_bytes(K), o);
            for (int l = 0; l < 16 && 16 * g + l < n_x; l++) {
                float *yr = y + (16 * g + l) * y_stride + r0;
                for (int t = 0; t < n; t++) yr[t] = o[t][l];
            }
        }
    }
}

/* ---- float strips */
int fstrip_type(int type) { return type == T_F16 || type == T_BF16; }

size_t fstrip_act_bytes(int64_t n_x, int64_t n_cols) { return (size_t)((n_x + 15) / 16) * (size_t)n_cols * 64; }

typedef struct {
    const float *x;
    int64_t n_x, n_cols;
    float *xf;
} fact_ctx;

static void fact_task(void *vctx, int64_t start, int64_t end) {
    const fact_ctx *c = vctx;
    const int64_t K = c->n_cols;
    for (int64_t g = start; g < end; g++) {
        float *o = c->xf + g * K * 16;
        for (int l = 0; l < 16; l++) {
            const int64_t r = 16 * g + l;
            const float *x = r < c->n_x ? c->x + r * K : NULL;
            for (int64_t k = 0; k < K; k++) o[16 * k + l] = x ? x[k] : 0.f;
        }
    }
}

void fstrip_act_pack(const float *x, int64_t n_x, int64_t n_cols, float *xf, int n_threads) {
    fact_ctx c = {x, n_x, n_cols, xf};
    gc_parallel_for(n_threads, (n_x + 15) / 16, 1, fact_task, &c);
}

size_t fstrip_bytes(int64_t n_cols) { return (size_t)n_cols * 8 * sizeof(float); }

/* weight row t of the strip (records of 16 columns, [row][16]) from an F16 or BF16 row */
AVX512 static void funpack_row(int type, const uint16_t *w, int64_t K, float *strip, int t) {
    for (int64_t c = 0; c < K / 16; c++) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(w + 16 * c));
        const __m512 v = type == T_F16 ? _mm512_cvtph_ps(h)
                                       : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        _mm512_storeu_ps(strip + 128 * c + 16 * t, v);
    }
}

/* out[j][t][l] = strip row t · row l of activation group j, for G groups (1 or 2) */
AVX512 static inline __attribute__((always_inline)) void fmicro(const float *strip, int64_t K, const float *x0,
                                                               const float *x1, float out[2][8][16], const int G,
                                                               const uint8_t *next) {
    __m512 acc[2][8];
    for (int j = 0; j < G; j++)
        for (int t = 0; t < 8; t++) acc[j][t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K / 16; c++, strip += 128, x0 += 256, x1 += 256) {
        if (next) /* the next strip's rows (8 x 2K bytes) from memory meanwhile: 256 bytes per 16 columns */
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)next + 256 * c + 64 * l, _MM_HINT_T1);
        for (int kk = 0; kk < 16; kk++) {
            const __m512 a0 = _mm512_loadu_ps(x0 + 16 * kk);
            const __m512 a1 = G == 2 ? _mm512_loadu_ps(x1 + 16 * kk) : a0;
            for (int t = 0; t < 8; t++) {
                const __m512 w = _mm512_set1_ps(strip[16 * t + kk]);
                acc[0][t] = _mm512_fmadd_ps(a0, w, acc[0][t]);
                if (G == 2) acc[1][t] = _mm512_fmadd_ps(a1, w, acc[1][t]);
            }
        }
    }
    for (int j = 0; j < G; j++)
        for (int t = 0; t < 8; t++) _mm512_storeu_ps(out[j][t], acc[j][t]);
}

AVX512 static void fmicro1(const float *s, int64_t K, const float *x0, float out[2][8][16], const uint8_t *next) {
    fmicro(s, K, x0, x0, out, 1, next);
}
AVX512 static void fmicro2(const float *s, int64_t K, const float *x0, const float *x1, float out[2][8][16],
                           const uint8_t *next) {
    fmicro(s, K, x0, x1, out, 2, next);
}

void fstrip_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t n_cols, const float *xf, int64_t n_x, float *y,
                 int64_t y_stride, int64_t start, int64_t end, float *strip) {
    const int64_t K = n_cols, groups = (n_x + 15) / 16;
    for (int64_t r0 = start; r0 < end; r0 += 8) {
        const int n = end - r0 < 8 ? (int)(end - r0) : 8;
        if (n < 8) memset(strip, 0, fstrip_bytes(K));
        for (int t = 0; t < n; t++) funpack_row(type, (const uint16_t *)(w + (r0 + t) * row_bytes), K, strip, t);
        for (int64_t g = 0; g < groups; g += 2) {
            float o[2][8][16];
            const int G = g + 1 < groups ? 2 : 1;
            const uint8_t *next = g == 0 && r0 + 16 <= end ? w + (r0 + 8) * row_bytes : NULL;
            if (G == 2) fmicro2(strip, K, xf + g * K * 16, xf + (g + 1) * K * 16, o, next);
            else fmicro1(strip, K, xf + g * K * 16, o, next);
            for (int j = 0; j < G; j++)
                for (int l = 0; l < 16 && 16 * (g + j) + l < n_x; l++) {
                    float *yr = y + (16 * (g + j) + l) * y_stride + r0;
                    for (int t = 0; t < n; t++) yr[t] = o[j][t][l];
                }
        }
    }
}

#endif /* GC_X86 */
