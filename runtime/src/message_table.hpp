// One HPU's message table of one EC: the open, held and recently retired messages keyed by
// (source rank, message id), each with its reorder window. Written and read by the thread
// driving the HPU only; sized at install, never allocates afterwards. Unit-tested on its own
// (tests/runtime/message_table_test.cpp).
#pragma once

#include <spin/rt/stats.hpp>

#include <cstdint>
#include <vector>

namespace spin::rt::detail {

inline constexpr std::uint32_t none = UINT32_MAX;

/// A message key's hash, never 0 (the index's empty slot): its index group is taken from the low
/// bits, and hpu_of_hash() takes its HPU from the high bits. Computed once per packet, kept in
/// the message and in the retired FIFO.
inline std::uint32_t key_hash(std::uint32_t source, std::uint64_t id) noexcept {
  std::uint64_t x = id ^ (std::uint64_t{source} * 0x9e3779b97f4a7c15ull);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  const auto h = static_cast<std::uint32_t>(x);
  return h + (h == 0);
}

/// The HPU of a key hash among `hpus` (multiply-shift: no division).
inline std::uint32_t hpu_of_hash(std::uint32_t hash, std::uint32_t hpus) noexcept {
  return static_cast<std::uint32_t>((std::uint64_t{hash} * hpus) >> 32);
}

enum class msg_state : std::uint8_t { free, open, held, retired };
enum class outcome : std::uint8_t { ok, dropped, aborted };

struct message {
  std::uint32_t source = 0;
  std::uint32_t hash = 0;
  std::uint64_t id = 0;
  std::uint64_t match_bits = 0;
  std::uint64_t len_bytes = 0;
  msg_state state = msg_state::free;
  outcome result = outcome::ok;
  bool header_done = false;  // the header handler returned (or the EC has none: see lane.cpp)
  bool proceed = false;      // a proceed return: skip the payload handlers still to come
  bool pending = false;      // a *_pending return: hold the entry after completion
  bool eom_seen = false;
  std::uint32_t packet_count = 0;  // 0 until the end packet is seen
  std::uint32_t base = 0;          // lowest seq not yet received
  std::uint32_t highest = 0;       // highest seq + 1 received
  std::uint32_t scratch_slot = none;
  std::uint32_t park_head = none, park_tail = none;
};

/// What `check` says of a packet for an open message.
enum class seq_verdict : std::uint8_t { accept, in_order, duplicate, out_of_window, bad_sequence };

class message_table {
public:
  /// Sizes the table for `open_max` open or held messages plus `retired_history` retired keys,
  /// with a reorder window of `window_packets` (rounded up to a multiple of 64; the bitmap per
  /// message to the next power of two). Throws std::bad_alloc (install catches it).
  void init(std::uint32_t open_max, std::uint32_t retired_history, std::uint32_t window_packets);

  std::uint32_t window() const noexcept { return _window; }
  message& operator[](std::uint32_t idx) noexcept { return _msgs[idx]; }
  const message& operator[](std::uint32_t idx) const noexcept { return _msgs[idx]; }
  std::uint32_t entries() const noexcept { return static_cast<std::uint32_t>(_msgs.size()); }

  /// The entry of (source, id) in any state but free, or none. `hash` is key_hash(source, id)
  /// here and in open() (any non-zero value in tests).
  std::uint32_t find(std::uint32_t hash, std::uint32_t source, std::uint64_t id) const noexcept;
  /// A new open entry for (source, id), evicting the oldest retired key when no entry is free;
  /// none when every entry is open or held. The caller fills the message's other fields.
  std::uint32_t open(std::uint32_t hash, std::uint32_t source, std::uint64_t id) noexcept;
  /// Checks sequence number `seq` (an end packet when `end`) against the open message `idx`.
  seq_verdict check(std::uint32_t idx, std::uint32_t seq, bool end) const noexcept;
  /// Marks `seq` received (after check said accept or in_order) and slides the window.
  void mark(std::uint32_t idx, std::uint32_t seq, bool end, seq_verdict v) noexcept;
  /// Moves a finished message to the retired history (its key is remembered for duplicates).
  void settle(std::uint32_t idx) noexcept;
  /// Frees an entry at once (uninstall, or a table without history).
  void free(std::uint32_t idx) noexcept;

private:
  static constexpr std::uint32_t group_slots = 8;  // one 64-byte cache line of slots
  const std::uint64_t* group(std::uint32_t g) const noexcept { return _slots + std::size_t{g} * group_slots; }
  std::uint64_t* group(std::uint32_t g) noexcept { return _slots + std::size_t{g} * group_slots; }
  void index_insert(std::uint32_t hash, std::uint32_t idx) noexcept;
  void index_erase(std::uint32_t idx, std::uint32_t hash) noexcept;
  void clear_window(std::uint32_t idx) noexcept;
  void release(std::uint32_t idx, std::uint32_t hash) noexcept;
  void evict_oldest() noexcept;
  void prefetch_victim() const noexcept;

  std::vector<message> _msgs;
  std::vector<std::uint64_t> _bitmaps;  // _window_words per message
  std::uint32_t _window = 0, _window_words = 0, _bit_mask = 0;
  std::vector<std::uint32_t> _free;
  // The index: groups of 8 slots, one cache line each, a slot (hash << 32) | (idx + 1) or 0 when
  // empty. A key lives in its home group (hash & _group_mask) or, when that was full at its
  // insertion, in the first later group with room; _overflow[g] counts the keys that passed group
  // g so, and a lookup goes on past g only while it is non-zero. A group is compared as a whole
  // into a bit mask (no branch per slot), and deletion only clears a slot: the table's cost per
  // message is a few predictable branches, where linear probing's backward-shift deletion and
  // probe loops mispredicted several times per message (measured: 25 ns per open + settle +
  // lookup before, see docs/benchmarks.md).
  std::vector<std::uint64_t> _index_store;  // the groups, with room to align them to 64 bytes
  std::uint64_t* _slots = nullptr;
  std::vector<std::uint32_t> _overflow;
  std::uint32_t _group_mask = 0;
  std::vector<std::uint64_t> _retired;  // FIFO of retired messages: hash << 32 | idx
  std::uint32_t _retired_head = 0, _retired_count = 0;
};

} // namespace spin::rt::detail
