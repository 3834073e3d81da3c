// The handler budget: over-budget handlers are stopped or reported, never hang the NIC.
#include "test_util.hpp"

#include <spin/rt/runtime.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

using namespace spin;
using namespace spin::test;

namespace {

// Message 1, packet 1 never finishes on its own; it keeps calling the API (lock/unlock), so it
// can be stopped at an API call even where signals are deferred (ThreadSanitizer).
SPIN_PAYLOAD_HANDLER(stuck_in_api_ph) {
  if (ctx->msg.message_id == 1 && ctx->msg.packet_index == 1)
    for (;;) {
      ctx->lock(8);
      ctx->unlock(8);
    }
  if (ctx->lock(8) != errc::ok) return ret::drop;  // the stopped handler's lock must be free again
  if (ctx->msg.message_id != 1) ctx->fetch_add<u64>(0, 1);
  ctx->unlock(8);
  return ret::success;
}

// Spins without any API call until the test raises the flag at handler memory offset 8.
SPIN_PAYLOAD_HANDLER(spin_until_flag_ph) {
  while (__atomic_load_n(ctx->mem<u64>(8), __ATOMIC_ACQUIRE) == 0) {
  }
  ctx->fetch_add<u64>(0, 1);
  return ret::success;
}

// Spins forever without any API call: only the preemption signal can stop it.
SPIN_PAYLOAD_HANDLER(pure_loop_ph) {
  if (ctx->msg.message_id == 1)
    for (;;) __atomic_fetch_add(ctx->mem<u64>(16), 1, __ATOMIC_RELAXED);
  ctx->fetch_add<u64>(0, 1);
  return ret::success;
}

SPIN_COMPLETION_HANDLER(count_ch) {
  ctx->fetch_add<u64>(24, 1);
  return ret::success;
}

rt::ec_config budget_ec(handler_fn payload) {
  rt::ec_config c{.name = "budget",
                  .handlers = rt::handler_set(nullptr, payload, count_ch),
                  .handler_mem_bytes = 64,
                  .limits = {.handler_budget = std::chrono::milliseconds(5)}};
  return c;
}

// Messages 0 .. count-1 of 4 packets of 100 bytes from source 1, all fed at once.
bool feed_messages(fixture& f, std::uint64_t count) {
  std::vector<rt::packet> all;
  for (std::uint64_t m = 0; m < count; ++m) {
    auto p = message_packets(f.pool, 0, 1, m, 4 * 100, 100);
    all.insert(all.end(), p.begin(), p.end());
  }
  return feed(*f.rt, all);
}

std::vector<rt::host_event> errors(rt::runtime& r, rt::ec_id ec) {
  std::vector<rt::host_event> ev(64), out;
  const std::size_t n = r.poll_events(ec, ev);
  for (std::size_t i = 0; i < n; ++i)
    if (ev[i].type == rt::host_event::kind::error) out.push_back(ev[i]);
  return out;
}

} // namespace

TEST_SUITE("runtime") {

TEST_CASE("a handler stuck past its budget is stopped, reported, and its message aborted while other messages complete") {
  fixture f(2);
  const rt::ec_id ec = f.install(budget_ec(stuck_in_api_ph));
  REQUIRE(feed_messages(f, 4));
  const auto ev = errors(*f.rt, ec);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].code == errc::aborted);
  CHECK(ev[0].message_id == 1);
  CHECK(ev[0].value == static_cast<std::uint64_t>(handler_kind::payload));
  const auto s = f.ec_stats(ec);
  CHECK(s.kinds[static_cast<std::size_t>(handler_kind::payload)].over_budget == 1);
  CHECK(s.messages_aborted == 1);
  CHECK(s.messages_completed == 3);
  CHECK(f.word(ec, 24) == 3);  // no completion handler for the aborted message
  CHECK(f.word(ec, 0) == 12);  // every payload handler of the other messages ran
  CHECK(f.word(ec, 8) == 0);   // the lock the stopped handler held is free
  CHECK(f.ec_stats(ec).api_errors == 0);
  // A retransmission of the aborted message is refused as such.
  const std::uint64_t before = f.drops(ec, rt::drop_reason::message_aborted);
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 1, 1, 4 * 100, 100)));
  CHECK(f.drops(ec, rt::drop_reason::message_aborted) == before + 4);
}

