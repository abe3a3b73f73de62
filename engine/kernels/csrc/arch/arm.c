/* The AArch64 kernels: NEON dot products, one activation row at a time. */

#include "../quants.h"

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

float dot_q8_0_neon(const void *vw, const void *vx, int nb) {
    const blk_q8_0 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++)
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum32(vld1q_s8(w[i].qs), vld1q_s8(w[i].qs + 16), x[i].qs);
    return acc;
}

float dot_q4_0_neon(const void *vw, const void *vx, int nb) {
    const blk_q4_0 *w = vw; const act32 *x = vx; float acc = 0.f;
    const int8x16_t eight = vdupq_n_s8(8);
    for (int i = 0; i < nb; i++) {
        const uint8x16_t v = vld1q_u8(w[i].qs);
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum32(vsubq_s8(lo_nib(v), eight), vsubq_s8(hi_nib(v), eight), x[i].qs);
    }
    return acc;
}

float dot_q4_1_neon(const void *vw, const void *vx, int nb) {
    const blk_q4_1 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        const uint8x16_t v = vld1q_u8(w[i].qs);
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum32(lo_nib(v), hi_nib(v), x[i].qs) + h2f_neon(w[i].m) * x[i].s;
    }
    return acc;
}

float dot_q5_0_neon(const void *vw, const void *vx, int nb) {
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

float dot_q5_1_neon(const void *vw, const void *vx, int nb) {
    const blk_q5_1 *w = vw; const act32 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) {
        const uint8x16_t v = vld1q_u8(w[i].qs);
        const int8x16_t a = vorrq_s8(lo_nib(v), vreinterpretq_s8_u8(bits16_to_0x10(w[i].qh)));
        const int8x16_t b = vorrq_s8(hi_nib(v), vreinterpretq_s8_u8(bits16_to_0x10(w[i].qh + 2)));
        acc += h2f_neon(w[i].d) * x[i].d * (float)sum32(a, b, x[i].qs) + h2f_neon(w[i].m) * x[i].s;
    }
    return acc;
}

/* IQ4_NL and MXFP4: 4-bit indices into a table of int8 values, one scale a block */
#define DEFINE_LUT_DOT_NEON(NAME, BLK, TABLE, SCALE)                                                \
    float NAME(const void *vw, const void *vx, int nb) {                                           \
        const BLK *w = vw; const act32 *x = vx; float acc = 0.f;                                  \
        const int8x16_t lut = vld1q_s8(TABLE);                                                    \
        for (int i = 0; i < nb; i++) {                                                            \
            const uint8x16_t v = vld1q_u8(w[i].qs);                                               \
            const int8x16_t a = vqtbl1q_s8(lut, vandq_u8(v, vdupq_n_u8(0xF))), b = vqtbl1q_s8(lut, vshrq_n_u8(v, 4)); \
            acc += SCALE(w[i]) * x[i].d * (float)sum32(a, b, x[i].qs);                           \
        }                                                                                         \
        return acc;                                                                               \
    }
#define IQ4_SCALE(b) h2f_neon((b).d)
#define MXFP4_SCALE(b) e8m0_half((b).e)
DEFINE_LUT_DOT_NEON(dot_iq4_nl_neon, blk_iq4_nl, kvalues_iq4nl, IQ4_SCALE)
DEFINE_LUT_DOT_NEON(dot_mxfp4_neon, blk_mxfp4, kvalues_mxfp4, MXFP4_SCALE)

/* Q2_K: element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]; per 16, scale (low
 * nibble) and min (high nibble) */
float dot_q2_K_neon(const void *vw, const void *vx, int nb) {
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
float dot_q3_K_neon(const void *vw, const void *vx, int nb) {
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

float dot_q4_K_neon(const void *vw, const void *vx, int nb) {
    const blk_q4_K *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) acc += q45_block_dot_neon(w[i].d, w[i].dmin, w[i].scales, w[i].qs, NULL, &x[i]);
    return acc;
}

float dot_q5_K_neon(const void *vw, const void *vx, int nb) {
    const blk_q5_K *w = vw; const act256 *x = vx; float acc = 0.f;
    for (int i = 0; i < nb; i++) acc += q45_block_dot_neon(w[i].d, w[i].dmin, w[i].scales, w[i].qs, w[i].qh, &x[i]);
    return acc;
}

/* Q6_K: element 128h + 32s + l: a nibble of ql[64h + 32(s & 1) + l] (high one for
 * s >= 2) and bits 2s..2s+1 of qh[32h + l] as bits 4-5, minus 32; int8 scales per 16 */
float dot_q6_K_neon(const void *vw, const void *vx, int nb) {
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

float dot_iq4_xs_neon(const void *vw, const void *vx, int nb) {
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
