/* The attention of many queries per sequence (prompt chunks), one of gc_attention's two
 * ways (attention.c has the other and the entry point). */
#include "attention.h"

/* Attention of many queries per sequence (prompt chunks): items of (sequence, kv head,
 * tile of tokens), each over all the cells its tokens see, a block of AT_KB cells at a time
 * with an online softmax (flash attention). The tile's rows (token x query head of the kv
 * head's group) meet a block's keys as a small matrix product: keys converted from their
 * type and transposed once per block, scores for four rows and AT_KB cells held in
 * registers; then the values the same way. Blocks no token of the tile sees (after its
 * last position, or outside its window) are skipped. */

/* One item: a tile of a sequence's tokens (seqs[].blk tokens a tile, n_blocks tiles; the
 * last tiles, which see the most cells, come first) and the query heads of one kv head. */
void attn_tile_task(void *vctx, int64_t start, int64_t end) {
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
            A->scores(Q, Kt, P, Rp, d);
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
            A->pv(P, vr, d, O, Rp, nc, d);
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
