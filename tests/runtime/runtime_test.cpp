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

rt::ec_config order_ec(std::uint64_t mb = 7) {
  rt::ec_config c{.name = "order",
                  .match = {.bits = mb},
                  .handlers = {order_hh, order_ph, order_ch},
                  .handler_mem_bytes = per_msg + 8 * 1024,
                  .scratchpad_bytes = 16,
                  .limits = {.max_messages = 256}};
  return c;
}

// Handlers whose return codes the test sets in handler memory (u64 words): [0] header code,
// [1] payload code, [2] completion code; they count calls in [3] header, [4] payload,
// [5] completion.
SPIN_HEADER_HANDLER(code_hh) {
  ctx->fetch_add<u64>(24, 1);
  return static_cast<ret>(*ctx->mem<u64>(0));
}
SPIN_PAYLOAD_HANDLER(code_ph) {
  ctx->fetch_add<u64>(32, 1);
  return static_cast<ret>(*ctx->mem<u64>(8));
}
SPIN_COMPLETION_HANDLER(code_ch) {
  ctx->fetch_add<u64>(40, 1);
  return static_cast<ret>(*ctx->mem<u64>(16));
}

// Handlers that check run-to-completion's placement: every handler of a message runs on the HPU
// that owns it (the one its header handler ran on, scratchpad word 0 = HPU + 1) and on the
// thread that drives that HPU (driver_of). Handler memory as for the ordering tests.
std::thread::id driver_of[3];

SPIN_HEADER_HANDLER(placed_hh) {
  ctx->fetch_add<u64>(header_calls, 1);
  u64* s = ctx->scratchpad<u64>(0);
  if (s == nullptr || *s != 0 || std::this_thread::get_id() != driver_of[ctx->hpu]) ctx->fetch_add<u64>(violations, 1);
  *s = ctx->hpu + 1;
  return ret::success;
}
SPIN_PAYLOAD_HANDLER(placed_ph) {
  ctx->fetch_add<u64>(payload_calls, 1);
  u64* s = ctx->scratchpad<u64>(0, 2);
  if (s == nullptr || s[0] != ctx->hpu + 1 || std::this_thread::get_id() != driver_of[ctx->hpu])
    ctx->fetch_add<u64>(violations, 1);
  for (u64 i = 0; i < ctx->packet.size(); ++i)
    if (ctx->packet.data[i] != static_cast<u8>(pattern(ctx->msg.source_rank, ctx->msg.message_id, ctx->msg.offset_bytes + i)))
      ctx->fetch_add<u64>(violations, 1);
  s[1] += 1;  // no atomics: one HPU runs the message's handlers one after another
  return ret::success;
}
SPIN_COMPLETION_HANDLER(placed_ch) {
  u64* s = ctx->scratchpad<u64>(0, 2);
  if (s == nullptr || s[0] != ctx->hpu + 1 || s[1] != ctx->msg.packet_count ||
      std::this_thread::get_id() != driver_of[ctx->hpu])
    ctx->fetch_add<u64>(violations, 1);
  ctx->fetch_add<u64>(completions, 1);
  ctx->fetch_add<u64>(per_msg + 8 * (ctx->msg.message_id % 1024), 1);
  return ret::success;
}

// Records the scratchpad's first word as it finds it (handler memory word per message id), then
// marks it.
SPIN_PAYLOAD_HANDLER(scratch_seen_ph) {
  u64* w = ctx->scratchpad<u64>(0);
  if (w == nullptr) return ret::drop;
  *ctx->mem<u64>(8 * (ctx->msg.message_id % 8)) = *w;
  *w = 0xabcd;
  return ret::success;
}

struct code_test {
  fixture f{1};
  rt::ec_id ec;
  explicit code_test(std::int64_t h, std::int64_t p, std::int64_t c, bool with_header = true,
                     std::uint32_t retired_history = 1024) {
    rt::ec_config cfg;
    cfg.limits.retired_history = retired_history;
    cfg.name = "codes";
    cfg.handlers = {with_header ? code_hh : nullptr, code_ph, code_ch};
    cfg.handler_mem_bytes = 64;
    cfg.scratchpad_bytes = 8;
    ec = f.install(cfg);
    auto m = f.rt->handler_memory(ec);
    const std::int64_t codes[3] = {h, p, c};
    std::memcpy(m.data(), codes, sizeof codes);
  }
  std::uint64_t header_calls() { return f.word(ec, 24); }
  std::uint64_t payload_calls() { return f.word(ec, 32); }
  std::uint64_t completion_calls() { return f.word(ec, 40); }
};

} // namespace

