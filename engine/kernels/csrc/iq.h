/* The codebook, ternary and 1-/2-bit types (IQ1_S .. IQ3_S, TQ1_0, TQ2_0, Q1_0, Q2_0) and
 * the float files' F16 and BF16, as the kernels read them. Every such block comes apart
 * the same way: a group of 32 weights as signed bytes (four 8-byte words, weight 8k + j in
 * byte j of word k), the integer scales of its two halves of 16, and one float factor for
 * the block, so that weight = factor x scale x byte, exactly (each is a small integer
 * times the file's half-precision scale). The expanders below (iqx_*, one per type, plain
 * C on 64-bit words) are what every ISA's dots and the tiles are built on; the integer sum
 * of a block is the same on every ISA, and the float work (factor x activation scale x
 * sum, in block order) is written once, so every ISA and the one- and four-row dots give
 * the same bits. Not part of the library's ABI. */
#ifndef GC_IQ_H
#define GC_IQ_H

#include "quants.h"

enum {
    T_F16 = 1, T_IQ2_XXS = 16, T_IQ2_XS = 17, T_IQ3_XXS = 18, T_IQ1_S = 19, T_IQ3_S = 21, T_IQ2_S = 22,
    T_IQ1_M = 29, T_BF16 = 30, T_TQ1_0 = 34, T_TQ2_0 = 35, T_Q1_0 = 41, T_Q2_0 = 42,
};

typedef struct { uint16_t d; uint16_t qs[32]; } blk_iq2_xxs;
typedef struct { uint16_t d; uint16_t qs[32]; uint8_t scales[8]; } blk_iq2_xs;
typedef struct { uint16_t d; uint8_t qs[32]; uint8_t signs[32]; uint8_t qh[8]; uint8_t scales[8]; } blk_iq2_s;
typedef struct { uint16_t d; uint8_t qs[64]; uint8_t ss[32]; } blk_iq3_xxs;
typedef struct { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; } blk_iq3_s;
typedef struct { uint16_t d; uint8_t qs[32]; uint16_t qh[8]; } blk_iq1_s;
typedef struct { uint8_t qs[32]; uint8_t qh[16]; uint16_t sc[4]; } blk_iq1_m;
typedef struct { uint8_t qs[48]; uint8_t qh[4]; uint16_t d; } blk_tq1_0;
typedef struct { uint8_t qs[64]; uint16_t d; } blk_tq2_0;
typedef struct { uint16_t d; uint8_t qs[16]; } blk_q1_0; /* 128 weights, one bit each: -d or +d */
typedef struct { uint16_t d; uint8_t qs[16]; } blk_q2_0; /* 64 weights, two bits each: (q - 1) d */

/* iq_tables.c: the codebooks, and bytes of 0xff where a sign bit is set (ksigns_mask: seven
 * bits and their parity, as ggml's ksigns_iq2xs; bits_mask: the eight bits of a byte) */
GC_HIDDEN extern const uint64_t grid_iq2xxs[256], grid_iq2xs[512], grid_iq2s[1024], grid_iq1s[2048];
GC_HIDDEN extern const uint32_t grid_iq3xxs[256], grid_iq3s[512];
GC_HIDDEN extern const uint64_t ksigns_mask[128], bits_mask[256];
GC_HIDDEN extern const uint8_t ksigns_byte[128]; /* the eight sign bits ksigns_mask spreads */
GC_HIDDEN extern const uint32_t q2_0_bytes[256]; /* a Q2_0 byte as its four weights' q - 1 */

/* 32 weights: v[k] byte j = weight 8k + j; s[h] the integer scale of weights 16h .. 16h + 15 */
typedef struct { uint64_t v[4]; int s[2]; } iq_group;

