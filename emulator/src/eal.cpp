#include <spin/emu/eal.hpp>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_log.h>

#include <mutex>

#include <sched.h>

namespace spin::emu {

std::vector<std::string> default_eal_args(const std::string& file_prefix) {
  return {"spin-emu", "--no-huge", "-m", "1024", "--no-shconf", "--no-pci",
          "--file-prefix=" + file_prefix, "--no-telemetry", "--log-level=lib.eal:error", "--log-level=pmd.net:error"};
}

namespace {
std::mutex eal_mu;
bool eal_done = false;
error eal_err;
std::vector<int> eal_cpus;  // the process's CPUs when EAL was initialised

std::vector<int> current_cpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
  if (out.empty()) out.push_back(0);
  return out;
}

bool has_lcore_option(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "-l" || a == "-c" || a.rfind("--lcores", 0) == 0 || (a.size() > 2 && (a.rfind("-l", 0) == 0 || a.rfind("-c", 0) == 0) &&
                                                                   a[2] >= '0' && a[2] <= '9'))
      return true;
  return false;
}
}  // namespace

std::vector<int> process_cpus() {
  {
    std::lock_guard lk(eal_mu);
    if (eal_done && !eal_cpus.empty()) return eal_cpus;
  }
  return current_cpus();
}

result<void> eal_init(const std::vector<std::string>& args) {
  std::lock_guard lk(eal_mu);
  if (eal_done) {
    if (eal_err.code == errc::ok) return {};
    return eal_err;
  }
  eal_done = true;
  eal_cpus = current_cpus();
  std::vector<std::string> copy = args;
  if (copy.empty()) copy.push_back("spin-emu");
  if (!has_lcore_option(copy)) {
    std::string list;
    for (int c : eal_cpus) list += (list.empty() ? "" : ",") + std::to_string(c);
    copy.push_back("--lcores=0@(" + list + ")");
  }
  std::vector<char*> argv;
  for (auto& s : copy) argv.push_back(s.data());
  argv.push_back(nullptr);
  if (rte_eal_init(static_cast<int>(copy.size()), argv.data()) < 0) {
    std::string joined;
    for (auto& s : args) joined += (joined.empty() ? "" : " ") + s;
    eal_err = error{errc::invalid_argument,
                    "DPDK EAL initialisation failed (" + std::string(rte_strerror(rte_errno)) + ") with arguments: " + joined};
    return eal_err;
  }
  return {};
}

bool eal_ready() noexcept {
  std::lock_guard lk(eal_mu);
  return eal_done && eal_err.code == errc::ok;
}

}  // namespace spin::emu
