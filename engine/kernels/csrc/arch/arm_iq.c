/* The NEON dots of the types iq.h expands, and of F16 / BF16: a group's four words as two
 * 16-byte vectors against the activations (vmull + vpadal, as arm.c's dots), the float
 * work as the scalar code does it. */

#include "../iq.h"

#ifdef GC_NEON

static inline int32x4_t dot16_iq(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_s8(vget_high_s8(a), vget_high_s8(b)));
}

/* one group against 32 activation bytes: the halves' scales times their sums */
static inline int group_dot_neon(const iq_group *e, const int8_t *x) {
    const int8x16_t a = vcombine_s8(vcreate_s8(e->v[0]), vcreate_s8(e->v[1]));
    const int8x16_t b = vcombine_s8(vcreate_s8(e->v[2]), vcreate_s8(e->v[3]));
    return e->s[0] * vaddvq_s32(dot16_iq(vdupq_n_s32(0), a, vld1q_s8(x))) +
           e->s[1] * vaddvq_s32(dot16_iq(vdupq_n_s32(0), b, vld1q_s8(x + 16)));
}

#define IQ_NEON_DOT(t, B)                                                                            \
    float dot_##t##_neon(const void *vw, const void *vx, int nb) {                                   \
        const B *w = vw; const act256 *x = vx; float acc = 0.f;                                      \
        for (int i = 0; i < nb; i++) {                                                               \
            int isum = 0;                                                                            \
            for (int g = 0; g < 8; g++) { iq_group e; iqx_##t(&w[i], g, &e); isum += group_dot_neon(&e, x[i].qs + 32 * g); } \
            acc += (iqd_##t(&w[i]) * x[i].d) * (float)isum;                                          \
        }                                                                                            \
        return acc;                                                                                  \
    }
GC_IQ_TYPES(IQ_NEON_DOT)

#define B32_NEON_DOT(t, B, G)                                                                        \
    float dot_##t##_neon(const void *vw, const void *vx, int nb) {                                   \
        const B *w = vw; const act32 *x = vx; float acc = 0.f;                                       \
        for (int i = 0; i < nb; i++)                                                                 \
            for (int g = 0; g < G; g++) {                                                            \
                iq_group e; iqx_##t(&w[i], g, &e);                                                   \
                acc += (h2f(w[i].d) * x[G * i + g].d) * (float)group_dot_neon(&e, x[G * i + g].qs); \
            }                                                                                        \
        return acc;                                                                                  \
    }
GC_B32_TYPES(B32_NEON_DOT)

static inline float32x4_t f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
static inline float32x4_t bf16x4(const uint16_t *p) { return vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(vld1_u16(p)), 16)); }

/* 16 weights a step in four partial sums, the last n % 16 one at a time */
#define F_NEON_DOT(t, LOAD4, CVT1)                                                                   \
    float dot_##t##_neon(const void *vw, const void *vx, int n) {                                    \
        const uint16_t *w = vw; const float *x = vx;                                                 \
        float32x4_t acc[4] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)}; \
        int j = 0;                                                                                   \
        for (; j + 16 <= n; j += 16)                                                                 \
            for (int k = 0; k < 4; k++) acc[k] = vfmaq_f32(acc[k], LOAD4(w + j + 4 * k), vld1q_f32(x + j + 4 * k)); \
        float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));       \
        for (; j < n; j++) s += CVT1(w[j]) * x[j];                                                   \
        return s;                                                                                    \
    }
F_NEON_DOT(f16, f16x4, h2f)
F_NEON_DOT(bf16, bf16x4, bf2f)

#endif /* GC_NEON */