static inline uint64_t ld64(const void *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t ld32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }
#define BYTES01 0x0101010101010101ull
/* g's bytes negated where m's are 0xff (no byte of g is 0, so no borrow crosses a byte) */
static inline uint64_t neg_where(uint64_t g, uint64_t m) { return (g ^ m) + (m & BYTES01); }
/* a + b byte by byte (mod 256, no carry between bytes) */
static inline uint64_t add8(uint64_t a, uint64_t b) {
    const uint64_t h = 0x8080808080808080ull;
    return ((a & ~h) + (b & ~h)) ^ ((a ^ b) & h);
}

/* the block's float factor */
static inline float iqd_iq2_xxs(const void *b) { return h2f(((const blk_iq2_xxs *)b)->d) * 0.125f; }
static inline float iqd_iq2_xs(const void *b) { return h2f(((const blk_iq2_xs *)b)->d) * 0.125f; }
static inline float iqd_iq2_s(const void *b) { return h2f(((const blk_iq2_s *)b)->d) * 0.125f; }
static inline float iqd_iq3_xxs(const void *b) { return h2f(((const blk_iq3_xxs *)b)->d) * 0.25f; }
static inline float iqd_iq3_s(const void *b) { return h2f(((const blk_iq3_s *)b)->d); }
static inline float iqd_iq1_s(const void *b) { return h2f(((const blk_iq1_s *)b)->d) * 0.125f; }
static inline float iqd_iq1_m(const void *b) {
    const uint16_t *sc = ((const blk_iq1_m *)b)->sc;
    return h2f((uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000))) * 0.125f;
}
static inline float iqd_tq1_0(const void *b) { return h2f(((const blk_tq1_0 *)b)->d); }
static inline float iqd_tq2_0(const void *b) { return h2f(((const blk_tq2_0 *)b)->d); }

/* The sign-and-grid types, group g (weights 32g ..) of a block apart: the grid points as
 * unsigned bytes, their signs as 32 bits (bit j: weight j negative), the halves' scales
 * (2s + 1 of the eighths (IQ2) or quarters (IQ3_XXS) of d; 1 + 2s of d for IQ3_S). The x86
 * dots put the signs on the activations (iqs_*); everything else takes the signed bytes
 * (iqx_*, from the same). */
typedef struct { uint64_t g[4]; uint32_t sg; int s[2]; } iq_split;

/* seven sign bits and their parity as the eighth, four times (ggml's ksigns_iq2xs) */
static inline uint32_t ksigns4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    return ksigns_byte[a] | (uint32_t)ksigns_byte[b] << 8 | (uint32_t)ksigns_byte[c] << 16 | (uint32_t)ksigns_byte[d] << 24;
}

static inline void iqs_iq2_xxs(const void *vb, int g, iq_split *o) {
    const blk_iq2_xxs *b = vb;
    const uint32_t idx = ld32(b->qs + 4 * g), sg = ld32(b->qs + 4 * g + 2);
    for (int l = 0; l < 4; l++) o->g[l] = grid_iq2xxs[(idx >> 8 * l) & 255];
    o->sg = ksigns4(sg & 127, (sg >> 7) & 127, (sg >> 14) & 127, (sg >> 21) & 127);
    o->s[0] = o->s[1] = 2 * (int)(sg >> 28) + 1;
}

static inline void iqs_iq2_xs(const void *vb, int g, iq_split *o) {
    const blk_iq2_xs *b = vb;
    const uint16_t *q = b->qs + 4 * g;
    for (int l = 0; l < 4; l++) o->g[l] = grid_iq2xs[q[l] & 511];
    o->sg = ksigns4(q[0] >> 9, q[1] >> 9, q[2] >> 9, q[3] >> 9);
    o->s[0] = 2 * (b->scales[g] & 15) + 1;
    o->s[1] = 2 * (b->scales[g] >> 4) + 1;
}

static inline void iqs_iq2_s(const void *vb, int g, iq_split *o) {
    const blk_iq2_s *b = vb;
    for (int l = 0; l < 4; l++) o->g[l] = grid_iq2s[b->qs[4 * g + l] | ((b->qh[g] << (8 - 2 * l)) & 0x300)];
    o->sg = ld32(b->signs + 4 * g);
    o->s[0] = 2 * (b->scales[g] & 15) + 1;
    o->s[1] = 2 * (b->scales[g] >> 4) + 1;
}

