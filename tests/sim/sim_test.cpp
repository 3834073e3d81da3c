// Virtual time (spin::sim): determinism, the models' bounds, equality with wall-clock results,
// and the refusal of bad model parameters.
#include <doctest/doctest.h>

#include <spin/coll/coll.hpp>
#include <spin/emu/cluster.hpp>
#include <spin/host/message.hpp>
#include <spin/rt/loader.hpp>
#include <spin/rt/wire.hpp>
#include <spin/sim/cluster.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <csignal>
#include <cstring>
#include <random>
#include <sys/wait.h>
#include <unistd.h>

using namespace spin;

namespace {

const std::string package_dir = SPIN_TEST_PACKAGE_DIR;

// The allreduce of `count` float32 values on every host of `t` with `algo`; rank r's input is
// a reproducible pseudo-random vector. Returns every rank's output and, in `elapsed`, rank 0's
// virtual time of the call.
struct vt_result {
  std::vector<std::vector<float>> out;
  std::vector<std::string> errors;
  std::string stats_json;
  sim::cluster_stats st;
  std::uint64_t elapsed_ns = 0;
};

std::vector<float> input_of(std::uint32_t r, std::size_t count) {
  std::mt19937 g(1234 + r);
  std::uniform_real_distribution<float> d(-1e3f, 1e3f);
  std::vector<float> v(count);
  for (auto& x : v) x = d(g);
  return v;
}

// Rank r of a group of ranks 0..n-1 (id 1), and the options these tests share.
coll::group group_of(std::uint32_t r, std::uint32_t n) {
  coll::group g;
  g.id = 1;
  g.me = r;
  for (std::uint32_t i = 0; i < n; ++i) g.members.push_back(i);
  return g;
}

coll::options options_with(coll::fabric* fab) {
  coll::options o;
  o.switches = fab;
  o.arena_bytes = 16 << 20;
  o.staging_bytes = 1 << 20;
  return o;
}

vt_result allreduce_vt(const emu::topology& t, std::size_t count, coll::algorithm algo, std::uint32_t switch_slots = 64) {
  vt_result res;
  auto c = sim::cluster::create(t);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message));
  sim::cluster& cl = *c.value();
  auto fab = coll::fabric::create(t, cl.controls());
  REQUIRE_MESSAGE(fab.ok(), (fab.ok() ? std::string() : fab.err().message));
  const auto n = static_cast<std::uint32_t>(t.host_count());
  res.out.resize(n);
  res.errors.resize(n);
  for (std::uint32_t r = 0; r < n; ++r)
    cl.spawn("rank" + std::to_string(r), [&, r] {
      coll::group g;
      g.id = 1;
      g.me = r;
      for (std::uint32_t i = 0; i < n; ++i) g.members.push_back(i);
      coll::options o;
      o.switches = fab.value().get();
      o.arena_bytes = 16 << 20;
      o.staging_bytes = 1 << 20;
      o.switch_slots = switch_slots;
      auto cm = coll::communicator::create(*cl.host(r), g, o);
      if (!cm) {
        res.errors[r] = cm.err().message;
        return;
      }
      const std::vector<float> in = input_of(r, count);
      res.out[r].resize(count);
      const auto t0 = cl.host(r)->now();
      auto a = cm.value()->allreduce(in.data(), res.out[r].data(), count, coll::dtype::f32, coll::op::sum, algo);
      if (!a) res.errors[r] = a.err().message;
      if (r == 0) res.elapsed_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(cl.host(r)->now() - t0).count());
    });
  auto run = cl.run();
  REQUIRE_MESSAGE(run.ok(), (run.ok() ? std::string() : run.err().message));
  res.st = cl.stats();
  res.stats_json = sim::to_json(res.st);
  return res;
}

emu::link_model fast_link() {
  emu::link_model lm;
  lm.rate_gbps = 100;
  lm.latency = std::chrono::nanoseconds(500);
  return lm;
}

