/* Block formats and scalar code: activation rows quantized to 8-bit blocks, the scalar
 * dot product of each weight type against them, and each type's dequantizer. The
 * reference the SIMD versions (arch/) are tested against, and the path where none runs. */

#include "quants.h"

/* ------------------------------------------------------- activation quantization */

void quantize_act32(const float *x, act32 *y, int64_t k) {
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

void quantize_act256(const float *x, act256 *y, int64_t k) {
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

/* ------------------------------------------------------------ scalar dots */

/* the same eight 6-bit scales and mins, four to a 32-bit word: scales 0-3, 4-7, mins 0-3, 4-7 */

void unpack_scale_min_k4(const uint8_t *q, uint8_t *sc, uint8_t *m) {
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

float dot_q4_0_s(const void *vw, const void *vx, int nb) {
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

float dot_q4_1_s(const void *vw, const void *vx, int nb) {
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

float dot_q5_0_s(const void *vw, const void *vx, int nb) {
    const blk_q5_0 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        uint32_t qh; memcpy(&qh, w[i].qh, 4);
        int s = 0;
        for (int j = 0; j < 32; j++) s += (q5_value(w[i].qs, qh, j) - 16) * x[i].qs[j];
        acc += h2f(w[i].d) * x[i].d * (float)s;
    }
    return acc;
}

float dot_q5_1_s(const void *vw, const void *vx, int nb) {
    const blk_q5_1 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        uint32_t qh; memcpy(&qh, w[i].qh, 4);
        int s = 0;
        for (int j = 0; j < 32; j++) s += q5_value(w[i].qs, qh, j) * x[i].qs[j];
        acc += h2f(w[i].d) * x[i].d * (float)s + h2f(w[i].m) * x[i].s;
    }
    return acc;
}

float dot_q8_0_s(const void *vw, const void *vx, int nb) {
    const blk_q8_0 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < 32; j++) s += w[i].qs[j] * x[i].qs[j];
        acc += h2f(w[i].d) * x[i].d * (float)s;
    }
    return acc;
}

/* IQ4_NL and MXFP4: 32 four-bit indices into a table of 16 values (low nibbles the first
 * 16 weights, high nibbles the next), one scale a block: IQ4_NL's float16, MXFP4's E8M0 */
static inline int table_block_dot(const int8_t table[16], const uint8_t qs[16], const int8_t *x) {
    int s = 0;
    for (int j = 0; j < 16; j++) s += table[qs[j] & 0xF] * x[j] + table[qs[j] >> 4] * x[j + 16];
    return s;
}

static inline void table_block_deq(const int8_t table[16], const uint8_t qs[16], float d, float *y) {
    for (int j = 0; j < 16; j++) { y[j] = d * table[qs[j] & 0xF]; y[j + 16] = d * table[qs[j] >> 4]; }
}

float dot_iq4_nl_s(const void *vw, const void *vx, int nb) {
    const blk_iq4_nl *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) acc += h2f(w[i].d) * x[i].d * (float)table_block_dot(kvalues_iq4nl, w[i].qs, x[i].qs);
    return acc;
}

float dot_mxfp4_s(const void *vw, const void *vx, int nb) {
    const blk_mxfp4 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) acc += e8m0_half(w[i].e) * x[i].d * (float)table_block_dot(kvalues_mxfp4, w[i].qs, x[i].qs);
    return acc;
}

float dot_q2_K_s(const void *vw, const void *vx, int nb) {
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

void q3_scales(const uint8_t *sc, int *out) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? (sc[j] & 0xF) : (sc[j - 8] >> 4);
        int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (lo | (hi << 4)) - 32;
    }
}

float dot_q3_K_s(const void *vw, const void *vx, int nb) {
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

float dot_q4_K_s(const void *vw, const void *vx, int nb) {
    const blk_q4_K *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) acc += q45_block_dot(w[i].d, w[i].dmin, w[i].scales, w[i].qs, NULL, &x[i]);
    return acc;
}

