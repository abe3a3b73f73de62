/* The library's matrix products over packed weights: gc_mul_mat (one matrix),
 * gc_mul_mat_multi (matrices that read the same input), gc_mul_mat_id (mixture-of-experts
 * selections, grouped by expert), gc_dequantize; activation rows quantized once, the
 * output rows split over the thread pool, each work item run by the kernels dispatch.c
 * picked (row-wise dots, four-row dots, or the tiles). */

#include "quants.h"

typedef struct {
    const kernel_t *k;
    dot_fn dot;
    const uint8_t *w;
    int64_t row_bytes, n_rows, n_cols, n_x;
    const uint8_t *xq;
    size_t xq_row_bytes;
    float *y;
    int64_t y_stride; /* floats between output rows (activation b's outputs start at y + b * y_stride) */
    const void *dot4; /* four activation rows at a time, or NULL */
    dot8_fn dot8;     /* a repacked type's eight-row dot (then dot is NULL) */
    dotx8_fn dotx8;   /* eight activation rows at a time (AVX-512 VNNI, 32-block types), or NULL */
    const act32x8 *x8; /* the activation rows in groups of eight for dotx8: n_x / 8 groups of nb blocks */
    const uint16_t *xb; /* the activations as AMX's bfloat16 tiles where this matrix takes them, or NULL */
    const uint8_t *xv;  /* the activations in VNNI's groups of 16 rows where this matrix takes them, or NULL */
    const float *xf;    /* the activations transposed in groups of 16 rows (F16 / BF16 strips), or NULL */
} mm_ctx;

/* Row streams a thread walks at once: one sequential stream leaves the memory system
 * idle between misses; interleaved ones keep several in flight (7 -> 12 GB/s from DRAM
 * with 2 threads on an AVX-512 machine, before the dots prefetched; with their prefetch,
 * 2 and 4 streams were alike there, 1 ~5% slower). On the AVX2 (Zen 3) machine, Q4_K
 * 9728 x 2560 matrices from DRAM, 2 threads, medians of interleaved runs: 2 streams
 * 24.8-26.4 GB/s, 4 streams 22.2-23.8, 1 stream 23.2-23.3, 8 streams 22.8; 1 MB matrices
 * 13.0-14.9 vs 12.4-14.8. (-DNSTREAM= / -DPREFETCH_DIST= / -DPREFETCH_LOCALITY= override, for such comparisons.) */
#ifndef NSTREAM
#define NSTREAM 2
#endif

/* y[r] = W[r] · x for rows [start, end) of one activation row, the rows walked as
 * NSTREAM interleaved streams */
static void rows_streamed(dot_fn dot, const uint8_t *w, int64_t row_bytes, const uint8_t *xq, int nb, float *y,
                          int64_t start, int64_t end) {
    if (end - start >= 2 * NSTREAM) {
        const int64_t len = (end - start) / NSTREAM;
        /* the dots prefetch PREFETCH_DIST ahead: ask for each stream's first bytes now */
        const int64_t first = len * row_bytes < PREFETCH_DIST ? len * row_bytes : PREFETCH_DIST;
        for (int s = 0; s < NSTREAM; s++)
            for (int64_t o = 0; o < first; o += 64) __builtin_prefetch(w + (start + s * len) * row_bytes + o, 0, 3);
        for (int64_t i = 0; i < len; i++)
            for (int s = 0; s < NSTREAM; s++) {
                const int64_t r = start + s * len + i;
                y[r] = dot(w + r * row_bytes, xq, nb);
            }
        start += NSTREAM * len;
    }
    for (int64_t r = start; r < end; r++) y[r] = dot(w + r * row_bytes, xq, nb);
}

/* Per-thread scratch: the quantized activations in two formats, the tiles */
static _Thread_local void *t_scratch[8];
static _Thread_local size_t t_scratch_cap[8];

static uint8_t *scratch(int i, size_t n) { return gc_grow(&t_scratch[i], &t_scratch_cap[i], n); }

/* Batch-invariant decode: up to this many activation rows (a decode step of up to 16
 * sequences), each row's product is the one-row dot's, bit for bit: the four- and
 * eight-row dots do each row's arithmetic as the one-row dot does (the weights unpacked
 * once for all), so a sequence's logits do not depend on what else shares its step. The
 * tiles, which sum in another order, start above it. */
#define DECODE_ROWS 16
/* Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL and MXFP4 weight rows go through the repacked tiles from this
 * many activation rows up (gc_set_tiles(0): never, for tests and comparisons) */