// A child process that keeps one CPU busy until killed: load from another process.
struct cpu_hog {
  pid_t pid = -1;
  cpu_hog() {
    pid = fork();
    if (pid == 0) {
      volatile std::uint64_t x = 0;
      for (;;) x = x + 1;
    }
  }
  ~cpu_hog() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// Ping-pong streams (handlers/std/pingpong.cpp) from h0 to h1 and back: h1's statistics and when
// the last echo landed. `packets` messages of `payload` bytes, or, with `one_message`, one
// message of `packets` packets (all of them in one home cluster).
struct stream_result {
  sim::node_stats echo;
  std::uint64_t end_ps = 0;
  std::uint64_t echoed = 0;
};

stream_result pingpong_stream(emu::topology t, std::uint32_t packets, std::uint32_t payload, bool one_message = false) {
  stream_result out;
  auto c = sim::cluster::create(t);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message));
  sim::cluster& cl = *c.value();
  auto pkg = rt::load_package_file(package_dir + "/pingpong.native.spkg");
  REQUIRE_MESSAGE(pkg.ok(), (pkg.ok() ? std::string() : pkg.err().message));
  rt::ec_config pp;
  pp.name = "pingpong";
  pp.match.bits = 7;
  REQUIRE(pkg.value().bind(pp).ok());
  REQUIRE(cl.node(1).install(pp).ok());
  rt::ec_config sink;
  sink.name = "sink";
  sink.match.bits = 7;
  REQUIRE(cl.node(0).install(sink).ok());
  std::vector<std::byte> mem(std::size_t{payload} * (one_message ? packets : 1));
  auto region = cl.node(0).register_host_memory(mem);
  REQUIRE(region.ok());
  cl.spawn("h0", [&] {
    if (one_message) {
      host::message m;
      m.dest_rank = 1;
      m.match_bits = 7;
      m.message_id = 1;
      m.region = region.value();
      m.len_bytes = mem.size();
      REQUIRE(cl.node(0).post(m).ok());
      return;
    }
    for (std::uint32_t i = 0; i < packets; ++i) {
      host::message m;
      m.dest_rank = 1;
      m.match_bits = 7;
      m.message_id = i + 1;
      m.region = region.value();
      m.len_bytes = payload;
      REQUIRE(cl.node(0).post(m).ok());
    }
  });
  REQUIRE(cl.run().ok());
  const auto st = cl.stats();
  out.echo = st.nodes[1];
  out.end_ps = st.now.count();
  out.echoed = st.nodes[0].packets_in;
  return out;
}

} // namespace

TEST_SUITE("sim") {

TEST_CASE("two runs of the same collectives give byte-identical timings and statistics, also under load from another process") {
  const emu::topology t = emu::star(4, fast_link());
  const vt_result a = allreduce_vt(t, 20000, coll::algorithm::switch_agg);
  vt_result b;
  {
    cpu_hog hog1, hog2;  // both cores busy elsewhere while the second run runs
    b = allreduce_vt(t, 20000, coll::algorithm::switch_agg);
  }
  for (const auto& e : a.errors) CHECK(e.empty());
  CHECK(a.elapsed_ns > 0);
  CHECK(a.elapsed_ns == b.elapsed_ns);
  CHECK(a.stats_json == b.stats_json);
  CHECK(a.out == b.out);
  const vt_result c = allreduce_vt(t, 20000, coll::algorithm::edge_ring);
  const vt_result d = allreduce_vt(t, 20000, coll::algorithm::edge_ring);
  CHECK(c.stats_json == d.stats_json);
  CHECK(c.elapsed_ns == d.elapsed_ns);
}

TEST_CASE("virtual-time results equal the wall-clock cluster's bit for bit") {
  emu::link_model lm;
  const emu::topology t = emu::star(4, lm);
  const std::size_t count = 50000;
  for (const auto algo : {coll::algorithm::switch_agg, coll::algorithm::edge_ring, coll::algorithm::host_ring}) {
    CAPTURE(static_cast<int>(algo));
    const vt_result v = allreduce_vt(t, count, algo);
    for (const auto& e : v.errors) REQUIRE_MESSAGE(e.empty(), e);
    // The same calls on spin-emu's wall-clock cluster.
    auto cl = emu::cluster::create(t, {});
    REQUIRE_MESSAGE(cl.ok(), (cl.ok() ? std::string() : cl.err().message));
    emu::cluster_runner running(*cl.value());
    auto fab = coll::fabric::create(*cl.value());
    REQUIRE(fab.ok());
    std::vector<std::vector<float>> out(4, std::vector<float>(count));
    std::vector<std::string> errors(4);
    std::vector<std::thread> ts;
    for (std::uint32_t r = 0; r < 4; ++r)
      ts.emplace_back([&, r] {
        auto cm = coll::communicator::create(*cl.value()->host(r), group_of(r, 4), options_with(fab.value().get()));
        if (!cm) {
          errors[r] = cm.err().message;
          return;
        }
        const std::vector<float> in = input_of(r, count);
        if (auto a = cm.value()->allreduce(in.data(), out[r].data(), count, coll::dtype::f32, coll::op::sum, algo); !a) errors[r] = a.err().message;
      });
    for (auto& th : ts) th.join();
    for (const auto& e : errors) REQUIRE_MESSAGE(e.empty(), e);
    for (std::uint32_t r = 0; r < 4; ++r) CHECK(std::memcmp(out[r].data(), v.out[r].data(), count * sizeof(float)) == 0);
    // And every rank holds the same bits.
    for (std::uint32_t r = 1; r < 4; ++r) CHECK(v.out[r] == v.out[0]);
  }
}

TEST_CASE("a switch allreduce completes on a member that joins late while the others finish and leave") {
  // Ranks 0..2 create their communicators and call at once; rank 3 creates its own 1 ms later
  // (virtual time), so their hellos reach a NIC with no engine and are lost. Had they sent their
  // contributions before their verdict, they would complete on rank 3's contributions and
  // destroy their communicators, and rank 3 would ask for the lost hellos until its timeout.
  emu::link_model lm;
  lm.rate_gbps = 100;
  lm.latency = std::chrono::nanoseconds(500);
  const emu::topology t = emu::star(4, lm);
  auto c = sim::cluster::create(t);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message));
  sim::cluster& cl = *c.value();
  auto fab = coll::fabric::create(t, cl.controls());
  REQUIRE_MESSAGE(fab.ok(), (fab.ok() ? std::string() : fab.err().message));
  const std::size_t count = 50000;
  std::vector<std::vector<float>> out(4, std::vector<float>(count));
  std::vector<std::string> errors(4);
  for (std::uint32_t r = 0; r < 4; ++r)
    cl.spawn("rank" + std::to_string(r), [&, r] {
      if (r == 3) cl.host(r)->sleep_for(std::chrono::milliseconds(1));
      coll::options o = options_with(fab.value().get());
      o.timeout = std::chrono::milliseconds(2000);
      auto cm = coll::communicator::create(*cl.host(r), group_of(r, 4), o);
      if (!cm) {
        errors[r] = cm.err().message;
        return;
      }
      const std::vector<float> in = input_of(r, count);
      if (auto a = cm.value()->allreduce(in.data(), out[r].data(), count, coll::dtype::f32, coll::op::sum, coll::algorithm::switch_agg); !a)
        errors[r] = a.err().message;
    });
  auto run = cl.run();
  REQUIRE_MESSAGE(run.ok(), (run.ok() ? std::string() : run.err().message));
  for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  const vt_result ring = allreduce_vt(t, count, coll::algorithm::edge_ring);
  for (std::uint32_t r = 0; r < 4; ++r) CHECK(out[r] == ring.out[0]);
}

