/* Dense ops of the forward pass on float32 rows: RMSNorm (optionally added to a
 * residual), gated activations, attention over the engine's KV cache (q/k norm, rotary,
 * cache write and, for a few queries per sequence, the attention itself), and Qwen3.5's
 * causal conv and gated delta rule. Each op's torch twin is in engine/kernels/ops.py and
 * the tests hold them equal. The vector loops have an AVX2 version on x86-64, picked at
 * run time, and a portable one written so that the compiler can vectorize it. */

#include "gc.h"
#include "quants.h"

/* ------------------------------------------------------------ primitives */

#define MAX_HEAD_DIM 512

enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_SWIGLU_OAI = 2 };

/* gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai): gate clamped above, up on both sides,
 * out = g sigmoid(alpha g) (u + 1) */
#define OAI_ALPHA 1.702f
#define OAI_LIMIT 7.0f

static float dot_s(const float *a, const float *b, int n) {
    float p[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) p[l] += a[i + l] * b[i + l];
    float s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_s(float a, const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* y += a * x elementwise */
static void axpy_v_s(const float *a, const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += a[i] * x[i];
}

static float silu_s(float g) { return g / (1.f + expf(-g)); }

static float gelu_tanh_s(float g) {
    return 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

static void act_mul_s(const float *g, const float *u, float *out, int n, int act) {
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

/* scores[i] = exp(scores[i] - m), 0 where the score is -inf; returns their sum */
static float exp_sum_s(float *s, int n, float m) {
    float sum = 0.f;
    for (int i = 0; i < n; i++) {
        s[i] = s[i] == -INFINITY ? 0.f : expf(s[i] - m);
        sum += s[i];
    }
    return sum;
}

#ifdef GC_X86
#define AVX2F __attribute__((target("avx2,fma")))

AVX2F static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2F static float dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

AVX2F static void axpy_avx2(float a, const float *x, float *y, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* e^x to ~1 ulp: x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-7 polynomial (Cephes'
 * expf coefficients), 2^n through the exponent bits; x is clamped to [-87.3, 88.37] */
AVX2F static void axpy_v_avx2(const float *a, const float *x, float *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a[i] * x[i];
}

AVX2F static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3762626647949f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

AVX2F static void act_mul_avx2(const float *g, const float *u, float *out, int n, int act) {
    const __m256 one = _mm256_set1_ps(1.f), half = _mm256_set1_ps(0.5f), two = _mm256_set1_ps(2.f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        __m256 a;
        if (act == ACT_SILU) {
            a = _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        } else if (act == ACT_SWIGLU_OAI) {
            const __m256 lim = _mm256_set1_ps(OAI_LIMIT), xc = _mm256_min_ps(x, lim);
            const __m256 y = _mm256_max_ps(_mm256_min_ps(_mm256_loadu_ps(u + i), lim), _mm256_sub_ps(_mm256_setzero_ps(), lim));
            a = _mm256_div_ps(xc, _mm256_add_ps(one, exp256(_mm256_mul_ps(_mm256_set1_ps(-OAI_ALPHA), xc))));
            _mm256_storeu_ps(out + i, _mm256_mul_ps(a, _mm256_add_ps(y, one)));
            continue;
        } else { /* 0.5 x (1 + tanh(z)), tanh(z) = 1 - 2 / (e^2z + 1) */
            const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
            const __m256 z = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                           _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
            const __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(exp256(_mm256_mul_ps(two, z)), one)));
            a = _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, t));
        }
        _mm256_storeu_ps(out + i, _mm256_mul_ps(a, _mm256_loadu_ps(u + i)));
    }
    act_mul_s(g + i, u + i, out + i, n - i, act);
}

/* the tail too as a vector (padded with -inf: zeros), so that a score's exponential and
 * the lane it is summed in depend on its index only, not on how many follow it (a draft's
 * block of cells reaches further than the same token's block decoded alone) */
AVX2F static float exp_sum_avx2(float *s, int n, float m) {
    const __m256 vm = _mm256_set1_ps(m), ninf = _mm256_set1_ps(-INFINITY);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i < n; i += 8) {
        float pad[8];
        const int k = n - i < 8 ? n - i : 8;
        float *p = s + i;
        if (k < 8) {
            for (int j = 0; j < 8; j++) pad[j] = j < k ? p[j] : -INFINITY;
            p = pad;
        }
        const __m256 x = _mm256_loadu_ps(p);
        const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(x, ninf, _CMP_EQ_OQ), exp256(_mm256_sub_ps(x, vm)));
        _mm256_storeu_ps(p, e);
        if (k < 8) memcpy(s + i, pad, sizeof(float) * (size_t)k);
        acc = _mm256_add_ps(acc, e);
    }
    return hsum256(acc);
}
#endif

typedef struct {
    float (*dot)(const float *, const float *, int);
    void (*axpy)(float, const float *, float *, int);
    void (*axpy_v)(const float *, const float *, float *, int);
    void (*act_mul)(const float *, const float *, float *, int, int);
    float (*exp_sum)(float *, int, float);
} vec_t;

static const vec_t VEC_S = {dot_s, axpy_s, axpy_v_s, act_mul_s, exp_sum_s};
#ifdef GC_X86
static const vec_t VEC_AVX2 = {dot_avx2, axpy_avx2, axpy_v_avx2, act_mul_avx2, exp_sum_avx2};
#endif

static const vec_t *vec(void) {
#ifdef GC_X86
    if (gc_isa() >= ISA_AVX2) return &VEC_AVX2;
#endif
    return &VEC_S;
}

/* rows / n_threads, at least `least` per chunk */
static int64_t chunk_of(int64_t n, int n_threads, int64_t least) {
    int64_t c = n / (n_threads > 0 ? n_threads : 1);
    return c < least ? least : c;
}

/* -------------------------------------------------------------- RMSNorm */

