// Handler actions: DMA, atomics, locks, sends, events, and the bounds every action enforces.
#include "../common/this_packet.hpp"
#include "test_util.hpp"

#include <spin/rt/runtime.hpp>

#include <doctest/doctest.h>

#include <algorithm>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

using namespace spin;
using namespace spin::test;

namespace {

template <class T> T load_at(std::span<std::byte> m, std::size_t off) {
  T v;
  std::memcpy(&v, m.data() + off, sizeof v);
  return v;
}
template <class T> void store_at(std::span<std::byte> m, std::size_t off, T v) { std::memcpy(m.data() + off, &v, sizeof v); }

// ---- isolation ---------------------------------------------------------------------------------
// EC A's handler memory: [0] pointer to EC B's handler memory (written by the test), [8..] one
// i32 result per attempted action, in the order below.
SPIN_PAYLOAD_HANDLER(intruder_ph) {
  u8* other = reinterpret_cast<u8*>(*ctx->mem<u64>(0));
  i32* out = ctx->mem<i32>(8, 16);
  const u64 n = ctx->handler_mem.size();
  u64 ignored = 0;
  out[0] = static_cast<i32>(ctx->dma_to_host(0, other, 8));               // source in another EC
  out[1] = static_cast<i32>(ctx->dma_from_host(other, 0, 8));             // destination in another EC
  out[2] = static_cast<i32>(ctx->fetch_add<u64>(n, 1, &ignored));         // just past the end
  out[3] = static_cast<i32>(ctx->fetch_add<u64>(~u64{0} - 3, 1));         // wrapping offset
  out[4] = static_cast<i32>(ctx->lock(n));                                // lock word outside
  out[5] = static_cast<i32>(ctx->put(0, 0, 1, 0, other, 8));              // send from another EC
  out[6] = static_cast<i32>(ctx->dma_to_host(0, ctx->handler_mem.data + n - 4, 8));  // straddles the end
  out[7] = static_cast<i32>(ctx->store<u32>(2, 1));                       // misaligned
  out[8] = ctx->mem<u64>(n - 4) == nullptr ? 0 : 1;                       // typed access straddling the end
  out[9] = ctx->scratchpad<u8>(0) == nullptr ? 0 : 1;                     // no scratchpad configured
  return ret::success;
}

SPIN_PAYLOAD_HANDLER(dma_ph) {
  // Copies the packet to the host at its message offset, reads it back into the scratchpad and
  // tries one DMA just past the window.
  // Payload handlers of one message run concurrently: each uses its own part of the scratchpad.
  const u64 len = ctx->packet.size();
  u8* mine = ctx->scratchpad<u8>(ctx->msg.offset_bytes, len);
  errc a = ctx->dma_to_host(ctx->msg.offset_bytes, ctx->packet.data, len);
  errc b = ctx->dma_from_host(mine, ctx->msg.offset_bytes, len);
  errc c = ctx->dma_to_host(ctx->host_window_len_bytes - 1, ctx->packet.data, 2);
  ctx->store<i32>(0, static_cast<i32>(a));
  ctx->store<i32>(4, static_cast<i32>(b));
  ctx->store<i32>(8, static_cast<i32>(c));
  for (u64 i = 0; i < len; ++i)
    if (mine == nullptr || mine[i] != ctx->packet.data[i]) ctx->fetch_add<u64>(16, 1);
  return ret::success;
}

SPIN_PAYLOAD_HANDLER(nb_dma_ph) {
  dma_handle h{};
  i32* out = ctx->mem<i32>(0, 4);
  out[0] = static_cast<i32>(ctx->dma_to_host_nb(0, ctx->packet.data, ctx->packet.size(), h));
  out[1] = ctx->dma_test(h);  // 0: the modelled DMA takes 2 ms
  out[2] = static_cast<i32>(ctx->dma_wait(h));
  out[3] = ctx->dma_test(h);  // handle consumed by wait: not_found
  return ret::success;
}

// Every payload handler adds to shared counters: integer and float atomics, min/max, and a
// non-atomic counter under a spin lock.
SPIN_PAYLOAD_HANDLER(atomics_ph) {
  const u32 idx = ctx->msg.packet_index + 1;
  ctx->fetch_add<u64>(0, idx);
  ctx->fetch_add<u32>(8, 1);
  ctx->float_add<double>(16, 0.5);
  ctx->fetch_min<i64>(24, -static_cast<i64>(idx));
  ctx->fetch_max<i64>(32, static_cast<i64>(idx));
  if (ctx->lock(40) == errc::ok) {
    u64* plain = ctx->mem<u64>(48);
    *plain = *plain + 1;  // protected by the lock, not atomic
    ctx->unlock(40);
  }
  ctx->float_max<float>(56, static_cast<float>(idx));
  u64 expected = 0;
  if (ctx->compare_exchange<u64>(64, &expected, idx) == errc::ok) ctx->fetch_add<u64>(72, 1);  // exactly one winner
  return ret::success;
}

SPIN_PAYLOAD_HANDLER(lock_misuse_ph) {
  i32* out = ctx->mem<i32>(0, 3);
  out[0] = static_cast<i32>(ctx->unlock(16));  // not held
  out[1] = static_cast<i32>(ctx->lock(16));
  out[2] = static_cast<i32>(ctx->lock(16));    // already held by this invocation
  return ret::success;                         // returns with the lock held: released by the runtime
}

// A runtime of `hpus` HPUs at rank 5 whose handlers send into `tx`.
rt::runtime_config sending_config(rt::memory_transmitter& tx, std::uint32_t hpus) {
  rt::runtime_config cfg;
  cfg.hpus = hpus;
  cfg.tx = &tx;
  cfg.rank = 5;
  return cfg;
}

SPIN_PAYLOAD_HANDLER(echo_ph) {
  return test::echo(ctx);  // each packet back to its sender as message id + 1000
}

// Reads the packet's collective fields and sends them on with epoch + 1 (msg_coll), and once
// more with the send_desc of a handler built before send_desc::coll existed (no coll fields).
SPIN_PAYLOAD_HANDLER(coll_echo_ph) {
  u64* seen = ctx->mem<u64>(0, 4);
  if (seen == nullptr) return ret::drop;
  seen[0] = (ctx->msg.flags & msg_coll) != 0 ? 1 : 0;
  seen[1] = (u64{ctx->coll.op} << 56) | (u64{ctx->coll.dtype} << 48) | (u64{ctx->coll.slot} << 32) | ctx->coll.elem_count;
  seen[2] = (u64{ctx->coll.epoch} << 32) | ctx->coll.aux;
  send_desc d{};
  d.size_bytes = sizeof d;
  d.dest_rank = 9;
  d.match_bits = 77;
  d.message_id = 1;
  d.message_len_bytes = 8;
  d.data = ctx->packet.data;
  d.len_bytes = 8;
  d.flags = msg_start | msg_end | msg_coll;
  d.coll = ctx->coll;
  d.coll.epoch += 1;
  errc e1 = ctx->send(d);
  d.size_bytes = offsetof(send_desc, coll);  // an older handler: the runtime must not read coll
  d.message_id = 2;
  d.flags = msg_start | msg_end;
  errc e2 = ctx->send(d);
  d.flags = msg_start | msg_end | msg_coll;  // asks for coll fields it did not pass: refused
  d.message_id = 3;
  errc e3 = ctx->send(d);
  seen[3] = (static_cast<u64>(static_cast<u32>(e1)) << 40) | (static_cast<u64>(static_cast<u32>(e2)) << 20) |
            static_cast<u32>(-static_cast<i32>(e3));
  return ret::success;
}

// Multicasts its packet to the ranks at handler memory [16..] (u32, [8] of them) as message
// 100 + i; [24] gets the result, and [32.. ] the results of calls that must be refused: no
// destination, too many, a destination list outside local memory.
SPIN_PAYLOAD_HANDLER(mcast_ph) {
  const u32* count = ctx->mem<u32>(8);
  const u32* dests = ctx->mem<u32>(16, 2);
  if (count == nullptr || dests == nullptr) return ret::drop;
  send_desc d{};
  d.size_bytes = sizeof d;
  d.match_bits = 77;
  d.message_id = 100;
  d.message_len_bytes = ctx->packet.size();
  d.data = ctx->packet.data;
  d.len_bytes = static_cast<u32>(ctx->packet.size());
  d.flags = msg_start | msg_end;
  ctx->store<i64>(24, ctx->multicast(d, dests, *count));
  const u32 on_stack[2] = {1, 2};
  ctx->store<i64>(32, ctx->multicast(d, dests, 0));
  ctx->store<i64>(40, ctx->multicast(d, dests, max_multicast + 1));
  ctx->store<i64>(48, ctx->multicast(d, on_stack, 2));
  return ret::success;
}

// Records where its payload lies ([0]) and a checksum of it ([8]).
SPIN_PAYLOAD_HANDLER(where_ph) {
  const u8* data = ctx->payload<u8>(0, ctx->packet.size());
  if (data == nullptr) return ret::drop;
  u64 sum = 0;
  for (u64 i = 0; i < ctx->packet.size(); ++i) sum = sum * 31 + data[i];
  ctx->store<u64>(0, reinterpret_cast<u64>(data));
  ctx->store<u64>(8, sum);
  return ret::success;
}

std::atomic<int> unshare_calls{0};
// runtime_config::unshare for a packet_pool: the frame and its tail, copied into a new frame of
// the pool; the original is released.
bool pool_unshare(void* user, rt::packet& p) noexcept {
  auto* pool = static_cast<packet_pool*>(user);
  std::vector<std::byte> b(p.frame, p.frame + p.frame_len);
  b.insert(b.end(), p.tail, p.tail + p.tail_len);
  const rt::packet q = pool->add_raw(std::move(b));
  packet_pool::release(user, p.cookie);
  p = q;
  unshare_calls.fetch_add(1);
  return true;
}

SPIN_COMPLETION_HANDLER(event_ch) {
  ctx->post_event(ctx->msg.message_id * 10);
  return ret::success;
}

} // namespace

