// DPDK's Environment Abstraction Layer, initialised once per process.
#pragma once

#include <spin/rt/result.hpp>

#include <string>
#include <vector>

namespace spin::emu {

/// EAL arguments that work on any machine: no hugepages, no shared config, no PCI scan,
/// 1 GiB of memory, a per-process file prefix, and quiet logs.
std::vector<std::string> default_eal_args(const std::string& file_prefix);

/// Initialises DPDK's EAL with `args` (argv[0] first, as rte_eal_init expects). EAL can be
/// initialised once per process: a second call with any arguments returns ok when the first one
/// succeeded and the first error otherwise. Main thread only. Errors: invalid_argument (EAL
/// refused the arguments; the message quotes DPDK's reason).
result<void> eal_init(const std::vector<std::string>& args);

/// True once eal_init succeeded.
bool eal_ready() noexcept;

} // namespace spin::emu