TEST_CASE("a two-level fat tree runs the switch allreduce through its spine, with the edge ring's bits") {
  const emu::topology t = emu::fat_tree(4, 4, 2, fast_link());
  REQUIRE(emu::validate(t).ok());
  CHECK(t.host_count() == 16);
  const vt_result sw = allreduce_vt(t, 30000, coll::algorithm::switch_agg);
  const vt_result ring = allreduce_vt(t, 30000, coll::algorithm::edge_ring);
  for (const auto& e : sw.errors) REQUIRE_MESSAGE(e.empty(), e);
  for (const auto& e : ring.errors) REQUIRE_MESSAGE(e.empty(), e);
  for (std::uint32_t r = 0; r < 16; ++r) {
    CHECK(sw.out[r] == ring.out[0]);
    CHECK(ring.out[r] == ring.out[0]);
  }
  // The contributions crossed a leaf and reached a spine's handlers (the aggregating root).
  bool spine = false;
  for (const auto& n : sw.st.nodes) spine = spine || (n.is_switch && n.name[0] == 's' && n.handled > 0);
  CHECK(spine);
  CHECK(sw.elapsed_ns > 0);
}

TEST_CASE("a switch worker's start streams its reads from host memory: a burst of 256 slots costs less than 256 read round trips") {
  // 4 hosts, 1 MiB of float32 (256 packets of 4 KiB, one epoch) into 256 slots: each worker
  // sends all 256 at once from one invocation. Compute sized for the line (64 clusters at the
  // hosts and the switch, copies free), so the start is what shows: one blocking read of host
  // memory per packet (2 x 500 ns PCIe latency each) took 256 x 1.06 us = 272 us of one HPU,
  // and the call 441 us; with 8 reads in flight the burst costs about the PCIe transfers
  // (spin-bench vt, the same setting after a warm-up: 164 us).
  emu::link_model lm;
  lm.rate_gbps = 400;
  lm.latency = std::chrono::nanoseconds(500);
  emu::topology t = emu::star(4, lm);
  t.nic.clusters = 64;
  t.nic.host_copy_gbps = 100000;
  t.nic.host_reduce_gbps = 100000;
  t.switch_nic.clusters = 64;
  REQUIRE(emu::validate(t).ok());
  const std::size_t count = 262144;
  const vt_result sw = allreduce_vt(t, count, coll::algorithm::switch_agg, 256);
  const vt_result ring = allreduce_vt(t, count, coll::algorithm::edge_ring);
  for (const auto& e : sw.errors) REQUIRE_MESSAGE(e.empty(), e);
  for (const auto& e : ring.errors) REQUIRE_MESSAGE(e.empty(), e);
  for (std::uint32_t r = 0; r < 4; ++r) CHECK(sw.out[r] == ring.out[0]);
  const double round_trips_ns = 256 * 2 * static_cast<double>(t.nic.pcie_latency.count());
  INFO("switch allreduce of 1 MiB: ", sw.elapsed_ns, " ns");
  CHECK(static_cast<double>(sw.elapsed_ns) < round_trips_ns);
}

