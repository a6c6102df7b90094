// kvserve's own worker threads for the CPU kernels: parallel_for with a step-scoped wait.
//
// Why not at::parallel_for (OpenMP): libgomp fixes, once per process, how its idle threads wait.
// Spinning (its default) makes a decode step up to 12x slower when another process takes a core;
// sleeping at once (`OMP_WAIT_POLICY=PASSIVE`, kvserve's setting) costs a futex wake-up per
// parallel region, ~200 regions per decode step: about 15 ms per token on the 2-vCPU benchmark
// host (docs/benchmarks.md, "OpenMP waiting between the steps"). This pool's workers spin only
// for a short window after each region (`spin_us`), yielding the core while they do, so the
// regions of one step find them awake; between steps they sleep.
//
// Work is claimed, not assigned: every participant (the calling thread and up to threads - 1
// workers) takes the next contiguous run of items from a shared counter, runs of about
// remaining / (2 x participants) items and at least `grain`. A thread that is slow to wake or that
// the OS takes away holds back only the run it has claimed. Which thread runs an item never
// changes what the item computes: the kernels' bits do not depend on the partition.
//
// Calls made while the pool is busy (another thread's region, or from inside a region) run
// inline on the calling thread. A forked child starts a new pool on its first call.
//
// The pool is for processes whose OpenMP threads sleep at once (`OMP_WAIT_POLICY=PASSIVE`, what
// the kvserve commands set): PyTorch's own operators still run on OpenMP, and where its threads
// spin after each of them (libgomp's default) they would take the cores from this pool's workers
// (measured: a decode step 1.7x slower). There set_pool_enabled(false) sends every region to
// OpenMP's threads instead (kvserve.kernels decides at load, from kvserve.cpu_threads).
#pragma once

#include <cstdint>
#include <vector>

namespace kvserve {

using RangeFunction = void (*)(const void* context, int64_t begin, int64_t end);

// Runs function(context, b, e) over disjoint runs [b, e) covering [begin, end), on up to
// num_threads() threads; rethrows the first exception a run threw, after all runs end.
void parallel_run(int64_t begin, int64_t end, int64_t grain, RangeFunction function, const void* context);

// The threads of a region: PyTorch's intra-op thread count, which the Python caller passes on
// (kvserve/kernels/library.py: before a call, when torch.get_num_threads() changed), or the
// calling thread's own count while pool_self_check varies it.
void set_num_threads(int64_t threads);
int64_t num_threads();

// Whether parallel_run uses this pool (true) or OpenMP's threads (false, the default).
void set_pool_enabled(bool enabled);
bool pool_enabled();

// How long (microseconds) an idle worker waits for the next region before it sleeps; 0: at once.
void set_pool_spin_us(int64_t microseconds);
int64_t pool_spin_us();

// Self-check for the tests: `regions` regions of random sizes, offsets and grains (seeded), with
// random thread counts up to max_threads (0: leave them), some nested, some after a pause (the
// workers asleep), and with throw_every > 0 about one region in throw_every throwing from one of
// its items. Returns the faults seen, by kind: [items run other than once, runs outside their
// region or after it returned, nested regions whose items did not all run once, exceptions lost
// or changed]. Call it without the GIL, from any number of threads at once.
std::vector<int64_t> pool_self_check(int64_t regions, int64_t seed, int64_t max_threads, int64_t throw_every);

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
  parallel_run(
      begin, end, grain,
      [](const void* context, int64_t b, int64_t e) { (*static_cast<const F*>(context))(b, e); },
      static_cast<const void*>(&f));
}

}  // namespace kvserve
