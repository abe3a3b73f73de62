/* The routed experts' float32 parts: the router's product (gc_linear_f32, also the small
 * gates files keep unquantized), the top-k choice with its softmax weights, and the
 * weighted sum of the chosen experts' outputs. The experts' own products are matmul.c's
 * (gc_mul_mat_id). */
#include "ops.h"

/* ---- the router: a float32 linear */

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

/* ---- routed experts */

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
