/* The kernel table (each weight type's block size, activation format, dot product per
 * ISA level, dequantizer) and the choice of ISA level: the best this CPU runs, or the
 * one gc_set_isa asks for (the process's), or the one gc_use_isa asks for on the calling
 * thread (a model's, for its forward pass; the pool's workers take the caller's level
 * with each task, pool.c). */

#include "iq.h"

#if defined(GC_X86)
static const char *const ISA_NAMES[N_ISA] = {"scalar", "avx2", "avx512"};
#elif defined(GC_NEON)
static const char *const ISA_NAMES[N_ISA] = {"scalar", "neon"};
#else
static const char *const ISA_NAMES[N_ISA] = {"scalar"};
#endif


#if defined(GC_X86)
#define K(t, blk, a, sz, name) {t, blk, a, sz, {dot_##name##_s, dot_##name##_avx2, dot_##name##_avx512}, deq_##name, NULL}
#define K4(t, blk, a, sz, name) {t, blk, a, sz, {dot_##name##_s, dot_##name##_avx2, dot_##name##_avx512}, deq_##name, \
                                 (void *)dot4_##name##_avx2}
#define K4V(t, blk, a, sz, name) {t, blk, a, sz, {dot_##name##_s, dot_##name##_avx2, dot_##name##_avx512}, deq_##name, \
                                  (void *)dot4_##name##_avx2, (void *)dot4_##name##_avx512}
#elif defined(GC_NEON)
#define K(t, blk, a, sz, name) {t, blk, a, sz, {dot_##name##_s, dot_##name##_neon}, deq_##name, NULL}
#define K4 K
#define K4V K
#else
#define K(t, blk, a, sz, name) {t, blk, a, sz, {dot_##name##_s}, deq_##name, NULL}
#define K4 K
#define K4V K
#endif

static const kernel_t KERNELS[] = {
    K4V(T_Q4_0, 32, 0, sizeof(blk_q4_0), q4_0),
    K4V(T_Q4_1, 32, 0, sizeof(blk_q4_1), q4_1),
    K4V(T_Q5_0, 32, 0, sizeof(blk_q5_0), q5_0),
    K4V(T_Q5_1, 32, 0, sizeof(blk_q5_1), q5_1),
    K4V(T_Q8_0, 32, 0, sizeof(blk_q8_0), q8_0),
    K4V(T_IQ4_NL, 32, 0, sizeof(blk_iq4_nl), iq4_nl),
    K4V(T_MXFP4, 32, 0, sizeof(blk_mxfp4), mxfp4),
    K(T_Q2_K, QK_K, 1, sizeof(blk_q2_K), q2_K),
    K(T_Q3_K, QK_K, 1, sizeof(blk_q3_K), q3_K),
    K4V(T_Q4_K, QK_K, 1, sizeof(blk_q4_K), q4_K),
    K4V(T_Q5_K, QK_K, 1, sizeof(blk_q5_K), q5_K),
    K4V(T_Q6_K, QK_K, 1, sizeof(blk_q6_K), q6_K),
    K(T_IQ4_XS, QK_K, 1, sizeof(blk_iq4_xs), iq4_xs),
    K4V(T_IQ2_XXS, QK_K, 1, sizeof(blk_iq2_xxs), iq2_xxs),
    K4V(T_IQ2_XS, QK_K, 1, sizeof(blk_iq2_xs), iq2_xs),
    K4V(T_IQ2_S, QK_K, 1, sizeof(blk_iq2_s), iq2_s),
    K4V(T_IQ3_XXS, QK_K, 1, sizeof(blk_iq3_xxs), iq3_xxs),
    K4V(T_IQ3_S, QK_K, 1, sizeof(blk_iq3_s), iq3_s),
    K4V(T_IQ1_S, QK_K, 1, sizeof(blk_iq1_s), iq1_s),
    K4V(T_IQ1_M, QK_K, 1, sizeof(blk_iq1_m), iq1_m),
    K4V(T_TQ1_0, QK_K, 1, sizeof(blk_tq1_0), tq1_0),
    K4V(T_TQ2_0, QK_K, 1, sizeof(blk_tq2_0), tq2_0),
    K4V(T_Q1_0, 128, ACT32, sizeof(blk_q1_0), q1_0),
    K4V(T_Q2_0, 64, ACT32, sizeof(blk_q2_0), q2_0),
    K4V(T_F16, 1, ACT_F32, 2, f16),
    K4V(T_BF16, 1, ACT_F32, 2, bf16),
#if defined(GC_X86)
    {T_Q5_0_X8, 32, 0, sizeof(blk_q5_0), {NULL}, NULL, NULL, NULL, 1, {dot8_q5_0x8_s, dot8_q5_0x8_avx2, dot8_q5_0x8_avx2},
     deq8_q5_0x8},
    {T_MXFP4_X8, 32, 0, sizeof(blk_mxfp4), {NULL}, NULL, NULL, NULL, 1,
     {dot8_mxfp4x8_s, dot8_mxfp4x8_avx2, dot8_mxfp4x8_avx2}, deq8_mxfp4x8},
#endif
};