TEST_CASE("an HPU-bound NIC runs the handler formula's rate, a line-bound one the line rate") {
  // One HPU at 1 GHz: the ping-pong handler's modelled time (invocation + 39 x cpi + command
  // cycles) sets the rate; the link (4 Tbit/s) is far faster.
  emu::link_model fast;
  fast.rate_gbps = 4000;
  fast.queue_packets = 1 << 16;
  emu::topology t = emu::pair(fast);
  t.nic.clusters = 1;
  t.nic.hpus_per_cluster = 1;
  const stream_result one = pingpong_stream(t, 2000, 1024);
  const stream_result two = pingpong_stream(t, 4000, 1024);
  REQUIRE(one.echoed == 2000);
  REQUIRE(two.echoed == 4000);
  const double handler_ns = static_cast<double>(one.echo.hpu_busy.count()) / 1000.0 / 2000;
  const double per_packet_ns = static_cast<double>(two.end_ps - one.end_ps) / 1000.0 / 2000;
  CHECK(per_packet_ns == doctest::Approx(handler_ns).epsilon(0.01));
  const double instr = static_cast<double>(one.echo.instructions) / static_cast<double>(one.echo.invocations);
  CHECK(handler_ns == doctest::Approx(t.nic.invocation_cycles + instr * t.nic.cpi + t.nic.command_cycles).epsilon(0.02));

  // 32 HPUs behind a 10 Gbit/s link: the line sets the rate, a frame's bytes x 8 / 10 ns each.
  emu::link_model slow;
  slow.rate_gbps = 10;
  slow.queue_packets = 1 << 16;
  const emu::topology u = emu::pair(slow);
  const stream_result a = pingpong_stream(u, 500, 1024);
  const stream_result b = pingpong_stream(u, 1000, 1024);
  REQUIRE(b.echoed == 1000);
  const double frame_bytes = static_cast<double>(a.echo.bytes_in) / 500;
  const double line_ns = frame_bytes * 8 / 10;
  CHECK(static_cast<double>(b.end_ps - a.end_ps) / 1000.0 / 500 == doctest::Approx(line_ns).epsilon(0.01));
  CHECK(a.echo.waiting_max <= 1);  // the HPUs never make a packet wait at this rate
}

TEST_CASE("a message's packets run on every cluster's HPUs when its home cluster is full") {
  // 2 clusters x 1 HPU at 0.25 GHz, one message of 4 KiB packets (one home cluster): the other
  // cluster's HPU takes the packets its home cluster has no HPU for, so the rate is about two
  // HPUs'. The link and the sender's DMA reads (4 Tbit/s) are far faster.
  emu::link_model fast;
  fast.rate_gbps = 4000;
  fast.queue_packets = 1 << 16;
  emu::topology t = emu::pair(fast);
  t.nic.clusters = 2;
  t.nic.hpus_per_cluster = 1;
  t.nic.hpu_ghz = 0.25;
  t.nic.pcie_gbps = 4000;
  const stream_result one = pingpong_stream(t, 500, 4096, true);
  const stream_result two = pingpong_stream(t, 1000, 4096, true);
  REQUIRE(one.echoed == 500);
  REQUIRE(two.echoed == 1000);
  const double handler_ns = static_cast<double>(one.echo.hpu_busy.count()) / 1000.0 / 500;
  const double per_packet_ns = static_cast<double>(two.end_ps - one.end_ps) / 1000.0 / 500;
  // About half of them move (a moved packet's second L1 copy, 4 KiB at 512 Gbit/s = 64 ns,
  // keeps the other cluster's HPU a little longer).
  CHECK(one.echo.moved > 150);
  CHECK(one.echo.moved < 350);
  CHECK(per_packet_ns < 0.65 * handler_ns);
  CHECK(per_packet_ns > 0.45 * handler_ns);
  // One cluster of one HPU: nothing to move to, the rate is one HPU's.
  t.nic.clusters = 1;
  const stream_result a = pingpong_stream(t, 500, 4096, true);
  const stream_result b = pingpong_stream(t, 1000, 4096, true);
  CHECK(a.echo.moved == 0);
  CHECK(static_cast<double>(b.end_ps - a.end_ps) / 1000.0 / 500 == doctest::Approx(handler_ns).epsilon(0.01));
}

