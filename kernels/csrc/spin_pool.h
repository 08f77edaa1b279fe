/* A small thread pool for decode-sized kernels whose workers spin between jobs.
 *
 * Why not OpenMP for these: a decode step makes ~150 short kernel calls (tens to hundreds of
 * microseconds each) with Python in between. libgomp's workers go to sleep between parallel
 * regions once the process holds more OpenMP threads than CPUs (the main thread's team and
 * the engine thread's both count), and waking one costs ~100 us on this VM, so a batch-1
 * quantized matmul spent more time waiting for its second thread than computing. Here a
 * worker spins for SPIN_POOL_SPIN_US after its last job, then sleeps on a futex; within a
 * step it never sleeps. A job is cut into SPIN_POOL_PARTS_PER_THREAD parts per thread, which
 * the caller and the workers take as they come free, so a thread the OS preempts holds up
 * one small part, not half the job.
 */
#ifndef RADIXGEN_CSRC_SPIN_POOL_H
#define RADIXGEN_CSRC_SPIN_POOL_H

#include <stdint.h>

/* One job: part `part` of `parts` (0 <= part < parts); parts run concurrently, in any order,
 * on any thread, so a part's result must depend on (part, parts) alone. */
typedef void (*spin_pool_fn)(void *arg, int part, int parts);

/* Run fn on `threads` threads (the caller and threads - 1 workers), as `threads` times
 * SPIN_POOL_PARTS_PER_THREAD parts, and return when all are done. threads <= 1, or a pool busy
 * with another caller's job, runs the job as one part on the caller. */
void spin_pool_run(spin_pool_fn fn, void *arg, int threads);

/* Wake the workers that sleep (they went idle), so that they spin again for SPIN_POOL_SPIN_US:
 * called when a request arrives at an idle engine, a few hundred microseconds before its first
 * step. On a loaded machine a sleeping worker took milliseconds to get a core back, and the
 * first step ran on the caller alone (twice as long). */
void spin_pool_wake(void);

/* The thread count a job should use: OpenMP's for the calling thread (torch.set_num_threads),
 * 1 without OpenMP. */
int spin_pool_threads(void);

#endif