TEST_SUITE("runtime") {

TEST_CASE("a handler cannot touch another EC's memory or anything outside its own through the API") {
  fixture f(1);
  std::vector<std::byte> host(4096);
  auto region = f.rt->register_host_memory(host);
  REQUIRE(region.ok());
  rt::ec_config b{.name = "victim", .match = {.bits = 2}, .handler_mem_bytes = 256};
  const rt::ec_id ec_b = f.install(b);
  auto mem_b = f.rt->handler_memory(ec_b);
  for (auto& x : mem_b) x = std::byte{0x5a};

  rt::ec_config a{.name = "intruder",
                  .match = {.bits = 1},
                  .handlers = rt::handler_set(nullptr, intruder_ph, nullptr),
                  .handler_mem_bytes = 128,
                  .window = rt::host_window{*region, 0, 4096}};
  const rt::ec_id ec_a = f.install(a);
  auto mem_a = f.rt->handler_memory(ec_a);
  store_at<std::uint64_t>(mem_a, 0, reinterpret_cast<std::uint64_t>(mem_b.data()));

  REQUIRE(feed(*f.rt, message_packets(f.pool, 1, 0, 1, 64, 64)));
  const auto oob = static_cast<std::int32_t>(errc::out_of_bounds);
  CHECK(load_at<std::int32_t>(mem_a, 8 + 0) == oob);
  CHECK(load_at<std::int32_t>(mem_a, 8 + 4) == oob);
  CHECK(load_at<std::int32_t>(mem_a, 8 + 8) == oob);
  CHECK(load_at<std::int32_t>(mem_a, 8 + 12) == oob);
  CHECK(load_at<std::int32_t>(mem_a, 8 + 16) == oob);
  CHECK(load_at<std::int32_t>(mem_a, 8 + 20) == oob);
  CHECK(load_at<std::int32_t>(mem_a, 8 + 24) == oob);
  CHECK(load_at<std::int32_t>(mem_a, 8 + 28) == static_cast<std::int32_t>(errc::misaligned));
  CHECK(load_at<std::int32_t>(mem_a, 8 + 32) == 0);
  CHECK(load_at<std::int32_t>(mem_a, 8 + 36) == 0);
  for (auto x : mem_b) REQUIRE(x == std::byte{0x5a});
  for (auto x : host) REQUIRE(x == std::byte{0});
  CHECK(f.ec_stats(ec_a).api_errors == 5);  // DMAs, lock and send go through the table; atomics are inline
}

TEST_CASE("DMA moves bytes between the packet, the scratchpad and the host window and rejects ranges outside the window") {
  fixture f(2);
  std::vector<std::byte> host(1 << 16);
  auto region = f.rt->register_host_memory(host);
  REQUIRE(region.ok());
  rt::ec_config c{.name = "dma",
                  .handlers = rt::handler_set(nullptr, dma_ph, nullptr),
                  .handler_mem_bytes = 64,
                  .scratchpad_bytes = 8000,
                  .window = rt::host_window{*region, 4096, 8192}};
  const rt::ec_id ec = f.install(c);
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 3, 9, 8000, 1000)));
  for (std::size_t i = 0; i < 8000; ++i) REQUIRE(host[4096 + i] == pattern(3, 9, i));
  for (std::size_t i = 0; i < 4096; ++i) REQUIRE(host[i] == std::byte{0});
  for (std::size_t i = 4096 + 8192; i < host.size(); ++i) REQUIRE(host[i] == std::byte{0});
  auto m = f.rt->handler_memory(ec);
  CHECK(load_at<std::int32_t>(m, 0) == 0);
  CHECK(load_at<std::int32_t>(m, 4) == 0);
  CHECK(load_at<std::int32_t>(m, 8) == static_cast<std::int32_t>(errc::out_of_bounds));
  CHECK(load_at<std::uint64_t>(m, 16) == 0);
  const auto s = f.ec_stats(ec);
  CHECK(s.dma_to_host_bytes == 8000);
  CHECK(s.dma_from_host_bytes == 8000);
  CHECK(s.dma_ops == 16);
  CHECK(s.api_errors == 8);
}