static inline void iqs_iq3_xxs(const void *vb, int g, iq_split *o) {
    const blk_iq3_xxs *b = vb;
    const uint32_t sg = ld32(b->ss + 4 * g);
    const uint8_t *q = b->qs + 8 * g;
    for (int l = 0; l < 4; l++) o->g[l] = grid_iq3xxs[q[2 * l]] | (uint64_t)grid_iq3xxs[q[2 * l + 1]] << 32;
    o->sg = ksigns4(sg & 127, (sg >> 7) & 127, (sg >> 14) & 127, (sg >> 21) & 127);
    o->s[0] = o->s[1] = 2 * (int)(sg >> 28) + 1;
}

static inline void iqs_iq3_s(const void *vb, int g, iq_split *o) {
    const blk_iq3_s *b = vb;
    const uint8_t *q = b->qs + 8 * g;
    const unsigned h = b->qh[g];
    for (int l = 0; l < 4; l++) {
        const uint64_t lo = grid_iq3s[q[2 * l] | ((h << (8 - 2 * l)) & 0x100)];
        const uint64_t hi = grid_iq3s[q[2 * l + 1] | ((h << (7 - 2 * l)) & 0x100)];
        o->g[l] = lo | hi << 32;
    }
    o->sg = ld32(b->signs + 4 * g);
    o->s[0] = o->s[1] = 1 + 2 * ((b->scales[g / 2] >> (4 * (g % 2))) & 15);
}

/* the signed bytes of a split group (no grid byte is 0, see neg_where) */
#define IQX_FROM_SPLIT(t)                                                                            \
    static inline void iqx_##t(const void *vb, int g, iq_group *o) {                                \
        iq_split e;                                                                                  \
        iqs_##t(vb, g, &e);                                                                          \
        for (int l = 0; l < 4; l++) o->v[l] = neg_where(e.g[l], bits_mask[(e.sg >> 8 * l) & 255]);   \
        o->s[0] = e.s[0];                                                                            \
        o->s[1] = e.s[1];                                                                            \
    }
IQX_FROM_SPLIT(iq2_xxs)
IQX_FROM_SPLIT(iq2_xs)
IQX_FROM_SPLIT(iq2_s)
IQX_FROM_SPLIT(iq3_xxs)
IQX_FROM_SPLIT(iq3_s)

/* IQ1: grid points -1, 0, 1 plus a delta of +-1/8: bytes 8 g +- 1 on a factor of d / 8 */
static inline uint64_t iq1_bytes(uint64_t grid, unsigned negative) {
    /* the delta's bytes without a branch (its sign is random in a file): -1 or 1 */
    return add8((grid << 3) & 0xF8F8F8F8F8F8F8F8ull, (0 - (uint64_t)(negative != 0)) | BYTES01);
}

/* an IQ1 group apart: the grid points (bytes -1, 0, 1), bit l of neg set where the delta
 * of weights 8l .. 8l + 7 is negative, the halves' scales */
typedef struct { uint64_t g[4]; unsigned neg; int s[2]; } iq1_split;

static inline void iqs_iq1_s(const void *vb, int g, iq1_split *o) {
    const blk_iq1_s *b = vb;
    const unsigned h = b->qh[g];
    for (int l = 0; l < 4; l++) o->g[l] = grid_iq1s[b->qs[4 * g + l] | (((h >> 3 * l) & 7) << 8)];
    o->neg = h & 0x8000 ? 15 : 0;
    o->s[0] = o->s[1] = 2 * (int)((h >> 12) & 7) + 1;
}

