// The NIC data path on net_ring ports (rte_eth_from_rings) inside one process: host messages,
// handler sends, multi-segment frames, back-pressure, drop reasons and mbuf accounting.
#include <doctest/doctest.h>

#include <spin/emu/nic.hpp>
#include <spin/emu/pcap.hpp>
#include <spin/emu/port.hpp>
#include <spin/handler.hpp>
#include <spin/rt/wire.hpp>

#include "../common/this_packet.hpp"

#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace spin;
using namespace std::chrono_literals;

namespace {

SPIN_PAYLOAD_HANDLER(echo_ph) {
  return test::echo(ctx);  // each packet back to its sender as message id + 1000
}

SPIN_PAYLOAD_HANDLER(echo_next_ph) {
  return test::echo(ctx, 1);  // like echo_ph, with the next match bits: the answer goes to another EC
}

SPIN_COMPLETION_HANDLER(event_ch) {
  ctx->post_event(ctx->msg.message_id);
  return ret::success;
}

unsigned seq_no = 0;

// Two rings and two ports: a cable between NIC a (rank 0) and NIC b (rank 1).
struct cable {
  rte_ring* ab = nullptr;
  rte_ring* ba = nullptr;
  std::uint16_t port_a = 0, port_b = 0;
  explicit cable(unsigned size = 1024) {
    const std::string n = std::to_string(seq_no++);
    ab = rte_ring_create(("t_ab" + n).c_str(), size, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
    ba = rte_ring_create(("t_ba" + n).c_str(), size, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
    REQUIRE(ab != nullptr);
    REQUIRE(ba != nullptr);
    auto a = emu::port_from_rings("net_t_a" + n, ba, ab);
    auto b = emu::port_from_rings("net_t_b" + n, ab, ba);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    port_a = *a;
    port_b = *b;
  }
  // Frames still in the rings after both NICs are gone belong to freed pools: count them.
  ~cable() {
    rte_eth_dev_close(port_a);
    rte_eth_dev_close(port_b);
    rte_ring_free(ab);
    rte_ring_free(ba);
  }
};

emu::nic_config config(std::string name, std::uint32_t rank, std::uint16_t port, std::uint32_t hpus = 1) {
  emu::nic_config c;
  c.name = std::move(name);
  c.rank = rank;
  c.ports = {port};
  c.port.pool_mbufs = 2047;
  c.port.max_frame_bytes = 9216;
  c.runtime.hpus = hpus;
  c.runtime.nic_memory_bytes = 16 << 20;
  return c;
}

// Drives both NICs from a thread of its own, as spin-emu's lcore loop does; the test thread
// makes control calls meanwhile.
struct poller {
  std::atomic<bool> stop{false};
  std::thread th;
  poller(emu::nic& a, emu::nic& b) {
    th = std::thread([this, &a, &b] {
      while (!stop.load(std::memory_order_relaxed)) {
        a.poll();
        b.poll();
      }
    });
  }
  ~poller() {
    stop = true;
    th.join();
  }
};

// Waits for `n` events of EC `ec` (any thread may read events).
std::vector<rt::host_event> wait_events(emu::nic& n, rt::ec_id ec, std::size_t count, std::chrono::milliseconds limit = 5000ms) {
  std::vector<rt::host_event> out;
  const auto end = std::chrono::steady_clock::now() + limit;
  rt::host_event buf[16];
  while (out.size() < count && std::chrono::steady_clock::now() < end) {
    const std::size_t k = n.poll_events(ec, buf);
    out.insert(out.end(), buf, buf + k);
    if (k == 0) std::this_thread::sleep_for(100us);
  }
  return out;
}

// Takes every object from `r`, one dequeue at a time (as a consumer loop does).
// Fills a local array of mbuf pointers and enqueues it, as a producer loop does.
[[gnu::noinline]] unsigned fill_and_enqueue(rte_ring* r, std::uintptr_t first, unsigned n) {
  rte_mbuf* local[32];
  for (unsigned i = 0; i < n && i < 32; ++i) local[i] = reinterpret_cast<rte_mbuf*>(first + i);
  return rte_ring_sp_enqueue_burst(r, reinterpret_cast<void* const*>(local), n, nullptr);
}

// flatten: inline DPDK's ring code here as a hot consumer loop would get it.
[[gnu::flatten]] std::vector<rte_mbuf*> drain_ring(rte_ring* r) {
  std::vector<rte_mbuf*> out;
  void* p = nullptr;
  while (rte_ring_sc_dequeue(r, &p) == 0) out.push_back(static_cast<rte_mbuf*>(p));
  return out;
}

std::vector<std::byte> pattern_bytes(std::size_t n, unsigned salt) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + salt * 7 + (i >> 8)) & 0xff);
  return v;
}

// Forwards its packet back to its source, then to rank 2, and posts the sum of its payload's
// bytes read after both: the packet stays readable and unchanged after a forward.
SPIN_PAYLOAD_HANDLER(forward_twice_ph) {
  const errc a = ctx->forward(ctx->msg.source_rank);
  const errc b = ctx->forward(2);
  u64 sum = 0;
  for (u64 i = 0; i < ctx->packet.size(); ++i) sum += ctx->packet.data[i];
  ctx->post_event(sum);
  return a == errc::ok && b == errc::ok ? ret::success : ret::drop;
}

SPIN_PAYLOAD_HANDLER(forward_ph) {
  return ctx->forward(ctx->msg.source_rank) == errc::ok ? ret::success : ret::drop;
}

// Inverts the first byte of its packet and deposits the payload at its offset by DMA.
SPIN_PAYLOAD_HANDLER(flip_deposit_ph) {
  u8* first = ctx->payload<u8>(0);
  if (first == nullptr) return ret::drop;
  *first = static_cast<u8>(~*first);
  return ctx->dma_to_host(ctx->msg.offset_bytes, ctx->packet.data, ctx->packet.size()) == errc::ok ? ret::success : ret::drop;
}