TEST_CASE("PCIe is full duplex: a NIC reads a message from its host while it writes another to it at full rate each way") {
  // Two hosts send each other 1 MiB at once over a 4 Tbit/s link; each NIC's DMA engine reads
  // the outgoing message from its host (10 Gbit/s PCIe: 839 us) while the to_host handler
  // writes the incoming one. Sharing one direction would take twice as long.
  emu::link_model fast;
  fast.rate_gbps = 4000;
  fast.queue_packets = 1 << 16;
  emu::topology t = emu::pair(fast);
  t.nic.pcie_gbps = 10;
  auto c = sim::cluster::create(t);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message));
  sim::cluster& cl = *c.value();
  auto pkg = rt::load_package_file(package_dir + "/to_host.native.spkg");
  REQUIRE_MESSAGE(pkg.ok(), (pkg.ok() ? std::string() : pkg.err().message));
  constexpr std::size_t bytes = 1 << 20;
  std::array<std::vector<std::byte>, 2> out, in;
  std::array<rt::region_id, 2> out_region{}, in_region{};
  for (std::uint32_t h = 0; h < 2; ++h) {
    out[h].resize(bytes);
    in[h].assign(bytes, std::byte{0});
    for (std::size_t i = 0; i < bytes; ++i) out[h][i] = static_cast<std::byte>((i * 7 + h * 3) & 0xff);
    auto o = cl.node(h).register_host_memory(out[h]);
    auto r = cl.node(h).register_host_memory(in[h]);
    REQUIRE(o.ok());
    REQUIRE(r.ok());
    out_region[h] = o.value();
    in_region[h] = r.value();
    rt::ec_config e;
    e.name = "to_host";
    e.match.bits = 9;
    e.window = rt::host_window{in_region[h], 0, bytes};
    REQUIRE(pkg.value().bind(e).ok());
    REQUIRE(cl.node(h).install(e).ok());
  }
  for (std::uint32_t h = 0; h < 2; ++h)
    cl.spawn("h" + std::to_string(h), [&, h] {
      host::message m;
      m.dest_rank = 1 - h;
      m.match_bits = 9;
      m.message_id = 1;
      m.region = out_region[h];
      m.len_bytes = bytes;
      REQUIRE(cl.node(h).post(m).ok());
    });
  REQUIRE(cl.run().ok());
  CHECK(in[0] == out[1]);
  CHECK(in[1] == out[0]);
  const auto st = cl.stats();
  const double one_way_ns = bytes * 8.0 / 10;  // 838861 ns
  for (std::uint32_t h = 0; h < 2; ++h) {
    CHECK(st.nodes[h].dma_bytes == 2 * bytes);
    CHECK(static_cast<double>(st.nodes[h].dma_busy.count()) / 1000 == doctest::Approx(2 * one_way_ns).epsilon(0.001));
  }
  // Both directions at once: the whole exchange takes one direction's time (plus latencies).
  CHECK(static_cast<double>(st.now.count()) / 1000 > one_way_ns);
  CHECK(static_cast<double>(st.now.count()) / 1000 < 1.05 * one_way_ns);
}

TEST_CASE("a port queue never holds more than queue_packets: the excess is dropped and counted, and the NIC's packet buffer likewise") {
  // Incast: three hosts stream at 100 Gbit/s into one 100 Gbit/s switch port.
  emu::link_model lm;
  lm.rate_gbps = 100;
  lm.queue_packets = 16;
  const emu::topology t = emu::star(4, lm);
  auto c = sim::cluster::create(t);
  REQUIRE(c.ok());
  sim::cluster& cl = *c.value();
  rt::ec_config sink;
  sink.name = "sink";
  sink.match.bits = 9;
  REQUIRE(cl.node(0).install(sink).ok());
  std::vector<std::vector<std::byte>> mem(4, std::vector<std::byte>(1024));
  const std::uint32_t per_host = 300;
  for (std::uint32_t h = 1; h < 4; ++h) {
    auto region = cl.node(h).register_host_memory(mem[h]);
    REQUIRE(region.ok());
    cl.spawn("h" + std::to_string(h), [&, h, reg = region.value()] {
      for (std::uint32_t i = 0; i < per_host; ++i) {
        host::message m;
        m.dest_rank = 0;
        m.match_bits = 9;
        m.message_id = i + 1;
        m.region = reg;
        m.len_bytes = 1024;
        REQUIRE(cl.node(h).post(m).ok());
      }
    });
  }
  REQUIRE(cl.run().ok());
  const auto st = cl.stats();
  const sim::port_stats* down = nullptr;
  for (const auto& p : st.ports)
    if (p.from == "s0" && p.to == "h0") down = &p;
  REQUIRE(down != nullptr);
  CHECK(down->depth_max <= 16);
  CHECK(down->dropped_queue_full > 0);
  CHECK(down->packets + down->dropped_queue_full == 3 * per_host);
  CHECK(st.nodes[0].packets_in == down->packets);
  CHECK(st.nodes[4].drops[static_cast<std::size_t>(sim::drop::queue_full)] == down->dropped_queue_full);

  // A packet buffer of 2 KiB holds one 1 KiB frame while its handler runs: a burst overflows it.
  emu::link_model fast;
  fast.rate_gbps = 4000;
  fast.queue_packets = 1 << 16;
  emu::topology p = emu::pair(fast);
  p.nic.packet_buffer_bytes = 2048;
  p.nic.clusters = 1;
  p.nic.hpus_per_cluster = 1;
  const stream_result s = pingpong_stream(p, 200, 1024);
  CHECK(s.echo.packet_buffer_max <= 2048);
  CHECK(s.echo.drops[static_cast<std::size_t>(sim::drop::packet_buffer_full)] > 0);
  CHECK(s.echo.handled + s.echo.drops[static_cast<std::size_t>(sim::drop::packet_buffer_full)] == 200);
}

