// DPDK's Environment Abstraction Layer, initialised once per process.
#pragma once

#include <spin/result.hpp>

#include <string>
#include <vector>

namespace spin::emu {

/// EAL arguments that work on any machine: no hugepages, no shared config, no PCI scan,
/// 1 GiB of memory, a per-process file prefix, and quiet logs.
std::vector<std::string> default_eal_args(const std::string& file_prefix);

/// Initialises DPDK's EAL with `args` (argv[0] first, as rte_eal_init expects). EAL can be
/// initialised once per process: a second call with any arguments returns ok when the first one
/// succeeded and the first error otherwise. EAL pins its main thread to one CPU, and every
/// thread it then creates inherits that: without an lcore option in `args` (-l, -c, --lcores)
/// eal_init adds `--lcores=0@(the CPUs this process may use)`, so that the main thread floats
/// over them. Main thread only. Errors: invalid_argument (EAL refused the arguments; the message
/// quotes DPDK's reason).
result<void> eal_init(const std::vector<std::string>& args);

/// The CPUs this process may run on, as they were when eal_init ran (EAL narrows the main
/// thread's affinity afterwards), or now when it has not run. Any thread.
std::vector<int> process_cpus();

/// True once eal_init succeeded.
bool eal_ready() noexcept;

} // namespace spin::emu