// A message of `packets` packets of `payload` bytes from rank 0 to rank 1 (match bits
// `bits`), each packet's frame in one mbuf of `pool`; with `coll`, the collective extension.
struct test_message {
  std::vector<rt::wire::header> headers;
  std::vector<std::vector<std::byte>> payloads;
  std::vector<rte_mbuf*> frames;
};
test_message make_message(rte_mempool* pool, std::uint64_t bits, std::uint64_t id, std::uint32_t packets, std::uint32_t payload,
                          bool coll) {
  test_message t;
  for (std::uint32_t k = 0; k < packets; ++k) {
    rt::wire::header h;
    h.source_rank = 0;
    h.match_bits = bits;
    h.message_id = id;
    h.seq = k;
    h.message_len = std::uint64_t{packets} * payload;
    h.offset = std::uint64_t{k} * payload;
    h.flags = rt::wire::position_flags(k, packets);
    if (coll) {
      h.flags |= rt::wire::flag_coll;
      h.coll = rt::wire::coll_ext{3, 2, 7, payload / 4, 11, k};
    }
    std::vector<std::byte> data = pattern_bytes(payload, static_cast<unsigned>(id * 16 + k));
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    REQUIRE(m != nullptr);
    const std::size_t n = rt::wire::encode(rt::wire::rank_endpoint(0), rt::wire::rank_endpoint(1), h, data,
                                           std::span<std::byte>(rte_pktmbuf_mtod(m, std::byte*), rte_pktmbuf_tailroom(m)));
    REQUIRE(n > 0);
    (void)rte_pktmbuf_append(m, static_cast<std::uint16_t>(n));
    h.payload_len = payload;
    t.headers.push_back(h);
    t.payloads.push_back(std::move(data));
    t.frames.push_back(m);
  }
  return t;
}

// The frame NIC `from` sends when it forwards packet `h` with `payload` to `to`: what a copy
// would encode.
std::vector<std::byte> forwarded_frame(rt::wire::header h, std::span<const std::byte> payload, std::uint32_t from, std::uint32_t to) {
  h.source_rank = from;
  std::vector<std::byte> f(rt::wire::encoded_len(h, payload.size()));
  REQUIRE(rt::wire::encode(rt::wire::rank_endpoint(from), rt::wire::rank_endpoint(to), h, payload, f) == f.size());
  return f;
}

std::vector<std::byte> frame_bytes(const rte_mbuf* m) {
  std::vector<std::byte> out;
  for (; m != nullptr; m = m->next) {
    const auto* p = rte_pktmbuf_mtod(m, const std::byte*);
    out.insert(out.end(), p, p + m->data_len);
  }
  return out;
}

// Polls `n` until `r` holds `want` frames (5 s at most) and takes them.
std::vector<rte_mbuf*> take_sent(emu::nic& n, rte_ring* r, std::size_t want) {
  std::vector<rte_mbuf*> out;
  const auto end = std::chrono::steady_clock::now() + 5000ms;
  while (out.size() < want && std::chrono::steady_clock::now() < end) {
    n.poll();
    for (rte_mbuf* m : drain_ring(r)) out.push_back(m);
  }
  return out;
}

// NIC b (rank 1) on a cable whose rank-0 end the test drives by hand (rings ab and ba), and a
// pool for the frames the test injects. `tx_ring_packets` 0: the default stage.
struct forward_rig {
  cable c;
  std::unique_ptr<emu::nic> b;
  std::uint64_t base_b = 0;  // b's mbufs in use before the test
  rte_mempool* pool = nullptr;
  explicit forward_rig(unsigned ring = 1024, std::uint32_t tx_ring_packets = 0) : c(ring) {
    auto cfg = config("b", 1, c.port_b);
    if (tx_ring_packets != 0) cfg.tx_ring_packets = tx_ring_packets;
    auto n = emu::nic::create(cfg);
    REQUIRE(n.ok());
    b = std::move(*n);
    base_b = b->stats().mbufs_in_use;
    pool = rte_pktmbuf_pool_create(("t_fwd" + std::to_string(seq_no++)).c_str(), 255, 0, 0, 2048 + RTE_PKTMBUF_HEADROOM,
                                   SOCKET_ID_ANY);
    REQUIRE(pool != nullptr);
  }
  // The NIC goes first: it may still hold frames of the pool.
  ~forward_rig() {
    b.reset();
    if (pool != nullptr) rte_mempool_free(pool);
  }
};

}  // namespace

