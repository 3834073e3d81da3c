// A host program built out of tree with `pkg-config --cflags --libs spin-host`: reads a handler
// package's manifest (the package format) and prints a NIC's statistics (the host library's
// value types), which a program that drives spin-emu does too.
#include <spin/host/host.hpp>
#include <spin/host/stats.hpp>
#include <spin/rt/package.hpp>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: host_program PACKAGE HANDLER\n");
    return 2;
  }
  auto p = spin::rt::read_package_file(argv[1]);
  if (!p) {
    std::fprintf(stderr, "host_program: %s\n", p.err().message.c_str());
    return 1;
  }
  bool found = false;
  for (const auto& h : p->manifest.handlers) found = found || h.name == argv[2];
  spin::host::nic_stats s;
  s.name = "nic0";
  std::printf("%s: %zu handler(s), %s %s\n%s", argv[1], p->manifest.handlers.size(), argv[2], found ? "found" : "missing",
              spin::host::to_text(s).c_str());
  // No spin-emu listens here: the client reports that, it does not crash.
  auto c = spin::host::client::connect("/nonexistent/spin-emu.sock");
  return found && !c.ok() ? 0 : 1;
}
