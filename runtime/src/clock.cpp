#include "clock.hpp"

#include <spin/rt/runtime.hpp>

#include <thread>
#include <utility>

namespace spin::rt {
namespace detail {

double g_ns_per_tick = 1.0;

namespace {
#if defined(__x86_64__)
// One steady_clock reading with the tick count at that moment: the midpoint of the ticks read
// just before and after it. A pair that took long (the thread was preempted between the reads)
// is read again, so that a descheduled moment cannot skew the calibration below.
std::pair<std::chrono::steady_clock::time_point, double> paired_now() {
  std::pair<std::chrono::steady_clock::time_point, double> best{};
  std::uint64_t best_spread = UINT64_MAX;
  for (int k = 0; k < 16; ++k) {
    const std::uint64_t a = ticks();
    const auto t = std::chrono::steady_clock::now();
    const std::uint64_t b = ticks();
    if (b - a < best_spread) {
      best_spread = b - a;
      best = {t, static_cast<double>(a) + static_cast<double>(b - a) / 2};
    }
    if (best_spread < 2000) break;  // well under a microsecond: not preempted
  }
  return best;
}
#endif
} // namespace

// Measured once per process against steady_clock over ~20 ms, from paired readings (an unpaired
// 5 ms calibration was seen 10% off on a loaded VM, which made hpu_stats::busy_ns exceed wall
// time).
double ticks_per_ns() {
  static const double v = [] {
#if defined(__x86_64__)
    const auto [t0, c0] = paired_now();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto [t1, c1] = paired_now();
    const double ns = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    const double r = ns > 0 && c1 > c0 ? (c1 - c0) / ns : 1.0;
#else
    const double r = 1.0;
#endif
    g_ns_per_tick = 1.0 / r;
    return r;
  }();
  return v;
}

} // namespace detail

double cycle_counter_ghz() { return detail::ticks_per_ns(); }

} // namespace spin::rt
