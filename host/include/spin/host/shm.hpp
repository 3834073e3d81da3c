// Shared memory between spin-emu and host processes: memory files (memfd) mapped by both
// sides, and the event ring through which an EC's host events reach the host.
//
// Trust. The host maps the same pages and may write anything into them at any time. The
// emulator side (shm_region::map_fd, event_ring_producer) therefore treats shared memory as
// untrusted input: it keeps its own copy of every size and index it needs, reads each shared
// word once, and never addresses outside its mapping or loops on a value the host controls.
// Regions the emulator maps are sealed against shrinking (F_SEAL_SHRINK), so a host cannot turn
// an access inside the mapping into SIGBUS by truncating the file.
#pragma once

#include <spin/result.hpp>
#include <spin/rt/runtime.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace spin::host {

/// A shared memory file mapped read-write (MAP_SHARED). Move-only; unmaps and closes its file
/// descriptor on destruction. An object may be used from any thread; the bytes it maps follow
/// whatever protocol the users agree on (none is imposed here).
class shm_region {
public:
  /// An empty region (no mapping, fd() == -1).
  shm_region() = default;
  ~shm_region();
  shm_region(shm_region&& o) noexcept;
  shm_region& operator=(shm_region&& o) noexcept;
  shm_region(const shm_region&) = delete;
  shm_region& operator=(const shm_region&) = delete;

  /// Creates a zero-filled memory file of `bytes` bytes (memfd_create with MFD_CLOEXEC and
  /// MFD_ALLOW_SEALING; `name` shows in /proc/PID/fd and is cut to 249 bytes), seals its size
  /// (F_SEAL_SHRINK | F_SEAL_GROW) and maps it. Errors: invalid_argument (bytes == 0, or above
  /// 2^46), no_memory (memfd_create, ftruncate or mmap failed; the message quotes errno).
  static result<shm_region> create(std::string name, std::size_t bytes);

  /// Maps the memory file behind `fd`, which the caller keeps (this object maps a duplicate).
  /// Maps `expected_bytes` bytes, or the whole file when `expected_bytes` is 0. The file must
  /// be a regular file (a memfd or a tmpfs file) that accepts F_SEAL_SHRINK, which this call
  /// adds, so that nobody can truncate it under the mapping. Errors: invalid_argument (fd < 0,
  /// not a regular file, cannot be sealed against shrinking, file smaller than
  /// `expected_bytes`, an empty file, or a size above 2^46), no_memory (dup or mmap failed),
  /// each with a message naming the problem.
  static result<shm_region> map_fd(int fd, std::size_t expected_bytes);

  /// The mapped bytes (empty for an empty region).
  std::span<std::byte> span() const noexcept { return {_base, _len}; }
  /// The mapping's file descriptor (-1 for an empty region); owned by this object.
  int fd() const noexcept { return _fd; }
  /// Mapped bytes.
  std::size_t size_bytes() const noexcept { return _len; }
  /// True when a file is mapped.
  explicit operator bool() const noexcept { return _base != nullptr; }

private:
  shm_region(int fd, std::byte* base, std::size_t len) : _fd(fd), _base(base), _len(len) {}
  void reset() noexcept;
  int _fd = -1;
  std::byte* _base = nullptr;
  std::size_t _len = 0;
};