TEST_CASE("a non-blocking DMA is in flight until the modelled DMA time has passed") {
  rt::runtime_config cfg;
  cfg.hpus = 1;
  cfg.dma.latency = std::chrono::milliseconds(2);
  fixture f(cfg);
  std::vector<std::byte> host(4096);
  auto region = f.rt->register_host_memory(host);
  REQUIRE(region.ok());
  rt::ec_config c{.handlers = rt::handler_set(nullptr, nb_dma_ph, nullptr),
                  .handler_mem_bytes = 64,
                  .window = rt::host_window{*region, 0, 4096}};
  const rt::ec_id ec = f.install(c);
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 0, 1, 100, 100)));
  auto m = f.rt->handler_memory(ec);
  CHECK(load_at<std::int32_t>(m, 0) == 0);
  CHECK(load_at<std::int32_t>(m, 4) == 0);
  CHECK(load_at<std::int32_t>(m, 8) == 0);
  CHECK(load_at<std::int32_t>(m, 12) == static_cast<std::int32_t>(errc::not_found));
  CHECK(host[0] == pattern(0, 1, 0));
}

TEST_CASE("atomics and locks on handler memory give exact results under concurrent payload handlers") {
  fixture f(4);
  rt::ec_config c{.handlers = rt::handler_set(nullptr, atomics_ph, nullptr),
                  .handler_mem_bytes = 128,
                  .limits = {.max_messages = 64}};
  const rt::ec_id ec = f.install(c);
  auto m = f.rt->handler_memory(ec);
  store_at<std::int64_t>(m, 24, 0);
  store_at<std::int64_t>(m, 32, 0);
  store_at<float>(m, 56, -1.0f);
  constexpr std::uint32_t packets = 64;
  std::vector<rt::packet> all;
  for (std::uint64_t msg = 0; msg < 50; ++msg) {
    auto p = message_packets(f.pool, 0, 0, msg, packets * 16, 16);
    all.insert(all.end(), p.begin(), p.end());
  }
  REQUIRE(feed(*f.rt, all));
  const std::uint64_t n = all.size();
  CHECK(load_at<std::uint64_t>(m, 0) == 50 * (packets * (packets + 1) / 2));
  CHECK(load_at<std::uint32_t>(m, 8) == n);
  CHECK(load_at<double>(m, 16) == 0.5 * static_cast<double>(n));
  CHECK(load_at<std::int64_t>(m, 24) == -static_cast<std::int64_t>(packets));
  CHECK(load_at<std::int64_t>(m, 32) == packets);
  CHECK(load_at<std::uint64_t>(m, 48) == n);
  CHECK(load_at<float>(m, 56) == static_cast<float>(packets));
  CHECK(load_at<std::uint64_t>(m, 72) == 1);
  CHECK(f.ec_stats(ec).api_errors == 0);
}

