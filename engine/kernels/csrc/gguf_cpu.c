/* gguf-serve CPU kernels: matrix-vector products straight from GGUF blocks.
 *
 * The method llama.cpp uses: quantize each activation row once (to 8-bit blocks of 32
 * or 256 with a float scale and, for the k-quants, sums of 16), then integer dot
 * products against the packed weight blocks, threads over output rows.
 *
 * Plain C with a C ABI (loaded through ctypes; no Python or torch headers). Each dot
 * product exists as a scalar version and, on x86-64, AVX2 / AVX-512 versions compiled
 * with target attributes, on AArch64 a NEON version; gc_set_isa() picks one at run time.
 */

#include "gc.h"

#define QK_K 256

enum {
    T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_IQ4_NL = 20, T_IQ4_XS = 23,
    T_Q5_0_X8 = 0x100 | T_Q5_0, /* Q5_0 repacked at load in groups of eight rows (gc_repack); not a file type */
};

/* ------------------------------------------------------------------ blocks */

typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } blk_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_1;
typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;
typedef struct { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } blk_q2_K;
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } blk_q3_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_K;
typedef struct { uint16_t d; uint8_t qs[16]; } blk_iq4_nl;
typedef struct { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; } blk_iq4_xs;

/* activations */
typedef struct { float d; float s; int8_t qs[32]; } act32;           /* s = d * sum(qs) */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[16]; } act256;

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static inline float h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            man &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline int nearest(float v) { return (int)lrintf(v); }

/* ------------------------------------------------------- activation quantization */

static void quantize_act32(const float *x, act32 *y, int64_t k) {
    for (int64_t i = 0; i < k / 32; i++) {
        float amax = 0.f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * i + j]));
        const float d = amax / 127.f, id = d ? 1.f / d : 0.f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int q = nearest(x[32 * i + j] * id);
            y[i].qs[j] = (int8_t)q;
            sum += q;
        }
        y[i].d = d;
        y[i].s = d * (float)sum;
    }
}

static void quantize_act256(const float *x, act256 *y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++) {
        float amax = 0.f, max = 0.f;
        for (int j = 0; j < QK_K; j++) {
            float ax = fabsf(x[QK_K * i + j]);
            if (ax > amax) { amax = ax; max = x[QK_K * i + j]; }
        }
        if (amax == 0.f) {
            memset(&y[i], 0, sizeof(act256));
            continue;
        }
        const float iscale = -127.f / max; /* as ggml's Q8_K: the extreme maps to -127 */
        for (int j = 0; j < QK_K; j++) {
            int v = nearest(iscale * x[QK_K * i + j]);
            y[i].qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1.f / iscale;
    }
}

/* Software prefetch: each SIMD dot asks for the bytes this far ahead of the block it
 * reads. Rows of a stream lie back to back, so the prefetches run on into the next row;
 * the hardware prefetchers alone stop at 4 KB pages and leave DRAM half used on long
 * rows (Q4_K 2560 x 9728 from DRAM, 2 threads: 13.8 -> 20.6 GB/s). */
#ifndef PREFETCH_LOCALITY
#define PREFETCH_LOCALITY 3
#endif
#ifndef PREFETCH_DIST
#define PREFETCH_DIST 2048
#endif

static inline void prefetch_ahead(const void *p, int bytes) {
    const char *c = (const char *)p + PREFETCH_DIST;
    for (int o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, PREFETCH_LOCALITY);
}

/* ------------------------------------------------------------ scalar dots */

/* the same eight 6-bit scales and mins, four to a 32-bit word: scales 0-3, 4-7, mins 0-3, 4-7 */
static inline void k4_scales_mins(const uint8_t *q, uint32_t out[4]) {
    uint32_t a[3];
    memcpy(a, q, 12);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    out[0] = a[0] & m6;                                  /* scales 0-3 */
    out[1] = (a[2] & m4) | (((a[0] >> 6) & m2) << 4);    /* scales 4-7: low 4 bits, top 2 bits */
    out[2] = a[1] & m6;                                  /* mins 0-3 */
    out[3] = ((a[2] >> 4) & m4) | (((a[1] >> 6) & m2) << 4); /* mins 4-7 */
}

static void unpack_scale_min_k4(const uint8_t *q, uint8_t *sc, uint8_t *m) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = q[j] & 63;
            m[j] = q[j + 4] & 63;
        } else {
            sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
}

static float dot_q4_0_s(const void *vw, const void *vx, int nb) {
    const blk_q4_0 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < 16; j++) {
            s += ((w[i].qs[j] & 0xF) - 8) * x[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
        }
        acc += h2f(w[i].d) * x[i].d * (float)s;
    }
    return acc;
}

static float dot_q4_1_s(const void *vw, const void *vx, int nb) {
    const blk_q4_1 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < 16; j++) s += (w[i].qs[j] & 0xF) * x[i].qs[j] + (w[i].qs[j] >> 4) * x[i].qs[j + 16];
        acc += h2f(w[i].d) * x[i].d * (float)s + h2f(w[i].m) * x[i].s;
    }
    return acc;
}

static inline int q5_value(const uint8_t *qs, uint32_t qh, int j) {
    int lo = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
    return lo | (((qh >> j) & 1) << 4);
}

static float dot_q5_0_s(const void *vw, const void *vx, int nb) {
    const blk_q5_0 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        uint32_t qh; memcpy(&qh, w[i].qh, 4);
        int s = 0;
        for (int j = 0; j < 32; j++) s += (q5_value(w[i].qs, qh, j) - 16) * x[i].qs[j];
        acc += h2f(w[i].d) * x[i].d * (float)s;
    }
    return acc;
}

static float dot_q5_1_s(const void *vw, const void *vx, int nb) {
    const blk_q5_1 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        uint32_t qh; memcpy(&qh, w[i].qh, 4);
        int s = 0;
        for (int j = 0; j < 32; j++) s += q5_value(w[i].qs, qh, j) * x[i].qs[j];
        acc += h2f(w[i].d) * x[i].d * (float)s + h2f(w[i].m) * x[i].s;
    }
    return acc;
}

static float dot_q8_0_s(const void *vw, const void *vx, int nb) {
    const blk_q8_0 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < 32; j++) s += w[i].qs[j] * x[i].qs[j];
        acc += h2f(w[i].d) * x[i].d * (float)s;
    }
    return acc;
}

static float dot_iq4_nl_s(const void *vw, const void *vx, int nb) {
    const blk_iq4_nl *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < 16; j++) {
            s += kvalues_iq4nl[w[i].qs[j] & 0xF] * x[i].qs[j] + kvalues_iq4nl[w[i].qs[j] >> 4] * x[i].qs[j + 16];
        }
        acc += h2f(w[i].d) * x[i].d * (float)s;
    }
    return acc;
}

static float dot_q2_K_s(const void *vw, const void *vx, int nb) {
    const blk_q2_K *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        int sum = 0, summ = 0;
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, s = (e % 128) / 32, l = e % 32;
            const int q = (w[i].qs[32 * h + l] >> (2 * s)) & 3;
            sum += (w[i].scales[e / 16] & 0xF) * q * x[i].qs[e];
        }
        for (int j = 0; j < 16; j++) summ += (w[i].scales[j] >> 4) * x[i].bsums[j];
        acc += x[i].d * (h2f(w[i].d) * (float)sum - h2f(w[i].dmin) * (float)summ);
    }
    return acc;
}

static void q3_scales(const uint8_t *sc, int *out) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? (sc[j] & 0xF) : (sc[j - 8] >> 4);
        int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (lo | (hi << 4)) - 32;
    }
}

static float dot_q3_K_s(const void *vw, const void *vx, int nb) {
    const blk_q3_K *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        int scales[16], sum = 0;
        q3_scales(w[i].scales, scales);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, s = (e % 128) / 32, l = e % 32;
            int q = (w[i].qs[32 * h + l] >> (2 * s)) & 3;
            if (!((w[i].hmask[l] >> (e / 32)) & 1)) q -= 4;
            sum += scales[e / 16] * q * x[i].qs[e];
        }
        acc += h2f(w[i].d) * x[i].d * (float)sum;
    }
    return acc;
}

/* element e of a Q4_K or Q5_K block: its nibble, plus for Q5_K (qh != NULL) the fifth
 * bit, bit e / 32 of qh[e % 32] */
static inline int q45_value(const uint8_t *qs, const uint8_t *qh, int e) {
    const int c = e / 64, l = e % 32;
    int q = ((e % 64) / 32) ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 0xF);
    if (qh) q |= ((qh[l] >> (e / 32)) & 1) << 4;
    return q;
}

static float q45_block_dot(uint16_t d, uint16_t dmin, const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                           const act256 *x) {
    uint8_t sc[8], m[8];
    unpack_scale_min_k4(scales, sc, m);
    int sum = 0, summ = 0;
    for (int e = 0; e < QK_K; e++) sum += sc[e / 32] * q45_value(qs, qh, e) * x->qs[e];
    for (int j = 0; j < 8; j++) summ += m[j] * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
    return x->d * (h2f(d) * (float)sum - h2f(dmin) * (float)summ);
}

static float dot_q4_K_s(const void *vw, const void *vx, int nb) {
    const blk_q4_K *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) acc += q45_block_dot(w[i].d, w[i].dmin, w[i].scales, w[i].qs, NULL, &x[i]);
    return acc;
}

static float dot_q5_K_s(const void *vw, const void *vx, int nb) {
    const blk_q5_K *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) acc += q45_block_dot(w[i].d, w[i].dmin, w[i].scales, w[i].qs, w[i].qh, &x[i]);
    return acc;
}

static inline int q6_value(const blk_q6_K *b, int e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    const uint8_t ql = b->ql[64 * h + l + 32 * (s & 1)];
    const int lo = (s >> 1) ? (ql >> 4) : (ql & 0xF);
    return (lo | (((b->qh[32 * h + l] >> (2 * s)) & 3) << 4)) - 32;
}

