// The library's own entry points: the last error of a call, the instruction set it was built
// for, the thread count, the worker pool's settings (thread_pool.h) and the AMX switch.
//
// The instruction-set rule (kvserve/kernels/build.py): the vector ISA is the library's, fixed when
// Python loads the variant the CPU runs, and code specialises only by the compiler's macros; AMX
// is the one choice made at run time inside the library (amx_tiles.h), here: the probe of
// amx_tiles.h, once, and the user's switch as Python passes it (kvserve_set_amx_enabled).
#include "abi.h"

#include <atomic>
#include <string>

#include "amx_tiles.h"
#include "kernels.h"
#include "thread_pool.h"

namespace {
thread_local std::string last_error;
std::atomic<bool> amx_enabled{true};  // kvserve_set_amx_enabled: false when the user turned AMX off
}  // namespace

void kvserve::set_last_error(const char* message) { last_error = message; }

void kvserve::set_amx_enabled(bool enabled) { amx_enabled.store(enabled); }

bool kvserve::amx_linear_available() {
#if defined(KVSERVE_AMX_BUILD)
  if (!amx_enabled.load()) return false;  // switched off: the probe (a syscall) never runs
  static const bool supported = kvserve_amx::amx_supported();
  return supported;
#else
  return false;
#endif
}

extern "C" {

// The message of this thread's last failed call ("" when none failed).
KVSERVE_EXPORT const char* kvserve_last_error() { return last_error.c_str(); }

// The ABI version Python expects (kvserve/kernels/library.py: ABI_VERSION); a library of another
// version (an old build left in a cache) is not loaded.
KVSERVE_EXPORT int64_t kvserve_abi_version() { return 10; }

// The instruction-set variant this library was compiled for (build.py: VARIANTS).
KVSERVE_EXPORT const char* kvserve_variant() {
#if defined(KVSERVE_VARIANT)
  return KVSERVE_VARIANT;
#else
  return "unknown";
#endif
}

KVSERVE_EXPORT void kvserve_set_num_threads(int64_t threads) { kvserve::set_num_threads(threads); }
KVSERVE_EXPORT int64_t kvserve_num_threads() { return kvserve::num_threads(); }
KVSERVE_EXPORT void kvserve_set_pool_enabled(int32_t enabled) { kvserve::set_pool_enabled(enabled != 0); }
KVSERVE_EXPORT int32_t kvserve_pool_enabled() { return kvserve::pool_enabled() ? 1 : 0; }
KVSERVE_EXPORT void kvserve_set_pool_spin_us(int64_t microseconds) { kvserve::set_pool_spin_us(microseconds); }
KVSERVE_EXPORT int64_t kvserve_pool_spin_us() { return kvserve::pool_spin_us(); }

// AMX tiles allowed (1, the default) or not (0: every kernel takes its vector path). Python sets it
// once, when it opens the library, from KVSERVE_AMX (kvserve/kernels/library.py).
KVSERVE_EXPORT void kvserve_set_amx_enabled(int32_t enabled) { kvserve::set_amx_enabled(enabled != 0); }
// AMX-BF16 tiles usable here: the CPU and OS grant them, this is the avx512_bf16 library, and the
// switch allows them.
KVSERVE_EXPORT int32_t kvserve_amx_linear_available() { return kvserve::amx_linear_available() ? 1 : 0; }

// faults: int64 [4], filled as pool_self_check returns them (thread_pool.h).
KVSERVE_EXPORT int kvserve_pool_self_check(int64_t regions, int64_t seed, int64_t max_threads, int64_t throw_every,
                                           int64_t* faults) {
  return kvserve::guarded([&] {
    const std::vector<int64_t> counts = kvserve::pool_self_check(regions, seed, max_threads, throw_every);
    for (size_t i = 0; i < counts.size(); ++i) faults[i] = counts[i];
  });
}

}  // extern "C"
