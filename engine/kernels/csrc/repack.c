/* Weights repacked at load into the layout this machine's kernels read fastest: Q5_0 and
 * MXFP4 in groups of eight rows (blk_q5_0x8, blk_mxfp4x8, quants.h) on x86-64 with AVX2,
 * and the scalar dot and dequantizer of those layouts for the lower ISA levels. */

#include "quants.h"

#if defined(GC_X86) /* made on x86-64 with AVX2 only (gc_repack); the scalar dot for the lower ISA levels */


static inline uint8_t every_fourth_bit(uint32_t x) { /* bits 0, 4, ..., 28 of x as bits 0..7 */
    x &= 0x11111111u;
    x = (x | x >> 3) & 0x03030303u;
    x = (x | x >> 6) & 0x000F000Fu;
    return (uint8_t)(x | x >> 12);
}

/* eight rows of nb Q5_0 blocks (row_bytes apart) -> nb blk_q5_0x8 */
void repack_q5_0x8(const uint8_t *w, int64_t row_bytes, int nb, blk_q5_0x8 *out) {
    for (int i = 0; i < nb; i++)
        for (int k = 0; k < 8; k++) {
            const blk_q5_0 *b = (const blk_q5_0 *)(w + k * row_bytes) + i;
            uint32_t qh;
            memcpy(&qh, b->qh, 4);
            out[i].d[k] = b->d;
            for (int p = 0; p < 4; p++) memcpy(out[i].qs + 32 * p + 4 * k, b->qs + 4 * p, 4);
            for (int j = 0; j < 4; j++) out[i].hb[4 * k + j] = every_fourth_bit(qh >> j);
        }
}

/* row k's block back in the file's layout */
static void unpack_q5_0x8(const blk_q5_0x8 *g, int k, blk_q5_0 *b) {
    uint32_t qh = 0;
    b->d = g->d[k];
    for (int p = 0; p < 4; p++) memcpy(b->qs + 4 * p, g->qs + 32 * p + 4 * k, 4);
    for (int j = 0; j < 4; j++)
        for (int bit = 0; bit < 8; bit++) qh |= (uint32_t)((g->hb[4 * k + j] >> bit) & 1) << (4 * bit + j);
    memcpy(b->qh, &qh, 4);
}

void dot8_q5_0x8_s(const void *vw, const void *vx, int nb, float *out) {
    const blk_q5_0x8 *w = vw;
    for (int k = 0; k < 8; k++) {
        float acc = 0.f;
        for (int i = 0; i < nb; i++) {
            blk_q5_0 b;
            unpack_q5_0x8(&w[i], k, &b);
            acc += dot_q5_0_s(&b, (const act32 *)vx + i, 1);
        }
        out[k] = acc;
    }
}

/* a group's eight rows as floats, rows n_cols apart */
void deq8_q5_0x8(const void *vw, float *y, int nb, int64_t n_cols) {
    const blk_q5_0x8 *w = vw;
    for (int k = 0; k < 8; k++)
        for (int i = 0; i < nb; i++) {
            blk_q5_0 b;
            unpack_q5_0x8(&w[i], k, &b);
            deq_q5_0(&b, y + k * n_cols + 32 * i, 1);
        }
}

/* eight MXFP4 rows -> blk_mxfp4x8 */
void repack_mxfp4x8(const uint8_t *w, int64_t row_bytes, int nb, blk_mxfp4x8 *out) {
    for (int i = 0; i < nb; i++)
        for (int k = 0; k < 8; k++) {
            const blk_mxfp4 *b = (const blk_mxfp4 *)(w + k * row_bytes) + i;
            out[i].e[k] = b->e;
            for (int p = 0; p < 4; p++) memcpy(out[i].qs + 32 * p + 4 * k, b->qs + 4 * p, 4);
        }
}

static void unpack_mxfp4x8(const blk_mxfp4x8 *g, int k, blk_mxfp4 *b) {
    b->e = g->e[k];
    for (int p = 0; p < 4; p++) memcpy(b->qs + 4 * p, g->qs + 32 * p + 4 * k, 4);
}

void dot8_mxfp4x8_s(const void *vw, const void *vx, int nb, float *out) {
    const blk_mxfp4x8 *w = vw;
    for (int k = 0; k < 8; k++) {
        float acc = 0.f;
        for (int i = 0; i < nb; i++) {
            blk_mxfp4 b;
            unpack_mxfp4x8(&w[i], k, &b);
            acc += dot_mxfp4_s(&b, (const act32 *)vx + i, 1);
        }
        out[k] = acc;
    }
}

void deq8_mxfp4x8(const void *vw, float *y, int nb, int64_t n_cols) {
    const blk_mxfp4x8 *w = vw;
    for (int k = 0; k < 8; k++)
        for (int i = 0; i < nb; i++) {
            blk_mxfp4 b;
            unpack_mxfp4x8(&w[i], k, &b);
            deq_mxfp4(&b, y + k * n_cols + 32 * i, 1);
        }
}

#endif

#if defined(GC_X86)
typedef struct {
    int type; /* the file's: T_Q5_0 or T_MXFP4 */
    const uint8_t *w;
    uint8_t *out;
    int64_t row_bytes;
    int nb;
} rp_ctx;

/* groups [start, end) of eight rows into the repacked layout */
static void repack_task(void *vctx, int64_t start, int64_t end) {
    const rp_ctx *c = vctx;
    for (int64_t g = start; g < end; g++) {
        const int64_t at = 8 * g * c->row_bytes;
        if (c->type == T_Q5_0) repack_q5_0x8(c->w + at, c->row_bytes, c->nb, (blk_q5_0x8 *)(c->out + at));
        else repack_mxfp4x8(c->w + at, c->row_bytes, c->nb, (blk_mxfp4x8 *)(c->out + at));
    }
}
#endif

/* W's rows in the layout this machine's kernels read fastest, where the type has one:
 * Q5_0 and MXFP4 in groups of eight rows (blk_q5_0x8, blk_mxfp4x8) with AVX2, n_rows a
 * multiple of 8 (a tensor of experts as one matrix of all their rows). Writes
 * `out` (as many bytes as W) and returns the new type for gc_mul_mat, gc_mul_mat_multi
 * and gc_dequantize; GC_UNSUPPORTED (out untouched) where there is none. */
int gc_repack(int type, const void *w, int64_t n_rows, int64_t n_cols, void *out, int n_threads) {
#if defined(GC_X86)
    const int64_t block = type == T_Q5_0 ? (int64_t)sizeof(blk_q5_0) : type == T_MXFP4 ? (int64_t)sizeof(blk_mxfp4) : 0;
    if (block && gc_isa() >= ISA_AVX2 && n_rows % 8 == 0 && n_cols % 32 == 0 && n_rows > 0) {
        const int nb = (int)(n_cols / 32);
        rp_ctx c = {type, w, out, nb * block, nb};
        gc_parallel_for(n_threads, n_rows / 8, 64, repack_task, &c); /* a gpt-oss layer's experts: 0.8 GB */
        return type == T_Q5_0 ? T_Q5_0_X8 : T_MXFP4_X8;
    }
#endif
    (void)type; (void)w; (void)n_rows; (void)n_cols; (void)out; (void)n_threads;
    return GC_UNSUPPORTED;
}
