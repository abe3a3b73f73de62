/* RMSNorm (optionally added to a residual) and the gated activations (SiLU, tanh GELU,
 * gpt-oss's clamped SwiGLU) over float32 rows; their torch twins are in
 * engine/kernels/ops.py. */
#include "ops.h"

/* ---- RMSNorm */

/* y = x / sqrt(mean(x²) + eps) * w per row (rows of `cols`, x rows `x_stride` apart),
 * plus `residual` (rows contiguous) when given. y may be x. */
void gc_rms_norm(const float *x, int64_t x_stride, const float *w, float *y, int64_t rows, int64_t cols, float eps,
                 const float *residual) {
    const vec_t *V = vec();
    for (int64_t r = 0; r < rows; r++)
        norm_row(V, x + r * x_stride, w, y + r * cols, residual ? residual + r * cols : NULL, (int)cols, eps);
}

/* ---- activations */

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
