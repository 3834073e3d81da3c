// The standard handlers of handlers/std (built by spinc): strided-vector unpack, histogram,
// filter, the broadcast forwarder and the float32 sum, each against an exact expectation, with packets in any
// order and malformed input.
#include "test_util.hpp"

#include <spin/std/bcast_forward.hpp>
#include <spin/std/filter.hpp>
#include <spin/std/fsum.hpp>
#include <spin/std/histogram.hpp>
#include <spin/std/strided_unpack.hpp>

#include <spin/rt/loader.hpp>
#include <spin/rt/runtime.hpp>
#include <spin/rt/tx.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace spin;
using namespace spin::test;

namespace {

// `target`: "native" or "ebpf" (run by rte_bpf's JIT).
rt::loaded_package load(const std::string& name, const std::string& target) {
  auto lp = rt::load_package_file(std::string(SPIN_TEST_PKG_DIR) + "/" + name + "." + target + ".spkg");
  REQUIRE_MESSAGE(lp.ok(), (lp.ok() ? std::string() : lp.err().message));
  return std::move(lp.value());
}

// Installs package `name` with a host window over `host`, sets its handler memory to `state`.
template <class State>
rt::ec_id install(fixture& f, const std::string& name, std::vector<std::byte>& host, const State& state,
                  const std::string& target = "native") {
  auto region = f.rt->register_host_memory(host);
  REQUIRE(region.ok());
  const rt::ec_id ec = f.install(load(name, target), {.name = name, .window = rt::host_window{region.value(), 0, host.size()}});
  auto mem = f.rt->handler_memory(ec);
  REQUIRE(mem.size() >= sizeof(State));
  std::memcpy(mem.data(), &state, sizeof(State));
  return ec;
}

template <class State> State state_of(fixture& f, rt::ec_id ec) {
  State s;
  std::memcpy(&s, f.rt->handler_memory(ec).data(), sizeof(State));
  return s;
}

// Every packet of a message with payload `bytes`, shuffled.
std::vector<rt::packet> shuffled(packet_pool& pool, std::uint32_t source, std::uint64_t msg, const std::vector<std::byte>& bytes,
                                 std::uint32_t pkt_bytes, std::uint64_t seed) {
  std::vector<rt::packet> out;
  const auto count = static_cast<std::uint32_t>((bytes.size() + pkt_bytes - 1) / pkt_bytes);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t lo = std::size_t{i} * pkt_bytes, n = std::min<std::size_t>(pkt_bytes, bytes.size() - lo);
    auto h = data_header(0, source, msg, i, count, bytes.size(), pkt_bytes);
    out.push_back(pool.add(h, std::span<const std::byte>(bytes.data() + lo, n)));
  }
  std::mt19937_64 rng(seed);
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

} // namespace