static float dot_q6_K_s(const void *vw, const void *vx, int nb) {
    const blk_q6_K *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        int sum = 0;
        for (int e = 0; e < QK_K; e++) sum += w[i].scales[e / 16] * q6_value(&w[i], e) * x[i].qs[e];
        acc += h2f(w[i].d) * x[i].d * (float)sum;
    }
    return acc;
}

static float dot_iq4_xs_s(const void *vw, const void *vx, int nb) {
    const blk_iq4_xs *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        int sum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const int ls = (((w[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((w[i].scales_h >> (2 * ib)) & 3) << 4)) - 32;
            int s = 0;
            for (int j = 0; j < 16; j++) {
                const uint8_t q = w[i].qs[16 * ib + j];
                s += kvalues_iq4nl[q & 0xF] * x[i].qs[32 * ib + j] + kvalues_iq4nl[q >> 4] * x[i].qs[32 * ib + j + 16];
            }
            sum += ls * s;
        }
        acc += h2f(w[i].d) * x[i].d * (float)sum;
    }
    return acc;
}

/* ------------------------------------------------------------ dequantize */

typedef void (*deq_fn)(const void *blocks, float *y, int nb);

static void deq_q4_0(const void *v, float *y, int nb) {
    const blk_q4_0 *b = v;
    for (int i = 0; i < nb; i++, y += 32) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 16; j++) { y[j] = d * ((b[i].qs[j] & 0xF) - 8); y[j + 16] = d * ((b[i].qs[j] >> 4) - 8); }
    }
}

static void deq_q4_1(const void *v, float *y, int nb) {
    const blk_q4_1 *b = v;
    for (int i = 0; i < nb; i++, y += 32) {
        const float d = h2f(b[i].d), m = h2f(b[i].m);
        for (int j = 0; j < 16; j++) { y[j] = d * (b[i].qs[j] & 0xF) + m; y[j + 16] = d * (b[i].qs[j] >> 4) + m; }
    }
}

static void deq_q5_0(const void *v, float *y, int nb) {
    const blk_q5_0 *b = v;
    for (int i = 0; i < nb; i++, y += 32) {
        uint32_t qh; memcpy(&qh, b[i].qh, 4);
        const float d = h2f(b[i].d);
        for (int j = 0; j < 32; j++) y[j] = d * (q5_value(b[i].qs, qh, j) - 16);
    }
}

static void deq_q5_1(const void *v, float *y, int nb) {
    const blk_q5_1 *b = v;
    for (int i = 0; i < nb; i++, y += 32) {
        uint32_t qh; memcpy(&qh, b[i].qh, 4);
        const float d = h2f(b[i].d), m = h2f(b[i].m);
        for (int j = 0; j < 32; j++) y[j] = d * q5_value(b[i].qs, qh, j) + m;
    }
}

static void deq_q8_0(const void *v, float *y, int nb) {
    const blk_q8_0 *b = v;
    for (int i = 0; i < nb; i++, y += 32) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 32; j++) y[j] = d * b[i].qs[j];
    }
}

static void deq_iq4_nl(const void *v, float *y, int nb) {
    const blk_iq4_nl *b = v;
    for (int i = 0; i < nb; i++, y += 32) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 16; j++) { y[j] = d * kvalues_iq4nl[b[i].qs[j] & 0xF]; y[j + 16] = d * kvalues_iq4nl[b[i].qs[j] >> 4]; }
    }
}

static void deq_q2_K(const void *v, float *y, int nb) {
    const blk_q2_K *b = v;
    for (int i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, s = (e % 128) / 32, l = e % 32;
            const uint8_t sc = b[i].scales[e / 16];
            y[e] = d * (sc & 0xF) * ((b[i].qs[32 * h + l] >> (2 * s)) & 3) - dmin * (sc >> 4);
        }
    }
}

static void deq_q3_K(const void *v, float *y, int nb) {
    const blk_q3_K *b = v;
    for (int i = 0; i < nb; i++, y += QK_K) {
        int scales[16];
        q3_scales(b[i].scales, scales);
        const float d = h2f(b[i].d);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, s = (e % 128) / 32, l = e % 32;
            int q = (b[i].qs[32 * h + l] >> (2 * s)) & 3;
            if (!((b[i].hmask[l] >> (e / 32)) & 1)) q -= 4;
            y[e] = d * scales[e / 16] * q;
        }
    }
}

static void deq_q4_K(const void *v, float *y, int nb) {
    const blk_q4_K *b = v;
    for (int i = 0; i < nb; i++, y += QK_K) {
        uint8_t sc[8], m[8];
        unpack_scale_min_k4(b[i].scales, sc, m);
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int c = 0; c < 4; c++) {
            const float d1 = d * sc[2 * c], m1 = dmin * m[2 * c], d2 = d * sc[2 * c + 1], m2 = dmin * m[2 * c + 1];
            for (int l = 0; l < 32; l++) {
                y[64 * c + l] = d1 * (b[i].qs[32 * c + l] & 0xF) - m1;
                y[64 * c + 32 + l] = d2 * (b[i].qs[32 * c + l] >> 4) - m2;
            }
        }
    }
}

static void deq_q5_K(const void *v, float *y, int nb) {
    const blk_q5_K *b = v;
    for (int i = 0; i < nb; i++, y += QK_K) {
        uint8_t sc[8], m[8];
        unpack_scale_min_k4(b[i].scales, sc, m);
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int e = 0; e < QK_K; e++) y[e] = d * sc[e / 32] * q45_value(b[i].qs, b[i].qh, e) - dmin * m[e / 32];
    }
}

static void deq_q6_K(const void *v, float *y, int nb) {
    const blk_q6_K *b = v;
    for (int i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(b[i].d);
        for (int e = 0; e < QK_K; e++) y[e] = d * b[i].scales[e / 16] * q6_value(&b[i], e);
    }
}

static void deq_iq4_xs(const void *v, float *y, int nb) {
    const blk_iq4_xs *b = v;
    for (int i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(b[i].d);
        for (int ib = 0; ib < 8; ib++) {
            const int ls = (((b[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b[i].scales_h >> (2 * ib)) & 3) << 4)) - 32;
            for (int j = 0; j < 16; j++) {
                const uint8_t q = b[i].qs[16 * ib + j];
                y[32 * ib + j] = d * ls * kvalues_iq4nl[q & 0xF];
                y[32 * ib + j + 16] = d * ls * kvalues_iq4nl[q >> 4];
            }
        }
    }
}

typedef void (*dot8_fn)(const void *w, const void *x, int nb, float *out);
typedef void (*deq8_fn)(const void *w, float *y, int nb, int64_t n_cols);

#if defined(GC_X86) /* made on x86-64 with AVX2 only (gc_repack); the scalar dot for the lower ISA levels */
/* ---------------------------------------- Q5_0 repacked in groups of eight rows
 * gc_repack turns the file's Q5_0 rows, eight at a time, into blk_q5_0x8: per 32-weight
 * block of the eight rows, the same 22 bytes a row as the file's blocks, so rows 8g..8g+7
 * keep their byte range. qs[32p + 4k + j] is row k's qs[4p + j] (weight 4p + j in the low
 * nibble, 16 + 4p + j in the high one: four weights of a row per 32-bit lane, the tiles'
 * layout), hb[4k + j] holds in bit g the fifth bit of row k's weight 4g + j, d[k] row k's
 * scale. A one-row product then takes eight rows per block in one pass (vpmaddubsw on
 * broadcast activation bytes, the float work once for the eight): Q5_0 1 x 640 dots in
 * L1, one thread, 17.9 -> 5.9 ns per 256 weights on the AVX2 (Zen 3) machine. */
typedef struct { uint16_t d[8]; uint8_t hb[32]; uint8_t qs[128]; } blk_q5_0x8;

static inline uint8_t every_fourth_bit(uint32_t x) { /* bits 0, 4, ..., 28 of x as bits 0..7 */
    x &= 0x11111111u;
    x = (x | x >> 3) & 0x03030303u;
    x = (x | x >> 6) & 0x000F000Fu;
    return (uint8_t)(x | x >> 12);
}

/* eight rows of nb Q5_0 blocks (row_bytes apart) -> nb blk_q5_0x8 */
static void repack_q5_0x8(const uint8_t *w, int64_t row_bytes, int nb, blk_q5_0x8 *out) {
    for (int i = 0; i < nb; i++)
        for (int k = 0; k < 8; k++) {
            const blk_q5_0 *b = (const blk_q5_0 *)(w + k * row_bytes) + i;
            uint32_t qh;
            memcpy(&qh, b->qh, 4);
            out[i].d[k] = b->d;
            for (int p = 0; p < 4; p++) memcpy(out[i].qs + 32 * p + 4 * k, b->qs + 4 * p, 4);
            for (int j = 0; j < 4; j++) out[i].hb[4 * k + j] = every_fourth_bit(qh >> j);
        }
}

/* row k's block back in the file's layout */
static void unpack_q5_0x8(const blk_q5_0x8 *g, int k, blk_q5_0 *b) {
    uint32_t qh = 0;
    b->d = g->d[k];
    for (int p = 0; p < 4; p++) memcpy(b->qs + 4 * p, g->qs + 32 * p + 4 * k, 4);
    for (int j = 0; j < 4; j++)
        for (int bit = 0; bit < 8; bit++) qh |= (uint32_t)((g->hb[4 * k + j] >> bit) & 1) << (4 * bit + j);
    memcpy(b->qh, &qh, 4);
}

static void dot8_q5_0x8_s(const void *vw, const void *vx, int nb, float *out) {
    const blk_q5_0x8 *w = vw;
    for (int k = 0; k < 8; k++) {
        float acc = 0.f;
        for (int i = 0; i < nb; i++) {
            blk_q5_0 b;
            unpack_q5_0x8(&w[i], k, &b);
            acc += dot_q5_0_s(&b, (const act32 *)vx + i, 1);
        }
        out[k] = acc;
    }
}

