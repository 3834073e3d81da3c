// The switch's group registry (spin/emu/groups.hpp): all or nothing, one answer per group, first
// come first served, and slots that go back when members or their owners go.
#include <spin/emu/groups.hpp>

#include <doctest/doctest.h>

using namespace spin;
using host::join_state;

namespace {

host::group_join req(std::uint32_t group, std::uint32_t slots, std::vector<std::uint32_t> members = {0, 1, 2}) {
  return host::group_join{group, std::move(members), slots};
}

host::group_answer join(emu::group_registry& r, std::uint64_t owner, const host::group_join& j, std::uint32_t me) {
  auto a = r.join(owner, j, me);
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? std::string() : a.err().message));
  return a.value();
}

std::uint32_t free_slots(emu::group_registry& r) { return r.pool().value().free; }

} // namespace

TEST_SUITE("unit") {

TEST_CASE("the first member installs; the others wait for its decision and all get the same lease") {
  emu::group_registry r("s0", host::slot_pool{100, 4096});
  const auto j = req(16, 40);
  auto a0 = join(r, 1, j, 0);
  CHECK(a0.state == join_state::install);
  CHECK(a0.installer);
  CHECK(free_slots(r) == 60);  // reserved at once
  auto a1 = join(r, 2, j, 1);
  CHECK(a1.state == join_state::wait);
  CHECK_FALSE(a1.installer);
  CHECK(a1.reason == "the group's first member is setting it up on s0");
  REQUIRE(r.decide(1, host::group_decision{16, true, {7, 8}, ""}).ok());
  for (std::uint32_t me : {1u, 2u}) {
    auto a = join(r, 2 + me, j, me);
    CHECK(a.state == join_state::granted);
    CHECK(a.lease == std::vector<std::uint32_t>{7, 8});
  }
  auto again = join(r, 1, j, 0);  // asking again is polling: the same answer
  CHECK(again.state == join_state::granted);
  CHECK(again.installer);
  const auto u = r.pool().value();
  CHECK(u.groups == 1);
  CHECK(u.free == 60);
  CHECK(u.waiting == 0);
}

TEST_CASE("a group gets all its slots or none, and groups are served in the order they asked") {
  emu::group_registry r("s0", host::slot_pool{100, 4096});
  REQUIRE(join(r, 1, req(16, 70), 0).state == join_state::install);
  REQUIRE(r.decide(1, host::group_decision{16, true, {9}, ""}).ok());
  // 30 free: a group of 50 waits; a later group of 10 would fit, but waits behind it.
  auto big = join(r, 2, req(32, 50), 0);
  CHECK(big.state == join_state::wait);
  CHECK(big.installer);
  CHECK(big.reason == "s0 has 30 free slots of 100 (1 groups hold the rest); the group asks for 50");
  auto small = join(r, 3, req(48, 10), 0);
  CHECK(small.state == join_state::wait);
  CHECK(small.reason == "s0 has 30 free slots of 100 (1 groups hold the rest); the group asks for 10, and groups that asked earlier wait before it");
  CHECK(r.pool().value().waiting == 2);
  CHECK(free_slots(r) == 30);  // nothing reserved for waiting groups
  // The holder's members leave: the head of the queue is served first, then the next.
  r.leave(1, 16, 0);
  CHECK(free_slots(r) == 100);
  CHECK(join(r, 3, req(48, 10), 0).state == join_state::wait);
  CHECK(join(r, 2, req(32, 50), 0).state == join_state::install);
  CHECK(join(r, 3, req(48, 10), 0).state == join_state::install);
  CHECK(free_slots(r) == 40);
}

TEST_CASE("an installer that gives up refuses the group for every member, and the refusal holds no slots") {
  emu::group_registry r("s0", host::slot_pool{10, 4096});
  REQUIRE(join(r, 1, req(16, 10), 0).state == join_state::install);
  CHECK(join(r, 2, req(32, 5), 0).state == join_state::wait);
  CHECK(join(r, 3, req(32, 5), 1).state == join_state::wait);
  REQUIRE(r.decide(2, host::group_decision{32, false, {}, "s0 is full"}).ok());
  auto a = join(r, 3, req(32, 5), 1);
  CHECK(a.state == join_state::refused);
  CHECK(a.reason == "s0 is full");
  CHECK(free_slots(r) == 0);
  CHECK(r.pool().value().waiting == 0);
}

TEST_CASE("a group asking for more slots than the pool has is refused at once, the same for every member") {
  emu::group_registry r("s0", host::slot_pool{8, 4096});
  for (std::uint32_t me = 0; me < 3; ++me) {
    auto a = join(r, 1 + me, req(16, 9), me);
    CHECK(a.state == join_state::refused);
    CHECK(a.reason == "the group asks for 9 slots; s0 has 8");
  }
  CHECK(free_slots(r) == 8);
}

TEST_CASE("slots go back when an owner goes away; an installer that goes before deciding refuses its group") {
  emu::group_registry r("s0", host::slot_pool{100, 4096});
  REQUIRE(join(r, 1, req(16, 60), 0).state == join_state::install);
  REQUIRE(join(r, 2, req(16, 60), 1).state == join_state::wait);
  r.release(1);  // the installer's connection closed before it decided
  auto a = join(r, 2, req(16, 60), 1);
  CHECK(a.state == join_state::refused);
  CHECK(a.reason == "the group's first member went away before it finished setting the group up");
  CHECK(free_slots(r) == 100);
  r.release(2);
  CHECK(r.pool().value().groups == 0);
  // A granted group keeps its slots while any member's owner remains.
  REQUIRE(join(r, 3, req(32, 60), 0).state == join_state::install);
  REQUIRE(r.decide(3, host::group_decision{32, true, {1}, ""}).ok());
  REQUIRE(join(r, 4, req(32, 60), 1).state == join_state::granted);
  r.release(3);
  CHECK(free_slots(r) == 40);
  r.release(4);
  CHECK(free_slots(r) == 100);
  // The group's id can be used again, from scratch.
  CHECK(join(r, 5, req(32, 10), 2).state == join_state::install);
}

TEST_CASE("members that disagree, bad requests and decisions out of turn get clear errors") {
  emu::group_registry r("s0", host::slot_pool{100, 4096});
  REQUIRE(join(r, 1, req(16, 10), 0).state == join_state::install);
  auto other = r.join(2, req(16, 11), 1);
  REQUIRE_FALSE(other.ok());
  CHECK(other.err().code == errc::invalid_argument);
  CHECK(other.err().message == "group 16 on s0: this member's slots differ from the first member's");
  CHECK(r.join(2, req(17, 10, {}), 0).err().message == "group 17: 1..65535 members");
  CHECK(r.join(2, req(17, 10), 3).err().message == "group 17: member index 3 of 3 members");
  CHECK(r.join(2, req(17, 0), 0).err().message == "group 17: slots out of 1..32767");
  REQUIRE(join(r, 2, req(16, 10), 1).state == join_state::wait);
  auto not_first = r.decide(2, host::group_decision{16, true, {1}, ""});
  CHECK(not_first.err().code == errc::bad_state);
  CHECK(not_first.err().message == "group 16 on s0: only its first member decides");
  CHECK(r.decide(1, host::group_decision{99, true, {1}, ""}).err().code == errc::not_found);
  REQUIRE(r.decide(1, host::group_decision{16, true, {1}, ""}).ok());
  CHECK(r.decide(1, host::group_decision{16, true, {1}, ""}).err().message == "group 16 on s0 is already decided");
  // A queued group cannot be granted before its slots are reserved.
  REQUIRE(join(r, 3, req(32, 95), 0).state == join_state::wait);
  CHECK(r.decide(3, host::group_decision{32, true, {1}, ""}).err().message == "group 32 on s0 holds no slots yet");
}

TEST_CASE("a group whose id another group holds on the switch is refused, the same for each of its members, until they leave") {
  emu::group_registry r("s0", host::slot_pool{100, 4096});
  REQUIRE(join(r, 1, req(16, 10, {0, 2}), 0).state == join_state::install);
  const std::string why = "group id 16 is held on s0 by another group (other members); groups that share a switch need different ids";
  auto b1 = join(r, 2, req(16, 10, {1, 3}), 0);
  CHECK(b1.state == join_state::refused);
  CHECK(b1.reason == why);
  // The holder goes; the clashing group's other member still gets the refusal its first got.
  r.release(1);
  auto b2 = join(r, 3, req(16, 10, {1, 3}), 1);
  CHECK(b2.state == join_state::refused);
  CHECK(b2.reason == why);
  CHECK(free_slots(r) == 100);
  // Once its members left, the id is free for a new group.
  r.leave(2, 16, 0);
  r.release(3);
  CHECK(join(r, 4, req(16, 10, {1, 3}), 0).state == join_state::install);
}

TEST_CASE("a member whose proof of the job secret differs from the first member's is refused with a clear error") {
  emu::group_registry r("s0", host::slot_pool{100, 4096});
  auto j = req(16, 10);
  j.proof = 0x1234;
  REQUIRE(join(r, 1, j, 0).state == join_state::install);
  auto other = j;
  other.proof = 0x9999;  // another job that uses the same id and members
  auto a = r.join(2, other, 1);
  REQUIRE_FALSE(a.ok());
  CHECK(a.err().code == errc::not_supported);
  CHECK(a.err().message == "group 16 on s0: this member's proof of the job secret differs from the first member's (another job "
                           "uses this group id, or the members do not share one secret)");
  CHECK(join(r, 3, j, 1).state == join_state::wait);  // the job's own member
}

TEST_CASE("the pool's size changes only while no group uses it") {
  emu::group_registry r("s0");
  CHECK(r.pool().value().pool == host::slot_pool{256, 4096});
  auto u = r.pool(host::slot_pool{32, 1024});
  REQUIRE(u.ok());
  CHECK(u.value().free == 32);
  CHECK(r.pool(host::slot_pool{0, 1024}).err().code == errc::invalid_argument);
  CHECK(r.pool(host::slot_pool{32, 1001}).err().code == errc::invalid_argument);
  REQUIRE(join(r, 1, req(16, 10), 0).state == join_state::install);
  CHECK(r.pool(host::slot_pool{32, 1024}).ok());  // the same size: fine
  auto busy = r.pool(host::slot_pool{64, 1024});
  CHECK(busy.err().code == errc::bad_state);
  CHECK(busy.err().message == "s0's slot pool is 32 slots of 1024 bytes and 1 groups use it; it cannot become 64 slots of 1024 bytes until they are gone");
  r.leave(1, 16, 0);
  CHECK(r.pool(host::slot_pool{64, 1024}).value().free == 64);
}

TEST_CASE("a leased owner that is not renewed within its term is released; renewals and joins keep it") {
  using namespace std::chrono_literals;
  emu::group_registry r("s0", host::slot_pool{100, 4096});
  const auto t0 = emu::group_registry::clock::now();
  REQUIRE(r.lease(7, 1s, t0).ok());
  REQUIRE(join(r, 7, req(16, 60), 0).state == join_state::install);
  REQUIRE(r.decide(7, host::group_decision{16, true, {9}, ""}).ok());
  REQUIRE(join(r, 8, req(16, 60), 1).state == join_state::granted);  // 8: no lease
  CHECK(r.expire(t0 + 900ms).empty());
  CHECK(r.renew(7, t0 + 900ms));  // a keep-alive: good until t0 + 1.9 s
  CHECK(r.expire(t0 + 1800ms).empty());
  CHECK(free_slots(r) == 40);
  CHECK(r.expire(t0 + 2s) == std::vector<std::uint64_t>{7});
  CHECK_FALSE(r.renew(7, t0 + 2s));  // gone: a late keep-alive learns it
  CHECK(free_slots(r) == 40);  // member 1 (owner 8) still holds the group
  r.release(8);
  CHECK(free_slots(r) == 100);
  // An installer whose lease runs out before it decides refuses its group for everyone.
  REQUIRE(r.lease(9, 1s, t0).ok());
  REQUIRE(join(r, 9, req(32, 10), 0).state == join_state::install);
  REQUIRE(join(r, 10, req(32, 10), 1).state == join_state::wait);
  CHECK(r.expire(emu::group_registry::clock::now() + 2s) == std::vector<std::uint64_t>{9});
  auto a = join(r, 10, req(32, 10), 1);
  CHECK(a.state == join_state::refused);
  CHECK(a.reason == "the group's first member went away before it finished setting the group up");
  // A term of 0 ends a lease; bad terms are refused.
  REQUIRE(r.lease(11, 1s, t0).ok());
  REQUIRE(r.lease(11, 0s, t0).ok());
  CHECK_FALSE(r.renew(11, t0));
  CHECK(r.lease(12, -1s, t0).err().code == errc::invalid_argument);
  CHECK(r.lease(12, 2h, t0).err().code == errc::invalid_argument);
}

}  // TEST_SUITE