#define TILE_MIN_ROWS (DECODE_ROWS + 1)
/* ...except signed 32-blocks (Q8_0, IQ4_NL, MXFP4) where AVX-512 VNNI's eight- and four-row dots run:
 * packing a tile costs more than those dots save below ~32 rows on a large matrix (Gemma 3
 * 270M's Q8_0 head, 262144 x 640, 2 threads, Zen 5: 8 rows 24.6 ms tiled vs 7.6 by the
 * eight-row dots, 24 rows 26.2 vs 22.2, 32 rows 38.5 vs 39.1, 48 rows 49.8 vs 89.7; on
 * 4096 x 2560 IQ4_NL the tiles win from 16 rows, 0.68 vs 1.14 ms) */
#define TILE_MIN_ROWS_SIGNED_VNNI 32
static int g_tiles = 1;
static int g_x8 = 1;
static int g_amx = 1;
static int g_vnni = 1;

/* use the tiles (1, the default) or the row-wise dots only (0); returns the setting */
int gc_set_tiles(int on) {
    if (on >= 0) g_tiles = on != 0;
    return g_tiles;
}

/* use the eight-row dots where they exist (1, the default) or not (0); returns the setting */
int gc_set_x8(int on) {
    if (on >= 0) g_x8 = on != 0;
    return g_x8;
}

/* prompts (the tiles' row counts) of the 256-block types through arch/x86_strips.c where
 * AVX-512 VNNI runs and AMX does not take them (1, the default), or the tiles (0);
 * returns the setting */
int gc_set_vnni(int on) {
    if (on >= 0) g_vnni = on != 0;
    return g_vnni;
}

/* prompts (the tiles' row counts) in bfloat16 on AMX where the CPU has it and the type is
 * one arch/x86_amx.c takes (1, the default), or never (0); -1 asks; returns the setting
 * as it applies here (0 on a CPU without AMX) */
int gc_set_amx(int on) {
    if (on >= 0) g_amx = on != 0;
#ifdef GC_X86
    return g_amx && amx_ready();
#else
    return 0;
#endif
}

/* 1 if this type's prompts take AMX under the process's settings (the thread's ISA level
 * and prefill choice aside) */
int gc_amx_takes(int type) {
#ifdef GC_X86
    return g_amx && g_tiles && amx_type(type) && amx_ready();
#else
    (void)type;
    return 0;
#endif
}

/* the calling thread's AMX choice for the calls it makes (a model's prompts in float32
 * turn it off: 0; -1 the process's setting); returns the previous one, to restore */
static _Thread_local int t_amx = -1;

int gc_use_amx(int on) {
    const int old = t_amx;
    t_amx = on < 0 ? -1 : on != 0;
    return old;
}


#ifdef GC_X86
/* whether n_x activation rows against this type take the tiles (AVX2 and up) */
static int tiled(int type, int64_t n_x) {
    const int vnni_signed = gc_isa() >= ISA_AVX512 && signed32(type);
    return g_tiles && gc_isa() >= ISA_AVX2 && n_x >= (vnni_signed ? TILE_MIN_ROWS_SIGNED_VNNI : TILE_MIN_ROWS)
        && tile_type(type);
}

static void *tile_scratch(int type, int nb, int64_t n_tiles) { return scratch(2, tile_bytes(type, nb) * (size_t)n_tiles); }

/* whether n_x activation rows against this type take AMX (arch/x86_amx.c) */
static int on_amx(int type, int64_t n_x, int64_t n_cols) {
    return t_amx != 0 && gc_isa() >= ISA_AVX512 && n_x >= TILE_MIN_ROWS && n_cols % 32 == 0 && gc_amx_takes(type);
}

/* whether n_x activation rows against this type take arch/x86_strips.c (AMX aside): 1 the
 * integer strips, 2 the float ones. The float strips cost the same from 17 to 32 rows (two
 * groups of 16 lanes), the four-by-four tiles grow with the rows: 2.6 against 3.0 ms at
 * 17 rows, 3.9 against 3.1 at 32 (F16 6144 x 2048, 2 threads, Sapphire Rapids without
 * AMX), so the floats take the strips from 24 rows. */
#define FSTRIP_MIN_ROWS 24
static int on_vnni(int type, int64_t n_x, int64_t n_cols) {
    if (!g_vnni || !g_tiles || gc_isa() < ISA_AVX512 || n_x < TILE_MIN_ROWS) return 0;
    if (n_cols % 256 == 0 && vnni_type(type)) return 1;
    return fstrip_type(type) && n_cols % 16 == 0 && n_x >= FSTRIP_MIN_ROWS ? 2 : 0;
}

