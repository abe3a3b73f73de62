/* Prompt-sized products on Intel AMX (Sapphire Rapids and later): the weight rows
 * dequantized 32 at a time to bfloat16 in an L2-sized strip (BF16 files are read as they
 * are), the activations converted once per call to bfloat16 in the tiles' pair layout,
 * and TDPBF16PS summing 16 x 16 x 32 products per instruction in float32. A prompt's
 * product then costs about the dequantization of the weights once: the integer tiles
 * spend as long again in their dots (IQ3_S, 6144 x 2048, 32 rows: 4.4 ms there).
 *
 * Numerics: each weight and each activation rounded once to bfloat16 (round to nearest
 * even), products summed in float32: what the BLAS path takes for longer prompts on these
 * CPUs (torch's bfloat16 matmul over dequantized tiles), not the integer dots' bits. */

#define _GNU_SOURCE /* syscall */
#include "../quants.h"

#if defined(GC_X86)

#include "../iq.h"
#include "x86.h"
#include <sys/syscall.h>
#include <unistd.h>

#define AMX __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,amx-tile,amx-bf16")))

/* ---- can this process use the tiles: the CPU's AMX-BF16 and the kernel's permission to
 * use their state (Linux asks each process to request it) */
static int g_amx_ready = -1;

int amx_ready(void) {
    if (g_amx_ready >= 0) return g_amx_ready;
    int ok = 0;
    __builtin_cpu_init();
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
    if (tile && bf16 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vbmi")) {
        /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18) */
        ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    }
    g_amx_ready = ok;
    return ok;
}

/* the types this path takes: those whose rows dequantize fast enough that the strip
 * costs less than the integer tiles' packing and dots */
int amx_type(int type) {
    switch (type) {
    case T_F16: case T_BF16: case T_Q4_K: case T_Q5_K: case T_Q6_K: case T_IQ4_XS: case T_Q8_0: case T_Q4_0:
    case T_IQ4_NL: case T_Q1_0: case T_Q2_0:
    case T_IQ2_XXS: case T_IQ2_XS: case T_IQ2_S: case T_IQ3_XXS: case T_IQ3_S:
    case T_IQ1_S: case T_IQ1_M: case T_TQ1_0: case T_TQ2_0:
        return 1;
    default:
        return 0;
    }
}

/* ---- activations: x (n_x rows of n_cols floats) as bfloat16 B tiles. Tile (b, c) holds
 * activation rows 16b..16b+15 and columns 32c..32c+31: its row p, lane t the pair of
 * columns 32c + 2p, +1 of activation row 16b + t (1 KB). Blocks run in pairs (the last
 * padded with zeros), b-major. */
size_t amx_act_bytes(int64_t n_x, int64_t n_cols) {
    const int64_t blocks = (n_x + 31) / 32 * 2;
    return (size_t)blocks * (size_t)(n_cols / 32) * 1024;
}

typedef struct {
    const float *x;
    int64_t n_x, n_cols;
    uint16_t *xb;
} act_ctx;

AMX static void act_task(void *vctx, int64_t start, int64_t end) {
    const act_ctx *c = vctx;
    const int64_t nk = c->n_cols / 32;
    for (int64_t b = start; b < end; b++)
        for (int64_t kc = 0; kc < nk; kc++) {
            uint32_t *tile = (uint32_t *)(c->xb + (b * nk + kc) * 512);
            for (int t = 0; t < 16; t++) {
                const int64_t r = 16 * b + t;
                __m512i v = _mm512_setzero_si512();
                if (r < c->n_x) {
                    const float *p = c->x + r * c->n_cols + 32 * kc;
                    v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
                }
                uint32_t pairs[16];
                _mm512_storeu_si512(pairs, v);
                for (int p = 0; p < 16; p++) tile[16 * p + t] = pairs[p];
            }
        }
}

void amx_act_pack(const float *x, int64_t n_x, int64_t n_cols, uint16_t *xb, int n_threads) {
    act_ctx c = {x, n_x, n_cols, xb};
    gc_parallel_for(n_threads, (n_x + 31) / 32 * 2, 1, act_task, &c);
}

/* ---- one weight row as bfloat16: each type's blocks as runs of 32 bytes (signed, or
 * unsigned below 128) with a float scale and a minimum per run of 16 */
