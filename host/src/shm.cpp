#include <spin/host/shm.hpp>

#include <atomic>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <thread>

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

namespace spin::host {

namespace {

// Sizes above this are refused: far beyond any host buffer, and it keeps offset arithmetic
// on the 64-bit sizes free of overflow.
constexpr std::size_t max_region_bytes = std::size_t{1} << 46;

std::string errno_text(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

// Shared words are accessed through atomic_ref: the other process may write them at any time.
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free, "cross-process atomics need lock-free u64");

std::uint64_t load_shared(std::byte* base, std::size_t off, std::memory_order mo) noexcept {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(base + off)).load(mo);
}
void store_shared(std::byte* base, std::size_t off, std::uint64_t v, std::memory_order mo) noexcept {
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(base + off)).store(v, mo);
}

static_assert(std::atomic_ref<std::uint32_t>::is_always_lock_free, "cross-process futex words need lock-free u32");
std::atomic_ref<std::uint32_t> shared_u32(std::byte* base, std::size_t off) noexcept {
  return std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(base + off));
}
// Futexes on memory shared between processes: the non-private operations.
void futex_wait_shared(std::byte* word, std::uint32_t expected, std::chrono::nanoseconds timeout) noexcept {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake_shared(std::byte* word) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

struct header_fields {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t record_bytes;
  std::uint64_t capacity;
};

// Reads and checks the header of a ring in `r`; returns its capacity.
result<std::uint32_t> check_header(const shm_region& r) {
  namespace L = event_ring_layout;
  if (r.size_bytes() < L::header_bytes)
    return fail(errc::invalid_argument, "event ring: mapping of " + std::to_string(r.size_bytes()) +
                                            " bytes is smaller than the " + std::to_string(L::header_bytes) + "-byte header");
  header_fields h{};
  std::memcpy(&h, r.span().data(), sizeof(h));
  if (h.magic != L::magic) return fail(errc::invalid_argument, "event ring: bad magic (not an event ring)");
  if (h.version != L::version)
    return fail(errc::invalid_argument, "event ring: layout version " + std::to_string(h.version) + ", expected " +
                                            std::to_string(L::version));
  if (h.record_bytes != sizeof(L::record))
    return fail(errc::invalid_argument, "event ring: record size " + std::to_string(h.record_bytes) + ", expected " +
                                            std::to_string(sizeof(L::record)));
  if (h.capacity == 0 || h.capacity > L::max_capacity || !std::has_single_bit(h.capacity))
    return fail(errc::invalid_argument,
                "event ring: capacity " + std::to_string(h.capacity) + " is not a power of two in 1.." + std::to_string(L::max_capacity));
  const auto cap = static_cast<std::uint32_t>(h.capacity);
  if (L::bytes_for(cap) > r.size_bytes())
    return fail(errc::invalid_argument, "event ring: " + std::to_string(cap) + " records need " +
                                            std::to_string(L::bytes_for(cap)) + " bytes, the mapping has " +
                                            std::to_string(r.size_bytes()));
  return cap;
}

} // namespace

// ---- shm_region ----------------------------------------------------------------------------

shm_region::~shm_region() { reset(); }

shm_region::shm_region(shm_region&& o) noexcept : _fd(o._fd), _base(o._base), _len(o._len) {
  o._fd = -1;
  o._base = nullptr;
  o._len = 0;
}

shm_region& shm_region::operator=(shm_region&& o) noexcept {
  if (this != &o) {
    reset();
    std::swap(_fd, o._fd);
    std::swap(_base, o._base);
    std::swap(_len, o._len);
  }
  return *this;
}

void shm_region::reset() noexcept {
  if (_base != nullptr) ::munmap(_base, _len);
  if (_fd >= 0) ::close(_fd);
  _fd = -1;
  _base = nullptr;
  _len = 0;
}