TEST_SUITE("runtime") {

TEST_CASE("a header handler returning drop discards the whole message: no payload or completion handler runs") {
  code_test t(static_cast<int>(ret::drop), 0, 0);
  auto p = message_packets(t.f.pool, 0, 1, 1, 4000, 500);
  std::reverse(p.begin() + 1, p.end());
  REQUIRE(feed(*t.f.rt, p));
  CHECK(t.header_calls() == 1);
  CHECK(t.payload_calls() == 0);
  CHECK(t.completion_calls() == 0);
  const auto s = t.f.ec_stats(t.ec);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::handler_drop)] == p.size());
  CHECK(s.messages_dropped == 1);
  CHECK(s.messages_completed == 0);
}

TEST_CASE("a header handler returning proceed skips every payload handler and the completion handler still runs once") {
  code_test t(static_cast<int>(ret::proceed), 0, 0);
  auto p = message_packets(t.f.pool, 0, 1, 1, 4000, 500);
  std::reverse(p.begin(), p.end());
  REQUIRE(feed(*t.f.rt, p));
  CHECK(t.payload_calls() == 0);
  CHECK(t.completion_calls() == 1);
  const auto s = t.f.ec_stats(t.ec);
  CHECK(s.packets_skipped == p.size());
  CHECK(s.messages_completed == 1);
  CHECK(s.total_drops() == 0);
}

TEST_CASE("a payload handler returning proceed skips the payload handlers of packets not yet started") {
  code_test t(0, static_cast<int>(ret::proceed), 0);
  auto p = message_packets(t.f.pool, 0, 1, 1, 4000, 500);
  REQUIRE(feed(*t.f.rt, std::span(p).first(1)));  // packet 0: header, then payload returns proceed
  REQUIRE(feed(*t.f.rt, std::span(p).subspan(1)));
  CHECK(t.payload_calls() == 1);
  CHECK(t.completion_calls() == 1);
  CHECK(t.f.ec_stats(t.ec).packets_skipped == p.size() - 1);
}

TEST_CASE("a payload handler returning proceed also skips payload handlers already queued behind it") {
  code_test t(0, static_cast<int>(ret::proceed), 0, /*with_header=*/false);
  auto p = message_packets(t.f.pool, 0, 1, 1, 50 * 10, 10);
  REQUIRE(feed(*t.f.rt, p, 64));  // one burst: all 50 queued on the single HPU at once
  CHECK(t.payload_calls() == 1);
  CHECK(t.completion_calls() == 1);
  CHECK(t.f.ec_stats(t.ec).packets_skipped == 49);
}

TEST_CASE("a payload handler returning drop drops only its packet and the message still completes") {
  code_test t(0, static_cast<int>(ret::drop), 0);
  auto p = message_packets(t.f.pool, 0, 1, 1, 4000, 500);
  REQUIRE(feed(*t.f.rt, p));
  CHECK(t.payload_calls() == p.size());
  CHECK(t.completion_calls() == 1);
  const auto s = t.f.ec_stats(t.ec);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::handler_drop)] == p.size());
  CHECK(s.messages_completed == 1);
}

TEST_CASE("a completion handler returning drop counts the message as dropped, not completed") {
  code_test t(0, 0, static_cast<int>(ret::drop));
  auto p = message_packets(t.f.pool, 0, 1, 1, 1000, 500);
  REQUIRE(feed(*t.f.rt, p));
  const auto s = t.f.ec_stats(t.ec);
  CHECK(t.completion_calls() == 1);
  CHECK(s.messages_dropped == 1);
  CHECK(s.messages_completed == 0);
}

