// Tile-level synchronization between blocks of dependent stages.
//
// Semaphores are 32-bit counters in device memory that are never reset: run
// number `epoch` (1, 2, ...) waits until a counter reaches epoch * expected
// posts. A producer posts with release semantics at GPU scope after its tile's
// stores; a consumer's thread 0 spins with acquire loads, then a block barrier
// hands the ordering to the other threads. Spins are bounded: past the limit a
// spin sets the error flag (read by the host as a timeout) and gives up, so a
// protocol bug can never hang the GPU.
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef TUNER_SPIN_NS
#define TUNER_SPIN_NS 200000000ull  // 200 ms: far above any tile's wait, far below a watchdog
#endif

__device__ __forceinline__ u64 tuner_globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ u32 tuner_ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u32 tuner_ld_relaxed(const u32* p) {
  u32 v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Spin (one thread) until *p >= target, comparing modulo 2^32. Returns false on timeout.
// Inlined where a kernel's warps run at different register counts (setmaxnreg): one out-of-line
// copy called from both would have to fit the smaller count around the larger one's live values.
__device__ __forceinline__ bool tuner_spin_until_inline(const u32* p, u32 target, u32* err) {
  if ((int)(tuner_ld_acquire(p) - target) >= 0) return true;
  const u64 start = tuner_globaltimer();
  // Back off exponentially: hundreds of blocks polling one L2 line at full speed would
  // take L2 bandwidth from the producers they are waiting for.
  unsigned sleep_ns = 32;
  for (unsigned it = 0;; ++it) {
    __nanosleep(sleep_ns);
    if ((int)(tuner_ld_acquire(p) - target) >= 0) return true;
    if (sleep_ns < 512u) sleep_ns *= 2u;
    if ((it & 15u) == 15u) {
      if (tuner_ld_relaxed(err) != 0u) return false;  // another wait already timed out: stop early
      if (tuner_globaltimer() - start > TUNER_SPIN_NS) {
        atomicExch(err, 1u);
        return false;
      }
    }
  }
}

// The same, out of line: the wait loop stays out of the kernel's hot code.
__device__ __noinline__ bool tuner_spin_until(const u32* p, u32 target, u32* err) {
  return tuner_spin_until_inline(p, target, err);
}

// After the barrier that follows a tile's global stores: thread 0 makes them visible at GPU
// scope, then counts the post.
__device__ __forceinline__ void tuner_signal(u32* p) {
  if (threadIdx.x == 0) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
  }
}

// Called by every thread of the block after its tile's global stores.
__device__ __forceinline__ void tuner_post(u32* p) {
  __syncthreads();
  tuner_signal(p);
}

// A barrier of the block's first `threads` threads (named barrier 1), for a tile whose other
// threads have left it (a producer warpgroup that gave its registers up).
__device__ __forceinline__ void tuner_bar_sync(int threads) {
  asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}
// The 128 threads of this thread's warpgroup, one of the block's first four: named barrier 2 + its
// index (1 is tuner_bar_sync's), each an immediate so that ptxas counts only those used.
__device__ __forceinline__ void warpgroup_bar_sync() {
  switch (threadIdx.x / 128) {
    case 0: asm volatile("bar.sync 2, 128;" ::: "memory"); break;
    case 1: asm volatile("bar.sync 3, 128;" ::: "memory"); break;
    case 2: asm volatile("bar.sync 4, 128;" ::: "memory"); break;
    default: asm volatile("bar.sync 5, 128;" ::: "memory"); break;
  }
}

// A ticket counted from 0 in every run: the counter gains `per_run` tickets per run.
__device__ __forceinline__ u32 tuner_ticket(u32* counter, u32 epoch, u32 per_run) {
  __shared__ u32 ticket;
  if (threadIdx.x == 0) ticket = atomicAdd(counter, 1u) - (epoch - 1u) * per_run;
  __syncthreads();
  return ticket;
}
