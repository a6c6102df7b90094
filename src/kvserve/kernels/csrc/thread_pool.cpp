// kvserve's worker pool (see thread_pool.h for why and what it promises).
//
// One region at a time. The caller publishes the region's parameters, then a ticket (generation,
// next item) that every participant advances with compare-and-swap to claim a run; it bumps the
// wake word (a futex) and wakes sleeping workers only when there are any. The caller claims runs
// too, then waits until the completed-item count reaches the region's size: a worker that never
// woke, or woke late, holds nothing back. Before it writes the next region's parameters the caller
// closes the old ticket (new generation, no items), so a late worker's claim on the old generation
// fails instead of running an item with the new parameters; parameters are read with acquire
// loads, so a worker that saw a new parameter also sees the closed ticket.
#include "thread_pool.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace kvserve {
namespace {

constexpr int kIndexBits = 40;
constexpr uint64_t kIndexMask = (uint64_t{1} << kIndexBits) - 1;
constexpr uint64_t kClosed = kIndexMask;  // index of a ticket with nothing left to claim

inline uint64_t ticket(uint64_t generation, uint64_t index) { return (generation << kIndexBits) | index; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, nullptr, nullptr, 0);
}

thread_local bool inside_region = false;  // a pool worker, or a caller running its region
std::atomic<int64_t> configured_spin_us{200};  // set_pool_spin_us; read by every worker as it waits

class Pool {
 public:
  Pool() : pid_(getpid()) {}

  void run(int64_t begin, int64_t end, int64_t grain, RangeFunction function, const void* context, int64_t threads);
  pid_t pid() const { return pid_; }
  std::mutex& busy() { return busy_; }

 private:
  void grow(int64_t workers);
  void worker_loop(int64_t index);
  bool wait_for_region(uint32_t* seen);
  // Claims and runs runs of the current region until none is left.
  void claim_and_run();

  std::mutex busy_;
  const pid_t pid_;
  int64_t workers_ = 0;
  // Wake word: bumped once per region; idle workers sleep on it after their spin window.
  std::atomic<uint32_t> wake_{0};
  std::atomic<uint32_t> sleepers_{0};
  std::atomic<uint64_t> ticket_{ticket(0, kClosed)};
  uint64_t generation_ = 0;  // written by the caller only
  // The current region's parameters (acquire/release: see the file comment).
  std::atomic<RangeFunction> function_{nullptr};
  std::atomic<const void*> context_{nullptr};
  std::atomic<int64_t> begin_{0};
  std::atomic<int64_t> end_{0};
  std::atomic<int64_t> grain_{1};
  std::atomic<int64_t> participants_{1};
  std::atomic<int64_t> completed_{0};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

void Pool::grow(int64_t workers) {
  for (; workers_ < workers; ++workers_) {
    const int64_t index = workers_;
    std::thread([this, index] { worker_loop(index); }).detach();
  }
}

void Pool::worker_loop(int64_t index) {
  inside_region = true;
  uint32_t seen = wake_.load();
  for (;;) {
    if (!wait_for_region(&seen)) continue;
    if (index + 1 < participants_.load(std::memory_order_acquire)) claim_and_run();
  }
}

// Spins (yielding the core once the first 20 us are over) for the spin window, then sleeps on
// the wake word. True when a new region was announced.
bool Pool::wait_for_region(uint32_t* seen) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const int64_t window = configured_spin_us.load(std::memory_order_relaxed) * 1000;
  for (;;) {
    const uint32_t now = wake_.load();
    if (now != *seen) {
      *seen = now;
      return true;
    }
    const int64_t waited = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    if (waited >= window) break;
    if (waited > 20000) {
      sched_yield();
    } else {
      for (int i = 0; i < 32; ++i) cpu_relax();
    }
  }
  sleepers_.fetch_add(1);
  futex(&wake_, FUTEX_WAIT_PRIVATE, *seen);
  sleepers_.fetch_sub(1);
  return false;
}