TEST_CASE("a pending return keeps the message entry until the host releases it, so late duplicates never rerun it") {
  code_test t(0, 0, static_cast<int>(ret::success_pending), true, /*retired_history=*/2);
  REQUIRE(feed(*t.f.rt, message_packets(t.f.pool, 0, 1, 1, 1000, 500)));  // held
  std::memset(t.f.rt->handler_memory(t.ec).data() + 16, 0, 8);           // later completions: success
  for (std::uint64_t m = 2; m <= 6; ++m) REQUIRE(feed(*t.f.rt, message_packets(t.f.pool, 0, 1, m, 1000, 500)));
  CHECK(t.completion_calls() == 6);
  // Message 1 is held: a full retransmission is recognised as duplicate.
  REQUIRE(feed(*t.f.rt, message_packets(t.f.pool, 0, 1, 1, 1000, 500)));
  CHECK(t.completion_calls() == 6);
  CHECK(t.f.drops(t.ec, rt::drop_reason::duplicate) == 2);
  // Message 2 was not pending and has left the 2-entry history: it runs as a new message.
  REQUIRE(feed(*t.f.rt, message_packets(t.f.pool, 0, 1, 2, 1000, 500)));
  CHECK(t.completion_calls() == 7);
  CHECK(t.f.rt->release_message(t.ec, 1, 1).ok());
  const auto again = t.f.rt->release_message(t.ec, 1, 1);
  CHECK(again.err().code == errc::not_found);
  CHECK(t.f.rt->release_message(t.ec, 1, 99).err().code == errc::not_found);
}

TEST_CASE("a handler returning a value that is not a spin::ret is counted as bad_return and treated as drop") {
  code_test t(0, 42, 0);
  auto p = message_packets(t.f.pool, 0, 1, 1, 1000, 500);
  REQUIRE(feed(*t.f.rt, p));
  CHECK(t.f.drops(t.ec, rt::drop_reason::bad_return) == p.size());
  CHECK(t.completion_calls() == 1);
}


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
    CHECK(f.word(*ec, violations) == 0);
    CHECK(f.word(*ec, completions) == messages);
    CHECK(f.word(*ec, header_calls) == messages);
    CHECK(f.word(*ec, payload_calls) == payload_packets);
    for (int m = 0; m < messages; ++m) CHECK(f.word(*ec, per_msg + 8 * m) == 1);
    const auto s = f.rt->stats();
    CHECK(s.ecs.at(0).messages_completed == messages);
    CHECK(s.ecs.at(0).total_drops() == 0);
  }
}

