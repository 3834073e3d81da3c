// spin::coll over other spin-emu processes: three host NIC processes and a switch process
// joined by memif, each driven through its control socket (communicator::connect,
// fabric::connect). Every algorithm runs, results are checked exactly and bit for bit.
#include "../emulator/emu_process.hpp"
#include "../emulator/netns_lab.hpp"
#include "handlers/argmax.hpp"

#include <spin/coll/coll.hpp>
#include <spin/coll/kernels.hpp>
#include <spin/rt/package.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace spin;
using namespace spin::coll;
using namespace spin::test;

namespace {

constexpr std::uint32_t n_hosts = 3;

/// How the processes are joined.
enum class links {
  memif,      ///< shared-memory packet rings
  af_packet,  ///< veth pairs between network namespaces (netns_lab), the stand-in for hosts
};

/// A switch process with one port per host and three host NIC processes (ranks 0..2).
struct remote_net {
  std::optional<netns_lab> lab;  // af_packet: the namespaces (destroyed last)
  temp_dir dir;
  std::unique_ptr<emu_process> sw;
  std::vector<std::unique_ptr<emu_process>> hosts;

  /// `switch_args`, `host_args`: more arguments of the switch process and of the host processes.
  explicit remote_net(links k = links::memif, const std::vector<std::string>& switch_args = {},
                      const std::vector<std::string>& host_args = {}) {
    const std::string prefix = "spinmp-" + std::to_string(::getpid()) + "-coll";
    const std::vector<std::string> common = {"--hpus", "1", "--max-frame", "1514", "--mbuf-bytes", "2048", "--payload-bytes", "1024"};
    // af_packet: 4096-frame kernel rings (default 512), so that a receiver the scheduler leaves
    // off the CPU for a while loses nothing.
    auto af_packet = [](std::uint32_t i, const std::string& iface) {
      return "net_af_packet" + std::to_string(i) + ",iface=" + iface + ",qpairs=1,blocksz=4096,framesz=2048,framecnt=4096";
    };
    auto port_vdev = [&](std::uint32_t i) {
      return k == links::memif ? "net_memif" + std::to_string(i) + ",role=server,socket=" + dir.path + "/p" + std::to_string(i) + ".sock,id=0"
                               : af_packet(i, "p" + std::to_string(i));
    };
    const std::string pmd = k == links::memif ? "net_memif" : "net_af_packet";
    if (k == links::af_packet) lab.emplace(n_hosts, netns_lab::wiring::ports);
    auto in_ns = [&](const std::string& ns) {
      return k == links::memif ? std::vector<std::string>{} : std::vector<std::string>{"ip", "netns", "exec", ns};
    };
    sw = std::make_unique<emu_process>("sw", dir.path);
    std::vector<std::string> eal = eal_args(prefix + "-sw", port_vdev(0));
    for (std::uint32_t i = 1; i < n_hosts; ++i) eal.push_back("--vdev=" + port_vdev(i));
    auto app = common;
    app.insert(app.end(), {"--mode", "switch"});
    app.insert(app.end(), switch_args.begin(), switch_args.end());
    for (std::uint32_t i = 0; i < n_hosts; ++i)
      app.insert(app.end(), {"--port", pmd + std::to_string(i), "--route", std::to_string(i) + "=" + std::to_string(i)});
    sw->start(in_ns(lab ? lab->middle_ns : ""), eal, app);
    (void)sw->connect();  // the memif sockets exist once the control socket answers
    for (std::uint32_t i = 0; i < n_hosts; ++i) {
      hosts.push_back(std::make_unique<emu_process>("h" + std::to_string(i), dir.path));
      auto a = common;
      a.insert(a.end(), {"--port", pmd + "0", "--rank", std::to_string(i)});
      a.insert(a.end(), host_args.begin(), host_args.end());
      const std::string vdev = k == links::memif ? "net_memif0,role=client,socket=" + dir.path + "/p" + std::to_string(i) + ".sock,id=0"
                                                 : af_packet(0, "eth0");
      hosts.back()->start(in_ns(lab ? lab->hosts[i] : ""), eal_args(prefix + "-h" + std::to_string(i), vdev), a);
    }
    for (auto& h : hosts) (void)h->connect();
  }

