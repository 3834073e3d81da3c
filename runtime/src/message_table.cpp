#include "message_table.hpp"

#include <algorithm>
#include <bit>

namespace spin::rt::detail {

void message_table::init(std::uint32_t open_max, std::uint32_t retired_history, std::uint32_t window_packets) {
  const std::uint32_t entries = open_max + retired_history;
  _window = (window_packets + 63) / 64 * 64;
  _window_words = std::bit_ceil(_window / 64);
  _bit_mask = _window_words * 64 - 1;
  _msgs.assign(entries, message{});
  _bitmaps.assign(std::uint64_t{entries} * _window_words, 0);
  _free.clear();
  _free.reserve(entries);
  for (std::uint32_t i = entries; i-- > 0;) _free.push_back(i);
  // At most half the slots in use: a group overflows rarely.
  const std::uint64_t groups = std::bit_ceil((std::uint64_t{entries} * 2 + group_slots - 1) / group_slots);
  _index_store.assign(groups * group_slots + group_slots, 0);
  const auto addr = reinterpret_cast<std::uintptr_t>(_index_store.data());
  _slots = _index_store.data() + ((64 - addr % 64) % 64) / sizeof(std::uint64_t);
  _overflow.assign(groups, 0);
  _group_mask = static_cast<std::uint32_t>(groups - 1);
  _retired.assign(retired_history, 0);
  _retired_head = _retired_count = 0;
}

namespace {

// Bit k set when slot k of the group holds a key of hash `hash` (never an empty slot: hashes are
// non-zero).
inline std::uint32_t match_hash(const std::uint64_t* g, std::uint32_t hash) noexcept {
  std::uint32_t m = 0;
  for (std::uint32_t k = 0; k < 8; ++k) m |= static_cast<std::uint32_t>(static_cast<std::uint32_t>(g[k] >> 32) == hash) << k;
  return m;
}
// Bit k set when slot k holds exactly `v`.
inline std::uint32_t match_value(const std::uint64_t* g, std::uint64_t v) noexcept {
  std::uint32_t m = 0;
  for (std::uint32_t k = 0; k < 8; ++k) m |= static_cast<std::uint32_t>(g[k] == v) << k;
  return m;
}

} // namespace

std::uint32_t message_table::find(std::uint32_t hash, std::uint32_t source, std::uint64_t id) const noexcept {
  for (std::uint32_t g = hash & _group_mask;; g = (g + 1) & _group_mask) {
    for (std::uint32_t m = match_hash(group(g), hash); m != 0; m &= m - 1) {
      const auto idx = static_cast<std::uint32_t>(group(g)[std::countr_zero(m)]) - 1;
      const message& e = _msgs[idx];
      if (e.source == source && e.id == id) return idx;
    }
    if (_overflow[g] == 0) return none;
  }
}

void message_table::index_insert(std::uint32_t hash, std::uint32_t idx) noexcept {
  // The table holds at most half as many keys as slots: some group has room.
  for (std::uint32_t g = hash & _group_mask;; g = (g + 1) & _group_mask) {
    if (const std::uint32_t room = match_value(group(g), 0); room != 0) {
      group(g)[std::countr_zero(room)] = (std::uint64_t{hash} << 32) | (idx + 1);
      return;
    }
    ++_overflow[g];
  }
}

void message_table::index_erase(std::uint32_t idx, std::uint32_t hash) noexcept {
  const std::uint64_t v = (std::uint64_t{hash} << 32) | (idx + 1);
  for (std::uint32_t g = hash & _group_mask;; g = (g + 1) & _group_mask) {
    if (const std::uint32_t m = match_value(group(g), v); m != 0) {
      group(g)[std::countr_zero(m)] = 0;
      return;
    }
    --_overflow[g];  // the key passed this group on insertion
  }
}

// The ring wraps by comparison: a division per packet would cost more than the rest of the
// bookkeeping.
void message_table::evict_oldest() noexcept {
  const std::uint64_t old = _retired[_retired_head];
  if (++_retired_head == _retired.size()) _retired_head = 0;
  --_retired_count;
  release(static_cast<std::uint32_t>(old), static_cast<std::uint32_t>(old >> 32));
}

// Starts loading what evicting the oldest retired message will touch (its entry and its index
// slot), when the next open or settle will evict it: no free entry left, or the FIFO full. In
// steady state every new message evicts one, long after it was last touched.
void message_table::prefetch_victim() const noexcept {
  if (_retired_count == 0 || (!_free.empty() && _retired_count < _retired.size())) return;
  const std::uint64_t v = _retired[_retired_head];
  __builtin_prefetch(&_msgs[static_cast<std::uint32_t>(v)], 1);
  __builtin_prefetch(group(static_cast<std::uint32_t>(v >> 32) & _group_mask), 1);
}

// Bits stay set only for packets received ahead of base (seq in (base, highest)): cleared when
// the message leaves the open state, while its entry is still in the cache, so that an entry
// opens with a clean window and an evicted one is never read.
void message_table::clear_window(std::uint32_t idx) noexcept {
  const message& m = _msgs[idx];
  if (m.highest > m.base)
    std::fill_n(_bitmaps.begin() + static_cast<std::ptrdiff_t>(std::uint64_t{idx} * _window_words), _window_words, 0);
}

// The key's hash comes from the caller (the retired FIFO keeps it), so that evicting the oldest
// retired message writes its entry but does not wait to read it.
void message_table::release(std::uint32_t idx, std::uint32_t hash) noexcept {
  index_erase(idx, hash);
  _msgs[idx].state = msg_state::free;  // open() initialises every field
  _free.push_back(idx);
}

void message_table::free(std::uint32_t idx) noexcept {
  if (_msgs[idx].state != msg_state::retired) clear_window(idx);
  release(idx, _msgs[idx].hash);
}

std::uint32_t message_table::open(std::uint32_t hash, std::uint32_t source, std::uint64_t id) noexcept {
  if (_free.empty()) {
    if (_retired_count == 0) return none;
    evict_oldest();
  }
  const std::uint32_t idx = _free.back();
  _free.pop_back();
  message& m = _msgs[idx];
  m = message{};
  m.source = source;
  m.hash = hash;
  m.id = id;
  m.state = msg_state::open;
  index_insert(hash, idx);
  return idx;
}

seq_verdict message_table::check(std::uint32_t idx, std::uint32_t seq, bool end) const noexcept {
  const message& m = _msgs[idx];
  if (m.packet_count != 0 && seq >= m.packet_count) return seq_verdict::bad_sequence;
  if (end && m.highest > seq + 1) return seq_verdict::bad_sequence;
  if (seq < m.base) return seq_verdict::duplicate;
  if (seq - m.base >= _window) return seq_verdict::out_of_window;
  // In-order arrival with nothing received ahead (every one-packet message, most streams) needs
  // no bitmap: all its bits are clear (see clear_window()).
  if (seq == m.base && m.highest <= m.base) return seq_verdict::in_order;
  const std::uint64_t* bits = _bitmaps.data() + std::uint64_t{idx} * _window_words;
  const std::uint32_t bit = seq & _bit_mask;
  return (bits[bit / 64] & (std::uint64_t{1} << (bit % 64))) ? seq_verdict::duplicate : seq_verdict::accept;
}

void message_table::mark(std::uint32_t idx, std::uint32_t seq, bool end, seq_verdict v) noexcept {
  message& m = _msgs[idx];
  if (v == seq_verdict::in_order) {
    ++m.base;
  } else {
    std::uint64_t* bits = _bitmaps.data() + std::uint64_t{idx} * _window_words;
    const std::uint32_t bit = seq & _bit_mask;
    bits[bit / 64] |= std::uint64_t{1} << (bit % 64);
    while (true) {
      const std::uint32_t b = m.base & _bit_mask;
      if (!(bits[b / 64] & (std::uint64_t{1} << (b % 64)))) break;
      bits[b / 64] &= ~(std::uint64_t{1} << (b % 64));
      ++m.base;
    }
  }
  m.highest = std::max(m.highest, seq + 1);
  if (end) {
    m.eom_seen = true;
    m.packet_count = seq + 1;
  }
}

void message_table::settle(std::uint32_t idx) noexcept {
  clear_window(idx);
  _msgs[idx].state = msg_state::retired;
  if (_retired.empty()) {
    free(idx);
    return;
  }
  if (_retired_count == _retired.size()) evict_oldest();
  std::uint32_t tail = _retired_head + _retired_count;
  if (tail >= _retired.size()) tail -= static_cast<std::uint32_t>(_retired.size());
  _retired[tail] = std::uint64_t{_msgs[idx].hash} << 32 | idx;
  ++_retired_count;
  prefetch_victim();
}

} // namespace spin::rt::detail