TEST_CASE("an idle NIC's watchdog dozes: about ten wake-ups a second, not a thousand") {
  // It ticks every millisecond while handlers run, and dozes after 64 quiet ticks. It once
  // woke for 64 more ticks after every doze (about 400 wake-ups a second per NIC: most of an
  // idle cluster's CPU).
  fixture f(2);
  const rt::ec_id ec = f.install(budget_ec(spin_until_flag_ph));
  std::memcpy(f.rt->handler_memory(ec).data() + 8, "\x01", 1);  // the handler returns at once
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 1, 7, 100, 100)));  // one invocation: ticking
  CHECK(f.word(ec, 0) == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // 64 quiet ticks, then dozing
  const std::uint64_t before = f.rt->stats().watchdog_wakeups;
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const std::uint64_t woke = f.rt->stats().watchdog_wakeups - before;
  MESSAGE("idle watchdog: " << woke << " wake-ups in one second");
  CHECK(woke <= 20);
  // An invocation makes it tick again (64 ticks of 1 ms before it dozes again; dozing alone
  // would wake about 20 times in the 2 s allowed here).
  const std::uint64_t dozing = f.rt->stats().watchdog_wakeups;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 1, 8, 100, 100)));
  while (f.rt->stats().watchdog_wakeups < dozing + 50 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(f.rt->stats().watchdog_wakeups >= dozing + 50);
}

TEST_CASE("one watchdog thread serves every runtime of the process, and stops each one's over-budget handler") {
  // A thread per runtime woke each of them every millisecond while handlers ran: 17 runtimes
  // of a 16-host cluster took 17,000 wake-ups (context switches) a second.
  auto threads = [] {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
    return n;
  };
  std::vector<std::unique_ptr<fixture>> nics;
  nics.push_back(std::make_unique<fixture>(2));
  const std::size_t with_one = threads();
  for (int i = 0; i < 7; ++i) nics.push_back(std::make_unique<fixture>(2));
  CHECK(threads() == with_one);
  for (std::size_t i : {std::size_t{0}, std::size_t{4}, std::size_t{7}}) {
    fixture& f = *nics[i];
    const rt::ec_id ec = f.install(budget_ec(stuck_in_api_ph));
    REQUIRE(feed_messages(f, 2));
    const auto ev = errors(*f.rt, ec);
    REQUIRE(ev.size() == 1);
    CHECK(ev[0].code == errc::aborted);
    CHECK(ev[0].message_id == 1);
    CHECK(f.ec_stats(ec).messages_completed == 1);
  }
  // The last runtime to go stops the thread; a new one starts it again and is served.
  nics.clear();
  fixture again(2);
  const rt::ec_id ec = again.install(budget_ec(stuck_in_api_ph));
  REQUIRE(feed(*again.rt, message_packets(again.pool, 0, 1, 1, 4 * 100, 100)));
  const auto ev = errors(*again.rt, ec);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].code == errc::aborted);
}

TEST_CASE("payload handlers of an aborted message that are queued but not started are skipped") {
  rt::runtime_config cfg;
  cfg.hpus = 1;
  fixture f(cfg);
  const rt::ec_id ec = f.install(budget_ec(stuck_in_api_ph));
  auto p = message_packets(f.pool, 0, 1, 1, 50 * 8, 8);  // message 1, packet 1 never returns
  REQUIRE(feed(*f.rt, p, 64));
  const auto s = f.ec_stats(ec);
  CHECK(s.kinds[static_cast<std::size_t>(handler_kind::payload)].invocations == 2);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::message_aborted)] == 48);
  CHECK(s.messages_aborted == 1);
}

TEST_CASE("an over-budget handler that returns on its own is still reported when preemption is off") {
  rt::runtime_config cfg;
  cfg.hpus = 1;
  cfg.preempt = false;
  fixture f(cfg);
  const rt::ec_id ec = f.install(budget_ec(spin_until_flag_ph));
  auto p = message_packets(f.pool, 0, 0, 3, 100, 100);
  // The handler runs on the thread that drives its HPU (run to completion) until the flag rises.
  std::uint32_t got = 0;
  std::thread hpu([&] { got = f.rt->rx_burst(0, p.data(), 1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  raise_flag(*f.rt, ec, 8);
  hpu.join();
  REQUIRE(got == 1);
  const auto ev = errors(*f.rt, ec);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].message_id == 3);
  CHECK(f.ec_stats(ec).messages_aborted == 1);
  CHECK(f.word(ec, 24) == 0);
}

TEST_CASE("a handler spinning without any API call is preempted by the watchdog") {
#if defined(SPIN_TSAN)
  MESSAGE("skipped: ThreadSanitizer defers asynchronous signals, so preemption is off in this build");
#else
  fixture f(1);
  const rt::ec_id ec = f.install(budget_ec(pure_loop_ph));
  std::vector<rt::packet> all = message_packets(f.pool, 0, 0, 1, 100, 100);
  auto more = message_packets(f.pool, 0, 0, 2, 300, 100);
  all.insert(all.end(), more.begin(), more.end());
  REQUIRE(feed(*f.rt, all));
  CHECK(errors(*f.rt, ec).size() == 1);
  CHECK(f.rt->stats().hpus.at(0).preempted == 1);
  CHECK(f.word(ec, 0) == 3);  // the single HPU went on with message 2
  CHECK(f.word(ec, 16) > 0);
  CHECK(f.ec_stats(ec).messages_aborted == 1);
#endif
}

} // TEST_SUITE