static int g_isa = -1;  /* the process's level (gc_set_isa); -1 until chosen */
/* the calling thread's level (gc_use_isa), -1: the process's; initial-exec: one load from
 * the thread pointer, read in every task */
static _Thread_local int t_isa __attribute__((tls_model("initial-exec"))) = -1;
static int g_best = -1;

static int detect_isa(void) {
#if defined(GC_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
#elif defined(GC_NEON)
    return ISA_NEON; /* part of every AArch64 CPU */
#endif
    return ISA_SCALAR;
}

/* the best ISA level this CPU runs */
int gc_best_isa(void) {
    if (g_best < 0) g_best = detect_isa();
    return g_best;
}

/* the name of an ISA level on this architecture, or NULL past the last */
const char *gc_isa_name(int isa) { return isa >= 0 && isa < N_ISA ? ISA_NAMES[isa] : NULL; }

/* select the process's ISA level (clamped to what the CPU runs); returns the one in use */
int gc_set_isa(int isa) {
    const int best = gc_best_isa();
    g_isa = (isa < 0 || isa > best) ? best : isa;
    return g_isa;
}

/* select the calling thread's ISA level (clamped to what the CPU runs; -1: the process's)
 * for the calls it makes, and the pool's tasks it hands out; returns the thread's
 * previous setting (to restore) */
int gc_use_isa(int isa) {
    const int old = t_isa, best = gc_best_isa();
    t_isa = isa < 0 ? -1 : isa > best ? best : isa;
    return old;
}

int gc_isa(void) {
    if (t_isa >= 0) return t_isa;
    if (g_isa < 0) gc_set_isa(-1);
    return g_isa;
}

const kernel_t *find(int type) {
    for (size_t i = 0; i < sizeof(KERNELS) / sizeof(KERNELS[0]); i++)
        if (KERNELS[i].type == type) return &KERNELS[i];
    return NULL;
}

/* the dot product of the selected level, or the best one below it */
int pick_level(const kernel_t *k) {
    int level = gc_isa();
    while (level > 0 && !(k->rows8 ? (void *)k->dot8[level] : (void *)k->dot[level])) level--;
    return level;
}

dot_fn pick(const kernel_t *k) { return k->dot[pick_level(k)]; }

dot8_fn pick8(const kernel_t *k) { return k->rows8 ? k->dot8[pick_level(k)] : NULL; }

/* the four-row dot product where the selected level has one (x86-64: AVX2 and up) */
const void *pick4(const kernel_t *k) {
#if defined(GC_X86)
    if (gc_isa() >= ISA_AVX512 && k->dot4_512) return k->dot4_512;
    if (gc_isa() >= ISA_AVX2) return k->dot4;
#endif
    (void)k;
    return NULL;
}

/* 1 if mul_mat handles this type */
int gc_supports(int type) { return find(type) != NULL; }

/* the ISA of the dot product mul_mat uses for this type under the current selection, or -1 */
int gc_path_isa(int type) {
    const kernel_t *k = find(type);
    return k ? pick_level(k) : -1;
}