static void norm_row(const vec_t *V, const float *x, const float *w, float *y, const float *res, int n, float eps) {
    const float scale = 1.f / sqrtf(V->dot(x, x, n) / (float)n + eps);
    if (res)
        for (int i = 0; i < n; i++) y[i] = res[i] + (x[i] * scale) * w[i];
    else
        for (int i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

/* y = x / sqrt(mean(x²) + eps) * w per row (rows of `cols`, x rows `x_stride` apart),
 * plus `residual` (rows contiguous) when given. y may be x. */
void gc_rms_norm(const float *x, int64_t x_stride, const float *w, float *y, int64_t rows, int64_t cols, float eps,
                 const float *residual) {
    const vec_t *V = vec();
    for (int64_t r = 0; r < rows; r++)
        norm_row(V, x + r * x_stride, w, y + r * cols, residual ? residual + r * cols : NULL, (int)cols, eps);
}

/* ----------------------------------------------------------- activations */

typedef struct {
    const float *g, *u;
    int64_t g_stride, u_stride, cols;
    float *out;
    int act;
} act_ctx;

static void act_task(void *vctx, int64_t start, int64_t end) {
    const act_ctx *c = vctx;
    const vec_t *V = vec();
    for (int64_t r = start; r < end; r++)
        V->act_mul(c->g + r * c->g_stride, c->u + r * c->u_stride, c->out + r * c->cols, (int)c->cols, c->act);
}

/* out[r] = act(g[r]) * u[r] (act 0: SiLU, 1: tanh GELU, 2: gpt-oss's clamped SwiGLU); rows of g and u strided */
void gc_act_mul(const float *g, int64_t g_stride, const float *u, int64_t u_stride, float *out, int64_t rows,
                int64_t cols, int act, int n_threads) {
    act_ctx c = {g, u, g_stride, u_stride, cols, out, act};
    gc_parallel_for(rows * cols >= 65536 ? n_threads : 1, rows, chunk_of(rows, n_threads, 1), act_task, &c);
}

/* ------------------------------------------------------- float32 linear */

typedef struct {
    const float *w, *x;
    int64_t cols, n, rows;
    float *y;
} lin_ctx;

static void lin_task(void *vctx, int64_t start, int64_t end) {
    const lin_ctx *c = vctx;
    const vec_t *V = vec();
    for (int64_t r = start; r < end; r++) {
        const float *wr = c->w + r * c->cols;
        if (r + 1 < end) __builtin_prefetch(wr + c->cols, 0, 0);
        for (int64_t t = 0; t < c->n; t++) c->y[t * c->rows + r] = V->dot(wr, c->x + t * c->cols, (int)c->cols);
    }
}

/* y (n, rows) = x (n, cols) . W^T for a float32 matrix W (rows, cols), both contiguous:
 * the routers and small gates that files keep unquantized, for a few rows at a time
 * (each weight row is read once for all of them) */
void gc_linear_f32(const float *w, int64_t rows, int64_t cols, const float *x, int64_t n, float *y, int n_threads) {
    lin_ctx c = {w, x, cols, n, rows, y};
    gc_parallel_for(rows * cols >= 65536 ? n_threads : 1, rows, chunk_of(rows, n_threads, 4), lin_task, &c);
}

/* -------------------------------------------------------- routed experts */

/* Per token: the k most probable of n_exp experts under softmax(logits) (ties to the
 * lower index), their probabilities in ids / weights order, renormalized to sum 1 when
 * norm. k <= n_exp. */
void gc_moe_route(const float *logits, int64_t n_tok, int64_t n_exp, int k, int norm, int64_t *ids, float *weights) {
    for (int64_t t = 0; t < n_tok; t++) {
        const float *l = logits + t * n_exp;
        int64_t *id = ids + t * k;
        float *w = weights + t * k;
        float m = -INFINITY, sum = 0.f;
        for (int64_t e = 0; e < n_exp; e++) m = l[e] > m ? l[e] : m;
        for (int64_t e = 0; e < n_exp; e++) sum += expf(l[e] - m);
        int n = 0; /* insertion into the k best so far, best first */
        for (int64_t e = 0; e < n_exp; e++) {
            const float v = l[e];
            if (n == k && !(v > l[id[k - 1]])) continue;
            int j = n < k ? n++ : k - 1;
            while (j > 0 && v > l[id[j - 1]]) { id[j] = id[j - 1]; j--; }
            id[j] = e;
        }
        float picked = 0.f;
        for (int j = 0; j < k; j++) picked += (w[j] = expf(l[id[j]] - m) / sum);
        if (norm)
            for (int j = 0; j < k; j++) w[j] /= picked;
    }
}

/* y[t] = sum_j weights[t, j] * x[t, j, :] for x (n_tok, k, cols) */
void gc_moe_combine(const float *x, const float *weights, int64_t n_tok, int k, int64_t cols, float *y) {
    const vec_t *V = vec();
    for (int64_t t = 0; t < n_tok; t++) {
        float *yt = y + t * cols;
        memset(yt, 0, sizeof(float) * (size_t)cols);
        for (int j = 0; j < k; j++) V->axpy(weights[t * k + j], x + (t * k + j) * cols, yt, (int)cols);
    }
}

/* ----------------------------------------------------------- sampling */

/* logits[i] = -inf where bit i of `allowed` is clear: a constrained-decoding token mask
 * in 32-bit little-endian words (llguidance's bitmask layout); tokens past the mask's
 * `n_mask` bits are not allowed either */
void gc_mask_logits(float *logits, int64_t n, const uint32_t *allowed, int64_t n_mask) {
    for (int64_t w = 0; w * 32 < n; w++) {
        const int64_t lo = w * 32, hi = lo + 32 < n ? lo + 32 : n;
        const uint32_t bits = lo < n_mask ? allowed[w] : 0u;
        if (bits == 0xFFFFFFFFu && hi <= n_mask) continue;
        for (int64_t i = lo; i < hi; i++)
            if (i >= n_mask || !((bits >> (i - lo)) & 1u)) logits[i] = -INFINITY;
    }
}

/* ------------------------------------------------------------- attention */

/* KV cache rows by type (GGML's type ids): float32, float16, bfloat16, or 32-value blocks
 * of Q8_0 or Q4_0 (llama-server's --cache-type-k/-v). A row is one head's d values. */
enum { KV_F32 = 0, KV_F16 = 1, KV_Q4_0 = 2, KV_Q8_0 = 8, KV_BF16 = 30 };

static int64_t kv_row_bytes(int type, int64_t d) {
    switch (type) {
    case KV_F32: return 4 * d;
    case KV_F16: case KV_BF16: return 2 * d;
    case KV_Q8_0: return d / 32 * (int64_t)sizeof(blk_q8_0);
    case KV_Q4_0: return d / 32 * (int64_t)sizeof(blk_q4_0);
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

/* one head's d floats into a cache row of `type` (ggml's reference quantizers, as
 * gguf_io's: Q8_0 d = amax / 127, q = round(x / d); Q4_0 d = -max / 8 for the value of
 * largest magnitude, q = trunc(x / d + 8.5) up to 15) */
static void kv_store(int type, const float *x, uint8_t *dst, int64_t d) {
    switch (type) {
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
    case KV_Q4_0:
        for (int64_t b = 0; b < d / 32; b++) {
            const float *xb = x + 32 * b;
            blk_q4_0 blk;
            float amax = 0.f, mx = 0.f;
            for (int j = 0; j < 32; j++)
                if (fabsf(xb[j]) > amax) { amax = fabsf(xb[j]); mx = xb[j]; }
            const float dd = mx / -8.f, id = dd != 0.f ? 1.f / dd : 0.f;
            blk.d = f2h(dd);
            for (int j = 0; j < 16; j++) {
                const int lo = (int)(xb[j] * id + 8.5f), hi = (int)(xb[j + 16] * id + 8.5f);
                blk.qs[j] = (uint8_t)((lo < 15 ? (lo < 0 ? 0 : lo) : 15) | ((hi < 15 ? (hi < 0 ? 0 : hi) : 15) << 4));
            }
            memcpy(dst + b * sizeof(blk_q4_0), &blk, sizeof blk);
        }
        break;
    }
}

/* a cache row of `type` as d floats */
static void kv_load_s(int type, const uint8_t *src, float *y, int d) {
    switch (type) {
    case KV_F32: memcpy(y, src, sizeof(float) * (size_t)d); break;
    case KV_F16: for (int i = 0; i < d; i++) y[i] = h2f(((const uint16_t *)src)[i]); break;
    case KV_BF16:
        for (int i = 0; i < d; i++) {
            const uint32_t bits = (uint32_t)((const uint16_t *)src)[i] << 16;
            memcpy(y + i, &bits, 4);
        }
        break;
    case KV_Q8_0:
        for (int b = 0; b < d / 32; b++) {
            const blk_q8_0 *blk = (const blk_q8_0 *)src + b;
            const float s = h2f(blk->d);
            for (int j = 0; j < 32; j++) y[32 * b + j] = s * (float)blk->qs[j];
        }
        break;
    case KV_Q4_0:
        for (int b = 0; b < d / 32; b++) {
            const blk_q4_0 *blk = (const blk_q4_0 *)src + b;
            const float s = h2f(blk->d);
            for (int j = 0; j < 16; j++) {
                y[32 * b + j] = s * (float)((blk->qs[j] & 15) - 8);
                y[32 * b + j + 16] = s * (float)((blk->qs[j] >> 4) - 8);
            }
        }
        break;
    }
}

#ifdef GC_X86
#define AVX2H __attribute__((target("avx2,fma,f16c")))
#define AVX512H __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))

AVX2H static void kv_load_avx2(int type, const uint8_t *src, float *y, int d) {
    int i = 0;
    switch (type) {
    case KV_F16:
        for (; i + 8 <= d; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 2 * i))));
        break;
    case KV_BF16:
        for (; i + 8 <= d; i += 8)
            _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 2 * i))), 16)));
        break;
    case KV_Q8_0:
        for (int b = 0; b < d / 32; b++) {
            const blk_q8_0 *blk = (const blk_q8_0 *)src + b;
            const __m256 s = _mm256_set1_ps(_cvtsh_ss(blk->d));
            for (int j = 0; j < 32; j += 8)
                _mm256_storeu_ps(y + 32 * b + j, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                                     _mm_loadl_epi64((const __m128i *)(blk->qs + j))))));
        }
        return;
    case KV_Q4_0:
        for (int b = 0; b < d / 32; b++) {
            const blk_q4_0 *blk = (const blk_q4_0 *)src + b;
            const __m256 s = _mm256_set1_ps(_cvtsh_ss(blk->d));
            const __m128i q = _mm_loadu_si128((const __m128i *)blk->qs), m4 = _mm_set1_epi8(15), e8 = _mm_set1_epi8(8);
            const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m4), e8);
            const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), e8);
            float *yb = y + 32 * b;
            _mm256_storeu_ps(yb, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
            _mm256_storeu_ps(yb + 8, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
            _mm256_storeu_ps(yb + 16, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
            _mm256_storeu_ps(yb + 24, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
        }
        return;
    }
    if (i < d) kv_load_s(type, src + (type == KV_F32 ? 4 : 2) * i, y + i, d - i);
}

AVX512H static void kv_load_avx512(int type, const uint8_t *src, float *y, int d) {
    int i = 0;
    switch (type) {
    case KV_F16:
        for (; i + 16 <= d; i += 16)
            _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + 2 * i))));
        break;
    case KV_BF16:
        for (; i + 16 <= d; i += 16)
            _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + 2 * i))), 16)));
        break;
    case KV_Q8_0:
        for (int b = 0; b < d / 32; b++) {
            const blk_q8_0 *blk = (const blk_q8_0 *)src + b;
            const __m512 s = _mm512_set1_ps(_cvtsh_ss(blk->d));
            _mm512_storeu_ps(y + 32 * b, _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                           _mm_loadu_si128((const __m128i *)blk->qs)))));
            _mm512_storeu_ps(y + 32 * b + 16, _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                                _mm_loadu_si128((const __m128i *)(blk->qs + 16))))));
        }
        return;
    case KV_Q4_0:
        for (int b = 0; b < d / 32; b++) {
            const blk_q4_0 *blk = (const blk_q4_0 *)src + b;
            const __m512 s = _mm512_set1_ps(_cvtsh_ss(blk->d));
            const __m128i q = _mm_loadu_si128((const __m128i *)blk->qs), m4 = _mm_set1_epi8(15), e8 = _mm_set1_epi8(8);
            const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m4), e8);
            const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), e8);
            _mm512_storeu_ps(y + 32 * b, _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo))));
            _mm512_storeu_ps(y + 32 * b + 16, _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi))));
        }
        return;
    }
    if (i < d) kv_load_s(type, src + (type == KV_F32 ? 4 : 2) * i, y + i, d - i);
}