/* a group's eight rows as floats, rows n_cols apart */
static void deq8_q5_0x8(const void *vw, float *y, int nb, int64_t n_cols) {
    const blk_q5_0x8 *w = vw;
    for (int k = 0; k < 8; k++)
        for (int i = 0; i < nb; i++) {
            blk_q5_0 b;
            unpack_q5_0x8(&w[i], k, &b);
            deq_q5_0(&b, y + k * n_cols + 32 * i, 1);
        }
}

#endif

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

/* Two blocks per iteration with separate accumulators, so that the loads, integer
 * dots and float multiply-adds of neighbouring blocks overlap. */
#define DEFINE_DOT32(NAME, TARGET, DOTI8, BLK, BODY)                                                \
    TARGET static float NAME(const void *vw, const void *vx, int nb) {                            \
        const act32 *x = vx; const BLK *wb = vw;                                                  \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                            \
        float extra = 0.f;                                                                        \
        int i0 = 0;                                                                               \
        for (; i0 + 1 < nb; i0 += 2) {                                                            \
            __m256i qa, qb; float da, db;                                                         \
            prefetch_ahead(&wb[i0], 2 * (int)sizeof(BLK));                                        \
            { const int i = i0; __m256i q; float d; BODY; qa = q; da = d; }                       \
            { const int i = i0 + 1; __m256i q; float d; BODY; qb = q; db = d; }                   \
            const __m256i xa = _mm256_loadu_si256((const __m256i *)x[i0].qs);                     \
            const __m256i xb = _mm256_loadu_si256((const __m256i *)x[i0 + 1].qs);                 \
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(da * x[i0].d), _mm256_cvtepi32_ps(DOTI8(qa, xa)), acc0); \
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(db * x[i0 + 1].d), _mm256_cvtepi32_ps(DOTI8(qb, xb)), acc1); \
        }                                                                                         \
        for (; i0 < nb; i0++) {                                                                   \
            prefetch_ahead(&wb[i0], (int)sizeof(BLK));                                            \
            const int i = i0; __m256i q; float d; BODY;                                           \
            const __m256i xv = _mm256_loadu_si256((const __m256i *)x[i].qs);                      \
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d * x[i].d), _mm256_cvtepi32_ps(DOTI8(q, xv)), acc0); \
        }                                                                                         \
        return hsum8(_mm256_add_ps(acc0, acc1)) + extra;                                          \
    }

#define BODY_Q8_0 const blk_q8_0 *w = vw; q = _mm256_loadu_si256((const __m256i *)w[i].qs); d = H2F(w[i].d)
#define BODY_Q4_0 const blk_q4_0 *w = vw; q = _mm256_sub_epi8(nibbles32(w[i].qs), _mm256_set1_epi8(8)); d = H2F(w[i].d)
#define BODY_Q5_0                                                                                   \
    const blk_q5_0 *w = vw; uint32_t qh; memcpy(&qh, w[i].qh, 4);                                   \
    q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10))); \
    q = _mm256_sub_epi8(q, _mm256_set1_epi8(16)); d = H2F(w[i].d)
#define BODY_Q4_1 const blk_q4_1 *w = vw; q = nibbles32(w[i].qs); d = H2F(w[i].d); extra += H2F(w[i].m) * x[i].s
#define BODY_Q5_1                                                                                   \
    const blk_q5_1 *w = vw; uint32_t qh; memcpy(&qh, w[i].qh, 4);                                   \
    q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10))); \
    d = H2F(w[i].d); extra += H2F(w[i].m) * x[i].s
#define BODY_IQ4_NL                                                                                 \
    const blk_iq4_nl *w = vw;                                                                       \
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl)); \
    q = _mm256_shuffle_epi8(lut, nibbles32(w[i].qs)); d = H2F(w[i].d)

DEFINE_DOT32(dot_q8_0_avx2, AVX2, dot_i8_avx2, blk_q8_0, BODY_Q8_0)
/* AVX2 Q4_0: the weights unsigned (0..15, no sign trick), the offset 8 through the
 * activation block sums: sum((q - 8) x) = sum(q x) - 8 sum(x). Q5_0: signed weights and
 * the sign trick (q - 16 is the low nibble with 0xF0 where the fifth bit is clear): the
 * unsigned form's per-block scalar for the offset became a loop-carried chain through a
 * general register there (one row in L2: 30.4 -> 27.5 ns per 256 weights; for Q4_0 the
 * unsigned form stays ahead, 21.2 vs 22.9). */
#define BODY_Q4_0_U const blk_q4_0 *w = vw; q = nibbles32(w[i].qs); d = H2F(w[i].d); extra -= 8.f * d * x[i].s
#define BODY_Q5_0_S                                                                                 \
    const blk_q5_0 *w = vw; uint32_t qh; memcpy(&qh, w[i].qh, 4);                                   \
    q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8((char)0xF0))); \
    d = H2F(w[i].d)
DEFINE_DOT32(dot_q4_0_avx2, AVX2, dot_u8_avx2, blk_q4_0, BODY_Q4_0_U)
DEFINE_DOT32(dot_q5_0_avx2, AVX2, dot_i8_avx2, blk_q5_0, BODY_Q5_0_S)
DEFINE_DOT32(dot_q4_1_avx2, AVX2, dot_u8_avx2, blk_q4_1, BODY_Q4_1)
DEFINE_DOT32(dot_q5_1_avx2, AVX2, dot_u8_avx2, blk_q5_1, BODY_Q5_1)
DEFINE_DOT32(dot_iq4_nl_avx2, AVX2, dot_i8_avx2, blk_iq4_nl, BODY_IQ4_NL)
/* AVX-512 (VL, BW): the fifth bits as a byte mask for a masked add (Q5_0 dot 13.2 -> 12.1
 * ns per 256 weights in L1) */
#define BODY_Q5_0_MASK                                                                              \
    const blk_q5_0 *w = vw; uint32_t qh; memcpy(&qh, w[i].qh, 4);                                   \
    const __m256i q16 = _mm256_sub_epi8(nibbles32(w[i].qs), _mm256_set1_epi8(16));                  \
    q = _mm256_mask_add_epi8(q16, qh, q16, _mm256_set1_epi8(16)); d = H2F(w[i].d)
#define BODY_Q5_1_MASK                                                                              \
    const blk_q5_1 *w = vw; uint32_t qh; memcpy(&qh, w[i].qh, 4);                                   \
    const __m256i q4 = nibbles32(w[i].qs);                                                          \
    q = _mm256_mask_add_epi8(q4, qh, q4, _mm256_set1_epi8(16)); d = H2F(w[i].d); extra += H2F(w[i].m) * x[i].s

DEFINE_DOT32(dot_q8_0_avx512, AVX512, dot_i8_vnni, blk_q8_0, BODY_Q8_0)
DEFINE_DOT32(dot_q4_0_avx512, AVX512, dot_i8_vnni, blk_q4_0, BODY_Q4_0)
DEFINE_DOT32(dot_q5_0_avx512, AVX512, dot_i8_vnni, blk_q5_0, BODY_Q5_0_MASK)
DEFINE_DOT32(dot_q4_1_avx512, AVX512, dot_u8_vnni, blk_q4_1, BODY_Q4_1)
DEFINE_DOT32(dot_q5_1_avx512, AVX512, dot_u8_vnni, blk_q5_1, BODY_Q5_1_MASK)
DEFINE_DOT32(dot_iq4_nl_avx512, AVX512, dot_i8_vnni, blk_iq4_nl, BODY_IQ4_NL)

/* Q4_K and Q5_K: per 64 elements, 32 bytes hold sub-block 2c (low nibbles) and 2c+1
 * (high nibbles); Q5_K adds a fifth bit: element 64c + 32h + l takes bit (2c + h) of
 * qh[l]. HIGH(shift) gives those bits (as 0x10) for one half, or zero for Q4_K. */