  // The memif clients (hosts) stop first, the server (switch) once they have exited: closing a
  // memif server's ports under connected clients can crash DPDK 22.11's memif, and reaping a
  // client can block until its server is gone (emu_process::running); the destructors reap.
  ~remote_net() {
    for (auto& h : hosts) h->terminate();
    for (auto& h : hosts) (void)h->wait_exit(10s);
    sw->terminate();
    (void)sw->wait_exit(10s);
  }

  std::string diag() const {
    std::string s = sw->diag();
    for (const auto& h : hosts) s += "\n" + h->diag();
    return s;
  }
};

/// Runs f(rank) on one thread per rank and returns the results.
std::vector<result<void>> run_all(std::uint32_t n, const std::function<result<void>(std::uint32_t)>& f) {
  std::vector<result<void>> res(n);
  std::vector<std::thread> t;
  for (std::uint32_t r = 0; r < n; ++r) t.emplace_back([&, r] { res[r] = f(r); });
  for (auto& x : t) x.join();
  return res;
}

/// The options every communicator of these tests uses: small arenas, a generous timeout for
/// loaded machines, 16 slots on `fab`'s switch.
options remote_options(fabric* fab) {
  options o;
  o.timeout = std::chrono::seconds(30);
  o.arena_bytes = std::size_t{16} << 20;
  o.staging_bytes = std::size_t{4} << 20;
  o.switches = fab;
  o.switch_slots = 16;
  return o;
}

std::vector<std::unique_ptr<communicator>> connect_all(remote_net& net, fabric* fab) {
  std::vector<std::unique_ptr<communicator>> comms;
  options o = remote_options(fab);
  for (std::uint32_t r = 0; r < n_hosts; ++r) {
    group g;
    g.id = 7;
    g.members = {0, 1, 2};
    g.me = r;
    auto c = communicator::connect(net.hosts[r]->socket, 0, g, o);
    REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message) << "\n" << net.diag());
    comms.push_back(std::move(c.value()));
  }
  return comms;
}

/// Connects the members of group `id` on threads of their own, member r with fabric fab(r) and
/// `slots` switch slots; returns the communicators and the lines they logged (empty lines
/// dropped). Fails the test when a member cannot connect.
std::pair<std::vector<std::unique_ptr<communicator>>, std::vector<std::string>> connect_group(
    remote_net& net, std::uint32_t id, const std::function<fabric*(std::uint32_t)>& fab, std::uint32_t slots = 16,
    const std::array<std::uint8_t, 16>& job_secret = {}) {
  static std::mutex log_m;
  static std::vector<std::string>* log_to = nullptr;
  std::vector<std::string> said;
  log_to = &said;
  std::vector<std::unique_ptr<communicator>> comms(n_hosts);
  auto res = run_all(n_hosts, [&](std::uint32_t r) -> result<void> {
    options o = remote_options(fab(r));
    o.switch_slots = slots;
    o.job_secret = job_secret;
    o.log = [](const std::string& line) {
      std::lock_guard l(log_m);
      log_to->push_back(line);
    };
    group g;
    g.id = id;
    g.members = {0, 1, 2};
    g.me = r;
    auto c = communicator::connect(net.hosts[r]->socket, 0, g, o);
    if (!c.ok()) return c.err();
    comms[r] = std::move(c.value());
    return {};
  });
  for (std::uint32_t r = 0; r < n_hosts; ++r) REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message) << "\n" << net.diag());
  std::erase(said, std::string());
  return {std::move(comms), std::move(said)};
}