AVX512H static float dot_avx512(const float *a, const float *b, int n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

AVX512H static void axpy_avx512(float a, const float *x, float *y, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
#endif

typedef struct {
    float (*dot)(const float *, const float *, int);
    void (*axpy)(float, const float *, float *, int);
    void (*load)(int, const uint8_t *, float *, int);
} attn_vec_t;

static const attn_vec_t *attn_vec(void) {
    static const attn_vec_t S = {dot_s, axpy_s, kv_load_s};
#ifdef GC_X86
    static const attn_vec_t A2 = {dot_avx2, axpy_avx2, kv_load_avx2};
    static const attn_vec_t A5 = {dot_avx512, axpy_avx512, kv_load_avx512};
    if (gc_isa() >= ISA_AVX512) return &A5;
    if (gc_isa() >= ISA_AVX2) return &A2;
#endif
    return &S;
}

/* A layer's attention, fixed at load (the Python side builds it once per layer and
 * cache): offsets are in floats from the start of a row of the fused q/k/v projection
 * output; q heads are `q_head` floats apart (2 d when a gate follows each, Qwen3.5). */
typedef struct {
    int64_t n_head, n_kv, d;
    int64_t q_off, q_head, k_off, v_off, gate_off; /* gate_off < 0: no output gate */
    const float *q_norm, *k_norm;                 /* NULL: no q/k RMSNorm */
    float eps, scale, softcap;                    /* softcap 0: none */
    int32_t half, neox, window;                   /* rotary dims / 2, NeoX pairing, window (0: none) */
    uint8_t *kc, *vc;                             /* cache rows (slots, n_kv, n_cells) of k_type / v_type */
    int64_t n_cells;
    const float *sinks;                           /* per head a logit in the softmax with no value (gpt-oss); NULL: none */
    const float *v_norm;                          /* RMSNorm weight of the v heads (Gemma 4); NULL: none */
    int32_t kv_shared;                            /* q only: k/v are an earlier layer's, in kc/vc (Gemma 4) */
    int32_t k_type, v_type;                       /* KV_*: the cache rows' types */
} gc_attn_layer;

/* a batch's sequence: its tokens [t0, t0 + n) (contiguous), slot, the cells it sees
 * (min(end, n_cells)), their blocks (of blk cells), its first work item and where its
 * partial results start */
typedef struct {
    int64_t t0, n, slot, len, cells, blk, n_blocks, item0, part0;
} attn_seq;

typedef struct {
    const gc_attn_layer *L;
    float *qkv;
    int64_t row, n_tok;
    const float *cos, *sin;
    const int64_t *slots, *cells, *pos, *kv_end;
    float *out;
    /* the attention's work: items (sequence, kv head, block of `blk` cells) */
    const attn_seq *seqs;
    const int64_t *seq_of; /* per token, its sequence */
    int64_t n_seqs;
    float *part; /* per item, per row (token x head of its group): d floats of sum p v, then max, sum p */
} attn_ctx;

static void rope_row(float *x, const float *cs, const float *sn, int half, int neox) {
    if (neox) {
        for (int i = 0; i < half; i++) {
            const float a = x[i], b = x[i + half];
            x[i] = a * cs[i] - b * sn[i];
            x[i + half] = b * cs[i] + a * sn[i];
        }
    } else {
        for (int i = 0; i < half; i++) {
            const float a = x[2 * i], b = x[2 * i + 1];
            x[2 * i] = a * cs[i] - b * sn[i];
            x[2 * i + 1] = b * cs[i] + a * sn[i];
        }
    }
}

/* per (token, head) of q and of k: norm, rotary; k and v heads into their cache cells */
static void attn_prep_task(void *vctx, int64_t start, int64_t end) {
    const attn_ctx *c = vctx;
    const gc_attn_layer *L = c->L;
    const vec_t *V = vec();
    const int64_t per = L->n_head + (L->kv_shared ? 0 : L->n_kv), d = L->d;
    const int64_t kb = kv_row_bytes(L->k_type, d), vb = kv_row_bytes(L->v_type, d);
    float vn[MAX_HEAD_DIM];
    for (int64_t it = start; it < end; it++) {
        const int64_t t = it / per, j = it % per;
        float *row = c->qkv + t * c->row;
        const float *cs = c->cos + t * L->half, *sn = c->sin + t * L->half;
        if (j < L->n_head) {
            float *x = row + L->q_off + j * L->q_head;
            if (L->q_norm) norm_row(V, x, L->q_norm, x, NULL, (int)d, L->eps);
            rope_row(x, cs, sn, L->half, L->neox);
            continue;
        }
        const int64_t h = j - L->n_head;
        float *x = row + L->k_off + h * d;
        if (L->k_norm) norm_row(V, x, L->k_norm, x, NULL, (int)d, L->eps);
        rope_row(x, cs, sn, L->half, L->neox);
        const int64_t at = (c->slots[t] * L->n_kv + h) * L->n_cells + c->cells[t];
        kv_store(L->k_type, x, L->kc + at * kb, d);
        const float *v = row + L->v_off + h * d;
        if (L->v_norm) {
            norm_row(V, v, L->v_norm, vn, NULL, (int)d, L->eps);
            v = vn;
        }
        kv_store(L->v_type, v, L->vc + at * vb, d);
    }
}

/* per-thread scratch of n floats (a decode step's attention runs hundreds of times) */
static float *scratch(void **buf, size_t *cap, size_t n) { return gc_grow(buf, cap, sizeof(float) * n); }

/* the sequence a work item belongs to (items are numbered sequence after sequence) */
static const attn_seq *item_seq(const attn_ctx *c, int64_t it) {
    int64_t si = 0;
    while (si + 1 < c->n_seqs && c->seqs[si + 1].item0 <= it) si++;
    return &c->seqs[si];
}

/* One work item: a sequence's tokens, the query heads of one kv head (a group of G), over
 * one block of cells: per row (token, head) the block's scores' max m, sum of e^(s - m)
 * and sum of e^(s - m) v, written to the item's partial results. The block's keys and
 * values are read once for all the rows (flash-decoding: the blocks of a long cache are
 * split across threads, and attn_reduce_task merges them). */
static void attn_block_task(void *vctx, int64_t start, int64_t end) {
    static _Thread_local void *buf;
    static _Thread_local size_t cap;
    const attn_ctx *c = vctx;
    const gc_attn_layer *L = c->L;
    const attn_vec_t *A = attn_vec();
    const vec_t *V = vec();
    const int64_t d = L->d, G = L->n_head / L->n_kv, n_cells = L->n_cells;
    const int64_t kb = kv_row_bytes(L->k_type, d), vb = kv_row_bytes(L->v_type, d);
    for (int64_t it = start; it < end; it++) {
        const attn_seq *S = item_seq(c, it);
        const int64_t local = it - S->item0, kvh = local / S->n_blocks, b = local % S->n_blocks;
        const int64_t blk = S->blk, c0 = b * blk, c1 = c0 + blk < S->cells ? c0 + blk : S->cells, nc = c1 - c0;
        const int64_t R = S->n * G, pw = d + 2;
        float *part = c->part + S->part0 + local * R * pw;
        float *kf = scratch(&buf, &cap, (size_t)(2 * d + R * blk));
        if (!kf) { /* out of memory: NaNs rather than a silent wrong answer */
            for (int64_t r = 0; r < R * pw; r++) part[r] = NAN;
            continue;
        }
        float *vf = kf + d, *s = vf + d;
        const int64_t base = (S->slot * L->n_kv + kvh) * n_cells;
        for (int64_t j = 0; j < nc; j++) {
            const int64_t cell = c0 + j;
            const int64_t cp = n_cells >= S->len ? cell : cell + n_cells * ((S->len - 1 - cell) / n_cells);
            const uint8_t *kr = L->kc + (base + cell) * kb;
            const float *k = (const float *)kr;
            int loaded = L->k_type == KV_F32;
            for (int64_t tt = 0; tt < S->n; tt++) {
                const int64_t p = c->pos[S->t0 + tt];
                const int ok = cp <= p && (!L->window || p - cp < L->window);
                if (ok && !loaded) {
                    A->load(L->k_type, kr, kf, (int)d);
                    k = kf;
                    loaded = 1;
                }
                const float *qrow = c->qkv + (S->t0 + tt) * c->row + L->q_off;
                for (int64_t g = 0; g < G; g++) {
                    float sc = -INFINITY;
                    if (ok) {
                        sc = A->dot(qrow + (kvh * G + g) * L->q_head, k, (int)d) * L->scale;
                        if (L->softcap > 0.f) sc = L->softcap * tanhf(sc / L->softcap);
                    }
                    s[(tt * G + g) * blk + j] = sc;
                }
            }
        }
        for (int64_t r = 0; r < R; r++) {
            float *sr = s + r * blk, *o = part + r * pw;
            float m = -INFINITY;
            for (int64_t j = 0; j < nc; j++) m = sr[j] > m ? sr[j] : m;
            memset(o, 0, sizeof(float) * (size_t)d);
            o[d] = m;
            if (m == -INFINITY) {
                o[d + 1] = 0.f;
                for (int64_t j = 0; j < nc; j++) sr[j] = 0.f;
            } else {
                o[d + 1] = V->exp_sum(sr, (int)nc, m);
            }
        }
        for (int64_t j = 0; j < nc; j++) {
            const uint8_t *vr = L->vc + (base + c0 + j) * vb;
            const float *v = L->v_type == KV_F32 ? (const float *)vr : NULL;
            for (int64_t r = 0; r < R; r++) {
                const float w = s[r * blk + j];
                if (w == 0.f) continue;
                if (!v) {
                    A->load(L->v_type, vr, vf, (int)d);
                    v = vf;
                }
                A->axpy(w, v, part + r * pw, (int)d);
            }
        }
    }
}

/* per (token, head): the blocks' partial results merged (each scaled by e^(m_b - M)),
 * the sink's share added, divided by the sum, times sigmoid(gate) if the layer has one */
static void attn_reduce_task(void *vctx, int64_t start, int64_t end) {
    const attn_ctx *c = vctx;
    const gc_attn_layer *L = c->L;
    const attn_vec_t *A = attn_vec();
    const int64_t d = L->d, G = L->n_head / L->n_kv, pw = d + 2;
    for (int64_t it = start; it < end; it++) {
        const int64_t t = it / L->n_head, h = it % L->n_head, kvh = h / G, g = h % G;
        const attn_seq *S = &c->seqs[c->seq_of[t]];
        const int64_t R = S->n * G, r = (t - S->t0) * G + g;
        const float *first = c->part + S->part0 + kvh * S->n_blocks * R * pw + r * pw;
        float M = L->sinks ? L->sinks[h] : -INFINITY;
        for (int64_t b = 0; b < S->n_blocks; b++) M = first[b * R * pw + d] > M ? first[b * R * pw + d] : M;
        float *o = c->out + (t * L->n_head + h) * d;
        memset(o, 0, sizeof(float) * (size_t)d);
        float sum = L->sinks ? expf(L->sinks[h] - M) : 0.f;
        for (int64_t b = 0; b < S->n_blocks; b++) {
            const float *pb = first + b * R * pw;
            if (pb[d] == -INFINITY) continue;
            const float w = expf(pb[d] - M);
            sum += w * pb[d + 1];
            A->axpy(w, pb, o, (int)d);
        }
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        for (int64_t i = 0; i < d; i++) o[i] *= inv;
        if (L->gate_off >= 0) {
            const float *gt = c->qkv + t * c->row + L->gate_off + h * L->q_head;
            for (int64_t i = 0; i < d; i++) o[i] *= 1.f / (1.f + expf(-gt[i]));
        }
    }
}

/* ---- attention of many queries per sequence (prompt chunks): items of (sequence, kv head,
 * tile of tokens), each over all the cells its tokens see, a block of AT_KB cells at a time
 * with an online softmax (flash attention). The tile's rows (token x query head of the kv
 * head's group) meet a block's keys as a small matrix product: keys converted from their
 * type and transposed once per block, scores for four rows and AT_KB cells held in
 * registers; then the values the same way. Blocks no token of the tile sees (after its
 * last position, or outside its window) are skipped. */

#define AT_KB 64   /* cells per key block: four 16-float vectors */
#define AT_ROWS 128 /* rows of a tile, about (tokens x the group's heads): 64 ran 15 % slower, 256 5 % faster */

typedef float v16f __attribute__((vector_size(64), aligned(4)));

/* S[r][0..AT_KB) = Q[r] . Kt[.][0..AT_KB) for R rows (a multiple of 4) of d */
#define DEFINE_AT_SCORES(NAME, TARGET)                                                              \
    TARGET static void NAME(const float *Q, const float *Kt, float *S, int64_t R, int64_t d) {      \
        for (int64_t r = 0; r < R; r += 4) {                                                        \
            v16f a[4][4] = {{{0}}};                                                                 \
            const float *q = Q + r * d;                                                             \
            for (int64_t i = 0; i < d; i++) {                                                       \
                const v16f *k = (const v16f *)(Kt + i * AT_KB);                                     \
                const v16f k0 = k[0], k1 = k[1], k2 = k[2], k3 = k[3];                              \
                for (int rr = 0; rr < 4; rr++) {                                                    \
                    const float x = q[rr * d + i];                                                  \
                    a[rr][0] += x * k0; a[rr][1] += x * k1; a[rr][2] += x * k2; a[rr][3] += x * k3; \
                }                                                                                   \
            }                                                                                       \
            for (int rr = 0; rr < 4; rr++)                                                          \
                for (int v = 0; v < 4; v++) ((v16f *)(S + (r + rr) * AT_KB))[v] = a[rr][v];         \
        }                                                                                           \
    }

/* O[r] += sum_j P[r][j] V[j] for R rows (a multiple of 4), nc cells, d a multiple of 16 */
#define DEFINE_AT_PV(NAME, TARGET)                                                                  \
    TARGET static void NAME(const float *P, const float *Vr, int64_t v_stride, float *O, int64_t R, int64_t nc, \
                            int64_t d) {                                                            \
        for (int64_t r = 0; r < R; r += 4) {                                                        \
            int64_t c = 0;                                                                          \
            for (; c + 64 <= d; c += 64) {                                                          \
                v16f a[4][4];                                                                       \
                for (int rr = 0; rr < 4; rr++)                                                      \
                    for (int v = 0; v < 4; v++) a[rr][v] = ((const v16f *)(O + (r + rr) * d + c))[v]; \
                for (int64_t j = 0; j < nc; j++) {                                                  \
                    const v16f *x = (const v16f *)(Vr + j * v_stride + c);                          \
                    const v16f x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];                          \
                    for (int rr = 0; rr < 4; rr++) {                                                \
                        const float p = P[(r + rr) * AT_KB + j];                                    \
                        a[rr][0] += p * x0; a[rr][1] += p * x1; a[rr][2] += p * x2; a[rr][3] += p * x3; \
                    }                                                                               \
                }                                                                                   \
                for (int rr = 0; rr < 4; rr++)                                                      \
                    for (int v = 0; v < 4; v++) ((v16f *)(O + (r + rr) * d + c))[v] = a[rr][v];     \
            }                                                                                       \
            for (; c < d; c += 16) {                                                                \
                v16f a[4];                                                                          \
                for (int rr = 0; rr < 4; rr++) a[rr] = *(const v16f *)(O + (r + rr) * d + c);      \
                for (int64_t j = 0; j < nc; j++) {                                                  \
                    const v16f x = *(const v16f *)(Vr + j * v_stride + c);                          \
                    for (int rr = 0; rr < 4; rr++) a[rr] += P[(r + rr) * AT_KB + j] * x;            \
                }                                                                                   \
                for (int rr = 0; rr < 4; rr++) *(v16f *)(O + (r + rr) * d + c) = a[rr];            \
            }                                                                                       \
        }                                                                                           \
    }

DEFINE_AT_SCORES(at_scores_s, )
DEFINE_AT_PV(at_pv_s, )
#ifdef GC_X86
DEFINE_AT_SCORES(at_scores_avx2, AVX2F)
DEFINE_AT_PV(at_pv_avx2, AVX2F)
DEFINE_AT_SCORES(at_scores_avx512, AVX512H)
DEFINE_AT_PV(at_pv_avx512, AVX512H)
#endif

typedef struct {
    void (*scores)(const float *, const float *, float *, int64_t, int64_t);
    void (*pv)(const float *, const float *, int64_t, float *, int64_t, int64_t, int64_t);
} at_vec_t;

static const at_vec_t *at_vec(void) {
    static const at_vec_t S = {at_scores_s, at_pv_s};
#ifdef GC_X86
    static const at_vec_t A2 = {at_scores_avx2, at_pv_avx2};
    static const at_vec_t A5 = {at_scores_avx512, at_pv_avx512};
    if (gc_isa() >= ISA_AVX512) return &A5;
    if (gc_isa() >= ISA_AVX2) return &A2;
#endif
    return &S;
}

/* One item: a tile of a sequence's tokens (seqs[].blk tokens a tile, n_blocks tiles; the
 * last tiles, which see the most cells, come first) and the query heads of one kv head. */
static void attn_tile_task(void *vctx, int64_t start, int64_t end) {
    static _Thread_local void *buf;
    static _Thread_local size_t cap;
    const attn_ctx *c = vctx;
    const gc_attn_layer *L = c->L;
    const attn_vec_t *A = attn_vec();
    const at_vec_t *T = at_vec();
    const vec_t *V = vec();
    const int64_t d = L->d, G = L->n_head / L->n_kv, n_cells = L->n_cells;
    const int64_t kb = kv_row_bytes(L->k_type, d), vb = kv_row_bytes(L->v_type, d);
    for (int64_t it = start; it < end; it++) {
        const attn_seq *S = item_seq(c, it);
        const int64_t local = it - S->item0, kvh = local / S->n_blocks, tile = S->n_blocks - 1 - local % S->n_blocks;
        const int64_t tt0 = tile * S->blk, nt = S->blk < S->n - tt0 ? S->blk : S->n - tt0;
        const int64_t R = nt * G, Rp = (R + 3) / 4 * 4;
        float *Q = scratch(&buf, &cap, (size_t)(2 * Rp * d + 2 * AT_KB * d + Rp * AT_KB + 2 * Rp));
        if (!Q) { /* out of memory: NaNs rather than a silent wrong answer */
            for (int64_t tt = 0; tt < nt; tt++)
                for (int64_t g = 0; g < G; g++)
                    for (int64_t i = 0; i < d; i++) c->out[((S->t0 + tt0 + tt) * L->n_head + kvh * G + g) * d + i] = NAN;
            continue;
        }
        float *O = Q + Rp * d, *Kt = O + Rp * d, *Vb = Kt + AT_KB * d, *P = Vb + AT_KB * d, *m = P + Rp * AT_KB;
        float *l = m + Rp;
        int64_t cpos[AT_KB];
        int64_t pmin = INT64_MAX, pmax = INT64_MIN;
        for (int64_t tt = 0; tt < nt; tt++) {
            const int64_t t = S->t0 + tt0 + tt, p = c->pos[t];
            pmin = p < pmin ? p : pmin;
            pmax = p > pmax ? p : pmax;
            const float *qrow = c->qkv + t * c->row + L->q_off;
            for (int64_t g = 0; g < G; g++) {
                const float *q = qrow + (kvh * G + g) * L->q_head;
                float *dst = Q + (tt * G + g) * d;
                for (int64_t i = 0; i < d; i++) dst[i] = q[i] * L->scale;
                m[tt * G + g] = L->sinks ? L->sinks[kvh * G + g] : -INFINITY; /* a sink: e^(sink - m) = 1 in l */
                l[tt * G + g] = L->sinks ? 1.f : 0.f;
            }
        }
        memset(Q + R * d, 0, sizeof(float) * (size_t)((Rp - R) * d));
        memset(O, 0, sizeof(float) * (size_t)(Rp * d));
        const int64_t base = (S->slot * L->n_kv + kvh) * n_cells;
        for (int64_t c0 = 0; c0 < S->cells; c0 += AT_KB) {
            const int64_t nc = c0 + AT_KB < S->cells ? AT_KB : S->cells - c0;
            int64_t cmin = INT64_MAX, cmax = INT64_MIN;
            for (int64_t j = 0; j < nc; j++) {
                const int64_t cell = c0 + j;
                const int64_t cp = n_cells >= S->len ? cell : cell + n_cells * ((S->len - 1 - cell) / n_cells);
                cpos[j] = cp;
                cmin = cp < cmin ? cp : cmin;
                cmax = cp > cmax ? cp : cmax;
            }
            if (cmin > pmax || (L->window && pmin - cmax >= L->window)) continue; /* no token sees any */
            const int full = cmax <= pmin && (!L->window || pmax - cmin < L->window);
            for (int64_t j = 0; j < nc; j++) { /* keys transposed: Kt[i][j] */
                const uint8_t *kr = L->kc + (base + c0 + j) * kb;
                const float *k = (const float *)kr;
                if (L->k_type != KV_F32) {
                    A->load(L->k_type, kr, Vb, (int)d);
                    k = Vb;
                }
                for (int64_t i = 0; i < d; i++) Kt[i * AT_KB + j] = k[i];
            }
            for (int64_t j = nc; j < AT_KB; j++)
                for (int64_t i = 0; i < d; i++) Kt[i * AT_KB + j] = 0.f;
            T->scores(Q, Kt, P, Rp, d);
            for (int64_t r = 0; r < R; r++) {
                float *sr = P + r * AT_KB;
                if (L->softcap > 0.f)
                    for (int64_t j = 0; j < nc; j++) sr[j] = L->softcap * tanhf(sr[j] / L->softcap);
                if (!full) {
                    const int64_t p = c->pos[S->t0 + tt0 + r / G];
                    for (int64_t j = 0; j < nc; j++)
                        if (!(cpos[j] <= p && (!L->window || p - cpos[j] < L->window))) sr[j] = -INFINITY;
                }
                float mb = -INFINITY;
                for (int64_t j = 0; j < nc; j++) mb = sr[j] > mb ? sr[j] : mb;
                if (mb == -INFINITY) {
                    memset(sr, 0, sizeof(float) * (size_t)nc);
                    continue;
                }
                const float mn = m[r] > mb ? m[r] : mb, alpha = m[r] == -INFINITY ? 0.f : expf(m[r] - mn);
                l[r] = l[r] * alpha + V->exp_sum(sr, (int)nc, mn);
                if (alpha != 1.f)
                    for (int64_t i = 0; i < d; i++) O[r * d + i] *= alpha;
                m[r] = mn;
            }
            memset(P + R * AT_KB, 0, sizeof(float) * (size_t)((Rp - R) * AT_KB));
            const float *vr = (const float *)(L->vc + (base + c0) * vb);
            if (L->v_type != KV_F32) {
                for (int64_t j = 0; j < nc; j++) A->load(L->v_type, L->vc + (base + c0 + j) * vb, Vb + j * d, (int)d);
                vr = Vb;
            }
            T->pv(P, vr, d, O, Rp, nc, d);
        }
        for (int64_t r = 0; r < R; r++) {
            const int64_t t = S->t0 + tt0 + r / G, h = kvh * G + r % G;
            const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
            float *o = c->out + (t * L->n_head + h) * d;
            for (int64_t i = 0; i < d; i++) o[i] = O[r * d + i] * inv;
            if (L->gate_off >= 0) {
                const float *gt = c->qkv + t * c->row + L->gate_off + h * L->q_head;
                for (int64_t i = 0; i < d; i++) o[i] *= 1.f / (1.f + expf(-gt[i]));
            }
        }
    }
}

/* Cells per block: a fixed grid, so that a token's sums run in the same order whatever
 * else is computed beside it: other sequences in the step, its own sequence's next tokens
 * (drafts being verified, a short prompt in one step: their later cells are masked and
 * add exact zeros) or the thread count. A greedy sequence then decodes the same tokens
 * with drafts or without, batched or alone. Sized by length, the blocks had cut the
 * cells differently for a draft than for the same token decoded alone. */
#define ATTN_BLOCK 256

enum { ATTEND_NONE = 0, ATTEND_BLOCKS = 1, ATTEND_TILES = 2 };

/* A layer's attention over the rows of its fused q/k/v projection (n_tok rows `row`
 * floats apart; see gc_attn_layer): q/k heads RMS-normalized when weights are given,
 * rotary over the first 2 * half dims with cos/sin tables (n_tok, half), k and v
 * written into the cache at each token's slot and cell (in the cache's row types). With
 * `attend`, then, per token and head, softmax over the cells of its slot whose positions
 * it sees (p <= its position, within the window if any; cell positions from the
 * sequence's end kv_end and the ring size) into out (n_tok, n_head * d), times
 * sigmoid(gate) if the layer has one; a head's sink logit, where the layer has them,
 * joins the softmax's denominator. A sequence's tokens are contiguous and share a slot.
 * `attend`: ATTEND_BLOCKS for a few tokens a sequence (decode: the cells split in blocks
 * across threads), ATTEND_TILES for many (prompt chunks: tiles of tokens, head_dim a
 * multiple of 16). The q and k parts of qkv are modified in place. Returns GC_NO_MEMORY if scratch
 * memory could not be had (nothing attended), else GC_OK. */
int gc_attention(const gc_attn_layer *L, float *qkv, int64_t row, int64_t n_tok, const float *cos, const float *sin,
                 const int64_t *slots, const int64_t *cells, const int64_t *pos, const int64_t *kv_end, float *out,
                 int attend, int n_threads) {
    static _Thread_local void *part_buf;
    static _Thread_local size_t part_cap;
    attn_ctx c = {L, qkv, row, n_tok, cos, sin, slots, cells, pos, kv_end, out, NULL, NULL, 0, NULL};
    const int64_t prep = n_tok * (L->n_head + (L->kv_shared ? 0 : L->n_kv));
    gc_parallel_for(prep >= 64 ? n_threads : 1, prep, chunk_of(prep, n_threads, 8), attn_prep_task, &c);
    if (!attend || n_tok == 0) return GC_OK;
    const int tiles = attend == ATTEND_TILES;
    int64_t n_seqs = 1;
    for (int64_t t = 1; t < n_tok; t++) n_seqs += slots[t] != slots[t - 1];
    attn_seq *seqs = malloc(sizeof(attn_seq) * (size_t)n_seqs + sizeof(int64_t) * (size_t)n_tok);
    if (!seqs) return GC_NO_MEMORY;
    int64_t *seq_of = (int64_t *)(seqs + n_seqs), si = -1;
    for (int64_t t = 0; t < n_tok; t++) {
        if (t == 0 || slots[t] != slots[t - 1]) {
            const int64_t len = kv_end[t], cl = len < L->n_cells ? len : L->n_cells;
            seqs[++si] = (attn_seq){t, 0, slots[t], len, cl, ATTN_BLOCK, 0, 0, 0};
        }
        seqs[si].n++;
        seq_of[t] = si;
    }
    const int64_t G = L->n_head / L->n_kv;
    int64_t items = 0, floats = 0;
    if (tiles) { /* items of (kv head, tile of tokens) */
        const int64_t per = AT_ROWS / G > 0 ? AT_ROWS / G : 1;
        for (int64_t s = 0; s < n_seqs; s++) {
            seqs[s].blk = per;
            seqs[s].n_blocks = (seqs[s].n + per - 1) / per;
            seqs[s].item0 = items;
            items += L->n_kv * seqs[s].n_blocks;
        }
        c.seqs = seqs;
        c.seq_of = seq_of;
        c.n_seqs = n_seqs;
        gc_parallel_for(n_threads, items, 1, attn_tile_task, &c);
        free(seqs);
        return GC_OK;
    }
    for (int64_t s = 0; s < n_seqs; s++) {
        seqs[s].n_blocks = (seqs[s].cells + seqs[s].blk - 1) / seqs[s].blk;
        if (seqs[s].n_blocks < 1) seqs[s].n_blocks = 1;
        seqs[s].item0 = items;
        seqs[s].part0 = floats;
        items += L->n_kv * seqs[s].n_blocks;
        floats += L->n_kv * seqs[s].n_blocks * seqs[s].n * G * (L->d + 2);
    }
    c.seqs = seqs;
    c.seq_of = seq_of;
    c.n_seqs = n_seqs;
    c.part = scratch(&part_buf, &part_cap, (size_t)floats);
    if (!c.part) {
        free(seqs);
        return GC_NO_MEMORY;
    }
    gc_parallel_for(n_threads, items, 1, attn_block_task, &c);
    const int64_t rows = n_tok * L->n_head;
    gc_parallel_for(rows >= 16 ? n_threads : 1, rows, chunk_of(rows, n_threads, 4), attn_reduce_task, &c);
    free(seqs);
    return GC_OK;
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

/* ------------------------------------ Qwen3.5, LFM2: causal conv */

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

/* ------------------------------------------- Qwen3.5: gated delta rule */

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
 * o = S^T q; the portable version */
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

#ifdef GC_X86
/* the same, 64 columns at a time held in registers: S^T k over the rows, then each row
 * updated and accumulated into o while it is in L1 (dv a multiple of 64) */
AVX2F static void delta_step_avx2(float *S, const float *qn, const float *kn, const float *v, float decay, float beta,
                                  float *o, int dk, int dv) {
    const __m256 vdec = _mm256_set1_ps(decay), vbeta = _mm256_set1_ps(beta);
    for (int j0 = 0; j0 < dv; j0 += 64) {
        __m256 acc[8], dl[8];
        for (int l = 0; l < 8; l++) acc[l] = _mm256_setzero_ps();
        for (int i = 0; i < dk; i++) {
            const float *row = S + (int64_t)i * dv + j0;
            const __m256 ki = _mm256_set1_ps(kn[i]);
            for (int l = 0; l < 8; l++) acc[l] = _mm256_fmadd_ps(ki, _mm256_loadu_ps(row + 8 * l), acc[l]);
        }
        for (int l = 0; l < 8; l++)
            dl[l] = _mm256_mul_ps(_mm256_fnmadd_ps(vdec, acc[l], _mm256_loadu_ps(v + j0 + 8 * l)), vbeta);
        for (int l = 0; l < 8; l++) acc[l] = _mm256_setzero_ps();
        for (int i = 0; i < dk; i++) {
            float *row = S + (int64_t)i * dv + j0;
            const __m256 ki = _mm256_set1_ps(kn[i]), qi = _mm256_set1_ps(qn[i]);
            for (int l = 0; l < 8; l++) {
                const __m256 sv = _mm256_fmadd_ps(_mm256_loadu_ps(row + 8 * l), vdec, _mm256_mul_ps(ki, dl[l]));
                _mm256_storeu_ps(row + 8 * l, sv);
                acc[l] = _mm256_fmadd_ps(qi, sv, acc[l]);
            }
        }
        for (int l = 0; l < 8; l++) _mm256_storeu_ps(o + j0 + 8 * l, acc[l]);
    }
}
#endif

static void delta_task(void *vctx, int64_t a, int64_t b) {
    const delta_ctx *c = vctx;
    const vec_t *V = vec();
    float qn[MAX_HEAD_DIM], kn[MAX_HEAD_DIM];
    const float qscale = 1.f / sqrtf((float)c->dk);
#ifdef GC_X86
    const int wide = gc_isa() >= ISA_AVX2 && c->dv % 64 == 0;
#endif
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
#ifdef GC_X86
            if (wide) {
                delta_step_avx2(S, qn, kn, v, decay, beta, o, c->dk, c->dv);
                continue;
            }
#endif
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