/// Layout of an event ring in shared memory (version 1): a 192-byte header, then `capacity`
/// records of 32 bytes. All integers are little-endian (both sides run on the same machine).
///
///   bytes   0..63   magic (u64 "SPINEVQ1"), layout version (u32 = 1), record_bytes (u32 = 32),
///                   capacity (u64, a power of two), the rest zero
///   bytes  64..127  head (u64 atomic: records ever written; the producer's line),
///                   dropped (u64 atomic: events lost because the ring was full),
///                   wake (u32 at 80: the producer adds one, then wakes the futex on it, after
///                   a push that finds `waiting` set)
///   bytes 128..191  tail (u64 atomic: records ever read; the consumer's line),
///                   waiting (u32 at 136: the consumer sets it before it sleeps on `wake`)
///   bytes 192..     record i of the sequence lives at 192 + (i mod capacity) * 32
///
/// The producer writes records, then stores head with release order; the consumer loads head
/// with acquire order, reads records, then stores tail with release order. A consumer with
/// nothing to read sets `waiting`, checks head again and sleeps on `wake` (a futex word shared
/// between the processes); the producer, after storing head, reads `waiting` and, when set,
/// bumps `wake` and wakes it. Both sides fence (seq_cst) between their store and their load, so
/// one of them sees the other's store: no wake-up is lost. A producer that never wakes (an older
/// one) costs only latency: the consumer sleeps at most 2 ms at a time.
namespace event_ring_layout {
inline constexpr std::uint64_t magic = 0x3151564550495053ull;  // "SPINEVQ1"
inline constexpr std::uint32_t version = 1;
inline constexpr std::size_t header_bytes = 192;
inline constexpr std::size_t head_offset = 64;
inline constexpr std::size_t dropped_offset = 72;
inline constexpr std::size_t wake_offset = 80;
inline constexpr std::size_t tail_offset = 128;
inline constexpr std::size_t waiting_offset = 136;
/// Largest capacity a ring may have (events).
inline constexpr std::uint32_t max_capacity = 1u << 24;

/// One event as stored in the ring: rt::host_event with a fixed layout.
struct record {
  std::uint32_t type;         ///< rt::host_event::kind
  std::int32_t code;          ///< spin::errc
  std::uint32_t source_rank;
  std::uint32_t reserved;     ///< zero
  std::uint64_t message_id;
  std::uint64_t value;
};
static_assert(sizeof(record) == 32 && alignof(record) == 8, "event records are 32 bytes");

/// Bytes of a ring of `capacity` records.
constexpr std::size_t bytes_for(std::uint32_t capacity) { return header_bytes + std::size_t{capacity} * sizeof(record); }
} // namespace event_ring_layout

/// Producer side of an event ring (spin-emu). One thread at a time may push (SPSC).
class event_ring_producer {
public:
  /// Creates a ring of `capacity` events (rounded up to a power of two) in a new memory file
  /// and initialises its header. The consumer maps region().fd(). Errors: invalid_argument
  /// (capacity 0 or above event_ring_layout::max_capacity), those of shm_region::create.
  static result<event_ring_producer> create(std::uint32_t capacity);

  /// Attaches to a ring in `region` that someone else initialised. Validates the header once
  /// (magic, version, record size, capacity a power of two whose records fit in the mapping)
  /// and keeps its own copies of capacity and head; later changes to the shared header cannot
  /// make the producer address outside the mapping. Errors: invalid_argument naming the bad
  /// field.
  static result<event_ring_producer> attach(shm_region region);

  /// Appends up to events.size() events without blocking and returns how many were written.
  /// The rest are lost: they are added to the shared `dropped` counter so that the consumer
  /// sees them missing. A tail the consumer (or anyone) corrupted so that it claims more free
  /// space than the ring has counts as a full ring. noexcept; no allocation; no system call.
  std::size_t try_push_burst(std::span<const rt::host_event> events) noexcept;

  /// Events lost so far (the producer's own count).
  std::uint64_t dropped() const noexcept { return _dropped; }
  /// Capacity in events.
  std::uint32_t capacity() const noexcept { return _capacity; }
  /// The shared memory; its fd is what the consumer maps.
  const shm_region& region() const noexcept { return _region; }

private:
  event_ring_producer(shm_region r, std::uint32_t cap, std::uint64_t head, std::uint64_t dropped)
      : _region(std::move(r)), _capacity(cap), _head(head), _dropped(dropped) {}
  shm_region _region;
  std::uint32_t _capacity = 0;
  std::uint64_t _head = 0;
  std::uint64_t _dropped = 0;
};

/// Consumer side of an event ring (the host). One thread at a time may pop (SPSC).
class event_ring_consumer {
public:
  /// Attaches to a ring the producer created. Validates the header like
  /// event_ring_producer::attach. Errors: invalid_argument naming the bad field.
  static result<event_ring_consumer> attach(shm_region region);

  /// Reads up to out.size() events without blocking; returns the count (0 when empty).
  std::size_t try_pop_burst(std::span<rt::host_event> out) noexcept;

  /// Reads up to out.size() events, waiting at most `timeout` for the first one: polls for about
  /// 20 microseconds (yielding the core), then sleeps on the ring's futex until the producer
  /// wakes it (the layout above). Returns the count, 0 on timeout.
  std::size_t pop_wait(std::span<rt::host_event> out, std::chrono::milliseconds timeout) noexcept;

  /// Events the producer could not store because the ring was full (from the shared header).
  std::uint64_t dropped() const noexcept;
  /// Capacity in events.
  std::uint32_t capacity() const noexcept { return _capacity; }

private:
  event_ring_consumer(shm_region r, std::uint32_t cap, std::uint64_t tail) : _region(std::move(r)), _capacity(cap), _tail(tail) {}
  shm_region _region;
  std::uint32_t _capacity = 0;
  std::uint64_t _tail = 0;
};

} // namespace spin::host
