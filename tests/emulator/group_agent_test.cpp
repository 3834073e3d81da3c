// Group agents in a cluster (spin/emu/group_agent.hpp): in-band joins over management datagrams,
// one answer for every member, set-up and removal by the switch's installer, leaves, and
// datagrams that lie about themselves counted and ignored.
#include <doctest/doctest.h>

#include <spin/emu/cluster.hpp>

#include "cluster_driver.hpp"
#include <spin/emu/group_agent.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

using namespace spin;
using namespace std::chrono_literals;

namespace {

using driver = spin::test::cluster_driver;

// Records what the switch's agent asks of it; set-up fails for group `fail_group`.
struct fake_installer final : emu::group_installer {
  struct log {
    std::mutex m;
    std::vector<std::uint32_t> set_up, torn_down;
    std::vector<std::array<std::uint8_t, 16>> frame_keys;  // of each set-up, in order
  };
  log& l;
  std::uint32_t rank;
  std::uint32_t fail_group = ~0u;
  fake_installer(log& lg, std::uint32_t r) : l(lg), rank(r) {}
  result<std::vector<std::uint32_t>> set_up(const host::group_join& j, std::uint32_t slot_bytes) override {
    std::lock_guard g(l.m);
    if (j.group == fail_group) return fail(errc::no_memory, "no room for its slots");
    CHECK(slot_bytes == 4096);
    l.set_up.push_back(j.group);
    l.frame_keys.push_back(j.frame_key);
    return std::vector<std::uint32_t>{rank, 7};
  }
  void tear_down(std::uint32_t group) override {
    std::lock_guard g(l.m);
    l.torn_down.push_back(group);
  }
};

// Polls agent `a` (member `me`, owner `owner`) until the answer is not `wait`.
result<host::group_answer> join_until_decided(emu::group_agent& a, std::uint64_t owner, std::uint32_t sw, const host::group_join& j,
                                              std::uint32_t me) {
  for (int i = 0; i < 2000; ++i) {
    auto r = a.join(owner, sw, j, me);
    if (!r.ok() || r.value().state != host::join_state::wait) return r;
    std::this_thread::sleep_for(2ms);
  }
  return fail(errc::timeout, "no answer within 4 s");
}

template <class F> bool eventually(F&& f) {
  for (int i = 0; i < 500; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return f();
}

} // namespace

TEST_SUITE("emulator") {

TEST_CASE("group agents join in-band: the switch sets the group up once, every member gets its answer, and leaves remove it") {
  emu::link_model m;
  m.rate_gbps = 0;
  emu::cluster_options co;
  co.payload_bytes = 1024;
  auto c = emu::cluster::create(emu::star(3, m), co);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message));
  emu::cluster& cl = **c;
  emu::nic& sw = cl.node(3);
  fake_installer::log log;
  auto inst = std::make_unique<fake_installer>(log, sw.rank());
  inst->fail_group = 48;
  auto sa = emu::group_agent::start(sw, std::move(inst));
  REQUIRE(sa.ok());
  std::vector<std::unique_ptr<emu::group_agent>> ha;
  for (std::uint32_t h = 0; h < 3; ++h) {
    emu::group_agent_options o;
    o.lease_term = 1000ms;
    auto a = emu::group_agent::start(*cl.host(h), nullptr, o);
    REQUIRE(a.ok());
    ha.push_back(std::move(a.value()));
  }
  driver d(cl);
  const std::uint32_t S = sw.rank();
  const host::group_join j{16, {0, 1, 2}, 40, 99};
  for (std::uint32_t r = 0; r < 3; ++r) {
    auto a = join_until_decided(*ha[r], 100 + r, S, j, r);
    REQUIRE_MESSAGE(a.ok(), (a.ok() ? std::string() : a.err().message));
    CHECK(a.value().state == host::join_state::granted);
    CHECK(a.value().lease == std::vector<std::uint32_t>{S, 7});
    CHECK(a.value().installer == (r == 0));
  }
  CHECK(sw.groups().pool().value().free == 216);
  {
    std::lock_guard g(log.m);
    CHECK(log.set_up == std::vector<std::uint32_t>{16});  // once, by the switch
  }
  // The switch's errors travel back with their code: a member whose proof differs.
  const host::group_join p1{80, {0, 1}, 4, 1};
  REQUIRE(join_until_decided(*ha[0], 100, S, p1, 0).value().state == host::join_state::granted);
  auto e = join_until_decided(*ha[1], 101, S, host::group_join{80, {0, 1}, 4, 2}, 1);
  REQUIRE_FALSE(e.ok());
  CHECK(e.err().code == errc::not_supported);
  CHECK(e.err().message.find("proof of the job secret differs") != std::string::npos);
  ha[0]->leave(100, S, 80, 0);
  ha[1]->leave(101, S, 80, 1);
  CHECK(eventually([&] { return !sw.groups().holds(80); }));
  // A NIC joins only as itself, and one connection per member of a NIC.
  auto as_other = join_until_decided(*ha[0], 100, S, host::group_join{96, {0, 1}, 4, 0}, 1);
  REQUIRE_FALSE(as_other.ok());
  CHECK(as_other.err().code == errc::invalid_argument);
  CHECK(as_other.err().message == "switch rank 65535: rank 0 asked to join group 96 as member 1 (rank 1); a NIC joins only as itself");
  ha[0]->leave(100, S, 96, 1);
  auto twice = ha[1]->join(999, S, j, 1);
  REQUIRE_FALSE(twice.ok());
  CHECK(twice.err().code == errc::exists);
  // A set-up that fails refuses the group, in its words, for every member.
  const host::group_join k{48, {0, 1}, 8, 0};
  for (std::uint32_t r = 0; r < 2; ++r) {
    auto a = join_until_decided(*ha[r], 100 + r, S, k, r);
    REQUIRE_MESSAGE(a.ok(), (a.ok() ? std::string() : a.err().message));
    CHECK(a.value().state == host::join_state::refused);
    CHECK(a.value().reason == "setting the group up on s0: no room for its slots");
  }
  // A member NIC cannot aggregate (no installer), and in-band joins check what they carry.
  auto na = join_until_decided(*ha[0], 100, cl.host(1)->rank(), host::group_join{32, {0, 1}, 4, 0}, 0);
  REQUIRE(na.ok());
  CHECK(na.value().state == host::join_state::refused);
  CHECK(na.value().reason == "h1 (rank 1) does not aggregate: its spin-emu sets up no switch engines");
  CHECK(ha[0]->join(100, cl.host(0)->rank(), j, 0).err().code == errc::invalid_argument);
  CHECK(ha[0]->join(100, S, host::group_join{16, std::vector<std::uint32_t>(20000, 0), 40, 0}, 0).err().code == errc::invalid_argument);
  CHECK(ha[0]->join(100, S, host::group_join{16, {0, 1}, 40, 0}, 2).err().code == errc::invalid_argument);
  CHECK(ha[0]->give_up(100, S, host::group_decision{16, true, {}, ""}).err().code == errc::invalid_argument);
  CHECK(ha[0]->give_up(555, S, host::group_decision{16, false, {}, ""}).err().code == errc::not_found);
  // Packets larger than the switch's slots: refused by the switch.
  host::group_join big{64, {0, 1}, 4, 0};
  big.packet_bytes = 8192;
  auto bg = join_until_decided(*ha[0], 100, S, big, 0);
  REQUIRE(bg.ok());
  CHECK(bg.value().reason == "packets of 8192 bytes do not fit the slots of 4096 bytes on s0");

