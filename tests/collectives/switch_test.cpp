// Core-INC: switch aggregation's traffic per host, groups that share a switch's slots, the slot
// policy, recovery, and user reductions on the switch.
#include "coll_world.hpp"
#include "handlers/argmax.hpp"

#include <spin/coll/kernels.hpp>
#include <spin/coll/protocol.hpp>
#include <spin/rt/package.hpp>
#include <spin/rt/wire.hpp>


#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>

using namespace spin;
using namespace spin::coll;
using spin::coll::test::world;

namespace {

// Frame bytes each host sent to and received from the switch, from the link counters.
struct host_traffic {
  std::vector<std::uint64_t> up, down;
};
host_traffic traffic(emu::cluster& c, std::uint32_t hosts) {
  host_traffic t{std::vector<std::uint64_t>(hosts), std::vector<std::uint64_t>(hosts)};
  for (const auto& l : c.stats().links)
    for (std::uint32_t h = 0; h < hosts; ++h) {
      if (l.from == "h" + std::to_string(h) && l.to == "s0") t.up[h] += l.stats.bytes_delivered;
      if (l.from == "s0" && l.to == "h" + std::to_string(h)) t.down[h] += l.stats.bytes_delivered;
    }
  return t;
}

std::vector<std::string>* log_lines = nullptr;
std::mutex log_mutex;
void capture_log(const std::string& line) {
  std::lock_guard<std::mutex> l(log_mutex);
  if (log_lines != nullptr) log_lines->push_back(line);
}

} // namespace

