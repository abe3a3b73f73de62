/* Shared by the kernel sources: architecture detection, ISA levels, the thread pool. */
#ifndef GC_H
#define GC_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#define GC_X86 1
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define GC_NEON 1
#include <arm_neon.h>
#endif

#define GC_HIDDEN __attribute__((visibility("hidden")))

/* What the library's status-returning entry points return; engine/kernels/cpu.py
 * (Status) names them for the Python side. */
enum gc_status {
    GC_OK = 0,
    GC_UNSUPPORTED = -1, /* a type, shape or layout these kernels do not take: the caller uses another path */
    GC_NO_MEMORY = -2,   /* scratch memory could not be allocated */
    GC_BAD_EXPERT = -3,  /* an expert index outside 0..n_experts - 1 */
};

/* ISA levels: 0 is the portable C; above it this architecture's SIMD builds, each
 * level running on CPUs that run the one below. */
#if defined(GC_X86)
enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, N_ISA = 3 };
#elif defined(GC_NEON)
enum { ISA_SCALAR = 0, ISA_NEON = 1, N_ISA = 2 };
#else
enum { ISA_SCALAR = 0, N_ISA = 1 };
#endif

/* the ISA level in use (gc_set_isa, else the best this CPU runs) */
GC_HIDDEN int gc_isa(void);

/* a grow-only buffer (per-thread scratch kept between calls: decode makes hundreds of calls
 * a token, and a malloc/free pair each is measurable), 64-byte aligned; NULL when memory
 * could not be had */
static inline void *gc_grow(void **buf, size_t *cap, size_t bytes) {
    if (bytes > *cap) {
        free(*buf);
        const size_t n = (bytes + 63) / 64 * 64;
        *buf = aligned_alloc(64, n);
        *cap = *buf ? n : 0;
    }
    return *buf;
}

typedef void (*gc_task_fn)(void *ctx, int64_t start, int64_t end);

/* run fn over [0, n) in chunks on n_threads threads (the caller is one of them) */
GC_HIDDEN void gc_parallel_for(int n_threads, int64_t n, int64_t chunk, gc_task_fn fn, void *ctx);

#endif
