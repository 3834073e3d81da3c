// main() of the 'dpdk' suite binaries. DPDK's EAL initialises once per process, so each EAL
// configuration is its own binary: SPIN_EAL_VDEVS (a ';'-separated list of --vdev arguments,
// may be empty) and SPIN_EAL_PREFIX pick it at build time. No hugepages, no PCI.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <spin/emu/eal.hpp>

#include <cstdio>
#include <string>
#include <unistd.h>

int main(int argc, char** argv) {
  std::vector<std::string> args = spin::emu::default_eal_args(std::string(SPIN_EAL_PREFIX) + "-" + std::to_string(getpid()));
  const std::string vdevs = SPIN_EAL_VDEVS;
  std::size_t pos = 0;
  while (pos < vdevs.size()) {
    std::size_t end = vdevs.find(';', pos);
    if (end == std::string::npos) end = vdevs.size();
    if (end > pos) args.push_back("--vdev=" + vdevs.substr(pos, end - pos));
    pos = end + 1;
  }
  if (auto r = spin::emu::eal_init(args); !r) {
    std::fprintf(stderr, "%s\n", r.err().message.c_str());
    return 1;
  }
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}
