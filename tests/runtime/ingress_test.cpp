// Ingress: matching, message table limits, every drop reason, back-pressure, EC life cycle.
#include "test_util.hpp"

#include <spin/rt/runtime.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

using namespace spin;
using namespace spin::test;

namespace {

SPIN_HEADER_HANDLER(count_hh) {
  ctx->fetch_add<u64>(0, 1);
  return ret::success;
}
SPIN_PAYLOAD_HANDLER(count_ph) {
  ctx->fetch_add<u64>(8, 1);
  return ret::success;
}
rt::ec_config counting_ec(std::uint64_t bits = 0, bool header = true) {
  rt::ec_config c{.name = "count",
                  .match = {.bits = bits},
                  .handlers = rt::handler_set(header ? count_hh : nullptr, count_ph, nullptr),
                  .handler_mem_bytes = 64};
  return c;
}

} // namespace

TEST_SUITE("runtime") {

TEST_CASE("packets go to the first installed EC whose match rule accepts their match bits") {
  fixture f(1);
  rt::ec_config wide = counting_ec(0x100, false);
  wide.match.ignore_mask = 0xff;  // matches 0x100..0x1ff
  const rt::ec_id a = f.install(counting_ec(0x105, false));
  const rt::ec_id b = f.install(wide);
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0x105, 0, 1, 10, 10)));
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0x1ab, 0, 1, 10, 10)));
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0x200, 0, 1, 10, 10)));
  CHECK(f.word(a, 8) == 1);
  CHECK(f.word(b, 8) == 1);
  CHECK(f.rt->stats().unknown_ec == 1);
}

TEST_CASE("packets that break the message's sequence rules are dropped, each under its reason") {
  fixture f(1);
  rt::ec_config c = counting_ec(0, false);
  c.limits.window_packets = 64;
  const rt::ec_id ec = f.install(c);
  auto hdr = [](std::uint32_t seq, std::uint32_t count, std::uint64_t len) { return data_header(0, 1, 5, seq, count, len, 10); };
  std::vector<std::byte> ten(10);
  std::vector<rt::packet> p;
  p.push_back(f.pool.add(hdr(0, 100, 1000), ten));   // accepted
  p.push_back(f.pool.add(hdr(65, 100, 1000), ten));  // window is [1, 65): out_of_window
  p.push_back(f.pool.add(hdr(1, 100, 2000), ten));   // message length changed: inconsistent
  p.push_back(f.pool.add(hdr(0, 100, 1000), ten));   // duplicate
  auto end = hdr(9, 10, 100);                         // end packet claims 10 packets of a 1000-byte message
  end.message_len = 1000;
  end.offset = 990;
  p.push_back(f.pool.add(end, ten));                  // accepted, fixes packet_count = 10
  p.push_back(f.pool.add(hdr(12, 100, 1000), ten));  // past the end: bad_sequence
  auto other = data_header(0, 1, 6, 0, 1, 10, 10);
  other.type = rt::wire::packet_type::ack;
  p.push_back(f.pool.add(other, ten));               // not_data
  REQUIRE(feed(*f.rt, p));
  const auto s = f.ec_stats(ec);
  CHECK(s.packets_in == 2);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::out_of_window)] == 1);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::inconsistent)] == 1);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::duplicate)] == 1);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::bad_sequence)] == 1);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::not_data)] == 1);
  CHECK(s.total_drops() == 5);
}

TEST_CASE("an EC with all message slots open drops packets of new messages as no_message_slot") {
  fixture f(1);
  rt::ec_config c = counting_ec(0, false);
  c.limits.max_messages = 2;
  const rt::ec_id ec = f.install(c);
  std::vector<rt::packet> p;
  for (std::uint64_t m = 0; m < 3; ++m) p.push_back(message_packet(f.pool, 0, 0, m, 100, 10, 0));  // incomplete
  REQUIRE(feed(*f.rt, p));
  CHECK(f.drops(ec, rt::drop_reason::no_message_slot) == 1);
  // Completing message 0 frees its slot for message 3.
  std::vector<rt::packet> m0;
  for (std::uint32_t k = 1; k < 10; ++k) m0.push_back(message_packet(f.pool, 0, 0, 0, 100, 10, k));
  REQUIRE(feed(*f.rt, m0));
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 0, 3, 10, 10)));
  CHECK(f.ec_stats(ec).messages_completed == 2);
  CHECK(f.drops(ec, rt::drop_reason::no_message_slot) == 1);
}