static inline void iqs_iq1_m(const void *vb, int g, iq1_split *o) {
    const blk_iq1_m *b = vb;
    const unsigned q = b->qh[2 * g] | (unsigned)b->qh[2 * g + 1] << 8; /* four nibbles: 3 index bits, the delta's sign */
    for (int l = 0; l < 4; l++) o->g[l] = grid_iq1s[b->qs[4 * g + l] | (((q >> 4 * l) & 7) << 8)];
    o->neg = ((q >> 3) & 1) | ((q >> 6) & 2) | ((q >> 9) & 4) | ((q >> 12) & 8);
    const unsigned sc = b->sc[g / 2] >> (6 * (g % 2)); /* the scales of halves 2g, 2g + 1 */
    o->s[0] = 2 * (int)(sc & 7) + 1;
    o->s[1] = 2 * (int)((sc >> 3) & 7) + 1;
}

#define IQ1X_FROM_SPLIT(t)                                                                           \
    static inline void iqx_##t(const void *vb, int g, iq_group *o) {                                \
        iq1_split e;                                                                                 \
        iqs_##t(vb, g, &e);                                                                          \
        for (int l = 0; l < 4; l++) o->v[l] = iq1_bytes(e.g[l], e.neg & (1u << l));                 \
        o->s[0] = e.s[0];                                                                            \
        o->s[1] = e.s[1];                                                                            \
    }
IQ1X_FROM_SPLIT(iq1_s)
IQ1X_FROM_SPLIT(iq1_m)

/* TQ2_0: weight 128h + 32s + m is bits 2s.. of qs[32h + m], minus 1 */
static inline void iqx_tq2_0(const void *vb, int g, iq_group *o) {
    const blk_tq2_0 *b = vb;
    const int h = g / 4, s = g % 4;
    for (int l = 0; l < 4; l++) o->v[l] = add8((ld64(b->qs + 32 * h + 8 * l) >> 2 * s) & 0x0303030303030303ull, ~0ull);
    o->s[0] = o->s[1] = 1;
}

/* TQ1_0: five (qs) or four (qh) base-3 digits a byte as ggml's fixed-point fractions: digit
 * j of byte q is (uint8(q 3^j) x 3) >> 8, minus 1. Weights 32j + m of qs[m] (m < 32, groups
 * 0-4), 160 + 16j + m of qs[32 + m] (groups 5-7), 240 + 4j + m of qh[m]. */
static const uint8_t pow3[5] = {1, 3, 9, 27, 81};

/* digit j of each of the eight bytes of w, minus 1, in 16-bit lanes (q 3^j < 2^16, x 3 too) */
static inline uint64_t trits8(uint64_t w, int j) {
    const uint64_t lo = 0x00FF00FF00FF00FFull;
    const uint64_t e = (((w & lo) * pow3[j]) & lo) * 3, o = ((((w >> 8) & lo) * pow3[j]) & lo) * 3;
    return add8(((e >> 8) & lo) | (o & ~lo), ~0ull);
}

static inline void iqx_tq1_0(const void *vb, int g, iq_group *o) {
    const blk_tq1_0 *b = vb;
    if (g < 5) {
        for (int l = 0; l < 4; l++) o->v[l] = trits8(ld64(b->qs + 8 * l), g);
    } else {
        const int j0 = 2 * (g - 5);
        const uint64_t a = ld64(b->qs + 32), c = ld64(b->qs + 40);
        o->v[0] = trits8(a, j0);
        o->v[1] = trits8(c, j0);
        if (g < 7) {
            o->v[2] = trits8(a, j0 + 1);
            o->v[3] = trits8(c, j0 + 1);
        } else { /* qh: digit j of its four bytes are weights 240 + 4j .. */
            const uint64_t h = ld32(b->qh), m32 = 0xFFFFFFFFull;
            o->v[2] = (trits8(h, 0) & m32) | trits8(h, 1) << 32;
            o->v[3] = (trits8(h, 2) & m32) | trits8(h, 3) << 32;
        }
    }
    o->s[0] = o->s[1] = 1;
}

/* Q1_0 and Q2_0 meet 32-weight activation blocks: group g of the block (scales 1) */
static inline void iqx_q1_0(const void *vb, int g, iq_group *o) {
    const blk_q1_0 *b = vb;
    for (int l = 0; l < 4; l++) o->v[l] = ~bits_mask[b->qs[4 * g + l]] | BYTES01; /* bit set: +1, else -1 */
    o->s[0] = o->s[1] = 1;
}