  // Datagrams that lie about themselves are counted and change nothing.
  const auto before = sa.value()->stats().bad_datagrams;
  const std::vector<std::vector<std::uint8_t>> bad = {
      {'X', 2, 1, 0, 0, 0, 0, 16, 0, 0, 0, 0},                    // wrong magic
      {'G', 1, 1, 0, 0, 0, 0, 16, 0, 0, 0, 0},                    // wrong version (the first format's)
      {'G', 2, 9, 0, 0, 0, 0, 16, 0, 0, 0, 0},                    // unknown op
      {'G', 2, 4, 2, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0},        // a seal flag that is neither 0 nor 1
      {'G', 2},                                                   // short header
      {'G', 2, 1, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 40},       // a join cut short
      {'G', 2, 1, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 40, 0, 0, 0, 0, 0, 0, 1, 44, 0, 0, 0, 0, 0, 0, 0, 99,
       0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
       0, 0, 0, 200, 0, 0, 0, 1},                                 // 200 members announced, 1 carried
      {'G', 2, 6, 0, 0, 0, 0, 16, 0, 0, 0, 0, 4, 0, 'a'},         // a give-up whose reason overruns
  };
  for (const auto& b : bad) REQUIRE(cl.host(2)->send_mgmt(S, std::as_bytes(std::span(b))).ok());
  CHECK(eventually([&] { return sa.value()->stats().bad_datagrams == before + bad.size(); }));
  CHECK(sw.groups().holds(16));

