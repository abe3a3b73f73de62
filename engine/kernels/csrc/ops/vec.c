/* The dense ops' vector loops by ISA: the portable C (written so that the compiler can
 * vectorize it, and the SIMD versions' tails), the SIMD versions built from one body
 * (vec_impl.h on simd.h's mappings) for each ISA of this architecture, and the tables
 * that pick them by the ISA level in use. */

#include "ops.h"
#include "../simd.h"

static float dot_s(const float *a, const float *b, int n) {
    float p[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) p[l] += a[i + l] * b[i + l];
    float s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void dot_rows_s(const float *a, const float *const *x, int k, int n, float *out) {
    for (int q = 0; q < k; q++) {
        float s = 0.f;
        for (int i = 0; i < n; i++) s += a[i] * x[q][i];
        out[q] = s;
    }
}

static void axpy_s(float a, const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static void axpy_v_s(const float *a, const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += a[i] * x[i];
}

static float silu_s(float g) { return g / (1.f + expf(-g)); }

static float gelu_tanh_s(float g) {
    return 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

void act_mul_s(const float *g, const float *u, float *out, int n, int act) {
    if (act == ACT_SILU)
        for (int i = 0; i < n; i++) out[i] = silu_s(g[i]) * u[i];
    else if (act == ACT_SWIGLU_OAI)
        for (int i = 0; i < n; i++) {
            const float x = fminf(g[i], OAI_LIMIT), y = fmaxf(fminf(u[i], OAI_LIMIT), -OAI_LIMIT);
            out[i] = x / (1.f + expf(-OAI_ALPHA * x)) * (y + 1.f);
        }
    else
        for (int i = 0; i < n; i++) out[i] = gelu_tanh_s(g[i]) * u[i];
}

static float exp_sum_s(float *s, int n, float m) {
    float sum = 0.f;
    for (int i = 0; i < n; i++) {
        s[i] = s[i] == -INFINITY ? 0.f : expf(s[i] - m);
        sum += s[i];
    }
    return sum;
}

static void at_scores_port(const float *Q, const float *Kt, float *S, int64_t R, int64_t d) {
    at_scores_s(Q, Kt, S, R, d);
}

static void at_pv_port(const float *P, const float *Vr, int64_t v_stride, float *O, int64_t R, int64_t nc, int64_t d) {
    at_pv_s(P, Vr, v_stride, O, R, nc, d);
}

static const vec_t VEC_S = {dot_s, axpy_s, axpy_v_s, act_mul_s, exp_sum_s, NULL};
static const attn_vec_t ATTN_S = {dot_s, axpy_s, kv_load_s, at_scores_port, at_pv_port, dot_rows_s};

#if defined(GC_X86)
#define SIMD avx512
#include "vec_impl.h"
#undef SIMD
#define SIMD avx2
#include "vec_impl.h"
#undef SIMD
/* The row ops (norms, activations, the decode softmax, MoE sums, the recurrent layers)
 * take AVX2's 8 lanes at the AVX-512 level too, the attention's inner loops 16: so the
 * row ops' sums run in the same order, and give the same bits, on both levels. */
static const vec_t VEC_AVX2 = {dot_avx2, axpy_avx2, axpy_v_avx2, act_mul_avx2, exp_sum_avx2, delta_step_avx2};
static const attn_vec_t ATTN_AVX2 = {dot_avx2, axpy_avx2, kv_load_avx2, at_scores_avx2, at_pv_avx2, dot_rows_avx2};
static const attn_vec_t ATTN_AVX512 = {dot_avx512, axpy_avx512, kv_load_avx512, at_scores_avx512, at_pv_avx512,
                                       dot_rows_avx512};
#elif defined(GC_NEON)
#define SIMD neon
#include "vec_impl.h"
#undef SIMD
static const vec_t VEC_NEON = {dot_neon, axpy_neon, axpy_v_neon, act_mul_neon, exp_sum_neon, delta_step_neon};
static const attn_vec_t ATTN_NEON = {dot_neon, axpy_neon, kv_load_neon, at_scores_neon, at_pv_neon, dot_rows_neon};
#endif

const vec_t *vec(void) {
#if defined(GC_X86)
    if (gc_isa() >= ISA_AVX2) return &VEC_AVX2;
#elif defined(GC_NEON)
    if (gc_isa() >= ISA_NEON) return &VEC_NEON;
#endif
    return &VEC_S;
}

const attn_vec_t *attn_vec(void) {
#if defined(GC_X86)
    if (gc_isa() >= ISA_AVX512) return &ATTN_AVX512;
    if (gc_isa() >= ISA_AVX2) return &ATTN_AVX2;
#elif defined(GC_NEON)
    if (gc_isa() >= ISA_NEON) return &ATTN_NEON;
#endif
    return &ATTN_S;
}
