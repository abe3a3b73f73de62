/* The KV cache's rows by type (float32, float16, bfloat16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * IQ4_NL): their sizes, one
 * head's floats stored into a row (ggml's rounding), a row read back as floats (the
 * portable version; vec_impl.h has the SIMD ones), and gc_kv_rows, which reads many rows
 * for the attention of long prompt chunks in torch. */
#include "ops.h"
#include "../iq.h" /* deq_f16, deq_bf16 */

int64_t kv_row_bytes(int type, int64_t d) {
    switch (type) {
    case KV_F32: return 4 * d;
    case KV_F16: case KV_BF16: return 2 * d;
    case KV_Q8_0: return d / 32 * (int64_t)sizeof(blk_q8_0);
    case KV_Q4_0: return d / 32 * (int64_t)sizeof(blk_q4_0);
    case KV_Q4_1: return d / 32 * (int64_t)sizeof(blk_q4_1);
    case KV_Q5_0: return d / 32 * (int64_t)sizeof(blk_q5_0);
    case KV_Q5_1: return d / 32 * (int64_t)sizeof(blk_q5_1);
    case KV_IQ4_NL: return d / 32 * (int64_t)sizeof(blk_iq4_nl);
    default: return -1;
    }
}

/* float32 -> float16 bits, rounded to nearest even (numpy's astype, bit for bit) */
static inline uint16_t f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up: inf */
    if (ax < 0x38800000u) {                                    /* below 2^-14: a half subnormal (or 0) */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.f));
    }
    return (uint16_t)(sign | ((ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13));
}

