#include "test_util.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace spin::test {

rt::packet packet_pool::add(const rt::wire::header& h, std::span<const std::byte> payload, std::uint32_t dest_rank) {
  std::vector<std::byte> bytes(rt::wire::encoded_len(h, payload.size()));
  const std::size_t n = rt::wire::encode(rt::wire::rank_endpoint(h.source_rank), rt::wire::rank_endpoint(dest_rank), h,
                                         payload, bytes);
  bytes.resize(n);
  return add_raw(std::move(bytes));
}

rt::packet packet_pool::add_raw(std::vector<std::byte> bytes) {
  auto s = std::make_unique<slot>();
  s->bytes = std::move(bytes);
  rt::packet p{s->bytes.data(), static_cast<std::uint32_t>(s->bytes.size()), _slots.size()};
  _slots.push_back(std::move(s));
  return p;
}

void packet_pool::release(void* user, std::uint64_t cookie) noexcept {
  auto* pool = static_cast<packet_pool*>(user);
  pool->_slots[cookie]->releases.fetch_add(1, std::memory_order_relaxed);
}

std::size_t packet_pool::released_once() const {
  std::size_t n = 0;
  for (const auto& s : _slots) n += s->releases.load() == 1;
  return n;
}
std::size_t packet_pool::released_twice() const {
  std::size_t n = 0;
  for (const auto& s : _slots) n += s->releases.load() > 1;
  return n;
}
std::size_t packet_pool::unreleased() const {
  std::size_t n = 0;
  for (const auto& s : _slots) n += s->releases.load() == 0;
  return n;
}

rt::wire::header data_header(std::uint64_t match_bits, std::uint32_t source, std::uint64_t msg, std::uint32_t seq,
                             std::uint32_t count, std::uint64_t len, std::uint32_t pkt_bytes) {
  rt::wire::header h;
  h.source_rank = source;
  h.match_bits = match_bits;
  h.message_id = msg;
  h.seq = seq;
  h.message_len = len;
  h.offset = std::uint64_t{seq} * pkt_bytes;
  h.flags = rt::wire::position_flags(seq, count);
  return h;
}

std::byte pattern(std::uint32_t s, std::uint64_t m, std::uint64_t i) {
  return static_cast<std::byte>((s * 131 + m * 31 + i * 7 + (i >> 8)) & 0xff);
}

rt::packet message_packet(packet_pool& pool, std::uint64_t match_bits, std::uint32_t source, std::uint64_t msg,
                          std::uint64_t len, std::uint32_t pkt_bytes, std::uint32_t seq) {
  const std::uint32_t count = len == 0 ? 1 : static_cast<std::uint32_t>((len + pkt_bytes - 1) / pkt_bytes);
  const rt::wire::header h = data_header(match_bits, source, msg, seq, count, len, pkt_bytes);
  const std::uint64_t n = std::min<std::uint64_t>(pkt_bytes, len - h.offset);
  std::vector<std::byte> payload(n);
  for (std::uint64_t i = 0; i < n; ++i) payload[i] = pattern(source, msg, h.offset + i);
  return pool.add(h, payload);
}

std::vector<rt::packet> message_packets(packet_pool& pool, std::uint64_t match_bits, std::uint32_t source,
                                        std::uint64_t msg, std::uint64_t len, std::uint32_t pkt_bytes) {
  const std::uint32_t count = len == 0 ? 1 : static_cast<std::uint32_t>((len + pkt_bytes - 1) / pkt_bytes);
  std::vector<rt::packet> out;
  for (std::uint32_t k = 0; k < count; ++k) out.push_back(message_packet(pool, match_bits, source, msg, len, pkt_bytes, k));
  return out;
}

bool feed(rt::runtime& r, std::span<const rt::packet> pkts, std::uint32_t burst) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> drivers;
  for (std::uint32_t h = 1; h < r.hpus(); ++h)
    drivers.emplace_back([&r, &stop, h] {
      while (true) {
        const bool last = stop.load(std::memory_order_acquire);
        if (r.poll(h) == 0) {
          if (last) break;
          std::this_thread::yield();
        }
      }
    });
  std::size_t i = 0;
  bool ok = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (i < pkts.size()) {
    const auto n = static_cast<std::uint32_t>(std::min<std::size_t>(burst, pkts.size() - i));
    const std::uint32_t got = r.rx_burst(0, pkts.data() + i, n);
    i += got;
    if (got < n) {
      if (std::chrono::steady_clock::now() > deadline) {
        ok = false;
        break;
      }
      std::this_thread::yield();
    }
  }
  stop.store(true, std::memory_order_release);
  for (auto& t : drivers) t.join();
  r.drain();
  return ok;
}

void raise_flag(rt::runtime& r, rt::ec_id ec, std::uint64_t off) {
  auto m = r.handler_memory(ec);
  REQUIRE(off + 8 <= m.size());
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(m.data() + off)).store(1, std::memory_order_release);
}

fixture::fixture(std::uint32_t hpus, rt::transmitter* tx) {
  rt::runtime_config cfg;
  cfg.hpus = hpus;
  cfg.tx = tx;
  pool.attach(cfg);
  auto r = rt::runtime::create(cfg);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.err().message));
  rt = std::move(r.value());
}

fixture::fixture(rt::runtime_config cfg) {
  pool.attach(cfg);
  auto r = rt::runtime::create(cfg);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.err().message));
  rt = std::move(r.value());
}

fixture::~fixture() {
  rt.reset();
  CHECK(pool.unreleased() == 0);
  CHECK(pool.released_twice() == 0);
}

rt::ec_id fixture::install(const rt::ec_config& c) {
  auto r = rt->install(c);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.err().message));
  return *r;
}

rt::ec_id fixture::install(const rt::loaded_package& lp, rt::ec_config c) {
  auto b = lp.bind(c);
  REQUIRE_MESSAGE(b.ok(), (b.ok() ? std::string() : b.err().message));
  return install(c);
}

std::uint64_t fixture::word(rt::ec_id ec, std::uint64_t off) {
  std::uint64_t v = 0;
  auto m = rt->handler_memory(ec);
  REQUIRE(off + 8 <= m.size());
  std::memcpy(&v, m.data() + off, 8);
  return v;
}

rt::ec_stats fixture::ec_stats(rt::ec_id ec) {
  for (auto& e : rt->stats().ecs)
    if (e.ec_id == ec) return e;
  FAIL("no such EC");
  return {};
}

} // namespace spin::test