TEST_CASE("bad model parameters are refused, naming the key") {
  auto refused = [](const std::string& text, const std::string& key) {
    auto t = emu::parse_topology("[[host]]\nname = \"h0\"\n[[host]]\nname = \"h1\"\n[[link]]\na = \"h0\"\nb = \"h1\"\n" + text, "t.toml");
    REQUIRE_FALSE(t.ok());
    CHECK(t.err().code == errc::invalid_argument);
    CHECK_MESSAGE(t.err().message.find(key) != std::string::npos, t.err().message);
  };
  refused("[nic]\ncpi = 0\n", "cpi");
  refused("[nic]\nhpu_ghz = -1\n", "hpu_ghz");
  refused("[nic]\nclusters = 0\n", "clusters");
  refused("[nic]\nhpus_per_cluster = 65\n", "hpus_per_cluster");
  refused("[nic]\npacket_buffer_bytes = 10\n", "packet_buffer_bytes");
  refused("[nic]\npcie_latency_ns = 2000000000\n", "pcie_latency_ns");
  refused("[nic]\nclusters = 2.5\n", "clusters");
  refused("[nic]\ncpi = \"fast\"\n", "cpi");
  refused("[nic]\nhpus = 4\n", "hpus");  // unknown key: the known ones are listed
  refused("[switch_nic]\nl1_copy_gbps = 0\n", "l1_copy_gbps");
  refused("[switch_model]\nlatency_ns = -5\n", "latency_ns");
  refused("[defaults]\ngap_ns = -1\n", "gap_ns");
  // In code: validate() names the key too, and sim::cluster::create refuses what it refuses.
  emu::topology t = emu::pair({});
  t.nic.cpi = std::nan("");
  auto c = sim::cluster::create(t);
  REQUIRE_FALSE(c.ok());
  CHECK(c.err().message.find("cpi") != std::string::npos);
  t.nic.cpi = 1;
  sim::options o;
  o.payload_bytes = 10;
  auto d = sim::cluster::create(t, o);
  REQUIRE_FALSE(d.ok());
  CHECK(d.err().message.find("payload_bytes") != std::string::npos);
  // A good file round-trips through to_toml with its models.
  auto good = emu::parse_topology("[nic]\ncpi = 1.5\nclusters = 2\n[switch_model]\nlatency_ns = 100\n"
                                  "[[host]]\nname = \"h0\"\n[[host]]\nname = \"h1\"\n[[link]]\na = \"h0\"\nb = \"h1\"\ngap_ns = 2.5\n",
                                  "t.toml");
  REQUIRE_MESSAGE(good.ok(), (good.ok() ? std::string() : good.err().message));
  CHECK(good.value().nic.cpi == 1.5);
  CHECK(good.value().switch_nic.clusters == 2);  // [switch_nic] takes [nic]'s values
  CHECK(good.value().switch_nic.memory_bytes == emu::switch_memory_bytes);  // but at least 1 GiB of memory
  auto again = emu::parse_topology(emu::to_toml(good.value()), "again.toml");
  REQUIRE(again.ok());
  CHECK(again.value() == good.value());
}