TEST_SUITE("emulator") {

TEST_CASE("rte_ring single-object dequeue returns what was enqueued, across the ring's wrap") {
  // DPDK's inline ring code reads and writes the caller's object arrays through uint64_t
  // pointers. Under strict aliasing clang 16 -O2 moved the stores that fill a local array of
  // rte_mbuf* past the ring's uint64_t loads, so garbage was enqueued (a link stage crashed on
  // it). The emulator builds with -fno-strict-aliasing (emulator/meson.build); this test fails
  // without it.
  rte_ring* r = rte_ring_create(("t_alias" + std::to_string(seq_no++)).c_str(), 16, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
  REQUIRE(r != nullptr);
  std::vector<std::uintptr_t> got;
  for (int round = 0; round < 3; ++round) {
    CHECK(fill_and_enqueue(r, 1, 25) == 15);
    for (auto* m : drain_ring(r)) got.push_back(reinterpret_cast<std::uintptr_t>(m));
  }
  REQUIRE(got.size() == 45);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == i % 15 + 1);
  rte_ring_free(r);
}

TEST_CASE("a host message crosses a net_ring cable and lands in the receiver's host memory by default deposit") {
  cable c;
  auto a = emu::nic::create(config("a", 0, c.port_a));
  auto b = emu::nic::create(config("b", 1, c.port_b, 2));
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? std::string() : a.err().message));
  REQUIRE_MESSAGE(b.ok(), (b.ok() ? std::string() : b.err().message));
  emu::nic& na = **a;
  emu::nic& nb = **b;
  const std::uint64_t base_a = na.stats().mbufs_in_use, base_b = nb.stats().mbufs_in_use;

  const std::size_t len = 100000;  // 98 packets of 1024 bytes
  std::vector<std::byte> src = pattern_bytes(len, 1), dst(len);
  auto ra = na.register_host_memory(src);
  auto rb = nb.register_host_memory(dst);
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  rt::ec_config ec{.name = "deposit",
                   .match = {0x77, 0},
                   .handlers = rt::handler_set(nullptr, nullptr, event_ch),
                   .window = rt::host_window{*rb, 0, len}};
  auto e = nb.install(ec);
  REQUIRE(e.ok());
  {
    poller p(na, nb);
    auto s = na.send(host::message{1, 0x77, 42, *ra, 0, len}, 5000ms);
    REQUIRE_MESSAGE(s.ok(), (s.ok() ? std::string() : s.err().message));
    auto ev = wait_events(nb, *e, 1);
    REQUIRE(ev.size() == 1);
    CHECK(ev[0].message_id == 42);
    CHECK(ev[0].source_rank == 0);
  }
  REQUIRE(na.quiesce(2000ms));
  REQUIRE(nb.quiesce(2000ms));
  CHECK(dst == src);
  const auto sa = na.stats(), sb = nb.stats();
  CHECK(sa.host_messages_sent == 1);
  CHECK(sa.host_packets_sent == 98);
  CHECK(sa.host_bytes_sent == len);
  CHECK(sa.ports[0].tx_packets == 98);
  CHECK(sb.ports[0].rx_packets == 98);
  CHECK(sb.runtime.ecs.at(0).packets_in == 98);
  CHECK(sb.runtime.ecs.at(0).deposit_bytes == len);
  for (auto d : sb.drops) CHECK(d == 0);
  CHECK(sa.mbufs_in_use == base_a);
  CHECK(sb.mbufs_in_use == base_b);
}

TEST_CASE("payload handlers' sends leave through the port: ping-pong between two NICs") {
  cable c;
  auto a = emu::nic::create(config("a", 0, c.port_a));
  auto b = emu::nic::create(config("b", 1, c.port_b, 2));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  emu::nic& na = **a;
  emu::nic& nb = **b;
  const std::size_t len = 5000;
  std::vector<std::byte> src = pattern_bytes(len, 2), back(len);
  auto ra = na.register_host_memory(src);
  auto rback = na.register_host_memory(back);
  REQUIRE(ra.ok());
  REQUIRE(rback.ok());
  rt::ec_config echo{.name = "echo", .match = {0x10, 0}, .handlers = rt::handler_set(nullptr, echo_ph, nullptr)};
  REQUIRE(nb.install(echo).ok());
  rt::ec_config land{.name = "land",
                     .match = {0x10, 0},
                     .handlers = rt::handler_set(nullptr, nullptr, event_ch),
                     .window = rt::host_window{*rback, 0, len}};
  auto e = na.install(land);
  REQUIRE(e.ok());
  {
    poller p(na, nb);
    for (std::uint64_t m = 1; m <= 3; ++m) {
      std::fill(back.begin(), back.end(), std::byte{0});
      REQUIRE(na.send(host::message{1, 0x10, m, *ra, 0, len}, 5000ms).ok());
      auto ev = wait_events(na, *e, 1);
      REQUIRE(ev.size() == 1);
      CHECK(ev[0].message_id == m + 1000);
      CHECK(ev[0].source_rank == 1);
      CHECK(back == src);
    }
  }
  REQUIRE(na.quiesce(2000ms));
  REQUIRE(nb.quiesce(2000ms));
  const auto sb = nb.stats();
  CHECK(sb.runtime.ecs.at(0).sends == 15);  // 3 messages x 5 packets
  CHECK(sb.ports[0].tx_packets == 15);
}

