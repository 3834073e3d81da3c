// The DPDK link stage: mbufs from one rte_ring to another under the link model, with a fake clock.
// Every test ends with the pool's free count back at its start value (no mbuf leaks).
#include <doctest/doctest.h>

#include <spin/emu/link.hpp>

#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include <cstring>
#include <string>
#include <vector>

using namespace spin::emu;
namespace emu = spin::emu;  // emu::link, not POSIX ::link
using namespace std::chrono_literals;

namespace {

int fixture_id = 0;

// A pool and two single-producer/single-consumer rings; the destructor drains and frees them.
struct stage {
  rte_mempool* pool = nullptr;
  rte_ring* in = nullptr;
  rte_ring* out = nullptr;
  unsigned start_avail = 0;

  explicit stage(unsigned out_size = 1024, unsigned pool_size = 1023) {
    const std::string id = std::to_string(++fixture_id);
    pool = rte_pktmbuf_pool_create(("lpool" + id).c_str(), pool_size, 0, 0, RTE_MBUF_DEFAULT_BUF_SIZE,
                                   SOCKET_ID_ANY);
    in = rte_ring_create(("lin" + id).c_str(), 1024, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
    out = rte_ring_create(("lout" + id).c_str(), out_size, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
    REQUIRE(pool != nullptr);
    REQUIRE(in != nullptr);
    REQUIRE(out != nullptr);
    start_avail = rte_mempool_avail_count(pool);
  }
  ~stage() {
    drain(in);
    drain(out);
    rte_ring_free(in);
    rte_ring_free(out);
    rte_mempool_free(pool);
  }
  stage(const stage&) = delete;
  stage& operator=(const stage&) = delete;

  static void drain(rte_ring* r) {
    void* p = nullptr;
    while (rte_ring_sc_dequeue(r, &p) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(p));
  }

  // A frame of `len` bytes whose first four bytes are `tag`.
  rte_mbuf* frame(std::uint32_t tag, std::uint16_t len = 1500) {
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    REQUIRE(m != nullptr);
    char* d = rte_pktmbuf_append(m, len);
    REQUIRE(d != nullptr);
    std::memset(d, 0xab, len);
    std::memcpy(d, &tag, sizeof tag);
    return m;
  }

  void send(std::uint32_t count, std::uint32_t first_tag = 0, std::uint16_t len = 1500) {
    for (std::uint32_t i = 0; i < count; ++i) REQUIRE(rte_ring_sp_enqueue(in, frame(first_tag + i, len)) == 0);
  }

  // Takes every frame from `out`: their tags, in order; the mbufs are freed unless `keep`.
  std::vector<std::uint32_t> receive(std::vector<rte_mbuf*>* keep = nullptr) {
    std::vector<std::uint32_t> tags;
    void* p = nullptr;
    while (rte_ring_sc_dequeue(out, &p) == 0) {
      auto* m = static_cast<rte_mbuf*>(p);
      std::uint32_t tag = 0;
      std::memcpy(&tag, rte_pktmbuf_mtod(m, const char*), sizeof tag);
      tags.push_back(tag);
      if (keep) keep->push_back(m);
      else rte_pktmbuf_free(m);
    }
    return tags;
  }

  unsigned avail() const { return rte_mempool_avail_count(pool); }
};

std::unique_ptr<emu::link> make(stage& s, const link_model& m, rte_mempool* dup_pool = nullptr) {
  auto r = emu::link::create(s.in, s.out, dup_pool ? dup_pool : s.pool, m);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.err().message));
  return std::move(*r);
}

link_model model(double rate_gbps, std::chrono::nanoseconds latency) {
  link_model m;
  m.rate_gbps = rate_gbps;
  m.latency = latency;
  return m;
}

// Polls at `now` until the link neither takes nor delivers anything.
void settle(emu::link& l, std::uint64_t now) {
  for (int i = 0; i < 1000 && l.poll(now) > 0; ++i) {}
}

}  // namespace

