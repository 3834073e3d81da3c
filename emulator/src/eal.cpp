#include <spin/emu/eal.hpp>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_log.h>

#include <mutex>

namespace spin::emu {

std::vector<std::string> default_eal_args(const std::string& file_prefix) {
  return {"spin-emu", "--no-huge", "-m", "1024", "--no-shconf", "--no-pci",
          "--file-prefix=" + file_prefix, "--no-telemetry", "--log-level=lib.eal:error", "--log-level=pmd.net:error"};
}

namespace {
std::mutex eal_mu;
bool eal_done = false;
error eal_err;
}  // namespace

result<void> eal_init(const std::vector<std::string>& args) {
  std::lock_guard lk(eal_mu);
  if (eal_done) {
    if (eal_err.code == errc::ok) return {};
    return eal_err;
  }
  eal_done = true;
  std::vector<std::string> copy = args;
  if (copy.empty()) copy.push_back("spin-emu");
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