#define DEFINE_Q45K(NAME, TARGET, BLK, HIGH)                                                        \
    TARGET static float NAME(const void *vw, const void *vx, int nb) {                            \
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
AVX2 static float dot_q6_K_avx2(const void *vw, const void *vx, int nb) {
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
    AVX2 static void NAME(const void *vw, const void *const *vx, int nb, float *out) {         \
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
        E += e * X[i].s;                                                                           \
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
DEFINE_DOT32_X4(dot4_iq4_nl_avx2, blk_iq4_nl, 1, X4_IQ4_NL)

#define DEFINE_Q45K_X4(NAME, BLK, HIGH)                                                             \
    AVX2 static void NAME(const void *vw, const void *const *vx, int nb, float *out) {         \
        const BLK *w = vw; X4_ROWS(act256);                                                        \
        const act256 *X[4] = {X0, X1, X2, X3};                                                     \
        __m256 acc[4];                                                                             \
        for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();                                  \
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
            const __m256 vd = _mm256_set1_ps(H2F(w[i].d)), vdmin = _mm256_set1_ps(H2F(w[i].dmin));     \
            for (int r = 0; r < 4; r++) { /* x.d (d sum - dmin (mins . bsums)) */                  \
                const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)X[r][i].bsums), mins); \
                const __m256 t = _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(sum[r]), _mm256_mul_ps(vdmin, _mm256_cvtepi32_ps(msum))); \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(X[r][i].d), t, acc[r]);                   \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < 4; r++) out[r] = hsum8(acc[r]);                                        \
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
 * e x.s. Signed weights (Q8_0, IQ4_NL's table values): t32_dot_signed. */
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
AVX2 static void dot8_q5_0x8_avx2(const void *vw, const void *vx, int nb, float *out) {
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

AVX2 static void dot4_q6_K_avx2(const void *vw, const void *const *vx, int nb, float *out) {
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
    TARGET static float NAME(const void *vw, const void *vx, int nb) {                            \
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
    TARGET static float NAME(const void *vw, const void *vx, int nb) {                            \
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
    TARGET static float NAME(const void *vw, const void *vx, int nb) {                            \
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
#define DEFINE_Q45K_512(NAME, BLK, FIVE)                                                            \
    AVX512 static float NAME(const void *vw, const void *vx, int nb) {                             \
        const BLK *w = vw; const act256 *x = vx;                                                  \
        const __m512i m4 = _mm512_set1_epi8(0xF);                                                 \
        const __m512i sel[4] = {lanes_2x16(0, 2), lanes_2x16(1, 3), lanes_2x16(4, 6), lanes_2x16(5, 7)}; \
        __m512 acc = _mm512_setzero_ps(); __m128 accm = _mm_setzero_ps();                          \
        for (int i = 0; i < nb; i++) {                                                            \
            prefetch_ahead(&w[i], (int)sizeof(BLK));                                              \
            uint32_t sm[4];                                                                       \
            k4_scales_mins(w[i].scales, sm);                                                       \
            const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)sm));      \
            const __m512i sc = _mm512_castsi256_si512(sm16);                                      \
            const __m256i bs = _mm256_loadu_si256((const __m256i *)x[i].bsums);                   \
            const __m128i bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)); \
            const __m128i mins = _mm_madd_epi16(_mm256_extracti128_si256(sm16, 1), bs32);          \
            __m512i sum = _mm512_setzero_si512();                                                 \
            for (int p = 0; p < 2; p++) {                                                         \
                const __m512i q = _mm512_loadu_si512((const void *)(w[i].qs + 64 * p));           \
                __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4); \
                FIVE                                                                              \
                const int8_t *xq = x[i].qs + 128 * p;                                             \
                const __m512i pl = _mm512_maddubs_epi16(lo, load_2x32(xq, xq + 64));              \
                const __m512i ph = _mm512_maddubs_epi16(hi, load_2x32(xq + 32, xq + 96));         \
                sum = _mm512_add_epi32(sum, _mm512_madd_epi16(pl, _mm512_permutexvar_epi16(sel[2 * p], sc))); \
                sum = _mm512_add_epi32(sum, _mm512_madd_epi16(ph, _mm512_permutexvar_epi16(sel[2 * p + 1], sc))); \
            }                                                                                     \
            acc = _mm512_fmadd_ps(_mm512_set1_ps(H2F(w[i].d) * x[i].d), _mm512_cvtepi32_ps(sum), acc); \
            accm = _mm_fmadd_ps(_mm_set1_ps(H2F(w[i].dmin) * x[i].d), _mm_cvtepi32_ps(mins), accm); \
        }                                                                                         \
        return hsum16(acc) - hsum4(accm);                                                         \
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

DEFINE_Q45K_512(dot_q4_K_avx512, blk_q4_K, )
DEFINE_Q45K_512(dot_q5_K_avx512, blk_q5_K, Q5_FIVE)

/* Q6_K: a 64-byte load of ql (half h) gives, from its low nibbles, elements 128h..+63 and
 * from its high nibbles 128h+64..+63; qh adds bits 4-5 from bit pairs 0/2 and 4/6.
 * q is 0..63 with offset 32: sum((q - 32) x) = sum(q x) - 32 sum(x) per 16 (bsums). */
AVX512 static float dot_q6_K_avx512(const void *vw, const void *vx, int nb) {
    const blk_q6_K *w = vw; const act256 *x = vx;
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    const __m512i sel[4] = {lanes_4x8(0), lanes_4x8(4), lanes_4x8(8), lanes_4x8(12)};
    const __m512i shl = lanes_2x16(4, 2), shr = lanes_2x16(0, 2);
    __m512 acc = _mm512_setzero_ps(); __m256 accoff = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        prefetch_ahead(&w[i], (int)sizeof(blk_q6_K));
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        const __m512i sc = _mm512_castsi256_si512(sc16);
        const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)x[i].bsums));
        __m512i sum = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512((const void *)(w[i].ql + 64 * h));
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h)));
            const __m512i lo = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
            const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                               _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
            const __m512i pl = _mm512_maddubs_epi16(lo, _mm512_loadu_si512((const void *)(x[i].qs + 128 * h)));
            const __m512i ph = _mm512_maddubs_epi16(hi, _mm512_loadu_si512((const void *)(x[i].qs + 128 * h + 64)));
            sum = _mm512_add_epi32(sum, _mm512_madd_epi16(pl, _mm512_permutexvar_epi16(sel[2 * h], sc)));
            sum = _mm512_add_epi32(sum, _mm512_madd_epi16(ph, _mm512_permutexvar_epi16(sel[2 * h + 1], sc)));
        }
        const float d = H2F(w[i].d) * x[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sum), acc);
        accoff = _mm256_fmadd_ps(_mm256_set1_ps(32.f * d), _mm256_cvtepi32_ps(off), accoff);
    }
    return hsum16(acc) - hsum8(accoff);
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

AVX2 static void quantize_act32_avx2(const float *x, act32 *y, int64_t k) {
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

AVX2 static void quantize_act256_avx2(const float *x, act256 *y, int64_t k) {
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

AVX512 static void quantize_act32_avx512(const float *x, act32 *y, int64_t k) {
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

AVX512 static void quantize_act256_avx512(const float *x, act256 *y, int64_t k) {
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

/* ------------------------------------------------------------ NEON dots */
#ifdef GC_NEON

/* baseline AArch64 NEON (no dot-product extension needed) */
static inline float h2f_neon(uint16_t h) {
    __fp16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}

/* acc + the 16 products a[j] b[j], pairwise into 4 lanes (|a b| <= 128 * 127 fits 16 bits) */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_s8(vget_high_s8(a), vget_high_s8(b)));
}

static inline int sum16(int8x16_t a, int8x16_t b) { return vaddvq_s32(dot16(vdupq_n_s32(0), a, b)); }

static inline int sum32(int8x16_t a0, int8x16_t a1, const int8_t *x) {
    return vaddvq_s32(dot16(dot16(vdupq_n_s32(0), a0, vld1q_s8(x)), a1, vld1q_s8(x + 16)));
}

static inline int8x16_t lo_nib(uint8x16_t v) { return vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0xF))); }
static inline int8x16_t hi_nib(uint8x16_t v) { return vreinterpretq_s8_u8(vshrq_n_u8(v, 4)); }

/* 16 bits (two bytes) -> 16 bytes of 0x10 / 0x00 */
static inline uint8x16_t bits16_to_0x10(const uint8_t *two) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8(two[0]), vdup_n_u8(two[1]));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

static float dot_q8_0_neon(const void *vw, const void *vx, int nb) {
    const blk_q8_0 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++)
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum32(vld1q_s8(w[i].qs), vld1q_s8(w[i].qs + 16), x[i].qs);
    return acc;
}

static float dot_q4_0_neon(const void *vw, const void *vx, int nb) {
    const blk_q4_0 *w = vw; const act32 *x = vx; float acc = 0.f;
    const int8x16_t eight = vdupq_n_s8(8);
    for (int i = 0; i < nb; i++) {
        const uint8x16_t v = vld1q_u8(w[i].qs);
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum32(vsubq_s8(lo_nib(v), eight), vsubq_s8(hi_nib(v), eight), x[i].qs);
    }
    return acc;
}

static float dot_q4_1_neon(const void *vw, const void *vx, int nb) {
    const blk_q4_1 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        const uint8x16_t v = vld1q_u8(w[i].qs);
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum32(lo_nib(v), hi_nib(v), x[i].qs) + h2f_neon(w[i].m) * x[i].s;
    }
    return acc;
}

static float dot_q5_0_neon(const void *vw, const void *vx, int nb) {
    const blk_q5_0 *w = vw; const act32 *x = vx; float acc = 0.f;
    const int8x16_t sixteen = vdupq_n_s8(16);
    for (int i = 0; i < nb; i++) {
        const uint8x16_t v = vld1q_u8(w[i].qs);
        const int8x16_t a = vorrq_s8(lo_nib(v), vreinterpretq_s8_u8(bits16_to_0x10(w[i].qh)));
        const int8x16_t b = vorrq_s8(hi_nib(v), vreinterpretq_s8_u8(bits16_to_0x10(w[i].qh + 2)));
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum32(vsubq_s8(a, sixteen), vsubq_s8(b, sixteen), x[i].qs);
    }
    return acc;
}

static float dot_q5_1_neon(const void *vw, const void *vx, int nb) {
    const blk_q5_1 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        const uint8x16_t v = vld1q_u8(w[i].qs);
        const int8x16_t a = vorrq_s8(lo_nib(v), vreinterpretq_s8_u8(bits16_to_0x10(w[i].qh)));
        const int8x16_t b = vorrq_s8(hi_nib(v), vreinterpretq_s8_u8(bits16_to_0x10(w[i].qh + 2)));
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum32(a, b, x[i].qs) + h2f_neon(w[i].m) * x[i].s;
    }
    return acc;
}

static float dot_iq4_nl_neon(const void *vw, const void *vx, int nb) {
    const blk_iq4_nl *w = vw; const act32 *x = vx; float acc = 0.f;
    const int8x16_t lut = vld1q_s8(kvalues_iq4nl);
    for (int i = 0; i < nb; i++) {
        const uint8x16_t v = vld1q_u8(w[i].qs);
        const int8x16_t a = vqtbl1q_s8(lut, vandq_u8(v, vdupq_n_u8(0xF))), b = vqtbl1q_s8(lut, vshrq_n_u8(v, 4));
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum32(a, b, x[i].qs);
    }
    return acc;
}

/* Q2_K: element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]; per 16, scale (low
 * nibble) and min (high nibble) */
static float dot_q2_K_neon(const void *vw, const void *vx, int nb) {
    const blk_q2_K *w = vw; const act256 *x = vx; float acc = 0.f;
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (int i = 0; i < nb; i++) {
        int sum = 0, summ = 0;
        for (int j = 0; j < 16; j++) summ += (w[i].scales[j] >> 4) * x[i].bsums[j];
        for (int h = 0; h < 2; h++) {
            const uint8x16_t q0 = vld1q_u8(w[i].qs + 32 * h), q1 = vld1q_u8(w[i].qs + 32 * h + 16);
            for (int s = 0; s < 4; s++) {
                const int e = 128 * h + 32 * s;
                const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * s));
                const int8x16_t a = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, shift), m3));
                const int8x16_t b = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, shift), m3));
                sum += (w[i].scales[e / 16] & 0xF) * sum16(a, vld1q_s8(x[i].qs + e)) +
                       (w[i].scales[e / 16 + 1] & 0xF) * sum16(b, vld1q_s8(x[i].qs + e + 16));
            }
        }
        acc += x[i].d * (h2f_neon(w[i].d) * (float)sum - h2f_neon(w[i].dmin) * (float)summ);
    }
    return acc;
}