TEST_SUITE("dpdk") {

TEST_CASE("frames pass in order at exactly their serialisation plus latency times") {
  stage s;
  {
    auto l = make(s, model(10, 1000ns));
    s.send(3);
    CHECK(l->poll(0) == 3);  // taken; none due yet
    CHECK(l->stats().held == 3);
    CHECK(l->next_due_ns() == 2200u);
    CHECK(l->poll(2199) == 0);
    CHECK(s.receive().empty());
    CHECK(l->poll(2200) == 1);
    CHECK(s.receive() == std::vector<std::uint32_t>{0});
    CHECK(l->poll(4599) == 1);  // 3400 is due
    CHECK(l->poll(4600) == 1);
    CHECK(s.receive() == std::vector<std::uint32_t>{1, 2});
    CHECK_FALSE(l->next_due_ns().has_value());
    const link_stats st = l->stats();
    CHECK(st.packets_in == 3);
    CHECK(st.bytes_in == 4500);
    CHECK(st.packets_delivered == 3);
    CHECK(st.bytes_delivered == 4500);
    CHECK(st.held == 0);
    CHECK(st.dropped_loss + st.dropped_queue_full + st.duplicated + st.reordered + st.output_stalls == 0);
    CHECK(l->to_json() ==
          R"({"bytes_delivered":4500,"bytes_in":4500,"dropped_loss":0,"dropped_queue_full":0,"dup_no_mbuf":0,)"
          R"("duplicated":0,"held":0,"output_stalls":0,"packets_delivered":3,"packets_in":3,"reordered":0})");
  }
  CHECK(s.avail() == s.start_avail);
}

TEST_CASE("a link without delay delivers in the same poll") {
  stage s;
  {
    auto l = make(s, model(0, 0ns));
    s.send(100);
    CHECK(l->poll(5) == 200);  // 100 taken + 100 delivered (4 bursts of 32 each way at most)
    std::vector<std::uint32_t> want(100);
    for (std::uint32_t i = 0; i < 100; ++i) want[i] = i;
    CHECK(s.receive() == want);
  }
  CHECK(s.avail() == s.start_avail);
}

TEST_CASE("one poll handles at most four bursts of 32 frames") {
  stage s;
  {
    auto l = make(s, model(0, 1000ns));
    s.send(300);
    CHECK(l->poll(0) == 128);
    CHECK(rte_ring_count(s.in) == 172);
    settle(*l, 0);
    CHECK(l->stats().held == 300);
    CHECK(l->poll(1000) == 128);  // delivers 128, no input left
    settle(*l, 1000);
    CHECK(s.receive().size() == 300);
  }
  CHECK(s.avail() == s.start_avail);
}

TEST_CASE("lost frames are freed and counted") {
  stage s;
  {
    link_model m = model(0, 100ns);
    m.loss = 0.5;
    m.seed = 3;
    auto l = make(s, m);
    s.send(400);
    settle(*l, 0);
    settle(*l, 100);
    const auto got = s.receive();
    const link_stats st = l->stats();
    CHECK(st.packets_in == 400);
    CHECK(st.dropped_loss > 100);
    CHECK(st.dropped_loss < 300);
    CHECK(st.packets_delivered + st.dropped_loss == 400);
    CHECK(got.size() == st.packets_delivered);
    CHECK(st.held == 0);
  }
  CHECK(s.avail() == s.start_avail);
}

TEST_CASE("duplicates are deep copies: changing one leaves the other unchanged") {
  stage s;
  {
    link_model m = model(10, 0ns);
    m.duplicate = 0.5;
    m.seed = 11;
    auto l = make(s, m);
    s.send(40);
    settle(*l, 0);
    settle(*l, 1'000'000);
    std::vector<rte_mbuf*> frames;
    const auto tags = s.receive(&frames);
    const link_stats st = l->stats();
    CHECK(st.duplicated > 0);
    CHECK(st.dup_no_mbuf == 0);
    CHECK(tags.size() == 40 + st.duplicated);
    CHECK(st.packets_delivered == 40 + st.duplicated);
    std::uint64_t pairs = 0;
    for (std::size_t i = 0; i + 1 < tags.size(); ++i) {
      if (tags[i] != tags[i + 1]) continue;
      ++pairs;  // the duplicate follows its original directly
      rte_mbuf* a = frames[i];
      rte_mbuf* b = frames[i + 1];
      CHECK(rte_pktmbuf_pkt_len(b) == 1500);
      CHECK(rte_pktmbuf_mtod(a, char*) != rte_pktmbuf_mtod(b, char*));
      CHECK(std::memcmp(rte_pktmbuf_mtod(a, char*), rte_pktmbuf_mtod(b, char*), 1500) == 0);
      rte_pktmbuf_mtod(a, unsigned char*)[100] = 0x11;
      CHECK(rte_pktmbuf_mtod(b, unsigned char*)[100] == 0xab);
    }
    CHECK(pairs == st.duplicated);
    for (rte_mbuf* f : frames) rte_pktmbuf_free(f);
  }
  CHECK(s.avail() == s.start_avail);
}

TEST_CASE("a duplicate without a free mbuf is counted and the original still goes") {
  stage s;
  rte_mempool* tiny = rte_pktmbuf_pool_create("ldup_tiny", 2, 0, 0, RTE_MBUF_DEFAULT_BUF_SIZE, SOCKET_ID_ANY);
  REQUIRE(tiny != nullptr);
  {
    link_model m = model(0, 0ns);
    m.duplicate = 0.9;
    m.seed = 5;
    auto l = make(s, m, tiny);
    s.send(30);
    settle(*l, 0);
    const link_stats st = l->stats();
    CHECK(st.duplicated > 2);
    CHECK(st.dup_no_mbuf == st.duplicated - 2);  // the tiny pool has two mbufs
    CHECK(st.packets_delivered == 32);
    std::vector<std::uint32_t> tags = s.receive();
    CHECK(tags.size() == 32);
    // Every original arrives once, in order.
    std::vector<std::uint32_t> unique;
    for (auto t : tags)
      if (unique.empty() || unique.back() != t) unique.push_back(t);
    CHECK(unique.size() == 30);
    CHECK(unique.back() == 29);
  }
  CHECK(rte_mempool_avail_count(tiny) == 2);
  rte_mempool_free(tiny);
  CHECK(s.avail() == s.start_avail);
}

TEST_CASE("frames due while the output ring is full wait in order and none is lost") {
  stage s(16);  // holds 15
  {
    auto l = make(s, model(0, 0ns));
    s.send(40);
    l->poll(0);
    link_stats st = l->stats();
    CHECK(st.packets_delivered == 15);
    CHECK(st.held == 25);
    CHECK(st.output_stalls >= 1);
    CHECK(l->poll(0) == 0);  // still full
    std::vector<std::uint32_t> tags = s.receive();
    CHECK(tags.size() == 15);
    CHECK(l->poll(0) == 15);
    auto more = s.receive();
    tags.insert(tags.end(), more.begin(), more.end());
    CHECK(l->poll(0) == 10);
    more = s.receive();
    tags.insert(tags.end(), more.begin(), more.end());
    std::vector<std::uint32_t> want(40);
    for (std::uint32_t i = 0; i < 40; ++i) want[i] = i;
    CHECK(tags == want);
    st = l->stats();
    CHECK(st.packets_delivered == 40);
    CHECK(st.held == 0);
    CHECK(st.dropped_loss + st.dropped_queue_full == 0);
  }
  CHECK(s.avail() == s.start_avail);
}

TEST_CASE("a full link drops new frames under the drop policy and leaves them queued under backpressure") {
  stage s;
  {
    link_model m = model(0, 1000ns);
    m.queue_packets = 8;
    auto l = make(s, m);
    s.send(20);
    settle(*l, 0);
    link_stats st = l->stats();
    CHECK(st.packets_in == 20);
    CHECK(st.held == 8);
    CHECK(st.dropped_queue_full == 12);
    settle(*l, 1000);
    CHECK(s.receive() == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  }
  CHECK(s.avail() == s.start_avail);
  {
    link_model m = model(0, 1000ns);
    m.queue_packets = 8;
    m.on_full = overflow_policy::backpressure;
    auto l = make(s, m);
    s.send(20);
    settle(*l, 0);
    CHECK(l->stats().held == 8);
    CHECK(rte_ring_count(s.in) == 12);
    CHECK(l->poll(1000) == 16);  // 8 delivered, 8 taken
    CHECK(l->poll(2000) == 12);  // 8 delivered, the last 4 taken
    settle(*l, 3000);
    std::vector<std::uint32_t> want(20);
    for (std::uint32_t i = 0; i < 20; ++i) want[i] = i;
    CHECK(s.receive() == want);
    CHECK(l->stats().dropped_queue_full == 0);
  }
  CHECK(s.avail() == s.start_avail);
}

TEST_CASE("destroying a link frees the frames it holds") {
  stage s;
  {
    auto l = make(s, model(1, std::chrono::nanoseconds(1s)));
    s.send(50);
    settle(*l, 0);
    CHECK(l->stats().held == 50);
    CHECK(s.avail() == s.start_avail - 50);
  }
  CHECK(s.avail() == s.start_avail);
}

TEST_CASE("a fixed seed reproduces the counters and the delivery order") {
  auto run = [](std::uint64_t seed) {
    stage s;
    link_model m = model(25, 3000ns);
    m.loss = 0.1;
    m.duplicate = 0.1;
    m.reorder = 0.2;
    m.seed = seed;
    auto l = make(s, m);
    std::vector<std::uint32_t> order;
    for (std::uint64_t step = 0; step < 20; ++step) {
      s.send(25, static_cast<std::uint32_t>(step * 25), static_cast<std::uint16_t>(64 + step * 70));
      l->poll(step * 5000);
      const auto got = s.receive();
      order.insert(order.end(), got.begin(), got.end());
    }
    settle(*l, 10'000'000);
    const auto got = s.receive();
    order.insert(order.end(), got.begin(), got.end());
    const link_stats st = l->stats();
    CHECK(st.packets_in + st.duplicated ==
          st.packets_delivered + st.dropped_loss + st.dropped_queue_full + st.dup_no_mbuf + st.held);
    CHECK(st.held == 0);
    CHECK(order.size() == st.packets_delivered);
    std::string json = l->to_json();
    l.reset();
    CHECK(s.avail() == s.start_avail);
    return std::make_pair(json, order);
  };
  const auto a = run(2024);
  const auto b = run(2024);
  const auto c = run(2025);
  CHECK(a.first == b.first);
  CHECK(a.second == b.second);
  CHECK(a.second != c.second);
  CHECK(a.first.find("\"reordered\":0,") == std::string::npos);
}

TEST_CASE("create rejects null or identical rings, invalid models and duplicates without a pool") {
  stage s;
  auto bad = [](const spin::result<std::unique_ptr<emu::link>>& r, const char* msg) {
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == spin::errc::invalid_argument);
    INFO(r.err().message);
    CHECK(r.err().message.find(msg) != std::string::npos);
  };
  bad(emu::link::create(nullptr, s.out, s.pool, link_model{}), "link: the input ring is null");
  bad(emu::link::create(s.in, nullptr, s.pool, link_model{}), "link: the output ring is null");
  bad(emu::link::create(s.in, s.in, s.pool, link_model{}), "link: the input and output rings are the same ring");
  link_model m;
  m.loss = 1;
  bad(emu::link::create(s.in, s.out, s.pool, m), "link model: loss is a probability and must be in [0, 1), got 1");
  m.loss = 0;
  m.duplicate = 0.1;
  bad(emu::link::create(s.in, s.out, nullptr, m), "link: duplicate = 0.10000000000000001 needs a mempool for the copies");
  m.duplicate = 0;
  CHECK(emu::link::create(s.in, s.out, nullptr, m).ok());
}

}  // TEST_SUITE