static inline uint16_t f2bf(float f) { /* round to nearest even; NaNs kept quiet */
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* the value of largest magnitude of 32 (the first on ties), with its sign */
static inline float signed_absmax32(const float *xb) {
    float amax = 0.f, mx = 0.f;
    for (int j = 0; j < 32; j++)
        if (fabsf(xb[j]) > amax) { amax = fabsf(xb[j]); mx = xb[j]; }
    return mx;
}

static inline int trunc_to(float v, int hi) { const int q = (int)v; return q < 0 ? 0 : q > hi ? hi : q; }

/* 32 levels q (0..hi) as nibbles (weights j and j + 16 in byte j) and, for five bits, their
 * fifth bits in qh (bit j: weight j) */
static void pack32(const int *q, uint8_t *qs, uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
        h |= (uint32_t)((q[j] >> 4) & 1) << j | (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    if (qh) memcpy(qh, &h, 4);
}

/* IQ4_NL as ggml's quantize_row_iq4_nl_ref: the scale from the value of largest magnitude
 * over the table's -127, each value to its nearest entry, then the scale refit by least
 * squares weighted by x^2 */
static inline int iq4_nearest(float v) {
    const int8_t *t = kvalues_iq4nl;
    if (v <= t[0]) return 0;
    if (v >= t[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < t[mid]) hi = mid; else lo = mid;
    }
    return v - t[hi - 1] < t[hi] - v ? hi - 1 : hi;
}

static void store_iq4_nl(const float *xb, blk_iq4_nl *blk) {
    int L[32] = {0};
    const float mx = signed_absmax32(xb);
    float dd = 0.f;
    if (fabsf(mx) >= 1e-15f) {
        const float id = 1.f / (mx / kvalues_iq4nl[0]);
        float sumqx = 0.f, sumq2 = 0.f;
        for (int j = 0; j < 32; j++) {
            L[j] = iq4_nearest(id * xb[j]);
            const float q = kvalues_iq4nl[L[j]], w = xb[j] * xb[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        dd = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    }
    blk->d = f2h(dd);
    pack32(L, blk->qs, NULL);
}

/* one head's d floats into a cache row of `type` (ggml's reference quantizers, as
 * gguf_io's: Q8_0 d = amax / 127, q = round(x / d); Q4_0 d = -max / 8 for the value of
 * largest magnitude, q = trunc(x / d + 8.5) up to 15; Q5_0 the same with 16 and 31; Q4_1 / Q5_1
 * d = (max - min) / 15 (31), q = trunc((x - min) / d + 0.5); IQ4_NL store_iq4_nl) */
void kv_store(int type, const float *x, uint8_t *dst, int64_t d) {
    int q[32];
    switch (type) {
    case KV_Q4_1: case KV_Q5_1:
        for (int64_t b = 0; b < d / 32; b++) {
            const float *xb = x + 32 * b;
            const int hi = type == KV_Q4_1 ? 15 : 31;
            float lo = xb[0], up = xb[0];
            for (int j = 1; j < 32; j++) { lo = fminf(lo, xb[j]); up = fmaxf(up, xb[j]); }
            const float dd = (up - lo) / (float)hi, id = dd != 0.f ? 1.f / dd : 0.f;
            for (int j = 0; j < 32; j++) q[j] = trunc_to((xb[j] - lo) * id + 0.5f, hi);
            if (type == KV_Q4_1) {
                blk_q4_1 *blk = (blk_q4_1 *)dst + b;
                blk->d = f2h(dd); blk->m = f2h(lo);
                pack32(q, blk->qs, NULL);
            } else {
                blk_q5_1 *blk = (blk_q5_1 *)dst + b;
                blk->d = f2h(dd); blk->m = f2h(lo);
                pack32(q, blk->qs, blk->qh);
            }
        }
        break;
    case KV_Q4_0: case KV_Q5_0: /* q4_0: half 8; q5_0: 16, the fifth bits in qh */
        for (int64_t b = 0; b < d / 32; b++) {
            const float *xb = x + 32 * b, half = type == KV_Q4_0 ? 8.f : 16.f;
            const float dd = signed_absmax32(xb) / -half, id = dd != 0.f ? 1.f / dd : 0.f;
            for (int j = 0; j < 32; j++) q[j] = trunc_to(xb[j] * id + (half + 0.5f), (int)(2 * half) - 1);
            if (type == KV_Q4_0) {
                blk_q4_0 *blk = (blk_q4_0 *)dst + b;
                blk->d = f2h(dd);
                pack32(q, blk->qs, NULL);
            } else {
                blk_q5_0 *blk = (blk_q5_0 *)dst + b;
                blk->d = f2h(dd);
                pack32(q, blk->qs, blk->qh);
            }
        }
        break;
    case KV_IQ4_NL:
        for (int64_t b = 0; b < d / 32; b++) store_iq4_nl(x + 32 * b, (blk_iq4_nl *)dst + b);
        break;
    case KV_F32: memcpy(dst, x, sizeof(float) * (size_t)d); break;
    case KV_F16: for (int64_t i = 0; i < d; i++) ((uint16_t *)dst)[i] = f2h(x[i]); break;
    case KV_BF16: for (int64_t i = 0; i < d; i++) ((uint16_t *)dst)[i] = f2bf(x[i]); break;
    case KV_Q8_0:
        for (int64_t b = 0; b < d / 32; b++) {
            const float *xb = x + 32 * b;
            blk_q8_0 blk;
            float amax = 0.f;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
            const float dd = amax / 127.f, id = dd != 0.f ? 1.f / dd : 0.f;
            blk.d = f2h(dd);
            for (int j = 0; j < 32; j++) blk.qs[j] = (int8_t)roundf(xb[j] * id);
            memcpy(dst + b * sizeof(blk_q8_0), &blk, sizeof blk);
        }
        break;
    }
}

/* a cache row of `type` as d floats */
void kv_load_s(int type, const uint8_t *src, float *y, int d) {
    switch (type) { /* the kernels' dequantizers (gguf_io's arithmetic, bit for bit) */
    case KV_F32: memcpy(y, src, sizeof(float) * (size_t)d); break;
    case KV_F16: deq_f16(src, y, d); break;
    case KV_BF16: deq_bf16(src, y, d); break;
    case KV_Q8_0: deq_q8_0(src, y, d / 32); break;
    case KV_Q4_0: deq_q4_0(src, y, d / 32); break;
    case KV_Q4_1: deq_q4_1(src, y, d / 32); break;
    case KV_Q5_0: deq_q5_0(src, y, d / 32); break;
    case KV_Q5_1: deq_q5_1(src, y, d / 32); break;
    case KV_IQ4_NL: deq_iq4_nl(src, y, d / 32); break;
    }
}

typedef struct {
    int type;
    const uint8_t *src;
    int64_t group_stride, n, d;
    float *dst;
} kv_rows_ctx;

static void kv_rows_task(void *vctx, int64_t start, int64_t end) {
    const kv_rows_ctx *c = vctx;
    const attn_vec_t *A = attn_vec();
    const int64_t rb = kv_row_bytes(c->type, c->d);
    for (int64_t i = start; i < end; i++) {
        const int64_t g = i / c->n, r = i % c->n;
        A->load(c->type, c->src + g * c->group_stride + r * rb, c->dst + i * c->d, (int)c->d);
    }
}

/* Cache rows of `type` as floats: `groups` runs of n rows each (a slot's kv heads, their
 * cells; runs `group_stride` bytes apart, rows back to back) into dst (groups, n, d), for
 * the attention of long prompt chunks over a quantized cache. */
int gc_kv_rows(int type, const uint8_t *src, int64_t groups, int64_t group_stride, int64_t n, int64_t d, float *dst,
               int n_threads) {
    if (kv_row_bytes(type, d) < 0 || (type != KV_F32 && type != KV_F16 && type != KV_BF16 && d % 32))
        return GC_UNSUPPORTED;
    kv_rows_ctx c = {type, src, group_stride, n, d, dst};
    const int64_t rows = groups * n;
    gc_parallel_for(rows >= 256 ? n_threads : 1, rows, chunk_of(rows, n_threads, 64), kv_rows_task, &c);
    return GC_OK;
}
