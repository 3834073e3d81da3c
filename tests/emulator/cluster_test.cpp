// Cluster mode: hosts and switches of a topology in one process, joined by net_ring cables that
// run the link model.
#include <doctest/doctest.h>

#include <spin/emu/cluster.hpp>
#include <spin/handler.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <sys/resource.h>

using namespace spin;
using namespace std::chrono_literals;

namespace {

SPIN_COMPLETION_HANDLER(done_ch) {
  ctx->post_event(ctx->msg.message_id);
  return ret::success;
}

struct driver {
  std::atomic<bool> stop{false};
  std::thread th;
  explicit driver(emu::cluster& c) {
    th = std::thread([this, &c] { c.run(stop); });
  }
  ~driver() {
    stop = true;
    th.join();
  }
};

std::vector<std::byte> bytes_of(std::uint32_t from, std::uint32_t to, std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((from * 37 + to * 11 + i * 7 + (i >> 9)) & 0xff);
  return v;
}

// All-to-all: every host sends `len` bytes to every other host, which deposits them in the slot
// of the sender in its window. Returns the events each host saw.
struct all_to_all {
  std::uint32_t n;
  std::size_t len;
  std::vector<std::vector<std::byte>> src, dst;
  std::vector<rt::region_id> src_region;
  std::vector<rt::ec_id> ecs;

  all_to_all(emu::cluster& c, std::uint32_t hosts, std::size_t bytes) : n(hosts), len(bytes), src(hosts), dst(hosts), ecs(hosts) {
    for (std::uint32_t h = 0; h < n; ++h) {
      emu::nic& nic = *c.host(h);
      src[h].resize(len * n);
      for (std::uint32_t to = 0; to < n; ++to) {
        auto b = bytes_of(h, to, len);
        std::copy(b.begin(), b.end(), src[h].begin() + static_cast<std::ptrdiff_t>(to * len));
      }
      dst[h].assign(len * n, std::byte{0});
      auto rs = nic.register_host_memory(src[h]);
      REQUIRE(rs.ok());
      src_region.push_back(*rs);
      // One EC per sender so that each deposits into its own slot of the window.
      for (std::uint32_t from = 0; from < n; ++from) {
        if (from == h) continue;
        auto rd = nic.register_host_memory(std::span<std::byte>(dst[h]).subspan(from * len, len));
        REQUIRE(rd.ok());
        rt::ec_config ec;
        ec.name = "from" + std::to_string(from);
        ec.match = {0x1000 + from, 0};
        ec.handlers = rt::handler_set(nullptr, nullptr, done_ch);
        ec.window = rt::host_window{*rd, 0, len};
        REQUIRE(nic.install(ec).ok());
      }
    }
  }

  void send(emu::cluster& c) {
    for (std::uint32_t h = 0; h < n; ++h)
      for (std::uint32_t to = 0; to < n; ++to)
        if (to != h) {
          auto r = c.host(h)->send(emu::message_send{to, 0x1000 + h, 1, src_region[h], to * len, len}, 5000ms);
          REQUIRE_MESSAGE(r.ok(), r.err().message);
        }
  }

  bool check() const {
    bool ok = true;
    for (std::uint32_t h = 0; h < n; ++h)
      for (std::uint32_t from = 0; from < n; ++from) {
        if (from == h) continue;
        auto want = bytes_of(from, h, len);
        ok &= std::equal(want.begin(), want.end(), dst[h].begin() + static_cast<std::ptrdiff_t>(from * len));
      }
    return ok;
  }
};

}  // namespace

// Host messages in packets of 1 KiB, as the packet counts below assume (the cluster's default
// is 4 KiB).
static emu::cluster_options kib_packets() {
  emu::cluster_options o;
  o.payload_bytes = 1024;
  return o;
}

