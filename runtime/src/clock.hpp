// The cycle counter the runtime times handlers with (the TSC on x86-64) and its rate.
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace spin::rt::detail {

inline std::uint64_t ticks() noexcept {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

/// Ticks per ns, measured once per process (the first call takes ~20 ms).
double ticks_per_ns();
/// 1 / ticks_per_ns(); valid after the first ticks_per_ns() call (runtime::create makes it).
extern double g_ns_per_tick;

inline std::uint64_t ns_to_ticks(std::uint64_t ns) noexcept {
  return static_cast<std::uint64_t>(static_cast<double>(ns) * (1.0 / g_ns_per_tick));
}
inline std::uint64_t ticks_to_ns(std::uint64_t t) noexcept { return static_cast<std::uint64_t>(static_cast<double>(t) * g_ns_per_tick); }

} // namespace spin::rt::detail