AMX static inline void store_bf16(uint16_t *o, __m512 lo, __m512 hi) {
    _mm512_storeu_si512(o, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* o[0..31] = s0 q - m0 (bytes 0..15), s1 q - m1 (bytes 16..31) */
AMX static inline void put32(uint16_t *o, __m256i q, float s0, float s1, float m0, float m1) {
    const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
    const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
    store_bf16(o, _mm512_fmsub_ps(a, _mm512_set1_ps(s0), _mm512_set1_ps(m0)),
               _mm512_fmsub_ps(b, _mm512_set1_ps(s1), _mm512_set1_ps(m1)));
}

AMX static void k45_row(int type, const uint8_t *w, int nb, uint16_t *o) {
    for (int i = 0; i < nb; i++, o += QK_K) {
        const uint8_t *scales;
        const uint16_t *dd;
        uint8_t q[QK_K];
        if (type == T_Q4_K) {
            const blk_q4_K *b = (const blk_q4_K *)w + i;
            q45k_unpack(b->qs, NULL, q); scales = b->scales; dd = &b->d;
        } else {
            const blk_q5_K *b = (const blk_q5_K *)w + i;
            q45k_unpack(b->qs, b->qh, q); scales = b->scales; dd = &b->d;
        }
        uint8_t sc[8], mn[8];
        unpack_scale_min_k4(scales, sc, mn);
        const float d = H2F(dd[0]), dmin = H2F(dd[1]);
        for (int j = 0; j < 8; j++) { /* sub-block j: weights 32j .., scale d sc[j], minimum dmin mn[j] */
            const float s = d * sc[j], m = dmin * mn[j];
            put32(o + 32 * j, _mm256_loadu_si256((const __m256i *)(q + 32 * j)), s, s, m, m);
        }
    }
}

AMX static void q6k_row(const blk_q6_K *b, int nb, uint16_t *o) {
    const __m256i off = _mm256_set1_epi8(32);
    for (int i = 0; i < nb; i++, b++, o += QK_K) {
        const float d = H2F(b->d);
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            q6k_half(b, h, q);
            for (int j = 0; j < 4; j++) {
                const int s = 8 * h + 2 * j;
                put32(o + 128 * h + 32 * j, _mm256_sub_epi8(q[j], off), d * b->scales[s], d * b->scales[s + 1], 0.f, 0.f);
            }
        }
    }
}

AMX static void iq4xs_row(const blk_iq4_xs *b, int nb, uint16_t *o) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
    for (int i = 0; i < nb; i++, b++, o += QK_K) {
        const float d = H2F(b->d);
        for (int j = 0; j < 8; j++) {
            const int ls = (((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b->scales_h >> (2 * j)) & 3) << 4)) - 32;
            const float s = d * (float)ls;
            put32(o + 32 * j, _mm256_shuffle_epi8(lut, nibbles32(b->qs + 16 * j)), s, s, 0.f, 0.f);
        }
    }
}

/* the 32-blocks with one half-float scale: Q8_0, Q4_0, IQ4_NL */
AMX static void b32_row(int type, const uint8_t *w, int nb, uint16_t *o) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
    for (int i = 0; i < nb; i++, o += 32) {
        __m256i q;
        float d;
        if (type == T_Q8_0) {
            const blk_q8_0 *b = (const blk_q8_0 *)w + i;
            q = _mm256_loadu_si256((const __m256i *)b->qs); d = H2F(b->d);
        } else if (type == T_Q4_0) {
            const blk_q4_0 *b = (const blk_q4_0 *)w + i;
            q = _mm256_sub_epi8(nibbles32(b->qs), _mm256_set1_epi8(8)); d = H2F(b->d);
        } else {
            const blk_iq4_nl *b = (const blk_iq4_nl *)w + i;
            q = _mm256_shuffle_epi8(lut, nibbles32(b->qs)); d = H2F(b->d);
        }
        put32(o, q, d, d, 0.f, 0.f);
    }
}