/* Tiles packed at a time, and the bytes of quantized activation rows that meet them in one
 * run: both together stay in L2 (Gemma 3 270M, 512 rows against its Q6_K 640 x 2048
 * ffn_down: 9.7 ms with all 512 rows, 1.2 MB of them, meeting each tile; 5.8 ms in runs). */
#define TILE_GROUP 8
#define TILE_X_BYTES (128 * 1024)
#endif

/* rows [lo, hi) of the repacked group at row g for every activation row, by its eight-row dot */
static void x8_rows(const mm_ctx *c, int nb, int64_t g, int64_t lo, int64_t hi) {
    const uint8_t *wg = c->w + g * c->row_bytes;
    for (int64_t b = 0; b < c->n_x; b++) {
        float *y = c->y + b * c->y_stride;
        if (lo == g && hi == g + 8) {
            c->dot8(wg, c->xq + b * c->xq_row_bytes, nb, y + g);
            continue;
        }
        float o[8];
        c->dot8(wg, c->xq + b * c->xq_row_bytes, nb, o);
        for (int64_t r = lo; r < hi; r++) y[r] = o[r - g];
    }
}

static void mm_task(void *vctx, int64_t start, int64_t end) {
    const mm_ctx *c = vctx;
    const int nb = (int)(c->n_cols / c->k->block);
    if (c->dot8 && start % 8) { /* a chunk that starts inside a group (after a matrix of other rows) */
        const int64_t g = start - start % 8, hi = g + 8 < end ? g + 8 : end;
        x8_rows(c, nb, g, start, hi);
        start = hi;
    }
    if (c->n_x == 1 && !c->dot8) {
        rows_streamed(c->dot, c->w, c->row_bytes, c->xq, nb, c->y, start, end);
        return;
    }
#ifdef GC_X86
    const int type = c->k->type;
    if (c->xb) {
        uint16_t *strip = (uint16_t *)scratch(4, 64 * (size_t)(c->n_cols + 32));
        if (strip) {
            amx_rows(type, c->w, c->row_bytes, c->n_cols, c->xb, c->n_x, c->y, c->y_stride, start, end, strip);
            return;
        }
    }
    if (c->xv) {
        uint8_t *strip = scratch(4, vnni_strip_bytes(c->n_cols));
        if (strip) {
            vnni_rows(type, c->w, c->row_bytes, c->n_cols, c->xv, c->n_x, c->y, c->y_stride, start, end, strip);
            return;
        }
    }
    if (c->xf) {
        float *strip = (float *)scratch(4, fstrip_bytes(c->n_cols));
        if (strip) {
            fstrip_rows(type, c->w, c->row_bytes, c->n_cols, c->xf, c->n_x, c->y, c->y_stride, start, end, strip);
            return;
        }
    }
    const int64_t n_tiles = (end - start) / 8 < TILE_GROUP ? (end - start) / 8 : TILE_GROUP;
    uint8_t *t = n_tiles && tiled(type, c->n_x) ? tile_scratch(type, nb, n_tiles) : NULL;
    const size_t tb = tile_bytes(type, nb);
    /* a group of tiles is packed once, then met by the activation rows a cache-sized run at a time */
    int64_t run = (int64_t)(TILE_X_BYTES / c->xq_row_bytes) / 4 * 4;
    if (run < 16) run = 16;
    while (t && start + 8 <= end) {
        const int64_t nt = (end - start) / 8 < n_tiles ? (end - start) / 8 : n_tiles;
        for (int64_t j = 0; j < nt; j++) tile_pack(type, c->w + (start + 8 * j) * c->row_bytes, c->row_bytes, nb, t + j * tb);
        for (int64_t b0 = 0; b0 < c->n_x; b0 += run) {
            const int64_t b1 = b0 + run < c->n_x ? b0 + run : c->n_x;
            for (int64_t j = 0; j < nt; j++)
                for (int64_t b = b0; b < b1; b += 4) {
                    const void *xs[4];
                    for (int l = 0; l < 4; l++) /* past the last activation row: the last again, discarded */
                        xs[l] = c->xq + (b + l < b1 ? b + l : b1 - 1) * c->xq_row_bytes;
                    float o[4][8];
                    tile_dot(type, t + j * tb, nb, xs, o);
                    for (int l = 0; l < 4 && b + l < b1; l++)
                        for (int k = 0; k < 8; k++) c->y[(b + l) * c->y_stride + start + 8 * j + k] = o[l][k];
                }
        }
        start += 8 * nt;
    }
#endif
    if (c->dot8) {
        for (int64_t g = start; g < end; g += 8) x8_rows(c, nb, g, g, g + 8 < end ? g + 8 : end);
        return;
    }
    const dot4_fn dot4 = (dot4_fn)c->dot4;
    for (int64_t r = start; r < end; r++) {
        const uint8_t *wr = c->w + r * c->row_bytes;
        int64_t b = 0;
        if (c->dotx8)
            for (; b + 8 <= c->n_x; b += 8) {
                float o[8];
                c->dotx8(wr, c->x8 + (b / 8) * nb, nb, o);
                for (int j = 0; j < 8; j++) c->y[(b + j) * c->y_stride + r] = o[j];
            }
        if (dot4)
            for (; b + 4 <= c->n_x; b += 4) {
                float o[4];
                const uint8_t *x0 = c->xq + b * c->xq_row_bytes;
                const void *xs[4] = {x0, x0 + c->xq_row_bytes, x0 + 2 * c->xq_row_bytes, x0 + 3 * c->xq_row_bytes};
                dot4(wr, xs, nb, o);
                for (int j = 0; j < 4; j++) c->y[(b + j) * c->y_stride + r] = o[j];
            }
        for (; b < c->n_x; b++) c->y[b * c->y_stride + r] = c->dot(wr, c->xq + b * c->xq_row_bytes, nb);
    }
}