TEST_CASE("unlocking a lock not held, locking one twice and returning with a lock held are errors, and the lock is freed") {
  fixture f(1);
  rt::ec_config c{.handlers = rt::handler_set(nullptr, lock_misuse_ph, nullptr), .handler_mem_bytes = 64};
  const rt::ec_id ec = f.install(c);
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 0, 1, 10, 10)));
  auto m = f.rt->handler_memory(ec);
  CHECK(load_at<std::int32_t>(m, 0) == static_cast<std::int32_t>(errc::bad_state));
  CHECK(load_at<std::int32_t>(m, 4) == 0);
  CHECK(load_at<std::int32_t>(m, 8) == static_cast<std::int32_t>(errc::bad_state));
  CHECK(load_at<std::uint64_t>(m, 16) == 0);  // released when the handler returned
  CHECK(f.ec_stats(ec).api_errors == 3);
  // The next invocation can take the lock again.
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 0, 2, 10, 10)));
  CHECK(load_at<std::int32_t>(m, 4) == 0);
}

TEST_CASE("packets a handler sends leave through the transmitter as valid frames that the runtime accepts again") {
  rt::memory_transmitter tx(2, 1 << 20, /*source_rank=*/5);
  fixture f(sending_config(tx, 2));
  rt::ec_config c{.handlers = rt::handler_set(nullptr, echo_ph, nullptr), .handler_mem_bytes = 8};
  const rt::ec_id ec = f.install(c);
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 2, 7, 3000, 1000)));
  auto frames = tx.take_frames();
  REQUIRE(frames.size() == 3);
  std::vector<bool> seen(3);
  for (auto& fr : frames) {
    rt::wire::parsed p;
    rt::wire::reject why;
    REQUIRE(rt::wire::parse(std::span<const std::byte>(fr.bytes), rt::wire::default_udp_port, p, why));
    CHECK(fr.dest_rank == 2);
    CHECK(p.hdr.source_rank == 5);
    CHECK(p.hdr.message_id == 1007);
    REQUIRE(p.hdr.seq < 3);
    seen[p.hdr.seq] = true;
    for (std::uint32_t i = 0; i < p.hdr.payload_len; ++i)
      REQUIRE(fr.bytes[p.payload_offset + i] == pattern(2, 7, p.hdr.offset + i));
  }
  CHECK((seen[0] && seen[1] && seen[2]));
  const auto s = f.ec_stats(ec);
  CHECK(s.sends == 3);
  CHECK(s.send_bytes == 3000);
}

