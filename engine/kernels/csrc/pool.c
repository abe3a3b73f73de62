/* The kernels' thread pool: one process-wide pool of n - 1 workers plus the calling
 * thread. Work is handed out in chunks from an atomic counter; workers spin briefly
 * between calls (a decode step makes hundreds of them) and then sleep. */

#include "gc.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

typedef struct {
    pthread_t *threads;
    int n_threads;            /* workers (excluding the caller) */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    atomic_uint_fast64_t generation;
    atomic_int pending;
    gc_task_fn fn;
    void *ctx;
    int isa;                  /* the caller's ISA level, which the workers take for the task */
    int64_t n, chunk;
    atomic_int_fast64_t next;
    atomic_int stop;
} pool_t;

static pool_t g_pool;

int gc_use_isa(int isa); /* dispatch.c: the calling thread's ISA level */
static pthread_mutex_t g_pool_init = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_call = PTHREAD_MUTEX_INITIALIZER;

/* Workers and the caller spin this many polls (tens of microseconds) before sleeping:
 * decode issues a hundred small matmuls per token, and a sleep/wake pair costs more
 * than the work. After that they block, so idle threads never hold a core. */
#define SPIN_POLLS 20000
/* A waiting worker yields its core every this many polls: with as many threads as cores,
 * another runnable thread (the server's event loop, a client) then gets it at once
 * instead of at the end of a time slice. */
#define YIELD_EVERY 256

static inline void cpu_relax(void) {
#if defined(GC_X86)
    _mm_pause();
#elif defined(GC_NEON)
    __asm__ __volatile__("yield");
#endif
}

/* Kernel work runs with denormals flushed to zero (x86 MXCSR FTZ and DAZ): an activation
 * far below 1e-30 (SiLU of a large negative gate, say) times a block scale is a float32
 * denormal, and every FMA on one takes a microcode assist (a decode step's expert down
 * projections ran at half speed on such inputs). Values that small change no result.
 * Workers take the setting's mode before each call's chunks; the calling thread gets its
 * own mode back after each call, so the rest of the process (torch, numpy) keeps IEEE
 * semantics. gc_set_ftz(0) turns it off for comparisons. */
static int g_ftz = 1;

int gc_set_ftz(int on) {
    if (on >= 0) g_ftz = on != 0;
    return g_ftz;
}

#if defined(GC_X86)
#define FTZ_DAZ 0x8040u
static inline unsigned ftz_enter(void) {
    const unsigned old = _mm_getcsr();
    if (g_ftz && (old & FTZ_DAZ) != FTZ_DAZ) _mm_setcsr(old | FTZ_DAZ);
    else if (!g_ftz && (old & FTZ_DAZ)) _mm_setcsr(old & ~FTZ_DAZ);
    return old;
}
static inline void ftz_leave(unsigned old) {
    if (_mm_getcsr() != old) _mm_setcsr(old);
}
#else
static inline unsigned ftz_enter(void) { return 0; }
static inline void ftz_leave(unsigned old) { (void)old; }
#endif

static void run_chunks(pool_t *p) {
    for (;;) {
        const int64_t start = atomic_fetch_add(&p->next, p->chunk);
        if (start >= p->n) break;
        const int64_t end = start + p->chunk < p->n ? start + p->chunk : p->n;
        p->fn(p->ctx, start, end);
    }
}

static void *worker(void *arg) {
    pool_t *p = arg;
    uint64_t seen = 0;
    for (;;) {
        int polls = 0;
        while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop) && polls < SPIN_POLLS) {
            cpu_relax();
            if (++polls % YIELD_EVERY == 0) sched_yield(); /* let a thread that wants this core run */
        }
        if (atomic_load(&p->generation) == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->generation);
        ftz_enter(); /* the worker keeps the mode the current setting asks for */
        gc_use_isa(p->isa); /* and the caller's ISA level */
        run_chunks(p);
        if (atomic_fetch_sub(&p->pending, 1) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void pool_resize(int n_threads) {
    pool_t *p = &g_pool;
    const int workers = n_threads > 1 ? n_threads - 1 : 0;
    if (p->threads && p->n_threads == workers) return;
    if (p->threads) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
        free(p->threads);
        p->threads = NULL;
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv_work);
        pthread_cond_destroy(&p->cv_done);
    }
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->n_threads = workers;
    p->threads = calloc(workers > 0 ? workers : 1, sizeof(pthread_t));
    for (int i = 0; i < workers; i++) pthread_create(&p->threads[i], NULL, worker, p);
}

/* run fn over [0, n) in chunks on n_threads threads (the caller is one of them) */
void gc_parallel_for(int n_threads, int64_t n, int64_t chunk, gc_task_fn fn, void *ctx) {
    const unsigned mode = ftz_enter();
    if (n_threads <= 1 || n <= chunk) {
        fn(ctx, 0, n);
        ftz_leave(mode);
        return;
    }
    pthread_mutex_lock(&g_call);
    pthread_mutex_lock(&g_pool_init);
    pool_resize(n_threads);
    pthread_mutex_unlock(&g_pool_init);
    pool_t *p = &g_pool;
    p->fn = fn; p->ctx = ctx; p->n = n; p->chunk = chunk; p->isa = gc_isa();
    atomic_store(&p->next, 0);
    atomic_store(&p->pending, p->n_threads);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p);
    int polls = 0;
    while (atomic_load(&p->pending) > 0 && polls < SPIN_POLLS) {
        cpu_relax();
        polls++;
    }
    if (atomic_load(&p->pending) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&g_call);
    ftz_leave(mode);
}
