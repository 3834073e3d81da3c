// Shared memory regions and the event ring: what both sides see, wrap-around, drops when full,
// and a producer that stays inside its mapping whatever the (untrusted) shared header says.
#include <spin/host/shm.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

using namespace spin;
using namespace spin::host;
namespace L = spin::host::event_ring_layout;

namespace {

rt::host_event ev(std::uint64_t i) {
  rt::host_event e;
  e.type = (i % 3 == 0) ? rt::host_event::kind::error : rt::host_event::kind::handler;
  e.code = (i % 3 == 0) ? errc::aborted : errc::ok;
  e.source_rank = static_cast<std::uint32_t>(i * 7);
  e.message_id = i;
  e.value = ~i;
  return e;
}

bool same(const rt::host_event& a, const rt::host_event& b) {
  return a.type == b.type && a.code == b.code && a.source_rank == b.source_rank && a.message_id == b.message_id &&
         a.value == b.value;
}

// A second mapping of the producer's ring, as a host would map it.
event_ring_consumer consumer_of(const event_ring_producer& p) {
  auto m = shm_region::map_fd(p.region().fd(), 0);
  REQUIRE_MESSAGE(m.ok(), (m.ok() ? std::string() : m.err().message));
  auto c = event_ring_consumer::attach(std::move(m.value()));
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message));
  return std::move(c.value());
}

std::uint64_t& word(const shm_region& r, std::size_t off) { return *reinterpret_cast<std::uint64_t*>(r.span().data() + off); }

} // namespace

TEST_SUITE("emulator") {

TEST_CASE("a shared region's bytes are visible through a second mapping of its descriptor") {
  auto a = shm_region::create("test", 10000);
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? std::string() : a.err().message));
  CHECK(a->size_bytes() == 10000);
  auto b = shm_region::map_fd(a->fd(), 0);
  REQUIRE_MESSAGE(b.ok(), (b.ok() ? std::string() : b.err().message));
  CHECK(b->size_bytes() == 10000);
  CHECK(b->fd() != a->fd());
  a->span()[9999] = std::byte{0x5a};
  CHECK(b->span()[9999] == std::byte{0x5a});
  // A region moved from is empty; the moved-to one keeps the mapping.
  shm_region c = std::move(b.value());
  CHECK_FALSE(*b);
  CHECK(c.span()[9999] == std::byte{0x5a});
}

TEST_CASE("map_fd refuses descriptors that are not sealable memory files or are too small") {
  SUBCASE("no descriptor") { CHECK(shm_region::map_fd(-1, 0).err().code == errc::invalid_argument); }
  SUBCASE("a pipe") {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    auto r = shm_region::map_fd(p[0], 0);
    CHECK(r.err().code == errc::invalid_argument);
    CHECK(r.err().message.find("regular file") != std::string::npos);
    ::close(p[0]);
    ::close(p[1]);
  }
  SUBCASE("a memfd without sealing cannot be protected against truncation") {
    const int fd = ::memfd_create("nosealing", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 4096) == 0);
    auto r = shm_region::map_fd(fd, 4096);
    CHECK(r.err().code == errc::invalid_argument);
    CHECK(r.err().message.find("sealed") != std::string::npos);
    ::close(fd);
  }
  SUBCASE("a file smaller than announced") {
    auto a = shm_region::create("small", 4096);
    REQUIRE(a.ok());
    auto r = shm_region::map_fd(a->fd(), 8192);
    CHECK(r.err().code == errc::invalid_argument);
    CHECK(r.err().message.find("4096") != std::string::npos);
  }
  SUBCASE("an empty file") {
    const int fd = ::memfd_create("empty", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    REQUIRE(fd >= 0);
    CHECK(shm_region::map_fd(fd, 0).err().code == errc::invalid_argument);
    ::close(fd);
  }
  SUBCASE("zero bytes cannot be created") { CHECK(shm_region::create("zero", 0).err().code == errc::invalid_argument); }
}

TEST_CASE("a mapped memory file cannot be truncated under the mapping") {
  const int fd = ::memfd_create("host", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 8192) == 0);
  auto r = shm_region::map_fd(fd, 8192);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.err().message));
  CHECK(::ftruncate(fd, 0) != 0);  // F_SEAL_SHRINK
  r->span()[8191] = std::byte{1};  // would be SIGBUS after a truncation
  ::close(fd);
}