TEST_CASE("an EC with a frame key runs only link frames whose tag verifies, counts the others as unauthenticated, and tags what it sends") {
  rt::memory_transmitter tx(1, 1 << 20, 5);
  fixture f(sending_config(tx, 1));
  rt::ec_config c{.handlers = rt::handler_set(nullptr, echo_ph, nullptr), .handler_mem_bytes = 8};
  for (std::size_t i = 0; i < 16; ++i) c.frame_key[i] = static_cast<std::uint8_t>(0x40 + i);
  const rt::ec_id ec = f.install(c);
  const auto key = rt::wire::auth_key::from_bytes(c.frame_key);
  auto payload = [](std::uint64_t msg) {
    std::vector<std::byte> b(10);
    for (std::uint64_t i = 0; i < b.size(); ++i) b[i] = pattern(2, msg, i);
    return b;
  };
  auto tagged = [&](std::uint64_t msg, rt::wire::auth_key k) {
    auto h = data_header(0, 2, msg, 0, 1, 10, 10);
    h.flags |= rt::wire::flag_auth;
    h.auth_tag = rt::wire::auth_tag(k, h, payload(msg));
    return h;
  };
  std::vector<rt::packet> p;
  p.push_back(f.pool.add(data_header(0, 2, 1, 0, 1, 10, 10), payload(1)));  // no tag
  rt::wire::auth_key wrong = key;
  wrong.k0 ^= 1;
  p.push_back(f.pool.add(tagged(2, wrong), payload(2)));  // another key's tag
  auto changed = payload(3);
  changed[4] ^= std::byte{0x80};
  p.push_back(f.pool.add(tagged(3, key), changed));  // payload changed after tagging
  auto forged_source = tagged(4, key);
  forged_source.source_rank = 3;
  p.push_back(f.pool.add(forged_source, payload(4)));  // source rank changed after tagging
  p.push_back(f.pool.add(tagged(5, key), payload(5)));  // verifies
  rt::packet local = f.pool.add(data_header(0, 2, 6, 0, 1, 10, 10), payload(6));
  local.local = true;  // from this NIC's own host: needs no tag
  p.push_back(local);
  REQUIRE(feed(*f.rt, p));
  CHECK(f.drops(ec, rt::drop_reason::unauthenticated) == 4);
  CHECK(f.ec_stats(ec).packets_in == 2);
  auto frames = tx.take_frames();
  REQUIRE(frames.size() == 2);
  std::vector<std::uint64_t> ids;
  for (auto& fr : frames) {
    rt::wire::parsed ps;
    rt::wire::reject why;
    REQUIRE(rt::wire::parse(std::span<const std::byte>(fr.bytes), rt::wire::default_udp_port, ps, why));
    CHECK((ps.hdr.flags & rt::wire::flag_auth) != 0);
    CHECK(ps.hdr.auth_tag ==
          rt::wire::auth_tag(key, ps.hdr, std::span<const std::byte>(fr.bytes).subspan(ps.payload_offset, ps.hdr.payload_len)));
    ids.push_back(ps.hdr.message_id);
  }
  std::sort(ids.begin(), ids.end());
  CHECK(ids == std::vector<std::uint64_t>{1005, 1006});
  // An EC without a key takes tagged and untagged frames alike.
  rt::ec_config open = c;
  open.frame_key = {};
  open.match.bits = 0x77;
  const rt::ec_id oc = f.install(open);
  auto t = tagged(7, wrong);
  t.match_bits = 0x77;
  REQUIRE(feed(*f.rt, std::vector<rt::packet>{f.pool.add(t, payload(7)), f.pool.add(data_header(0x77, 2, 8, 0, 1, 10, 10), payload(8))}));
  CHECK(f.ec_stats(oc).packets_in == 2);
  CHECK(f.drops(oc, rt::drop_reason::unauthenticated) == 0);
}

