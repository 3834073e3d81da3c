// spin-bench coll. How the figures come about (docs/benchmarks.md has the full story):
//
// spin::coll (switch, edge_ring, host_ring): an emulated cluster in this process, N hosts in a
// star around one switch (cluster mode: one poll thread drives every node and link), one
// communicator per rank, one thread per rank. Buffers come from the communicator's arena, so
// they go to the NIC without a staging copy. Lossless links; the repair timer follows measured
// round trips between 1 ms and 1 s (--repair-min-us, --repair-max-ms), so a frame a NIC drops
// costs round trips; the progress lines count the repairs (spurious ones on a slow machine
// included), and their frames are in sent/rank.
// Gloo (gloo): N threads in this process, each with a Gloo context over TCP on 127.0.0.1
// (rendezvous through an in-process HashStore), gloo::allreduce with the ring algorithm.
// Open MPI (mpi): spin-bench-mpi under mpirun, N processes, MPI_Allreduce (Open MPI picks its
// algorithm and transport: shared memory between processes of one machine).
//
// Every implementation gets the same float32 inputs (coll_data.hpp): integers, so that the sum
// is exact in any order, and #wrong counts elements that differ from it bit for bit. A
// measurement: warm-up calls, then `iters` timed calls; each call starts on every rank at a
// barrier, its time is the slowest rank's, and the table gives the mean over the calls
// (nccl-tests: time, algbw = S / time, busbw = algbw x 2(n-1)/n). In-place calls refill the
// buffer before each call, outside the timed region.
#include "coll.hpp"
#include "vt.hpp"

#include "coll_data.hpp"
#include "coll_types.hpp"
#include "coll_table.hpp"
#include "../common.hpp"
#include "repair_options.hpp"

#include <spin/coll/coll.hpp>
#include <spin/emu/cluster.hpp>
#include <spin/emu/eal.hpp>
#include <spin/emu/topology.hpp>

#if SPIN_BENCH_HAVE_GLOO
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#endif

#include <algorithm>
#include <random>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