TEST_CASE("payload packets waiting for their header are dropped as parking_full once the EC's parking is used up") {
  fixture f(1);
  rt::ec_config c = counting_ec();
  c.limits.max_parked_packets = 3;
  const rt::ec_id ec = f.install(c);
  auto p = message_packets(f.pool, 0, 0, 1, 60, 10);  // 6 packets
  REQUIRE(feed(*f.rt, std::span(p).subspan(1)));      // 5 payload packets, no header yet
  CHECK(f.drops(ec, rt::drop_reason::parking_full) == 2);
  CHECK(f.word(ec, 8) == 0);
  REQUIRE(feed(*f.rt, std::span(p).first(1)));
  CHECK(f.word(ec, 0) == 1);
  CHECK(f.word(ec, 8) == 4);  // header packet + 3 parked
  // The dropped packets were not marked received: their retransmission completes the message.
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 0, 1, 60, 10)));
  CHECK(f.word(ec, 8) == 6);
  CHECK(f.ec_stats(ec).messages_completed == 1);
}

TEST_CASE("a packet that finds no parking space does not open a message it could never complete") {
  fixture f(1);
  rt::ec_config c = counting_ec();
  c.limits.max_parked_packets = 1;
  c.limits.max_messages = 2;
  const rt::ec_id ec = f.install(c);
  // Message 1's second packet takes the only parking place; packets of messages 2 and 3 find
  // none and must not take the two message slots.
  std::vector<rt::packet> p{message_packet(f.pool, 0, 0, 1, 20, 10, 1), message_packet(f.pool, 0, 0, 2, 20, 10, 1),
                            message_packet(f.pool, 0, 0, 3, 20, 10, 1)};
  REQUIRE(feed(*f.rt, p));
  CHECK(f.drops(ec, rt::drop_reason::parking_full) == 2);
  CHECK(f.ec_stats(ec).messages_started == 1);
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 0, 4, 10, 10)));  // a second slot is still free
  CHECK(f.ec_stats(ec).messages_completed == 1);
  CHECK(f.drops(ec, rt::drop_reason::no_message_slot) == 0);
}

TEST_CASE("HPUs opening and settling messages at once share max_messages exactly and lose no slot") {
  rt::runtime_config cfg;
  cfg.hpus = 2;
  fixture f(cfg);
  rt::ec_config c = counting_ec(0, false);
  c.limits.max_messages = 8;
  c.limits.retired_history = 64;
  const rt::ec_id ec = f.install(c);
  std::vector<rt::packet> p;
  for (std::uint64_t m = 0; m < 60000; ++m) p.push_back(message_packet(f.pool, 0, static_cast<std::uint32_t>(m % 3), m, 10, 10, 0));
  REQUIRE(feed(*f.rt, p));  // both HPUs open and settle one-packet messages concurrently
  CHECK(f.drops(ec, rt::drop_reason::no_message_slot) == 0);
  // Every slot is back: 8 messages that stay open (their second packet never comes) fit, a
  // ninth does not, whichever HPU owns them.
  std::vector<rt::packet> open;
  for (std::uint64_t m = 0; m < 9; ++m) open.push_back(message_packet(f.pool, 0, 7, 100000 + m, 20, 10, 0));
  REQUIRE(feed(*f.rt, open));
  CHECK(f.ec_stats(ec).messages_started == 60000 + 8);
  CHECK(f.drops(ec, rt::drop_reason::no_message_slot) == 1);
}

