// Test helpers: network namespaces joined by veth pairs, as stand-ins for hosts with NICs
// (multiproc_test.cpp's bridge, tests/collectives/remote_test.cpp's switch process). Root only.
#pragma once

#include "emu_process.hpp"

#include <doctest/doctest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace spin::test {

/// Runs a shell command; returns its exit status and stdout+stderr.
inline std::pair<int, std::string> sh(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed: " + std::string(std::strerror(errno))};
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

/// Runs a command that must succeed.
inline void must(const std::string& cmd) {
  auto [rc, out] = sh(cmd);
  REQUIRE_MESSAGE(rc == 0, "command failed (" << rc << "): " << cmd << "\n" << out);
}

/// Deletes namespaces "spinmp-<pid>-*" left behind by runs whose process is gone.
inline void remove_stale_namespaces() {
  auto [rc, out] = sh("ip netns list");
  if (rc != 0) return;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    const std::string name = line.substr(0, line.find(' '));
    if (stale_name(name)) (void)sh("ip netns del " + name);
  }
}

/// `hosts` namespaces <prefix>-h<i>, each with an interface eth0 whose veth peer p<i> lies in a
/// namespace <prefix>-<middle>:
/// - wiring::bridge: the p<i> are ports of a Linux bridge br0 there (an ordinary Ethernet
///   switch), which knows each rank's MAC (02:53:50:00:hi:lo) on its port statically, so frames
///   never flood to hosts they are not for; multicast snooping is off (with it on, br0 joins
///   224.0.0.106, Multicast Router Discovery, and floods IGMPv3 reports to every port);
/// - wiring::ports: the p<i> are plain interfaces, for a switch-mode spin-emu that runs in that
///   namespace with one port per host.
/// The kernel must send nothing on the links (the emulators would count it as malformed): IPv6
/// is off everywhere. Everything goes when this object goes (deleting a namespace deletes its
/// interfaces).
struct netns_lab {
  enum class wiring { bridge, ports };
  std::string prefix;
  std::vector<std::string> hosts;
  std::string middle_ns;
  std::vector<std::string> created;

  explicit netns_lab(std::size_t n, wiring w = wiring::bridge) {
    REQUIRE_MESSAGE(::geteuid() == 0, "the netns test creates network namespaces and must run as root (CI does); it does not skip");
    auto [rc, out] = sh("ip netns list");
    REQUIRE_MESSAGE(rc == 0, "`ip netns` is unavailable (install iproute2): " << out);
    remove_stale_namespaces();
    prefix = "spinmp-" + std::to_string(::getpid());
    middle_ns = prefix + (w == wiring::bridge ? "-br" : "-sw");
    for (std::size_t i = 0; i < n; ++i) hosts.push_back(prefix + "-h" + std::to_string(i));
    std::vector<std::string> all = hosts;
    all.push_back(middle_ns);
    for (const auto& ns : all) {
      (void)sh("ip netns del " + ns);
      must("ip netns add " + ns);
      created.push_back(ns);
      must("ip netns exec " + ns + " sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1");
      must("ip -n " + ns + " link set lo up");
    }
    if (w == wiring::bridge) {
      must("ip -n " + middle_ns + " link add br0 type bridge stp_state 0 mcast_snooping 0");
      must("ip -n " + middle_ns + " link set br0 up");
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::string p = "p" + std::to_string(i);
      must("ip -n " + middle_ns + " link add " + p + " type veth peer name eth0 netns " + hosts[i]);
      if (w == wiring::bridge) must("ip -n " + middle_ns + " link set " + p + " master br0");
      must("ip -n " + middle_ns + " link set " + p + " up");
      must("ip -n " + hosts[i] + " link set eth0 up");
      if (w == wiring::bridge) {
        char mac[32];
        std::snprintf(mac, sizeof mac, "02:53:50:00:%02x:%02x", static_cast<unsigned>(i >> 8), static_cast<unsigned>(i & 0xff));
        must("bridge -n " + middle_ns + " fdb add " + mac + " dev " + p + " master static");
      }
    }
  }
  ~netns_lab() {
    for (auto it = created.rbegin(); it != created.rend(); ++it) {
      auto [rc, out] = sh("ip netns del " + *it);
      if (rc != 0) std::fprintf(stderr, "netns_lab: cannot delete namespace %s: %s\n", it->c_str(), out.c_str());
    }
  }
};

} // namespace spin::test
