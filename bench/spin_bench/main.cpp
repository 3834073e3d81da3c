// spin-bench: handler throughput and collective benchmarks against baselines run in the same
// process or script (docs/benchmarks.md).
//
//   spin-bench handlers [options]   handler throughput of spin-emu's NIC, with the NIC model
//   spin-bench coll [options]       nccl-tests-style allreduce tables: spin::coll's algorithms,
//                                   Gloo and Open MPI on the same data
//   spin-bench groups [options]     many small groups at once: call-time percentiles
//   spin-bench reductions [options] the collectives' reduction kernels per datatype, ns per value
//   spin-bench sparse [options]     sparse allreduce per ranks, density and type, beside dense float32 and bfloat16
//
// Exit status: 0 when every check passed; 1 when a check failed (lost, dropped or wrongly handled
// packets, wrong results); 2 on bad options or set-up errors. Missing an aim is reported, not an
// error.
#if SPIN_BENCH_HAVE_COLL
#include "coll.hpp"
#include "groups.hpp"

#include <spin/coll/coll.hpp>
#endif
#include "handlers.hpp"
#include "reductions.hpp"
#include "vt.hpp"
#if SPIN_BENCH_HAVE_COLL
#include "sparse.hpp"
#endif

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>

#ifndef SPIN_BENCH_PACKAGE_DIR
#define SPIN_BENCH_PACKAGE_DIR "."
#endif
#ifndef SPIN_BENCH_MPI_PEER
#define SPIN_BENCH_MPI_PEER ""
#endif

