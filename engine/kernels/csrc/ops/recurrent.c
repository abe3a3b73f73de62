/* The recurrent layers' ops: the depthwise causal conv (Qwen3.5, LFM2) and Qwen3.5's
 * gated delta rule (Gated DeltaNet), per sequence over each slot's state. */
#include "ops.h"

/* ---- Qwen3.5, LFM2: causal conv */

typedef struct {
    const float *x;
    int64_t x_row, C;
    float *out, *state;
    const float *w;
    int K, silu;
    const int64_t *slot, *start, *len;
} conv_ctx;

#define CONV_BLOCK 256
#define MAX_KERNEL 8

static void conv_task(void *vctx, int64_t a, int64_t b) {
    const conv_ctx *c = vctx;
    const vec_t *V = vec();
    const int64_t blocks = (c->C + CONV_BLOCK - 1) / CONV_BLOCK, C = c->C;
    const int hist = c->K - 1;
    float acc[CONV_BLOCK], ones[CONV_BLOCK];
    for (int j = 0; j < CONV_BLOCK; j++) ones[j] = 1.f;
    for (int64_t it = a; it < b; it++) {
        const int64_t s = it / blocks, c0 = (it % blocks) * CONV_BLOCK;
        const int n = (int)((c0 + CONV_BLOCK < C ? c0 + CONV_BLOCK : C) - c0);
        float *st = c->state + c->slot[s] * hist * C + c0; /* row j: the input hist - j steps back */
        for (int64_t t = c->start[s]; t < c->start[s] + c->len[s]; t++) {
            const float *xt = c->x + t * c->x_row + c0;
            /* out = sum_j w[j] * input (t - hist + j), the inputs before t from the state rows */
            for (int i = 0; i < n; i++) acc[i] = c->w[hist * C + c0 + i] * xt[i];
            for (int j = 0; j < hist; j++) V->axpy_v(c->w + j * C + c0, st + j * C, acc, n);
            for (int j = 0; j + 1 < hist; j++) memcpy(st + j * C, st + (j + 1) * C, sizeof(float) * (size_t)n);
            memcpy(st + (hist - 1) * C, xt, sizeof(float) * (size_t)n);
            if (c->silu) V->act_mul(acc, ones, c->out + t * C + c0, n, ACT_SILU);
            else memcpy(c->out + t * C + c0, acc, sizeof(float) * (size_t)n);
        }
    }
}

/* Depthwise causal conv (kernel K <= 8) of each sequence's channels, then SiLU where
 * `silu` (Qwen3.5; LFM2's has none): x (T, C) rows strided, weight (K, C), out (T, C);
 * state (slots, K - 1, C) holds each slot's last K - 1 inputs, oldest first. */
int gc_causal_conv(const float *x, int64_t x_row, float *out, int64_t C, const float *w, int K, int silu,
                   float *state, int n_seq, const int64_t *slot, const int64_t *start, const int64_t *len,
                   int n_threads) {
    if (K < 2 || K > MAX_KERNEL) return GC_UNSUPPORTED;
    conv_ctx c = {x, x_row, C, out, state, w, K, silu, slot, start, len};
    const int64_t items = n_seq * ((C + CONV_BLOCK - 1) / CONV_BLOCK);
    gc_parallel_for(n_threads, items, 1, conv_task, &c);
    return GC_OK;
}

/* ---- Qwen3.5: gated delta rule */

typedef struct {
    const float *q, *k, *v, *g, *beta;
    int64_t q_row, k_row, v_row;
    float *out, *state;
    int n_k, n_v, dk, dv;
    const int64_t *slot, *start, *len;
} delta_ctx;

static void l2_unit(const vec_t *V, const float *x, float *y, int n, float mul) {
    const float r = mul / sqrtf(V->dot(x, x, n) + 1e-6f);
    for (int i = 0; i < n; i++) y[i] = x[i] * r;
}

/* one token of one head: S (dk x dv) = decay S + k delta^T with delta = beta (v - decay S^T k),
 * o = S^T q; the portable version (vec_t's delta_step: the SIMD ones) */
static void delta_step_s(const vec_t *V, float *S, const float *qn, const float *kn, const float *v, float decay,
                         float beta, float *o, int dk, int dv) {
    float kv[MAX_HEAD_DIM], delta[MAX_HEAD_DIM];
    memset(kv, 0, sizeof(float) * (size_t)dv);
    for (int i = 0; i < dk; i++) V->axpy(kn[i], S + (int64_t)i * dv, kv, dv);
    for (int j = 0; j < dv; j++) delta[j] = (v[j] - decay * kv[j]) * beta;
    memset(o, 0, sizeof(float) * (size_t)dv);
    for (int i = 0; i < dk; i++) { /* S_i = decay S_i + k_i delta; o += q_i S_i */
        float *Si = S + (int64_t)i * dv;
        for (int j = 0; j < dv; j++) Si[j] *= decay;
        V->axpy(kn[i], delta, Si, dv);
        V->axpy(qn[i], Si, o, dv);
    }
}

static void delta_task(void *vctx, int64_t a, int64_t b) {
    const delta_ctx *c = vctx;
    const vec_t *V = vec();
    float qn[MAX_HEAD_DIM], kn[MAX_HEAD_DIM];
    const float qscale = 1.f / sqrtf((float)c->dk);
    const int wide = V->delta_step && c->dv % 64 == 0;
    for (int64_t it = a; it < b; it++) {
        const int64_t s = it / c->n_v;
        const int h = (int)(it % c->n_v), hk = h % c->n_k;
        float *S = c->state + (c->slot[s] * c->n_v + h) * (int64_t)c->dk * c->dv;
        for (int64_t t = c->start[s]; t < c->start[s] + c->len[s]; t++) {
            l2_unit(V, c->q + t * c->q_row + (int64_t)hk * c->dk, qn, c->dk, qscale);
            l2_unit(V, c->k + t * c->k_row + (int64_t)hk * c->dk, kn, c->dk, 1.f);
            const float decay = expf(c->g[t * c->n_v + h]), beta = c->beta[t * c->n_v + h];
            const float *v = c->v + t * c->v_row + (int64_t)h * c->dv;
            float *o = c->out + (t * c->n_v + h) * (int64_t)c->dv;
            if (wide) {
                V->delta_step(S, qn, kn, v, decay, beta, o, c->dk, c->dv);
                continue;
            }
            delta_step_s(V, S, qn, kn, v, decay, beta, o, c->dk, c->dv);
        }
    }
}

/* Gated DeltaNet, token by token: q, k (T, n_k, dk) and v (T, n_v, dv) rows strided,
 * g (log-decay) and beta (T, n_v); value head h reads key head h % n_k; q and k are
 * L2-normalized (q also scaled by dk^-0.5); state (slots, n_v, dk, dv) is updated;
 * out (T, n_v, dv). */
int gc_gated_delta(const float *q, int64_t q_row, const float *k, int64_t k_row, const float *v, int64_t v_row,
                   const float *g, const float *beta, float *out, int n_k, int n_v, int dk, int dv, float *state,
                   int n_seq, const int64_t *slot, const int64_t *start, const int64_t *len, int n_threads) {
    if (dk > MAX_HEAD_DIM || dv > MAX_HEAD_DIM || n_v % n_k) return GC_UNSUPPORTED;
    delta_ctx c = {q, k, v, g, beta, q_row, k_row, v_row, out, state, n_k, n_v, dk, dv, slot, start, len};
    const int64_t items = (int64_t)n_seq * n_v;
    gc_parallel_for(n_threads, items, 1, delta_task, &c);
    return GC_OK;
}
