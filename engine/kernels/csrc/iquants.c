/* The portable C of the types iq.h expands: each block's 32-weight groups against the
 * activations in integers, the float work once a block; the dequantizers the same
 * expansion times the factors (exact: every weight is a small integer times a half). And
 * F16 / BF16 rows against float32 activations. */

#include "iq.h"

/* one group against 32 activation bytes: sum over its halves of scale x (bytes . x) */
static inline int group_dot(const iq_group *e, const int8_t *x) {
    int h[2] = {0, 0};
    for (int j = 0; j < 32; j++) h[j / 16] += (int8_t)(e->v[j / 8] >> 8 * (j % 8)) * x[j];
    return e->s[0] * h[0] + e->s[1] * h[1];
}

static inline void group_deq(const iq_group *e, float f, float *y) {
    for (int j = 0; j < 32; j++) y[j] = f * (float)(e->s[j / 16] * (int8_t)(e->v[j / 8] >> 8 * (j % 8)));
}

#define IQ_SCALAR(t, B)                                                                              \
    float dot_##t##_s(const void *vw, const void *vx, int nb) {                                      \
        const B *w = vw; const act256 *x = vx; float acc = 0.f;                                      \
        for (int i = 0; i < nb; i++) {                                                               \
            int isum = 0;                                                                            \
            for (int g = 0; g < 8; g++) { iq_group e; iqx_##t(&w[i], g, &e); isum += group_dot(&e, x[i].qs + 32 * g); } \
            acc += (iqd_##t(&w[i]) * x[i].d) * (float)isum;                                          \
        }                                                                                            \
        return acc;                                                                                  \
    }                                                                                                \
    void deq_##t(const void *v, float *y, int nb) {                                                  \
        const B *w = v;                                                                              \
        for (int i = 0; i < nb; i++)                                                                 \
            for (int g = 0; g < 8; g++) { iq_group e; iqx_##t(&w[i], g, &e); group_deq(&e, iqd_##t(&w[i]), y + 256 * i + 32 * g); } \
    }
GC_IQ_TYPES(IQ_SCALAR)

/* Q1_0 (128 weights) and Q2_0 (64): G activation blocks of 32 a weight block, the float
 * work once an activation block */
#define B32_SCALAR(t, B, G)                                                                          \
    float dot_##t##_s(const void *vw, const void *vx, int nb) {                                      \
        const B *w = vw; const act32 *x = vx; float acc = 0.f;                                       \
        for (int i = 0; i < nb; i++)                                                                 \
            for (int g = 0; g < G; g++) {                                                            \
                iq_group e; iqx_##t(&w[i], g, &e);                                                   \
                acc += (h2f(w[i].d) * x[G * i + g].d) * (float)group_dot(&e, x[G * i + g].qs);      \
            }                                                                                        \
        return acc;                                                                                  \
    }                                                                                                \
    void deq_##t(const void *v, float *y, int nb) {                                                  \
        const B *w = v;                                                                              \
        for (int i = 0; i < nb; i++)                                                                 \
            for (int g = 0; g < G; g++) { iq_group e; iqx_##t(&w[i], g, &e); group_deq(&e, h2f(w[i].d), y + 32 * (G * i + g)); } \
    }
GC_B32_TYPES(B32_SCALAR)

/* F16 / BF16: n weights against n float32 activations, in eight partial sums (as the SIMD
 * code's lanes would hold them, though not in their order) */
#define FLOAT_SCALAR(t, CVT)                                                                         \
    float dot_##t##_s(const void *vw, const void *vx, int n) {                                       \
        const uint16_t *w = vw; const float *x = vx; float acc[8] = {0};                             \
        for (int j = 0; j < n; j++) acc[j % 8] += CVT(w[j]) * x[j];                                  \
        return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));  \
    }                                                                                                \
    void deq_##t(const void *v, float *y, int n) {                                                   \
        const uint16_t *w = v;                                                                       \
        for (int j = 0; j < n; j++) y[j] = CVT(w[j]);                                                \
    }
FLOAT_SCALAR(f16, h2f)
FLOAT_SCALAR(bf16, bf2f)