  // Leaves: the last member's removes the group (the installer tears its engine down).
  ha[0]->leave(100, S, 16, 0);
  ha[1]->release(101);  // member 1's connection closed
  CHECK(eventually([&] { return sw.groups().pool().value().groups == 1; }));  // member 2 holds it
  ha[2].reset();  // a spin-emu that stops sends its leaves
  CHECK(eventually([&] { return !sw.groups().holds(16); }));
  // Every engine the switch set up is gone again (a late copy of a join may set a group up
  // once more after its members left; that member's leave, which follows it, removes it).
  CHECK(eventually([&] { return sa.value()->stats().groups_removed == sa.value()->stats().groups_set_up; }));
  {
    const auto set_up = sa.value()->stats().groups_set_up;  // before log.m: the agent takes its lock, then the log's
    std::lock_guard g(log.m);
    std::multiset<std::uint32_t> up(log.set_up.begin(), log.set_up.end()), down(log.torn_down.begin(), log.torn_down.end());
    CHECK(up == down);
    CHECK(up.count(16) == 1);
    CHECK(up.count(80) >= 1);
    CHECK(up.size() == set_up);
  }
  CHECK(sw.groups().pool().value().free == 256);
  CHECK(sw.groups().pool().value().groups == 0);
  CHECK(sw.stats().drops[static_cast<std::size_t>(emu::nic_drop::mgmt_queue_full)] == 0);
}