typedef struct {
    const float *x;
    int64_t n_cols;
    uint8_t *xq;
    size_t xq_row_bytes;
    int act256;
} q_ctx;

static void quant_task(void *vctx, int64_t start, int64_t end) {
    const q_ctx *c = vctx;
    for (int64_t b = start; b < end; b++) {
        const float *x = c->x + b * c->n_cols;
        uint8_t *xq = c->xq + b * c->xq_row_bytes;
        if (c->act256 == ACT_F32) { /* the float types read the activations as they are */
            memcpy(xq, x, (size_t)c->n_cols * sizeof(float));
            continue;
        }
#ifdef GC_X86
        const int isa = gc_isa();
        if (isa >= ISA_AVX512) {
            if (c->act256) quantize_act256_avx512(x, (act256 *)xq, c->n_cols);
            else quantize_act32_avx512(x, (act32 *)xq, c->n_cols);
            continue;
        }
        if (isa >= ISA_AVX2) {
            if (c->act256) quantize_act256_avx2(x, (act256 *)xq, c->n_cols);
            else quantize_act32_avx2(x, (act32 *)xq, c->n_cols);
            continue;
        }
#endif
        if (c->act256) quantize_act256(x, (act256 *)xq, c->n_cols);
        else quantize_act32(x, (act32 *)xq, c->n_cols);
    }
}

static size_t act_row_bytes(const kernel_t *k, int64_t n_cols) {
    if (k->act256 == ACT_F32) return (size_t)n_cols * sizeof(float);
    return k->act256 ? (size_t)(n_cols / QK_K) * sizeof(act256) : (size_t)(n_cols / 32) * sizeof(act32);
}

int gc_mul_mat_multi(int n, const int *types, const void *const *ws, const int64_t *n_rows, int64_t n_cols,
                     const float *x, int64_t n_x, float *y, int n_threads);

/* y[n_x, n_rows] = x[n_x, n_cols] · W[n_rows, n_cols]^T for packed W; returns a gc_status (GC_OK on success) */
int gc_mul_mat(int type, const void *w, int64_t n_rows, int64_t n_cols, const float *x, int64_t n_x, float *y,
               int n_threads) {
    return gc_mul_mat_multi(1, &type, &w, &n_rows, n_cols, x, n_x, y, n_threads);
}

/* Several packed matrices that read the same input (q/k/v, gate/up) in one call: x is
 * quantized once per activation format, and the rows of all matrices are one work list.
 * Matrix m's outputs are columns [sum(n_rows[:m]), +n_rows[m]) of y[n_x, sum(n_rows)]. */
typedef struct {
    int n;
    const mm_ctx *mats;
    const int64_t *first; /* first global row of each matrix, and the total at [n] */
} multi_ctx;

static void multi_task(void *vctx, int64_t start, int64_t end) {
    const multi_ctx *c = vctx;
    for (int m = 0; m < c->n && start < end; m++) {
        const int64_t lo = c->first[m], hi = c->first[m + 1];
        if (start >= hi) continue;
        const int64_t e = end < hi ? end : hi;
        mm_task((void *)&c->mats[m], start - lo, e - lo);
        start = e;
    }
}

#define MAX_MULTI 8

