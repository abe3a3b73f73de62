/* What the attention's two sources share (attention.c: the layer, its q/k/v
 * preparation, decode's blocks and the entry point; attention_tiles.c: prompt chunks'
 * tiles): the layer as the Python side builds it, a batch's sequences, the work's
 * context. Not part of the library's ABI (gc_attn_layer's layout is: engine/kernels/
 * cpu_ops.py AttnLayer mirrors it). */
#ifndef GC_ATTENTION_H
#define GC_ATTENTION_H

#include "ops.h"

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

/* the sequence a work item belongs to (items are numbered sequence after sequence) */
GC_HIDDEN const attn_seq *item_seq(const attn_ctx *c, int64_t it);
/* attention_tiles.c: items of (sequence, kv head, tile of tokens), for many tokens a sequence */
#define AT_ROWS 128 /* rows of a tile, about (tokens x the group's heads): 64 ran 15 % slower, 256 5 % faster */
GC_HIDDEN void attn_tile_task(void *vctx, int64_t start, int64_t end);

#endif