/// An i64 sum through the switch on every member, exact (a count that ends in a short packet).
void check_switch_allreduce(const std::vector<std::unique_ptr<communicator>>& comms) {
  const std::uint64_t count = 3 * 256 + 5;
  std::vector<std::vector<std::int64_t>> in(n_hosts, std::vector<std::int64_t>(count)), out = in;
  for (std::uint32_t r = 0; r < n_hosts; ++r)
    for (std::uint64_t i = 0; i < count; ++i) in[r][i] = static_cast<std::int64_t>(i * 1000 + r) - 7;
  auto res = run_all(n_hosts, [&](std::uint32_t r) {
    return comms[r]->allreduce(in[r].data(), out[r].data(), count, dtype::i64, op::sum, algorithm::switch_agg);
  });
  for (std::uint32_t r = 0; r < n_hosts; ++r) {
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    for (std::uint64_t i = 0; i < count; ++i) REQUIRE(out[r][i] == in[0][i] + in[1][i] + in[2][i]);
  }
}

} // namespace

/// Members whose fabrics are other connections (to the switch's spin-emu, processes) share
/// the switch's pool and all get the first member's answer.
static void shared_pool_case(links k) {
  remote_net net(k);
  // Fabric a serves ranks 0 and 1, fabric b rank 2: to the switch's spin-emu they are two
  // processes (one control connection each).
  fabric_options fo;
  fo.slots_per_switch = 32;
  auto fa = fabric::connect({remote_switch{net.sw->socket, 0, {0, 1, 2}}}, fo);
  REQUIRE_MESSAGE(fa.ok(), (fa.ok() ? std::string() : fa.err().message));
  auto fb = fabric::connect({remote_switch{net.sw->socket, 0, {0, 1, 2}}}, fo);
  REQUIRE_MESSAGE(fb.ok(), (fb.ok() ? std::string() : fb.err().message));
  fabric_options other = fo;
  other.slots_per_switch = 64;
  // A third connection holds 20 of the 32 slots (a group of some other job).
  auto holder = net.sw->connect();
  {
    auto a = holder.join_group(0, host::group_join{4096, {0, 1}, 20}, 0);
    REQUIRE_MESSAGE(a.ok(), (a.ok() ? std::string() : a.err().message));
    REQUIRE(a.value().state == host::join_state::install);
    REQUIRE(holder.decide_group(0, host::group_decision{4096, true, {65535}, ""}).ok());
    // The pool is the switch's: a fabric cannot resize it while groups use it.
    auto f = fabric::connect({remote_switch{net.sw->socket, 0, {0, 1, 2}}}, other);
    REQUIRE_FALSE(f.ok());
    CHECK(f.err().code == errc::bad_state);
    CHECK(f.err().message.find("cannot become 64 slots") != std::string::npos);
  }
  auto make = [&](std::uint32_t id) {
    return connect_group(net, id, [&](std::uint32_t r) { return r < 2 ? fa.value().get() : fb.value().get(); });
  };
  {
    // 12 free, the group asks for 16: refused, and the same words reach every member.
    auto [comms, said] = make(7);
    REQUIRE(said.size() == n_hosts);
    for (const auto& line : said)
      CHECK(line == "group 7 (standard) runs without switch aggregation: sw has 12 free slots of 32 (1 groups hold the rest); the group asks for 16");
    CHECK(fb.value()->usage()[0].free == 12);
  }
  // The holder's connection closes (as when its process dies): its slots go back.
  holder = host::client::connect(net.sw->socket).value();
  for (int i = 0; i < 100 && fa.value()->usage()[0].free != 32; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(fa.value()->usage()[0].free == 32);
  {
    auto [comms, said] = make(8);
    CHECK(said.empty());
    // Both fabrics see the one group that holds 16 slots.
    for (auto* f : {fa.value().get(), fb.value().get()}) {
      const auto u = f->usage();
      CHECK(u[0].free == 16);
      CHECK(u[0].groups == 1);
    }
    check_switch_allreduce(comms);
  }
  // Every member gone: the slots are back.
  CHECK(fb.value()->usage()[0].free == 32);
  CHECK(fb.value()->usage()[0].groups == 0);
}

TEST_SUITE("collectives") {

TEST_CASE("communicators and a fabric over spin-emu processes run every algorithm with exact results") {
  remote_net net(links::memif, {"--native-packages", "any"});  // a switch this job owns: argmax runs there too
  fabric_options fo;
  fo.slots_per_switch = 32;
  auto fab = fabric::connect({remote_switch{net.sw->socket, 0, {0, 1, 2}}}, fo);
  REQUIRE_MESSAGE(fab.ok(), (fab.ok() ? std::string() : fab.err().message));
  {
    const auto u = fab.value()->usage();
    REQUIRE(u.size() == 1);
    CHECK(u[0].rank == 65535);
    CHECK(u[0].name == "sw");
    CHECK(u[0].free == 32);
  }
  auto comms = connect_all(net, fab.value().get());
  {
    const auto u = fab.value()->usage();
    CHECK(u[0].free == 16);  // the group holds its 16 slots
    CHECK(u[0].groups == 1);
  }

  // Integer sums: exact, on every algorithm, across packet boundaries (256 int32 per packet).
  const std::uint64_t count = 3 * 256 + 77;
  std::vector<std::vector<std::int32_t>> in(n_hosts, std::vector<std::int32_t>(count));
  for (std::uint32_t r = 0; r < n_hosts; ++r)
    for (std::uint64_t i = 0; i < count; ++i) in[r][i] = static_cast<std::int32_t>(i * 7 + r * 1000003) - 500;
  for (algorithm a : {algorithm::switch_agg, algorithm::edge_ring, algorithm::host_ring}) {
    std::vector<std::vector<std::int32_t>> out(n_hosts, std::vector<std::int32_t>(count, -1));
    auto res = run_all(n_hosts, [&](std::uint32_t r) {
      return comms[r]->allreduce(std::span<const std::int32_t>(in[r]), std::span<std::int32_t>(out[r]), op::sum, a);
    });
    for (std::uint32_t r = 0; r < n_hosts; ++r) {
      INFO(name(a) << " rank " << r);
      REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message) << "\n" << net.diag());
      for (std::uint64_t i = 0; i < count; ++i) REQUIRE(out[r][i] == in[0][i] + in[1][i] + in[2][i]);
    }
  }

  // Random floats: the same bits on every rank and from every algorithm.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
  std::vector<std::vector<float>> fin(n_hosts, std::vector<float>(count));
  for (auto& v : fin)
    for (auto& x : v) x = dist(rng);
  std::vector<float> ref;
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg, algorithm::host_ring}) {
    std::vector<std::vector<float>> out(n_hosts, std::vector<float>(count));
    auto res = run_all(n_hosts, [&](std::uint32_t r) {
      return comms[r]->allreduce(std::span<const float>(fin[r]), std::span<float>(out[r]), op::sum, a);
    });
    for (std::uint32_t r = 0; r < n_hosts; ++r) {
      INFO(name(a) << " rank " << r);
      REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
      if (ref.empty()) ref = out[r];
      CHECK(std::memcmp(out[r].data(), ref.data(), count * sizeof(float)) == 0);
      // Within rounding of the exact sum (the bits themselves are the ring's order).
      for (std::uint64_t i = 0; i < count; i += 97) {
        const double exact = double(fin[0][i]) + double(fin[1][i]) + double(fin[2][i]);
        CHECK(std::abs(out[r][i] - exact) <= 1e-3);
      }
    }
  }

  // Allgather and broadcast through the switch (multicast), reduce-scatter on the ring.
  {
    const std::uint64_t block = 1000;
    std::vector<std::vector<std::uint64_t>> out(n_hosts, std::vector<std::uint64_t>(block * n_hosts));
    std::vector<std::vector<std::uint64_t>> mine(n_hosts, std::vector<std::uint64_t>(block));
    for (std::uint32_t r = 0; r < n_hosts; ++r)
      for (std::uint64_t i = 0; i < block; ++i) mine[r][i] = (std::uint64_t{r} << 40) | i;
    auto res = run_all(n_hosts, [&](std::uint32_t r) {
      return comms[r]->allgather(mine[r].data(), out[r].data(), block, dtype::u64, algorithm::switch_agg);
    });
    for (std::uint32_t r = 0; r < n_hosts; ++r) {
      REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
      for (std::uint32_t q = 0; q < n_hosts; ++q)
        for (std::uint64_t i = 0; i < block; ++i) REQUIRE(out[r][q * block + i] == mine[q][i]);
    }
  }
  for (algorithm a : {algorithm::switch_agg, algorithm::edge_ring}) {
    const std::uint64_t n = 5000;
    std::vector<double> src(n);
    for (std::uint64_t i = 0; i < n; ++i) src[i] = 0.5 * static_cast<double>(i) - 7;
    std::vector<std::vector<double>> out(n_hosts, std::vector<double>(n));
    auto res = run_all(n_hosts, [&](std::uint32_t r) {
      return comms[r]->broadcast(r == 2 ? src.data() : nullptr, out[r].data(), n, dtype::f64, 2, a);
    });
    for (std::uint32_t r = 0; r < n_hosts; ++r) {
      INFO(name(a) << " rank " << r);
      REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
      CHECK(std::memcmp(out[r].data(), src.data(), n * sizeof(double)) == 0);
    }
  }
  {
    const std::uint64_t block = 700;
    std::vector<std::vector<std::uint32_t>> rin(n_hosts, std::vector<std::uint32_t>(block * n_hosts));
    std::vector<std::vector<std::uint32_t>> part(n_hosts, std::vector<std::uint32_t>(block));
    for (std::uint32_t r = 0; r < n_hosts; ++r)
      for (std::uint64_t i = 0; i < block * n_hosts; ++i) rin[r][i] = static_cast<std::uint32_t>(i * 3 + r);
    auto res = run_all(n_hosts, [&](std::uint32_t r) {
      return comms[r]->reduce_scatter(rin[r].data(), part[r].data(), block, dtype::u32, op::max);
    });
    for (std::uint32_t r = 0; r < n_hosts; ++r) {
      REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
      for (std::uint64_t i = 0; i < block; ++i) REQUIRE(part[r][i] == static_cast<std::uint32_t>((r * block + i) * 3 + 2));
    }
  }

  // A user reduction: its package goes to each NIC and to the switch through their sockets.
  {
    auto pkg = rt::read_package_file(SPIN_ARGMAX_PACKAGE);
    REQUIRE_MESSAGE(pkg.ok(), (pkg.ok() ? std::string() : pkg.err().message));
    std::vector<custom_op> ops;
    for (auto& c : comms) {
      auto op = c->add_reduction(reduction{"argmax", pkg.value(), kernels_of<argmax>()});
      REQUIRE_MESSAGE(op.ok(), (op.ok() ? std::string() : op.err().message));
      ops.push_back(op.value());
    }
    const std::uint64_t n = 2000;
    auto input = [](std::uint32_t r, std::uint64_t i) {
      return value_index{static_cast<float>((i * 5 + r * 11) % 13), static_cast<std::uint32_t>(r * 100000 + i)};
    };
    std::vector<std::vector<value_index>> vin(n_hosts, std::vector<value_index>(n)), vout = vin;
    for (std::uint32_t r = 0; r < n_hosts; ++r)
      for (std::uint64_t i = 0; i < n; ++i) vin[r][i] = input(r, i);
    for (algorithm a : {algorithm::switch_agg, algorithm::edge_ring}) {
      auto res = run_all(n_hosts, [&](std::uint32_t r) { return comms[r]->allreduce(vin[r].data(), vout[r].data(), n, ops[r], a); });
      for (std::uint32_t r = 0; r < n_hosts; ++r) {
        INFO(name(a) << " rank " << r);
        REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
        for (std::uint64_t i = 0; i < n; ++i) {
          value_index best = input(0, i);
          for (std::uint32_t q = 1; q < n_hosts; ++q) best = argmax::combine(best, input(q, i));
          REQUIRE(vout[r][i].index == best.index);
        }
      }
    }
  }

  // The engine's counters come back through the shared arena.
  auto k = comms[1]->engine_counters();
  REQUIRE_MESSAGE(k.ok(), (k.ok() ? std::string() : k.err().message));
  CHECK(k->sent[coll::proto::k_up] > 0);

  // The switch process ran the group's aggregation engines (standard and argmax) and every
  // host's traffic crossed it.
  {
    auto swc = net.sw->connect();
    auto st = swc.stats();
    REQUIRE(st.ok());
    const host::nic_stats& s = st->at(0).stats;
    std::uint64_t engines = 0, in = 0, sent = 0;
    for (const auto& e : s.runtime.ecs)
      if (e.name == "coll.7.switch") {
        ++engines;
        in += e.packets_in;
        sent += e.sends;
      }
    CHECK(engines == 2);
    // At least the integer allreduce's packets: 4 per rank up, 4 multicast to each rank.
    CHECK(in >= 4 * n_hosts);
    CHECK(sent >= 4 * n_hosts);
    for (const auto& p : s.ports) CHECK(p.rx_packets > 0);
  }

  // Destroying the communicators frees the group's slots and removes every engine EC.
  comms.clear();
  CHECK(fab.value()->usage()[0].free == 32);
  for (auto& h : net.hosts) {
    auto c = h->connect();
    auto st = c.stats();
    REQUIRE(st.ok());
    CHECK_MESSAGE(st->at(0).stats.runtime.ecs.empty(), host::to_text(st->at(0).stats));
  }
}