TEST_CASE("with a management key agents seal their datagrams, carry a group's frame key wrapped, and count datagrams of strangers as forged") {
  emu::link_model m;
  m.rate_gbps = 0;
  auto c = emu::cluster::create(emu::star(2, m), emu::cluster_options{});
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message));
  emu::cluster& cl = **c;
  emu::nic& sw = cl.node(2);
  const std::uint32_t S = sw.rank();
  std::array<std::uint8_t, 16> mk{}, fk{};
  for (std::size_t i = 0; i < 16; ++i) {
    mk[i] = static_cast<std::uint8_t>(0x11 * (i + 1));
    fk[i] = static_cast<std::uint8_t>(0xa0 + i);
  }
  emu::group_agent_options keyed;
  keyed.mgmt_key = mk;
  fake_installer::log log;
  auto sa = emu::group_agent::start(sw, std::make_unique<fake_installer>(log, S), keyed);
  REQUIRE(sa.ok());
  auto a0 = emu::group_agent::start(*cl.host(0), nullptr, keyed);
  REQUIRE(a0.ok());
  emu::group_agent_options stranger;  // no management key
  stranger.answer_timeout = 300ms;
  auto a1 = emu::group_agent::start(*cl.host(1), nullptr, stranger);
  REQUIRE(a1.ok());
  driver d(cl);

  // A group with a frame key: the switch's installer gets exactly that key.
  host::group_join j{16, {0}, 4, 7};
  j.frame_key = fk;
  auto g = join_until_decided(*a0.value(), 1, S, j, 0);
  REQUIRE_MESSAGE(g.ok(), (g.ok() ? std::string() : g.err().message));
  CHECK(g.value().state == host::join_state::granted);
  {
    std::lock_guard l(log.m);
    REQUIRE(log.frame_keys.size() == 1);
    CHECK(log.frame_keys[0] == fk);
  }
  // A group without one stays without one.
  auto g2 = join_until_decided(*a0.value(), 1, S, host::group_join{32, {0}, 4, 0}, 0);
  REQUIRE(g2.ok());
  {
    std::lock_guard l(log.m);
    REQUIRE(log.frame_keys.size() == 2);
    CHECK(log.frame_keys[1] == std::array<std::uint8_t, 16>{});
  }
  // Without a management key an agent does not send a frame key in clear.
  host::group_join j1{48, {1}, 4, 7};
  j1.frame_key = fk;
  auto clear = a1.value()->join(2, S, j1, 0);
  REQUIRE_FALSE(clear.ok());
  CHECK(clear.err().code == errc::invalid_argument);
  CHECK(clear.err().message.find("has no management key to send its frame key to the switch in-band") != std::string::npos);
  // Its unsealed join is forged to the switch: counted, never answered.
  const auto forged = sa.value()->stats().forged_datagrams;
  auto unanswered = join_until_decided(*a1.value(), 2, S, host::group_join{48, {1}, 4, 0}, 0);
  REQUIRE_FALSE(unanswered.ok());
  CHECK(unanswered.err().code == errc::timeout);
  CHECK(sa.value()->stats().forged_datagrams > forged);
  CHECK_FALSE(sw.groups().holds(48));
  // A sealed datagram whose tag was made without the key, or whose bytes changed: forged.
  const auto before = sa.value()->stats().forged_datagrams;
  const std::vector<std::uint8_t> keepalive = {'G', 2, 4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0xe8, 1, 2, 3, 4, 5, 6, 7, 8};
  REQUIRE(cl.host(1)->send_mgmt(S, std::as_bytes(std::span(keepalive))).ok());
  CHECK(eventually([&] { return sa.value()->stats().forged_datagrams == before + 1; }));
  CHECK(sa.value()->stats().bad_datagrams == 0);
  // The keyed member's own datagrams were all taken.
  CHECK(a0.value()->stats().forged_datagrams == 0);
}

TEST_CASE("an in-band join that no switch answers fails with timeout instead of waiting for a decision nobody makes") {
  emu::link_model m;
  m.rate_gbps = 0;
  auto c = emu::cluster::create(emu::star(2, m), emu::cluster_options{});
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message));
  emu::cluster& cl = **c;
  emu::group_agent_options o;
  o.answer_timeout = 300ms;
  auto a = emu::group_agent::start(*cl.host(0), nullptr, o);  // the switch (node 2) runs no agent
  REQUIRE(a.ok());
  driver d(cl);
  const auto start = std::chrono::steady_clock::now();
  auto r = join_until_decided(*a.value(), 1, cl.node(2).rank(), host::group_join{16, {0, 1}, 4, 0}, 0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == errc::timeout);
  CHECK(r.err().message == "switch rank 65535 sent no answer to an in-band join through h0 within 300 ms (is its spin-emu running, "
                           "in switch mode, and linked to this NIC?)");
  CHECK(std::chrono::steady_clock::now() - start >= 300ms);
  CHECK(emu::group_agent::start(*cl.host(0), nullptr, emu::group_agent_options{3000ms, 50ms, 5ms}).err().code == errc::invalid_argument);
}

}  // TEST_SUITE