/* Q3_K: Q2_K's two bits, minus 4 where bit 4h + s of hmask[l] is clear; signed scales */
static float dot_q3_K_neon(const void *vw, const void *vx, int nb) {
    const blk_q3_K *w = vw; const act256 *x = vx; float acc = 0.f;
    const uint8x16_t m3 = vdupq_n_u8(3), four = vdupq_n_u8(4);
    for (int i = 0; i < nb; i++) {
        int sc[16], sum = 0;
        q3_scales(w[i].scales, sc);
        const uint8x16_t hm0 = vld1q_u8(w[i].hmask), hm1 = vld1q_u8(w[i].hmask + 16);
        for (int h = 0; h < 2; h++) {
            const uint8x16_t q0 = vld1q_u8(w[i].qs + 32 * h), q1 = vld1q_u8(w[i].qs + 32 * h + 16);
            for (int s = 0; s < 4; s++) {
                const int e = 128 * h + 32 * s;
                const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * s));
                const uint8x16_t bit = vdupq_n_u8((uint8_t)(1 << (4 * h + s)));
                /* q = two bits - 4 + (4 where the mask bit is set) */
                const int8x16_t a = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(vshlq_u8(q0, shift), m3), vandq_u8(vtstq_u8(hm0, bit), four))), vreinterpretq_s8_u8(four));
                const int8x16_t b = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(vshlq_u8(q1, shift), m3), vandq_u8(vtstq_u8(hm1, bit), four))), vreinterpretq_s8_u8(four));
                sum += sc[e / 16] * sum16(a, vld1q_s8(x[i].qs + e)) + sc[e / 16 + 1] * sum16(b, vld1q_s8(x[i].qs + e + 16));
            }
        }
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum;
    }
    return acc;
}

/* Q4_K / Q5_K: 32 bytes of qs per 64 elements, low nibbles sub-block 2c, high 2c+1;
 * Q5_K's fifth bit of element 64c + 32h + l is bit 2c + h of qh[l] */
static float q45_block_dot_neon(uint16_t d, uint16_t dmin, const uint8_t *scales, const uint8_t *qs,
                                const uint8_t *qh, const act256 *x) {
    uint8_t sc[8], m[8];
    unpack_scale_min_k4(scales, sc, m);
    int sum = 0, summ = 0;
    for (int j = 0; j < 8; j++) summ += m[j] * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
    const uint8x16_t h0 = qh ? vld1q_u8(qh) : vdupq_n_u8(0), h1 = qh ? vld1q_u8(qh + 16) : vdupq_n_u8(0);
    const uint8x16_t b16 = vdupq_n_u8(0x10);
    for (int c = 0; c < 4; c++) {
        const uint8x16_t v0 = vld1q_u8(qs + 32 * c), v1 = vld1q_u8(qs + 32 * c + 16);
        const uint8x16_t bl = vdupq_n_u8((uint8_t)(1 << (2 * c))), bh = vdupq_n_u8((uint8_t)(2 << (2 * c)));
        const int8x16_t l0 = vorrq_s8(lo_nib(v0), vreinterpretq_s8_u8(vandq_u8(vtstq_u8(h0, bl), b16)));
        const int8x16_t l1 = vorrq_s8(lo_nib(v1), vreinterpretq_s8_u8(vandq_u8(vtstq_u8(h1, bl), b16)));
        const int8x16_t u0 = vorrq_s8(hi_nib(v0), vreinterpretq_s8_u8(vandq_u8(vtstq_u8(h0, bh), b16)));
        const int8x16_t u1 = vorrq_s8(hi_nib(v1), vreinterpretq_s8_u8(vandq_u8(vtstq_u8(h1, bh), b16)));
        sum += sc[2 * c] * sum32(l0, l1, x->qs + 64 * c) + sc[2 * c + 1] * sum32(u0, u1, x->qs + 64 * c + 32);
    }
    return x->d * (h2f_neon(d) * (float)sum - h2f_neon(dmin) * (float)summ);
}

static float dot_q4_K_neon(const void *vw, const void *vx, int nb) {
    const blk_q4_K *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) acc += q45_block_dot_neon(w[i].d, w[i].dmin, w[i].scales, w[i].qs, NULL, &x[i]);
    return acc;
}

static float dot_q5_K_neon(const void *vw, const void *vx, int nb) {
    const blk_q5_K *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) acc += q45_block_dot_neon(w[i].d, w[i].dmin, w[i].scales, w[i].qs, w[i].qh, &x[i]);
    return acc;
}

/* Q6_K: element 128h + 32s + l: a nibble of ql[64h + 32(s & 1) + l] (high one for
 * s >= 2) and bits 2s..2s+1 of qh[32h + l] as bits 4-5, minus 32; int8 scales per 16 */
static float dot_q6_K_neon(const void *vw, const void *vx, int nb) {
    const blk_q6_K *w = vw; const act256 *x = vx; float acc = 0.f;
    const uint8x16_t m3 = vdupq_n_u8(3);
    const int8x16_t off = vdupq_n_s8(32);
    for (int i = 0; i < nb; i++) {
        int sum = 0;
        for (int h = 0; h < 2; h++) {
            for (int s = 0; s < 4; s++) {
                const int e = 128 * h + 32 * s;
                const uint8_t *ql = w[i].ql + 64 * h + 32 * (s & 1);
                const int8x16_t hshift = vdupq_n_s8((int8_t)(-2 * s));
                int8x16_t q[2];
                for (int half = 0; half < 2; half++) {
                    const uint8x16_t v = vld1q_u8(ql + 16 * half);
                    const uint8x16_t lo = (s >> 1) ? vshrq_n_u8(v, 4) : vandq_u8(v, vdupq_n_u8(0xF));
                    const uint8x16_t hi = vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(w[i].qh + 32 * h + 16 * half), hshift), m3), 4);
                    q[half] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hi)), off);
                }
                sum += w[i].scales[e / 16] * sum16(q[0], vld1q_s8(x[i].qs + e)) +
                       w[i].scales[e / 16 + 1] * sum16(q[1], vld1q_s8(x[i].qs + e + 16));
            }
        }
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum;
    }
    return acc;
}