TEST_CASE("a 9000-byte frame in 2 KiB mbufs reaches handlers intact, also when the spin header straddles two segments") {
  cable c;
  auto b = emu::nic::create(config("b", 1, c.port_b));
  REQUIRE(b.ok());
  emu::nic& nb = **b;
  rte_mempool* pool = rte_pktmbuf_pool_create(("t_seg" + std::to_string(seq_no++)).c_str(), 255, 0, 0,
                                              2048 + RTE_PKTMBUF_HEADROOM, SOCKET_ID_ANY);
  REQUIRE(pool != nullptr);
  const std::size_t payload = 9000 - rt::wire::min_overhead;
  std::vector<std::byte> host(payload * 8);
  auto r = nb.register_host_memory(host);
  REQUIRE(r.ok());
  rt::ec_config ec{.name = "jumbo",
                   .match = {0x5, 0},
                   .handlers = rt::handler_set(nullptr, nullptr, event_ch),
                   .window = rt::host_window{*r, 0, host.size()}};
  auto e = nb.install(ec);
  REQUIRE(e.ok());
  // First-segment lengths: inside the IP header, inside the spin header (starts at byte 42,
  // ends at 88), right at its end, one past it, and a plain 2 KiB split.
  const std::uint32_t firsts[] = {20, 50, 87, 88, 89, 2048};
  std::uint64_t msg = 0;
  for (std::uint32_t first : firsts) {
    ++msg;
    std::vector<std::byte> data = pattern_bytes(payload, static_cast<unsigned>(msg));
    rt::wire::header h;
    h.source_rank = 0;
    h.match_bits = 0x5;
    h.message_id = msg;
    h.flags = rt::wire::flag_start | rt::wire::flag_end;
    h.message_len = payload;
    std::vector<std::byte> frame(9000);
    REQUIRE(rt::wire::encode(rt::wire::rank_endpoint(0), rt::wire::rank_endpoint(1), h, data, frame) == 9000);
    // Chain: `first` bytes, then 2 KiB segments.
    rte_mbuf* head = nullptr;
    std::size_t off = 0;
    while (off < frame.size()) {
      rte_mbuf* m = rte_pktmbuf_alloc(pool);
      REQUIRE(m != nullptr);
      const std::size_t n = std::min<std::size_t>(off == 0 ? first : 2048, frame.size() - off);
      std::memcpy(rte_pktmbuf_append(m, static_cast<std::uint16_t>(n)), frame.data() + off, n);
      off += n;
      if (head == nullptr) head = m;
      else REQUIRE(rte_pktmbuf_chain(head, m) == 0);
    }
    CHECK(head->nb_segs >= 5);
    REQUIRE(rte_ring_enqueue(c.ab, head) == 0);
    // Message m deposits at its own offset in host memory.
    ec.window = rt::host_window{*r, (msg - 1) * payload, payload};
    (void)data;
  }
  // All six messages carry the same offsets (0): they land in the first `payload` bytes; check
  // each one as it arrives.
  std::uint64_t seen = 0;
  const auto end = std::chrono::steady_clock::now() + 5000ms;
  while (seen < 6 && std::chrono::steady_clock::now() < end) {
    nb.poll();
    rt::host_event ev[8];
    const std::size_t k = nb.poll_events(*e, ev);
    for (std::size_t i = 0; i < k; ++i) {
      ++seen;
      CHECK(ev[i].message_id == seen);
    }
  }
  CHECK(seen == 6);
  REQUIRE(nb.quiesce(2000ms));
  // The last message's payload is in host memory, byte for byte.
  const auto last = pattern_bytes(payload, 6);
  CHECK(std::equal(last.begin(), last.end(), host.begin()));
  const auto s = nb.stats();
  CHECK(s.runtime.ecs.at(0).deposit_bytes == 6 * payload);
  for (auto d : s.drops) CHECK(d == 0);
  CHECK(rte_mempool_in_use_count(pool) == 0);
  rte_mempool_free(pool);
}

TEST_CASE("frames too long, malformed or for no EC are dropped under their own reasons") {
  cable c;
  auto cfg = config("b", 1, c.port_b);
  cfg.port.max_frame_bytes = 4096;
  cfg.port.mbuf_data_bytes = 2048;
  auto b = emu::nic::create(cfg);
  REQUIRE(b.ok());
  emu::nic& nb = **b;
  rte_mempool* pool = rte_pktmbuf_pool_create(("t_drop" + std::to_string(seq_no++)).c_str(), 255, 0, 0,
                                              2048 + RTE_PKTMBUF_HEADROOM, SOCKET_ID_ANY);
  REQUIRE(pool != nullptr);
  // 5000 bytes in three segments: longer than 4096.
  rte_mbuf* head = rte_pktmbuf_alloc(pool);
  for (int i = 0; i < 3; ++i) {
    rte_mbuf* m = i == 0 ? head : rte_pktmbuf_alloc(pool);
    std::memset(rte_pktmbuf_append(m, i < 2 ? 2000 : 1000), 0xab, i < 2 ? 2000 : 1000);
    if (i > 0) REQUIRE(rte_pktmbuf_chain(head, m) == 0);
  }
  REQUIRE(rte_ring_enqueue(c.ab, head) == 0);
  // Garbage: not IPv4.
  std::vector<std::byte> junk(100, std::byte{0x11});
  CHECK(nb.inject(junk) == errc::ok);
  // A valid spin packet that matches no EC.
  rt::wire::header h;
  h.flags = rt::wire::flag_start | rt::wire::flag_end;
  h.match_bits = 0x999;
  std::vector<std::byte> frame(200);
  const std::size_t n = rt::wire::encode(rt::wire::rank_endpoint(0), rt::wire::rank_endpoint(1), h, {}, frame);
  frame.resize(n);
  CHECK(nb.inject(frame) == errc::ok);
  // Too long to inject.
  CHECK(nb.inject(std::vector<std::byte>(5000)) == errc::invalid_argument);
  for (int i = 0; i < 100; ++i) nb.poll();
  REQUIRE(nb.quiesce(2000ms));
  const auto s = nb.stats();
  CHECK(s.drops[static_cast<std::size_t>(emu::nic_drop::oversize)] == 1);
  CHECK(s.drops[static_cast<std::size_t>(emu::nic_drop::malformed)] == 1);
  CHECK(s.drops[static_cast<std::size_t>(emu::nic_drop::unknown_ec)] == 1);
  CHECK(s.runtime.frames_rejected[static_cast<std::size_t>(rt::wire::reject::not_ipv4)] == 1);
  CHECK(s.ports[0].rx_packets == 3);
  CHECK(rte_mempool_in_use_count(pool) == 0);
  rte_mempool_free(pool);
}