static inline void iqx_q2_0(const void *vb, int g, iq_group *o) {
    const blk_q2_0 *b = vb;
    for (int l = 0; l < 4; l++) o->v[l] = q2_0_bytes[b->qs[8 * g + 2 * l]] | (uint64_t)q2_0_bytes[b->qs[8 * g + 2 * l + 1]] << 32;
    o->s[0] = o->s[1] = 1;
}

/* the types built on the expanders: X(name, block struct) for the 256-weight ones (act256);
 * the codebook ones (GC_GRID_TYPES) on them on x86 too, the ternary ones there in vectors */
#define GC_SPLIT_TYPES(X) X(iq2_xxs, blk_iq2_xxs) X(iq2_xs, blk_iq2_xs) X(iq2_s, blk_iq2_s) X(iq3_xxs, blk_iq3_xxs) \
    X(iq3_s, blk_iq3_s)
#define GC_GRID_TYPES(X) GC_SPLIT_TYPES(X) X(iq1_s, blk_iq1_s) X(iq1_m, blk_iq1_m)
#define GC_IQ_TYPES(X) GC_GRID_TYPES(X) X(tq1_0, blk_tq1_0) X(tq2_0, blk_tq2_0)
/* ...and the small-block ones, groups of 32 per activation block (act32): X(name, struct, groups) */
#define GC_B32_TYPES(X) X(q1_0, blk_q1_0, 4) X(q2_0, blk_q2_0, 2)
/* the float types, activations as float32 */
#define GC_FLOAT_TYPES(X) X(f16) X(bf16)

/* iquants.c: the scalar code; and the x86 one (arch/x86_iq.c) */
#define GC_IQ_PROTOS(t, B) GC_HIDDEN float dot_##t##_s(const void *, const void *, int); GC_HIDDEN void deq_##t(const void *, float *, int);
GC_IQ_TYPES(GC_IQ_PROTOS)
#define GC_B32_PROTOS(t, B, G) GC_IQ_PROTOS(t, B)
GC_B32_TYPES(GC_B32_PROTOS)
#define GC_F_PROTOS(t) GC_IQ_PROTOS(t, 0)
GC_FLOAT_TYPES(GC_F_PROTOS)
#if defined(GC_X86)
#define GC_IQ_X86(t, B) GC_HIDDEN float dot_##t##_avx2(const void *, const void *, int); \
    GC_HIDDEN float dot_##t##_avx512(const void *, const void *, int);                    \
    GC_HIDDEN void dot4_##t##_avx2(const void *, const void *const *, int, float *);      \
    GC_HIDDEN void dot4_##t##_avx512(const void *, const void *const *, int, float *);
GC_IQ_TYPES(GC_IQ_X86)
#define GC_B32_X86(t, B, G) GC_IQ_X86(t, B)
GC_B32_TYPES(GC_B32_X86)
#define GC_F_X86(t) GC_IQ_X86(t, 0)
GC_FLOAT_TYPES(GC_F_X86)
/* a block of a 256-weight type above as 256 signed bytes, 16 integer scales of 16 and the
 * float factor, for the tiles; 0 where the type has no such form */
GC_HIDDEN int iq_expand(int type, const void *blk, int8_t *q, int16_t *sc, float *d);
/* the largest |byte| iq_expand gives for a type, which the tiles add to make them unsigned */
GC_HIDDEN int iq_offset(int type);
#elif defined(GC_NEON)
#define GC_IQ_NEON(t, B) GC_HIDDEN float dot_##t##_neon(const void *, const void *, int);
GC_IQ_TYPES(GC_IQ_NEON)
#define GC_B32_NEON(t, B, G) GC_IQ_NEON(t, B)
GC_B32_TYPES(GC_B32_NEON)
#define GC_F_NEON(t) GC_IQ_NEON(t, 0)
GC_FLOAT_TYPES(GC_F_NEON)
#endif

#endif
