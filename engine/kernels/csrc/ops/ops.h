/* What the dense ops' sources (the .c files of ops/) share and nothing else reads: the
 * vector loops' tables by ISA (vec.c), the cache rows' types (kv_rows.c), the attention
 * tiles' matrix products (their bodies here, built once per ISA), a few row helpers. Not
 * part of the library's ABI. */
#ifndef GC_OPS_H
#define GC_OPS_H

#include "../gc.h"
#include "../quants.h"

#define MAX_HEAD_DIM 1024

enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_SWIGLU_OAI = 2 };

/* gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai): gate clamped above, up on both sides,
 * out = g sigmoid(alpha g) (u + 1) */
#define OAI_ALPHA 1.702f
#define OAI_LIMIT 7.0f

/* KV cache rows by type (GGML's type ids): float32, float16, bfloat16, or 32-value blocks
 * of Q8_0 or Q4_0 (llama-server's --cache-type-k/-v). A row is one head's d values. */
enum { KV_F32 = 0, KV_F16 = 1, KV_Q4_0 = 2, KV_Q4_1 = 3, KV_Q5_0 = 6, KV_Q5_1 = 7, KV_Q8_0 = 8, KV_IQ4_NL = 20, KV_BF16 = 30 };

/* kv_rows.c: a row's bytes (-1: not a cache type), one head's d floats into a row, a row as floats */
GC_HIDDEN int64_t kv_row_bytes(int type, int64_t d);
GC_HIDDEN void kv_store(int type, const float *x, uint8_t *dst, int64_t d);
GC_HIDDEN void kv_load_s(int type, const uint8_t *src, float *y, int d);

/* the vector loops, one table per ISA level (vec.c) */
typedef struct {
    float (*dot)(const float *, const float *, int);
    void (*axpy)(float, const float *, float *, int);         /* y += a x */
    void (*axpy_v)(const float *, const float *, float *, int); /* y += a x elementwise */
    void (*act_mul)(const float *, const float *, float *, int, int); /* out = act(g) u */
    float (*exp_sum)(float *, int, float); /* s[i] = exp(s[i] - m), 0 where s[i] is -inf; their sum */
    /* Gated DeltaNet's step over a head's state, dv a multiple of 64 (NULL: delta_step_s only) */
    void (*delta_step)(float *, const float *, const float *, const float *, float, float, float *, int, int);
} vec_t;

/* the attention's inner loops: q . k, p v, cache rows as floats, the tiles' products */
typedef struct {
    float (*dot)(const float *, const float *, int);
    void (*axpy)(float, const float *, float *, int);
    void (*load)(int, const uint8_t *, float *, int);
    void (*scores)(const float *, const float *, float *, int64_t, int64_t);
    void (*pv)(const float *, const float *, int64_t, float *, int64_t, int64_t, int64_t);
    /* out[q] = a . x[q] for k (1 to 4) rows, each summed in one chain (the same for any k) */
    void (*dot_rows)(const float *, const float *const *, int, int, float *);
} attn_vec_t;

GC_HIDDEN const vec_t *vec(void);
GC_HIDDEN const attn_vec_t *attn_vec(void);
GC_HIDDEN void act_mul_s(const float *g, const float *u, float *out, int n, int act);

/* rows / n_threads, at least `least` per chunk */
static inline int64_t chunk_of(int64_t n, int n_threads, int64_t least) {
    int64_t c = n / (n_threads > 0 ? n_threads : 1);
    return c < least ? least : c;
}

/* y = x / sqrt(mean(x²) + eps) * w, plus res when given (y may be x) */
static inline void norm_row(const vec_t *V, const float *x, const float *w, float *y, const float *res, int n,
                            float eps) {
    const float scale = 1.f / sqrtf(V->dot(x, x, n) / (float)n + eps);
    if (res)
        for (int i = 0; i < n; i++) y[i] = res[i] + (x[i] * scale) * w[i];
    else
        for (int i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

/* per-thread scratch of n floats (a decode step's attention runs hundreds of times) */
static inline float *scratch(void **buf, size_t *cap, size_t n) { return gc_grow(buf, cap, sizeof(float) * n); }

/* ---- the attention tiles' matrix products, in GCC's vector types: written once, built
 * for each ISA by the functions of vec.c and vec_impl.h that inline them */

#define AT_KB 64 /* cells per key block: four 16-float vectors */

typedef float v16f __attribute__((vector_size(64), aligned(4)));

/* S[r][0..AT_KB) = Q[r] . Kt[.][0..AT_KB) for R rows (a multiple of 4) of d */
static inline __attribute__((always_inline)) void at_scores_s(const float *Q, const float *Kt, float *S, int64_t R,
                                                              int64_t d) {
    for (int64_t r = 0; r < R; r += 4) {
        v16f a[4][4] = {{{0}}};
        const float *q = Q + r * d;
        for (int64_t i = 0; i < d; i++) {
            const v16f *k = (const v16f *)(Kt + i * AT_KB);
            const v16f k0 = k[0], k1 = k[1], k2 = k[2], k3 = k[3];
            for (int rr = 0; rr < 4; rr++) {
                const float x = q[rr * d + i];
                a[rr][0] += x * k0; a[rr][1] += x * k1; a[rr][2] += x * k2; a[rr][3] += x * k3;
            }
        }
        for (int rr = 0; rr < 4; rr++)
            for (int v = 0; v < 4; v++) ((v16f *)(S + (r + rr) * AT_KB))[v] = a[rr][v];
    }
}

/* O[r] += sum_j P[r][j] V[j] for R rows (a multiple of 4), nc cells, d a multiple of 16 */
static inline __attribute__((always_inline)) void at_pv_s(const float *P, const float *Vr, int64_t v_stride, float *O,
                                                          int64_t R, int64_t nc, int64_t d) {
    for (int64_t r = 0; r < R; r += 4) {
        int64_t c = 0;
        for (; c + 64 <= d; c += 64) {
            v16f a[4][4];
            for (int rr = 0; rr < 4; rr++)
                for (int v = 0; v < 4; v++) a[rr][v] = ((const v16f *)(O + (r + rr) * d + c))[v];
            for (int64_t j = 0; j < nc; j++) {
                const v16f *x = (const v16f *)(Vr + j * v_stride + c);
                const v16f x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
                for (int rr = 0; rr < 4; rr++) {
                    const float p = P[(r + rr) * AT_KB + j];
                    a[rr][0] += p * x0; a[rr][1] += p * x1; a[rr][2] += p * x2; a[rr][3] += p * x3;
                }
            }
            for (int rr = 0; rr < 4; rr++)
                for (int v = 0; v < 4; v++) ((v16f *)(O + (r + rr) * d + c))[v] = a[rr][v];
        }
        for (; c < d; c += 16) {
            v16f a[4];
            for (int rr = 0; rr < 4; rr++) a[rr] = *(const v16f *)(O + (r + rr) * d + c);
            for (int64_t j = 0; j < nc; j++) {
                const v16f x = *(const v16f *)(Vr + j * v_stride + c);
                for (int rr = 0; rr < 4; rr++) a[rr] += P[(r + rr) * AT_KB + j] * x;
            }
            for (int rr = 0; rr < 4; rr++) *(v16f *)(O + (r + rr) * d + c) = a[rr];
        }
    }
}

#endif
