// spin-bench's --repair-min-us and --repair-max-ms (coll, groups) as spin::coll options.
#pragma once

#include <spin/coll/coll.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace spin::bench {

/// The repair timer between min_us and max_ms: options::repair_min_interval and
/// repair_max_interval; it starts at the library's repair_interval (10 ms) kept within the two.
/// min above max is left for communicator::create to refuse (invalid_argument, naming both).
inline void set_repair_timer(coll::options& co, std::uint32_t min_us, std::uint32_t max_ms) {
  co.repair_min_interval = std::chrono::microseconds(min_us);
  co.repair_max_interval = std::chrono::milliseconds(max_ms);
  if (co.repair_min_interval <= co.repair_max_interval)
    co.repair_interval = std::clamp(co.repair_interval, co.repair_min_interval, co.repair_max_interval);
}

}  // namespace spin::bench