TEST_SUITE("emulator") {

TEST_CASE("a star of four hosts and a switch delivers all-to-all messages exactly, and the link counters show each path") {
  emu::link_model m;
  m.rate_gbps = 0;
  auto c = emu::cluster::create(emu::star(4, m), kib_packets());
  REQUIRE_MESSAGE(c.ok(), c.err().message);
  emu::cluster& cl = **c;
  const std::size_t len = 10000;  // 10 packets of 1024 bytes
  all_to_all a(cl, 4, len);
  {
    driver d(cl);
    a.send(cl);
  }
  REQUIRE(cl.quiesce(3000ms));
  CHECK(a.check());
  const auto s = cl.stats();
  REQUIRE(s.links.size() == 8);
  for (std::uint32_t h = 0; h < 4; ++h) {
    // Link h joins host h and the switch: a->b is the host's uplink.
    const auto& up = s.links[2 * h];
    const auto& down = s.links[2 * h + 1];
    CHECK(up.from == "h" + std::to_string(h));
    CHECK(up.to == "s0");
    CHECK(up.stats.packets_in == 30);  // 3 messages x 10 packets
    CHECK(up.stats.packets_delivered == 30);
    CHECK(down.stats.packets_delivered == 30);
    CHECK(up.stats.dropped_loss == 0);
  }
  // The switch forwarded every packet once.
  const auto& sw = s.nodes[4];
  std::uint64_t fwd = 0;
  for (const auto& p : sw.ports) fwd += p.forwarded;
  CHECK(fwd == 120);
}

TEST_CASE("in a ring of hosts, packets for a host two hops away are forwarded by the host between") {
  auto c = emu::cluster::create(emu::ring(4, emu::link_model{}), kib_packets());
  REQUIRE_MESSAGE(c.ok(), c.err().message);
  emu::cluster& cl = **c;
  all_to_all a(cl, 4, 3000);
  {
    driver d(cl);
    a.send(cl);
  }
  REQUIRE(cl.quiesce(3000ms));
  CHECK(a.check());
  const auto s = cl.stats();
  std::uint64_t fwd = 0;
  for (const auto& n : s.nodes)
    for (const auto& p : n.ports) fwd += p.forwarded;
  // Pairs (0,2), (2,0), (1,3), (3,1) are two hops apart: 4 messages x 3 packets, one transit each.
  CHECK(fwd == 12);
}

TEST_CASE("with loss, duplication and reordering, a run with the same seed is reproducible") {
  const std::string toml = R"(
[defaults]
latency_ns = 2000
loss = 0.05
duplicate = 0.05
reorder = 0.1
seed = 42
[[host]]
name = "a"
[[host]]
name = "b"
[[switch]]
name = "sw"
[[link]]
a = "a"
b = "sw"
[[link]]
a = "b"
b = "sw"
)";
  auto t = emu::parse_topology(toml, "test.toml");
  REQUIRE_MESSAGE(t.ok(), t.err().message);
  auto run = [&]() {
    auto c = emu::cluster::create(*t, kib_packets());
    REQUIRE_MESSAGE(c.ok(), c.err().message);
    emu::cluster& cl = **c;
    std::vector<std::byte> src(200 * 1024), dst(200 * 1024);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 13);
    auto rs = cl.host(0)->register_host_memory(src);
    auto rd = cl.host(1)->register_host_memory(dst);
    REQUIRE(rs.ok());
    REQUIRE(rd.ok());
    rt::ec_config ec;
    ec.name = "sink";
    ec.match = {7, 0};
    ec.window = rt::host_window{*rd, 0, dst.size()};
    REQUIRE(cl.host(1)->install(ec).ok());
    {
      driver d(cl);
      // Message by message, so that the link's queue never overflows and only the seed decides.
      for (std::uint64_t m = 0; m < 20; ++m) {
        REQUIRE(cl.host(0)->send(emu::message_send{1, 7, m, *rs, m * 10240, 10240}, 5000ms).ok());
        std::this_thread::sleep_for(2ms);
      }
    }
    REQUIRE(cl.quiesce(3000ms));
    return cl.stats();
  };
  const auto s1 = run();
  const auto s2 = run();
  for (std::size_t l = 0; l < s1.links.size(); ++l) {
    CHECK(s1.links[l].stats.dropped_loss == s2.links[l].stats.dropped_loss);
    CHECK(s1.links[l].stats.duplicated == s2.links[l].stats.duplicated);
    CHECK(s1.links[l].stats.reordered == s2.links[l].stats.reordered);
    CHECK(s1.links[l].stats.packets_delivered == s2.links[l].stats.packets_delivered);
  }
  // The model did act: 200 packets cross two lossy links.
  const auto& up = s1.links[0].stats;
  CHECK(up.packets_in == 200);
  CHECK(up.dropped_loss > 0);
  CHECK(up.duplicated > 0);
  CHECK(up.reordered > 0);
  // b's runtime saw each surviving packet, duplicates counted as such.
  const auto& ec1 = s1.nodes[1].runtime.ecs.at(0);
  const auto& ec2 = s2.nodes[1].runtime.ecs.at(0);
  CHECK(ec1.packets_in == ec2.packets_in);
  CHECK(ec1.drops == ec2.drops);
  CHECK(ec1.drops[static_cast<std::size_t>(rt::drop_reason::duplicate)] > 0);
}

