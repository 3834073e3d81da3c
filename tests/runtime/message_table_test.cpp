// The message table of one HPU and EC (runtime/src/message_table.hpp), on its own.
#include "message_table.hpp"

#include <doctest/doctest.h>

#include <set>

using namespace spin::rt::detail;

namespace {

std::uint32_t open_msg(message_table& t, std::uint32_t source, std::uint64_t id) {
  return t.open(key_hash(source, id), source, id);
}
std::uint32_t find_msg(const message_table& t, std::uint32_t source, std::uint64_t id) {
  return t.find(key_hash(source, id), source, id);
}
// Accepts `seq` when check allows it; returns the verdict.
seq_verdict offer(message_table& t, std::uint32_t idx, std::uint32_t seq, bool end = false) {
  const seq_verdict v = t.check(idx, seq, end);
  if (v == seq_verdict::accept || v == seq_verdict::in_order) t.mark(idx, seq, end, v);
  return v;
}

} // namespace

TEST_SUITE("runtime") {

TEST_CASE("the message table remembers the last retired_history settled keys, oldest evicted first") {
  message_table t;
  t.init(2, 3, 64);
  CHECK(t.entries() == 5);
  for (std::uint64_t id = 0; id < 6; ++id) {
    const std::uint32_t idx = open_msg(t, 1, id);
    REQUIRE(idx != none);
    CHECK(find_msg(t, 1, id) == idx);
    t.settle(idx);
  }
  for (std::uint64_t id = 0; id < 3; ++id) CHECK(find_msg(t, 1, id) == none);
  for (std::uint64_t id = 3; id < 6; ++id) {
    const std::uint32_t idx = find_msg(t, 1, id);
    REQUIRE(idx != none);
    CHECK(t[idx].state == msg_state::retired);
  }
  CHECK(find_msg(t, 2, 5) == none);  // another source's message of the same id
}

TEST_CASE("the message table refuses a new message only when every entry is open or held") {
  message_table t;
  t.init(2, 0, 64);
  const std::uint32_t a = open_msg(t, 0, 1), b = open_msg(t, 0, 2);
  REQUIRE(a != none);
  REQUIRE(b != none);
  CHECK(open_msg(t, 0, 3) == none);
  t.settle(a);  // no history: the entry is free at once
  CHECK(find_msg(t, 0, 1) == none);
  CHECK(open_msg(t, 0, 3) != none);
  CHECK(find_msg(t, 0, 2) == b);
}

TEST_CASE("keys that collide in the index stay findable after others are deleted around them") {
  message_table t;
  t.init(64, 0, 64);
  std::set<std::uint64_t> live;
  std::vector<std::uint32_t> idx(200, none);
  // Open and settle in a pattern that exercises backward-shift deletion on a crowded index.
  for (std::uint64_t id = 0; id < 200; ++id) {
    if (live.size() == 64) {
      const std::uint64_t victim = *std::next(live.begin(), static_cast<long>(id % live.size()));
      t.settle(idx[victim]);
      live.erase(victim);
    }
    idx[id] = open_msg(t, static_cast<std::uint32_t>(id % 7), id);
    REQUIRE(idx[id] != none);
    live.insert(id);
    for (std::uint64_t k : live) REQUIRE(find_msg(t, static_cast<std::uint32_t>(k % 7), k) == idx[k]);
  }
}

TEST_CASE("keys of one index group overflow into the next groups and stay findable in any deletion order") {
  // 64 entries: 16 groups of 8 slots. Forty keys share one hash (as an attacker choosing ids
  // could make them), so they fill their home group and four more; keys of the groups they
  // pass through must stay findable, and deleting in any order must leave every other key
  // findable and keep lookups of absent keys ending.
  message_table t;
  t.init(64, 0, 64);
  constexpr std::uint32_t same = 0x35;  // group 5
  std::vector<std::uint32_t> idx;
  for (std::uint64_t id = 0; id < 40; ++id) {
    idx.push_back(t.open(same, 1, id));
    REQUIRE(idx.back() != none);
  }
  // Keys whose home is a group the overflow filled: they go further on, and are found.
  std::vector<std::uint32_t> other;
  for (std::uint32_t g = 5; g < 11; ++g) {
    other.push_back(t.open(g, 2, g));
    REQUIRE(other.back() != none);
  }
  for (std::uint64_t id = 0; id < 40; ++id) CHECK(t.find(same, 1, id) == idx[id]);
  for (std::uint32_t g = 5; g < 11; ++g) CHECK(t.find(g, 2, g) == other[g - 5]);
  CHECK(t.find(same, 1, 40) == none);
  // Delete every third, then the rest from the far end.
  std::set<std::uint64_t> live;
  for (std::uint64_t id = 0; id < 40; ++id) live.insert(id);
  for (std::uint64_t id = 0; id < 40; id += 3) {
    t.free(idx[id]);
    live.erase(id);
    for (std::uint64_t k : live) REQUIRE(t.find(same, 1, k) == idx[k]);
    for (std::uint32_t g = 5; g < 11; ++g) REQUIRE(t.find(g, 2, g) == other[g - 5]);
  }
  while (!live.empty()) {
    const std::uint64_t id = *live.rbegin();
    t.free(idx[id]);
    live.erase(id);
    CHECK(t.find(same, 1, id) == none);
    for (std::uint64_t k : live) REQUIRE(t.find(same, 1, k) == idx[k]);
  }
  for (std::uint32_t g = 5; g < 11; ++g) CHECK(t.find(g, 2, g) == other[g - 5]);
  // The freed entries open again, under the same crowded hash.
  for (std::uint64_t id = 100; id < 140; ++id) CHECK(t.open(same, 1, id) != none);
  for (std::uint64_t id = 100; id < 140; ++id) CHECK(t.find(same, 1, id) != none);
}

TEST_CASE("a key hash is never 0, the index's empty slot") {
  // The mix of (0, 0) is 0: the key would match every empty slot without the correction.
  CHECK(key_hash(0, 0) != 0);
  message_table t;
  t.init(8, 0, 64);
  const std::uint32_t a = open_msg(t, 0, 0);
  REQUIRE(a != none);
  CHECK(find_msg(t, 0, 0) == a);
  CHECK(find_msg(t, 0, 1) == none);
}

TEST_CASE("the reorder window accepts each sequence number once and slides over the received prefix") {
  message_table t;
  t.init(4, 4, 100);  // rounded up to 128 packets
  CHECK(t.window() == 128);
  const std::uint32_t m = open_msg(t, 0, 9);
  CHECK(offer(t, m, 0) == seq_verdict::in_order);
  CHECK(offer(t, m, 2) == seq_verdict::accept);
  CHECK(offer(t, m, 2) == seq_verdict::duplicate);
  CHECK(t[m].base == 1);
  CHECK(offer(t, m, 1) == seq_verdict::accept);
  CHECK(t[m].base == 3);  // 1 filled the gap: the window slid over 2 as well
  CHECK(offer(t, m, 0) == seq_verdict::duplicate);
  CHECK(offer(t, m, 3 + 128) == seq_verdict::out_of_window);
  CHECK(offer(t, m, 3 + 127) == seq_verdict::accept);
  CHECK(offer(t, m, 5, true) == seq_verdict::bad_sequence);  // an end before a later packet
  CHECK(offer(t, m, 200, true) == seq_verdict::out_of_window);
}

TEST_CASE("after the end packet, sequence numbers at or past the packet count are bad") {
  message_table t;
  t.init(1, 0, 64);
  const std::uint32_t m = open_msg(t, 0, 1);
  CHECK(offer(t, m, 3, true) == seq_verdict::accept);
  CHECK(t[m].eom_seen);
  CHECK(t[m].packet_count == 4);
  CHECK(offer(t, m, 4) == seq_verdict::bad_sequence);
  CHECK(offer(t, m, 0) == seq_verdict::accept);  // in order, but a packet is ahead: the bitmap is used
  CHECK(offer(t, m, 1) == seq_verdict::accept);
  CHECK(offer(t, m, 2) == seq_verdict::accept);
  CHECK(t[m].base == 4);
}

TEST_CASE("an entry reused after an out-of-order message opens with a clean window") {
  message_table t;
  t.init(1, 0, 64);
  std::uint32_t m = open_msg(t, 0, 1);
  CHECK(offer(t, m, 5) == seq_verdict::accept);  // bit 5 set, base 0
  t.settle(m);
  m = open_msg(t, 0, 2);
  REQUIRE(m != none);
  for (std::uint32_t s = 0; s < 8; ++s) CHECK(offer(t, m, s) == seq_verdict::in_order);
}

TEST_CASE("HPUs are chosen from the key hash without division and cover every HPU") {
  std::set<std::uint32_t> seen;
  for (std::uint64_t id = 0; id < 1000; ++id) {
    const std::uint32_t h = hpu_of_hash(key_hash(3, id), 5);
    CHECK(h < 5);
    seen.insert(h);
  }
  CHECK(seen.size() == 5);
  CHECK(hpu_of_hash(0xffffffffu, 1) == 0);
}

} // TEST_SUITE