TEST_CASE("handlers read a packet's collective fields and send their own; a handler built before them still sends") {
  rt::memory_transmitter tx(1, 1 << 20, 5);
  fixture f(sending_config(tx, 1));
  rt::ec_config c{.handlers = rt::handler_set(nullptr, coll_echo_ph, nullptr), .handler_mem_bytes = 32};
  const rt::ec_id ec = f.install(c);
  auto h = data_header(0, 2, 40, 0, 1, 8, 8);
  h.flags |= rt::wire::flag_coll;
  h.coll = rt::wire::coll_ext{4, 3, 0x8005, 2, 1234, 99};
  std::vector<std::byte> payload(8, std::byte{0x42});
  const rt::packet pk = f.pool.add(h, payload);
  REQUIRE(feed(*f.rt, std::span<const rt::packet>(&pk, 1)));
  CHECK(f.word(ec, 0) == 1);
  CHECK(f.word(ec, 8) == ((4ull << 56) | (3ull << 48) | (0x8005ull << 32) | 2));
  CHECK(f.word(ec, 16) == ((1234ull << 32) | 99));
  CHECK(f.word(ec, 24) == static_cast<std::uint64_t>(-static_cast<std::int32_t>(errc::invalid_argument)));  // ok, ok, refused
  auto frames = tx.take_frames();
  REQUIRE(frames.size() == 2);
  for (auto& fr : frames) {
    rt::wire::parsed p;
    rt::wire::reject why;
    REQUIRE(rt::wire::parse(std::span<const std::byte>(fr.bytes), rt::wire::default_udp_port, p, why));
    if (p.hdr.message_id == 1) {
      CHECK((p.hdr.flags & rt::wire::flag_coll) != 0);
      CHECK(p.hdr.coll == rt::wire::coll_ext{4, 3, 0x8005, 2, 1235, 99});
    } else {
      CHECK(p.hdr.message_id == 2);
      CHECK((p.hdr.flags & rt::wire::flag_coll) == 0);
      CHECK(p.hdr.coll == rt::wire::coll_ext{});
    }
  }
  // A packet without the extension shows zeros and no msg_coll.
  const rt::packet plain = f.pool.add(data_header(0, 2, 41, 0, 1, 8, 8), payload);
  REQUIRE(feed(*f.rt, std::span<const rt::packet>(&plain, 1)));
  CHECK(f.word(ec, 0) == 0);
  CHECK(f.word(ec, 8) == 0);
  CHECK(f.word(ec, 16) == 0);
}

// Installs mcast_ph with `dests` in its handler memory.
rt::ec_id install_mcast(fixture& f, std::span<const std::uint32_t> dests) {
  rt::ec_config c{.handlers = rt::handler_set(nullptr, mcast_ph, nullptr), .handler_mem_bytes = 64};
  const rt::ec_id ec = f.install(c);
  auto mem = f.rt->handler_memory(ec);
  const auto count = static_cast<std::uint32_t>(dests.size());
  std::memcpy(mem.data() + 8, &count, 4);
  std::memcpy(mem.data() + 16, dests.data(), dests.size_bytes());
  return ec;
}

// where_ph's checksum of the first `n` bytes of message 7 from rank 2 (`pattern`).
std::uint64_t pattern_sum(std::uint32_t n) {
  std::uint64_t sum = 0;
  for (std::uint32_t i = 0; i < n; ++i) sum = sum * 31 + static_cast<std::uint8_t>(pattern(2, 7, i));
  return sum;
}

TEST_CASE("a multicast sends one frame per destination with consecutive message ids, and refuses bad destination lists") {
  rt::memory_transmitter tx(1, 1 << 20, 5);
  fixture f(sending_config(tx, 1));
  const std::uint32_t dests[2] = {3, 9};
  const rt::ec_id ec = install_mcast(f, dests);
  const auto pk = message_packet(f.pool, 0, 2, 7, 300, 300, 0);
  REQUIRE(feed(*f.rt, std::span<const rt::packet>(&pk, 1)));
  CHECK(static_cast<std::int64_t>(f.word(ec, 24)) == 2);
  CHECK(static_cast<std::int64_t>(f.word(ec, 32)) == static_cast<std::int64_t>(errc::invalid_argument));
  CHECK(static_cast<std::int64_t>(f.word(ec, 40)) == static_cast<std::int64_t>(errc::invalid_argument));
  CHECK(static_cast<std::int64_t>(f.word(ec, 48)) == static_cast<std::int64_t>(errc::out_of_bounds));
  auto frames = tx.take_frames();
  REQUIRE(frames.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    rt::wire::parsed p;
    rt::wire::reject why;
    REQUIRE(rt::wire::parse(std::span<const std::byte>(frames[i].bytes), rt::wire::default_udp_port, p, why));
    CHECK(frames[i].dest_rank == dests[i]);
    CHECK(p.hdr.message_id == 100 + i);
    CHECK(p.hdr.match_bits == 77);
    REQUIRE(p.hdr.payload_len == 300);
    for (std::uint32_t k = 0; k < 300; ++k) REQUIRE(frames[i].bytes[p.payload_offset + k] == pattern(2, 7, k));
  }
  const auto s = f.ec_stats(ec);
  CHECK(s.sends == 2);
  CHECK(s.send_bytes == 600);
}