TEST_CASE("a topology whose host rank collides with a switch's address is refused with a message") {
  emu::topology t = emu::star(2, emu::link_model{});
  t.nodes[1].rank = emu::max_rank;
  auto c = emu::cluster::create(t, kib_packets());
  REQUIRE_FALSE(c.ok());
  CHECK(c.err().code == errc::invalid_argument);
  CHECK(c.err().message.find("rank 65535") != std::string::npos);
}

TEST_CASE("an idle cluster on two lcores uses almost no CPU over a second and wakes at once when work arrives") {
  emu::cluster_options o = kib_packets();
  o.lcores = 2;
  auto c = emu::cluster::create(emu::star(4, emu::link_model{}), o);
  REQUIRE_MESSAGE(c.ok(), c.err().message);
  emu::cluster& cl = **c;
  REQUIRE(cl.lcores() == 2);
  std::vector<std::byte> src = bytes_of(0, 1, 4000), dst(4000);
  auto rs = cl.host(0)->register_host_memory(src);
  auto rd = cl.host(1)->register_host_memory(dst);
  REQUIRE(rs.ok());
  REQUIRE(rd.ok());
  rt::ec_config ec;
  ec.name = "land";
  ec.match = {0x77, 0};
  ec.handlers = rt::handler_set(nullptr, nullptr, done_ch);  // deposits, then an event
  ec.window = rt::host_window{*rd, 0, dst.size()};
  auto e = cl.host(1)->install(ec);
  REQUIRE(e.ok());
  auto cpu_seconds = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  {
    driver d(cl);
    std::this_thread::sleep_for(300ms);  // the lcores and the NICs' watchdogs settle into their sleep
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(1s);
    const double used = cpu_seconds() - c0;
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("idle cluster of 5 nodes on 2 lcores: " << used * 1e3 << " ms of CPU in " << wall * 1e3 << " ms");
    CHECK(used < 0.1 * wall);  // spinning lcores would use two cores' worth
    // Work wakes the sleeping lcores: the host message lands well within the longest sleep of
    // an idle lcore plus its path through two links and the switch.
    const auto s0 = std::chrono::steady_clock::now();
    REQUIRE(cl.host(0)->send(emu::message_send{1, 0x77, 1, *rs, 0, src.size()}, 5000ms).ok());
    rt::host_event ev[1];
    const std::size_t got = cl.host(1)->wait_events(*e, ev, 5s);  // the NIC wakes this thread
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
    REQUIRE(got == 1);
    MESSAGE("a 4000-byte message from h0 to h1 on the idle cluster landed after " << ms << " ms");
    CHECK(dst == src);
    CHECK(ms < 200);
  }
}

}  // TEST_SUITE