TEST_CASE("packets of one message handed to any HPU all run on the HPU that owns it, on its driving thread, in order and once") {
  rt::runtime_config cfg;
  cfg.hpus = 3;
  cfg.inbox_packets = 16;  // small: steering meets back-pressure
  fixture f(cfg);
  rt::ec_config c = order_ec();
  c.handlers = {placed_hh, placed_ph, placed_ch};
  const rt::ec_id ec = f.install(c);
  constexpr std::uint64_t messages = 60;
  std::mt19937 rng(1234);
  // Each thread gets packets from every message, in a random order with duplicates, as if the
  // NIC's queues (or RSS with another hash) had spread them without regard for messages.
  std::vector<std::vector<rt::packet>> share(3);
  for (std::uint64_t m = 0; m < messages; ++m)
    for (const rt::packet& p : message_packets(f.pool, 7, static_cast<std::uint32_t>(m % 5), m, 6 * 64 - 10, 64)) {
      share[rng() % 3].push_back(p);
      if (rng() % 10 == 0) share[rng() % 3].push_back(message_packet(f.pool, 7, static_cast<std::uint32_t>(m % 5), m, 6 * 64 - 10, 64, 
                                                                     static_cast<std::uint32_t>(rng() % 6)));
    }
  for (auto& v : share) std::shuffle(v.begin(), v.end(), rng);
  std::atomic<int> fed{0}, ready{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (std::uint32_t h = 0; h < 3; ++h)
    threads.emplace_back([&, h] {
      driver_of[h] = std::this_thread::get_id();
      ready++;
      while (ready.load() < 3) std::this_thread::yield();
      const auto& mine = share[h];
      for (std::size_t i = 0; i < mine.size();) {
        const auto n = static_cast<std::uint32_t>(std::min<std::size_t>(8, mine.size() - i));
        const std::uint32_t got = f.rt->rx_burst(h, mine.data() + i, n);
        i += got;
        if (got < n) std::this_thread::yield();  // another HPU's inbox is full: it runs meanwhile
      }
      fed++;
      while (true) {
        const bool last = stop.load();
        if (f.rt->poll(h) == 0) {
          if (last) break;
          std::this_thread::yield();
        }
      }
    });
  while (fed.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stop = true;
  for (auto& t : threads) t.join();
  for (std::uint32_t h = 0; h < 3; ++h) CHECK_FALSE(f.rt->has_work(h));
  CHECK(f.word(ec, violations) == 0);
  CHECK(f.word(ec, header_calls) == messages);
  CHECK(f.word(ec, payload_calls) == messages * 6);
  CHECK(f.word(ec, completions) == messages);
  for (std::uint64_t m = 0; m < messages; ++m) CHECK(f.word(ec, per_msg + 8 * m) == 1);
  const auto s = f.rt->stats();
  std::uint64_t steered = 0;
  for (const auto& h : s.hpus) {
    CHECK(h.frames > 0);
    steered += h.steered;
  }
  CHECK(steered > 0);
  CHECK(s.ecs.at(0).messages_completed == messages);
}

TEST_CASE("a header packet arriving after all payload packets still runs first") {
  fixture f(2);
  auto ec = f.rt->install(order_ec());
  REQUIRE(ec.ok());
  auto p = message_packets(f.pool, 7, 1, 42, 4096, 512);
  std::reverse(p.begin(), p.end());  // end first, header last
  REQUIRE(feed(*f.rt, std::span(p).first(p.size() - 1)));
  CHECK(f.word(*ec, payload_calls) == 0);  // all parked
  CHECK(f.word(*ec, completions) == 0);
  REQUIRE(feed(*f.rt, std::span(p).last(1)));
  CHECK(f.word(*ec, violations) == 0);
  CHECK(f.word(*ec, payload_calls) == 8);
  CHECK(f.word(*ec, completions) == 1);
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
  CHECK(f.word(*ec, violations) == 0);
  CHECK(f.word(*ec, completions) == 20);
  for (int m = 0; m < 20; ++m) CHECK(f.word(*ec, per_msg + 8 * m) == 1);
  const auto s = f.rt->stats().ecs.at(0);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::duplicate)] == all.size() / 2);
  CHECK(s.packets_in == all.size() / 2);
}

TEST_CASE("message entries are reused with a clean reorder window, whether their packets came in order or not") {
  // Few entries, so that each is reused about 30 times; odd messages arrive last packet first
  // (every packet but one lands in the bitmap), even ones in order (the bitmap is not touched).
  fixture f(1);
  rt::ec_config c = order_ec();
  c.limits.max_messages = 4;
  c.limits.retired_history = 4;
  auto ec = f.rt->install(c);
  REQUIRE(ec.ok());
  constexpr int messages = 240;
  std::uint64_t packets = 0;
  for (int m = 0; m < messages; ++m) {
    auto p = message_packets(f.pool, 7, 3, m, 8 * 256, 256);
    if (m % 2) std::reverse(p.begin() + 1, p.end());  // header first, then payloads last to first
    packets += p.size();
    REQUIRE(feed(*f.rt, p));
  }
  // A repeat of the last message is a duplicate (it is in the retired history), whatever its order.
  auto again = message_packets(f.pool, 7, 3, messages - 1, 8 * 256, 256);
  std::reverse(again.begin(), again.end());
  REQUIRE(feed(*f.rt, again));
  INFO(rt::to_text(f.rt->stats()));
  CHECK(f.word(*ec, violations) == 0);
  CHECK(f.word(*ec, completions) == messages);
  const auto s = f.ec_stats(*ec);
  CHECK(s.packets_in == packets);
  CHECK(s.messages_completed == messages);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::duplicate)] == again.size());
  CHECK(s.total_drops() == again.size());
}