TEST_CASE("rx_burst accepts fewer frames than offered only when the inbox of the HPU a frame belongs to is full") {
  rt::runtime_config cfg;
  cfg.hpus = 2;
  cfg.inbox_packets = 4;
  fixture f(cfg);
  const rt::ec_id ec = f.install(counting_ec(0, false));
  std::vector<rt::packet> p;
  for (std::uint64_t m = 0; m < 64; ++m) p.push_back(message_packet(f.pool, 0, 0, m, 10, 10, 0));
  // Nobody drives HPU 1: its inbox takes 4 frames, the fifth of HPU 1's stops the burst.
  std::uint32_t expect = 0, to_1 = 0;
  for (; expect < p.size(); ++expect) {
    if (f.rt->hpu_of(std::span<const std::byte>(p[expect].frame, p[expect].frame_len)) != 1) continue;
    if (++to_1 == 5) break;
  }
  REQUIRE(expect < p.size());
  const std::uint32_t got = f.rt->rx_burst(0, p.data(), static_cast<std::uint32_t>(p.size()));
  CHECK(got == expect);
  CHECK(f.rt->has_work(1));
  CHECK(f.rt->stats().hpus.at(0).steered == 4);
  CHECK(f.word(ec, 8) == expect - 4);  // HPU 0 ran its own frames at once
  CHECK(f.pool.unreleased() == p.size() - (expect - 4));  // the rest is in the inbox or still the caller's
  CHECK(f.rt->poll(1) == 4);
  CHECK_FALSE(f.rt->has_work(1));
  REQUIRE(feed(*f.rt, std::span(p).subspan(got)));
  CHECK(f.word(ec, 8) == 64);
}

TEST_CASE("uninstalling an EC returns its parked packets, frees its NIC memory and stops matching it") {
  fixture f(2);
  const std::uint64_t before = f.rt->stats().nic_mem_used_bytes;
  rt::ec_config c = counting_ec();
  c.handler_mem_bytes = 4096;
  c.scratchpad_bytes = 256;
  const rt::ec_id ec = f.install(c);
  CHECK(f.rt->stats().nic_mem_used_bytes > before);
  auto p = message_packets(f.pool, 0, 0, 1, 100, 10);
  REQUIRE(feed(*f.rt, std::span(p).subspan(1)));  // parked behind the missing header
  REQUIRE(f.rt->uninstall(ec).ok());
  CHECK(f.pool.unreleased() == 1);  // only the header packet, not handed over yet
  CHECK(f.rt->stats().nic_mem_used_bytes == before);
  CHECK(f.rt->handler_memory(ec).empty());
  REQUIRE(feed(*f.rt, std::span(p).first(1)));
  CHECK(f.rt->stats().unknown_ec == 1);
  CHECK(f.rt->uninstall(ec).err().code == errc::not_found);
}

TEST_CASE("stats and events may be read from another thread while ECs come and go") {
  fixture f(2);
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    std::vector<rt::host_event> ev(8);
    while (!stop.load()) {
      const auto s = f.rt->stats();
      CHECK(s.nic_mem_used_bytes <= s.nic_mem_capacity_bytes);
      f.rt->poll_events(1, ev);
    }
  });
  for (int round = 0; round < 50; ++round) {
    rt::ec_config c = counting_ec();
    c.handler_mem_bytes = 4096;
    const rt::ec_id ec = f.install(c);
    REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 0, 1, 100, 10)));
    REQUIRE(f.rt->uninstall(ec).ok());
  }
  stop = true;
  reader.join();
  CHECK(f.rt->stats().nic_mem_used_bytes == 0);
}

