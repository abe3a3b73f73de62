/* A layer's attention over the engine's KV cache: per token and head, q/k RMSNorm and
 * rotary, k and v written into their cache cells, then the softmax over the cells each
 * token sees. Decode (a few tokens a sequence) here: the cells in blocks across threads
 * (flash-decoding), merged after; prompt chunks' tiles are attention_tiles.c's. The
 * torch twin is in engine/kernels/ops.py. */
#include "attention.h"

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

/* the sequence a work item belongs to (items are numbered sequence after sequence) */
const attn_seq *item_seq(const attn_ctx *c, int64_t it) {
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
