/* A stand-alone check of the CPU kernels for machines where Python and torch are not at
 * hand (the NEON build, cross-compiled and run under qemu by test_native_check.py).
 *
 * For every type the kernels handle: random blocks (float16 factors kept sane), three
 * random activation rows; each ISA level's gc_mul_mat must lie within the bound that
 * 8-bit activation quantization implies around the exact float64 product of the
 * dequantized rows, and agree with the scalar level up to summation order. Prints one
 * line per type and level; exits 1 on any failure. */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gc_mul_mat(int type, const void *w, int64_t n_rows, int64_t n_cols, const float *x, int64_t n_x, float *y,
               int n_threads);
int gc_dequantize(int type, const void *w, int64_t n_rows, int64_t n_cols, float *y, int n_threads);
int gc_set_isa(int isa);
int gc_best_isa(void);
int gc_path_isa(int type);
const char *gc_isa_name(int isa);

/* type, name, weights per block, bytes per block, activation block, float16 field offsets */
static const struct { int type; const char *name; int block, bytes, act; int f16[2]; } TYPES[] = {
    {12, "Q4_K", 256, 144, 256, {0, 2}},   {14, "Q6_K", 256, 210, 256, {208, -1}}, {8, "Q8_0", 32, 34, 32, {0, -1}},
    {13, "Q5_K", 256, 176, 256, {0, 2}},   {6, "Q5_0", 32, 22, 32, {0, -1}},       {2, "Q4_0", 32, 18, 32, {0, -1}},
    {3, "Q4_1", 32, 20, 32, {0, 2}},       {7, "Q5_1", 32, 24, 32, {0, 2}},        {11, "Q3_K", 256, 110, 256, {108, -1}},
    {10, "Q2_K", 256, 84, 256, {80, 82}},  {20, "IQ4_NL", 32, 18, 32, {0, -1}},    {23, "IQ4_XS", 256, 136, 256, {0, -1}},
    {39, "MXFP4", 32, 17, 32, {-1, -1}},   {16, "IQ2_XXS", 256, 66, 256, {0, -1}}, {17, "IQ2_XS", 256, 74, 256, {0, -1}},
    {22, "IQ2_S", 256, 82, 256, {0, -1}},  {18, "IQ3_XXS", 256, 98, 256, {0, -1}}, {21, "IQ3_S", 256, 110, 256, {0, -1}},
    {19, "IQ1_S", 256, 50, 256, {0, -1}},  {29, "IQ1_M", 256, 56, 256, {-1, -1}},  {34, "TQ1_0", 256, 54, 256, {52, -1}},
    {35, "TQ2_0", 256, 66, 256, {64, -1}}, {41, "Q1_0", 128, 18, 32, {0, -1}},     {42, "Q2_0", 64, 18, 32, {0, -1}},
    /* the float types: every element a float16 field (F16) or a bfloat16 (set below); a bound of 1/254 per product */
    {1, "F16", 1, 2, 1, {0, -1}},          {30, "BF16", 1, 2, 1, {-1, -1}},
};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}
static float uniform(void) { return (float)(next_u32() >> 8) / 16777216.f; }
static float normal(void) { /* Box-Muller */
    const float u = uniform() + 1e-7f, v = uniform();
    return sqrtf(-2.f * logf(u)) * cosf(6.2831853f * v);
}

/* float -> float16 bits for values of normal range (no rounding subtleties needed) */
static uint16_t f2h(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    const uint32_t sign = (b >> 16) & 0x8000;
    const int exp = (int)((b >> 23) & 0xff) - 127 + 15;
    return (uint16_t)(sign | ((uint32_t)exp << 10) | ((b >> 13) & 0x3ff));
}

