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
#include <sstream>
#include <sys/mman.h>
#include <unistd.h>

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
  // Until the actor is done and the last echo has landed.
  if (auto r = cl.run(); !r) out.error = r.err().message;
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

// ---- allreduce, allgather, broadcast ---------------------------------------------------------

coll::algorithm algorithm_named(const std::string& a) {
  if (a == "switch") return coll::algorithm::switch_agg;
  if (a == "edge_ring") return coll::algorithm::edge_ring;
  return coll::algorithm::host_ring;
}

struct coll_row {
  std::uint32_t hosts = 0;
  std::string algorithm;
  std::uint64_t bytes = 0;
  double time_us = 0;          // virtual time of one call (rank 0, mean of the timed calls)
  std::uint64_t wrong = 0;
  double repaired = 0;         // epochs repaired per timed call, all ranks together (comm_stats)
  std::uint32_t slots = 0;     // the group's switch slots (slots_of)
  std::string error;
  sim::cluster_stats st;
  double wall_s = 0;           // wall-clock seconds the simulation took (this machine)
};

// The group's switch slots: --switch-slots, or (0) coll::options' 64, fewer when the members'
// start bursts would fill more than half the switch's packet buffer: each member sends one
// packet per slot at once, so n x slots x payload bytes reach the switch together, and its
// HPUs, not the line, drain them (256 hosts x 64 slots x 4 KiB is the whole 64 MiB buffer: it
// dropped 210 packets in a 1 MiB allreduce, whose repairs tripled its time).
std::uint32_t slots_of(const vt_options& o, const emu::topology& t, std::uint32_t n) {
  if (o.switch_slots != 0) return o.switch_slots;
  const std::uint64_t payload = o.packet_bytes != 0 ? o.packet_bytes : 4096;
  const std::uint64_t fit = t.switch_nic.packet_buffer_bytes / (2 * std::uint64_t{n} * payload);
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(fit, 1, coll::options{}.switch_slots));
}

// The values every rank contributes (one shared input, so that 256 ranks of 1 GiB fit): small
// integers, whose sum over up to 2^16 ranks is exact in float32. Period 13 (pattern_input).
float value_at(std::uint64_t i) { return static_cast<float>(i % 13); }

// The shared input: count float32 values value_at(i) whose pages repeat one block of 13 x 4 MiB
// (value_at's period divides the block), mapped again and again from one memfd, so that 8 GiB
// of input take 52 MiB of memory (the outputs take their full size). Read-only.
class pattern_input {
 public:
  explicit pattern_input(std::uint64_t count) {
    constexpr std::uint64_t block = std::uint64_t{13} << 22;  // bytes: 13 x 4 MiB
    const std::uint64_t bytes = std::max<std::uint64_t>(count * 4, 1);
    _len = (bytes + block - 1) / block * block;
    const int fd = ::memfd_create("spin-bench-vt-input", 0);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(block)) != 0) {
      if (fd >= 0) ::close(fd);
      return;
    }
    void* b = ::mmap(nullptr, block, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b != MAP_FAILED) {
      auto* f = static_cast<float*>(b);
      for (std::uint64_t i = 0; i < block / 4; ++i) f[i] = value_at(i);
      ::munmap(b, block);
      void* r = ::mmap(nullptr, _len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (r != MAP_FAILED) {
        _base = static_cast<char*>(r);
        for (std::uint64_t off = 0; off < _len && _base != nullptr; off += block)
          if (::mmap(_base + off, block, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
            ::munmap(_base, _len);
            _base = nullptr;
          }
      }
    }
    ::close(fd);
  }
  ~pattern_input() {
    if (_base != nullptr) ::munmap(_base, _len);
  }
  pattern_input(const pattern_input&) = delete;
  pattern_input& operator=(const pattern_input&) = delete;
  const float* data() const { return reinterpret_cast<const float*>(_base); }

 private:
  char* _base = nullptr;
  std::uint64_t _len = 0;
};

// The inputs and outputs pass through each rank's two staging buffers (they are not in the
// communicator's arena): larger buffers mean fewer epochs per call, and 2 x hosts of them must
// fit in memory.
std::uint64_t staging_of(const vt_options& o, std::uint32_t n) {
  if (o.staging_bytes != 0) return o.staging_bytes;
  std::uint64_t s = std::uint64_t{32} << 20;
  while (s > (1u << 20) && 2 * n * s > (std::uint64_t{4} << 30)) s /= 2;
  return s;
}

