/* The spinning thread pool of spin_pool.h. Linux (futex); elsewhere the jobs run on the caller. */
#define _GNU_SOURCE /* sched_getcpu, CPU_SET */
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
/* How long a waiting thread only pauses before it also yields the core (see worker_main). */
#define SPIN_POOL_PAUSE_US 100
/* A job of `threads` threads is cut into this many parts per thread, taken one at a time by
 * whichever thread is free: a thread the OS preempts (another process wants the core) delays
 * the job by the part it holds, not by its whole share. With one part per thread, one
 * background process at nice 10 made a decode step 4x slower. */
#define SPIN_POOL_PARTS_PER_THREAD 4

/* The job's ticket: (job number << 32) | next part to take. A thread takes part p of job g
 * by a compare-and-swap from (g, p) to (g, p + 1), so a late worker cannot take a part of a
 * job that is over: the number changed. */
#define TICKET(job, part) (((uint64_t)(job) << 32) | (uint32_t)(part))

static struct {
    pthread_mutex_t lock;   /* held by the caller whose job runs (and while workers start) */
    int workers;            /* started so far */
    _Atomic uint32_t generation; /* bumped per job; the futex word */
    _Atomic uint64_t ticket;
    _Atomic int done;       /* parts of the current job finished */
    _Atomic int sleepers;   /* workers in (or entering) futex_wait */
    _Atomic int caller_cpu; /* the CPU the last job was posted from */
    spin_pool_fn fn;        /* the current job (written before its ticket is published) */
    void *arg;
    int parts;
    uint32_t start_generation[SPIN_POOL_MAX_WORKERS + 1]; /* the last job each worker saw */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .caller_cpu = -1};

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

/* Take and run parts of the job in the ticket until none is left. The job's fields are read
 * between loading the ticket and taking a part of it: a successful take proves they were the
 * job's own (a new job is posted only after every part of this one is done). */
static int take_parts(int limit) {
    uint64_t t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    int taken = 0;
    while (taken < limit) {
        const spin_pool_fn fn = pool.fn;
        void *const arg = pool.arg;
        const int parts = pool.parts;
        const uint32_t part = (uint32_t)t;
        if (part >= (uint32_t)parts) break;
        if (!atomic_compare_exchange_weak_explicit(&pool.ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* t now holds the ticket's value: try again */
        fn(arg, (int)part, parts);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_acq_rel);
        taken++;
        t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    }
    return taken;
}

/* A worker woken onto its caller's CPU waits there until the caller stops (the caller takes
 * every part itself meanwhile, so the step runs on one thread): when the other CPUs are busy,
 * even with idle-priority work, Linux's wakeup placement need not look for them. A worker that
 * finds itself there moves to another CPU it may use (a call that migrates it at once), then
 * may use them all again. */
static void leave_caller_cpu(const cpu_set_t *home) {
    const int here = sched_getcpu();
    if (here < 0 || here != atomic_load_explicit(&pool.caller_cpu, memory_order_relaxed)) return;
    cpu_set_t away = *home;
    CPU_CLR(here, &away);
    if (CPU_COUNT(&away) == 0) return;
    if (sched_setaffinity(0, sizeof away, &away) != 0) return;
    /* back to the CPUs the worker started with; should they be gone meanwhile (a cpuset
     * shrank), to every CPU, which the kernel narrows to the ones allowed */
    if (sched_setaffinity(0, sizeof *home, home) != 0) {
        cpu_set_t all;
        CPU_ZERO(&all);
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) CPU_SET(cpu, &all);
        sched_setaffinity(0, sizeof all, &all);
    }
}

static void *worker_main(void *p) {
    const int id = (int)(intptr_t)p; /* 1 .. workers */
    cpu_set_t home; /* the CPUs this worker may use, as it started */
    if (sched_getaffinity(0, sizeof home, &home) != 0) CPU_ZERO(&home);
    uint32_t seen = pool.start_generation[id]; /* not the current one: the job that started it
                                                 * may already be posted */
    for (;;) {
        uint32_t g;
        int64_t since = now_us();
        unsigned spins = 0;
        int yielding = 0;
        while ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen) {
            /* after SPIN_POOL_PAUSE_US, yield too: a spinning worker must not keep torch's
             * OpenMP threads (or any other runnable thread) off this core; before it, a yield
             * would hand the core to another process for a whole time slice in mid-step */
            if (yielding && ++spins % 8 == 0) sched_yield();
            else cpu_relax();
            if (++spins % 256 == 0 && !yielding) yielding = now_us() - since > SPIN_POOL_PAUSE_US;
            if (spins % 256 == 0) leave_caller_cpu(&home);
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
        leave_caller_cpu(&home);
        take_parts(INT_MAX);
    }
    return NULL;
}

void spin_pool_run(spin_pool_fn fn, void *arg, int threads) {
    if (threads > SPIN_POOL_MAX_WORKERS + 1) threads = SPIN_POOL_MAX_WORKERS + 1;
    if (threads <= 1 || pthread_mutex_trylock(&pool.lock) != 0) {
        fn(arg, 0, 1);
        return;
    }
    while (pool.workers < threads - 1) {
        pthread_t t;
        pool.start_generation[pool.workers + 1] = atomic_load(&pool.generation);
        if (pthread_create(&t, NULL, worker_main, (void *)(intptr_t)(pool.workers + 1)) != 0) break;
        pthread_detach(t);
        pool.workers++;
    }
    if (pool.workers < threads - 1) threads = pool.workers + 1; /* could not start them all */
    const int parts = threads * SPIN_POOL_PARTS_PER_THREAD;
    atomic_store_explicit(&pool.caller_cpu, sched_getcpu(), memory_order_relaxed);
    const uint32_t job = atomic_load(&pool.generation) + 1;
    pool.fn = fn;
    pool.arg = arg;
    pool.parts = parts;
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.ticket, TICKET(job, 0), memory_order_release);
    atomic_store_explicit(&pool.generation, job, memory_order_release);
    if (atomic_load(&pool.sleepers) > 0)
        syscall(SYS_futex, &pool.generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    /* The caller's share first. If no worker took a part meanwhile, one may be queued behind
     * this thread on its CPU (woken there after sleeping): yield once, so that it can run and
     * move away (leave_caller_cpu) instead of leaving the whole job to this thread. */
    const int share = parts / threads;
    if (take_parts(share) == share && (uint32_t)atomic_load(&pool.ticket) == (uint32_t)share)
        sched_yield();
    take_parts(INT_MAX);
    /* the parts other threads hold; after SPIN_POOL_PAUSE_US yield now and then, so that a
     * worker the OS took off this core for another process can get it back */
    const int64_t since = now_us();
    int yielding = 0;
    for (unsigned spins = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < parts;) {
        if (yielding && ++spins % 8 == 0) sched_yield();
        else cpu_relax();
        if (++spins % 256 == 0 && !yielding) yielding = now_us() - since > SPIN_POOL_PAUSE_US;
    }
    pthread_mutex_unlock(&pool.lock);
}

void spin_pool_wake(void) {
    /* a worker woken with no job resets its spin clock and spins SPIN_POOL_SPIN_US again */
    if (atomic_load(&pool.sleepers) > 0)
        syscall(SYS_futex, &pool.generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

#else /* no futex: every part on the caller */

void spin_pool_run(spin_pool_fn fn, void *arg, int threads) {
    (void)threads;
    fn(arg, 0, 1);
}

void spin_pool_wake(void) {}

#endif

int spin_pool_threads(void) {
#if defined(_OPENMP)
    return omp_get_max_threads();
#else
    return 1;
#endif
}