namespace spin::bench {

namespace {

using clock_type = std::chrono::steady_clock;

// One rank's part of one measurement: `call` runs the collective once (out-of-place or in
// place), `refill` prepares the buffers before each call (outside the timed region), `check`
// counts wrong elements after the last call.
struct rank_ops {
  std::function<std::string(bool in_place)> call;  // "" or the error
  std::function<void(bool in_place)> refill;
  std::function<std::uint64_t(bool in_place)> check;
};

std::string fmt_ms(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f ms", ms);
  return b;
}

// Runs warm-up and timed calls of one mode on every rank (one thread each); fills `m`.
// `between` runs on the calling thread after the warm-up and after the timed calls (counters).
void measure_mode(std::vector<rank_ops>& ranks, bool in_place, std::uint32_t warmup, std::uint32_t iters, std::uint64_t bytes,
                  coll_mode& m, const std::function<void()>& after_warmup, const std::function<void()>& after_timed) {
  const std::uint32_t n = static_cast<std::uint32_t>(ranks.size());
  std::vector<std::vector<double>> secs(n, std::vector<double>(iters, 0));
  std::vector<std::string> errors(n);
  std::vector<std::uint64_t> wrong(n, 0);
  auto phase = [&](std::uint32_t calls, bool timed) {
    std::barrier sync(static_cast<std::ptrdiff_t>(n));
    std::vector<std::thread> ts;
    for (std::uint32_t r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        for (std::uint32_t k = 0; k < calls; ++k) {
          if (in_place || k == 0) ranks[r].refill(in_place);
          sync.arrive_and_wait();
          const auto t0 = clock_type::now();
          std::string e = errors[r].empty() ? ranks[r].call(in_place) : std::string("skipped after an error");
          const auto t1 = clock_type::now();
          if (!e.empty() && errors[r].empty()) errors[r] = e;
          if (timed) secs[r][k] = std::chrono::duration<double>(t1 - t0).count();
        }
        if (timed && errors[r].empty()) wrong[r] = ranks[r].check(in_place);
      });
    for (auto& t : ts) t.join();
  };
  phase(warmup, false);
  if (after_warmup) after_warmup();
  phase(iters, true);
  if (after_timed) after_timed();
  for (std::uint32_t r = 0; r < n; ++r)
    if (!errors[r].empty()) {
      m.error = "rank " + std::to_string(r) + ": " + errors[r];
      m.ran = false;
      return;
    }
  double total = 0;
  for (std::uint32_t k = 0; k < iters; ++k) {
    double slowest = 0;
    for (std::uint32_t r = 0; r < n; ++r) slowest = std::max(slowest, secs[r][k]);
    total += slowest;
  }
  set_rates(m, bytes, n, total / iters);
  for (auto w : wrong) m.wrong += w;
}

std::uint32_t warmup_for(const coll_options& o, std::uint64_t bytes) {
  return bytes <= (std::uint64_t{8} << 20) ? o.warmup_iters : std::min<std::uint32_t>(o.warmup_iters, 1);
}

// ---- spin::coll on an emulated cluster --------------------------------------------------------

coll::algorithm algorithm_of(const std::string& a) {
  if (a == "switch") return coll::algorithm::switch_agg;
  if (a == "edge_ring") return coll::algorithm::edge_ring;
  return coll::algorithm::host_ring;
}

// Runs every spin::coll algorithm of `algos` over `sizes`; appends rows, and to `not_run` the
// algorithms a failure kept from running. false: set-up failed (message printed).
bool run_spin(const coll_options& o, const std::vector<std::string>& algos, const std::vector<std::uint64_t>& sizes,
              std::vector<coll_row>& rows, std::vector<std::pair<std::string, std::string>>& not_run) {
  if (auto r = emu::eal_init(emu::default_eal_args("spin-bench-coll-" + std::to_string(::getpid()))); !r) {
    std::fprintf(stderr, "spin-bench coll: %s\n", r.err().message.c_str());
    return false;
  }
  emu::cluster_options clo;
  clo.lcores = o.lcores;
  emu::link_model lm;
  lm.latency = std::chrono::nanoseconds(o.link_latency_ns);
  auto cluster = emu::cluster::create(emu::star(o.ranks, lm), clo);
  if (!cluster) {
    std::fprintf(stderr, "spin-bench coll: %s\n", cluster.err().message.c_str());
    return false;
  }
  emu::cluster_runner running(*cluster.value());
  auto fab = coll::fabric::create(*cluster.value());
  if (!fab) {
    std::fprintf(stderr, "spin-bench coll: %s\n", fab.err().message.c_str());
    return false;
  }
  // The largest buffer: the largest size in the widest datatype.
  std::vector<coll_typed_data> data;
  std::vector<std::string> type_names;
  for (const std::string& name : o.dtypes)
    if (const auto t = coll_type_of(name)) {
      data.emplace_back(*t, o.ranks);
      type_names.push_back(name);
    }
  std::uint64_t max_bytes = 0;
  for (const coll_typed_data& d : data)
    for (std::uint64_t b : sizes) max_bytes = std::max(max_bytes, d.count_for(b / 4) * d.elem_bytes());
  coll::options co;
  // A large message on a slow machine takes seconds; the timeout only guards against a hang.
  co.timeout = std::chrono::milliseconds(60'000 + max_bytes / (1 << 20) * 1000);
  set_repair_timer(co, o.repair_min_us, o.repair_max_ms);
  co.packet_bytes = o.packet_bytes;
  co.window_packets = o.window_packets;
  co.switch_slots = o.switch_slots;
  if (o.authenticate) {
    std::random_device rd;
    for (auto& b : co.job_secret) b = static_cast<std::uint8_t>(rd());
  }
  // The buffers come from the arena (no staging copy); the staging buffers stay small.
  co.staging_bytes = std::size_t{1} << 20;
  // host_ring keeps an epoch's partial sums in the arena too: (staging_bytes / element bytes)
  // accumulators, 4 MiB for mxfp8 (128-byte accumulators of 33-byte blocks).
  const std::uint64_t buffer = (max_bytes + 4095) / 4096 * 4096;
  std::uint64_t partials = 0;
  for (const coll_typed_data& d : data)
    partials = std::max<std::uint64_t>(partials, co.staging_bytes / d.elem_bytes() * d.acc_bytes());
  co.arena_bytes = 2 * buffer + 2 * co.staging_bytes + (partials + 4095) / 4096 * 4096 + (std::size_t{1} << 20);
  co.switches = fab.value().get();
  co.log = [](const std::string& line) { std::fprintf(stderr, "spin-bench coll: %s\n", line.c_str()); };
  coll::group g;
  g.id = 1;
  for (std::uint32_t r = 0; r < o.ranks; ++r) g.members.push_back(r);
  std::vector<std::unique_ptr<coll::communicator>> comms;
  std::vector<std::span<std::byte>> in(o.ranks), out(o.ranks);
  for (std::uint32_t r = 0; r < o.ranks; ++r) {
    g.me = r;
    auto c = coll::communicator::create(*cluster.value()->host(r), g, co);
    if (!c) {
      std::fprintf(stderr, "spin-bench coll: communicator of rank %u: %s\n", r, c.err().message.c_str());
      return false;
    }
    comms.push_back(std::move(c.value()));
    in[r] = comms[r]->alloc(max_bytes);
    out[r] = comms[r]->alloc(max_bytes);
    if (in[r].size() < max_bytes || out[r].size() < max_bytes) {
      std::fprintf(stderr, "spin-bench coll: the arena of rank %u cannot hold two buffers of %llu bytes\n", r,
                   static_cast<unsigned long long>(max_bytes));
      return false;
    }
  }
  auto repairs = [&] {
    std::int64_t s = 0;
    for (const auto& c : comms) s += static_cast<std::int64_t>(c->stats().repaired_epochs);
    return s;
  };
  auto tx_bytes = [&] {
    std::uint64_t s = 0;
    for (std::uint32_t r = 0; r < o.ranks; ++r) s += cluster.value()->node(r).stats().ports[0].tx_bytes;
    return s;
  };
  // Every frame the cluster dropped, by "where: reason" (NICs, their runtimes, links).
  auto drops = [&] {
    std::map<std::string, std::uint64_t> d;
    const emu::cluster_stats cs = cluster.value()->stats();
    for (const auto& nd : cs.nodes) {
      for (std::size_t i = 0; i < emu::nic_drop_count; ++i)
        if (nd.drops[i] != 0) d[std::string("nic ") + emu::nic_drop_name(static_cast<emu::nic_drop>(i))] += nd.drops[i];
      for (const auto& e : nd.runtime.ecs)
        for (std::size_t i = 0; i < rt::drop_reason_count; ++i)
          if (e.drops[i] != 0) d[std::string("runtime ") + rt::drop_reason_name(static_cast<rt::drop_reason>(i))] += e.drops[i];
    }
    for (const auto& l : cs.links) {
      if (l.stats.dropped_loss != 0) d["link loss"] += l.stats.dropped_loss;
      if (l.stats.dropped_queue_full != 0) d["link queue full"] += l.stats.dropped_queue_full;
    }
    return d;
  };
  std::printf("spin::coll: %u hosts and a switch emulated on %u lcores (of %u hardware threads), %u rank threads that sleep while "
              "their NIC works; links with %.1f us of propagation delay\n",
              o.ranks, cluster.value()->lcores(), std::max(1u, std::thread::hardware_concurrency()), o.ranks,
              static_cast<double>(o.link_latency_ns) / 1e3);
  for (std::size_t ai = 0; ai < algos.size(); ++ai) {
    const std::string& a = algos[ai];
    const coll::algorithm algo = algorithm_of(a);
    for (std::size_t ti = 0; ti < data.size(); ++ti)
    for (std::uint64_t size : sizes) {
      const coll_typed_data& d = data[ti];
      const coll::dtype t = *coll_type_of(type_names[ti]);
      coll_row row;
      row.algorithm = a;
      row.ranks = o.ranks;
      row.type = type_names[ti];
      row.values = size / 4;
      row.count = d.count_for(row.values);
      row.bytes = row.count * d.elem_bytes();
      const std::uint64_t bytes = row.bytes;
      row.iters = coll_iters(bytes, o.budget_bytes, o.max_iters);
      std::fprintf(stderr, "  %s %s %llu B x %u\n", a.c_str(), row.type.c_str(), static_cast<unsigned long long>(bytes), row.iters);
      std::vector<rank_ops> ops(o.ranks);
      for (std::uint32_t r = 0; r < o.ranks; ++r) {
        std::byte* ip = in[r].data();
        std::byte* op = out[r].data();
        const std::uint64_t n = row.count;
        ops[r].refill = [=, &d](bool in_place) { d.fill(r, in_place ? op : ip, n); };
        ops[r].call = [&, r, ip, op, n, algo, t](bool in_place) -> std::string {
          auto res = comms[r]->allreduce(in_place ? op : ip, op, n, t, coll::op::sum, algo);
          return res ? std::string() : res.err().message;
        };
        ops[r].check = [=, &d](bool) { return d.wrong(op, n); };
      }
      std::uint64_t tx0 = 0, tx1 = 0;
      std::int64_t rp0 = 0, rp1 = 0;
      std::vector<emu::cluster_lcore_stats> lc0, lc1;
      std::map<std::string, std::uint64_t> dr0, dr1;
      measure_mode(
          ops, false, warmup_for(o, bytes), row.iters, bytes, row.oop,
          [&] {
            tx0 = tx_bytes();
            rp0 = repairs();
            lc0 = cluster.value()->lcore_stats();
            dr0 = drops();
          },
          [&] {
            tx1 = tx_bytes();
            rp1 = repairs();
            lc1 = cluster.value()->lcore_stats();
            dr1 = drops();
          });
      if (row.oop.ran) {
        row.max_error = d.max_error(out[0].data(), row.count);
        row.sent_bytes_per_rank = static_cast<double>(tx1 - tx0) / o.ranks / row.iters;
        row.repairs = rp1 - rp0;
        // Where the lcores' time went: busy (rounds that moved something, helping included) per
        // call, against the call's time.
        std::string busy;
        for (std::size_t k = 0; k < lc1.size(); ++k)
          busy += (k ? " + " : "") + fmt_ms(static_cast<double>(lc1[k].busy_ns - lc0[k].busy_ns) / 1e6 / row.iters) + " (" +
                  std::to_string((lc1[k].helped_rounds - lc0[k].helped_rounds) / row.iters) + " helping rounds, " +
                  std::to_string((lc1[k].sleeps - lc0[k].sleeps) / row.iters) + " sleeps, " +
                  std::to_string(lc1[k].unrung_wakeups - lc0[k].unrung_wakeups) + " unrung wake-ups in all)";
        const coll::comm_stats s0 = comms[0]->stats();
        // Frames the cluster dropped during the timed calls, by reason: what the repairs answered.
        std::string dropped;
        for (const auto& [why, n] : dr1)
          if (n > dr0[why]) dropped += (dropped.empty() ? "" : ", ") + std::to_string(n - dr0[why]) + " " + why;
        std::fprintf(stderr, "    out of place: %s per call; lcores busy %s per call; %lld repaired epochs in %u calls (rank 0's repair timer: "
                     "srtt %lld us, interval %lld us); frames dropped: %s\n", fmt_ms(row.oop.time_us / 1e3).c_str(), busy.c_str(),
                     static_cast<long long>(row.repairs), row.iters, static_cast<long long>(s0.srtt.count()),
                     static_cast<long long>(s0.repair_interval.count()), dropped.empty() ? "none" : dropped.c_str());
      }
      if (row.oop.error.empty()) measure_mode(ops, true, warmup_for(o, bytes), row.iters, bytes, row.ip, {}, {});
      rows.push_back(row);
      if (!row.oop.error.empty() || !row.ip.error.empty()) {
        // A failed collective leaves its communicators broken: the remaining sizes and the
        // algorithms after it cannot run on them.
        std::fprintf(stderr, "spin-bench coll: %s (%s) failed at %llu bytes: %s\n", a.c_str(), row.type.c_str(),
                     static_cast<unsigned long long>(bytes),
                     (row.oop.error.empty() ? row.ip.error : row.oop.error).c_str());
        for (std::size_t k = ai + 1; k < algos.size(); ++k)
          not_run.emplace_back(algos[k], "the communicators broke when " + a + " failed at " + std::to_string(bytes) + " bytes");
        return true;
      }
    }
  }
  return true;
}

// ---- Gloo ----------------------------------------------------------------------------------

#if SPIN_BENCH_HAVE_GLOO
std::string run_gloo(const coll_options& o, const std::vector<std::uint64_t>& sizes, std::vector<coll_row>& rows) {
  const std::uint64_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::shared_ptr<gloo::rendezvous::Context>> ctx(o.ranks);
  std::vector<std::string> errors(o.ranks);
  {
    std::vector<std::thread> ts;
    for (std::uint32_t r = 0; r < o.ranks; ++r)
      ts.emplace_back([&, r] {
        try {
          gloo::transport::tcp::attr attr("127.0.0.1");
          auto dev = gloo::transport::tcp::CreateDevice(attr);
          auto c = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(r), static_cast<int>(o.ranks));
          c->setTimeout(std::chrono::milliseconds(120'000 + max_bytes / (1 << 20) * 1000));
          c->connectFullMesh(*store, dev);
          ctx[r] = c;
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ts) t.join();
  }
  for (std::uint32_t r = 0; r < o.ranks; ++r)
    if (!errors[r].empty()) return "Gloo rendezvous of rank " + std::to_string(r) + ": " + errors[r];
  std::vector<std::vector<float>> in(o.ranks, std::vector<float>(max_bytes / 4)), out(o.ranks, std::vector<float>(max_bytes / 4));
  for (std::uint64_t bytes : sizes) {
    coll_row row;
    row.algorithm = "gloo";
    row.ranks = o.ranks;
    row.bytes = bytes;
    row.count = bytes / 4;
    row.values = row.count;
    row.iters = coll_iters(bytes, o.budget_bytes, o.max_iters);
    std::fprintf(stderr, "  gloo %llu B x %u\n", static_cast<unsigned long long>(bytes), row.iters);
    std::vector<rank_ops> ops(o.ranks);
    for (std::uint32_t r = 0; r < o.ranks; ++r) {
      float* ip = in[r].data();
      float* op = out[r].data();
      const std::size_t n = row.count;
      ops[r].refill = [=](bool in_place) { coll_fill(r, in_place ? op : ip, n); };
      ops[r].call = [&, r, ip, op, n](bool in_place) -> std::string {
        try {
          gloo::AllreduceOptions opts(ctx[r]);
          if (!in_place) opts.setInput(ip, n);
          opts.setOutput(op, n);
          opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
          opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
          opts.setTag(1);
          gloo::allreduce(opts);
        } catch (const std::exception& e) {
          return e.what();
        }
        return "";
      };
      ops[r].check = [=](bool) { return coll_wrong(o.ranks, op, n); };
    }
    measure_mode(ops, false, warmup_for(o, bytes), row.iters, bytes, row.oop, {}, {});
    if (row.oop.error.empty()) measure_mode(ops, true, warmup_for(o, bytes), row.iters, bytes, row.ip, {}, {});
    rows.push_back(row);
    if (!row.oop.error.empty() || !row.ip.error.empty()) return "";
  }
  return "";
}
#endif

// ---- Open MPI (a child process) -------------------------------------------------------------

// Runs argv[0] (looked up in PATH) with `argv`, standard output and error going to `log_path`,
// and waits for it. No shell: paths and options reach mpirun as they are. Returns "" when it
// exited with status 0, else why not.
std::string spawn_and_wait(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Opened here, not in the child, so that a log that cannot be written is not mistaken for a
  // missing launcher (both would be the child's ENOENT).
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) return "cannot write " + log_path + ": " + std::strerror(errno);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, log, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, log, STDERR_FILENO);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(log);
  if (err == ENOENT) return argv[0] + " not found (Debian: openmpi-bin)";
  if (err != 0) return "cannot start " + argv[0] + ": " + std::strerror(err);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return "waitpid on " + argv[0] + ": " + std::strerror(errno);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  const std::string how = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                            : "signal " + std::to_string(WTERMSIG(status));
  return argv[0] + " failed (" + how + "); its output is in " + log_path;
}

// spin-bench-mpi under mpirun; `extra` goes between mpirun's options and the peer (-x ...), the
// rows are labelled `label`.
std::string run_mpi(const coll_options& o, std::vector<coll_row>& rows, const std::vector<std::string>& extra = {},
                    const std::string& label = "mpi") {
  if (o.mpi_peer.empty())
    return "spin-bench-mpi was not built (Open MPI's development files were missing at configure time: Debian libopenmpi-dev)";
  if (access(o.mpi_peer.c_str(), X_OK) != 0) return o.mpi_peer + " (--mpi-peer) is not an executable file";
  // --mpirun is the launcher and its own options, separated by spaces (no shell quoting).
  std::vector<std::string> argv;
  {
    std::istringstream words(o.mpirun);
    for (std::string w; words >> w;) argv.push_back(w);
  }
  if (argv.empty()) return "--mpirun is empty";
  const std::string json_path = o.out_dir + "/coll-" + label + ".json", log_path = o.out_dir + "/coll-" + label + ".log";
  std::filesystem::remove(json_path);
  // Root may run mpirun only when told; more ranks than cores need --oversubscribe.
  for (std::string a : {std::string("--allow-run-as-root"), std::string("--oversubscribe"), std::string("-np"), std::to_string(o.ranks)})
    argv.push_back(std::move(a));
  for (const auto& a : extra) argv.push_back(a);
  for (std::string a : {o.mpi_peer, std::string("--label"), label,
                        std::string("--min-bytes"), std::to_string(o.min_bytes), std::string("--max-bytes"), std::to_string(o.max_bytes),
                        std::string("--factor"), std::to_string(o.factor), std::string("--iters"), std::to_string(o.max_iters),
                        std::string("--warmup"), std::to_string(o.warmup_iters), std::string("--budget-bytes"), std::to_string(o.budget_bytes),
                        std::string("--json"), json_path})
    argv.push_back(std::move(a));
  std::string line;
  for (const auto& a : argv) line += (line.empty() ? "" : " ") + a;
  std::fprintf(stderr, "  %s: %s > %s\n", label.c_str(), line.c_str(), log_path.c_str());
  if (std::string why = spawn_and_wait(argv, log_path); !why.empty()) return why;
  std::ifstream f(json_path);
  if (!f) return "mpirun ran, but the peer wrote no results to " + json_path + "; its output is in " + log_path;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    for (const auto& r : j.at("rows")) rows.push_back(row_from_json(r));
  } catch (const std::exception& e) {
    return "cannot read " + json_path + ": " + e.what();
  }
  return "";
}

// ---- spin::coll with one process per rank (libspin-mpi under mpirun) ----------------------------

// A spin-emu cluster process (a star of o.ranks hosts around one switch, lossless) and
// spin-bench-mpi under mpirun with libspin-mpi preloaded: every rank's MPI_Allreduce runs on
// spin::coll `algo` through its NIC in that process: edge_ring, host_ring, or switch (automatic
// with SPIN_MPI_SWITCH_NODE: each rank's fabric asks the cluster's switch node, o.ranks, for
// slots). Rows are labelled <algo>_mpi. Returns "" or why it did not run.
std::string run_spin_mpi(const coll_options& o, const std::string& algo, std::vector<coll_row>& rows) {
  const std::string label = algo + "_mpi";
  if (o.spin_mpi_lib.empty() || o.spin_emu.empty())
    return "libspin-mpi was not built (Open MPI's development files or the collectives were missing at configure time)";
  if (access(o.spin_mpi_lib.c_str(), R_OK) != 0) return o.spin_mpi_lib + " (--spin-mpi) cannot be read";
  if (access(o.spin_emu.c_str(), X_OK) != 0) return o.spin_emu + " (--spin-emu) is not an executable file";
  const std::string topo = o.out_dir + "/coll-" + label + ".toml", sock = o.out_dir + "/coll-" + label + ".sock",
                    emu_log = o.out_dir + "/coll-" + label + "-emu.log";
  {
    std::ofstream t(topo);
    t << "# spin-bench coll " << label << ": " << o.ranks << " hosts around one switch, lossless\n[defaults]\nrate_gbps = 100\n";
    if (o.link_latency_ns > 0) t << "latency_ns = " << o.link_latency_ns << "\n";
    for (std::uint32_t h = 0; h < o.ranks; ++h) t << "[[host]]\nname = \"h" << h << "\"\n";
    t << "[[switch]]\nname = \"s0\"\n";
    for (std::uint32_t h = 0; h < o.ranks; ++h) t << "[[link]]\na = \"h" << h << "\"\nb = \"s0\"\n";
    if (!t) return "cannot write " + topo;
  }
  std::filesystem::remove(sock);
  std::vector<std::string> emu_argv = {o.spin_emu, "--topology", topo, "--socket", std::filesystem::absolute(sock).string(), "--duration",
                                       "86400", "-q"};
  if (o.lcores > 0) emu_argv.insert(emu_argv.end(), {"--lcores", std::to_string(o.lcores)});
  std::vector<char*> args;
  for (auto& a : emu_argv) args.push_back(a.data());
  args.push_back(nullptr);
  const int log = open(emu_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) return "cannot write " + emu_log + ": " + std::strerror(errno);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, log, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, log, STDERR_FILENO);
  pid_t emu = 0;
  const int err = posix_spawn(&emu, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(log);
  if (err != 0) return "cannot start " + o.spin_emu + ": " + std::strerror(err);
  auto stop_emu = [&] {
    kill(emu, SIGTERM);
    int status = 0;
    while (waitpid(emu, &status, 0) < 0 && errno == EINTR) {
    }
  };
  for (int i = 0; i < 200 && !std::filesystem::exists(sock); ++i) {
    int status = 0;
    if (waitpid(emu, &status, WNOHANG) == emu) return "spin-emu exited before its control socket appeared; its output is in " + emu_log;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!std::filesystem::exists(sock)) {
    stop_emu();
    return "spin-emu's control socket did not appear within 20 s; its output is in " + emu_log;
  }
  std::vector<std::string> mpirun_args = {"--bind-to", "none", "-x", "LD_PRELOAD=" + o.spin_mpi_lib, "-x",
                                          "SPIN_MPI_SOCKET=" + std::filesystem::absolute(sock).string(), "-x", "SPIN_MPI_LOG=1"};
  if (algo == "switch") {  // the hosts are nodes 0..ranks-1, the switch node `ranks`
    mpirun_args.insert(mpirun_args.end(), {"-x", "SPIN_MPI_ALGORITHM=automatic", "-x", "SPIN_MPI_SWITCH_NODE=" + std::to_string(o.ranks)});
  } else {
    mpirun_args.insert(mpirun_args.end(), {"-x", "SPIN_MPI_ALGORITHM=" + algo});
  }
  const std::string why = run_mpi(o, rows, mpirun_args, label);
  stop_emu();
  return why;
}

// ---- report --------------------------------------------------------------------------------

std::string mode_cols(const coll_mode& m) {
  char b[128];
  if (!m.ran) return "         -        -        -       -";
  std::snprintf(b, sizeof b, "%10.1f %8.4f %8.4f %7llu", m.time_us, m.algbw_gbs, m.busbw_gbs, static_cast<unsigned long long>(m.wrong));
  return b;
}

const char* describe(const std::string& a) {
  if (a == "switch") return "spin::coll Core-INC: the emulated switch aggregates (algorithm::switch_agg)";
  if (a == "edge_ring") return "spin::coll Edge-INC: NIC handlers reduce along a ring (algorithm::edge_ring)";
  if (a == "host_ring") return "spin::coll without INC: host threads reduce, NICs move chunks (algorithm::host_ring)";
  if (a == "gloo") return "Gloo ring allreduce, TCP over loopback, one thread per rank";
  if (a == "mpi") return "Open MPI MPI_Allreduce under mpirun, one process per rank";
  if (a == "edge_ring_mpi")
    return "spin::coll Edge-INC with one process per rank: MPI_Allreduce under mpirun through libspin-mpi (edge_ring), NICs in a "
           "spin-emu cluster process";
  if (a == "host_ring_mpi")
    return "spin::coll without INC with one process per rank: MPI_Allreduce under mpirun through libspin-mpi (host_ring), NICs "
           "in a spin-emu cluster process";
  if (a == "switch_mpi")
    return "spin::coll Core-INC with one process per rank: MPI_Allreduce under mpirun through libspin-mpi, each rank's fabric a view "
           "of the switch's registry (SPIN_MPI_SWITCH_NODE), NICs and switch in a spin-emu cluster process";
  return "";
}

} // namespace

int run_coll(const coll_options& o) {
  for (const auto& a : o.algorithms)
    if (a != "switch" && a != "edge_ring" && a != "host_ring" && a != "gloo" && a != "mpi" && a != "edge_ring_mpi" &&
        a != "host_ring_mpi" && a != "switch_mpi") {
      std::fprintf(stderr,
                   "spin-bench coll: unknown algorithm '%s' (switch, edge_ring, host_ring, gloo, mpi, edge_ring_mpi, host_ring_mpi, "
                   "switch_mpi)\n",
                   a.c_str());
      return 2;
    }
  const std::vector<std::string> known_types = coll_type_names();
  for (const auto& t : o.dtypes)
    if (std::find(known_types.begin(), known_types.end(), t) == known_types.end()) {
      std::string all;
      for (const auto& n : known_types) all += " " + n;
      std::fprintf(stderr, "spin-bench coll: unknown --dtype %s (one of:%s)\n", t.c_str(), all.c_str());
      return 2;
    }
  if (o.dtypes.empty()) {
    std::fprintf(stderr, "spin-bench coll: --dtype needs at least one datatype\n");
    return 2;
  }
  if (o.ranks < 2 || o.ranks > 64) {
    std::fprintf(stderr, "spin-bench coll: --ranks must be 2..64\n");
    return 2;
  }
  if (o.min_bytes < 4 || o.max_bytes < o.min_bytes || o.factor < 2) {
    std::fprintf(stderr, "spin-bench coll: need 4 <= --min-bytes <= --max-bytes and --factor >= 2\n");
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) {
    std::fprintf(stderr, "spin-bench coll: cannot create %s: %s\n", o.out_dir.c_str(), ec.message().c_str());
    return 2;
  }
  const std::vector<std::uint64_t> sizes = coll_sizes(o.min_bytes, o.max_bytes, o.factor);
  run_conditions cond = measure_conditions();
  cond.print("spin-bench coll");
  std::string types;
  for (const auto& t : o.dtypes) types += (types.empty() ? "" : ", ") + t;
  std::printf("WALL-CLOCK time on this machine: allreduce, sum, %u ranks, %llu .. %llu bytes (factor %llu); up to %u timed calls after up to %u warm-up calls, "
              "fewer for large messages (about %llu MiB per measurement)\n"
              "datatypes: %s for spin::coll (sizes are the float32 tensor's: every datatype carries the same values in its own bytes); "
              "float32 for Gloo and Open MPI\n",
              o.ranks, static_cast<unsigned long long>(o.min_bytes), static_cast<unsigned long long>(o.max_bytes),
              static_cast<unsigned long long>(o.factor), o.max_iters, o.warmup_iters,
              static_cast<unsigned long long>(o.budget_bytes >> 20), types.c_str());
  // Sizes are whole float32 elements: say what runs when that is not what was asked for.
  if (o.min_bytes % 4 != 0 || o.max_bytes % 4 != 0 || sizes.front() != o.min_bytes) {
    std::printf("sizes run (bytes, rounded down to whole float32 elements):");
    for (std::uint64_t b : sizes) std::printf(" %llu", static_cast<unsigned long long>(b));
    std::printf("\n");
  }
  std::fflush(stdout);

  std::vector<coll_row> rows;
  std::vector<std::pair<std::string, std::string>> not_run;
  std::vector<std::string> spin_algos;
  for (const auto& a : o.algorithms)
    if (a == "switch" || a == "edge_ring" || a == "host_ring") spin_algos.push_back(a);
  for (const auto& a : o.algorithms) {
    if (a == "gloo") {
#if SPIN_BENCH_HAVE_GLOO
      if (std::string why = run_gloo(o, sizes, rows); !why.empty()) not_run.emplace_back("gloo", why);
#else
      not_run.emplace_back("gloo", "spin-bench was built without Gloo (Debian libgloo-dev was missing at configure time)");
#endif
    } else if (a == "mpi") {
      if (std::string why = run_mpi(o, rows); !why.empty()) not_run.emplace_back("mpi", why);
    } else if (a == "edge_ring_mpi" || a == "host_ring_mpi" || a == "switch_mpi") {
      if (std::string why = run_spin_mpi(o, a.substr(0, a.size() - 4), rows); !why.empty()) not_run.emplace_back(a, why);
    }
  }
  // spin::coll last: EAL stays initialised for the rest of the process.
  if (!spin_algos.empty() && !run_spin(o, spin_algos, sizes, rows, not_run)) return 2;
  if (rows.empty()) {
    for (const auto& [what, why] : not_run) std::fprintf(stderr, "not run: %s: %s\n", what.c_str(), why.c_str());
    std::fprintf(stderr, "spin-bench coll: nothing ran\n");
    return 2;
  }
  cond.load_after = load_average();

  bool all_ok = true;
  std::vector<std::string> order;
  for (const auto& a : o.algorithms)
    if (std::any_of(rows.begin(), rows.end(), [&](const coll_row& r) { return r.algorithm == a; })) order.push_back(a);
  const double ring = busbw_factor(o.ranks);
  for (const auto& a : order) {
    std::printf("\n# %s: %s\n", a.c_str(), describe(a));
    if (a == "switch" || a == "edge_ring" || a == "host_ring")
      std::printf("# data frames: %s\n", o.authenticate ? "authenticated (a job secret: a SipHash-2-4 tag on every frame, checked by its receiver)"
                                                          : "not authenticated (no job secret; --authenticate gives one)");
    std::printf("#%74s%38s\n", "out-of-place", "in-place");
    std::printf("# %12s %11s %10s %6s %5s %10s %8s %8s %7s %10s %8s %8s %7s %12s %7s %7s %9s\n", "size", "count", "type", "redop",
                "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "sent/rank", "x S", "B/value", "max err");
    std::printf("# %12s %11s %10s %6s %5s %10s %8s %8s %7s %10s %8s %8s %7s %12s %7s %7s %9s\n", "(B)", "(elements)", "", "", "", "(us)",
                "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "(B)", "", "", "");
    for (const auto& r : rows) {
      if (r.algorithm != a) continue;
      char sent[32] = "-", ratio[32] = "-", per_value[32] = "-", err[32] = "-";
      if (r.max_error >= 0 || std::isnan(r.max_error)) std::snprintf(err, sizeof err, "%.2e", r.max_error);
      if (r.sent_bytes_per_rank >= 0) {
        std::snprintf(sent, sizeof sent, "%.0f", r.sent_bytes_per_rank);
        std::snprintf(ratio, sizeof ratio, "%.3f", r.sent_bytes_per_rank / static_cast<double>(r.bytes));
        if (r.values > 0) std::snprintf(per_value, sizeof per_value, "%.3f", r.sent_bytes_per_rank / static_cast<double>(r.values));
      }
      std::printf("  %12llu %11llu %10s %6s %5d %s %s %12s %7s %7s %9s\n", static_cast<unsigned long long>(r.bytes),
                  static_cast<unsigned long long>(r.count), r.type.c_str(), "sum", -1, mode_cols(r.oop).c_str(), mode_cols(r.ip).c_str(),
                  sent, ratio, per_value, err);
      for (const coll_mode* m : {&r.oop, &r.ip}) {
        if (!m->error.empty()) std::printf("  FAILED: %s\n", m->error.c_str());
        if (!m->error.empty() || m->wrong != 0) all_ok = false;
      }
    }
    double sum_bus = 0;
    std::uint32_t n = 0;
    for (const auto& r : rows)
      if (r.algorithm == a && r.oop.ran) {
        sum_bus += r.oop.busbw_gbs;
        ++n;
      }
    std::printf("# Avg bus bandwidth (out-of-place): %.4f GB/s\n", n ? sum_bus / n : 0);
  }
  std::printf("\nsent/rank: bytes of frames each rank's NIC sent per call (headers and any repairs included); x S: the same\n"
              "divided by the message size S; B/value: the same per value of the tensor (float32 sends 4 x (x S)). A ring\n"
              "sends %.3f x S of payload (2(n-1)/n); Core-INC aggregation sends 1 x S. Rings carry reduce-scatter's partial sums\n"
              "as float32 accumulators (4 bytes a value for bf16, f16 and the block formats); through the switch only elements\n"
              "travel.\n"
              "max err: rank 0's result against the exact float64 sum, max |error| / max |sum| (the inputs are small\n"
              "integers, so every partial sum is exact and the error is the datatype's rounding of the result).\n"
              "Gloo and Open MPI do not go through an emulated NIC, so their bytes are not measured.\n",
              ring);
  for (const auto& [what, why] : not_run) std::printf("not run: %s: %s\n", what.c_str(), why.c_str());
  std::printf("load average after: %.2f %.2f %.2f\n", cond.load_after[0], cond.load_after[1], cond.load_after[2]);

  // ---- files ----
  std::ostringstream csv;
  csv << "algorithm,ranks,size_bytes,count,values,type,redop,root,iters,oop_time_us,oop_algbw_gbs,oop_busbw_gbs,oop_wrong,ip_time_us,"
         "ip_algbw_gbs,ip_busbw_gbs,ip_wrong,sent_bytes_per_rank,sent_over_size,max_error,error\n";
  nlohmann::json jrows = nlohmann::json::array();
  for (const auto& r : rows) {
    csv << r.algorithm << ',' << r.ranks << ',' << r.bytes << ',' << r.count << ',' << r.values << ',' << r.type << ",sum,-1," << r.iters << ',' << r.oop.time_us << ','
        << r.oop.algbw_gbs << ',' << r.oop.busbw_gbs << ',' << r.oop.wrong << ',' << r.ip.time_us << ',' << r.ip.algbw_gbs << ','
        << r.ip.busbw_gbs << ',' << r.ip.wrong << ',';
    if (r.sent_bytes_per_rank >= 0) csv << r.sent_bytes_per_rank << ',' << r.sent_bytes_per_rank / static_cast<double>(r.bytes);
    else csv << ',';
    csv << ',';
    if (r.max_error >= 0 || std::isnan(r.max_error)) csv << r.max_error;
    csv << ',' << csv_field(r.oop.error.empty() ? r.ip.error : r.oop.error) << '\n';
    jrows.push_back(to_json(r));
  }
  nlohmann::json jn = nlohmann::json::array();
  for (const auto& [what, why] : not_run) jn.push_back({{"algorithm", what}, {"why", why}});
  const nlohmann::json doc = {{"benchmark", "spin-bench coll"},
                              {"conditions", cond.to_json()},
                              {"config",
                               {{"ranks", o.ranks}, {"min_bytes", o.min_bytes}, {"max_bytes", o.max_bytes}, {"factor", o.factor},
                                {"max_iters", o.max_iters}, {"warmup_iters", o.warmup_iters}, {"budget_bytes", o.budget_bytes},
                                {"packet_bytes", o.packet_bytes}, {"window_packets", o.window_packets},
                                {"switch_slots", o.switch_slots}, {"link_latency_ns", o.link_latency_ns},
                                {"authenticate", o.authenticate},
                                {"repair_min_us", o.repair_min_us}, {"repair_max_ms", o.repair_max_ms},
                                {"algorithms", o.algorithms}, {"dtypes", o.dtypes}}},
                              {"ring_bytes_factor", ring},
                              {"rows", jrows},
                              {"not_run", jn},
                              {"exact", all_ok}};
  const std::string base = o.out_dir + "/coll";
  const bool files_ok = write_text(base + ".csv", csv.str()) && write_text(base + ".json", doc.dump(2) + "\n");
  if (o.plots && files_ok && !order.empty()) {
    // One series per algorithm and datatype, over the float32 tensor's size.
    std::vector<std::pair<std::string, std::string>> series;
    for (const auto& a : order)
      for (const auto& r : rows)
        if (r.algorithm == a && std::find(series.begin(), series.end(), std::make_pair(a, r.type)) == series.end())
          series.emplace_back(a, r.type);
    std::ostringstream dat;
    for (std::size_t i = 0; i < series.size(); ++i) {
      dat << (i ? "\n\n" : "") << "# " << series[i].first << ' ' << series[i].second << '\n';
      for (const auto& r : rows)
        if (r.algorithm == series[i].first && r.type == series[i].second && r.oop.ran)
          dat << r.values * 4 << ' ' << r.oop.busbw_gbs << ' ' << r.oop.time_us << '\n';
    }
    if (write_text(base + ".dat", dat.str())) {
      std::ostringstream gp;
      gp << "set terminal pngcairo size 1100,650 noenhanced\nset output '" << base << ".png'\n"
         << "set title 'spin-bench coll: allreduce sum, " << o.ranks << " ranks, out-of-place (" << cond.cpu_model << ")'\n"
         << "set xlabel 'float32 tensor size (bytes)'\nset logscale x 2\nset format x '%.0b %BB'\nset logscale y\nset format y '%g'\n"
         << "set key left top\nset grid\n"
         << "set ylabel 'time per call (us)'\nplot ";
      for (std::size_t i = 0; i < series.size(); ++i)
        gp << (i ? ", " : "") << "'" << base << ".dat' index " << i << " using 1:3 with linespoints title '" << series[i].first
           << (series.size() > order.size() ? " " + series[i].second : std::string()) << "'";
      gp << '\n';
      if (std::string why = run_gnuplot(base + ".gp", gp.str()); !why.empty())
        std::printf("no plot: %s\n", why.c_str());
      else
        std::printf("wrote %s.png\n", base.c_str());
    }
  }
  if (files_ok) std::printf("wrote %s.csv and %s.json\n", base.c_str(), base.c_str());
  std::printf("result: %s\n", all_ok ? "every result exact (#wrong 0)" : "WRONG RESULTS OR FAILED COLLECTIVES (exit status 1)");
  std::fflush(stdout);
  if (!files_ok) return 2;
  int vt_status = 0;
  if (o.virtual_time && !spin_algos.empty()) {
    vt_options v;
    v.what = "allreduce";
    v.hosts = {o.ranks};
    v.sizes.clear();
    for (std::uint64_t b : sizes) v.sizes.push_back(std::max<std::uint64_t>(4, b / 4 * 4));
    v.algorithms = spin_algos;
    v.iters = 1;
    v.packet_bytes = o.packet_bytes;
    v.window = o.window_packets;
    v.switch_slots = o.switch_slots;
    v.link_latency_ns = static_cast<double>(o.link_latency_ns);
    v.out_dir = o.out_dir;
    v.plots = o.plots;
    std::printf("\n==== The tables above are WALL-CLOCK time on this machine. Below: the same allreduce (float32) in VIRTUAL TIME,\n"
                "==== modelled sPIN NICs and links, the same on any machine (spin-bench vt allreduce; docs/virtual-time.md).\n\n");
    std::fflush(stdout);
    vt_status = run_vt(v);
  }
  return !all_ok || vt_status == 1 ? 1 : vt_status;
}

} // namespace spin::bench