TEST_CASE("a reorder window that is not a power of two accepts exactly window_packets packets ahead of the oldest missing one") {
  // window_packets 192: the bitmap holds 256 bits per message, the window stays 192 packets.
  fixture f(1);
  rt::ec_config c = order_ec();
  c.limits.window_packets = 192;
  auto ec = f.rt->install(c);
  REQUIRE(ec.ok());
  constexpr std::uint32_t count = 600;
  auto p = message_packets(f.pool, 7, 3, 1, std::uint64_t{count} * 64, 64);
  REQUIRE(p.size() == count);
  // Before packet 0 arrives, packets 1..191 fit the window and 192 does not.
  const rt::packet early = message_packet(f.pool, 7, 3, 1, std::uint64_t{count} * 64, 64, 192);
  REQUIRE(feed(*f.rt, std::span(&early, 1)));
  CHECK(f.drops(*ec, rt::drop_reason::out_of_window) == 1);
  // Packet 0, then blocks of 150 packets, each block last to first: every packet lands within
  // 192 of the oldest missing one, and the window slides across the wrap point of the bitmap.
  std::vector<rt::packet> order;
  order.assign(1, p[0]);
  for (std::uint32_t lo = 1; lo < count; lo += 150) {
    const std::uint32_t hi = std::min(count, lo + 150);
    for (std::uint32_t k = hi; k-- > lo;) order.push_back(p[k]);
  }
  REQUIRE(order.size() == count);
  REQUIRE(feed(*f.rt, order));
  INFO(rt::to_text(f.rt->stats()));
  CHECK(f.word(*ec, violations) == 0);
  CHECK(f.word(*ec, completions) == 1);
  CHECK(f.word(*ec, payload_calls) == count);
  const auto s = f.ec_stats(*ec);
  CHECK(s.packets_in == count);
  CHECK(s.total_drops() == 1);
}

TEST_CASE("host memory can be unregistered once no EC's window lies in it, and its id is not reused") {
  fixture f(1);
  std::vector<std::byte> mem(4096);
  auto r = f.rt->register_host_memory(mem);
  REQUIRE(r.ok());
  rt::ec_config c{.name = "windowed", .match = {1, 0}, .window = rt::host_window{*r, 0, 4096}};
  const rt::ec_id ec = f.install(c);
  auto busy = f.rt->unregister_host_memory(*r);
  CHECK(busy.err().code == errc::bad_state);
  CHECK(busy.err().message.find("windowed") != std::string::npos);
  REQUIRE(f.rt->uninstall(ec).ok());
  CHECK(f.rt->unregister_host_memory(*r).ok());
  CHECK(f.rt->unregister_host_memory(*r).err().code == errc::not_found);
  CHECK(f.rt->unregister_host_memory(*r + 7).err().code == errc::not_found);
  // An EC cannot take a window in a region that is gone.
  auto again = f.rt->install(c);
  REQUIRE_FALSE(again.ok());
  CHECK(again.err().code == errc::not_found);
  auto next = f.rt->register_host_memory(mem);
  REQUIRE(next.ok());
  CHECK(*next != *r);
}

TEST_CASE("a scratchpad opens zeroed by default and keeps an earlier message's bytes when undefined is asked for") {
  for (const auto init : {rt::scratchpad_init::zeroed, rt::scratchpad_init::undefined}) {
    fixture f(1);
    rt::ec_config c{.handlers = rt::handler_set(nullptr, scratch_seen_ph, nullptr),
                    .handler_mem_bytes = 64,
                    .scratchpad_bytes = 64,
                    .scratchpad = init};
    c.limits.max_messages = 1;  // both messages use the one slot
    const rt::ec_id ec = f.install(c);
    REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 0, 1, 10, 10)));
    REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 0, 2, 10, 10)));
    CHECK(f.word(ec, 8) == 0);
    CHECK(f.word(ec, 16) == (init == rt::scratchpad_init::zeroed ? 0 : 0xabcd));
  }
}

TEST_CASE("the cycle counter's rate is measured once per process and is a plausible clock rate") {
  // The benchmarks turn busy_ns back into cycles with this rate: it must be the runtime's one
  // value, not a new measurement per call.
  const double ghz = spin::rt::cycle_counter_ghz();
  CHECK(ghz > 0.05);
  CHECK(ghz < 20.0);
  CHECK(spin::rt::cycle_counter_ghz() == ghz);
}

} // TEST_SUITE