namespace {
// CLI::Range lets NaN through (every comparison with it is false).
const CLI::Validator finite_number(
    [](std::string& s) -> std::string {
      std::size_t used = 0;
      double v = 0;
      try {
        v = std::stod(s, &used);
      } catch (...) {
        return "not a number: " + s;
      }
      return used == s.size() && std::isfinite(v) ? std::string() : "not a finite number: " + s;
    },
    "FINITE");

#if SPIN_BENCH_HAVE_COLL
// spin::coll's repair timer bounds, the same options in every collective benchmark.
void add_repair_options(CLI::App* c, std::uint32_t& min_us, std::uint32_t& max_ms) {
  c->add_option("--repair-min-us", min_us, "spin::coll's shortest repair interval (options::repair_min_interval), us")
      ->capture_default_str()
      ->check(CLI::Range(1u, 60'000'000u));
  c->add_option("--repair-max-ms", max_ms,
                "spin::coll's longest repair interval (options::repair_max_interval), ms; the repair timer starts at "
                "options::repair_interval (10 ms, kept within the two) and follows measured round trips in between")
      ->capture_default_str()
      ->check(CLI::Range(1u, 60'000u));
}
#endif
} // namespace

int main(int argc, char** argv) {
  CLI::App app{"spin-bench: handler throughput and collective benchmarks of spinnic, each beside baselines measured in the same run"};
  app.require_subcommand(1);

  spin::bench::handlers_options h;
  h.package_dir = SPIN_BENCH_PACKAGE_DIR;
  CLI::App* hc = app.add_subcommand(
      "handlers",
      "Throughput of spin-emu's NIC for each standard handler x frame size x HPU count x target (native, eBPF-JIT) on net_null, beside "
      "io forwarding and one core's memcpy and float32-add bandwidth measured in the same run; then a NIC model (HPUs x GHz against "
      "line rate) and ping-pong beside PsPIN. Writes handlers.csv, handlers.json and handlers.png to --out.");
  hc->add_option("--sizes", h.sizes, "frame sizes in bytes, 64..9000 (a spin frame has at least 88 bytes: 64 runs at 88)")
      ->capture_default_str()
      ->check(CLI::Range(64u, 9000u));
  hc->add_option("--handler", h.handlers,
                 "handlers to run (default: all): empty, noop, isum, fsum, pingpong, strided_unpack, histogram, filter, bcast_forward");
  hc->add_option("--target", h.targets, "targets of packaged handlers: native, ebpf")->capture_default_str()->check(CLI::IsMember({"native", "ebpf"}));
  // More HPU threads than CPUs starve each other inside the cacheless mempool's ring (a thread
  // preempted mid-operation holds the others up): the rows then crawl and fail their checks.
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  hc->add_option("--hpus", h.hpus, "HPU counts to run, 1 .. hardware threads (" + std::to_string(cpus) + "; default: all of them)")
      ->check(CLI::Range(1u, cpus));
  hc->add_option("--seconds", h.seconds, "duration of one measurement")->capture_default_str()->check(finite_number)->check(CLI::Range(0.01, 600.0));
  hc->add_option("--repeats", h.repeats, "measurements per row (the median is reported)")->capture_default_str()->check(CLI::Range(1u, 1000u));
  hc->add_option("--min-packets", h.min_packets,
                 "a measurement goes on past --seconds until the NIC received this many packets, or until max(10 s, 100 x --seconds)")
      ->capture_default_str();
  hc->add_option("--warmup", h.warmup_seconds, "warm-up run per row (seconds)")->capture_default_str()->check(finite_number)->check(CLI::Range(0.0, 60.0));
  hc->add_option("--poll-cpu", h.poll_cpu, "CPU of HPU 0 and the baselines; HPU i runs on (poll-cpu + i) mod CPUs")->capture_default_str();
  hc->add_option("--pool-mbufs", h.pool_mbufs, "mbufs per port pool (message ids repeat after this many frames)")
      ->capture_default_str()
      ->check(CLI::Range(2049u, 1u << 20));
  hc->add_option("--packages", h.package_dir, "directory holding <handler>.<target>.spkg")->capture_default_str();
  hc->add_option("--out", h.out_dir, "directory for handlers.csv, .json, .dat, .gp and .png")->capture_default_str();
  hc->add_flag("!--no-plot", h.plots, "do not run gnuplot");
  hc->add_flag("!--no-baselines", h.baselines, "skip the baselines (for profiling a handler; no ratios are printed)");
  hc->add_option("--model-hpus", h.model_hpus, "NIC model: HPUs (PsPIN: 32)")->capture_default_str()->check(CLI::Range(1u, 4096u));
  hc->add_option("--model-ghz", h.model_ghz, "NIC model: HPU clock in GHz (PsPIN: 1)")->capture_default_str()->check(finite_number)->check(CLI::Range(0.01, 10.0));
  hc->add_option("--line-gbps", h.model_line_gbps, "NIC model: line rate in Gbit/s (PsPIN: 400)")->capture_default_str()->check(finite_number)->check(CLI::Range(0.1, 10000.0));

  spin::bench::reductions_options ro;
  CLI::App* rc = app.add_subcommand(
      "reductions",
      "What the collectives' sum kernels (widen, fold, narrow of spin/coll/types.hpp) cost per value on one core for every "
      "datatype, block formats included, beside float32's in the same run; checks that narrow(widen(x)) == x.");
  rc->add_option("--values", ro.values, "values per buffer")->capture_default_str()->check(CLI::Range(std::uint64_t{32}, std::uint64_t{1} << 28));
  rc->add_option("--repeats", ro.repeats, "timed passes per kernel (the median is reported)")->capture_default_str()->check(CLI::Range(1u, 1000u));
  rc->add_option("--dtype", ro.dtypes, "datatypes (default: every one with a sum; f32 always runs, as the baseline)");

#if SPIN_BENCH_HAVE_COLL
  spin::bench::coll_options c;
  c.mpi_peer = SPIN_BENCH_MPI_PEER;
#ifdef SPIN_BENCH_SPIN_MPI
  c.spin_mpi_lib = SPIN_BENCH_SPIN_MPI;
  c.spin_emu = SPIN_BENCH_SPIN_EMU;
#endif
  double link_latency_us = 0;
  CLI::App* cc = app.add_subcommand(
      "coll",
      "nccl-tests-style allreduce tables (size, count, type, redop, root, time, algbw, busbw, #wrong; out-of-place and in-place) for "
      "spin::coll's switch, edge_ring and host_ring on an emulated cluster, Gloo's ring allreduce over TCP on loopback and Open MPI's "
      "MPI_Allreduce, all on the same data, with the bytes each rank's NIC sent. Writes coll.csv, coll.json and coll.png to --out.");
  // Each rank of the emulated star takes two DPDK ports (its NIC's and the switch's).
  constexpr unsigned max_ranks = RTE_MAX_ETHPORTS / 2;
  cc->add_option("-n,--ranks", c.ranks, "ranks (hosts), 2 .. " + std::to_string(max_ranks) + " (each takes two of DPDK's " +
                                            std::to_string(RTE_MAX_ETHPORTS) + " ports)")
      ->capture_default_str()
      ->check(CLI::Range(2u, max_ranks));
  cc->add_option("-b,--min-bytes", c.min_bytes, "smallest message (bytes)")->capture_default_str()->check(CLI::Range(std::uint64_t{4}, std::uint64_t{1} << 33));
  cc->add_option("-e,--max-bytes", c.max_bytes, "largest message (bytes)")->capture_default_str()->check(CLI::Range(std::uint64_t{4}, std::uint64_t{1} << 33));
  cc->add_option("-f,--factor", c.factor, "size step factor")->capture_default_str()->check(CLI::Range(std::uint64_t{2}, std::uint64_t{1024}));
  cc->add_option("--algorithm", c.algorithms,
                 "switch, edge_ring, host_ring, gloo, mpi; edge_ring_mpi, host_ring_mpi and switch_mpi: spin::coll with one "
                 "process per rank under mpirun (libspin-mpi)")
      ->capture_default_str()
      ->check(CLI::IsMember({"switch", "edge_ring", "host_ring", "gloo", "mpi", "edge_ring_mpi", "host_ring_mpi", "switch_mpi"}));
  cc->add_option("--dtype", c.dtypes,
                 "datatypes of spin::coll's allreduce (repeatable): f32, f64, f16, bf16, i32, i64, the OCP MX types mxfp8_e4m3, "
                 "mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4_e2m1, mxint8, and block floating point bfp8_16, bfp8_32, bfp16_16, "
                 "bfp16_32. Sizes stay the float32 tensor's; each datatype carries its values in its own bytes")
      ->capture_default_str();
  cc->add_option("--iters", c.max_iters, "timed calls per measurement, at most (fewer for large messages)")->capture_default_str()->check(CLI::Range(1u, 100000u));
  cc->add_option("--warmup", c.warmup_iters, "warm-up calls per measurement (1 at most above 8 MiB)")->capture_default_str()->check(CLI::Range(0u, 1000u));
  cc->add_option("--budget-bytes", c.budget_bytes, "data per measurement that sets the number of timed calls")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  cc->add_option("--packet-bytes", c.packet_bytes,
                 "spin::coll payload per packet, 64 .. 4096 (switch: at most the switch's slot, " +
                     std::to_string(spin::coll::fabric_options{}.slot_bytes) + ")")
      ->capture_default_str()
      ->check(CLI::Range(64u, 4096u));
  cc->add_option("--lcores", c.lcores, "lcores the emulated cluster runs on (0: every CPU this process may use)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1024u));
  cc->add_option("--window", c.window_packets, "packets each rank's NIC keeps in flight (spin::coll options::window_packets)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  add_repair_options(cc, c.repair_min_us, c.repair_max_ms);
  cc->add_flag("--authenticate", c.authenticate,
               "give spin::coll's in-process algorithms a random job secret, so that every data frame carries and has "
               "checked a SipHash-2-4 tag (MPI modes always do)");
  cc->add_option("--switch-slots", c.switch_slots, "aggregator slots the group takes on the switch (options::switch_slots)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 32767u));
  cc->add_option("--link-latency-us", link_latency_us,
                 "one-way propagation delay of every emulated link in us (a host's packet to another host crosses two)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cc->add_option("--mpi-peer", c.mpi_peer, "the spin-bench-mpi binary")->capture_default_str();
  cc->add_option("--mpirun", c.mpirun, "MPI launcher and its options, separated by spaces (run without a shell)")->capture_default_str();
  cc->add_option("--spin-mpi", c.spin_mpi_lib, "libspin-mpi.so, preloaded for edge_ring_mpi, host_ring_mpi and switch_mpi")->capture_default_str();
  cc->add_option("--spin-emu", c.spin_emu, "the spin-emu binary that emulates the cluster for edge_ring_mpi, host_ring_mpi and switch_mpi")
      ->capture_default_str();
  cc->add_option("--out", c.out_dir, "directory for coll.csv, .json, .dat, .gp and .png")->capture_default_str();
  cc->add_flag("!--no-plot", c.plots, "do not run gnuplot");
  cc->add_flag("--virtual-time", c.virtual_time,
               "after the wall-clock tables, the same allreduce of switch, edge_ring and host_ring in virtual time (modelled sPIN NICs "
               "and 400 Gbit/s links; spin-bench vt allreduce)");
  spin::bench::groups_options gr;
  CLI::App* gc = app.add_subcommand(
      "groups",
      "Many small groups at once on one emulated star: each group's members run a few small int32 allreduces together; prints "
      "p50, p99 and max call time and checks every result. Writes groups.json to --out.");
  gc->add_option("--hosts", gr.hosts, "hosts of the emulated star, 2 .. " + std::to_string(max_ranks))
      ->capture_default_str()
      ->check(CLI::Range(2u, max_ranks));
  gc->add_option("--groups", gr.groups, "groups running at once")->capture_default_str()->check(CLI::Range(1u, 4096u));
  gc->add_option("--members", gr.members, "ranks per group (at most --hosts)")->capture_default_str()->check(CLI::Range(2u, 256u));
  gc->add_option("--calls", gr.calls, "allreduces per group")->capture_default_str()->check(CLI::Range(1u, 100000u));
  gc->add_option("--bytes", gr.bytes, "message size in bytes (int32 elements)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{4}, std::uint64_t{1} << 24));
  gc->add_option("--lcores", gr.lcores, "lcores the emulated cluster runs on (0: every CPU this process may use)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1024u));
  add_repair_options(gc, gr.repair_min_us, gr.repair_max_ms);
  gc->add_option("--out", gr.out_dir, "directory for groups.json")->capture_default_str();

  spin::bench::sparse_options sp;
  CLI::App* sc = app.add_subcommand(
      "sparse",
      "spin::coll's sparse allreduce (allreduce_sparse) on an emulated cluster per rank count, algorithm, value type and density, "
      "beside the dense float32 and bfloat16 allreduces of the same vectors: time, bytes each rank's NIC sent, the union's "
      "density, the error against the exact float64 sum, exactness. Writes sparse.csv to --out.");
  sc->add_option("-n,--ranks", sp.ranks, "rank counts (repeatable)")->capture_default_str()->check(CLI::Range(2u, 64u));
  sc->add_option("--density", sp.densities, "fractions of each rank's vector given as pairs (repeatable)")
      ->capture_default_str()->check(CLI::Range(1e-9, 1.0));
  sc->add_option("--algorithm", sp.algorithms, "switch, edge_ring (repeatable)")->capture_default_str();
  sc->add_option("--dtype", sp.dtypes, "value types: f32, bf16, f16, or an MX type (float32 values that travel as MX codes: mxfp8_e4m3, mxint8, ...) (repeatable)")->capture_default_str();
  sc->add_option("--values", sp.values, "length of the vector")->capture_default_str()->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 30));
  sc->add_option("--iters", sp.iters, "timed calls per row (after one warm-up)")->capture_default_str()->check(CLI::Range(1u, 1000u));
  sc->add_option("--lcores", sp.lcores, "lcores of the emulated cluster (0: every CPU)")->capture_default_str();
  sc->add_option("--out", sp.out_dir, "directory for sparse.csv")->capture_default_str();
#endif

#if SPIN_BENCH_HAVE_COLL
  spin::bench::vt_options vo;
  CLI::App* vc = app.add_subcommand(
      "vt",
      "Benchmarks in VIRTUAL TIME (spin::sim, docs/virtual-time.md): modelled time of the topology's NIC and network models, the same "
      "on any machine. pspin: the standard ping-pong handler on PsPIN's default NIC beside PsPIN's published figures. allreduce, "
      "allgather, broadcast: spin::coll's switch, edge_ring (and, allreduce only, host_ring) per host count and size on a star or "
      "a two-level fat tree of modelled NICs (modelled time, algbw, busbw, #wrong, packet latency, HPU occupancy, switch queue and "
      "buffer, drops); writes vt_<what>.csv and a plot (.dat, .gp, .png) to --out.");
  vc->add_option("what", vo.what, "pspin, allreduce, allgather, broadcast")
      ->capture_default_str()
      ->check(CLI::IsMember({"pspin", "allreduce", "allgather", "broadcast"}));
  vc->add_option("-n,--hosts", vo.hosts, "collectives: host counts (repeatable), 2 .. 4096")->capture_default_str()->check(CLI::Range(2u, 4096u));
  vc->add_option("--size", vo.sizes, "collectives: message sizes in bytes (repeatable; float32)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{4}, std::uint64_t{1} << 36));
  vc->add_option("--algorithm", vo.algorithms, "collectives: switch, edge_ring, host_ring (repeatable; host_ring: allreduce only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"switch", "edge_ring", "host_ring"}));
  vc->add_option("--iters", vo.iters, "collectives: timed calls after one warm-up")->capture_default_str()->check(CLI::Range(1u, 1000u));
  vc->add_option("--link-latency-ns", vo.link_latency_ns, "propagation delay of the generated links")->capture_default_str()->check(CLI::Range(0.0, 1e9));
  vc->add_flag("--json", vo.json, "also print each run's statistics as JSON");
  vc->add_flag("!--no-plot", vo.plots, "collectives: do not run gnuplot (vt_<what>.png)");
  vc->add_option("--out", vo.out_dir, "directory for vt_<what>.csv, .dat, .gp and .png")->capture_default_str();
  vc->add_option("--topology", vo.topology_file,
                 "take the NIC and switch models from this topology file ([nic], [switch_nic], [switch_model]); the links are "
                 "--link-gbps and --link-latency-ns");
  vc->add_option("--hosts-per-leaf", vo.hosts_per_leaf,
                 "collectives: 0, a star around one switch; else a two-level fat tree (emu::fat_tree) of hosts/this leaves")
      ->capture_default_str()
      ->check(CLI::Range(0u, 4096u));
  vc->add_option("--spines", vo.spines, "collectives: spine switches of the fat tree, each linked to every leaf")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  vc->add_option("--link-gbps", vo.link_gbps, "line rate of the generated topologies' links")->capture_default_str()->check(CLI::Range(1e-3, 1e4));
  vc->add_option("--staging-bytes", vo.staging_bytes,
                 "collectives: each rank's staging buffers (coll::options::staging_bytes; 0: 4 GiB / (2 x hosts), 1 .. 32 MiB)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{1} << 32));
  vc->add_option("--warmup-bytes", vo.warmup_bytes, "collectives: size of the untimed warm-up call (0: the timed size)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{1} << 36));
  vc->add_option("--window", vo.window, "collectives: packets each rank keeps in flight in the edge algorithms (coll::options::window_packets; the switch's slots bound its own)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  vc->add_option("--switch-slots", vo.switch_slots, "collectives: aggregator slots the group takes on the switch (coll::options::switch_slots; 0: "
                 "64, or fewer so that hosts x slots x payload fill at most half the switch's packet buffer)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 32767u));
  vc->add_option("--packet-bytes", vo.packet_bytes, "collectives: payload bytes per packet, 16 .. 4096 (0: the largest the NICs carry, 4096)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 4096u));
  vc->add_option("--packets", vo.packets, "pspin: packets of the loaded stream")->capture_default_str()->check(CLI::Range(16u, 1u << 22));
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (hc->parsed()) return spin::bench::run_handlers(h);
  if (rc->parsed()) return spin::bench::run_reductions(ro);
#if SPIN_BENCH_HAVE_COLL
  if (cc->parsed()) {
    c.link_latency_ns = static_cast<std::uint64_t>(link_latency_us * 1e3 + 0.5);
    return spin::bench::run_coll(c);
  }
  if (gc->parsed()) return spin::bench::run_groups(gr);
  if (sc->parsed()) return spin::bench::run_sparse(sp);
  if (vc->parsed()) return spin::bench::run_vt(vo);
#endif
  return 2;
}
