/* What the kernel sources share: the GGUF block formats they read, the activation
 * blocks they quantize to, the kernel table's entry, and each function one source defines
 * for another: the scalar code (quants.c), the Q5_0 eight-row layout (repack.c), the SIMD
 * code (arch/x86_avx2.c, arch/x86_avx512.c, arch/x86_tiles.c, arch/arm.c), the table and
 * the ISA choice (dispatch.c); matmul.c runs them over a matrix on the thread pool
 * (pool.c). Not part of the library's ABI. */
#ifndef GC_QUANTS_H
#define GC_QUANTS_H

#include "gc.h"

#define QK_K 256

enum {
    T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_IQ4_NL = 20, T_IQ4_XS = 23, T_MXFP4 = 39,
    T_Q5_0_X8 = 0x100 | T_Q5_0, /* Q5_0 repacked at load in groups of eight rows (gc_repack); not a file type */
    T_MXFP4_X8 = 0x100 | T_MXFP4, /* MXFP4 likewise */
};

/* ------------------------------------------------------------------ blocks */

typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } blk_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_1;
typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;
typedef struct { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } blk_q2_K;
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } blk_q3_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_K;
typedef struct { uint16_t d; uint8_t qs[16]; } blk_iq4_nl;
typedef struct { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; } blk_iq4_xs;
typedef struct { uint8_t e; uint8_t qs[16]; } blk_mxfp4; /* OCP MX: a power-of-two scale, 32 E2M1 values */

/* activations */
typedef struct { float d; float s; int8_t qs[32]; } act32;           /* s = d * sum(qs) */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[16]; } act256;
/* eight act32 rows' block i together (the eight-row dots): each row pair's scales
 * spread over 16 lanes (rows 2j, 2j + 1: eight lanes each), the block sums, the values */
typedef struct { float dx[4][16]; float s[8]; int8_t qs[8][32]; } act32x8;

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* the E2M1 values doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, times 2), so
 * that they are integers; the block scale is halved to match (e8m0_half) */