TEST_CASE("members whose fabrics are other connections (processes) share the switch's pool and all get the first member's answer") {
  shared_pool_case(links::memif);
}

TEST_CASE("in network namespaces on af_packet veths, members of two processes aggregate on a switch process and share its pool") {
  shared_pool_case(links::af_packet);
}

TEST_CASE("a shared switch runs the standard engine and refuses a native user reduction, which runs on the edge ring on every member") {
  remote_net net;  // switch mode: --native-packages trusted by default
  auto fab = fabric::connect({remote_switch{net.sw->socket, 0, {0, 1, 2}}});
  REQUIRE_MESSAGE(fab.ok(), (fab.ok() ? std::string() : fab.err().message));
  static std::mutex log_m;
  static std::vector<std::string> said;
  said.clear();
  std::vector<std::unique_ptr<communicator>> comms(n_hosts);
  for (std::uint32_t r = 0; r < n_hosts; ++r) {
    options o = remote_options(fab.value().get());
    o.log = [](const std::string& line) {
      std::lock_guard l(log_m);
      said.push_back(line);
    };
    group g;
    g.id = 9;
    g.members = {0, 1, 2};
    g.me = r;
    auto c = communicator::connect(net.hosts[r]->socket, 0, g, o);
    REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message) << "\n" << net.diag());
    comms[r] = std::move(c.value());
  }
  CHECK(said.empty());  // the standard engine is the switch's own: trusted
  const std::uint64_t count = 700;
  std::vector<std::vector<std::uint32_t>> in(n_hosts, std::vector<std::uint32_t>(count)), out = in;
  for (std::uint32_t r = 0; r < n_hosts; ++r)
    for (std::uint64_t i = 0; i < count; ++i) in[r][i] = static_cast<std::uint32_t>(i * 3 + r);
  auto res = run_all(n_hosts, [&](std::uint32_t r) {
    return comms[r]->allreduce(in[r].data(), out[r].data(), count, dtype::u32, op::max, algorithm::switch_agg);
  });
  for (std::uint32_t r = 0; r < n_hosts; ++r) {
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    for (std::uint64_t i = 0; i < count; ++i) REQUIRE(out[r][i] == static_cast<std::uint32_t>(i * 3 + 2));
  }
  // A user reduction's engine is native code of the job: the shared switch refuses it, and every
  // member hears the same reason.
  auto pkg = rt::read_package_file(SPIN_ARGMAX_PACKAGE);
  REQUIRE_MESSAGE(pkg.ok(), (pkg.ok() ? std::string() : pkg.err().message));
  std::vector<custom_op> ops(n_hosts);
  auto added = run_all(n_hosts, [&](std::uint32_t r) -> result<void> {
    auto op = comms[r]->add_reduction(reduction{"argmax", pkg.value(), kernels_of<argmax>()});
    if (!op.ok()) return op.err();
    ops[r] = op.value();
    return {};
  });
  for (std::uint32_t r = 0; r < n_hosts; ++r) REQUIRE_MESSAGE(added[r].ok(), (added[r].ok() ? std::string() : added[r].err().message));
  REQUIRE(said.size() == n_hosts);
  for (const auto& line : said) {
    CHECK(line.find("runs without switch aggregation: installing the aggregation engine on sw: this spin-emu is a shared switch") !=
          std::string::npos);
    CHECK(line == said[0]);
  }
  const std::uint64_t n = 500;
  std::vector<std::vector<value_index>> vin(n_hosts, std::vector<value_index>(n)), vout = vin;
  for (std::uint32_t r = 0; r < n_hosts; ++r)
    for (std::uint64_t i = 0; i < n; ++i) vin[r][i] = value_index{static_cast<float>((i + r * 5) % 7), static_cast<std::uint32_t>(r * 1000 + i)};
  auto via_switch = comms[0]->allreduce(vin[0].data(), vout[0].data(), n, ops[0], algorithm::switch_agg);
  CHECK(via_switch.err().code == errc::not_supported);
  auto ring = run_all(n_hosts, [&](std::uint32_t r) { return comms[r]->allreduce(vin[r].data(), vout[r].data(), n, ops[r]); });
  for (std::uint32_t r = 0; r < n_hosts; ++r) {
    REQUIRE_MESSAGE(ring[r].ok(), (ring[r].ok() ? std::string() : ring[r].err().message));
    for (std::uint64_t i = 0; i < n; ++i) {
      value_index best = vin[0][i];
      for (std::uint32_t q = 1; q < n_hosts; ++q) best = argmax::combine(best, vin[q][i]);
      REQUIRE(vout[r][i].index == best.index);
    }
  }
  CHECK(fab.value()->usage()[0].groups == 1);  // the standard engine's group only
}