TEST_CASE("events pushed by the producer are popped in order by the consumer across wrap-around") {
  auto p = event_ring_producer::create(5);  // rounded up to 8
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? std::string() : p.err().message));
  CHECK(p->capacity() == 8);
  CHECK(p->region().size_bytes() == L::bytes_for(8));
  auto c = consumer_of(*p);
  std::uint64_t next_in = 0, next_out = 0;
  for (int round = 0; round < 50; ++round) {
    std::vector<rt::host_event> in;
    for (int k = 0; k < 1 + round % 7; ++k) in.push_back(ev(next_in + k));
    REQUIRE(p->try_push_burst(in) == in.size());
    next_in += in.size();
    std::vector<rt::host_event> out(16);
    const std::size_t n = c.try_pop_burst(out);
    REQUIRE(n == in.size());
    for (std::size_t k = 0; k < n; ++k) CHECK(same(out[k], ev(next_out + k)));
    next_out += n;
  }
  CHECK(next_out > 8 * 20);  // wrapped many times
  CHECK(c.dropped() == 0);
  std::vector<rt::host_event> out(4);
  CHECK(c.try_pop_burst(out) == 0);
}

TEST_CASE("a full ring takes what fits and counts the rest as dropped in the shared header") {
  auto p = event_ring_producer::create(4);
  REQUIRE(p.ok());
  auto c = consumer_of(*p);
  std::vector<rt::host_event> in;
  for (int k = 0; k < 6; ++k) in.push_back(ev(k));
  CHECK(p->try_push_burst(in) == 4);
  CHECK(p->dropped() == 2);
  CHECK(c.dropped() == 2);
  CHECK(p->try_push_burst(std::span(in).first(1)) == 0);
  CHECK(c.dropped() == 3);
  std::vector<rt::host_event> out(8);
  REQUIRE(c.try_pop_burst(out) == 4);
  for (int k = 0; k < 4; ++k) CHECK(same(out[k], ev(k)));
  // Room again after the consumer read.
  CHECK(p->try_push_burst(std::span(in).subspan(4)) == 2);
  REQUIRE(c.try_pop_burst(out) == 2);
  CHECK(same(out[1], ev(5)));
}

TEST_CASE("pop_wait returns 0 after its timeout and an event pushed meanwhile from another thread") {
  auto p = event_ring_producer::create(16);
  REQUIRE(p.ok());
  auto c = consumer_of(*p);
  std::vector<rt::host_event> out(4);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(c.pop_wait(out, std::chrono::milliseconds(30)) == 0);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(30));
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const rt::host_event e = ev(42);
    (void)p->try_push_burst(std::span(&e, 1));
  });
  const std::size_t n = c.pop_wait(out, std::chrono::seconds(10));
  producer.join();
  REQUIRE(n == 1);
  CHECK(same(out[0], ev(42)));
}

TEST_CASE("attach refuses a header whose capacity does not fit the mapping or is not a power of two") {
  auto p = event_ring_producer::create(8);
  REQUIRE(p.ok());
  auto check_refused = [&](std::size_t off, std::uint64_t value, const char* what) {
    auto m = shm_region::map_fd(p->region().fd(), 0);
    REQUIRE(m.ok());
    const std::uint64_t saved = word(*m, off);
    word(*m, off) = value;
    auto a = shm_region::map_fd(p->region().fd(), 0);
    REQUIRE(a.ok());
    auto r = event_ring_producer::attach(std::move(a.value()));
    CHECK_MESSAGE(r.err().code == errc::invalid_argument, what);
    CHECK_MESSAGE(r.err().message.find(what) != std::string::npos, r.err().message);
    auto b = shm_region::map_fd(p->region().fd(), 0);
    REQUIRE(b.ok());
    CHECK(event_ring_consumer::attach(std::move(b.value())).err().code == errc::invalid_argument);
    word(*m, off) = saved;
  };
  check_refused(16, 1u << 20, "bytes");        // capacity far beyond the mapping
  check_refused(16, 6, "power of two");
  check_refused(16, 0, "power of two");
  check_refused(0, 0x1234, "magic");
  auto tiny = shm_region::create("tiny", 64);
  REQUIRE(tiny.ok());
  CHECK(event_ring_producer::attach(std::move(tiny.value())).err().message.find("header") != std::string::npos);
}