TEST_CASE("a cluster whose run() stopped at its limit ends its waiting actors when destroyed") {
  bool returned = false;
  {
    auto c = sim::cluster::create(emu::pair({}));
    REQUIRE(c.ok());
    sim::cluster& cl = *c.value();
    rt::ec_config quiet;
    quiet.name = "quiet";
    auto ec = cl.node(0).install(quiet);
    REQUIRE(ec.ok());
    cl.spawn("waiter", [&] {
      std::array<rt::host_event, 4> evs;
      // One virtual second, far past the run's limit; then time's end when the cluster goes.
      while (cl.node(0).wait_events(ec.value(), evs, std::chrono::seconds(1)) == 0 &&
             cl.node(0).now() < std::chrono::steady_clock::time_point::max()) {
      }
      returned = true;
    });
    cl.spawn("never runs", [] {});
    auto r = cl.run(sim::picoseconds(1'000'000));  // 1 us
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::timeout);
    CHECK(cl.now().count() <= 1'000'000);
  }  // the destructor must not hang
  CHECK(returned);
}

TEST_CASE("actors that meet go on together at the virtual time the last one came; a meeting times out, or is cancelled") {
  auto c = sim::cluster::create(emu::pair({}));
  REQUIRE(c.ok());
  sim::cluster& cl = *c.value();
  using sim::cluster;
  // Not an actor: it cannot wait.
  CHECK(cl.meet("x", 1, std::chrono::seconds(1)) == cluster::meet_result::cancelled);
  std::array<cluster::meet_result, 5> how{};
  std::array<std::uint64_t, 5> at{};
  for (std::size_t i = 0; i < 3; ++i)
    cl.spawn("member " + std::to_string(i), [&, i] {
      cl.node(0).sleep_for(std::chrono::microseconds(10 * (3 - i)));  // 30, 20, 10 us
      how[i] = cl.meet("three", 3, std::chrono::seconds(1));
      at[i] = cl.now().count();
    });
  cl.spawn("alone", [&] {
    how[3] = cl.meet("two", 2, std::chrono::microseconds(5));
    at[3] = cl.now().count();
  });
  cl.spawn("cancelled", [&] {
    how[4] = cl.meet("never", 2, std::chrono::seconds(1));
    at[4] = cl.now().count();
  });
  cl.spawn("canceller", [&] {
    cl.node(1).sleep_for(std::chrono::microseconds(7));
    cl.cancel_meeting("never");
    cl.cancel_meeting("no such meeting");
  });
  REQUIRE(cl.run().ok());
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(how[i] == cluster::meet_result::met);
    CHECK(at[i] == 30'000'000);  // the last one came at 30 us
  }
  CHECK(how[3] == cluster::meet_result::timed_out);
  CHECK(at[3] == 5'000'000);
  CHECK(how[4] == cluster::meet_result::cancelled);
  CHECK(at[4] == 7'000'000);
}

TEST_CASE("queue depth samples are taken at every interval while packets move") {
  emu::link_model lm;
  lm.rate_gbps = 10;
  lm.queue_packets = 1 << 16;
  const emu::topology t = emu::pair(lm);
  sim::options o;
  o.sample_interval = sim::picoseconds(1'000'000);  // 1 us
  auto c = sim::cluster::create(t, o);
  REQUIRE(c.ok());
  sim::cluster& cl = *c.value();
  rt::ec_config sink;
  sink.name = "sink";
  sink.match.bits = 5;
  REQUIRE(cl.node(1).install(sink).ok());
  std::vector<std::byte> mem(1024);
  auto region = cl.node(0).register_host_memory(mem);
  REQUIRE(region.ok());
  cl.spawn("h0", [&] {
    for (std::uint32_t i = 0; i < 50; ++i) {
      host::message m;
      m.dest_rank = 1;
      m.match_bits = 5;
      m.message_id = i + 1;
      m.region = region.value();
      m.len_bytes = 1024;
      REQUIRE(cl.node(0).post(m).ok());
    }
  });
  REQUIRE(cl.run().ok());
  const auto& s = cl.samples();
  // 50 frames of ~1.1 KB at 10 Gbit/s take ~45 us: a sample per us, depths that fall to 0.
  REQUIRE(s.size() >= 40);
  std::uint32_t deepest = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    CHECK(s[i].at.count() == i * 1'000'000);
    REQUIRE(s[i].port_depth.size() == 2);
    deepest = std::max(deepest, s[i].port_depth[0]);
  }
  CHECK(deepest > 10);
  CHECK(s.back().port_depth[0] <= 1);
}