TEST_CASE("a multicast whose TX queue fills part-way returns the copies sent and counts the others as failed sends") {
  rt::memory_transmitter tx(1, 900, 5);  // room for two frames of 300 bytes of payload (396 bytes each)
  rt::runtime_config cfg;
  cfg.hpus = 1;
  cfg.tx = &tx;
  fixture f(cfg);
  const std::uint32_t dests[3] = {3, 4, 5};
  const rt::ec_id ec = install_mcast(f, dests);
  const auto pk = message_packet(f.pool, 0, 2, 7, 300, 300, 0);
  REQUIRE(feed(*f.rt, std::span<const rt::packet>(&pk, 1)));
  CHECK(f.word(ec, 24) == 2);
  const auto s = f.ec_stats(ec);
  CHECK(s.sends == 2);
  CHECK(s.send_failed == 1);  // the third copy (refused calls send nothing: api errors, not failed sends)
  CHECK(s.api_errors == 3);
}

// A frame in two buffers, as the emulator hands a multicast copy over: the headers of `whole`
// up to `split`, then the rest in `tail`.
rt::packet split_packet(rt::packet whole, std::uint32_t split, std::vector<std::byte>& tail, bool shared) {
  tail.assign(whole.frame + split, whole.frame + whole.frame_len);
  rt::packet p = whole;
  p.frame_len = split;
  p.tail = tail.data();
  p.tail_len = static_cast<std::uint32_t>(tail.size());
  p.shared = shared;
  return p;
}

TEST_CASE("a payload in a second, shared buffer reaches read-only ECs in place and every other EC as its own copy") {
  for (const bool read_only : {true, false}) {
    CAPTURE(read_only);
    rt::runtime_config cfg;
    cfg.hpus = 1;
    cfg.unshare = pool_unshare;
    fixture f(cfg);
    rt::ec_config c{.handlers = rt::handler_set(nullptr, where_ph, nullptr),
                    .handler_mem_bytes = 16,
                    .limits = {.read_only_multicast = read_only}};
    const rt::ec_id ec = f.install(c);
    const rt::packet whole = message_packet(f.pool, 0, 2, 7, 500, 500, 0);
    rt::wire::parsed ps;
    rt::wire::reject why;
    REQUIRE(rt::wire::parse(std::span<const std::byte>(whole.frame, whole.frame_len), rt::wire::default_udp_port, ps, why));
    const std::uint64_t want = pattern_sum(500);
    std::vector<std::byte> tail;
    const rt::packet p = split_packet(whole, ps.payload_offset, tail, true);
    unshare_calls = 0;
    REQUIRE(feed(*f.rt, std::span<const rt::packet>(&p, 1)));
    CHECK(f.word(ec, 8) == want);
    if (read_only) {
      CHECK(f.word(ec, 0) == reinterpret_cast<std::uint64_t>(tail.data()));
      CHECK(unshare_calls == 0);
    } else {
      CHECK(f.word(ec, 0) != reinterpret_cast<std::uint64_t>(tail.data()));
      CHECK(unshare_calls == 1);
    }
  }
}

TEST_CASE("a local frame stays local when the runtime gives it a private copy: an EC with a frame key runs it untagged") {
  rt::runtime_config cfg;
  cfg.hpus = 1;
  cfg.unshare = pool_unshare;
  fixture f(cfg);
  rt::ec_config c{.handlers = rt::handler_set(nullptr, where_ph, nullptr), .handler_mem_bytes = 16};
  c.frame_key[0] = 1;
  const rt::ec_id ec = f.install(c);
  const rt::packet whole = message_packet(f.pool, 0, 2, 7, 500, 500, 0);
  rt::wire::parsed ps;
  rt::wire::reject why;
  REQUIRE(rt::wire::parse(std::span<const std::byte>(whole.frame, whole.frame_len), rt::wire::default_udp_port, ps, why));
  std::vector<std::byte> tail;
  rt::packet p = split_packet(whole, ps.payload_offset, tail, true);
  p.local = true;
  unshare_calls = 0;
  REQUIRE(feed(*f.rt, std::span<const rt::packet>(&p, 1)));
  CHECK(unshare_calls == 1);
  CHECK(f.word(ec, 8) == pattern_sum(500));
  CHECK(f.drops(ec, rt::drop_reason::unauthenticated) == 0);
}

TEST_CASE("a two-buffer frame whose payload does not start the second buffer is made contiguous first, and dropped with a reason when it cannot be") {
  for (const bool can_copy : {true, false}) {
    CAPTURE(can_copy);
    rt::runtime_config cfg;
    cfg.hpus = 1;
    if (can_copy) cfg.unshare = pool_unshare;
    fixture f(cfg);
    rt::ec_config c{.handlers = rt::handler_set(nullptr, where_ph, nullptr),
                    .handler_mem_bytes = 16,
                    .limits = {.read_only_multicast = true}};
    const rt::ec_id ec = f.install(c);
    const rt::packet whole = message_packet(f.pool, 0, 2, 7, 500, 500, 0);
    std::vector<std::byte> tail;
    const rt::packet p = split_packet(whole, 60, tail, false);  // cut inside the headers
    unshare_calls = 0;
    REQUIRE(feed(*f.rt, std::span<const rt::packet>(&p, 1)));
    const std::uint64_t want = pattern_sum(500);
    if (can_copy) {
      CHECK(unshare_calls == 1);
      CHECK(f.word(ec, 8) == want);
    } else {
      CHECK(f.word(ec, 8) == 0);
      CHECK(f.drops(ec, rt::drop_reason::no_private_copy) == 1);
    }
  }
}

