/* LoRA adapters' low-rank products for a decode step's few rows (engine/lora.py), from
 * float16 factors: h = x A^T (gc_lora_down: A's rows are the adapters' stacked ranks) and
 * y += h B per span of h's columns, one adapter each (gc_lora_up, from B^T). A row's sums
 * run in one order whatever the other rows and adapters: a column of h that is zero (an
 * adapter the row does not use) adds nothing, so a row gets the bits it gets alone. */
#include "ops.h"

typedef struct {
    const uint16_t *a;
    const float *x;
    int64_t cols, n, rows;
    float *h;
} down_ctx;

static void down_task(void *vctx, int64_t start, int64_t end) {
    const down_ctx *c = vctx;
    const vec_t *V = vec();
    for (int64_t r = start; r < end; r++) {
        const uint16_t *ar = c->a + r * c->cols;
        for (int64_t t = 0; t < c->n; t++) c->h[t * c->rows + r] = V->dot_f16(ar, c->x + t * c->cols, (int)c->cols);
    }
}

/* h (n, rows) = x (n, cols) . A^T for a float16 A (rows, cols), all contiguous */
void gc_lora_down(const uint16_t *a, int64_t rows, int64_t cols, const float *x, int64_t n, float *h, int n_threads) {
    down_ctx c = {a, x, cols, n, rows, h};
    gc_parallel_for(rows * cols >= 65536 ? n_threads : 1, rows, chunk_of(rows, n_threads, 4), down_task, &c);
}

#define UP_COLS 256 /* output columns summed at a time, on the stack */

typedef struct {
    const uint16_t *bt;
    const float *h;
    const int64_t *ends;
    int n_spans;
    int64_t r, out, n;
    float *y;
} up_ctx;

static void up_task(void *vctx, int64_t start, int64_t end) {
    const up_ctx *c = vctx;
    const vec_t *V = vec();
    float acc[UP_COLS];
    for (int64_t c0 = start; c0 < end; c0 += UP_COLS) {
        const int w = (int)(end - c0 < UP_COLS ? end - c0 : UP_COLS);
        for (int64_t t = 0; t < c->n; t++) {
            const float *ht = c->h + t * c->r;
            float *yt = c->y + t * c->out + c0;
            int64_t j = 0;
            for (int s = 0; s < c->n_spans; s++) {
                int any = 0;
                for (; j < c->ends[s]; j++) {
                    if (ht[j] == 0.f) continue;
                    if (!any) memset(acc, 0, sizeof(float) * (size_t)w);
                    any = 1;
                    V->axpy_f16(ht[j], c->bt + j * c->out + c0, acc, w);
                }
                if (any) V->axpy(1.f, acc, yt, w);
            }
        }
    }
}

/* y (n, out) += h (n, r) . Bt (r, out) for a float16 Bt, span by span of h's columns
 * (ends: each span's end, the last r): each span's product summed, then added to y */
void gc_lora_up(const uint16_t *bt, int64_t r, int64_t out, const float *h, int64_t n, const int64_t *ends,
                int n_spans, float *y, int n_threads) {
    up_ctx c = {bt, h, ends, n_spans, r, out, n, y};
    /* chunks of whole UP_COLS: a column's arithmetic (vector or tail) is the same whatever the threads */
    const int64_t chunk = (chunk_of(out, n_threads, UP_COLS) + UP_COLS - 1) / UP_COLS * UP_COLS;
    gc_parallel_for(r * out >= 65536 ? n_threads : 1, out, chunk, up_task, &c);
}
