// spin-bench handlers: handler throughput of spin-emu's NIC per standard handler, packet size,
// HPU count and target, beside forwarding and one-core memory baselines measured in the same run,
// and the NIC model that turns the measured cycles into a prediction for a sPIN NIC.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spin::bench {

struct handlers_options {
  /// Frame sizes (bytes, Ethernet header to the end of the payload, no FCS). The spin headers
  /// take 88 bytes, so 64 runs at 88 (no payload). The defaults give payloads of 0, 64, 256,
  /// 1024, 4096 and 8912 bytes.
  std::vector<std::uint32_t> sizes{64, 152, 344, 1112, 4184, 9000};
  std::vector<std::string> handlers;  ///< names to run; empty: all
  std::vector<std::string> targets{"native", "ebpf"};
  std::vector<std::uint32_t> hpus;    ///< HPU counts; empty: 1 .. hardware threads
  double seconds = 0.5;               ///< one measurement
  std::uint32_t repeats = 3;          ///< measurements per row; the median is reported
  double warmup_seconds = 0.2;
  /// A measurement goes on past `seconds` until the NIC received this many packets, or until
  /// max(10 s, 100 x seconds) passed (then the row says it ended at that deadline): a row on a
  /// loaded machine still sees packets (the smoke test under sanitizers).
  std::uint64_t min_packets = 0;
  int poll_cpu = 0;                   ///< CPU of HPU 0 (EAL main lcore) and of the baselines
  std::uint32_t pool_mbufs = 8191;    ///< mbufs per port pool (message ids repeat after this many)
  std::string package_dir;            ///< where <handler>.<target>.spkg are
  std::string out_dir = "spin-bench-out";
  bool plots = true;
  bool baselines = true;              ///< false: skip them (profiling a handler; no ratios)
  // NIC model (defaults: PsPIN's reference NIC, ISCA 2021)
  std::uint32_t model_hpus = 32;
  double model_ghz = 1.0;
  double model_line_gbps = 400;
};

/// Runs the benchmark, prints the report, writes handlers.csv, handlers.json and the plots to
/// out_dir. Exit status: 0 when every check passed, 1 when a check failed (a lost, dropped or
/// wrongly handled packet, a wrong result in handler memory), 2 on bad options or a set-up
/// error. Missing an aim is reported but does not change the status.
int run_handlers(const handlers_options& o);

} // namespace spin::bench