coll_row run_collective(const emu::topology& models, const vt_options& o, std::uint32_t n, std::uint64_t bytes, const std::string& algo) {
  coll_row row;
  row.hosts = n;
  row.algorithm = algo;
  row.bytes = bytes;
  emu::topology t;
  if (o.hosts_per_leaf == 0) {
    t = emu::star(n, link_of(o));
  } else {
    if (n % o.hosts_per_leaf != 0) {
      row.error = std::to_string(n) + " hosts do not fill leaves of " + std::to_string(o.hosts_per_leaf);
      return row;
    }
    t = emu::fat_tree(n / o.hosts_per_leaf, o.hosts_per_leaf, o.spines, link_of(o));
  }
  t.nic = models.nic;
  t.switch_nic = models.switch_nic;
  t.switch_params = models.switch_params;
  const auto w0 = std::chrono::steady_clock::now();
  auto c = sim::cluster::create(t);
  if (!c) {
    row.error = c.err().message;
    return row;
  }
  sim::cluster& cl = *c.value();
  coll::fabric_options fo;
  const std::uint32_t slots = slots_of(o, t, n);
  row.slots = slots;
  fo.slots_per_switch = std::max(fo.slots_per_switch, slots);  // the group may take more than the default pool
  auto fab = coll::fabric::create(t, cl.controls(), fo);
  if (!fab) {
    row.error = fab.err().message;
    return row;
  }
  // allreduce and broadcast: `bytes` in and out; allgather: `bytes` out, a block of bytes / n
  // (float32 elements, rounded down, at least one) from each rank.
  const std::uint64_t block = o.what == "allgather" ? std::max<std::uint64_t>(1, bytes / 4 / n) : 0;
  const std::uint64_t count = o.what == "allgather" ? block * n : bytes / 4;
  row.bytes = count * 4;
  const pattern_input in(count);
  if (in.data() == nullptr) {
    row.error = std::string("cannot map the input: ") + std::strerror(errno);
    return row;
  }
  // One output per rank while they fit in 2 GiB; else one shared (each rank checks it right
  // after its call, before any other rank runs: actors hand over only in waits).
  const bool shared_out = static_cast<double>(n) * static_cast<double>(bytes) > 2.0 * (1ull << 30);
  std::vector<std::vector<float>> out(shared_out ? 1 : n, std::vector<float>(count));
  std::vector<std::uint64_t> wrong(n, 0);
  std::vector<std::string> errors(n);
  std::vector<double> elapsed(n, 0);
  std::vector<std::uint64_t> repaired(n, 0);
  const coll::algorithm a = algorithm_named(algo);
  for (std::uint32_t r = 0; r < n; ++r)
    cl.spawn("rank" + std::to_string(r), [&, r] {
      coll::group g;
      g.id = 1;
      g.me = r;
      for (std::uint32_t i = 0; i < n; ++i) g.members.push_back(i);
      coll::options co;
      co.switches = fab.value().get();
      co.staging_bytes = staging_of(o, n);
      co.arena_bytes = 4 * co.staging_bytes + (8 << 20);  // staging, and host_ring's partial sums
      co.timeout = std::chrono::milliseconds(600'000);
      co.window_packets = o.window;
      co.switch_slots = slots;
      co.packet_bytes = o.packet_bytes;
      auto cm = coll::communicator::create(*cl.host(r), g, co);
      if (!cm) {
        errors[r] = cm.err().message;
        return;
      }
      float* res = out[shared_out ? 0 : r].data();
      // One warm-up call (joins the switch, installs the ECs), of --warmup-bytes if given.
      const std::uint64_t warm = o.warmup_bytes != 0 ? std::min(count, std::max<std::uint64_t>(o.what == "allgather" ? n : 1, o.warmup_bytes / 4)) : count;
      for (std::uint32_t it = 0; it < 1 + o.iters; ++it) {
        const auto t0 = cl.host(r)->now();
        const std::uint64_t c = it == 0 ? warm : count;
        result<void> x = o.what == "allgather"   ? cm.value()->allgather(in.data() + r * (c / n), res, c / n, coll::dtype::f32, a)
                         : o.what == "broadcast" ? cm.value()->broadcast(in.data(), res, c, coll::dtype::f32, 0, a)
                                                 : cm.value()->allreduce(in.data(), res, c, coll::dtype::f32, coll::op::sum, a);
        if (!x) {
          errors[r] = x.err().message;
          return;
        }
        if (it == 0) repaired[r] = cm.value()->stats().repaired_epochs;
        else elapsed[r] += std::chrono::duration<double, std::micro>(cl.host(r)->now() - t0).count();
      }
      repaired[r] = cm.value()->stats().repaired_epochs - repaired[r];
      const float times = o.what == "allreduce" ? static_cast<float>(n) : 1.0f;  // allgather, broadcast: the input itself
      for (std::uint64_t i = 0; i < count; ++i) wrong[r] += res[i] != value_at(i) * times;
    });
  if (auto rr = cl.run(); !rr) row.error = rr.err().message;
  for (std::uint32_t r = 0; r < n && row.error.empty(); ++r)
    if (!errors[r].empty()) row.error = "rank " + std::to_string(r) + ": " + errors[r];
  for (auto w : wrong) row.wrong += w;
  for (auto x : repaired) row.repaired += static_cast<double>(x) / o.iters;
  row.time_us = elapsed[0] / o.iters;
  row.st = cl.stats();
  row.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  return row;
}

std::string fmt_bytes(std::uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) std::snprintf(buf, sizeof buf, "%llu GiB", static_cast<unsigned long long>(b >> 30));
  else if (b >= (1ull << 20) && b % (1ull << 20) == 0) std::snprintf(buf, sizeof buf, "%llu MiB", static_cast<unsigned long long>(b >> 20));
  else if (b >= 1024 && b % 1024 == 0) std::snprintf(buf, sizeof buf, "%llu KiB", static_cast<unsigned long long>(b >> 10));
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

// nccl-tests' bus bandwidth factors: what each rank's link carries per byte of the result.
double bus_factor(const std::string& what, std::uint32_t n) {
  if (n < 2) return 0;
  if (what == "allreduce") return 2.0 * (n - 1) / n;
  if (what == "allgather") return static_cast<double>(n - 1) / n;
  return 1.0;  // broadcast
}

// vt_<what>.dat, .gp and .png: one panel per host count, modelled time per call against
// size, one line per algorithm (rows that failed are left out).
void plot_collective(const vt_options& o, const std::vector<coll_row>& rows) {
  const std::string base = o.out_dir + "/vt_" + o.what;
  std::ostringstream dat;
  std::vector<std::pair<std::uint32_t, std::string>> series;
  for (std::uint32_t n : o.hosts)
    for (const std::string& a : o.algorithms) {
      dat << (series.empty() ? "" : "\n\n") << "# " << n << " hosts, " << a << '\n';
      for (const auto& r : rows)
        if (r.hosts == n && r.algorithm == a && r.error.empty() && r.time_us > 0) dat << r.bytes << ' ' << r.time_us << '\n';
      series.emplace_back(n, a);
    }
  if (!write_text(base + ".dat", dat.str())) return;
  // One tic per size measured, named as the table names it (gnuplot's own tics fall between).
  std::string size_tics;
  for (std::uint64_t b : o.sizes) size_tics += (size_tics.empty() ? "'" : ", '") + fmt_bytes(b) + "' " + std::to_string(b);
  const std::size_t panels = o.hosts.size();
  const std::size_t cols = panels < 2 ? 1 : 2, lines = (panels + cols - 1) / cols;
  std::ostringstream gp;
  gp << "set terminal pngcairo size " << 600 * cols << "," << 420 * lines << " noenhanced\nset output '" << base << ".png'\n"
     << "set multiplot layout " << lines << "," << cols << " title 'spin-bench vt " << o.what
     << ": VIRTUAL TIME (modelled), float32, " << o.link_gbps << " Gbit/s links, " << (o.hosts_per_leaf == 0 ? "star" : "fat tree")
     << "'\n"
     << "set xlabel 'size (bytes)'\nset logscale x 2\nset xtics (" << size_tics << ")\nset offsets graph 0.03, graph 0.03, 0, 0\nset logscale y\nset format y '%g'\n"
     << "set ylabel 'modelled time per call (us)'\nset key left top\nset grid\n";
  for (std::uint32_t n : o.hosts) {
    gp << "set title '" << n << " hosts'\nplot ";
    bool first = true;
    for (std::size_t i = 0; i < series.size(); ++i)
      if (series[i].first == n) {
        gp << (first ? "" : ", ") << "'" << base << ".dat' index " << i << " using 1:2 with linespoints title '" << series[i].second << "'";
        first = false;
      }
    gp << '\n';
  }
  gp << "unset multiplot\n";
  if (std::string why = run_gnuplot(base + ".gp", gp.str()); !why.empty()) std::printf("no plot: %s\n", why.c_str());
  else std::printf("wrote %s.png\n", base.c_str());
}

int run_collective_table(const vt_options& o) {
  auto base = base_topology(o);
  if (!base) {
    std::fprintf(stderr, "spin-bench vt: %s\n", base.err().message.c_str());
    return 2;
  }
  if (o.hosts_per_leaf != 0)
    for (std::uint32_t n : o.hosts)
      if (n % o.hosts_per_leaf != 0) {
        std::fprintf(stderr, "spin-bench vt: %u hosts do not fill leaves of --hosts-per-leaf %u\n", n, o.hosts_per_leaf);
        return 2;
      }
  const emu::nic_model& m = base.value().nic;
  const char* what = o.what == "allreduce" ? "float32 sum allreduce" : o.what == "allgather" ? "float32 allgather" : "float32 broadcast from rank 0";
  const std::string shape = o.hosts_per_leaf == 0 ? std::string("a star of") :
                            "a two-level fat tree (" + std::to_string(o.hosts_per_leaf) + " hosts per leaf, " + std::to_string(o.spines) + " spines) of";
  std::printf("spin-bench vt %s: VIRTUAL TIME (spin::sim): spin::coll's %s, its handlers' counted objects on\n"
              "modelled NICs (%u x %u HPUs at %.2f GHz, cpi %.2f, PCIe %.0f Gbit/s) and %s %.0f Gbit/s links (%.0f ns); switches\n"
              "forward in %lld ns, their handler units %u x %u HPUs. time: modelled time of one call on rank 0 (mean of %u after one\n"
              "warm-up); size: the result's bytes (allgather: every rank's block together); algbw = size/time, busbw = algbw x %s.\n"
              "repaired: epochs the repair timer found stalled and repaired, per call, all ranks together (lost or late packets\n"
              "resent). wall s: what simulating the row took on this machine. slots: the group's switch slots (%s).\n"
              "%u packets in flight per rank in the edge algorithms; payload %s bytes per packet; staging %s bytes per rank (buffers\n"
              "outside the arena pass through it; auto: 4 GiB / (2 x hosts), 1 .. 32 MiB). host_ring is allreduce only.\n\n",
              o.what.c_str(), what, m.clusters, m.hpus_per_cluster, m.hpu_ghz, m.cpi, m.pcie_gbps, shape.c_str(), o.link_gbps,
              o.link_latency_ns, static_cast<long long>(base.value().switch_params.latency.count()), base.value().switch_nic.clusters,
              base.value().switch_nic.hpus_per_cluster, o.iters,
              o.what == "allreduce" ? "2(n-1)/n" : o.what == "allgather" ? "(n-1)/n" : "1",
              o.switch_slots != 0 ? "--switch-slots" : "auto: 64, or fewer so that\nhosts x slots x payload fill at most half the switch's packet buffer",
              o.window, o.packet_bytes == 0 ? "4096" : std::to_string(o.packet_bytes).c_str(),
              o.staging_bytes == 0 ? "auto" : std::to_string(o.staging_bytes).c_str());
  std::printf("%6s %-10s %9s %12s %9s %9s %6s %10s %10s %9s %9s %7s %9s %5s %6s %8s %7s\n", "hosts", "algorithm", "size", "time us", "algbw",
              "busbw", "#wrong", "pkt p50 ns", "pkt p99 ns", "host HPU%", "sw HPU%", "sw q max", "sw buf KiB", "slots", "drops", "repaired",
              "wall s");
  std::vector<coll_row> rows;
  bool ok = true;
  for (std::uint32_t n : o.hosts)
    for (std::uint64_t b : o.sizes)
      for (const std::string& algo : o.algorithms) {
        if (algo == "host_ring" && o.what != "allreduce") continue;  // allreduce only
        coll_row r = run_collective(base.value(), o, n, b, algo);
        if (!r.error.empty() || r.wrong != 0) ok = false;
        if (!r.error.empty()) {
          std::printf("%6u %-10s %9s  failed: %s\n", n, algo.c_str(), fmt_bytes(b).c_str(), r.error.c_str());
          rows.push_back(std::move(r));
          continue;
        }
        // Per-packet latency at the hosts' NICs (all hosts' histograms merged), HPU occupancy
        // of the hosts (mean) and of the switch, the deepest switch port queue.
        sim::histogram lat;
        double host_busy = 0, sw_busy = 0;
        std::uint64_t drops = 0, sw_buf = 0;
        std::uint32_t qmax = 0;
        const double now = static_cast<double>(r.st.now.count());
        for (const auto& nd : r.st.nodes) {
          for (auto d : nd.drops) drops += d;
          const double occ = now > 0 ? static_cast<double>(nd.hpu_busy.count()) / now / nd.hpus : 0;
          if (nd.is_switch) {  // the busiest switch
            sw_busy = std::max(sw_busy, occ);
            sw_buf = std::max(sw_buf, nd.packet_buffer_max);
          } else {
            host_busy += occ / n;
            for (std::size_t k = 0; k < lat.buckets.size(); ++k) lat.buckets[k] += nd.latency.buckets[k];
            lat.count += nd.latency.count;
            lat.max = std::max(lat.max, nd.latency.max);
          }
        }
        for (const auto& p : r.st.ports)
          if (p.from[0] != 'h') qmax = std::max(qmax, p.depth_max);  // a switch's port ("s..", "l..")
        const double algbw = r.time_us > 0 ? static_cast<double>(r.bytes) / r.time_us / 1e3 : 0;
        std::printf("%6u %-10s %9s %12.1f %9.2f %9.2f %6llu %10.0f %10.0f %9.2f %9.2f %7u %9.0f %5u %6llu %8.2f %7.1f\n", n, algo.c_str(),
                    fmt_bytes(r.bytes).c_str(), r.time_us, algbw, algbw * bus_factor(o.what, n), static_cast<unsigned long long>(r.wrong),
                    ps_to_ns(lat.quantile(0.5)), ps_to_ns(lat.quantile(0.99)), 100 * host_busy, 100 * sw_busy, qmax,
                    static_cast<double>(sw_buf) / 1024, r.slots, static_cast<unsigned long long>(drops), r.repaired, r.wall_s);
        std::fflush(stdout);
        if (o.json) std::printf("%s", sim::to_json(r.st).c_str());
        rows.push_back(std::move(r));
      }
  // CSV for plots.
  std::filesystem::create_directories(o.out_dir);
  std::string csv = "hosts,algorithm,bytes,time_us,algbw_gbs,busbw_gbs,wrong,repaired,switch_slots,error\n";
  for (const auto& r : rows) {
    const double algbw = r.time_us > 0 ? static_cast<double>(r.bytes) / r.time_us / 1e3 : 0;
    csv += std::to_string(r.hosts) + "," + r.algorithm + "," + std::to_string(r.bytes) + "," + std::to_string(r.time_us) + "," +
           std::to_string(algbw) + "," + std::to_string(algbw * bus_factor(o.what, r.hosts)) + "," +
           std::to_string(r.wrong) + "," + std::to_string(r.repaired) + "," + std::to_string(r.slots) + "," + csv_field(r.error) + "\n";
  }
  const std::string path = o.out_dir + "/vt_" + o.what + ".csv";
  if (!write_text(path, csv)) std::fprintf(stderr, "spin-bench vt: cannot write %s\n", path.c_str());
  else std::printf("\nwrote %s\n", path.c_str());
  if (o.plots) plot_collective(o, rows);
  return ok ? 0 : 1;
}

} // namespace

int run_vt(const vt_options& o) {
  if (o.what == "pspin") return run_pspin(o);
  if (o.what == "allreduce" || o.what == "allgather" || o.what == "broadcast") return run_collective_table(o);
  std::fprintf(stderr, "spin-bench vt: unknown benchmark '%s' (pspin, allreduce, allgather, broadcast)\n", o.what.c_str());
  return 2;
}

} // namespace spin::bench