float dot_q5_K_s(const void *vw, const void *vx, int nb) {
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

float dot_q6_K_s(const void *vw, const void *vx, int nb) {
    const blk_q6_K *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        int sum = 0;
        for (int e = 0; e < QK_K; e++) sum += w[i].scales[e / 16] * q6_value(&w[i], e) * x[i].qs[e];
        acc += h2f(w[i].d) * x[i].d * (float)sum;
    }
    return acc;
}

float dot_iq4_xs_s(const void *vw, const void *vx, int nb) {
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


void deq_q4_0(const void *v, float *y, int nb) {
    const blk_q4_0 *b = v;
    for (int i = 0; i < nb; i++, y += 32) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 16; j++) { y[j] = d * ((b[i].qs[j] & 0xF) - 8); y[j + 16] = d * ((b[i].qs[j] >> 4) - 8); }
    }
}

void deq_q4_1(const void *v, float *y, int nb) {
    const blk_q4_1 *b = v;
    for (int i = 0; i < nb; i++, y += 32) {
        const float d = h2f(b[i].d), m = h2f(b[i].m);
        for (int j = 0; j < 16; j++) { y[j] = d * (b[i].qs[j] & 0xF) + m; y[j + 16] = d * (b[i].qs[j] >> 4) + m; }
    }
}

void deq_q5_0(const void *v, float *y, int nb) {
    const blk_q5_0 *b = v;
    for (int i = 0; i < nb; i++, y += 32) {
        uint32_t qh; memcpy(&qh, b[i].qh, 4);
        const float d = h2f(b[i].d);
        for (int j = 0; j < 32; j++) y[j] = d * (q5_value(b[i].qs, qh, j) - 16);
    }
}

void deq_q5_1(const void *v, float *y, int nb) {
    const blk_q5_1 *b = v;
    for (int i = 0; i < nb; i++, y += 32) {
        uint32_t qh; memcpy(&qh, b[i].qh, 4);
        const float d = h2f(b[i].d), m = h2f(b[i].m);
        for (int j = 0; j < 32; j++) y[j] = d * q5_value(b[i].qs, qh, j) + m;
    }
}

void deq_q8_0(const void *v, float *y, int nb) {
    const blk_q8_0 *b = v;
    for (int i = 0; i < nb; i++, y += 32) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 32; j++) y[j] = d * b[i].qs[j];
    }
}

void deq_iq4_nl(const void *v, float *y, int nb) {
    const blk_iq4_nl *b = v;
    for (int i = 0; i < nb; i++, y += 32) table_block_deq(kvalues_iq4nl, b[i].qs, h2f(b[i].d), y);
}

void deq_mxfp4(const void *v, float *y, int nb) {
    const blk_mxfp4 *b = v;
    for (int i = 0; i < nb; i++, y += 32) table_block_deq(kvalues_mxfp4, b[i].qs, e8m0_half(b[i].e), y);
}

void deq_q2_K(const void *v, float *y, int nb) {
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

void deq_q3_K(const void *v, float *y, int nb) {
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

void deq_q4_K(const void *v, float *y, int nb) {
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

void deq_q5_K(const void *v, float *y, int nb) {
    const blk_q5_K *b = v;
    for (int i = 0; i < nb; i++, y += QK_K) {
        uint8_t sc[8], m[8];
        unpack_scale_min_k4(b[i].scales, sc, m);
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int e = 0; e < QK_K; e++) y[e] = d * sc[e / 32] * q45_value(b[i].qs, b[i].qh, e) - dmin * m[e / 32];
    }
}

void deq_q6_K(const void *v, float *y, int nb) {
    const blk_q6_K *b = v;
    for (int i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(b[i].d);
        for (int e = 0; e < QK_K; e++) y[e] = d * b[i].scales[e / 16] * q6_value(&b[i], e);
    }
}

void deq_iq4_xs(const void *v, float *y, int nb) {
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
