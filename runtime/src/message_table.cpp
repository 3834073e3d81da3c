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
  _index.assign(std::bit_ceil(std::uint64_t{entries} * 2), 0);
  _index_mask = static_cast<std::uint32_t>(_index.size() - 1);
  _retired.assign(retired_history, 0);
  _retired_head = _retired_count = 0;
}

std::uint32_t message_table::find(std::uint32_t hash, std::uint32_t source, std::uint64_t id) const noexcept {
  for (std::uint32_t p = hash & _index_mask;; p = (p + 1) & _index_mask) {
    const std::uint64_t v = _index[p];
    if (v == 0) return none;
    if (static_cast<std::uint32_t>(v >> 32) != hash) continue;
    const auto idx = static_cast<std::uint32_t>(v) - 1;
    const message& m = _msgs[idx];
    if (m.source == source && m.id == id) return idx;
  }
}

void message_table::index_erase(std::uint32_t idx) noexcept {
  std::uint32_t p = _msgs[idx].hash & _index_mask;
  while (static_cast<std::uint32_t>(_index[p]) != idx + 1) p = (p + 1) & _index_mask;
  // Backward-shift deletion keeps linear probing free of tombstones.
  std::uint32_t hole = p;
  for (std::uint32_t q = (p + 1) & _index_mask; _index[q] != 0; q = (q + 1) & _index_mask) {
    const std::uint32_t home = static_cast<std::uint32_t>(_index[q] >> 32) & _index_mask;
    // Move q into the hole when its home does not lie cyclically in (hole, q].
    const bool stays = hole <= q ? (home > hole && home <= q) : (home > hole || home <= q);
    if (!stays) {
      _index[hole] = _index[q];
      hole = q;
    }
  }
  _index[hole] = 0;
}

// The ring wraps by comparison: a division per packet would cost more than the rest of the
// bookkeeping.
std::uint32_t message_table::pop_retired() noexcept {
  const std::uint64_t old = _retired[_retired_head];
  if (++_retired_head == _retired.size()) _retired_head = 0;
  --_retired_count;
  return static_cast<std::uint32_t>(old);
}

// Starts loading what evicting the oldest retired message will touch (its entry and its index
// slot), when the next open or settle will evict it: no free entry left, or the FIFO full. In
// steady state every new message evicts one, long after it was last touched.
void message_table::prefetch_victim() const noexcept {
  if (_retired_count == 0 || (!_free.empty() && _retired_count < _retired.size())) return;
  const std::uint64_t v = _retired[_retired_head];
  __builtin_prefetch(&_msgs[static_cast<std::uint32_t>(v)], 1);
  __builtin_prefetch(&_index[static_cast<std::uint32_t>(v >> 32) & _index_mask], 1);
}

void message_table::free(std::uint32_t idx) noexcept {
  index_erase(idx);
  message& m = _msgs[idx];
  // Bits stay set only for packets received ahead of base (seq in (base, highest)): clear them
  // here, so that a message opens with a clean window without touching it.
  if (m.highest > m.base)
    std::fill_n(_bitmaps.begin() + static_cast<std::ptrdiff_t>(std::uint64_t{idx} * _window_words), _window_words, 0);
  m.state = msg_state::free;  // open() initialises every field
  _free.push_back(idx);
}

std::uint32_t message_table::open(std::uint32_t hash, std::uint32_t source, std::uint64_t id) noexcept {
  if (_free.empty()) {
    if (_retired_count == 0) return none;
    free(pop_retired());
  }
  const std::uint32_t idx = _free.back();
  _free.pop_back();
  message& m = _msgs[idx];
  m = message{};
  m.source = source;
  m.hash = hash;
  m.id = id;
  m.state = msg_state::open;
  std::uint32_t p = hash & _index_mask;
  while (_index[p] != 0) p = (p + 1) & _index_mask;
  _index[p] = (std::uint64_t{hash} << 32) | (idx + 1);
  return idx;
}

seq_verdict message_table::check(std::uint32_t idx, std::uint32_t seq, bool end) const noexcept {
  const message& m = _msgs[idx];
  if (m.packet_count != 0 && seq >= m.packet_count) return seq_verdict::bad_sequence;
  if (end && m.highest > seq + 1) return seq_verdict::bad_sequence;
  if (seq < m.base) return seq_verdict::duplicate;
  if (seq - m.base >= _window) return seq_verdict::out_of_window;
  // In-order arrival with nothing received ahead (every one-packet message, most streams) needs
  // no bitmap: all its bits are clear (see free()).
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
  _msgs[idx].state = msg_state::retired;
  if (_retired.empty()) {
    free(idx);
    return;
  }
  if (_retired_count == _retired.size()) free(pop_retired());
  std::uint32_t tail = _retired_head + _retired_count;
  if (tail >= _retired.size()) tail -= static_cast<std::uint32_t>(_retired.size());
  _retired[tail] = std::uint64_t{_msgs[idx].hash} << 32 | idx;
  ++_retired_count;
  prefetch_victim();
}

} // namespace spin::rt::detail