int main(void) {
    enum { ROWS = 28, COLS = 1024, NX = 13 }; /* 13 rows: Q4_K tiles (three of 8 rows, four left) and the four-row dots, with remainders */
    int failures = 0;
    const int best = gc_best_isa();
    printf("best %s\n", gc_isa_name(best));
    for (size_t t = 0; t < sizeof(TYPES) / sizeof(TYPES[0]); t++) {
        const int nb = COLS / TYPES[t].block, bytes = TYPES[t].bytes;
        uint8_t *w = malloc((size_t)ROWS * nb * bytes);
        for (int i = 0; i < ROWS * nb * bytes; i++) w[i] = (uint8_t)next_u32();
        for (int b = 0; b < ROWS * nb; b++)
            for (int f = 0; f < 2; f++)
                if (TYPES[t].f16[f] >= 0) {
                    const uint16_t h = f2h((uniform() * 0.5f + 0.5f) * 0.02f * (next_u32() & 1 ? 1.f : -1.f));
                    memcpy(w + (size_t)b * bytes + TYPES[t].f16[f], &h, 2);
                }
        for (int b = 0; b < ROWS * nb; b++) {
            const float v = (uniform() * 0.5f + 0.5f) * 0.02f * (next_u32() & 1 ? 1.f : -1.f);
            uint32_t fb;
            memcpy(&fb, &v, 4);
            uint8_t *blk = w + (size_t)b * bytes;
            if (TYPES[t].type == 30) { /* BF16: the value's top half */
                const uint16_t h = (uint16_t)(fb >> 16);
                memcpy(blk, &h, 2);
            } else if (TYPES[t].type == 29) { /* IQ1_M: the half factor in the top nibbles of the four scale words */
                const uint16_t h = f2h(v);
                for (int k = 0; k < 4; k++) blk[48 + 2 * k + 1] = (uint8_t)((blk[48 + 2 * k + 1] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4));
            }
        }
        if (TYPES[t].type == 39) /* MXFP4: the exponent byte as a scale of 2^-9..2^-6 */
            for (int b = 0; b < ROWS * nb; b++) w[(size_t)b * bytes] = (uint8_t)(118 + next_u32() % 4);
        float *W = malloc(sizeof(float) * ROWS * COLS), *x = malloc(sizeof(float) * NX * COLS);
        for (int i = 0; i < NX * COLS; i++) x[i] = normal();
        if (gc_dequantize(TYPES[t].type, w, ROWS, COLS, W, 1) != 0) {
            printf("%s dequantize failed\n", TYPES[t].name);
            return 1;
        }
        float y[NX * ROWS], y0[NX * ROWS];
        for (int level = 0; level <= best; level++) {
            gc_set_isa(level);
            const int path = gc_path_isa(TYPES[t].type);
            if (gc_mul_mat(TYPES[t].type, w, ROWS, COLS, x, NX, y, 2) != 0) {
                printf("%s mul_mat failed\n", TYPES[t].name);
                return 1;
            }
            if (level == 0) memcpy(y0, y, sizeof(y));
            double worst = 0.0, vs_scalar = 0.0;
            int ok = path == level;
            for (int n = 0; n < NX; n++)
                for (int r = 0; r < ROWS; r++) {
                    double exact = 0.0, bound = 0.0;
                    const int a = TYPES[t].act;
                    for (int b0 = 0; b0 < COLS; b0 += a) {
                        double amax = 0.0, wsum = 0.0;
                        for (int j = b0; j < b0 + a; j++) {
                            exact += (double)W[r * COLS + j] * x[n * COLS + j];
                            amax = fmax(amax, fabs(x[n * COLS + j]));
                            wsum += fabs(W[r * COLS + j]);
                        }
                        bound += amax / 254.0 * wsum;
                    }
                    const double err = fabs(y[n * ROWS + r] - exact), diff = fabs(y[n * ROWS + r] - y0[n * ROWS + r]);
                    if (err > bound * 1.001 + 1e-4) ok = 0;
                    if (diff > 1e-3 + 1e-5 * fabs(y0[n * ROWS + r])) ok = 0;
                    worst = fmax(worst, bound > 0 ? err / bound : 0);
                    vs_scalar = fmax(vs_scalar, diff);
                }
            printf("%s %s path=%s error/bound=%.3f vs_scalar=%.2e %s\n", TYPES[t].name, gc_isa_name(level),
                   gc_isa_name(path), worst, vs_scalar, ok ? "ok" : "FAIL");
            failures += !ok;
        }
        free(w); free(W); free(x);
    }
    printf("%s\n", failures ? "FAILED" : "PASSED");
    return failures ? 1 : 0;
}