TEST_SUITE("collectives") {

TEST_CASE("switch allreduce sends S bytes up and receives S down per host; the ring sends 2(N-1)/N x S") {
  const std::uint32_t n = 4;
  const std::uint64_t count = 1 << 18;  // S = 1 MiB of float32
  const double s_bytes = count * 4.0;
  options o;
  // No loss: a slow machine must not add repair traffic (a fixed interval of 1 s).
  o.repair_max_interval = o.repair_interval = o.repair_min_interval = std::chrono::seconds(1);
  world w(emu::star(n, {}), o, 1, test::switches::fabric);
  std::vector<std::vector<float>> in(n, std::vector<float>(count, 1.0f)), out(n, std::vector<float>(count));
  // Per packet: 1024 payload bytes and 104 bytes of Ethernet, IPv4, UDP and spin headers.
  const double per_packet = 1.0 + 104.0 / 1024.0;
  for (algorithm a : {algorithm::switch_agg, algorithm::edge_ring}) {
    const host_traffic before = traffic(*w.cluster, n);
    auto res = w.run([&](std::uint32_t r) { return w.comms[r]->allreduce(std::span<const float>(in[r]), std::span<float>(out[r]), op::sum, a); });
    const host_traffic after = traffic(*w.cluster, n);
    const double want = a == algorithm::switch_agg ? 1.0 : 2.0 * (n - 1) / n;
    for (std::uint32_t r = 0; r < n; ++r) {
      INFO(std::string(name(a)) << " rank " << r);
      REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
      CHECK(out[r][count - 1] == 4.0f);
      const double up = static_cast<double>(after.up[r] - before.up[r]) / s_bytes;
      const double down = static_cast<double>(after.down[r] - before.down[r]) / s_bytes;
      MESSAGE(std::string(name(a)) << " rank " << r << ": up " << up << " x S, down " << down << " x S (payload alone: " << want << " x S)");
      // Payload plus headers, plus a little control traffic (hellos, acknowledgements).
      CHECK(up >= want);
      CHECK(up <= want * per_packet + 0.01);
      CHECK(down >= want);
      CHECK(down <= want * per_packet + 0.01);
    }
  }
}

TEST_CASE("with a job secret, frames without the group's tag are dropped as unauthenticated on switch and NIC, and the group stays exact") {
  const std::uint32_t n = 3;
  options o;
  for (std::size_t i = 0; i < 16; ++i) o.job_secret[i] = static_cast<std::uint8_t>(i + 1);
  world w(emu::star(n, {}), o, 1, test::switches::fabric);
  const std::uint64_t count = 3000;
  std::vector<std::vector<std::int32_t>> in(n, std::vector<std::int32_t>(count)), out(n, std::vector<std::int32_t>(count));
  for (std::uint32_t r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < count; ++i) in[r][i] = static_cast<std::int32_t>(i * (r + 1));
  auto check = [&](const char* when) {
    std::vector<std::uint64_t> through(n);
    for (std::uint32_t r = 0; r < n; ++r) through[r] = w.comms[r]->stats().switch_collectives;
    auto res = w.run([&](std::uint32_t r) {
      return w.comms[r]->allreduce(std::span<const std::int32_t>(in[r]), std::span<std::int32_t>(out[r]), op::sum, algorithm::switch_agg);
    });
    for (std::uint32_t r = 0; r < n; ++r) {
      INFO(when << ", rank " << r);
      REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
      CHECK(w.comms[r]->stats().switch_collectives == through[r] + 1);
      for (std::uint64_t i = 0; i < count; i += 97) REQUIRE(out[r][i] == static_cast<std::int32_t>(i * 6));
    }
  };
  check("before");
  // Frames as a stranger on the network makes them: a member's source rank, the group's match
  // bits and collective extension, no tag or a tag under another key.
  emu::nic& sw = w.cluster->node(n);
  emu::nic& h0 = *w.cluster->host(0);
  namespace proto = spin::coll::proto;
  auto frame = [&](std::uint32_t from, std::uint32_t to, std::uint32_t kind, bool tagged) {
    rt::wire::header h;
    h.flags = rt::wire::flag_start | rt::wire::flag_end | rt::wire::flag_coll;
    h.source_rank = from;
    h.match_bits = proto::match_bits(1u << 4, kind);
    h.message_id = 777000 + kind;
    h.coll = {static_cast<std::uint8_t>(op::sum), static_cast<std::uint8_t>(dtype::i32), 0, 256, 1, 0};
    std::vector<std::byte> payload(1024, std::byte{0x7f});
    h.message_len = payload.size();
    if (tagged) {
      h.flags |= rt::wire::flag_auth;
      rt::wire::auth_key other;
      other.k0 = 0x1234;
      other.k1 = 0x5678;
      h.auth_tag = rt::wire::auth_tag(other, h, payload);
    }
    std::vector<std::byte> f(rt::wire::encoded_len(h, payload.size()));
    REQUIRE(rt::wire::encode(rt::wire::rank_endpoint(from), rt::wire::rank_endpoint(to), h, payload, f) == f.size());
    return f;
  };
  auto unauthenticated = [](const emu::nic& nic, const char* ec_suffix) {
    std::uint64_t k = 0;
    for (const auto& e : nic.runtime_stats().ecs)
      if (e.name.ends_with(ec_suffix)) k += e.drops[static_cast<std::size_t>(rt::drop_reason::unauthenticated)];
    return k;
  };
  for (bool tagged : {false, true}) {
    REQUIRE(sw.inject(frame(2, sw.rank(), proto::k_up, tagged)) == errc::ok);
    REQUIRE(h0.inject(frame(sw.rank(), 0, proto::k_down, tagged)) == errc::ok);
  }
  bool counted = false;
  for (int i = 0; i < 500 && !counted; ++i) {
    counted = unauthenticated(sw, ".switch") == 2 && unauthenticated(h0, ".rank0") == 2;
    if (!counted) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(unauthenticated(sw, ".switch") == 2);
  CHECK(unauthenticated(h0, ".rank0") == 2);
  check("after the forged frames");
  // The members' own frames all verified.
  for (std::uint32_t r = 1; r < n; ++r) CHECK(unauthenticated(*w.cluster->host(r), (".rank" + std::to_string(r)).c_str()) == 0);
  CHECK(unauthenticated(sw, ".switch") == 2);
}

TEST_CASE("with authenticate_frames off, a group with a job secret sends untagged frames and its engines take untagged ones") {
  options o;
  for (std::size_t i = 0; i < 16; ++i) o.job_secret[i] = static_cast<std::uint8_t>(i + 1);
  o.authenticate_frames = false;
  world w(emu::star(2, {}), o, 1, test::switches::fabric);
  std::vector<std::vector<std::int32_t>> in(2, std::vector<std::int32_t>(5000, 3)), out(2, std::vector<std::int32_t>(5000));
  auto res = w.run([&](std::uint32_t r) {
    return w.comms[r]->allreduce(std::span<const std::int32_t>(in[r]), std::span<std::int32_t>(out[r]), op::sum, algorithm::switch_agg);
  });
  for (std::uint32_t r = 0; r < 2; ++r) {
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    CHECK(w.comms[r]->stats().switch_collectives == 1);
    CHECK(out[r][4999] == 6);
  }
  // No EC has a key: nothing is dropped as unauthenticated, and the switch's engine takes an
  // untagged frame in (it ignores it itself: an old epoch).
  for (std::uint32_t node = 0; node < 3; ++node)
    for (const auto& e : w.cluster->node(node).runtime_stats().ecs) {
      CHECK(e.drops[static_cast<std::size_t>(rt::drop_reason::unauthenticated)] == 0);
      CHECK(e.packets_in > 0);
    }
  emu::nic& sw = w.cluster->node(2);
  auto switch_in = [&] {
    std::uint64_t k = 0;
    for (const auto& e : sw.runtime_stats().ecs)
      if (e.name.ends_with(".switch")) k += e.packets_in;
    return k;
  };
  const std::uint64_t before = switch_in();
  rt::wire::header h;
  h.flags = rt::wire::flag_start | rt::wire::flag_end | rt::wire::flag_coll;
  h.source_rank = 1;
  h.match_bits = spin::coll::proto::match_bits(1u << 4, spin::coll::proto::k_up);
  h.message_id = 999;
  h.coll = {static_cast<std::uint8_t>(op::sum), static_cast<std::uint8_t>(dtype::i32), 0, 16, 1, 0};
  std::vector<std::byte> payload(64);
  h.message_len = payload.size();
  std::vector<std::byte> f(rt::wire::encoded_len(h, payload.size()));
  REQUIRE(rt::wire::encode(rt::wire::rank_endpoint(1), rt::wire::rank_endpoint(sw.rank()), h, payload, f) == f.size());
  REQUIRE(sw.inject(f) == errc::ok);
  for (int i = 0; i < 500 && switch_in() == before; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(switch_in() == before + 1);
}

TEST_CASE("a switch epoch that stalls without loss sends nothing twice: its repair tick asks the switch first") {
  // Links of 5 ms (a round trip through the switch takes 20 ms) and a fixed repair interval of
  // 1 ms: most ticks find no progress, though nothing is lost. Each tick once sent the rank's
  // whole window of contributions again; on 2 cores with 16 ranks such stalls (a descheduled
  // lcore) cost 15 to 20 % of a call. Now a tick sends a probe, and the switch's answer, which
  // comes after the results, says that nothing is missing. The second call is the one
  // checked: a communicator's first waits for its verdict (docs/collectives.md), and its
  // hellos, 10 ms in flight against 1 ms ticks, are asked for again.
  const std::uint32_t n = 4;
  emu::link_model slow;
  slow.latency = std::chrono::milliseconds(5);
  options o;
  o.repair_max_interval = o.repair_interval = o.repair_min_interval = std::chrono::milliseconds(1);
  o.packet_bytes = 4096;
  world w(emu::star(n, slow), o, 1, test::switches::fabric);
  const std::uint64_t count = 64 * 1024;  // 256 KiB of int32: 64 packets of 4 KiB per rank
  const std::uint64_t packets = count * 4 / o.packet_bytes;
  std::vector<std::vector<std::int32_t>> in(n, std::vector<std::int32_t>(count)), out(n, std::vector<std::int32_t>(count));
  for (std::uint32_t r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < count; ++i) in[r][i] = static_cast<std::int32_t>(i * 7 + r);
  auto call = [&](std::uint32_t r) {
    return w.comms[r]->allreduce(std::span<const std::int32_t>(in[r]), std::span<std::int32_t>(out[r]), op::sum, algorithm::switch_agg);
  };
  for (const auto& x : w.run(call)) REQUIRE_MESSAGE(x.ok(), (x.ok() ? std::string() : x.err().message));
  std::vector<proto::engine_counters> k0(n);
  std::vector<comm_stats> st0(n);
  for (std::uint32_t r = 0; r < n; ++r) {
    auto k = w.comms[r]->engine_counters();
    REQUIRE_MESSAGE(k.ok(), (k.ok() ? std::string() : k.err().message));
    k0[r] = k.value();
    st0[r] = w.comms[r]->stats();
  }
  auto res = w.run(call);
  std::uint64_t probes = 0;
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    bool exact = true;
    for (std::uint64_t i = 0; i < count; ++i) exact &= out[r][i] == static_cast<std::int32_t>(i * 28 + 6);
    CHECK(exact);
    auto k = w.comms[r]->engine_counters();
    REQUIRE_MESSAGE(k.ok(), (k.ok() ? std::string() : k.err().message));
    const auto st = w.comms[r]->stats();
    const std::uint64_t ups = k->sent[proto::k_up] - k0[r].sent[proto::k_up];
    MESSAGE("rank " << r << ", second call: " << st.repair_ticks - st0[r].repair_ticks << " ticks, "
                    << k->sent[proto::k_probe] - k0[r].sent[proto::k_probe] << " probes, " << ups << " contributions for "
                    << packets << " packets");
    probes += k->sent[proto::k_probe] - k0[r].sent[proto::k_probe];
    CHECK(ups == packets);
    CHECK(st.repaired_epochs == st0[r].repaired_epochs);
  }
  // The epochs did stall (a rank whose thread woke late may have found progress at every tick
  // it sent: under AddressSanitizer one rank sent 4 ticks and no probe).
  CHECK(probes > 0);
  std::uint64_t lost = 0;
  for (const auto& l : w.cluster->stats().links) lost += l.stats.dropped_loss;
  CHECK(lost == 0);
}

TEST_CASE("groups share a switch's slots first come, first served; a group without slots runs on the edge ring and says why") {
  std::vector<std::string> lines;
  log_lines = &lines;
  fabric_options fo;
  fo.slots_per_switch = 100;
  world w(emu::star(4, {}), fo);
  auto make = [&](std::uint32_t id, std::vector<std::uint32_t> members, std::uint32_t slots) {
    std::vector<std::unique_ptr<communicator>> out;
    options o;
    o.switches = w.fab.get();
    o.switch_slots = slots;
    o.log = capture_log;
    group g;
    g.id = id;
    g.members = members;
    for (std::uint32_t i = 0; i < members.size(); ++i) {
      g.me = i;
      auto cm = communicator::create(*w.cluster->host(members[i]), g, o);
      REQUIRE_MESSAGE(cm.ok(), (cm.ok() ? std::string() : cm.err().message));
      out.push_back(std::move(cm.value()));
    }
    return out;
  };
  auto a = make(1, {0, 1, 2, 3}, 64);
  auto b = make(2, {0, 1}, 64);  // 36 left: refused
  auto cgroup = make(3, {2, 3}, 32);
  {
    const auto u = w.fab->usage();
    REQUIRE(u.size() == 1);
    CHECK(u[0].free == 4);
    CHECK(u[0].groups == 2);
  }
  REQUIRE(lines.size() == 2);  // one line per member of b
  CHECK(lines[0].find("36 free slots of 100") != std::string::npos);

  // a and c run at once on the switch, each with its own data; b falls back to the edge ring.
  const std::uint64_t count = 30011;
  auto values = [](std::uint32_t group, std::uint32_t rank, std::uint64_t i) {
    return static_cast<std::int64_t>(group * 1000003 + rank * 7919 + i);
  };
  struct job {
    std::uint32_t id;
    std::vector<std::unique_ptr<communicator>>* comms;
    std::vector<std::vector<std::int64_t>> in, out;
  };
  std::vector<job> jobs = {{1, &a, {}, {}}, {3, &cgroup, {}, {}}, {2, &b, {}, {}}};
  for (auto& j : jobs) {
    const auto m = static_cast<std::uint32_t>(j.comms->size());
    j.in.assign(m, std::vector<std::int64_t>(count));
    j.out.assign(m, std::vector<std::int64_t>(count));
    for (std::uint32_t r = 0; r < m; ++r)
      for (std::uint64_t i = 0; i < count; ++i) j.in[r][i] = values(j.id, r, i);
  }
  std::vector<std::thread> threads;
  std::vector<std::string> errors;
  std::mutex em;
  for (auto& j : jobs)
    for (std::uint32_t r = 0; r < j.comms->size(); ++r)
      threads.emplace_back([&, r, jp = &j] {
        auto res = (*jp->comms)[r]->allreduce(std::span<const std::int64_t>(jp->in[r]), std::span<std::int64_t>(jp->out[r]), op::sum);
        if (!res.ok()) {
          std::lock_guard<std::mutex> l(em);
          errors.push_back(res.err().message);
        }
      });
  for (auto& t : threads) t.join();
  REQUIRE_MESSAGE(errors.empty(), (errors.empty() ? "" : errors[0]));
  for (auto& j : jobs) {
    const auto m = static_cast<std::uint32_t>(j.comms->size());
    for (std::uint32_t r = 0; r < m; ++r)
      for (std::uint64_t i = 0; i < count; ++i) {
        std::int64_t want = 0;
        for (std::uint32_t q = 0; q < m; ++q) want += values(j.id, q, i);
        REQUIRE(j.out[r][i] == want);
      }
  }
  // Asking b for the switch says why it cannot.
  std::vector<std::int64_t> x(4), y(4);
  auto refused = b[0]->allreduce(x.data(), y.data(), 4, dtype::i64, op::sum, algorithm::switch_agg);
  CHECK(refused.err().code == errc::not_supported);
  CHECK(refused.err().message.find("free slots") != std::string::npos);
  // Slots come back when a group ends.
  a.clear();
  CHECK(w.fab->usage()[0].free == 68);
  b.clear();
  cgroup.clear();
  CHECK(w.fab->usage()[0].free == 100);
  log_lines = nullptr;
}

TEST_CASE("switch_wait gives every member of a group one answer: a member that joins while the first waits for slots gets them too") {
  fabric_options fo;
  fo.slots_per_switch = 100;
  world w(emu::star(4, {}), fo);
  auto make = [&](std::uint32_t id, std::vector<std::uint32_t> members, std::uint32_t me, std::chrono::milliseconds wait) {
    options o;
    o.switches = w.fab.get();
    o.switch_slots = 64;
    o.switch_wait = wait;
    o.log = capture_log;
    group g;
    g.id = id;
    g.members = std::move(members);
    g.me = me;
    return communicator::create(*w.cluster->host(g.members[me]), g, o);
  };
  // Group 1 holds 64 of the 100 slots; group 2 asks for 64 and may wait 20 s for them.
  std::vector<std::unique_ptr<communicator>> first;
  for (std::uint32_t r = 0; r < 2; ++r) {
    auto cm = make(1, {0, 1}, r, std::chrono::milliseconds(0));
    REQUIRE_MESSAGE(cm.ok(), (cm.ok() ? std::string() : cm.err().message));
    first.push_back(std::move(cm.value()));
  }
  REQUIRE(w.fab->usage()[0].free == 36);
  // Both members of group 2 join while the slots are taken: the first waits for them, the second
  // joins during that wait. Then group 1 ends and frees its slots.
  std::vector<result<std::unique_ptr<communicator>>> second;
  second.emplace_back(fail(errc::bad_state, "not created"));
  second.emplace_back(fail(errc::bad_state, "not created"));
  std::thread t0([&] { second[0] = make(2, {2, 3}, 0, std::chrono::seconds(20)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::thread t1([&] { second[1] = make(2, {2, 3}, 1, std::chrono::seconds(20)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  first.clear();
  t0.join();
  t1.join();
  REQUIRE_MESSAGE(second[0].ok(), (second[0].ok() ? std::string() : second[0].err().message));
  REQUIRE_MESSAGE(second[1].ok(), (second[1].ok() ? std::string() : second[1].err().message));
  CHECK(w.fab->usage()[0].free == 36);
  // Both members hold the slots: the switch aggregates their allreduce (not_supported otherwise).
  std::vector<std::vector<std::int32_t>> in = {std::vector<std::int32_t>(5000, 3), std::vector<std::int32_t>(5000, 4)};
  std::vector<std::vector<std::int32_t>> out(2, std::vector<std::int32_t>(5000));
  std::vector<result<void>> res(2);
  std::thread a([&] { res[0] = second[0].value()->allreduce(in[0].data(), out[0].data(), 5000, dtype::i32, op::sum, algorithm::switch_agg); });
  std::thread b([&] { res[1] = second[1].value()->allreduce(in[1].data(), out[1].data(), 5000, dtype::i32, op::sum, algorithm::switch_agg); });
  a.join();
  b.join();
  for (std::uint32_t r = 0; r < 2; ++r) {
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    CHECK(out[r] == std::vector<std::int32_t>(5000, 7));
  }
}

TEST_CASE("in a leaf-spine network leaves combine integer and min/max reductions; float sums go to the spine for the ring's bits") {
  emu::cluster_options co;
  auto no_switch = emu::cluster::create(emu::ring(3, {}), co);
  REQUIRE(no_switch.ok());
  CHECK(fabric::create(*no_switch.value()).err().code == errc::not_found);  // no switch at all
  no_switch.value().reset();

  // Leaves l0 (h0, h1) and l1 (h2, h3) under spine sp.
  const emu::topology t = test::leaf_spine({2, 2});
  options o;
  o.repair_max_interval = o.repair_interval = o.repair_min_interval = std::chrono::seconds(1);  // no loss: the bytes are measured
  world w(t, o, 1, test::switches::fabric);
  const auto u = w.fab->usage();
  REQUIRE(u.size() == 3);
  CHECK(u[2].name == "sp");
  for (const auto& x : u) CHECK(x.groups == 1);  // slots on the spine and on both leaves
  const std::uint64_t count = 1 << 16;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> dist(0.0f, 10.0f);
  std::vector<std::vector<float>> in(4, std::vector<float>(count)), sw(4, std::vector<float>(count)), ring(4, std::vector<float>(count));
  for (auto& v : in)
    for (auto& x : v) x = dist(rng);
  auto leaf_up = [&] {
    for (const auto& l : w.cluster->stats().links)
      if (l.from == "l0" && l.to == "sp") return l.stats.bytes_delivered;
    return std::uint64_t{0};
  };
  const std::uint64_t before = leaf_up();
  auto res = w.run([&](std::uint32_t r) { return w.comms[r]->allreduce(std::span<const float>(in[r]), std::span<float>(sw[r]), op::sum); });
  const std::uint64_t leaf_bytes = leaf_up() - before;
  for (auto& x : res) REQUIRE(x.ok());
  res = w.run([&](std::uint32_t r) { return w.comms[r]->allreduce(std::span<const float>(in[r]), std::span<float>(ring[r]), op::sum, algorithm::edge_ring); });
  for (std::uint32_t r = 0; r < 4; ++r) {
    REQUIRE(res[r].ok());
    REQUIRE(std::memcmp(sw[r].data(), ring[0].data(), count * 4) == 0);
  }
  // Float sums are not combined at the leaf (the order would change): both members' S cross it.
  const double s_bytes = count * 4.0;
  MESSAGE("float sum, leaf l0 -> spine: " << leaf_bytes / s_bytes << " x S");
  CHECK(leaf_bytes >= 2 * s_bytes);
  CHECK(leaf_bytes <= 2 * s_bytes * (1.0 + 104.0 / 1024.0) + 0.02 * s_bytes);
  // Integer sums are: one combined S leaves each leaf.
  std::vector<std::vector<std::int32_t>> iin(4, std::vector<std::int32_t>(count)), iout(4, std::vector<std::int32_t>(count));
  for (std::uint32_t r = 0; r < 4; ++r)
    for (std::uint64_t i = 0; i < count; ++i) iin[r][i] = static_cast<std::int32_t>(i * 31 + r * 1000003);
  const std::uint64_t before_int = leaf_up();
  res = w.run([&](std::uint32_t r) { return w.comms[r]->allreduce(std::span<const std::int32_t>(iin[r]), std::span<std::int32_t>(iout[r]), op::sum); });
  const std::uint64_t leaf_int = leaf_up() - before_int;
  for (std::uint32_t r = 0; r < 4; ++r) {
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    for (std::uint64_t i = 0; i < count; ++i) {
      std::int64_t want = 0;
      for (std::uint32_t q = 0; q < 4; ++q) want += iin[q][i];
      REQUIRE(iout[r][i] == static_cast<std::int32_t>(want));
    }
  }
  MESSAGE("int32 sum, leaf l0 -> spine: " << leaf_int / s_bytes << " x S");
  CHECK(leaf_int >= s_bytes);
  CHECK(leaf_int <= s_bytes * (1.0 + 104.0 / 1024.0) + 0.02 * s_bytes);
}

TEST_CASE("two-level aggregation stays exact under loss, duplication and reordering") {
  const emu::link_model m = test::lossy(0.01, 17, 0.03);
  const emu::topology t = test::leaf_spine({3, 2}, m);  // three hosts on l0, two on l1
  options o;
  o.repair_interval = std::chrono::microseconds(1000);
  o.repair_max_interval = o.repair_interval;
  o.switch_slots = 8;
  world w(t, o, 1, test::switches::fabric);
  const std::uint64_t count = 20011;
  for (op op_ : {op::sum, op::max, op::prod}) {
    std::vector<std::vector<std::int64_t>> in(5, std::vector<std::int64_t>(count)), out(5, std::vector<std::int64_t>(count));
    for (std::uint32_t r = 0; r < 5; ++r)
      for (std::uint64_t i = 0; i < count; ++i) in[r][i] = static_cast<std::int64_t>((i * 7 + r * 13) % 11) - 5;
    auto res = w.run([&](std::uint32_t r) {
      return w.comms[r]->allreduce(std::span<const std::int64_t>(in[r]), std::span<std::int64_t>(out[r]), op_, algorithm::switch_agg);
    });
    for (std::uint32_t r = 0; r < 5; ++r) {
      INFO(std::string(name(op_)) << " rank " << r);
      REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
      for (std::uint64_t i = 0; i < count; ++i) {
        std::int64_t want = in[0][i];
        for (std::uint32_t q = 1; q < 5; ++q)
          want = op_ == op::sum ? want + in[q][i] : op_ == op::max ? std::max(want, in[q][i]) : want * in[q][i];
        REQUIRE(out[r][i] == want);
      }
    }
  }
  std::uint64_t lost = 0;
  for (const auto& l : w.cluster->stats().links) lost += l.stats.dropped_loss;
  CHECK(lost > 0);
}

TEST_CASE("back-to-back switch allreduces with a lossy host: faster ranks start the next call while it repairs the last") {
  // Every rank calls eight times without waiting for the others in between. A switch allreduce
  // sends its contributions before the ranks' hellos are compared, so ranks 0..2 put the next
  // call's first round into the slots while host 3 (20 % loss on its link) still asks the
  // switch again for results of the call before. Those must still be there (shadow_of: a call
  // starts on the copies the last one did not end on). Four slots, seven rounds each per call.
  emu::topology t = emu::star(4, emu::link_model{});
  for (auto& l : t.links)
    if (l.a == 3 || l.b == 3) l.model = test::lossy(0.2, 29, 0.0);
  options o;
  o.repair_interval = std::chrono::microseconds(1000);
  o.repair_max_interval = o.repair_interval;
  o.switch_slots = 4;
  o.packet_bytes = 1024;
  world w(t, o, 1, test::switches::fabric);
  constexpr std::uint32_t calls = 8;
  constexpr std::uint64_t count = 27 * 256 + 100;  // 28 packets: seven rounds per slot, so a call ends on the copy the next would start on
  std::vector<std::vector<std::vector<std::int32_t>>> out(4, std::vector<std::vector<std::int32_t>>(calls, std::vector<std::int32_t>(count)));
  auto input = [](std::uint32_t r, std::uint32_t k, std::uint64_t i) { return static_cast<std::int32_t>((i * 31 + r * 7 + k * 1009) % 4099); };
  auto res = w.run([&](std::uint32_t r) -> result<void> {
    std::vector<std::int32_t> in(count);
    for (std::uint32_t k = 0; k < calls; ++k) {
      for (std::uint64_t i = 0; i < count; ++i) in[i] = input(r, k, i);
      if (auto x = w.comms[r]->allreduce(std::span<const std::int32_t>(in), std::span<std::int32_t>(out[r][k]), op::sum,
                                         algorithm::switch_agg);
          !x.ok())
        return x;
    }
    return {};
  });
  for (std::uint32_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    for (std::uint32_t k = 0; k < calls; ++k) {
      bool exact = true;
      for (std::uint64_t i = 0; i < count; ++i) exact &= out[r][k][i] == input(0, k, i) + input(1, k, i) + input(2, k, i) + input(3, k, i);
      CHECK_MESSAGE(exact, "call " << k);
    }
  }
  std::uint64_t lost = 0;
  for (const auto& l : w.cluster->stats().links) lost += l.stats.dropped_loss;
  CHECK(lost > 0);
}

TEST_CASE("allgather and broadcast through the switch: blocks go up once and come down replicated, exact under loss") {
  for (double loss : {0.0, 0.01}) {
    const emu::link_model m = test::lossy(loss, 13, 0.03);
    options o;
    // Without loss, no repair traffic on a slow machine either: the bytes are measured.
    o.repair_max_interval = o.repair_interval = o.repair_min_interval = loss > 0 ? std::chrono::microseconds(1000) : std::chrono::microseconds(1000000);
    const std::uint32_t n = 4;
    world w(emu::star(n, m), o, 1, test::switches::fabric);
    for (std::uint64_t block : {0ull, 1ull, 255ull, 256ull, 257ull, 20011ull}) {
      std::vector<std::vector<std::uint32_t>> in(n, std::vector<std::uint32_t>(block)), out(n, std::vector<std::uint32_t>(block * n));
      for (std::uint32_t r = 0; r < n; ++r)
        for (std::uint64_t i = 0; i < block; ++i) in[r][i] = static_cast<std::uint32_t>(r * 1000003 + i);
      const host_traffic before = traffic(*w.cluster, n);
      auto res = w.run([&](std::uint32_t r) { return w.comms[r]->allgather(in[r].data(), out[r].data(), block, dtype::u32, algorithm::switch_agg); });
      const host_traffic after = traffic(*w.cluster, n);
      for (std::uint32_t r = 0; r < n; ++r) {
        INFO("loss " << loss << " block " << block << " rank " << r);
        REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
        for (std::uint32_t q = 0; q < n; ++q) REQUIRE(test::same_bytes(out[r].data() + q * block, in[q].data(), block * 4));
        if (loss == 0.0 && block == 20011) {
          // Up: the own block once; down: every block, the own one's copy included.
          const double s_bytes = block * 4.0 * n;
          MESSAGE("allgather via switch, rank " << r << ": up " << (after.up[r] - before.up[r]) / s_bytes << " x S, down "
                                                 << (after.down[r] - before.down[r]) / s_bytes << " x S");
          CHECK(after.up[r] - before.up[r] < 0.3 * s_bytes);
          CHECK(after.down[r] - before.down[r] < 1.12 * s_bytes);
        }
      }
      std::vector<std::vector<std::uint32_t>> buf(n, std::vector<std::uint32_t>(block * 3));
      for (std::uint64_t i = 0; i < block * 3; ++i) buf[2][i] = static_cast<std::uint32_t>(i * 7 + 1);
      const std::vector<std::uint32_t> want = buf[2];
      res = w.run([&](std::uint32_t r) { return w.comms[r]->broadcast(buf[r].data(), buf[r].data(), block * 3, dtype::u32, 2); });
      for (std::uint32_t r = 0; r < n; ++r) {
        REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
        REQUIRE(buf[r] == want);
      }
    }
  }
}

TEST_CASE("a switch multicasting to many hosts takes each frame from its egress port's pool and runs dry on none") {
  // Small pools of 128 mbufs: the group's 64 slots put up to 64 results towards each host at
  // once. Taken from one shared pool (as the NIC once did), 8 x 64 frames do not fit: no_mbuf
  // drops, and without recovery a timeout. From each egress port's own pool they do.
  constexpr std::uint32_t n = 8;
  emu::cluster_options co;
  co.port.pool_mbufs = 128;
  auto c = emu::cluster::create(emu::star(n, emu::link_model{}), co);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message));
  test::driver d;
  d.start(**c);
  auto fab = fabric::create(**c);
  REQUIRE_MESSAGE(fab.ok(), (fab.ok() ? std::string() : fab.err().message));
  options o;
  o.switches = fab.value().get();
  o.recovery = false;
  o.timeout = std::chrono::seconds(20);
  o.arena_bytes = std::size_t{16} << 20;
  o.staging_bytes = std::size_t{2} << 20;
  std::vector<std::unique_ptr<communicator>> comms;
  group g;
  g.id = 3;
  for (std::uint32_t r = 0; r < n; ++r) g.members.push_back(r);
  for (std::uint32_t r = 0; r < n; ++r) {
    g.me = r;
    auto cm = communicator::create(*(*c)->host(r), g, o);
    REQUIRE_MESSAGE(cm.ok(), (cm.ok() ? std::string() : cm.err().message));
    comms.push_back(std::move(cm.value()));
  }
  constexpr std::uint64_t count = 512 * 1024;  // 2 MiB of int32 per rank: 512 packets
  std::vector<std::vector<std::int32_t>> in(n, std::vector<std::int32_t>(count)), out(n, std::vector<std::int32_t>(count));
  for (std::uint32_t r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < count; ++i) in[r][i] = static_cast<std::int32_t>(i % 1000) + static_cast<std::int32_t>(r);
  std::vector<result<void>> res(n);
  std::vector<std::thread> th;
  for (std::uint32_t r = 0; r < n; ++r)
    th.emplace_back([&, r] { res[r] = comms[r]->allreduce(in[r].data(), out[r].data(), count, dtype::i32, op::sum, algorithm::switch_agg); });
  for (auto& t : th) t.join();
  for (std::uint32_t r = 0; r < n; ++r) {
    if (!res[r].ok()) MESSAGE(emu::to_text((*c)->stats()));
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    bool exact = true;
    for (std::uint64_t i = 0; i < count; ++i) exact &= out[r][i] == 8 * static_cast<std::int32_t>(i % 1000) + 28;
    CHECK(exact);
  }
  for (const auto& node : (*c)->stats().nodes) {
    INFO(node.name);
    CHECK(node.drops[static_cast<std::size_t>(emu::nic_drop::no_mbuf)] == 0);
  }
  comms.clear();
}

TEST_CASE("switch allreduce without recovery ends in a timeout on every rank when packets are lost") {
  emu::link_model m;
  m.loss = 0.05;
  m.seed = 9;
  options o;
  o.recovery = false;
  o.timeout = std::chrono::milliseconds(300);
  world w(emu::star(3, m), o, 1, test::switches::fabric);
  std::vector<std::vector<std::int32_t>> in(3, std::vector<std::int32_t>(50000, 1)), out(3, std::vector<std::int32_t>(50000));
  auto res = w.run([&](std::uint32_t r) {
    return w.comms[r]->allreduce(in[r].data(), out[r].data(), 50000, dtype::i32, op::sum, algorithm::switch_agg);
  });
  for (std::uint32_t r = 0; r < 3; ++r) {
    REQUIRE_FALSE(res[r].ok());
    CHECK(res[r].err().code == errc::timeout);
  }
}

TEST_CASE("a user reduction aggregates on the switch too") {
  auto pkg = rt::read_package_file(SPIN_ARGMAX_PACKAGE);
  REQUIRE(pkg.ok());
  world w(emu::star(4, {}), {}, 1, test::switches::fabric);
  std::vector<custom_op> ops;
  for (auto& c : w.comms) {
    auto op_ = c->add_reduction(reduction{"argmax", pkg.value(), kernels_of<argmax>()});
    REQUIRE_MESSAGE(op_.ok(), (op_.ok() ? std::string() : op_.err().message));
    ops.push_back(op_.value());
  }
  CHECK(w.fab->usage()[0].groups == 2);  // the standard engine's slots and the reduction's
  const std::uint64_t count = 5000;
  std::vector<std::vector<value_index>> in(4, std::vector<value_index>(count)), out(4, std::vector<value_index>(count));
  for (std::uint32_t r = 0; r < 4; ++r)
    for (std::uint64_t i = 0; i < count; ++i) in[r][i] = {static_cast<float>((i * 3 + r * 5) % 7), static_cast<std::uint32_t>(r * count + i)};
  for (algorithm a : {algorithm::switch_agg, algorithm::automatic}) {
    auto res = w.run([&](std::uint32_t r) { return w.comms[r]->allreduce(in[r].data(), out[r].data(), count, ops[r], a); });
    for (std::uint32_t r = 0; r < 4; ++r) {
      REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
      for (std::uint64_t i = 0; i < count; ++i) {
        value_index best = in[0][i];
        for (std::uint32_t q = 1; q < 4; ++q) best = argmax::combine(best, in[q][i]);
        REQUIRE(out[r][i].index == best.index);
      }
    }
  }
}

}