/// Members join in-band through their own NICs: the switch sets the group up, answers all alike,
/// and frees the slots of a member NIC that dies.
static void inband_case(links k) {
  // Every spin-emu of the fabric shares a management key (from its environment): the groups have
  // a job secret, so their frame keys travel to the switch wrapped under it, and every data frame
  // carries a tag the switch checks.
  struct mgmt_key_env {
    mgmt_key_env() { ::setenv("SPIN_MGMT_KEY", "0f1e2d3c4b5a69788796a5b4c3d2e1f0", 1); }
    ~mgmt_key_env() { ::unsetenv("SPIN_MGMT_KEY"); }
  } key_env;
  std::array<std::uint8_t, 16> secret{};
  for (std::size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<std::uint8_t>(0x30 + i);
  // Hosts ask the switch for 1 s leases (keep-alives every 250 ms): short for a test, and still
  // four keep-alives long, so that a loaded machine (sanitizer builds) does not lapse a live one.
  remote_net net(k, {}, {"--group-lease-ms", "1000"});
  auto sw = net.sw->connect();
  auto pool = [&] {
    auto u = sw.group_pool(0);
    REQUIRE_MESSAGE(u.ok(), (u.ok() ? std::string() : u.err().message));
    return u.value();
  };
  REQUIRE(pool().free == 256);  // spin-emu's default pool: 256 slots of 4096 bytes
  // One fabric per rank, each through the rank's own NIC: no connection to the switch's spin-emu.
  std::vector<std::unique_ptr<fabric>> fabs;
  for (std::uint32_t r = 0; r < n_hosts; ++r) {
    auto f = fabric::in_band({net.hosts[r]->socket, 0, 65535});
    REQUIRE_MESSAGE(f.ok(), (f.ok() ? std::string() : f.err().message));
    fabs.push_back(std::move(f.value()));
  }
  std::vector<std::string> said;
  auto make = [&](std::uint32_t id, std::uint32_t slots) {
    auto [comms, lines] = connect_group(net, id, [&](std::uint32_t r) { return fabs[r].get(); }, slots, secret);
    said = std::move(lines);
    return std::move(comms);
  };
  {
    // More slots than the switch has: refused at once, in the same words for every member.
    auto comms = make(5, 300);
    REQUIRE(said.size() == n_hosts);
    for (const auto& line : said)
      CHECK(line == "group 5 (standard) runs without switch aggregation: the group asks for 300 slots; sw has 256");
    CHECK(pool().groups == 0);
  }
  {
    auto comms = make(6, 16);
    CHECK(said.empty());
    const auto u = pool();
    CHECK(u.free == 240);
    CHECK(u.groups == 1);
    check_switch_allreduce(comms);
    for (std::uint32_t r = 0; r < n_hosts; ++r) CHECK(comms[r]->stats().switch_slots == 16);
  }
  // Every member left (their leaves went in-band): the switch removed the group.
  for (int i = 0; i < 200 && pool().free != 256; ++i) std::this_thread::sleep_for(10ms);
  CHECK(pool().free == 256);
  CHECK(pool().groups == 0);
  {
    auto comms = make(7, 16);
    CHECK(pool().free == 240);
    // Ranks 0 and 1 leave; rank 2's NIC dies without a word (SIGKILL; its communicator stays):
    // after its lease (1 s) the switch releases its join, the group's last, and frees the
    // slots. (A NIC that stops cleanly sends its leaves: its slots go at once.)
    comms[0].reset();
    comms[1].reset();
    std::this_thread::sleep_for(100ms);
    CHECK(pool().free == 240);  // rank 2 still holds the group
    net.hosts[2]->crash();
    const auto killed = std::chrono::steady_clock::now();
    for (int i = 0; i < 600 && pool().free != 256; ++i) std::this_thread::sleep_for(10ms);
    CHECK(pool().free == 256);
    CHECK(pool().groups == 0);
    // Not before the lease ran out: the last keep-alive left at most 250 ms before the kill.
    CHECK(std::chrono::steady_clock::now() - killed >= 600ms);
    comms[2].reset();  // its NIC is gone: it fails quietly
  }
}

TEST_CASE("members join in-band through their own NICs: the switch sets the group up, answers all alike, and frees the slots of a member NIC that dies") {
  inband_case(links::memif);
}

TEST_CASE("in network namespaces on af_packet veths, members join in-band through their NICs' processes, with no connection to the switch's") {
  inband_case(links::af_packet);
}

TEST_CASE("connecting to a missing spin-emu, a missing node or a switch without links fails with a clear error") {
  group g;
  g.members = {0};
  auto c = communicator::connect("/nonexistent/spin.sock", 0, g);
  REQUIRE_FALSE(c.ok());
  CHECK(c.err().code == errc::not_found);
  CHECK(c.err().message.find("/nonexistent/spin.sock") != std::string::npos);
  auto f = fabric::connect({remote_switch{"/nonexistent/sw.sock", 0, {}}});
  REQUIRE_FALSE(f.ok());
  CHECK(f.err().code == errc::invalid_argument);
  f = fabric::connect({});
  REQUIRE_FALSE(f.ok());
  CHECK(f.err().code == errc::invalid_argument);
  f = fabric::connect({remote_switch{"/nonexistent/sw.sock", 0, {0}}});
  REQUIRE_FALSE(f.ok());
  CHECK(f.err().code == errc::not_found);

  remote_net net;
  c = communicator::connect(net.hosts[0]->socket, 3, g);
  REQUIRE_FALSE(c.ok());
  CHECK(c.err().code == errc::not_found);
  CHECK(c.err().message.find("no node 3") != std::string::npos);
  g.members = {5};
  c = communicator::connect(net.hosts[0]->socket, 0, g);  // the NIC's rank is 0
  REQUIRE_FALSE(c.ok());
  CHECK(c.err().code == errc::invalid_argument);
}

} // TEST_SUITE
