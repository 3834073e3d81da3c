// spin-bench groups: many small groups at once on one emulated cluster, each running a few small
// allreduces: the distribution of call times (p50, p99, max), every result checked exactly.
#pragma once

#include <cstdint>
#include <string>

namespace spin::bench {

struct groups_options {
  std::uint32_t hosts = 16;        ///< hosts of the emulated star
  std::uint32_t groups = 128;      ///< groups running at once
  std::uint32_t members = 4;       ///< ranks per group (hosts (g * members + k) mod hosts)
  std::uint32_t calls = 5;         ///< allreduces per group
  std::uint64_t bytes = 1024;      ///< message size (int32 elements)
  std::uint32_t lcores = 0;        ///< lcores of the cluster; 0: every CPU
  /// spin::coll's repair timer, shortest and longest interval (coll::options' defaults).
  std::uint32_t repair_min_us = 1000;
  std::uint32_t repair_max_ms = 1000;
  std::string out_dir = "spin-bench-out";
};

/// Runs the groups, prints the call-time percentiles, writes groups.json to out_dir. Exit
/// status: 0 when every result was exact, 1 when one was wrong or a call failed, 2 on bad
/// options or a set-up error.
int run_groups(const groups_options& o);

} // namespace spin::bench