TEST_CASE("when the peer stops receiving, packets wait or are dropped with a counted reason, and every mbuf comes back") {
  cable c(256);
  auto ca = config("a", 0, c.port_a);
  ca.tx_ring_packets = 8;
  auto a = emu::nic::create(ca);
  auto b = emu::nic::create(config("b", 1, c.port_b));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  emu::nic& na = **a;
  emu::nic& nb = **b;
  const std::uint64_t base_a = na.stats().mbufs_in_use, base_b = nb.stats().mbufs_in_use;
  const std::size_t len = 1 << 20;  // 1024 packets: more than the cable and the stage hold
  std::vector<std::byte> src = pattern_bytes(len, 3), dst(len);
  auto ra = na.register_host_memory(src);
  auto rb = nb.register_host_memory(dst);
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  // a echoes what b sends it; b is not polled at first, so a's echoes and a's own message back up.
  rt::ec_config echo{.name = "echo", .match = {0x20, 0}, .handlers = rt::handler_set(nullptr, echo_ph, nullptr)};
  REQUIRE(na.install(echo).ok());
  rt::ec_config land{.name = "land",
                     .match = {0x21, 0},
                     .handlers = rt::handler_set(nullptr, nullptr, event_ch),
                     .window = rt::host_window{*rb, 0, len}};
  auto e = nb.install(land);
  REQUIRE(e.ok());

  // Only a is polled: its message fills the cable (256) and its stage, then the send times out.
  {
    std::atomic<bool> stop{false};
    std::thread t([&] { na.run(stop); });
    auto s = na.send(host::message{1, 0x21, 7, *ra, 0, len}, 300ms);
    stop = true;
    t.join();
    REQUIRE_FALSE(s.ok());
    CHECK(s.err().code == errc::timeout);
    CHECK(s.err().message.find("stayed full") != std::string::npos);
  }
  const auto mid = na.stats();
  CHECK(mid.host_packets_sent > 0);
  CHECK(mid.host_packets_sent < 1024);
  CHECK(mid.mbufs_in_use > base_a);  // frames wait in the cable and the stage

  // Now echo traffic towards a, which a runs while b hardly receives: the echoes meet a full
  // cable and a full stage, and a's handler sends fail (counted). b queues 6 x 64 packets (the
  // cable b -> a takes 256, b's stage the rest); a echoes 256 into the cable a -> b (256) and its
  // stage (8); b receives one burst (32) and sends the rest of its messages; a's echoes of those
  // find room for about 32 + 8 only.
  std::vector<std::byte> small = pattern_bytes(64 * 1024, 4);
  auto rsmall = nb.register_host_memory(small);
  REQUIRE(rsmall.ok());
  {
    std::atomic<bool> stop{false};
    std::thread t([&] { nb.run(stop); });
    for (std::uint64_t m = 0; m < 6; ++m) REQUIRE(nb.send(host::message{0, 0x20, 100 + m, *rsmall, 0, small.size()}, 5000ms).ok());
    stop = true;
    t.join();
  }
  for (int i = 0; i < 1000; ++i) na.poll();
  nb.poll();
  for (int i = 0; i < 1000; ++i) na.poll();
  // The peer recovers: both NICs polled until quiet, and every mbuf is back.
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 1000; ++i) {
      na.poll();
      nb.poll();
    }
    REQUIRE(na.quiesce(3000ms));
    REQUIRE(nb.quiesce(3000ms));
  }
  const auto sa = na.stats(), sb = nb.stats();
  CHECK(sa.mbufs_in_use == base_a);
  CHECK(sb.mbufs_in_use == base_b);
  // Every packet b received was either deposited or counted as a drop.
  const auto& land_stats = sb.runtime.ecs.at(0);
  CHECK(land_stats.packets_in + land_stats.total_drops() == sb.ports[0].rx_packets - sb.drops[static_cast<std::size_t>(emu::nic_drop::unknown_ec)]);
  // a's echo handlers saw a full ring at least once, each counted, none lost silently.
  const auto& echo_stats = sa.runtime.ecs.at(0);
  CHECK(echo_stats.send_failed > 0);
  CHECK(echo_stats.sends + echo_stats.send_failed == echo_stats.packets_in);
  CHECK(sa.drops[static_cast<std::size_t>(emu::nic_drop::tx_queue_full)] == echo_stats.send_failed);
}

TEST_CASE("cancel_sends ends a host message waiting for a stopped poll loop at once, with aborted") {
  cable c;
  auto a = emu::nic::create(config("a", 0, c.port_a));
  REQUIRE(a.ok());
  std::vector<std::byte> src(64 * 1024);
  auto r = (*a)->register_host_memory(src);
  REQUIRE(r.ok());
  // Nobody polls: the message cannot advance, so send() would wait for its 10 s timeout.
  std::atomic<bool> returned{false};
  result<void> out = fail(errc::ok, "");
  std::thread t([&] {
    out = (*a)->send(host::message{1, 0x1, 1, *r, 0, src.size()}, 10000ms);
    returned = true;
  });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(returned.load());
  const auto t0 = std::chrono::steady_clock::now();
  (*a)->cancel_sends();
  t.join();
  CHECK(std::chrono::steady_clock::now() - t0 < 2000ms);
  REQUIRE_FALSE(out.ok());
  CHECK(out.err().code == errc::aborted);
  CHECK(out.err().message.find("shutting down") != std::string::npos);
  // The region is free again.
  CHECK((*a)->unregister_host_memory(*r).ok());
}

TEST_CASE("control calls from other threads run between bursts while a thread polls") {
  cable c;
  auto a = emu::nic::create(config("a", 0, c.port_a));
  auto b = emu::nic::create(config("b", 1, c.port_b));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  poller p(**a, **b);
  std::vector<std::byte> mem(4096);
  auto r = (*b)->register_host_memory(mem);
  REQUIRE(r.ok());
  for (int i = 0; i < 50; ++i) {
    rt::ec_config ec{.name = "e" + std::to_string(i),
                     .match = {static_cast<std::uint64_t>(i), 0},
                     .window = rt::host_window{*r, 0, 4096}};
    auto e = (*b)->install(ec);
    REQUIRE(e.ok());
    CHECK((*b)->unregister_host_memory(*r).err().code == errc::bad_state);
    REQUIRE((*b)->uninstall(*e).ok());
  }
  CHECK((*b)->unregister_host_memory(*r).ok());
  CHECK((*b)->unregister_host_memory(*r).err().code == errc::not_found);
  auto bad = (*a)->send(host::message{1, 0, 1, 99, 0, 1}, 100ms);
  CHECK(bad.err().code == errc::not_found);
  std::vector<std::byte> src(10);
  auto ra = (*a)->register_host_memory(src);
  REQUIRE(ra.ok());
  CHECK((*a)->send(host::message{1, 0, 1, *ra, 5, 6}, 100ms).err().code == errc::out_of_bounds);
}