TEST_CASE("a send with no transmitter or a full TX queue fails with an error code and is counted") {
  rt::memory_transmitter tx(1, 1500, 0);  // room for one frame
  rt::runtime_config cfg;
  cfg.hpus = 1;
  cfg.tx = &tx;
  fixture f(cfg);
  rt::ec_config c;
  c.handlers.payload = echo_ph;
  const rt::ec_id ec = f.install(c);
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 2, 7, 3000, 1000)));
  const auto s = f.ec_stats(ec);
  CHECK(s.sends == 1);
  CHECK(s.send_failed == 2);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::handler_drop)] == 2);
  CHECK(tx.take_frames().size() == 1);
}

TEST_CASE("events posted by handlers reach the host in the EC's queue and a full queue counts lost events") {
  fixture f(2);
  rt::ec_config c{.handlers = rt::handler_set(nullptr, nullptr, event_ch), .limits = {.event_queue_depth = 4}};
  const rt::ec_id ec = f.install(c);
  for (std::uint64_t m = 1; m <= 6; ++m) REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 0, m, 0, 64)));
  std::vector<rt::host_event> ev(16);
  const std::size_t n = f.rt->poll_events(ec, ev);
  REQUIRE(n == 4);
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(ev[i].type == rt::host_event::kind::handler);
    CHECK(ev[i].value == ev[i].message_id * 10);
  }
  const auto s = f.ec_stats(ec);
  CHECK(s.events_posted == 4);
  CHECK(s.events_lost == 2);
  CHECK(f.rt->poll_events(ec, ev) == 0);
  CHECK(f.rt->poll_events(999, ev) == 0);
}

TEST_CASE("a host waiting for an event gets one posted while it sleeps, and returns at once when its EC is uninstalled") {
  fixture f(2);
  rt::ec_config c;
  c.handlers.completion = event_ch;
  const rt::ec_id ec = f.install(c);
  using clk = std::chrono::steady_clock;
  // An event posted while the host waits (most likely asleep on the futex by then: its polling
  // rounds take microseconds). CHECK, not REQUIRE, while the host thread runs.
  {
    std::vector<rt::host_event> ev(4);
    std::size_t got = 0;
    std::thread host([&] { got = f.rt->wait_events(ec, ev, std::chrono::seconds(30)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t0 = clk::now();
    CHECK(feed(*f.rt, message_packets(f.pool, 0, 0, 5, 0, 64)));
    host.join();
    CHECK(clk::now() - t0 < std::chrono::seconds(10));
    REQUIRE(got == 1);
    CHECK(ev[0].value == 50);
  }
  // Uninstalled while the host sleeps: the wait ends, not its 30 s timeout.
  std::vector<rt::host_event> ev(4);
  std::size_t got = 99;
  clk::time_point woke{};
  std::thread host([&] {
    got = f.rt->wait_events(ec, ev, std::chrono::seconds(30));
    woke = clk::now();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto t0 = clk::now();
  CHECK(f.rt->uninstall(ec).ok());
  host.join();
  CHECK(got == 0);
  CHECK(woke - t0 < std::chrono::seconds(10));
  // A later wait on the uninstalled EC returns at once too (the EC is unknown now).
  CHECK(f.rt->wait_events(ec, ev, std::chrono::seconds(30)) == 0);
}

TEST_CASE("an EC without payload handler deposits each payload into its host window at the message offset") {
  fixture f(2);
  std::vector<std::byte> host(10000);
  auto region = f.rt->register_host_memory(host);
  REQUIRE(region.ok());
  rt::ec_config c;
  c.window = rt::host_window{*region, 0, 5000};
  const rt::ec_id ec = f.install(c);
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 1, 1, 5000, 1000)));
  for (std::size_t i = 0; i < 5000; ++i) REQUIRE(host[i] == pattern(1, 1, i));
  REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 1, 2, 6000, 1000)));  // last 1000 bytes fall outside
  const auto s = f.ec_stats(ec);
  CHECK(s.deposit_bytes == 10000);
  CHECK(s.drops[static_cast<std::size_t>(rt::drop_reason::host_window)] == 1);
  for (std::size_t i = 5000; i < host.size(); ++i) REQUIRE(host[i] == std::byte{0});
}

} // TEST_SUITE
