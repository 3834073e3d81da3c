#include "test_util.hpp"

#include <spin/rt/runtime.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

using namespace spin;
using namespace spin::test;

namespace {

// ---- handlers used by the ordering tests -----------------------------------------------------
// Handler memory layout (u64 words): [0] order violations, [1] completions, [2] payload calls,
// [3] header calls, [8 + m] completions of message m.
// Scratchpad layout (u64 words): [0] header ran, [1] payload handlers finished.
constexpr std::uint64_t violations = 0, completions = 8, payload_calls = 16, header_calls = 24, per_msg = 64;

SPIN_HEADER_HANDLER(order_hh) {
  ctx->fetch_add<u64>(header_calls, 1);
  u64* ran = ctx->scratchpad<u64>(0);
  if (ran == nullptr || *ran != 0) ctx->fetch_add<u64>(violations, 1);
  __atomic_store_n(ran, 1, __ATOMIC_SEQ_CST);
  return ret::success;
}

SPIN_PAYLOAD_HANDLER(order_ph) {
  ctx->fetch_add<u64>(payload_calls, 1);
  u64* ran = ctx->scratchpad<u64>(0);
  if (ran == nullptr || __atomic_load_n(ran, __ATOMIC_SEQ_CST) != 1) ctx->fetch_add<u64>(violations, 1);
  // Check the payload bytes are the ones the sender put at this offset.
  for (u64 i = 0; i < ctx->packet.size(); ++i)
    if (ctx->packet.data[i] != static_cast<u8>(pattern(ctx->msg.source_rank, ctx->msg.message_id, ctx->msg.offset_bytes + i)))
      ctx->fetch_add<u64>(violations, 1);
  __atomic_fetch_add(ctx->scratchpad<u64>(8), 1, __ATOMIC_SEQ_CST);
  return ret::success;
}

SPIN_COMPLETION_HANDLER(order_ch) {
  u64* s = ctx->scratchpad<u64>(0, 2);
  const u64 expected_payload = ctx->msg.message_len_bytes == 0 ? 0 : ctx->msg.packet_count;
  if (s == nullptr || s[0] != 1 || s[1] != expected_payload) ctx->fetch_add<u64>(violations, 1);
  ctx->fetch_add<u64>(completions, 1);
  ctx->fetch_add<u64>(per_msg + 8 * (ctx->msg.message_id % 1024), 1);
  return ret::success;
}

u64 word(rt::runtime& r, rt::ec_id ec, std::uint64_t off) {
  u64 v;
  std::memcpy(&v, r.handler_memory(ec).data() + off, 8);
  return v;
}

struct fixture {
  packet_pool pool;
  std::unique_ptr<rt::runtime> rt;
  explicit fixture(std::uint32_t hpus = 2, rt::tx_port* tx = nullptr) {
    rt::runtime_config cfg;
    cfg.hpus = hpus;
    cfg.tx = tx;
    pool.attach(cfg);
    auto r = rt::runtime::create(cfg);
    REQUIRE_MESSAGE(r.ok(), r.err().message);
    rt = std::move(r.value());
  }
  ~fixture() {
    rt.reset();
    CHECK(pool.unreleased() == 0);
    CHECK(pool.released_twice() == 0);
  }
};

rt::ec_config order_ec(std::uint64_t mb = 7) {
  rt::ec_config c;
  c.name = "order";
  c.match.bits = mb;
  c.handlers = {order_hh, order_ph, order_ch};
  c.handler_mem_bytes = per_msg + 8 * 1024;
  c.scratchpad_bytes = 16;
  c.limits.max_messages = 256;
  return c;
}

} // namespace

TEST_SUITE("runtime") {

TEST_CASE("payload handlers never start before the header handler returns, under random packet orders") {
  for (std::uint32_t hpus : {1u, 2u, 4u}) {
    fixture f(hpus);
    auto ec = f.rt->install(order_ec());
    REQUIRE(ec.ok());
    std::mt19937_64 rng(hpus * 7919);
    constexpr int messages = 200;
    std::vector<rt::packet> all;
    std::uint64_t payload_packets = 0;
    for (int m = 0; m < messages; ++m) {
      const std::uint64_t len = rng() % 6000;
      auto p = message_packets(f.pool, 7, static_cast<std::uint32_t>(m % 5), m, len, 512);
      payload_packets += len == 0 ? 0 : p.size();
      all.insert(all.end(), p.begin(), p.end());
    }
    // Interleave messages and reorder packets within a window of 64 (many messages in flight).
    for (std::size_t i = 0; i + 1 < all.size(); ++i) std::swap(all[i], all[i + rng() % std::min<std::size_t>(64, all.size() - i)]);
    REQUIRE(feed(*f.rt, all));
    INFO(rt::to_text(f.rt->stats()));
    CHECK(word(*f.rt, *ec, violations) == 0);
    CHECK(word(*f.rt, *ec, completions) == messages);
    CHECK(word(*f.rt, *ec, header_calls) == messages);
    CHECK(word(*f.rt, *ec, payload_calls) == payload_packets);
    for (int m = 0; m < messages; ++m) CHECK(word(*f.rt, *ec, per_msg + 8 * m) == 1);
    const auto s = f.rt->stats();
    CHECK(s.ecs.at(0).messages_completed == messages);
    CHECK(s.ecs.at(0).total_drops() == 0);
  }
}

TEST_CASE("a header packet arriving after all payload packets still runs first") {
  fixture f(2);
  auto ec = f.rt->install(order_ec());
  REQUIRE(ec.ok());
  auto p = message_packets(f.pool, 7, 1, 42, 4096, 512);
  std::reverse(p.begin(), p.end());  // end first, header last
  REQUIRE(f.rt->rx_burst(p.data(), static_cast<std::uint32_t>(p.size() - 1)) == p.size() - 1);
  REQUIRE(f.rt->drain());
  CHECK(word(*f.rt, *ec, payload_calls) == 0);  // all parked
  CHECK(word(*f.rt, *ec, completions) == 0);
  REQUIRE(f.rt->rx_burst(&p.back(), 1) == 1);
  REQUIRE(f.rt->drain());
  CHECK(word(*f.rt, *ec, violations) == 0);
  CHECK(word(*f.rt, *ec, payload_calls) == 8);
  CHECK(word(*f.rt, *ec, completions) == 1);
}

TEST_CASE("the completion handler runs exactly once even when every packet is duplicated") {
  fixture f(2);
  auto ec = f.rt->install(order_ec());
  REQUIRE(ec.ok());
  std::vector<rt::packet> all;
  for (int m = 0; m < 20; ++m) {
    auto p = message_packets(f.pool, 7, 3, m, 3000, 256);
    auto q = message_packets(f.pool, 7, 3, m, 3000, 256);  // identical copies
    all.insert(all.end(), p.begin(), p.end());
    all.insert(all.end(), q.begin(), q.end());
  }
  std::mt19937 rng(5);
  std::shuffle(all.begin(), all.end(), rng);
  REQUIRE(feed(*f.rt, all));
  CHECK(word(*f.rt, *ec, violations) == 0);
  CHECK(word(*f.rt, *ec, completions) == 20);
  for (int m = 0; m < 20; ++m) CHECK(word(*f.rt, *ec, per_msg + 8 * m) == 1);
  const auto s = f.rt->stats().ecs.at(0);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::duplicate)] == all.size() / 2);
  CHECK(s.packets_in == all.size() / 2);
}

} // TEST_SUITE