TEST_CASE("messages and handler sends to the NIC's own rank loop back to its runtime without touching the wire") {
  cable c;
  auto a = emu::nic::create(config("a", 0, c.port_a));
  auto b = emu::nic::create(config("b", 1, c.port_b));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  emu::nic& na = **a;
  const std::size_t len = 3000;
  std::vector<std::byte> src = pattern_bytes(len, 5), direct(len), echoed(len);
  auto rs = na.register_host_memory(src);
  auto rd = na.register_host_memory(direct);
  auto re = na.register_host_memory(echoed);
  REQUIRE(rs.ok());
  REQUIRE(rd.ok());
  REQUIRE(re.ok());
  // 0x40: the echo EC answers with match bits 0x41 to the sender, which is this NIC itself.
  rt::ec_config echo{.name = "echo", .match = {0x40, 0}, .handlers = rt::handler_set(nullptr, echo_next_ph, nullptr)};
  REQUIRE(na.install(echo).ok());
  rt::ec_config land{.name = "echoed",
                     .match = {0x41, 0},
                     .handlers = rt::handler_set(nullptr, nullptr, event_ch),
                     .window = rt::host_window{*re, 0, len}};
  auto e = na.install(land);
  REQUIRE(e.ok());
  land.name = "direct";
  land.match = {0x42, 0};
  land.window = rt::host_window{*rd, 0, len};
  auto d = na.install(land);
  REQUIRE(d.ok());
  {
    poller p(na, **b);
    REQUIRE(na.send(host::message{0, 0x42, 9, *rs, 0, len}, 5000ms).ok());
    auto ev = wait_events(na, *d, 1);
    REQUIRE(ev.size() == 1);
    CHECK(ev[0].message_id == 9);
    CHECK(ev[0].source_rank == 0);
    REQUIRE(na.send(host::message{0, 0x40, 20, *rs, 0, len}, 5000ms).ok());
    ev = wait_events(na, *e, 1);
    REQUIRE(ev.size() == 1);
    CHECK(ev[0].message_id == 1020);
  }
  REQUIRE(na.quiesce(2000ms));
  CHECK(direct == src);
  CHECK(echoed == src);
  const auto s = na.stats();
  CHECK(s.ports[0].tx_packets == 0);
  CHECK(s.ports[0].rx_packets == 0);
  CHECK(s.runtime.ecs.at(0).sends == 3);
  CHECK(s.loopback_packets == 9);  // 3 direct, 3 to the echo EC, 3 echoed
  for (auto dr : s.drops) CHECK(dr == 0);
}

TEST_CASE("a NIC captures what it sends and receives, and replaying the capture into another NIC gives the same host bytes") {
  const std::string dir = "/tmp/spin-test-capture-" + std::to_string(getpid());
  REQUIRE(system(("mkdir -p " + dir).c_str()) == 0);
  cable c;
  auto ca = config("a", 0, c.port_a);
  ca.capture_path = dir + "/a.pcap";
  auto cb = config("b", 1, c.port_b);
  cb.capture_path = dir + "/b.pcap";
  const std::size_t len = 5000;
  std::vector<std::byte> src = pattern_bytes(len, 9);
  {
    auto a = emu::nic::create(ca);
    auto b = emu::nic::create(cb);
    REQUIRE_MESSAGE(a.ok(), (a.ok() ? std::string() : a.err().message));
    REQUIRE(b.ok());
    auto ra = (*a)->register_host_memory(src);
    REQUIRE(ra.ok());
    {
      poller p(**a, **b);
      REQUIRE((*a)->send(host::message{1, 0x33, 5, *ra, 0, len}, 5000ms).ok());
      std::this_thread::sleep_for(20ms);
    }
    REQUIRE((*b)->quiesce(2000ms));
    CHECK((*a)->stats().capture_frames == 5);
    CHECK((*b)->stats().capture_frames == 5);
    (*b)->stop();
    (*a)->stop();
  }
  auto frames = emu::read_all_frames(dir + "/b.pcap");
  REQUIRE_MESSAGE(frames.ok(), (frames.ok() ? std::string() : frames.err().message));
  REQUIRE(frames->size() == 5);
  auto sent = emu::read_all_frames(dir + "/a.pcap");
  REQUIRE(sent.ok());
  CHECK(*sent == *frames);  // what a queued is what b received
  for (std::size_t i = 0; i < 5; ++i) {
    rt::wire::parsed pr;
    rt::wire::reject why;
    REQUIRE(rt::wire::parse((*frames)[i], rt::wire::default_udp_port, pr, why));
    CHECK(pr.hdr.seq == i);
    CHECK(pr.hdr.message_id == 5);
  }
  // Replay into a fresh NIC: the frames deposit the same bytes.
  cable c2;
  auto r = emu::nic::create(config("r", 1, c2.port_b));
  REQUIRE(r.ok());
  std::vector<std::byte> dst(len);
  auto rd = (*r)->register_host_memory(dst);
  REQUIRE(rd.ok());
  rt::ec_config ec{.name = "replay", .match = {0x33, 0}, .window = rt::host_window{*rd, 0, len}};
  REQUIRE((*r)->install(ec).ok());
  for (const auto& f : *frames) CHECK((*r)->inject(f) == errc::ok);
  REQUIRE((*r)->quiesce(2000ms));
  CHECK(dst == src);
  CHECK(system(("rm -rf " + dir).c_str()) == 0);
}