TEST_SUITE("runtime") {

TEST_CASE("strided_unpack scatters a packed vector to its blocks in host memory, whatever the packet order") {
  fixture f(2);
  const std::uint64_t block = 100, stride = 256, blocks = 50;
  std::vector<std::byte> host(blocks * stride, std::byte{0xee});
  const rt::ec_id ec = install(f, "strided_unpack", host, stdh::strided_state{block, stride, blocks, 0, 0, 0});
  std::vector<std::byte> packed(block * blocks);
  for (std::size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<std::byte>(i * 7 + (i >> 8));
  REQUIRE(feed(*f.rt, shuffled(f.pool, 1, 10, packed, 128, 3)));  // packets cut across blocks
  for (std::uint64_t b = 0; b < blocks; ++b) {
    CHECK(std::memcmp(host.data() + b * stride, packed.data() + b * block, block) == 0);
    for (std::uint64_t g = block; g < stride; ++g) REQUIRE(host[b * stride + g] == std::byte{0xee});  // gaps untouched
  }
  rt::host_event ev[4];
  REQUIRE(f.rt->poll_events(ec, ev) == 1);
  CHECK(ev[0].value == 10);
  // A message of the wrong length is refused whole.
  std::vector<std::byte> short_msg(block * blocks - 1);
  REQUIRE(feed(*f.rt, shuffled(f.pool, 1, 11, short_msg, 128, 4)));
  const auto s = state_of<stdh::strided_state>(f, ec);
  CHECK(s.messages == 1);
  CHECK(s.rejected == 1);
  CHECK(s.dma_failed == 0);
}

TEST_CASE("histogram counts every value of every message into its bin, with underflow and overflow") {
  fixture f(3);
  std::vector<std::byte> host(sizeof(stdh::histogram_result));
  stdh::histogram_state st{};
  st.lo = -50;
  st.bin_width = 10;
  st.bins = 20;  // [-50, 150)
  st.expected_messages = 4;
  const rt::ec_id ec = install(f, "histogram", host, st);
  std::vector<std::uint64_t> want(20, 0);
  std::uint64_t under = 0, over = 0;
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::int32_t> dist(-80, 180);
  for (std::uint32_t m = 0; m < 4; ++m) {
    std::vector<std::int32_t> v(3001);
    for (auto& x : v) {
      x = dist(rng);
      if (x < -50) ++under;
      else if (x >= 150) ++over;
      else ++want[static_cast<std::size_t>((x + 50) / 10)];
    }
    std::vector<std::byte> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    REQUIRE(feed(*f.rt, shuffled(f.pool, 2, 100 + m, bytes, 1024, m)));
  }
  stdh::histogram_result got;
  std::memcpy(&got, host.data(), sizeof(got));
  CHECK(got.underflow == under);
  CHECK(got.overflow == over);
  for (std::size_t b = 0; b < 20; ++b) CHECK(got.counts[b] == want[b]);
  rt::host_event ev[4];
  REQUIRE(f.rt->poll_events(ec, ev) == 1);
  CHECK(ev[0].value == 4);
  // A packet whose length is not whole int32 values is refused, not half counted.
  std::vector<std::byte> odd(6);
  REQUIRE(feed(*f.rt, shuffled(f.pool, 2, 200, odd, 1024, 9)));
  CHECK(state_of<stdh::histogram_state>(f, ec).rejected == 1);
}

TEST_CASE("filter appends exactly the records in the key range to host memory, and counts what did not fit") {
  fixture f(2);
  const std::uint64_t capacity = 150;
  std::vector<std::byte> host(capacity * sizeof(stdh::filter_record));
  stdh::filter_state st{};
  st.key_lo = 1000;
  st.key_hi = 1999;
  st.capacity_records = capacity;
  const rt::ec_id ec = install(f, "filter", host, st);
  std::vector<stdh::filter_record> recs(2000);
  std::uint64_t matching = 0;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    recs[i] = {(i * 7919) % 10000, i};
    if (recs[i].key >= 1000 && recs[i].key <= 1999) ++matching;
  }
  std::vector<std::byte> bytes(recs.size() * sizeof(stdh::filter_record));
  std::memcpy(bytes.data(), recs.data(), bytes.size());
  REQUIRE(feed(*f.rt, shuffled(f.pool, 3, 1, bytes, 1024, 1)));
  const auto s = state_of<stdh::filter_state>(f, ec);
  REQUIRE(matching > capacity);  // the window is too small on purpose
  CHECK(s.kept == capacity);
  CHECK(s.overflow == matching - capacity);
  CHECK(s.dropped == recs.size() - matching);
  // Every record in host memory is a matching input record, each at most once.
  std::vector<std::uint64_t> seen;
  for (std::uint64_t i = 0; i < capacity; ++i) {
    stdh::filter_record r;
    std::memcpy(&r, host.data() + i * sizeof(r), sizeof(r));
    REQUIRE(r.key >= 1000);
    REQUIRE(r.key <= 1999);
    REQUIRE(recs[r.value].key == r.key);
    seen.push_back(r.value);
  }
  std::sort(seen.begin(), seen.end());
  CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
}

TEST_CASE("bcast_forward lands every packet in host memory and passes it on to the next rank as it arrives, on both targets") {
  std::string target = "native";
  SUBCASE("native") {}
  SUBCASE("ebpf") { target = "ebpf"; }
  CAPTURE(target);
  // Packets of 8 KiB are more than one eBPF window.
  for (const std::uint32_t pkt : {1024u, 8192u}) {
    CAPTURE(pkt);
    rt::memory_transmitter tx(2, 1 << 22, 5, 9000);
    fixture f(2, &tx);
    std::vector<std::byte> host(20000);
    const std::uint32_t packets = static_cast<std::uint32_t>((host.size() + pkt - 1) / pkt);
    const rt::ec_id ec = install(f, "bcast_forward", host, stdh::bcast_state{6, 1, 0, 0, 0, 0}, target);
    std::vector<std::byte> msg(host.size());
    for (std::size_t i = 0; i < msg.size(); ++i) msg[i] = pattern(4, 77, i);
    REQUIRE(feed(*f.rt, shuffled(f.pool, 4, 77, msg, pkt, 2)));
    CHECK(host == msg);
    const auto s = state_of<stdh::bcast_state>(f, ec);
    CHECK(s.packets == packets);
    CHECK(s.messages == 1);
    CHECK(s.forward_failed == 0);
    // Every packet went on to rank 6 unchanged: same message, offset and payload.
    auto frames = tx.take_frames();
    REQUIRE(frames.size() == packets);
    std::vector<std::byte> rebuilt(msg.size());
    for (auto& fr : frames) {
      CHECK(fr.dest_rank == 6);
      rt::wire::parsed p;
      rt::wire::reject why;
      REQUIRE(rt::wire::parse(std::span<const std::byte>(fr.bytes), rt::wire::default_udp_port, p, why));
      CHECK(p.hdr.message_id == 77);
      std::memcpy(rebuilt.data() + p.hdr.offset, fr.bytes.data() + p.payload_offset, p.hdr.payload_len);
    }
    CHECK(rebuilt == msg);
  }
}

TEST_CASE("fsum adds every float32 element of every message, across lock blocks and in any packet order, and DMAs the sum once") {
  fixture f(3);
  const std::uint64_t n = 3001;  // six lock blocks of 512 elements, the last one partly used
  std::vector<std::byte> host(n * sizeof(float), std::byte{0xee});
  auto st = std::make_unique<stdh::fsum_state>();  // 64 KiB: not on the test's stack
  st->elements = n;
  st->expected_messages = 4;
  const rt::ec_id ec = install(f, "fsum", host, *st);
  // Integers: every partial sum is exact in float32, so the result does not depend on the order.
  std::vector<float> want(n, 0.0f);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> dist(-1000, 1000);
  for (std::uint32_t m = 0; m < 4; ++m) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = static_cast<float>(dist(rng));
      want[i] += v[i];
    }
    std::vector<std::byte> bytes(n * sizeof(float));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    REQUIRE(feed(*f.rt, shuffled(f.pool, 2, 100 + m, bytes, 1000, m)));  // packets cut across lock blocks
  }
  std::vector<float> got(n);
  std::memcpy(got.data(), host.data(), host.size());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += got[i] != want[i];
  CHECK(wrong == 0);
  rt::host_event ev[4];
  REQUIRE(f.rt->poll_events(ec, ev) == 1);
  CHECK(ev[0].value == 4);
  *st = state_of<stdh::fsum_state>(f, ec);
  CHECK(st->messages == 4);
  CHECK(st->packets == 4 * ((n * 4 + 999) / 1000));
  CHECK(st->rejected == 0);
  // A contribution of the wrong length is refused by the header handler and adds nothing.
  std::vector<std::byte> short_msg((n - 1) * sizeof(float));
  REQUIRE(feed(*f.rt, shuffled(f.pool, 2, 300, short_msg, 1000, 7)));
  *st = state_of<stdh::fsum_state>(f, ec);
  CHECK(st->rejected == 1);
  CHECK(st->messages == 4);
  for (std::size_t i = 0; i < n; ++i) wrong += st->acc[i] != want[i];
  CHECK(wrong == 0);
}

}