void Pool::claim_and_run() {
  for (;;) {
    uint64_t current = ticket_.load(std::memory_order_acquire);
    const uint64_t index = current & kIndexMask;
    if (index == kClosed) return;
    const RangeFunction function = function_.load(std::memory_order_acquire);
    const void* context = context_.load(std::memory_order_acquire);
    const int64_t begin = begin_.load(std::memory_order_acquire);
    const int64_t end = end_.load(std::memory_order_acquire);
    const int64_t grain = grain_.load(std::memory_order_acquire);
    const int64_t participants = participants_.load(std::memory_order_acquire);
    const int64_t first = static_cast<int64_t>(index);
    if (first >= end) return;
    const int64_t share = (end - first + 2 * participants - 1) / (2 * participants);
    const int64_t last = std::min(end, first + std::max(grain, share));
    if (!ticket_.compare_exchange_weak(current, (current & ~kIndexMask) | static_cast<uint64_t>(last))) continue;
    try {
      function(context, begin + first, begin + last);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    completed_.fetch_add(last - first, std::memory_order_acq_rel);
  }
}

void Pool::run(int64_t begin, int64_t end, int64_t grain, RangeFunction function, const void* context,
               int64_t threads) {
  // The caller holds busy_. Close the old generation before touching the parameters.
  ++generation_;
  ticket_.store(ticket(generation_, kClosed));
  grow(threads - 1);
  function_.store(function, std::memory_order_release);
  context_.store(context, std::memory_order_release);
  begin_.store(begin, std::memory_order_release);
  end_.store(end - begin, std::memory_order_release);  // the ticket numbers items from 0
  grain_.store(grain, std::memory_order_release);
  participants_.store(threads, std::memory_order_release);
  completed_.store(0, std::memory_order_release);
  error_ = nullptr;
  ticket_.store(ticket(generation_, 0), std::memory_order_release);
  wake_.fetch_add(1);
  if (sleepers_.load() > 0) futex(&wake_, FUTEX_WAKE_PRIVATE, INT_MAX);
  inside_region = true;
  claim_and_run();
  const int64_t total = end - begin;
  for (int spins = 0; completed_.load(std::memory_order_acquire) < total; ++spins) {
    if (spins < 2000) {
      cpu_relax();
    } else {
      sched_yield();
    }
  }
  inside_region = false;
  ticket_.store(ticket(generation_, kClosed));
  if (error_) std::rethrow_exception(error_);
}

std::atomic<bool> enabled{false};
std::atomic<int64_t> configured_threads{1};  // set_num_threads: PyTorch's intra-op thread count
thread_local int64_t thread_threads = 0;     // set_thread_num_threads: this thread's own, 0 = none

// OpenMP's threads over [begin, end): one contiguous share per thread, as at::parallel_for's
// OpenMP backend splits a range; the first exception is rethrown after every share ends.
void openmp_run(int64_t begin, int64_t end, int64_t grain, RangeFunction function, const void* context,
                int64_t threads) {
#ifdef _OPENMP
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    const int64_t team = std::min<int64_t>(omp_get_num_threads(), (end - begin + grain - 1) / grain);
    const int64_t chunk = (end - begin + team - 1) / team;
    const int64_t first = begin + omp_get_thread_num() * chunk;
    if (omp_get_thread_num() < team && first < end) {
      try {
        const bool outer = inside_region;
        inside_region = true;
        function(context, first, std::min(end, first + chunk));
        inside_region = outer;
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
#else
  (void)grain;
  (void)threads;
  function(context, begin, end);
#endif
}
std::mutex pool_mutex;
Pool* pool = nullptr;  // never deleted: detached workers use it until the process exits

Pool* current_pool() {
  std::lock_guard<std::mutex> lock(pool_mutex);
  if (pool == nullptr || pool->pid() != getpid()) pool = new Pool();  // first call, or forked
  return pool;
}

}  // namespace

void parallel_run(int64_t begin, int64_t end, int64_t grain, RangeFunction function, const void* context) {
  if (end <= begin) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t size = end - begin;
  const int64_t threads = std::min<int64_t>(std::max<int64_t>(1, num_threads()), (size + grain - 1) / grain);
  if (threads <= 1 || inside_region) {
    function(context, begin, end);
    return;
  }
  if (!enabled.load(std::memory_order_relaxed)) {
    openmp_run(begin, end, grain, function, context, threads);
    return;
  }
  Pool* p = current_pool();
  std::unique_lock<std::mutex> lock(p->busy(), std::try_to_lock);
  if (!lock.owns_lock()) {  // another thread's region is running: this one runs here, alone
    function(context, begin, end);
    return;
  }
  p->run(begin, end, grain, function, context, threads);
}

void set_pool_enabled(bool on) { enabled.store(on); }

void set_num_threads(int64_t threads) { configured_threads.store(std::max<int64_t>(1, threads)); }

int64_t num_threads() { return thread_threads > 0 ? thread_threads : configured_threads.load(std::memory_order_relaxed); }

bool pool_enabled() { return enabled.load(); }

void set_pool_spin_us(int64_t microseconds) {
  configured_spin_us.store(std::max<int64_t>(0, microseconds));
}

int64_t pool_spin_us() { return configured_spin_us.load(); }

namespace {

// One region of pool_self_check. Every region's record lives until the check returns, so a body
// that ran late (after its region returned) is seen, not undefined.
struct CheckRegion {
  int64_t id = 0;
  int64_t begin = 0, end = 0;
  int64_t throw_item = INT64_MIN;  // the item whose run throws; INT64_MIN: none
  bool nested = false;             // each run also makes a region of its own
  const std::atomic<int64_t>* active = nullptr;  // the id of the region now running on this caller
  std::atomic<int64_t>* faults = nullptr;        // by kind: see pool_self_check
  std::unique_ptr<std::atomic<uint8_t>[]> hits;  // times each item ran
};

void check_body(const void* context, int64_t b, int64_t e) {
  const CheckRegion& r = *static_cast<const CheckRegion*>(context);
  if (r.active->load(std::memory_order_acquire) != r.id || b < r.begin || e > r.end || b >= e) {
    r.faults[1].fetch_add(1);
    return;
  }
  for (int64_t i = b; i < e; ++i) r.hits[i - r.begin].fetch_add(1, std::memory_order_relaxed);
  // Unequal work per run, so runs end out of order.
  for (volatile int64_t spin = (b * 2654435761u) % 97; spin > 0; spin = spin - 1) {
  }
  if (r.nested) {  // inline where this run is on the pool; it may use the pool where this run is inline
    std::atomic<int64_t> count{0};
    parallel_run(
        0, 1000, 1,
        [](const void* c, int64_t ib, int64_t ie) {
          static_cast<std::atomic<int64_t>*>(const_cast<void*>(c))->fetch_add(ie - ib);
        },
        &count);
    if (count.load() != 1000) r.faults[2].fetch_add(1);
  }
  if (b <= r.throw_item && r.throw_item < e) throw std::runtime_error("pool_self_check: item " + std::to_string(r.throw_item));
}

}  // namespace

std::vector<int64_t> pool_self_check(int64_t regions, int64_t seed, int64_t max_threads, int64_t throw_every) {
  std::mt19937_64 random(static_cast<uint64_t>(seed));
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(random); };
  std::atomic<int64_t> active{-1};
  std::atomic<int64_t> faults[4] = {};
  std::vector<CheckRegion> records(static_cast<size_t>(std::max<int64_t>(0, regions)));
  const int64_t saved_threads = thread_threads;  // this thread's own setting (0: none)
  for (int64_t id = 0; id < regions; ++id) {
    CheckRegion& r = records[static_cast<size_t>(id)];
    r.id = id;
    r.begin = uniform(-1000, 1000);
    r.end = r.begin + (uniform(0, 3) == 0 ? uniform(1, 8) : uniform(1, 600));
    const int64_t grain = uniform(0, 2) == 0 ? 1 : uniform(1, 64);
    r.nested = uniform(0, 7) == 0;
    const bool throws = throw_every > 0 && uniform(1, throw_every) == 1;
    if (throws) r.throw_item = uniform(r.begin, r.end - 1);
    r.active = &active;
    r.faults = faults;
    r.hits.reset(new std::atomic<uint8_t>[static_cast<size_t>(r.end - r.begin)]);
    for (int64_t i = 0; i < r.end - r.begin; ++i) r.hits[i].store(0, std::memory_order_relaxed);
    if (max_threads > 0) thread_threads = uniform(1, max_threads);  // up and down
    if (uniform(0, 63) == 0) std::this_thread::sleep_for(std::chrono::microseconds(uniform(100, 1500)));  // workers asleep
    active.store(id, std::memory_order_release);
    bool thrown = false;
    try {
      parallel_run(r.begin, r.end, grain, check_body, &r);
    } catch (const std::runtime_error& error) {
      thrown = std::string(error.what()) == "pool_self_check: item " + std::to_string(r.throw_item);
    }
    active.store(-1, std::memory_order_release);
    if (thrown != throws) faults[3].fetch_add(1);
    // Every item once; where a run threw, OpenMP's threads may leave the rest of their share.
    for (int64_t i = 0; i < r.end - r.begin; ++i) {
      const int hits = r.hits[i].load(std::memory_order_relaxed);
      if (hits > 1 || (hits == 0 && !(throws && !pool_enabled()))) faults[0].fetch_add(1);
    }
  }
  thread_threads = saved_threads;
  std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a late body would show by now
  std::vector<int64_t> counts;
  for (const auto& count : faults) counts.push_back(count.load());
  return counts;
}

}  // namespace kvserve