TEST_CASE("forward sends the received mbuf itself, headers rewritten in place, byte for byte the frame a copy would send") {
  forward_rig r;
  cable& c = r.c;
  emu::nic& nb = *r.b;
  const std::uint64_t base_b = r.base_b;
  rte_mempool* pool = r.pool;
  rt::ec_config ec{.name = "forward", .match = {0x70, 0}, .handlers = rt::handler_set(nullptr, forward_ph, nullptr)};
  auto e = nb.install(ec);
  REQUIRE(e.ok());
  // Four packets without and two with the collective extension (88- and 104-byte headers).
  std::vector<test_message> msgs;
  msgs.push_back(make_message(pool, 0x70, 5, 4, 1000, false));
  msgs.push_back(make_message(pool, 0x70, 6, 2, 100, true));
  std::vector<rte_mbuf*> injected;
  for (auto& m : msgs)
    for (rte_mbuf* f : m.frames) {
      injected.push_back(f);
      REQUIRE(rte_ring_enqueue(c.ab, f) == 0);
    }
  const std::vector<rte_mbuf*> sent = take_sent(nb, c.ba, injected.size());
  REQUIRE(sent.size() == injected.size());
  std::size_t i = 0;
  for (auto& m : msgs)
    for (std::size_t k = 0; k < m.frames.size(); ++k, ++i) {
      CAPTURE(i);
      CHECK(sent[i] == injected[i]);  // the same mbuf: nothing was copied
      CHECK(sent[i]->nb_segs == 1);
      CHECK(frame_bytes(sent[i]) == forwarded_frame(m.headers[k], m.payloads[k], 1, 0));
    }
  const auto s = nb.stats();
  CHECK(s.forward_in_place == injected.size());
  CHECK(s.forward_chained == 0);
  CHECK(s.runtime.ecs.at(0).sends == injected.size());
  CHECK(s.runtime.ecs.at(0).send_failed == 0);
  for (rte_mbuf* m : sent) rte_pktmbuf_free(m);
  CHECK(rte_mempool_in_use_count(pool) == 0);  // the runtime's reference went when the handler was done
  CHECK(nb.stats().mbufs_in_use == base_b);
}

TEST_CASE("a second forward of the same packet chains a header to a clone of the payload, and the packet stays readable after both") {
  forward_rig r;
  cable& c = r.c;
  emu::nic& nb = *r.b;
  const std::uint64_t base_b = r.base_b;
  rte_mempool* pool = r.pool;
  rt::ec_config ec{.name = "forward2", .match = {0x71, 0}, .handlers = rt::handler_set(nullptr, forward_twice_ph, nullptr)};
  auto e = nb.install(ec);
  REQUIRE(e.ok());
  test_message m = make_message(pool, 0x71, 9, 3, 1024, false);
  for (rte_mbuf* f : m.frames) REQUIRE(rte_ring_enqueue(c.ab, f) == 0);
  const std::vector<rte_mbuf*> sent = take_sent(nb, c.ba, 6);
  REQUIRE(sent.size() == 6);
  for (std::size_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    // First the packet itself back to rank 0, then a header mbuf and a clone to rank 2.
    CHECK(sent[2 * k] == m.frames[k]);
    CHECK(frame_bytes(sent[2 * k]) == forwarded_frame(m.headers[k], m.payloads[k], 1, 0));
    CHECK(sent[2 * k + 1]->nb_segs == 2);
    CHECK(RTE_MBUF_CLONED(sent[2 * k + 1]->next));
    CHECK(frame_bytes(sent[2 * k + 1]) == forwarded_frame(m.headers[k], m.payloads[k], 1, 2));
  }
  // Each handler read its payload after both forwards: the sums of the bytes it was sent.
  rt::host_event ev[8];
  REQUIRE(nb.poll_events(*e, ev) == 3);
  for (std::size_t k = 0; k < 3; ++k) {
    std::uint64_t sum = 0;
    for (std::byte x : m.payloads[k]) sum += static_cast<std::uint8_t>(x);
    CHECK(ev[k].value == sum);
  }
  const auto s = nb.stats();
  CHECK(s.forward_in_place == 3);
  CHECK(s.forward_chained == 3);
  // The clones hold the received mbufs: these go back with whichever frame is freed last.
  for (std::size_t k = 0; k < 3; ++k) rte_pktmbuf_free(sent[2 * k]);
  CHECK(rte_mempool_in_use_count(pool) == 3);
  for (std::size_t k = 0; k < 3; ++k) rte_pktmbuf_free(sent[2 * k + 1]);
  CHECK(rte_mempool_in_use_count(pool) == 0);
  CHECK(nb.stats().mbufs_in_use == base_b);
}