AMX static void row_bf16(int type, const uint8_t *w, int64_t n_cols, uint16_t *o) {
    const int nb256 = (int)(n_cols / QK_K);
    switch (type) {
    case T_F16:
        for (int64_t j = 0; j < n_cols; j += 32)
            store_bf16(o + j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * j))),
                       _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * j + 32))));
        return;
    case T_Q4_K: case T_Q5_K: k45_row(type, w, nb256, o); return;
    case T_Q6_K: q6k_row((const blk_q6_K *)w, nb256, o); return;
    case T_IQ4_XS: iq4xs_row((const blk_iq4_xs *)w, nb256, o); return;
    case T_Q8_0: case T_Q4_0: case T_IQ4_NL: b32_row(type, w, (int)(n_cols / 32), o); return;
    case T_Q1_0: /* 128 weights of one bit: +d or -d */
        for (int64_t i = 0; i < n_cols / 128; i++) {
            const blk_q1_0 *b = (const blk_q1_0 *)w + i;
            const float d = H2F(b->d);
            for (int g = 0; g < 4; g++, o += 32) /* set bits: 0 - (0xff | 1) = 1; clear ones: 0 - 1 */
                put32(o, _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_or_si256(bits_to_bytes(ld32(b->qs + 4 * g)),
                                                                                  _mm256_set1_epi8(1))), d, d, 0.f, 0.f);
        }
        return;
    case T_Q2_0: { /* 64 weights of two bits, low bits first: (q - 1) d */
        const __m256i at = _mm256_setr_epi64x(0x0e0c0a0806040200, 0x1e1c1a1816141210, 0x2e2c2a2826242220,
                                              0x3e3c3a3836343230); /* byte j: bits 2j .. */
        for (int64_t i = 0; i < n_cols / 64; i++) {
            const blk_q2_0 *b = (const blk_q2_0 *)w + i;
            const float d = H2F(b->d);
            for (int g = 0; g < 2; g++, o += 32) {
                const __m256i q = _mm256_and_si256(_mm256_multishift_epi64_epi8(at, _mm256_set1_epi64x((long long)ld64(b->qs + 8 * g))),
                                                   _mm256_set1_epi8(3));
                put32(o, _mm256_sub_epi8(q, _mm256_set1_epi8(1)), d, d, 0.f, 0.f);
            }
        }
        return;
    }
    default: { /* the i-quants: signed bytes x integer scales of 16 x one factor per 256 */
        const int64_t bb = (int64_t)find(type)->bytes;
        int8_t q[QK_K];
        int16_t sc[16];
        float d;
        for (int i = 0; i < nb256; i++) {
            iq_expand(type, w + i * bb, q, sc, &d);
            for (int g = 0; g < 16; g += 2)
                put32(o + QK_K * i + 16 * g, _mm256_loadu_si256((const __m256i *)(q + 16 * g)), d * (float)sc[g],
                      d * (float)sc[g + 1], 0.f, 0.f);
        }
    }
    }
}

/* ---- the product: y[b][r] for activation rows b < n_x and weight rows [start, end) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

AMX static void configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) { /* 0..3 the sums (16 x 16 floats), 4, 5 weights, 6, 7 activations */
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* the four sums of a 32-row strip and a pair of activation blocks out to y */
AMX static void store_sums(float *y, int64_t y_stride, int64_t n_x, int64_t r0, int nr, int64_t b0) {
    float s[4][16][16];
    _tile_stored(0, s[0], 64);
    _tile_stored(1, s[1], 64);
    _tile_stored(2, s[2], 64);
    _tile_stored(3, s[3], 64);
    for (int i = 0; i < 4; i++) {
        const int m0 = 16 * (i >> 1);            /* tiles 2, 3: strip rows 16..31 */
        const int64_t t0 = 16 * (b0 + (i & 1)); /* tiles 1, 3: the second activation block */
        for (int t = 0; t < 16 && t0 + t < n_x; t++) {
            float *yr = y + (t0 + t) * y_stride + r0;
            for (int m = 0; m < 16 && m0 + m < nr; m++) yr[m0 + m] = s[i][m][t];
        }
    }
}

AMX void amx_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t n_cols, const uint16_t *xb, int64_t n_x,
                  float *y, int64_t y_stride, int64_t start, int64_t end, uint16_t *strip) {
    const int64_t nk = n_cols / 32, pairs = (n_x + 31) / 32;
    configure();
    for (int64_t r0 = start; r0 < end; r0 += 32) {
        const int nr = end - r0 < 32 ? (int)(end - r0) : 32;
        const uint8_t *a;
        int64_t stride;
        if (type == T_BF16 && nr == 32) { /* the file's rows are the tiles' rows */
            a = w + r0 * row_bytes;
            stride = row_bytes;
        } else {
            for (int m = 0; m < 32; m++) {
                uint16_t *o = strip + m * (n_cols + 32);
                if (m >= nr) memset(o, 0, (size_t)n_cols * 2);
                else if (type == T_BF16) memcpy(o, w + (r0 + m) * row_bytes, (size_t)n_cols * 2);
                else row_bf16(type, w + (r0 + m) * row_bytes, n_cols, o);
            }
            a = (const uint8_t *)strip;
            stride = n_cols * 2 + 64; /* not a multiple of 4 KB: the tile's 16 rows in 16 cache sets */
        }
        for (int64_t p = 0; p < pairs; p++) {
            const uint16_t *x0 = xb + (2 * p) * nk * 512, *x1 = x0 + nk * 512;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t kc = 0; kc < nk; kc++) {
                _tile_loadd(4, a + 64 * kc, stride);
                _tile_loadd(5, a + 16 * stride + 64 * kc, stride);
                _tile_loadd(6, x0 + 512 * kc, 64);
                _tile_loadd(7, x1 + 512 * kc, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            store_sums(y, y_stride, n_x, r0, nr, 2 * p);
        }
    }
    _tile_release();
}

#endif /* GC_X86 */