result<shm_region> shm_region::create(std::string name, std::size_t bytes) {
  if (bytes == 0 || bytes > max_region_bytes)
    return fail(errc::invalid_argument, "shared memory '" + name + "': size " + std::to_string(bytes) + " is not in 1..2^46 bytes");
  if (name.size() > 249) name.resize(249);  // memfd names are at most 249 bytes
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return fail(errc::no_memory, "shared memory '" + name + "': memfd_create: " + errno_text(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    return fail(errc::no_memory, "shared memory '" + name + "': ftruncate to " + std::to_string(bytes) + " bytes: " + errno_text(e));
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    const int e = errno;
    ::close(fd);
    return fail(errc::no_memory, "shared memory '" + name + "': sealing its size: " + errno_text(e));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    return fail(errc::no_memory, "shared memory '" + name + "': mmap of " + std::to_string(bytes) + " bytes: " + errno_text(e));
  }
  return shm_region(fd, static_cast<std::byte*>(p), bytes);
}

result<shm_region> shm_region::map_fd(int fd, std::size_t expected_bytes) {
  if (fd < 0) return fail(errc::invalid_argument, "shared memory: no file descriptor");
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(errc::invalid_argument, "shared memory: fstat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) return fail(errc::invalid_argument, "shared memory: the file descriptor is not a regular file (memfd)");
  // Seal first, then read the size: from here on the file cannot shrink below what we map.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
    return fail(errc::invalid_argument, "shared memory: the file cannot be sealed against shrinking (create it with "
                                        "memfd_create(MFD_ALLOW_SEALING)): " + errno_text(errno));
  if (::fstat(fd, &st) != 0) return fail(errc::invalid_argument, "shared memory: fstat: " + errno_text(errno));
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
  if (file_bytes == 0) return fail(errc::invalid_argument, "shared memory: the file is empty");
  const std::uint64_t want = expected_bytes == 0 ? file_bytes : expected_bytes;
  if (want > max_region_bytes)
    return fail(errc::invalid_argument, "shared memory: size " + std::to_string(want) + " is above 2^46 bytes");
  if (file_bytes < want)
    return fail(errc::invalid_argument, "shared memory: the file has " + std::to_string(file_bytes) + " bytes, " +
                                            std::to_string(want) + " were announced");
  const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return fail(errc::no_memory, "shared memory: dup: " + errno_text(errno));
  void* p = ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, own, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(own);
    return fail(e == EACCES || e == EPERM ? errc::invalid_argument : errc::no_memory,
                "shared memory: mmap of " + std::to_string(want) + " bytes: " + errno_text(e));
  }
  return shm_region(own, static_cast<std::byte*>(p), static_cast<std::size_t>(want));
}

// ---- event ring ----------------------------------------------------------------------------

result<event_ring_producer> event_ring_producer::create(std::uint32_t capacity) {
  namespace L = event_ring_layout;
  if (capacity == 0 || capacity > L::max_capacity)
    return fail(errc::invalid_argument, "event ring: capacity " + std::to_string(capacity) + " is not in 1.." +
                                            std::to_string(L::max_capacity));
  const std::uint32_t cap = std::bit_ceil(capacity);
  auto r = shm_region::create("spin-events", L::bytes_for(cap));
  if (!r) return r.err();
  header_fields h{L::magic, L::version, static_cast<std::uint32_t>(sizeof(L::record)), cap};
  std::memcpy(r->span().data(), &h, sizeof(h));  // the file is fresh: head, tail, dropped are 0
  return event_ring_producer(std::move(r.value()), cap, 0, 0);
}

result<event_ring_producer> event_ring_producer::attach(shm_region region) {
  auto cap = check_header(region);
  if (!cap) return cap.err();
  std::byte* base = region.span().data();
  const std::uint64_t head = load_shared(base, event_ring_layout::head_offset, std::memory_order_acquire);
  const std::uint64_t dropped = load_shared(base, event_ring_layout::dropped_offset, std::memory_order_relaxed);
  return event_ring_producer(std::move(region), *cap, head, dropped);
}

std::size_t event_ring_producer::try_push_burst(std::span<const rt::host_event> events) noexcept {
  namespace L = event_ring_layout;
  if (events.empty() || !_region) return 0;
  std::byte* base = _region.span().data();
  // The tail is untrusted: read it once; a value claiming more free room than exists (or one
  // ahead of head) counts as a full ring.
  const std::uint64_t tail = load_shared(base, L::tail_offset, std::memory_order_acquire);
  const std::uint64_t used = _head - tail;
  const std::uint64_t room = used <= _capacity ? _capacity - used : 0;
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(room, events.size()));
  for (std::size_t i = 0; i < n; ++i) {
    const rt::host_event& e = events[i];
    const L::record rec{static_cast<std::uint32_t>(e.type), static_cast<std::int32_t>(e.code), e.source_rank, 0,
                        e.message_id, e.value};
    // The index comes from our own head and capacity; the mapping holds capacity records.
    std::memcpy(base + L::header_bytes + ((_head + i) & (_capacity - 1)) * sizeof(L::record), &rec, sizeof(rec));
  }
  _head += n;
  store_shared(base, L::head_offset, _head, std::memory_order_release);
  if (n > 0) {
    // A consumer asleep on `wake` (the layout's protocol): bump it and wake it. `waiting` is the
    // host's to write; whatever it holds costs at most one system call here.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (shared_u32(base, L::waiting_offset).load(std::memory_order_relaxed) != 0) {
      shared_u32(base, L::wake_offset).fetch_add(1, std::memory_order_release);
      futex_wake_shared(base + L::wake_offset);
    }
  }
  if (n < events.size()) {
    _dropped += events.size() - n;
    store_shared(base, L::dropped_offset, _dropped, std::memory_order_relaxed);
  }
  return n;
}