static float dot_iq4_xs_neon(const void *vw, const void *vx, int nb) {
    const blk_iq4_xs *w = vw; const act256 *x = vx; float acc = 0.f;
    const int8x16_t lut = vld1q_s8(kvalues_iq4nl);
    for (int i = 0; i < nb; i++) {
        int sum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const int ls = (((w[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((w[i].scales_h >> (2 * ib)) & 3) << 4)) - 32;
            const uint8x16_t v = vld1q_u8(w[i].qs + 16 * ib);
            const int8x16_t a = vqtbl1q_s8(lut, vandq_u8(v, vdupq_n_u8(0xF))), b = vqtbl1q_s8(lut, vshrq_n_u8(v, 4));
            sum += ls * sum32(a, b, x[i].qs + 32 * ib);
        }
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum;
    }
    return acc;
}

#endif /* GC_NEON */

/* ---------------------------------------------------------------- dispatch */

typedef float (*dot_fn)(const void *, const void *, int);
/* four activation rows against one weight row: out[0..3] */
typedef void (*dot4_fn)(const void *w, const void *const *x, int nb, float *out);

#if defined(GC_X86)
static const char *const ISA_NAMES[N_ISA] = {"scalar", "avx2", "avx512"};
#elif defined(GC_NEON)
static const char *const ISA_NAMES[N_ISA] = {"scalar", "neon"};
#else
static const char *const ISA_NAMES[N_ISA] = {"scalar"};
#endif

typedef struct {
    int type, block, act256; /* act256: activations in 256-blocks (k-quants) else 32 */
    size_t bytes;            /* bytes per weight block */
    dot_fn dot[N_ISA];       /* by ISA level (NULL: none at that level) */
    deq_fn deq;
    void *dot4;              /* four activation rows at once (x86-64, AVX2 and up; NULL: none) */
    int rows8;               /* a repacked type: blocks of eight rows (dot8, deq8), no per-row dot */
    dot8_fn dot8[N_ISA];
    deq8_fn deq8;
} kernel_t;

#if defined(GC_X86)
#define K(t, blk, a, sz, name) {t, blk, a, sz, {dot_##name##_s, dot_##name##_avx2, dot_##name##_avx512}, deq_##name, NULL}
#define K4(t, blk, a, sz, name) {t, blk, a, sz, {dot_##name##_s, dot_##name##_avx2, dot_##name##_avx512}, deq_##name, \
                                 (void *)dot4_##name##_avx2}
#elif defined(GC_NEON)
#define K(t, blk, a, sz, name) {t, blk, a, sz, {dot_##name##_s, dot_##name##_neon}, deq_##name, NULL}
#define K4 K
#else
#define K(t, blk, a, sz, name) {t, blk, a, sz, {dot_##name##_s}, deq_##name, NULL}
#define K4 K
#endif

static const kernel_t KERNELS[] = {
    K4(T_Q4_0, 32, 0, sizeof(blk_q4_0), q4_0),
    K4(T_Q4_1, 32, 0, sizeof(blk_q4_1), q4_1),
    K4(T_Q5_0, 32, 0, sizeof(blk_q5_0), q5_0),
    K4(T_Q5_1, 32, 0, sizeof(blk_q5_1), q5_1),
    K4(T_Q8_0, 32, 0, sizeof(blk_q8_0), q8_0),
    K4(T_IQ4_NL, 32, 0, sizeof(blk_iq4_nl), iq4_nl),
    K(T_Q2_K, QK_K, 1, sizeof(blk_q2_K), q2_K),
    K(T_Q3_K, QK_K, 1, sizeof(blk_q3_K), q3_K),
    K4(T_Q4_K, QK_K, 1, sizeof(blk_q4_K), q4_K),
    K4(T_Q5_K, QK_K, 1, sizeof(blk_q5_K), q5_K),
    K4(T_Q6_K, QK_K, 1, sizeof(blk_q6_K), q6_K),
    K(T_IQ4_XS, QK_K, 1, sizeof(blk_iq4_xs), iq4_xs),
#if defined(GC_X86)
    {T_Q5_0_X8, 32, 0, sizeof(blk_q5_0), {NULL}, NULL, NULL, 1, {dot8_q5_0x8_s, dot8_q5_0x8_avx2, dot8_q5_0x8_avx2},
     deq8_q5_0x8},
#endif
};

static int g_isa = -1;

static int detect_isa(void) {
#if defined(GC_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
#elif defined(GC_NEON)
    return ISA_NEON; /* part of every AArch64 CPU */
#endif
    return ISA_SCALAR;
}

/* the best ISA level this CPU runs */
int gc_best_isa(void) { return detect_isa(); }

/* the name of an ISA level on this architecture, or NULL past the last */
const char *gc_isa_name(int isa) { return isa >= 0 && isa < N_ISA ? ISA_NAMES[isa] : NULL; }

/* select an ISA level (clamped to what the CPU runs); returns the one in use */
int gc_set_isa(int isa) {
    const int best = detect_isa();
    g_isa = (isa < 0 || isa > best) ? best : isa;
    return g_isa;
}

int gc_isa(void) {
    if (g_isa < 0) gc_set_isa(-1);
    return g_isa;
}

static const kernel_t *find(int type) {
    for (size_t i = 0; i < sizeof(KERNELS) / sizeof(KERNELS[0]); i++)
        if (KERNELS[i].type == type) return &KERNELS[i];
    return NULL;
}

/* the dot product of the selected level, or the best one below it */
static int pick_level(const kernel_t *k) {
    int level = gc_isa();
    while (level > 0 && !(k->rows8 ? (void *)k->dot8[level] : (void *)k->dot[level])) level--;
    return level;
}

static dot_fn pick(const kernel_t *k) { return k->dot[pick_level(k)]; }

static dot8_fn pick8(const kernel_t *k) { return k->rows8 ? k->dot8[pick_level(k)] : NULL; }

/* the four-row dot product where the selected level has one (x86-64: AVX2 and up) */
static const void *pick4(const kernel_t *k) {
#if defined(GC_X86)
    if (gc_isa() >= ISA_AVX2) return k->dot4;
#endif
    (void)k;
    return NULL;
}

/* 1 if mul_mat handles this type */
int gc_supports(int type) { return find(type) != NULL; }

/* the ISA of the dot product mul_mat uses for this type under the current selection, or -1 */
int gc_path_isa(int type) {
    const kernel_t *k = find(type);
    return k ? pick_level(k) : -1;
}

/* --------------------------------------------------------------- mul_mat */

typedef struct {
    const kernel_t *k;
    dot_fn dot;
    const uint8_t *w;
    int64_t row_bytes, n_rows, n_cols, n_x;
    const uint8_t *xq;
    size_t xq_row_bytes;
    float *y;
    int64_t y_stride; /* floats between output rows (activation b's outputs start at y + b * y_stride) */
    const void *dot4; /* four activation rows at a time, or NULL */
    dot8_fn dot8;     /* a repacked type's eight-row dot (then dot is NULL) */
} mm_ctx;

/* Row streams a thread walks at once: one sequential stream leaves the memory system
 * idle between misses; interleaved ones keep several in flight (7 -> 12 GB/s from DRAM
 * with 2 threads on an AVX-512 machine, before the dots prefetched; with their prefetch,
 * 2 and 4 streams were alike there, 1 ~5% slower). On the AVX2 (Zen 3) machine, Q4_K
 * 9728 x 2560 matrices from DRAM, 2 threads, medians of interleaved runs: 2 streams
 * 24.8-26.4 GB/s, 4 streams 22.2-23.8, 1 stream 23.2-23.3, 8 streams 22.8; 1 MB matrices
 * 13.0-14.9 vs 12.4-14.8. (-DNSTREAM= / -DPREFETCH_DIST= / -DPREFETCH_LOCALITY= override, for such comparisons.) */
#ifndef NSTREAM
#define NSTREAM 2
#endif

/* y[r] = W[r] · x for rows [start, end) of one activation row, the rows walked as
 * NSTREAM interleaved streams */
static void rows_streamed(dot_fn dot, const uint8_t *w, int64_t row_bytes, const uint8_t *xq, int nb, float *y,
                          int64_t start, int64_t end) {
    if (end - start >= 2 * NSTREAM) {
        const int64_t len = (end - start) / NSTREAM;
        /* the dots prefetch PREFETCH_DIST ahead: ask for each stream's first bytes now */
        const int64_t first = len * row_bytes < PREFETCH_DIST ? len * row_bytes : PREFETCH_DIST;
        for (int s = 0; s < NSTREAM; s++)
            for (int64_t o = 0; o < first; o += 64) __builtin_prefetch(w + (start + s * len) * row_bytes + o, 0, 3);
        for (int64_t i = 0; i < len; i++)
            for (int s = 0; s < NSTREAM; s++) {
                const int64_t r = start + s * len + i;
                y[r] = dot(w + r * row_bytes, xq, nb);
            }
        start += NSTREAM * len;
    }
    for (int64_t r = start; r < end; r++) y[r] = dot(w + r * row_bytes, xq, nb);
}

/* Per-thread scratch (the quantized activations in two formats, Q4_K tiles), kept between calls (decode makes
 * hundreds of calls a token; a malloc/free pair each is measurable). */
static _Thread_local uint8_t *t_scratch[3];
static _Thread_local size_t t_scratch_cap[3];

static uint8_t *scratch(int i, size_t n) {
    if (t_scratch_cap[i] < n) {
        free(t_scratch[i]);
        t_scratch[i] = malloc(n);
        t_scratch_cap[i] = t_scratch[i] ? n : 0;
    }
    return t_scratch[i];
}

/* Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL weight rows go through the repacked tiles from this
 * many activation rows up (gc_set_tiles(0): never, for tests and comparisons) */
#define TILE_MIN_ROWS 8
static int g_tiles = 1;

/* use the tiles (1, the default) or the row-wise dots only (0); returns the setting */
int gc_set_tiles(int on) {
    if (on >= 0) g_tiles = on != 0;
    return g_tiles;
}

#ifdef GC_X86
static int kq_type(int type) { return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K; }

static int tile_type(int type) {
    return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K || type == T_Q4_0 || type == T_Q4_1 || type == T_Q5_0 ||
           type == T_Q5_1 || type == T_Q8_0 || type == T_IQ4_NL || type == T_Q5_0_X8;
}

/* whether n_x activation rows against this type take the tiles (AVX2 and up) */
static int tiled(int type, int64_t n_x) {
    return g_tiles && gc_isa() >= ISA_AVX2 && n_x >= TILE_MIN_ROWS && tile_type(type);
}

/* bytes of one packed tile (eight weight rows) */
static size_t tile_bytes(int type, int nb) {
    const size_t per = kq_type(type) ? sizeof(kq_tile_block) : sizeof(t32_block);
    return per * (size_t)nb;
}

static void *tile_scratch(int type, int nb, int64_t n_tiles) { return scratch(2, tile_bytes(type, nb) * (size_t)n_tiles); }

/* Tiles packed at a time, and the bytes of quantized activation rows that meet them in one
 * run: both together stay in L2 (Gemma 3 270M, 512 rows against its Q6_K 640 x 2048
 * ffn_down: 9.7 ms with all 512 rows, 1.2 MB of them, meeting each tile; 5.8 ms in runs). */
#define TILE_GROUP 8
#define TILE_X_BYTES (128 * 1024)

static void tile_pack(int type, const uint8_t *w, int64_t row_bytes, int nb, void *t) {
    if (kq_type(type)) kq_tile_pack(type, w, row_bytes, nb, t);
    else if (type == T_Q5_0_X8) x8_tile_pack(w, nb, t);
    else t32_pack(type, w, row_bytes, nb, t);
}

static void tile_dot(int type, const void *t, int nb, const void *const *xs, float o[4][8]) {
    if (kq_type(type)) kq_tile_dot(t, nb, (const act256 *const *)xs, o);
    else if (type == T_Q8_0 || type == T_IQ4_NL) t32_dot_signed(t, nb, (const act32 *const *)xs, o);
    else t32_dot(t, nb, (const act32 *const *)xs, o);
}
#endif

/* rows [lo, hi) of the repacked group at row g for every activation row, by its eight-row dot */
static void x8_rows(const mm_ctx *c, int nb, int64_t g, int64_t lo, int64_t hi) {
    const uint8_t *wg = c->w + g * c->row_bytes;
    for (int64_t b = 0; b < c->n_x; b++) {
        float *y = c->y + b * c->y_stride;
        if (lo == g && hi == g + 8) {
            c->dot8(wg, c->xq + b * c->xq_row_bytes, nb, y + g);
            continue;
        }
        float o[8];
        c->dot8(wg, c->xq + b * c->xq_row_bytes, nb, o);
        for (int64_t r = lo; r < hi; r++) y[r] = o[r - g];
    }
}

static void mm_task(void *vctx, int64_t start, int64_t end) {
    const mm_ctx *c = vctx;
    const int nb = (int)(c->n_cols / c->k->block);
    if (c->dot8 && start % 8) { /* a chunk that starts inside a group (after a matrix of other rows) */
        const int64_t g = start - start % 8, hi = g + 8 < end ? g + 8 : end;
        x8_rows(c, nb, g, start, hi);
        start = hi;
    }
    if (c->n_x == 1 && !c->dot8) {
        rows_streamed(c->dot, c->w, c->row_bytes, c->xq, nb, c->y, start, end);
        return;
    }
#ifdef GC_X86
    const int type = c->k->type;
    const int64_t n_tiles = (end - start) / 8 < TILE_GROUP ? (end - start) / 8 : TILE_GROUP;
    uint8_t *t = n_tiles && tiled(type, c->n_x) ? tile_scratch(type, nb, n_tiles) : NULL;
    const size_t tb = tile_bytes(type, nb);
    /* a group of tiles is packed once, then met by the activation rows a cache-sized run at a time */
    int64_t run = (int64_t)(TILE_X_BYTES / c->xq_row_bytes) / 4 * 4;
    if (run < 16) run = 16;
    while (t && start + 8 <= end) {
        const int64_t nt = (end - start) / 8 < n_tiles ? (end - start) / 8 : n_tiles;
        for (int64_t j = 0; j < nt; j++) tile_pack(type, c->w + (start + 8 * j) * c->row_bytes, c->row_bytes, nb, t + j * tb);
        for (int64_t b0 = 0; b0 < c->n_x; b0 += run) {
            const int64_t b1 = b0 + run < c->n_x ? b0 + run : c->n_x;
            for (int64_t j = 0; j < nt; j++)
                for (int64_t b = b0; b < b1; b += 4) {
                    const void *xs[4];
                    for (int l = 0; l < 4; l++) /* past the last activation row: the last again, discarded */
                        xs[l] = c->xq + (b + l < b1 ? b + l : b1 - 1) * c->xq_row_bytes;
                    float o[4][8];
                    tile_dot(type, t + j * tb, nb, xs, o);
                    for (int l = 0; l < 4 && b + l < b1; l++)
                        for (int k = 0; k < 8; k++) c->y[(b + l) * c->y_stride + start + 8 * j + k] = o[l][k];
                }
        }
        start += 8 * nt;
    }
#endif
    if (c->dot8) {
        for (int64_t g = start; g < end; g += 8) x8_rows(c, nb, g, g, g + 8 < end ? g + 8 : end);
        return;
    }
    const dot4_fn dot4 = (dot4_fn)c->dot4;
    for (int64_t r = start; r < end; r++) {
        const uint8_t *wr = c->w + r * c->row_bytes;
        int64_t b = 0;
        if (dot4)
            for (; b + 4 <= c->n_x; b += 4) {
                float o[4];
                const uint8_t *x0 = c->xq + b * c->xq_row_bytes;
                const void *xs[4] = {x0, x0 + c->xq_row_bytes, x0 + 2 * c->xq_row_bytes, x0 + 3 * c->xq_row_bytes};
                dot4(wr, xs, nb, o);
                for (int j = 0; j < 4; j++) c->y[(b + j) * c->y_stride + r] = o[j];
            }
        for (; b < c->n_x; b++) c->y[b * c->y_stride + r] = c->dot(wr, c->xq + b * c->xq_row_bytes, nb);
    }
}

typedef struct {
    const float *x;
    int64_t n_cols;
    uint8_t *xq;
    size_t xq_row_bytes;
    int act256;
} q_ctx;

static void quant_task(void *vctx, int64_t start, int64_t end) {
    const q_ctx *c = vctx;
    for (int64_t b = start; b < end; b++) {
        const float *x = c->x + b * c->n_cols;
        uint8_t *xq = c->xq + b * c->xq_row_bytes;
#ifdef GC_X86
        const int isa = gc_isa();
        if (isa >= ISA_AVX512) {
            if (c->act256) quantize_act256_avx512(x, (act256 *)xq, c->n_cols);
            else quantize_act32_avx512(x, (act32 *)xq, c->n_cols);
            continue;
        }
        if (isa >= ISA_AVX2) {
            if (c->act256) quantize_act256_avx2(x, (act256 *)xq, c->n_cols);
            else quantize_act32_avx2(x, (act32 *)xq, c->n_cols);
            continue;
        }
#endif
        if (c->act256) quantize_act256(x, (act256 *)xq, c->n_cols);
        else quantize_act32(x, (act32 *)xq, c->n_cols);
    }
}

static size_t act_row_bytes(const kernel_t *k, int64_t n_cols) {
    const int64_t nb = n_cols / k->block;
    return k->act256 ? (size_t)nb * sizeof(act256) : (size_t)nb * sizeof(act32);
}

int gc_mul_mat_multi(int n, const int *types, const void *const *ws, const int64_t *n_rows, int64_t n_cols,
                     const float *x, int64_t n_x, float *y, int n_threads);

/* y[n_x, n_rows] = x[n_x, n_cols] · W[n_rows, n_cols]^T for packed W; returns 0 on success */
int gc_mul_mat(int type, const void *w, int64_t n_rows, int64_t n_cols, const float *x, int64_t n_x, float *y,
               int n_threads) {
    return gc_mul_mat_multi(1, &type, &w, &n_rows, n_cols, x, n_x, y, n_threads);
}

/* Several packed matrices that read the same input (q/k/v, gate/up) in one call: x is
 * quantized once per activation format, and the rows of all matrices are one work list.
 * Matrix m's outputs are columns [sum(n_rows[:m]), +n_rows[m]) of y[n_x, sum(n_rows)]. */
typedef struct {
    int n;
    const mm_ctx *mats;
    const int64_t *first; /* first global row of each matrix, and the total at [n] */
} multi_ctx;

static void multi_task(void *vctx, int64_t start, int64_t end) {
    const multi_ctx *c = vctx;
    for (int m = 0; m < c->n && start < end; m++) {
        const int64_t lo = c->first[m], hi = c->first[m + 1];
        if (start >= hi) continue;
        const int64_t e = end < hi ? end : hi;
        mm_task((void *)&c->mats[m], start - lo, e - lo);
        start = e;
    }
}

#define MAX_MULTI 8

int gc_mul_mat_multi(int n, const int *types, const void *const *ws, const int64_t *n_rows, int64_t n_cols,
                     const float *x, int64_t n_x, float *y, int n_threads) {
    if (n < 1 || n > MAX_MULTI) return -1;
    const kernel_t *ks[MAX_MULTI];
    int64_t first[MAX_MULTI + 1];
    first[0] = 0;
    for (int m = 0; m < n; m++) {
        ks[m] = find(types[m]);
        if (!ks[m] || n_cols % ks[m]->block || (ks[m]->rows8 && n_rows[m] % 8)) return -1;
        first[m + 1] = first[m] + n_rows[m];
    }
    const int64_t total = first[n];
    /* one quantized copy of x per activation format the matrices need */
    uint8_t *xq[2] = {NULL, NULL};
    size_t xq_bytes[2] = {0, 0};
    for (int m = 0; m < n; m++) {
        const int f = ks[m]->act256;
        if (xq[f]) continue;
        xq_bytes[f] = act_row_bytes(ks[m], n_cols);
        xq[f] = scratch(f, xq_bytes[f] * (size_t)n_x + 64);
        if (!xq[f]) return -2;
        q_ctx qc = {x, n_cols, xq[f], xq_bytes[f], f};
        gc_parallel_for(n_threads, n_x, 1, quant_task, &qc);
    }
    mm_ctx mats[MAX_MULTI];
    for (int m = 0; m < n; m++) {
        const kernel_t *k = ks[m];
        const int64_t nb = n_cols / k->block;
        mats[m] = (mm_ctx){k, pick(k), ws[m], (int64_t)(nb * k->bytes), n_rows[m], n_cols, n_x, xq[k->act256],
                           xq_bytes[k->act256], y + first[m], total, pick4(k), pick8(k)};
    }
    multi_ctx mc = {n, mats, first};
    int64_t chunk = total / (8 * (n_threads > 0 ? n_threads : 1));
    if (chunk < 16) chunk = 16;
    chunk = (chunk + 7) / 8 * 8; /* whole tiles of eight rows where the type has them */
    gc_parallel_for(n_threads, total, chunk, multi_task, &mc);
    return 0;
}

/* ---------------------------------------------------------- mul_mat_id */

/* Selections grouped by expert: group g is expert gexp[g] with the slots (t * n_k + k)
 * slot[gstart[g] .. gstart[g + 1]). Work items are (group, weight row) pairs, so each
 * expert row is read once for all the tokens that chose that expert. */
typedef struct {
    dot_fn dot;
    int nb;
    const uint8_t *w;
    int64_t row_bytes, expert_bytes, n_rows, n_k;
    const int64_t *gexp, *gstart, *slot;
    const uint8_t *xq;
    size_t xq_row_bytes;
    int x_per_slot;
    float *y;
    int64_t ldy; /* y's row stride (n_rows, or more when two matrices share the rows) */
    const void *dot4;
    int type; /* experts chosen by many tokens take the tiles where this type has them */
} mmid_ctx;

static void mmid_task(void *vctx, int64_t start, int64_t end) {
    const mmid_ctx *c = vctx;
    while (start < end) {
        const int64_t g = start / c->n_rows, r0 = start % c->n_rows;
        const int64_t r1 = end - g * c->n_rows < c->n_rows ? end - g * c->n_rows : c->n_rows;
        const uint8_t *we = c->w + c->gexp[g] * c->expert_bytes;
        if (c->gstart[g + 1] - c->gstart[g] == 1) { /* one token chose this expert: stream its rows */
            const int64_t s = c->slot[c->gstart[g]];
            const uint8_t *xq = c->xq + (c->x_per_slot ? s : s / c->n_k) * c->xq_row_bytes;
            rows_streamed(c->dot, we, c->row_bytes, xq, c->nb, c->y + s * c->ldy, r0, r1);
        } else {
            const dot4_fn dot4 = (dot4_fn)c->dot4;
            int64_t r = r0;
#ifdef GC_X86
            const int64_t n_sel = c->gstart[g + 1] - c->gstart[g];
            void *t = tiled(c->type, n_sel) ? tile_scratch(c->type, c->nb, 1) : NULL;
            for (; t && r + 8 <= r1; r += 8) { /* as mm_task: eight rows of this expert at a time */
                tile_pack(c->type, we + r * c->row_bytes, c->row_bytes, c->nb, t);
                for (int64_t j = 0; j < n_sel; j += 4) {
                    const void *xs[4];
                    int64_t sl[4];
                    for (int l = 0; l < 4; l++) {
                        sl[l] = c->slot[c->gstart[g] + (j + l < n_sel ? j + l : n_sel - 1)];
                        xs[l] = c->xq + (c->x_per_slot ? sl[l] : sl[l] / c->n_k) * c->xq_row_bytes;
                    }
                    float o[4][8];
                    tile_dot(c->type, t, c->nb, xs, o);
                    for (int l = 0; l < 4 && j + l < n_sel; l++)
                        for (int k = 0; k < 8; k++) c->y[sl[l] * c->ldy + r + k] = o[l][k];
                }
            }
#endif
            for (; r < r1; r++) {
                const uint8_t *wr = we + r * c->row_bytes;
                int64_t j = c->gstart[g];
                if (dot4)
                    for (; j + 4 <= c->gstart[g + 1]; j += 4) {
                        const void *xs[4];
                        float o[4];
                        for (int l = 0; l < 4; l++) {
                            const int64_t s = c->slot[j + l];
                            xs[l] = c->xq + (c->x_per_slot ? s : s / c->n_k) * c->xq_row_bytes;
                        }
                        dot4(wr, xs, c->nb, o);
                        for (int l = 0; l < 4; l++) c->y[c->slot[j + l] * c->ldy + r] = o[l];
                    }
                for (; j < c->gstart[g + 1]; j++) {
                    const int64_t s = c->slot[j];
                    const uint8_t *xq = c->xq + (c->x_per_slot ? s : s / c->n_k) * c->xq_row_bytes;
                    c->y[s * c->ldy + r] = c->dot(wr, xq, c->nb);
                }
            }
        }
        start = g * c->n_rows + r1;
    }
}

typedef struct {
    const mmid_ctx *m;
    int n;
    int64_t items; /* per matrix */
} mmid_multi_ctx;

static void mmid_multi_task(void *vctx, int64_t start, int64_t end) {
    const mmid_multi_ctx *c = vctx;
    while (start < end) { /* a chunk may run from one matrix's items into the next's */
        const int i = (int)(start / c->items);
        const int64_t stop = (i + 1) * c->items < end ? (i + 1) * c->items : end;
        mmid_task((void *)&c->m[i], start - i * c->items, stop - i * c->items);
        start = stop;
    }
}

/* The body of gc_mul_mat_id and gc_mul_mat_id2: n (1 or 2) expert tensors of the same
 * shape and activation format read the same x with the same ids; matrix m's rows land in
 * columns [m n_rows, (m + 1) n_rows) of y (n_tokens * n_k, n * n_rows). */
static int mul_mat_id_n(int n, const int *types, const void *const *ws, int64_t n_experts, int64_t n_rows,
                        int64_t n_cols, const float *x, int x_per_slot, const int64_t *ids, int64_t n_tokens,
                        int64_t n_k, float *y, int n_threads) {
    const kernel_t *ks[2];
    for (int m = 0; m < n; m++) {
        ks[m] = find(types[m]);
        if (!ks[m] || ks[m]->rows8 || n_cols % ks[m]->block || ks[m]->act256 != ks[0]->act256 ||
            ks[m]->block != ks[0]->block)
            return -1;
    }
    const kernel_t *k = ks[0];
    const int64_t n_slots = n_tokens * n_k;
    for (int64_t s = 0; s < n_slots; s++)
        if (ids[s] < 0 || ids[s] >= n_experts) return -3;
    const int64_t nb = n_cols / k->block, n_x = x_per_slot ? n_slots : n_tokens;
    const size_t xq_row_bytes = k->act256 ? (size_t)nb * sizeof(act256) : (size_t)nb * sizeof(act32);
    uint8_t *xq = malloc(xq_row_bytes * (size_t)n_x + 64);
    int64_t *count = calloc((size_t)n_experts, sizeof(int64_t));
    int64_t *gexp = malloc(sizeof(int64_t) * (size_t)(n_slots + 1)), *gstart = malloc(sizeof(int64_t) * (size_t)(n_slots + 2));
    int64_t *slot = malloc(sizeof(int64_t) * (size_t)(n_slots + 1)), *fill = malloc(sizeof(int64_t) * (size_t)(n_experts + 1));
    int rc = 0;
    if (!xq || !count || !gexp || !gstart || !slot || !fill) { rc = -2; goto done; }
    q_ctx qc = {x, n_cols, xq, xq_row_bytes, k->act256};
    gc_parallel_for(n_threads, n_x, 1, quant_task, &qc);
    for (int64_t s = 0; s < n_slots; s++) count[ids[s]]++;
    int64_t n_groups = 0, pos = 0;
    for (int64_t e = 0; e < n_experts; e++) {
        fill[e] = pos;
        if (count[e]) { gexp[n_groups] = e; gstart[n_groups++] = pos; pos += count[e]; }
    }
    gstart[n_groups] = pos;
    for (int64_t s = 0; s < n_slots; s++) slot[fill[ids[s]]++] = s;
    mmid_ctx c[2];
    for (int m = 0; m < n; m++) {
        const int64_t row_bytes = nb * (int64_t)ks[m]->bytes;
        c[m] = (mmid_ctx){pick(ks[m]), (int)nb, ws[m], row_bytes, row_bytes * n_rows, n_rows, n_k, gexp, gstart,
                          slot, xq, xq_row_bytes, x_per_slot, y + m * n_rows, n * n_rows, pick4(ks[m]),
                          ks[m]->type};
    }
    const int64_t items = n_groups * n_rows;
    int64_t chunk = n * items / (8 * (n_threads > 0 ? n_threads : 1));
    if (chunk < 16) chunk = 16;
    chunk = (chunk + 7) / 8 * 8; /* whole tiles of eight rows */
    mmid_multi_ctx mc = {c, n, items};
    gc_parallel_for(n_threads, n * items, chunk, mmid_multi_task, &mc);
done:
    free(xq); free(count); free(gexp); free(gstart); free(slot); free(fill);
    return rc;
}

/* Mixture-of-experts product: y[t, k, :] = x_t · W[ids[t, k]]^T, W being n_experts packed
 * (n_rows, n_cols) matrices one after another; x is (n_tokens, n_cols), or with
 * x_per_slot (n_tokens, n_k, n_cols), one row per selection. 0 on success, -3 for an
 * expert index out of range. */
int gc_mul_mat_id(int type, const void *w, int64_t n_experts, int64_t n_rows, int64_t n_cols, const float *x,
                  int x_per_slot, const int64_t *ids, int64_t n_tokens, int64_t n_k, float *y, int n_threads) {
    return mul_mat_id_n(1, &type, &w, n_experts, n_rows, n_cols, x, x_per_slot, ids, n_tokens, n_k, y, n_threads);
}

/* Two expert tensors that read the same x (an MoE's gate and up) in one call: x quantized
 * once, both matrices' rows one work list; y (n_tokens * n_k, 2 n_rows), a's outputs
 * first. -1 where the two types quantize activations differently (then call one by one). */
int gc_mul_mat_id2(int type_a, const void *wa, int type_b, const void *wb, int64_t n_experts, int64_t n_rows,
                   int64_t n_cols, const float *x, const int64_t *ids, int64_t n_tokens, int64_t n_k, float *y,
                   int n_threads) {
    const int types[2] = {type_a, type_b};
    const void *ws[2] = {wa, wb};
    return mul_mat_id_n(2, types, ws, n_experts, n_rows, n_cols, x, 0, ids, n_tokens, n_k, y, n_threads);
}

typedef struct {
    const kernel_t *k;
    const uint8_t *w;
    int64_t row_bytes, n_cols;
    float *y;
} dq_ctx;

static void dq_task(void *vctx, int64_t start, int64_t end) {
    const dq_ctx *c = vctx;
    const int nb = (int)(c->n_cols / c->k->block);
    for (int64_t r = start; r < end; r++)
        if (c->k->rows8) c->k->deq8(c->w + 8 * r * c->row_bytes, c->y + 8 * r * c->n_cols, nb, c->n_cols);
        else c->k->deq(c->w + r * c->row_bytes, c->y + r * c->n_cols, nb);
}

/* y[n_rows, n_cols] = the float values of packed W; returns 0 on success */
int gc_dequantize(int type, const void *w, int64_t n_rows, int64_t n_cols, float *y, int n_threads) {
    const kernel_t *k = find(type);
    if (!k || n_cols % k->block || (k->rows8 && n_rows % 8)) return -1;
    dq_ctx c = {k, w, (int64_t)(n_cols / k->block * k->bytes), n_cols, y};
    /* work items: rows, or groups of eight rows for a repacked type */
    gc_parallel_for(n_threads, k->rows8 ? n_rows / 8 : n_rows, k->rows8 ? 1 : 8, dq_task, &c);
    return 0;
}

/* W's rows in the layout this machine's kernels read fastest, where the type has one:
 * Q5_0 in groups of eight rows (blk_q5_0x8) with AVX2, n_rows a multiple of 8. Writes
 * `out` (as many bytes as W) and returns the new type for gc_mul_mat, gc_mul_mat_multi
 * and gc_dequantize; -1 (out untouched) where there is none. */
int gc_repack(int type, const void *w, int64_t n_rows, int64_t n_cols, void *out) {
#if defined(GC_X86)
    if (type == T_Q5_0 && gc_isa() >= ISA_AVX2 && n_rows % 8 == 0 && n_cols % 32 == 0 && n_rows > 0) {
        const int nb = (int)(n_cols / 32);
        const int64_t row_bytes = nb * (int64_t)sizeof(blk_q5_0);
        for (int64_t g = 0; g < n_rows; g += 8)
            repack_q5_0x8((const uint8_t *)w + g * row_bytes, row_bytes, nb, (blk_q5_0x8 *)((uint8_t *)out + g * row_bytes));
        return T_Q5_0_X8;
    }
#endif
    (void)type; (void)w; (void)n_rows; (void)n_cols; (void)out;
    return -1;
}