TEST_CASE("a NIC in virtual time refuses handlers that do not count their instructions") {
  auto c = sim::cluster::create(emu::pair({}));
  REQUIRE(c.ok());
  auto pkg = rt::read_package_file(package_dir + "/pingpong.native.spkg");
  REQUIRE(pkg.ok());
  pkg.value().counted_object.clear();  // as spinc builds it without --count-instructions
  auto lp = rt::load_package(pkg.value());
  REQUIRE(lp.ok());
  rt::ec_config cfg;
  cfg.name = "uncounted";
  REQUIRE(lp.value().bind(cfg).ok());
  auto r = c.value()->node(0).install(cfg);
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == errc::not_supported);
  CHECK(r.err().message.find("--count-instructions") != std::string::npos);
}

} // TEST_SUITE

TEST_CASE("host traffic crosses the ports as packets: an isolated packet's exact time, two messages to one node share its "
          "link, a lossy link loses none") {
  emu::link_model lm;
  lm.rate_gbps = 100;
  lm.latency = std::chrono::nanoseconds(1000);
  lm.queue_packets = 1 << 16;
  const emu::nic_model nic{};
  auto ceil_ps = [](double v) { return static_cast<std::uint64_t>(std::ceil(v)); };
  SUBCASE("one packet of 100 bytes between two hosts: doorbell, DMA read, transmit, wire, DMA write") {
    auto c = sim::cluster::create(emu::pair(lm));
    REQUIRE(c.ok());
    sim::cluster& cl = *c.value();
    std::uint64_t at = 0;
    cl.spawn("sender", [&] { REQUIRE(cl.send_host_traffic(0, 1, 100, [&] { at = cl.now().count(); }).ok()); });
    REQUIRE(cl.run().ok());
    const std::uint64_t pcie = static_cast<std::uint64_t>(nic.pcie_latency.count()) * 1000;
    const std::uint64_t xfer = ceil_ps(100 * 8000.0 / nic.pcie_gbps);
    const std::uint64_t ready = pcie + xfer + 2 * pcie + static_cast<std::uint64_t>(nic.tx_latency.count()) * 1000;
    const std::uint64_t wire = ceil_ps((100 + rt::wire::max_overhead) * 8000.0 / lm.rate_gbps) + 1'000'000;
    CHECK(at == ready + wire + xfer + pcie);
    auto idle = cl.transfer_time(0, 1, 100);  // the wire alone
    REQUIRE(idle.ok());
    CHECK(idle.value().total().count() == wire);
    const auto st = cl.stats();
    CHECK(st.nodes[0].host_packets == 1);
    CHECK(st.nodes[1].packets_in == 1);
    CHECK(st.nodes[1].handled == 0);  // past the HPUs
  }
  SUBCASE("two 1 MiB messages to one host at once each take about twice one alone; alone it runs at line rate") {
    const std::uint64_t mib = 1 << 20;
    auto one = [&](int senders) {
      auto c = sim::cluster::create(emu::star(3, lm));
      REQUIRE(c.ok());
      sim::cluster& cl = *c.value();
      std::vector<std::uint64_t> at(static_cast<std::size_t>(senders), 0);
      for (int i = 0; i < senders; ++i)
        cl.spawn("sender", [&, i] {
          REQUIRE(cl.send_host_traffic(static_cast<std::uint32_t>(1 + i), 0, mib, [&, i] { at[static_cast<std::size_t>(i)] = cl.now().count(); }).ok());
        });
      REQUIRE(cl.run().ok());
      return *std::max_element(at.begin(), at.end());
    };
    const std::uint64_t line = mib * 8000 / 100;  // ps at 100 Gbit/s, payload only
    const std::uint64_t alone = one(1), both = one(2);
    CHECK(alone > line);
    CHECK(alone < line + line / 5);  // headers and latencies: within 20 %
    CHECK(both > 2 * line);          // the last link carries both
    CHECK(both < 2 * alone);
  }
  SUBCASE("a link that loses half its packets loses none of a host's traffic") {
    emu::link_model lossy = lm;
    lossy.loss = 0.5;
    lossy.duplicate = 0.2;
    auto c = sim::cluster::create(emu::pair(lossy));
    REQUIRE(c.ok());
    sim::cluster& cl = *c.value();
    bool arrived = false;
    cl.spawn("sender", [&] { REQUIRE(cl.send_host_traffic(0, 1, 100 * 4096, [&] { arrived = true; }).ok()); });
    REQUIRE(cl.run().ok());
    CHECK(arrived);
    CHECK(cl.stats().nodes[1].packets_in == 100);
  }
  SUBCASE("a switch is no end of host traffic") {
    auto c = sim::cluster::create(emu::star(2, lm));
    REQUIRE(c.ok());
    sim::cluster& cl = *c.value();
    bool refused = false;
    cl.spawn("sender", [&] {
      auto r = cl.send_host_traffic(0, 2, 8, [] {});
      refused = !r.ok() && r.err().code == errc::not_found;
    });
    REQUIRE(cl.run().ok());
    CHECK(refused);
  }
}
