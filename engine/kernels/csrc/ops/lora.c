/* LoRA adapters' low-rank products for a decode step's few rows (engine/lora.py), from
 * float16 factors: h = x A^T (gc_lora_down: A's rows are the adapters' stacked ranks) and
 * y += h B per span of h's columns, one adapter each (gc_lora_up, from B^T). The factors'
 * rows are widened to float32 once per call into a thread's scratch, then every input row
 * goes through them. A row's sums run in one order whatever the other rows and adapters:
 * a column of h that is zero (an adapter the row does not use) adds nothing, so a row gets
 * the bits it gets alone. */
#include "ops.h"

typedef struct {
    const uint16_t *a;
    const float *x, *mask;
    int64_t cols, n, rows;
    float *h;
} down_ctx;

static void down_task(void *vctx, int64_t start, int64_t end) {
    static _Thread_local void *buf;
    static _Thread_local size_t cap;
    const down_ctx *c = vctx;
    const attn_vec_t *A = attn_vec();
    float *row = scratch(&buf, &cap, (size_t)c->cols);
    for (int64_t r = start; r < end; r++) {
        const float *xs[4];
        int64_t ts[4];
        int k = 0, loaded = 0;
        for (int64_t t = 0; t < c->n; t++) {
            const float m = c->mask ? c->mask[t * c->rows + r] : 1.f;
            c->h[t * c->rows + r] = 0.f;
            if (m != 0.f) {
                xs[k] = c->x + t * c->cols;
                ts[k++] = t;
            }
            if (k == 4 || (k && t == c->n - 1)) { /* up to four input rows at a time */
                float out[4];
                if (!row) { /* out of memory: NaNs rather than a silent wrong answer */
                    for (int q = 0; q < k; q++) out[q] = NAN;
                } else {
                    if (!loaded) A->load(KV_F16, (const uint8_t *)(c->a + r * c->cols), row, (int)c->cols);
                    loaded = 1;
                    A->dot_rows(row, xs, k, (int)c->cols, out);
                }
                for (int q = 0; q < k; q++)
                    c->h[ts[q] * c->rows + r] = c->mask ? out[q] * c->mask[ts[q] * c->rows + r] : out[q];
                k = 0;
            }
        }
    }
}

/* h (n, rows) = x (n, cols) . A^T for a float16 A (rows, cols), all contiguous; with a
 * mask (n, rows), h's entries times it, those where it is 0 not computed (0) */
void gc_lora_down(const uint16_t *a, int64_t rows, int64_t cols, const float *x, int64_t n, const float *mask,
                  float *h, int n_threads) {
    down_ctx c = {a, x, mask, cols, n, rows, h};
    gc_parallel_for(rows * cols >= 65536 ? n_threads : 1, rows, chunk_of(rows, n_threads, 4), down_task, &c);
}

#define UP_COLS 256 /* output columns summed at a time */

typedef struct {
    const uint16_t *bt;
    const float *h;
    const int64_t *ends;
    int n_spans;
    int64_t r, out, n, ldy;
    float *y;
} up_ctx;

static void up_task(void *vctx, int64_t start, int64_t end) {
    static _Thread_local void *buf;
    static _Thread_local size_t cap;
    const up_ctx *c = vctx;
    const attn_vec_t *A = attn_vec();
    float *b = scratch(&buf, &cap, (size_t)(c->r + 1) * UP_COLS); /* B^T's rows of this chunk, then the sum */
    for (int64_t c0 = start; c0 < end; c0 += UP_COLS) {
        const int w = (int)(end - c0 < UP_COLS ? end - c0 : UP_COLS);
        if (!b) {
            for (int64_t t = 0; t < c->n; t++)
                for (int i = 0; i < w; i++) c->y[t * c->ldy + c0 + i] = NAN;
            continue;
        }
        float *acc = b + c->r * UP_COLS;
        int64_t lo = c->r, hi = 0; /* the rows of B^T some input row uses */
        for (int64_t t = 0; t < c->n; t++)
            for (int64_t j = 0; j < c->r; j++)
                if (c->h[t * c->r + j] != 0.f) {
                    lo = j < lo ? j : lo;
                    hi = j + 1 > hi ? j + 1 : hi;
                }
        for (int64_t j = lo; j < hi; j++) A->load(KV_F16, (const uint8_t *)(c->bt + j * c->out + c0), b + j * UP_COLS, w);
        for (int64_t t = 0; t < c->n; t++) {
            const float *ht = c->h + t * c->r;
            float *yt = c->y + t * c->ldy + c0;
            int64_t j = 0;
            for (int s = 0; s < c->n_spans; s++) {
                int any = 0;
                for (; j < c->ends[s]; j++) {
                    if (ht[j] == 0.f) continue;
                    if (!any) memset(acc, 0, sizeof(float) * (size_t)w);
                    any = 1;
                    A->axpy(ht[j], b + j * UP_COLS, acc, w);
                }
                if (any) A->axpy(1.f, acc, yt, w);
            }
        }
    }
}

/* y (n, out; rows ldy floats apart) += h (n, r) . Bt (r, out) for a float16 Bt, span by
 * span of h's columns (ends: each span's end, the last r): each span's product summed,
 * then added to y */
void gc_lora_up(const uint16_t *bt, int64_t r, int64_t out, const float *h, int64_t n, const int64_t *ends,
                int n_spans, float *y, int64_t ldy, int n_threads) {
    up_ctx c = {bt, h, ends, n_spans, r, out, n, ldy, y};
    /* chunks of whole UP_COLS: a column's arithmetic (vector or tail) is the same whatever the threads */
    const int64_t chunk = (chunk_of(out, n_threads, UP_COLS) + UP_COLS - 1) / UP_COLS * UP_COLS;
    gc_parallel_for(r * out >= 65536 ? n_threads : 1, out, chunk, up_task, &c);
}