result<event_ring_consumer> event_ring_consumer::attach(shm_region region) {
  auto cap = check_header(region);
  if (!cap) return cap.err();
  const std::uint64_t tail = load_shared(region.span().data(), event_ring_layout::tail_offset, std::memory_order_acquire);
  return event_ring_consumer(std::move(region), *cap, tail);
}

std::size_t event_ring_consumer::try_pop_burst(std::span<rt::host_event> out) noexcept {
  namespace L = event_ring_layout;
  if (out.empty() || !_region) return 0;
  std::byte* base = _region.span().data();
  const std::uint64_t head = load_shared(base, L::head_offset, std::memory_order_acquire);
  const std::uint64_t avail = std::min<std::uint64_t>(head - _tail, _capacity);  // defensive clamp
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(avail, out.size()));
  for (std::size_t i = 0; i < n; ++i) {
    L::record rec;
    std::memcpy(&rec, base + L::header_bytes + ((_tail + i) & (_capacity - 1)) * sizeof(L::record), sizeof(rec));
    out[i] = rt::host_event{static_cast<rt::host_event::kind>(rec.type), static_cast<errc>(rec.code), rec.source_rank,
                            rec.message_id, rec.value};
  }
  // After a clamp, skip whatever the producer overwrote so that the next read starts at data
  // that is still there.
  _tail = head - avail + n;
  store_shared(base, L::tail_offset, _tail, std::memory_order_release);
  return n;
}

std::size_t event_ring_consumer::pop_wait(std::span<rt::host_event> out, std::chrono::milliseconds timeout) noexcept {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + timeout;
  namespace L = event_ring_layout;
  for (;;) {
    if (const std::size_t n = try_pop_burst(out); n > 0) return n;
    const auto now = clock::now();
    if (now >= deadline || !_region) return 0;
    if (now - start < std::chrono::microseconds(20)) {
      std::this_thread::yield();
      continue;
    }
    // Announce the sleep, look once more, then sleep until the producer bumps `wake`.
    std::byte* base = _region.span().data();
    const std::uint32_t seen = shared_u32(base, L::wake_offset).load(std::memory_order_acquire);
    shared_u32(base, L::waiting_offset).store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const std::size_t n = try_pop_burst(out);
    if (n == 0)
      futex_wait_shared(base + L::wake_offset, seen,
                        std::min<std::chrono::nanoseconds>(std::chrono::milliseconds(2), deadline - now));
    shared_u32(base, L::waiting_offset).store(0, std::memory_order_relaxed);
    if (n > 0) return n;
  }
}

std::uint64_t event_ring_consumer::dropped() const noexcept {
  if (!_region) return 0;
  return load_shared(_region.span().data(), event_ring_layout::dropped_offset, std::memory_order_relaxed);
}

} // namespace spin::host