static const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* an E8M0 exponent byte as 2^(e - 127) / 2, exactly (e < 2: the float subnormals) */
static inline float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* the 32-block types whose values are signed (Q8_0's bytes, IQ4_NL's and MXFP4's tables): their
 * tiles take the sign trick, and AVX-512 VNNI's four-row dots beat those tiles up to more rows */
static inline int signed32(int type) { return type == T_Q8_0 || type == T_IQ4_NL || type == T_MXFP4; }

static inline float h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            man &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* bfloat16 bits as a float (exact: the top half of a float32) */
static inline float bf2f(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline int nearest(float v) { return (int)lrintf(v); }

/* Software prefetch: each SIMD dot asks for the bytes this far ahead of the block it
 * reads. Rows of a stream lie back to back, so the prefetches run on into the next row;
 * the hardware prefetchers alone stop at 4 KB pages and leave DRAM half used on long
 * rows (Q4_K 2560 x 9728 from DRAM, 2 threads: 13.8 -> 20.6 GB/s). */
#ifndef PREFETCH_LOCALITY
#define PREFETCH_LOCALITY 3
#endif
#ifndef PREFETCH_DIST
#define PREFETCH_DIST 2048
#endif

static inline void prefetch_ahead(const void *p, int bytes) {
    const char *c = (const char *)p + PREFETCH_DIST;
    for (int o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, PREFETCH_LOCALITY);
}

/* Q4_K/Q5_K: the eight 6-bit scales and mins as four words of four bytes */
static inline void k4_scales_mins(const uint8_t *q, uint32_t out[4]) {
    uint32_t a[3];
    memcpy(a, q, 12);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    out[0] = a[0] & m6;                                  /* scales 0-3 */
    out[1] = (a[2] & m4) | (((a[0] >> 6) & m2) << 4);    /* scales 4-7: low 4 bits, top 2 bits */
    out[2] = a[1] & m6;                                  /* mins 0-3 */
    out[3] = ((a[2] >> 4) & m4) | (((a[1] >> 6) & m2) << 4); /* mins 4-7 */
}

typedef void (*deq_fn)(const void *blocks, float *y, int nb);
typedef void (*dot8_fn)(const void *w, const void *x, int nb, float *out);
typedef void (*deq8_fn)(const void *w, float *y, int nb, int64_t n_cols);
typedef float (*dot_fn)(const void *, const void *, int);
/* four activation rows against one weight row: out[0..3] */
typedef void (*dot4_fn)(const void *w, const void *const *x, int nb, float *out);
/* eight activation rows (act32x8 blocks) against one weight row: out[0..7] */
typedef void (*dotx8_fn)(const void *w, const act32x8 *x, int nb, float *out);

/* ---------------------------------------- Q5_0 repacked in groups of eight rows
 * gc_repack turns the file's Q5_0 rows, eight at a time, into blk_q5_0x8: per 32-weight
 * block of the eight rows, the same 22 bytes a row as the file's blocks, so rows 8g..8g+7
 * keep their byte range. qs[32p + 4k + j] is row k's qs[4p + j] (weight 4p + j in the low
 * nibble, 16 + 4p + j in the high one: four weights of a row per 32-bit lane, the tiles'
 * layout), hb[4k + j] holds in bit g the fifth bit of row k's weight 4g + j, d[k] row k's
 * scale. A one-row product then takes eight rows per block in one pass (vpmaddubsw on
 * broadcast activation bytes, the float work once for the eight): Q5_0 1 x 640 dots in
 * L1, one thread, 17.9 -> 5.9 ns per 256 weights on the AVX2 (Zen 3) machine. */
typedef struct { uint16_t d[8]; uint8_t hb[32]; uint8_t qs[128]; } blk_q5_0x8;

/* MXFP4 in groups of eight rows, the same way: per 32-weight block of the eight rows their
 * exponent bytes e[k], and qs[32p + 4k + j] row k's qs[4p + j] (136 bytes, as the rows'
 * eight blocks). The one-row product then reads eight rows per block in one pass, the
 * table lookups, activation broadcasts and float work shared (gpt-oss's experts). */
typedef struct { uint8_t e[8]; uint8_t qs[128]; } blk_mxfp4x8;
/* kvalues_mxfp4 + 12: unsigned for vpmaddubsw, the offset through the activation block sums */
static const int8_t kvalues_mxfp4_u[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/* the activation formats: 8-bit blocks of 32 (act32) or 256 (act256), or float32 as given */
enum { ACT32 = 0, ACT256 = 1, ACT_F32 = 2 };

typedef struct {
    int type, block, act256; /* act256: the activation format (ACT32, ACT256, ACT_F32) */
    size_t bytes;            /* bytes per weight block */
    dot_fn dot[N_ISA];       /* by ISA level (NULL: none at that level) */
    deq_fn deq;
    void *dot4;              /* four activation rows at once (x86-64, AVX2 and up; NULL: none) */
    void *dot4_512;          /* the same with AVX-512 VNNI, where the type has one */
    int rows8;               /* a repacked type: blocks of eight rows (dot8, deq8), no per-row dot */
    dot8_fn dot8[N_ISA];
    deq8_fn deq8;
} kernel_t;

/* every weight type the kernels take (an X-macro for the prototypes below and the table) */
#define GC_TYPES(X) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) X(iq4_nl) X(q2_K) X(q3_K) X(q4_K) X(q5_K) X(q6_K) X(iq4_xs) X(mxfp4)
/* the types with a four-row AVX2 dot */
#define GC_FOUR_ROW_TYPES(X) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) X(iq4_nl) X(mxfp4) X(q4_K) X(q5_K) X(q6_K)
/* ...and those with an AVX-512 VNNI four-row dot too */
#define GC_FOUR_ROW_VNNI_TYPES(X) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) X(iq4_nl) X(mxfp4) X(q4_K) X(q5_K) X(q6_K)

/* quants.c: the scalar code */
GC_HIDDEN void quantize_act32(const float *x, act32 *y, int64_t k);
GC_HIDDEN void quantize_act256(const float *x, act256 *y, int64_t k);
GC_HIDDEN void q3_scales(const uint8_t *sc, int *out);  /* Q3_K: the 16 six-bit scales, offset removed */
GC_HIDDEN void unpack_scale_min_k4(const uint8_t *q, uint8_t *sc, uint8_t *m);  /* Q4_K/Q5_K: scales and mins as bytes */
#define GC_SCALAR(t) GC_HIDDEN float dot_##t##_s(const void *vw, const void *vx, int nb); \
                     GC_HIDDEN void deq_##t(const void *v, float *y, int nb);
GC_TYPES(GC_SCALAR)
#undef GC_SCALAR

#if defined(GC_X86)
/* repack.c: Q5_0 in groups of eight rows */
GC_HIDDEN void repack_q5_0x8(const uint8_t *w, int64_t row_bytes, int nb, blk_q5_0x8 *out);
GC_HIDDEN void dot8_q5_0x8_s(const void *vw, const void *vx, int nb, float *out);
GC_HIDDEN void deq8_q5_0x8(const void *vw, float *y, int nb, int64_t n_cols);
GC_HIDDEN void repack_mxfp4x8(const uint8_t *w, int64_t row_bytes, int nb, blk_mxfp4x8 *out);
GC_HIDDEN void dot8_mxfp4x8_s(const void *vw, const void *vx, int nb, float *out);
GC_HIDDEN void deq8_mxfp4x8(const void *vw, float *y, int nb, int64_t n_cols);
/* arch/x86_avx2.c, x86_avx512.c, x86_tiles.c: AVX2 and AVX-512 */
#define GC_X86_DOTS(t) GC_HIDDEN float dot_##t##_avx2(const void *vw, const void *vx, int nb); \
                       GC_HIDDEN float dot_##t##_avx512(const void *vw, const void *vx, int nb);
GC_TYPES(GC_X86_DOTS)
#undef GC_X86_DOTS
#define GC_DOT4(t) GC_HIDDEN void dot4_##t##_avx2(const void *vw, const void *const *vx, int nb, float *out);
GC_FOUR_ROW_TYPES(GC_DOT4)
#undef GC_DOT4
#define GC_DOT4_512(t) GC_HIDDEN void dot4_##t##_avx512(const void *vw, const void *const *vx, int nb, float *out);
GC_FOUR_ROW_VNNI_TYPES(GC_DOT4_512)
#undef GC_DOT4_512
GC_HIDDEN void dot8_q5_0x8_avx2(const void *vw, const void *vx, int nb, float *out);
/* the AVX-512 VNNI eight-row dots of the 32-block types, and their activation layout */
GC_HIDDEN dotx8_fn dotx8_for(int type);
GC_HIDDEN void pack_x8(const uint8_t *x, size_t row_bytes, int nb, act32x8 *out);
GC_HIDDEN void dot8_mxfp4x8_avx2(const void *vw, const void *vx, int nb, float *out);
GC_HIDDEN void quantize_act32_avx2(const float *x, act32 *y, int64_t k);
GC_HIDDEN void quantize_act256_avx2(const float *x, act256 *y, int64_t k);
GC_HIDDEN void quantize_act32_avx512(const float *x, act32 *y, int64_t k);
GC_HIDDEN void quantize_act256_avx512(const float *x, act256 *y, int64_t k);
/* the tiles: eight weight rows packed once, met by activation rows four at a time */
GC_HIDDEN int tile_type(int type);
GC_HIDDEN size_t tile_bytes(int type, int nb);
GC_HIDDEN void tile_pack(int type, const uint8_t *w, int64_t row_bytes, int nb, void *t);
GC_HIDDEN void tile_dot(int type, const void *t, int nb, const void *const *xs, float o[4][8]);
/* arch/x86_amx.c: prompts on AMX in bfloat16 (weights dequantized in strips of 32 rows) */
GC_HIDDEN int amx_ready(void);
GC_HIDDEN int amx_type(int type);
GC_HIDDEN size_t amx_act_bytes(int64_t n_x, int64_t n_cols);
GC_HIDDEN void amx_act_pack(const float *x, int64_t n_x, int64_t n_cols, uint16_t *xb, int n_threads);
GC_HIDDEN void amx_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t n_cols, const uint16_t *xb, int64_t n_x,
                        float *y, int64_t y_stride, int64_t start, int64_t end, uint16_t *strip);
/* arch/x86_strips.c: prompts of the 256-block types on AVX-512 VNNI (weights in strips of 8
 * rows, activations in groups of 16 rows) */
GC_HIDDEN int vnni_type(int type);
GC_HIDDEN size_t vnni_act_bytes(int64_t n_x, int64_t n_cols);
GC_HIDDEN void vnni_act_pack(const uint8_t *xq, size_t row_bytes, int64_t n_x, int64_t n_cols, uint8_t *xv, int n_threads);
GC_HIDDEN size_t vnni_strip_bytes(int64_t n_cols);
GC_HIDDEN void vnni_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t n_cols, const uint8_t *xv, int64_t n_x,
                         float *y, int64_t y_stride, int64_t start, int64_t end, uint8_t *strip);
/* ... and F16 / BF16 in float32 (activations transposed in groups of 16 rows) */
GC_HIDDEN int fstrip_type(int type);
GC_HIDDEN size_t fstrip_act_bytes(int64_t n_x, int64_t n_cols);
GC_HIDDEN void fstrip_act_pack(const float *x, int64_t n_x, int64_t n_cols, float *xf, int n_threads);
GC_HIDDEN size_t fstrip_bytes(int64_t n_cols);
GC_HIDDEN void fstrip_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t n_cols, const float *xf, int64_t n_x,
                           float *y, int64_t y_stride, int64_t start, int64_t end, float *strip);
#elif defined(GC_NEON)
/* arch/arm.c: NEON */
#define GC_NEON_DOT(t) GC_HIDDEN float dot_##t##_neon(const void *vw, const void *vx, int nb);
GC_TYPES(GC_NEON_DOT)
#undef GC_NEON_DOT
#endif

/* dispatch.c: the kernel table and the ISA level in use */
GC_HIDDEN const kernel_t *find(int type);
GC_HIDDEN int pick_level(const kernel_t *k);
GC_HIDDEN dot_fn pick(const kernel_t *k);
GC_HIDDEN dot8_fn pick8(const kernel_t *k);
GC_HIDDEN const void *pick4(const kernel_t *k);

#endif
