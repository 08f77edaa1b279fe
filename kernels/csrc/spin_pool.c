/* The spinning thread pool of spin_pool.h. Linux (futex); elsewhere the jobs run on the caller. */
#include "spin_pool.h"

#include <limits.h>
#include <stdint.h>

#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__linux__)
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long a worker spins after a job before it sleeps (a decode step's calls come every few
 * tens of microseconds; between steps and requests the workers sleep). */
#define SPIN_POOL_SPIN_US 2000
#define SPIN_POOL_MAX_WORKERS 63

static struct {
    pthread_mutex_t lock;   /* held by the caller whose job runs (and while workers start) */
    int workers;            /* started so far */
    _Atomic uint32_t generation; /* bumped per job; the futex word */
    _Atomic int pending;    /* workers that have not finished the current job */
    _Atomic int sleepers;   /* workers in (or entering) futex_wait */
    spin_pool_fn fn;
    void *arg;
    int parts;
    uint32_t start_generation[SPIN_POOL_MAX_WORKERS + 1]; /* the last job each worker saw */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void *worker_main(void *p) {
    const int id = (int)(intptr_t)p; /* 1 .. workers */
    uint32_t seen = pool.start_generation[id]; /* not the current one: the job that started it
                                                 * may already be posted */
    for (;;) {
        uint32_t g;
        int64_t since = now_us();
        unsigned spins = 0;
        while ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen) {
            /* yield, not only pause: a spinning worker must not keep torch's OpenMP threads (or
             * any other runnable thread) off this core */
            if (++spins % 8 == 0) sched_yield();
            else cpu_relax();
            if (spins % 256 == 0 && now_us() - since > SPIN_POOL_SPIN_US) {
                /* sleepers is raised before the generation is read again in the kernel: a job
                 * posted in between changes the word, and futex_wait returns at once. */
                atomic_fetch_add(&pool.sleepers, 1);
                syscall(SYS_futex, &pool.generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
                atomic_fetch_sub(&pool.sleepers, 1);
                since = now_us();
            }
        }
        seen = g;
        if (id < pool.parts) pool.fn(pool.arg, id, pool.parts);
        atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

void spin_pool_run(spin_pool_fn fn, void *arg, int parts) {
    if (parts > SPIN_POOL_MAX_WORKERS + 1) parts = SPIN_POOL_MAX_WORKERS + 1;
    if (parts <= 1 || pthread_mutex_trylock(&pool.lock) != 0) {
        for (int i = 0; i < (parts < 1 ? 1 : parts); i++) fn(arg, i, parts < 1 ? 1 : parts);
        return;
    }
    while (pool.workers < parts - 1) {
        pthread_t t;
        pool.start_generation[pool.workers + 1] = atomic_load(&pool.generation);
        if (pthread_create(&t, NULL, worker_main, (void *)(intptr_t)(pool.workers + 1)) != 0) break;
        pthread_detach(t);
        pool.workers++;
    }
    if (pool.workers < parts - 1) parts = pool.workers + 1; /* could not start them all */
    pool.fn = fn;
    pool.arg = arg;
    pool.parts = parts;
    atomic_store_explicit(&pool.pending, pool.workers, memory_order_release);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_acq_rel);
    if (atomic_load(&pool.sleepers) > 0)
        syscall(SYS_futex, &pool.generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    fn(arg, 0, parts);
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) cpu_relax();
    pthread_mutex_unlock(&pool.lock);
}

#else /* no futex: every part on the caller */

void spin_pool_run(spin_pool_fn fn, void *arg, int parts) {
    if (parts < 1) parts = 1;
    for (int i = 0; i < parts; i++) fn(arg, i, parts);
}

#endif

int spin_pool_threads(void) {
#if defined(_OPENMP)
    return omp_get_max_threads();
#else
    return 1;
#endif
}