TEST_CASE("forwarding a multicast copy chains a header to a clone of its shared payload and writes nothing shared") {
  forward_rig r;
  cable& c = r.c;
  emu::nic& nb = *r.b;
  const std::uint64_t base_b = r.base_b;
  rte_mempool* pool = r.pool;
  rt::ec_config ec{.name = "forward", .match = {0x74, 0}, .handlers = rt::handler_set(nullptr, forward_ph, nullptr)};
  ec.limits.read_only_multicast = true;  // runs on the shared payload in place
  REQUIRE(nb.install(ec).ok());
  // A multicast copy as another NIC sends it: a header mbuf chained to a clone of the payload,
  // whose mbuf the test keeps (another copy's holder).
  test_message m = make_message(pool, 0x74, 8, 1, 1024, false);
  rte_mbuf* whole = m.frames[0];
  rte_mbuf* payload = rte_pktmbuf_alloc(pool);
  REQUIRE(payload != nullptr);
  std::memcpy(rte_pktmbuf_append(payload, 1024), m.payloads[0].data(), 1024);
  rte_mbuf* hdr = rte_pktmbuf_alloc(pool);
  REQUIRE(hdr != nullptr);
  const std::size_t hl = rt::wire::min_overhead;
  std::memcpy(rte_pktmbuf_append(hdr, static_cast<std::uint16_t>(hl)), rte_pktmbuf_mtod(whole, const std::byte*), hl);
  rte_pktmbuf_free(whole);
  rte_mbuf* clone = rte_pktmbuf_clone(payload, pool);
  REQUIRE(clone != nullptr);
  REQUIRE(rte_pktmbuf_chain(hdr, clone) == 0);
  REQUIRE(rte_ring_enqueue(c.ab, hdr) == 0);
  const std::vector<rte_mbuf*> sent = take_sent(nb, c.ba, 1);
  REQUIRE(sent.size() == 1);
  CHECK(sent[0]->nb_segs == 2);
  CHECK(RTE_MBUF_CLONED(sent[0]->next));
  CHECK(frame_bytes(sent[0]) == forwarded_frame(m.headers[0], m.payloads[0], 1, 0));
  CHECK(std::equal(m.payloads[0].begin(), m.payloads[0].end(), rte_pktmbuf_mtod(payload, const std::byte*)));
  const auto s = nb.stats();
  CHECK(s.forward_chained == 1);
  CHECK(s.forward_in_place == 0);
  CHECK(s.unshared == 0);
  rte_pktmbuf_free(sent[0]);
  CHECK(rte_mempool_in_use_count(pool) == 1);  // the payload, which the test still holds
  rte_pktmbuf_free(payload);
  CHECK(rte_mempool_in_use_count(pool) == 0);
  CHECK(nb.stats().mbufs_in_use == base_b);
}

TEST_CASE("forwards that find the TX queue full fail with no_space, and every mbuf comes back, also from a NIC stopped with frames queued") {
  forward_rig r(64, 4);  // a stage of 4 frames
  cable& c = r.c;
  emu::nic& nb = *r.b;
  rte_mempool* pool = r.pool;
  // The cable towards rank 0 is full: nothing b sends leaves.
  std::vector<rte_mbuf*> filler;
  for (;;) {
    rte_mbuf* f = rte_pktmbuf_alloc(pool);
    REQUIRE(f != nullptr);
    if (rte_ring_enqueue(c.ba, f) != 0) {
      rte_pktmbuf_free(f);
      break;
    }
    filler.push_back(f);
  }
  rt::ec_config ec{.name = "forward", .match = {0x72, 0}, .handlers = rt::handler_set(nullptr, forward_ph, nullptr)};
  auto e = nb.install(ec);
  REQUIRE(e.ok());
  test_message m = make_message(pool, 0x72, 4, 10, 512, false);
  for (rte_mbuf* f : m.frames) REQUIRE(rte_ring_enqueue(c.ab, f) == 0);
  for (int i = 0; i < 20; ++i) nb.poll();
  const auto s = nb.stats();
  const auto& es = s.runtime.ecs.at(0);
  CHECK(es.packets_in == 10);
  CHECK(es.sends == 4);  // the stage's room
  CHECK(es.send_failed == 6);
  CHECK(s.forward_in_place == 4);
  CHECK(s.drops[static_cast<std::size_t>(emu::nic_drop::tx_queue_full)] == 6);
  // The failed forwards' frames went back when their handlers were done; the four queued ones
  // are still in b's stage.
  CHECK(rte_mempool_in_use_count(pool) == filler.size() + 4);
  r.b.reset();  // stops with the four frames queued
  CHECK(rte_mempool_in_use_count(pool) == filler.size());
  for (rte_mbuf* f : drain_ring(c.ba)) rte_pktmbuf_free(f);
  CHECK(rte_mempool_in_use_count(pool) == 0);
}

TEST_CASE("a received frame that another holder still references is shared: handlers that write get a private copy") {
  for (const bool read_only : {false, true}) {
    CAPTURE(read_only);
    forward_rig rig;
    cable& c = rig.c;
    emu::nic& nb = *rig.b;
    rte_mempool* pool = rig.pool;
    const std::uint32_t payload = 1024;
    std::vector<std::byte> host(2 * payload);
    auto r = nb.register_host_memory(host);
    REQUIRE(r.ok());
    rt::ec_config ec{.name = "flip", .match = {0x73, 0}};
    // A read-only EC deposits (reads only); the other writes its packet first.
    ec.handlers = rt::handler_set(nullptr, read_only ? nullptr : flip_deposit_ph, nullptr);
    ec.window = rt::host_window{*r, 0, host.size()};
    ec.limits.read_only_multicast = read_only;
    REQUIRE(nb.install(ec).ok());
    test_message m = make_message(pool, 0x73, 3, 2, payload, false);
    // The test holds a second reference to each frame, as a forwarding NIC whose handler still
    // runs would.
    std::vector<std::vector<std::byte>> before;
    for (rte_mbuf* f : m.frames) {
      before.push_back(frame_bytes(f));
      rte_mbuf_refcnt_update(f, 1);
      REQUIRE(rte_ring_enqueue(c.ab, f) == 0);
    }
    for (int i = 0; i < 20; ++i) nb.poll();
    REQUIRE(nb.quiesce(2000ms));
    std::vector<std::byte> want;
    for (auto& p : m.payloads) want.insert(want.end(), p.begin(), p.end());
    if (!read_only)
      for (std::size_t off = 0; off < want.size(); off += payload) want[off] = ~want[off];
    CHECK(host == want);
    for (std::size_t k = 0; k < m.frames.size(); ++k) CHECK(frame_bytes(m.frames[k]) == before[k]);  // never written
    CHECK(nb.stats().unshared == (read_only ? 0u : 2u));
    CHECK(rte_mempool_in_use_count(pool) == 2);  // only the test's references
    for (rte_mbuf* f : m.frames) rte_pktmbuf_free(f);
    CHECK(rte_mempool_in_use_count(pool) == 0);
  }
}

}  // TEST_SUITE