TEST_CASE("install refuses limits past their maximum instead of failing to allocate, and takes no NIC memory") {
  fixture f(1);
  auto limit = [&](auto set) {
    rt::ec_config c = counting_ec();
    set(c.limits);
    const auto r = f.rt->install(c);
    CHECK(r.err().code == errc::invalid_argument);
    CHECK(f.rt->stats().nic_mem_used_bytes == 0);
  };
  limit([](rt::ec_limits& l) { l.max_parked_packets = UINT32_MAX; });
  limit([](rt::ec_limits& l) { l.window_packets = UINT32_MAX; });
  limit([](rt::ec_limits& l) { l.max_messages = UINT32_MAX; });
  limit([](rt::ec_limits& l) { l.retired_history = UINT32_MAX; });
  limit([](rt::ec_limits& l) { l.event_queue_depth = UINT32_MAX; });
  limit([](rt::ec_limits& l) { l.handler_budget = std::chrono::nanoseconds::max(); });
  rt::runtime_config cfg;
  cfg.inbox_packets = UINT32_MAX;
  CHECK(rt::runtime::create(cfg).err().code == errc::invalid_argument);
  cfg.inbox_packets = 256;
  cfg.dma.latency = std::chrono::hours(1);
  CHECK(rt::runtime::create(cfg).err().code == errc::invalid_argument);
}

TEST_CASE("install rejects bad windows, exhausted NIC memory and zero limits with a message, changing nothing") {
  rt::runtime_config cfg;
  cfg.nic_memory_bytes = 1 << 16;
  cfg.max_ecs = 2;
  fixture f(cfg);
  std::vector<std::byte> host(100);
  auto region = f.rt->register_host_memory(host);
  REQUIRE(region.ok());
  CHECK(f.rt->register_host_memory({}).err().code == errc::invalid_argument);

  rt::ec_config c = counting_ec();
  c.window = rt::host_window{*region, 50, 51};
  auto r = f.rt->install(c);
  CHECK(r.err().code == errc::invalid_argument);
  CHECK(r.err().message.find("exceeds region") != std::string::npos);
  c.window = rt::host_window{7, 0, 1};
  CHECK(f.rt->install(c).err().code == errc::not_found);
  c.window.reset();
  c.handler_mem_bytes = 1 << 20;
  r = f.rt->install(c);
  CHECK(r.err().code == errc::no_memory);
  CHECK(r.err().message.find("handler memory") != std::string::npos);
  c.handler_mem_bytes = 64;
  c.limits.max_messages = 0;
  CHECK(f.rt->install(c).err().code == errc::invalid_argument);
  c.limits.max_messages = 4;
  CHECK(f.rt->stats().nic_mem_used_bytes == 0);
  CHECK(f.rt->install(c).ok());
  CHECK(f.rt->install(c).ok());
  CHECK(f.rt->install(c).err().code == errc::no_space);
}

TEST_CASE("runtime creation rejects impossible configurations") {
  rt::runtime_config cfg;
  cfg.hpus = 0;
  CHECK(rt::runtime::create(cfg).err().code == errc::invalid_argument);
  cfg.hpus = 1;
  cfg.nic_memory_bytes = 0;
  CHECK(rt::runtime::create(cfg).err().code == errc::invalid_argument);
  cfg.nic_memory_bytes = 1 << 20;
  cfg.hpus = 257;
  CHECK(rt::runtime::create(cfg).err().code == errc::invalid_argument);
  cfg.hpus = 2;
  for (std::uint32_t depth : {0u, 65537u}) {
    cfg.inbox_packets = depth;
    const auto r = rt::runtime::create(cfg);
    CHECK(r.err().code == errc::invalid_argument);
    CHECK(r.err().message.find("inbox_packets") != std::string::npos);
  }
}

TEST_CASE("statistics print as text and as JSON with every drop reason and handler time percentiles") {
  fixture f(1);
  f.install(counting_ec());
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 0, 1, 100, 10)));
  const auto s = f.rt->stats();
  const std::string text = rt::to_text(s);
  INFO(text);
  // The EC's row: id 1, name, 10 packets; the payload handler's row: 10 calls.
  CHECK(text.find("\nEC  name   packets  bytes in") != std::string::npos);
  CHECK(text.find("\n 1  count       10") != std::string::npos);
  CHECK(text.find("\n 1  payload     10    100") != std::string::npos);
  const std::string json = rt::to_json(s);
  CHECK(json.find("\"no_message_slot\": 0") != std::string::npos);
  CHECK(json.find("\"p99_ns\"") != std::string::npos);
  CHECK(json.find("\"ip_checksum\": 0") != std::string::npos);
}

} // TEST_SUITE
