// spin-bench vt: benchmarks in virtual time (vt.hpp).
#include "vt.hpp"

#include "../common.hpp"

#include <spin/coll/coll.hpp>
#include <spin/host/message.hpp>
#include <spin/rt/loader.hpp>
#include <spin/sim/cluster.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace spin::bench {
namespace {

double ps_to_ns(std::uint64_t ps) { return static_cast<double>(ps) / 1000.0; }

result<emu::topology> base_topology(const vt_options& o) {
  if (o.topology_file.empty()) return emu::topology{};
  return emu::load_topology_file(o.topology_file);
}

emu::link_model link_of(const vt_options& o) {
  emu::link_model lm;
  lm.rate_gbps = o.link_gbps;
  lm.latency = std::chrono::nanoseconds(static_cast<std::int64_t>(o.link_latency_ns));
  lm.queue_packets = 1u << 16;
  return lm;
}

// ---- pspin ----------------------------------------------------------------------------------

struct pingpong_run {
  sim::node_stats echo;     // the ping-pong NIC
  std::uint64_t end_ps = 0; // when the last echo reached h0
  std::uint64_t echoed = 0;
  std::string error;
};

// h0 sends `packets` one-packet messages of `payload` bytes to h1, whose NIC runs the standard
// ping-pong handler (each packet straight back); `gap_ns` between the sends (0: back to back).
pingpong_run run_pingpong(const emu::topology& models, const vt_options& o, std::uint32_t payload, std::uint32_t packets, double gap_ns) {
  pingpong_run out;
  emu::topology t = emu::pair(link_of(o));
  t.nic = models.nic;
  t.switch_nic = models.switch_nic;
  t.switch_params = models.switch_params;
  auto c = sim::cluster::create(t);
  if (!c) {
    out.error = c.err().message;
    return out;
  }
  sim::cluster& cl = *c.value();
  auto pkg = rt::load_package_file(std::string(SPIN_BENCH_PACKAGE_DIR) + "/pingpong.native.spkg");
  if (!pkg) {
    out.error = pkg.err().message;
    return out;
  }
  constexpr std::uint64_t bits = 0x5050;
  rt::ec_config pp;
  pp.name = "pingpong";
  pp.match.bits = bits;
  if (auto r = pkg.value().bind(pp); !r) {
    out.error = r.err().message;
    return out;
  }
  if (auto r = cl.node(1).install(pp); !r) {
    out.error = r.err().message;
    return out;
  }
  rt::ec_config sink;  // the echoes end on h0: no handler, no window
  sink.name = "sink";
  sink.match.bits = bits;
  if (auto r = cl.node(0).install(sink); !r) {
    out.error = r.err().message;
    return out;
  }
  std::vector<std::byte> mem(payload);
  auto region = cl.node(0).register_host_memory(mem);
  if (!region) {
    out.error = region.err().message;
    return out;
  }
  cl.spawn("h0", [&] {
    for (std::uint32_t i = 0; i < packets; ++i) {
      host::message m;
      m.dest_rank = 1;
      m.match_bits = bits;
      m.message_id = i + 1;
      m.region = region.value();
      m.len_bytes = payload;
      if (auto r = cl.node(0).post(m); !r) {
        out.error = r.err().message;
        return;
      }
      if (gap_ns > 0) cl.node(0).sleep_for(std::chrono::nanoseconds(static_cast<std::int64_t>(gap_ns)));
    }
  });
  if (auto r = cl.run(); !r) out.error = r.err().message;
  // The actor is done: run on until the last echo has landed.
  if (auto r = cl.run(); !r && out.error.empty()) out.error = r.err().message;
  const sim::cluster_stats st = cl.stats();
  out.end_ps = st.now.count();
  out.echo = st.nodes[1];
  out.echoed = st.nodes[0].packets_in;
  return out;
}

int run_pspin(const vt_options& o) {
  auto base = base_topology(o);
  if (!base) {
    std::fprintf(stderr, "spin-bench vt: %s\n", base.err().message.c_str());
    return 2;
  }
  const emu::nic_model& m = base.value().nic;
  std::printf("spin-bench vt pspin: VIRTUAL TIME (spin::sim): the standard ping-pong handler (handlers/std/pingpong.cpp, its counted\n"
              "object) on a modelled NIC of %u clusters x %u HPUs at %.2f GHz, cpi %.2f, scheduler %lld ns, beside PsPIN's published\n"
              "figures (Di Girolamo et al., ISCA 2021). Two hosts, one %.0f Gbit/s link. Modelled time, not this machine's.\n\n",
              m.clusters, m.hpus_per_cluster, m.hpu_ghz, m.cpi, static_cast<long long>(m.scheduler_latency.count()), o.link_gbps);
  // Idle: one packet at a time, far apart.
  const pingpong_run idle64 = run_pingpong(base.value(), o, 64, 64, 10000);
  const pingpong_run idle1k = run_pingpong(base.value(), o, 1024, 64, 10000);
  // Loaded: back to back at line rate; the steady rate is what N more packets add.
  const pingpong_run load1k = run_pingpong(base.value(), o, 1024, o.packets, 0);
  const pingpong_run load2k = run_pingpong(base.value(), o, 1024, 2 * o.packets, 0);
  for (const pingpong_run* r : {&idle64, &idle1k, &load1k, &load2k})
    if (!r->error.empty()) {
      std::fprintf(stderr, "spin-bench vt pspin: %s\n", r->error.c_str());
      return 2;
    }
  bool exact = true;
  for (const pingpong_run* r : {&idle64, &idle1k, &load1k, &load2k}) exact = exact && r->echoed == r->echo.handled && r->echo.handled > 0;
  const sim::node_stats& i1 = idle1k.echo;
  const double instr = i1.invocations ? static_cast<double>(i1.instructions) / static_cast<double>(i1.invocations) : 0;
  const double handler_ns = ps_to_ns(i1.hpu_busy.count()) / static_cast<double>(std::max<std::uint64_t>(1, i1.handled));
  const double lat64 = ps_to_ns(idle64.echo.wait.quantile(0.5));
  const sim::node_stats& l = load2k.echo;
  const double feedback_gbps = static_cast<double>(o.packets) * 1024 * 8 / ps_to_ns(load2k.end_ps - load1k.end_ps);
  const double hpus = static_cast<double>(m.clusters * m.hpus_per_cluster);
  const double hpu_bound_gbps = hpus / handler_ns * 1024 * 8;
  struct row {
    const char* what;
    double pspin, model;
    const char* unit;
  };
  const std::vector<row> rows = {
      {"ping-pong handler, instructions (counted estimate)", 29, instr, "instr"},
      {"ping-pong handler, 1 KiB packet, time on an HPU", 38, handler_ns, "ns"},
      {"feedback throughput, 32 HPUs, 1 KiB packets", 443, feedback_gbps, "Gbit/s"},
      {"latency of a 64 B packet to its handler (idle)", 26, lat64, "ns"},
      {"packet latency under load, median (1 KiB, line rate)", 108, ps_to_ns(l.latency.quantile(0.5)), "ns"},
      {"packet latency under load, 99th percentile", 155, ps_to_ns(l.latency.quantile(0.99)), "ns"},
  };
  bool all = true;
  std::printf("  %-56s %10s %12s %8s %s\n", "figure", "PsPIN", "model", "ratio", "within 2x");
  for (const row& r : rows) {
    const double ratio = r.model / r.pspin;
    const bool ok = ratio >= 0.5 && ratio <= 2.0;
    all = all && ok;
    std::printf("  %-56s %8.0f %-3s %9.1f %-3s %7.2fx %s\n", r.what, r.pspin, r.unit, r.model, r.unit, ratio, ok ? "yes" : "NO");
  }
  std::printf("\n  HPU bound of the feedback test: %.0f HPUs / %.1f ns x 1 KiB = %.0f Gbit/s; the link carries %.0f Gbit/s.\n", hpus,
              handler_ns, hpu_bound_gbps, o.link_gbps);
  std::printf("  Loaded run: %llu packets of 1 KiB back to back, HPU occupancy %.1f%%, at most %u waiting for an HPU, packet buffer\n"
              "  high-water %llu bytes; every packet echoed: %s.\n",
              static_cast<unsigned long long>(l.handled), 100.0 * ps_to_ns(l.hpu_busy.count()) / (ps_to_ns(load2k.end_ps) * hpus),
              l.waiting_max, static_cast<unsigned long long>(l.packet_buffer_max), exact ? "yes" : "NO");
  return all && exact ? 0 : 1;
}

} // namespace

int run_vt(const vt_options& o) {
  if (o.what == "pspin") return run_pspin(o);
  std::fprintf(stderr, "spin-bench vt: unknown benchmark '%s' (pspin)\n", o.what.c_str());
  return 2;
}

} // namespace spin::bench