TEST_CASE("a producer whose shared header is scribbled on after attach never writes outside its records") {
  // The ring lives inside a larger mapping whose bytes after the ring are a canary: any write
  // the producer made outside its records would show there (and ASan would see overruns of
  // private memory; this mapping is shared, so the canary is the check).
  constexpr std::uint32_t cap = 16;
  const std::size_t ring_bytes = L::bytes_for(cap);
  auto made = event_ring_producer::create(cap);
  REQUIRE(made.ok());
  // A region exactly the ring's size, followed by a guard page we can detect writes to: map
  // ring + 1 page from a bigger file, and keep the page as canary.
  auto big = shm_region::create("canary", ring_bytes + 4096);
  REQUIRE(big.ok());
  std::memcpy(big->span().data(), made->region().span().data(), ring_bytes);
  std::memset(big->span().data() + ring_bytes, 0xa5, 4096);
  auto ring_map = shm_region::map_fd(big->fd(), ring_bytes);
  REQUIRE(ring_map.ok());
  auto p = event_ring_producer::attach(std::move(ring_map.value()));
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? std::string() : p.err().message));
  CHECK(p->capacity() == cap);

  const std::uint64_t garbage[] = {0, 1, cap, cap + 1, 0x7fffffffffffffffull, 0xffffffffffffffffull, 0xdeadbeefcafef00dull};
  std::vector<rt::host_event> in(40, ev(1));
  std::uint64_t pushed = 0, offered = 0;
  for (std::uint64_t capacity_lie : {std::uint64_t{1} << 40, std::uint64_t{3}, std::uint64_t{0}}) {
    word(*big, 16) = capacity_lie;
    for (std::uint64_t t : garbage)
      for (std::uint64_t h : garbage) {
        word(*big, L::tail_offset) = t;
        word(*big, L::head_offset) = h;
        word(*big, L::dropped_offset) = h ^ t;
        const std::size_t n = p->try_push_burst(in);
        CHECK(n <= cap);
        pushed += n;
        offered += in.size();
      }
  }
  CHECK(p->dropped() == offered - pushed);
  for (std::size_t i = 0; i < 4096; ++i) REQUIRE(big->span()[ring_bytes + i] == std::byte{0xa5});
  // The producer wrote records only: bytes 24..63 of the header stay as they were (zero).
  for (std::size_t i = 24; i < 64; ++i) CHECK(big->span()[i] == std::byte{0});
}

TEST_CASE("a consumer that lags more than a ring behind resumes at data that is still there") {
  auto p = event_ring_producer::create(4);
  REQUIRE(p.ok());
  auto c = consumer_of(*p);
  std::vector<rt::host_event> out(8);
  // Forge a producer head 10 ahead (as if records had been overwritten).
  auto m = shm_region::map_fd(p->region().fd(), 0);
  REQUIRE(m.ok());
  word(*m, L::head_offset) = 10;
  CHECK(c.try_pop_burst(out) == 4);  // clamped to the capacity, no read outside the records
  CHECK(c.try_pop_burst(out) == 0);
  CHECK(word(*m, L::tail_offset) == 10);
}

TEST_CASE("a consumer that sleeps on an empty ring says so in the header, and the producer's push wakes it through the futex") {
  auto p = event_ring_producer::create(8);
  REQUIRE(p.ok());
  auto c = consumer_of(*p);
  const shm_region& r = p->region();
  auto u32_at = [&](std::size_t off) { return std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(r.span().data() + off)).load(); };
  std::size_t got = 0;
  rt::host_event e;
  std::thread t([&] { got = c.pop_wait(std::span(&e, 1), std::chrono::seconds(20)); });
  // The consumer announces its sleep (bounded wait for the thread to get there).
  for (int i = 0; i < 2000 && u32_at(L::waiting_offset) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(u32_at(L::waiting_offset) == 1);
  CHECK(u32_at(L::wake_offset) == 0);
  const rt::host_event sent = ev(3);
  CHECK(p->try_push_burst(std::span(&sent, 1)) == 1);
  t.join();
  CHECK(got == 1);
  CHECK(same(e, sent));
  CHECK(u32_at(L::wake_offset) >= 1);  // the producer bumped the futex word and woke the sleeper
  CHECK(u32_at(L::waiting_offset) == 0);
}

} // TEST_SUITE