int gc_mul_mat_multi(int n, const int *types, const void *const *ws, const int64_t *n_rows, int64_t n_cols,
                     const float *x, int64_t n_x, float *y, int n_threads) {
    if (n < 1 || n > MAX_MULTI) return GC_UNSUPPORTED;
    const kernel_t *ks[MAX_MULTI];
    int64_t first[MAX_MULTI + 1];
    first[0] = 0;
    for (int m = 0; m < n; m++) {
        ks[m] = find(types[m]);
        if (!ks[m] || n_cols % ks[m]->block || (ks[m]->rows8 && n_rows[m] % 8)) return GC_UNSUPPORTED;
        first[m + 1] = first[m] + n_rows[m];
    }
    const int64_t total = first[n];
    /* the bfloat16 tiles of x where a matrix takes AMX */
    int amx[MAX_MULTI], any_amx = 0, vnni[MAX_MULTI], any_vnni = 0, any_float = 0;
    const uint16_t *xb = NULL;
    const uint8_t *xv = NULL;
    const float *xf = NULL;
    for (int m = 0; m < n; m++) {
#ifdef GC_X86
        amx[m] = on_amx(types[m], n_x, n_cols);
        vnni[m] = amx[m] ? 0 : on_vnni(types[m], n_x, n_cols);
#else
        amx[m] = vnni[m] = 0;
#endif
        any_amx |= amx[m];
        any_vnni |= vnni[m] == 1;
        any_float |= vnni[m] == 2;
    }
#ifdef GC_X86
    if (any_amx) {
        uint16_t *p = (uint16_t *)scratch(5, amx_act_bytes(n_x, n_cols));
        if (!p) return GC_NO_MEMORY;
        amx_act_pack(x, n_x, n_cols, p, n_threads);
        xb = p;
    }
#endif
    /* one quantized copy of x per activation format the other matrices need */
    uint8_t *xq[3] = {NULL, NULL, NULL};
    size_t xq_bytes[3] = {0, 0, 0};
    for (int m = 0; m < n; m++) {
        const int f = vnni[m] == 1 ? ACT256 : ks[m]->act256; /* VNNI's groups are made from act256 rows */
        if (xq[f] || amx[m] || vnni[m] == 2) continue;
        xq_bytes[f] = act_row_bytes(ks[m], n_cols);
        if (f == ACT_F32) { /* float32 as given */
            xq[f] = (uint8_t *)(uintptr_t)x;
            continue;
        }
        xq[f] = scratch(f, xq_bytes[f] * (size_t)n_x + 64);
        if (!xq[f]) return GC_NO_MEMORY;
        q_ctx qc = {x, n_cols, xq[f], xq_bytes[f], f};
        gc_parallel_for(n_threads, n_x, 1, quant_task, &qc);
    }
#ifdef GC_X86
    if (any_vnni) {
        uint8_t *p = scratch(6, vnni_act_bytes(n_x, n_cols));
        if (!p) return GC_NO_MEMORY;
        vnni_act_pack(xq[ACT256], xq_bytes[ACT256], n_x, n_cols, p, n_threads);
        xv = p;
    }
    if (any_float) {
        float *p = (float *)scratch(7, fstrip_act_bytes(n_x, n_cols));
        if (!p) return GC_NO_MEMORY;
        fstrip_act_pack(x, n_x, n_cols, p, n_threads);
        xf = p;
    }
#endif
    /* eight rows at a time where AVX-512 VNNI has a dot for it: the act32 rows regrouped once */
    const act32x8 *x8 = NULL;
#ifdef GC_X86
    if (g_x8 && xq[0] && n_x >= 8 && gc_isa() >= ISA_AVX512) {
        const int nb = (int)(n_cols / 32);
        act32x8 *p = (act32x8 *)scratch(3, sizeof(act32x8) * (size_t)nb * (size_t)(n_x / 8) + 64);
        if (!p) return GC_NO_MEMORY;
        p = (act32x8 *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
        for (int64_t g = 0; g < n_x / 8; g++) pack_x8(xq[0] + 8 * g * xq_bytes[0], xq_bytes[0], nb, p + g * nb);
        x8 = p;
    }
#endif
    mm_ctx mats[MAX_MULTI];
    for (int m = 0; m < n; m++) {
        const kernel_t *k = ks[m];
        const int64_t nb = n_cols / k->block;
        dotx8_fn dx8 = NULL;
#ifdef GC_X86
        if (x8 && !k->rows8 && k->act256 == ACT32) dx8 = dotx8_for(k->type);
#endif
        mats[m] = (mm_ctx){k, pick(k), ws[m], (int64_t)(nb * k->bytes), n_rows[m], n_cols, n_x, xq[k->act256],
                           xq_bytes[k->act256], y + first[m], total, pick4(k), pick8(k), dx8, x8, amx[m] ? xb : NULL,
                           vnni[m] == 1 ? xv : NULL, vnni[m] == 2 ? xf : NULL};
    }
    multi_ctx mc = {n, mats, first};
    int64_t chunk = total / (8 * (n_threads > 0 ? n_threads : 1));
    if (chunk < 16) chunk = 16;
    const int64_t whole = any_amx ? 32 : 8; /* whole tiles of eight rows where the type has them; AMX strips of 32 */
    chunk = (chunk + whole - 1) / whole * whole;
    gc_parallel_for(n_threads, total, chunk, multi_task, &mc);
    return GC_OK;
}

/* ---------------------------------------------------------- mul_mat_id */

/* Selections grouped by expert: group g is expert gexp[g] with the slots (t * n_k + k)
 * slot[gstart[g] .. gstart[g + 1]). Work items are (group, weight row) pairs, so each
 * expert row is read once for all the tokens that chose that expert. */
typedef struct {
    dot_fn dot;
    int nb;
    const uint8_t *w;
    int64_t row_bytes, expert_bytes, n_rows, n_k;
    const int64_t *gexp, *gstart, *slot;
    const uint8_t *xq;
    size_t xq_row_bytes;
    int x_per_slot;
    float *y;
    int64_t ldy; /* y's row stride (n_rows, or more when two matrices share the rows) */
    const void *dot4;
    int type; /* experts chosen by many tokens take the tiles where this type has them */
    dot8_fn dot8; /* a repacked type's eight-row dot (then dot is NULL) */
} mmid_ctx;

#ifdef GC_X86
/* rows [r, r + 8) of expert group g (at `rows`) for all its tokens: packed as a tile into
 * `t`, met by the tokens four at a time */
static void mmid_tile(const mmid_ctx *c, int64_t g, const uint8_t *rows, int64_t r, void *t) {
    const int64_t n_sel = c->gstart[g + 1] - c->gstart[g];
    tile_pack(c->type, rows, c->row_bytes, c->nb, t);
    for (int64_t j = 0; j < n_sel; j += 4) {
        const void *xs[4];
        int64_t sl[4];
        for (int l = 0; l < 4; l++) { /* past the last token: the last again, discarded */
            sl[l] = c->slot[c->gstart[g] + (j + l < n_sel ? j + l : n_sel - 1)];
            xs[l] = c->xq + (c->x_per_slot ? sl[l] : sl[l] / c->n_k) * c->xq_row_bytes;
        }
        float o[4][8];
        tile_dot(c->type, t, c->nb, xs, o);
        for (int l = 0; l < 4 && j + l < n_sel; l++)
            for (int k = 0; k < 8; k++) c->y[sl[l] * c->ldy + r + k] = o[l][k];
    }
}
#endif

/* rows [r0, r1) of expert group g for its tokens, a repacked type: eight rows at a time by
 * its eight-row dot, or its tiles for many tokens */
static void mmid_rows8(const mmid_ctx *c, int64_t g, int64_t r0, int64_t r1) {
    const uint8_t *we = c->w + c->gexp[g] * c->expert_bytes;
    int64_t r = r0 - r0 % 8;
#ifdef GC_X86
    const int64_t n_sel = c->gstart[g + 1] - c->gstart[g];
    void *t = r0 % 8 == 0 && tiled(c->type, n_sel) ? tile_scratch(c->type, c->nb, 1) : NULL;
    for (; t && r + 8 <= r1; r += 8) mmid_tile(c, g, we + r * c->row_bytes, r, t);
#endif
    for (; r < r1; r += 8)
        for (int64_t j = c->gstart[g]; j < c->gstart[g + 1]; j++) {
            const int64_t s = c->slot[j];
            const uint8_t *xq = c->xq + (c->x_per_slot ? s : s / c->n_k) * c->xq_row_bytes;
            float *y = c->y + s * c->ldy;
            if (r >= r0 && r + 8 <= r1) {
                c->dot8(we + r * c->row_bytes, xq, c->nb, y + r);
                continue;
            }
            float o[8]; /* a chunk's edge inside a group */
            c->dot8(we + r * c->row_bytes, xq, c->nb, o);
            for (int64_t k = r < r0 ? r0 : r; k < r + 8 && k < r1; k++) y[k] = o[k - r];
        }
}

static void mmid_task(void *vctx, int64_t start, int64_t end) {
    const mmid_ctx *c = vctx;
    while (start < end) {
        const int64_t g = start / c->n_rows, r0 = start % c->n_rows;
        const int64_t r1 = end - g * c->n_rows < c->n_rows ? end - g * c->n_rows : c->n_rows;
        const uint8_t *we = c->w + c->gexp[g] * c->expert_bytes;
        if (c->dot8) {
            mmid_rows8(c, g, r0, r1);
        } else if (c->gstart[g + 1] - c->gstart[g] == 1) { /* one token chose this expert: stream its rows */
            const int64_t s = c->slot[c->gstart[g]];
            const uint8_t *xq = c->xq + (c->x_per_slot ? s : s / c->n_k) * c->xq_row_bytes;
            rows_streamed(c->dot, we, c->row_bytes, xq, c->nb, c->y + s * c->ldy, r0, r1);
        } else {
            const dot4_fn dot4 = (dot4_fn)c->dot4;
            int64_t r = r0;
#ifdef GC_X86
            const int64_t n_sel = c->gstart[g + 1] - c->gstart[g];
            void *t = tiled(c->type, n_sel) ? tile_scratch(c->type, c->nb, 1) : NULL;
            for (; t && r + 8 <= r1; r += 8) mmid_tile(c, g, we + r * c->row_bytes, r, t); /* as mm_task */
#endif
            for (; r < r1; r++) {
                const uint8_t *wr = we + r * c->row_bytes;
                int64_t j = c->gstart[g];
                if (dot4)
                    for (; j + 4 <= c->gstart[g + 1]; j += 4) {
                        const void *xs[4];
                        float o[4];
                        for (int l = 0; l < 4; l++) {
                            const int64_t s = c->slot[j + l];
                            xs[l] = c->xq + (c->x_per_slot ? s : s / c->n_k) * c->xq_row_bytes;
                        }
                        dot4(wr, xs, c->nb, o);
                        for (int l = 0; l < 4; l++) c->y[c->slot[j + l] * c->ldy + r] = o[l];
                    }
                for (; j < c->gstart[g + 1]; j++) {
                    const int64_t s = c->slot[j];
                    const uint8_t *xq = c->xq + (c->x_per_slot ? s : s / c->n_k) * c->xq_row_bytes;
                    c->y[s * c->ldy + r] = c->dot(wr, xq, c->nb);
                }
            }
        }
        start = g * c->n_rows + r1;
    }
}

typedef struct {
    const mmid_ctx *m;
    int n;
    int64_t items; /* per matrix */
} mmid_multi_ctx;

static void mmid_multi_task(void *vctx, int64_t start, int64_t end) {
    const mmid_multi_ctx *c = vctx;
    while (start < end) { /* a chunk may run from one matrix's items into the next's */
        const int i = (int)(start / c->items);
        const int64_t stop = (i + 1) * c->items < end ? (i + 1) * c->items : end;
        mmid_task((void *)&c->m[i], start - i * c->items, stop - i * c->items);
        start = stop;
    }
}

/* The body of gc_mul_mat_id and gc_mul_mat_id2: n (1 or 2) expert tensors of the same
 * shape and activation format read the same x with the same ids; matrix m's rows land in
 * columns [m n_rows, (m + 1) n_rows) of y (n_tokens * n_k, n * n_rows). */
static int mul_mat_id_n(int n, const int *types, const void *const *ws, int64_t n_experts, int64_t n_rows,
                        int64_t n_cols, const float *x, int x_per_slot, const int64_t *ids, int64_t n_tokens,
                        int64_t n_k, float *y, int n_threads) {
    const kernel_t *ks[2];
    for (int m = 0; m < n; m++) {
        ks[m] = find(types[m]);
        if (!ks[m] || (ks[m]->rows8 && n_rows % 8) || n_cols % ks[m]->block || ks[m]->act256 != ks[0]->act256 ||
            ks[m]->block != ks[0]->block)
            return GC_UNSUPPORTED;
    }
    const kernel_t *k = ks[0];
    const int64_t n_slots = n_tokens * n_k;
    for (int64_t s = 0; s < n_slots; s++)
        if (ids[s] < 0 || ids[s] >= n_experts) return GC_BAD_EXPERT;
    const int64_t nb = n_cols / k->block, n_x = x_per_slot ? n_slots : n_tokens;
    const size_t xq_row_bytes = act_row_bytes(k, n_cols);
    uint8_t *xq = malloc(xq_row_bytes * (size_t)n_x + 64);
    int64_t *count = calloc((size_t)n_experts, sizeof(int64_t));
    int64_t *gexp = malloc(sizeof(int64_t) * (size_t)(n_slots + 1)), *gstart = malloc(sizeof(int64_t) * (size_t)(n_slots + 2));
    int64_t *slot = malloc(sizeof(int64_t) * (size_t)(n_slots + 1)), *fill = malloc(sizeof(int64_t) * (size_t)(n_experts + 1));
    int rc = GC_OK;
    if (!xq || !count || !gexp || !gstart || !slot || !fill) { rc = GC_NO_MEMORY; goto done; }
    q_ctx qc = {x, n_cols, xq, xq_row_bytes, k->act256};
    gc_parallel_for(n_threads, n_x, 1, quant_task, &qc);
    for (int64_t s = 0; s < n_slots; s++) count[ids[s]]++;
    int64_t n_groups = 0, pos = 0;
    for (int64_t e = 0; e < n_experts; e++) {
        fill[e] = pos;
        if (count[e]) { gexp[n_groups] = e; gstart[n_groups++] = pos; pos += count[e]; }
    }
    gstart[n_groups] = pos;
    for (int64_t s = 0; s < n_slots; s++) slot[fill[ids[s]]++] = s;
    mmid_ctx c[2];
    for (int m = 0; m < n; m++) {
        const int64_t row_bytes = nb * (int64_t)ks[m]->bytes;
        c[m] = (mmid_ctx){pick(ks[m]), (int)nb, ws[m], row_bytes, row_bytes * n_rows, n_rows, n_k, gexp, gstart,
                          slot, xq, xq_row_bytes, x_per_slot, y + m * n_rows, n * n_rows, pick4(ks[m]),
                          ks[m]->type, pick8(ks[m])};
    }
    const int64_t items = n_groups * n_rows;
    int64_t chunk = n * items / (8 * (n_threads > 0 ? n_threads : 1));
    if (chunk < 16) chunk = 16;
    chunk = (chunk + 7) / 8 * 8; /* whole tiles of eight rows */
    mmid_multi_ctx mc = {c, n, items};
    gc_parallel_for(n_threads, n * items, chunk, mmid_multi_task, &mc);
done:
    free(xq); free(count); free(gexp); free(gstart); free(slot); free(fill);
    return rc;
}

/* Mixture-of-experts product: y[t, k, :] = x_t · W[ids[t, k]]^T, W being n_experts packed
 * (n_rows, n_cols) matrices one after another; x is (n_tokens, n_cols), or with
 * x_per_slot (n_tokens, n_k, n_cols), one row per selection. GC_OK, or GC_BAD_EXPERT for an
 * expert index out of range. */
int gc_mul_mat_id(int type, const void *w, int64_t n_experts, int64_t n_rows, int64_t n_cols, const float *x,
                  int x_per_slot, const int64_t *ids, int64_t n_tokens, int64_t n_k, float *y, int n_threads) {
    return mul_mat_id_n(1, &type, &w, n_experts, n_rows, n_cols, x, x_per_slot, ids, n_tokens, n_k, y, n_threads);
}

/* Two expert tensors that read the same x (an MoE's gate and up) in one call: x quantized
 * once, both matrices' rows one work list; y (n_tokens * n_k, 2 n_rows), a's outputs
 * first. GC_UNSUPPORTED where the two types quantize activations differently (then call one by one). */
int gc_mul_mat_id2(int type_a, const void *wa, int type_b, const void *wb, int64_t n_experts, int64_t n_rows,
                   int64_t n_cols, const float *x, const int64_t *ids, int64_t n_tokens, int64_t n_k, float *y,
                   int n_threads) {
    const int types[2] = {type_a, type_b};
    const void *ws[2] = {wa, wb};
    return mul_mat_id_n(2, types, ws, n_experts, n_rows, n_cols, x, 0, ids, n_tokens, n_k, y, n_threads);
}

typedef struct {
    const kernel_t *k;
    const uint8_t *w;
    int64_t row_bytes, n_cols;
    float *y;
} dq_ctx;

static void dq_task(void *vctx, int64_t start, int64_t end) {
    const dq_ctx *c = vctx;
    const int nb = (int)(c->n_cols / c->k->block);
    for (int64_t r = start; r < end; r++)
        if (c->k->rows8) c->k->deq8(c->w + 8 * r * c->row_bytes, c->y + 8 * r * c->n_cols, nb, c->n_cols);
        else c->k->deq(c->w + r * c->row_bytes, c->y + r * c->n_cols, nb);
}

/* y[n_rows, n_cols] = the float values of packed W; returns a gc_status (GC_OK on success) */
int gc_dequantize(int type, const void *w, int64_t n_rows, int64_t n_cols, float *y, int n_threads) {
    const kernel_t *k = find(type);
    if (!k || n_cols % k->block || (k->rows8 && n_rows % 8)) return GC_UNSUPPORTED;
    dq_ctx c = {k, w, (int64_t)(n_cols / k->block * k->bytes), n_cols, y};
    /* work items: rows, or groups of eight rows for a repacked type */
    gc_parallel_for(n_threads, k->rows8 ? n_rows / 8 : n_rows, k->rows8 ? 1 : 8, dq_task, &c);
    return GC_OK;
}
