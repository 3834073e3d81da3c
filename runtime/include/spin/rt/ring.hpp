// Lock-free rings used between HPUs, lcores and the host (DPDK rte_ring semantics:
// `try_*` never blocks). The runtime's inboxes use them, and so do the emulator's lanes.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>

namespace spin::rt {

inline constexpr std::size_t cache_line = 64;

/// Bounded single-producer single-consumer ring of trivially copyable T. Capacity is rounded up
/// to a power of two. One thread may call try_push/try_stage/flush, one (other) thread
/// try_pop/try_pop_burst; size/empty from any thread.
template <class T> class spsc_ring {
  static_assert(std::is_trivially_copyable_v<T>);

public:
  explicit spsc_ring(std::size_t capacity)
      : _mask(std::bit_ceil(capacity < 2 ? std::size_t{2} : capacity) - 1), _slots(new T[_mask + 1]) {}

  std::size_t capacity() const { return _mask + 1; }

  /// Producer: appends `v`; false when the ring is full.
  bool try_push(const T& v) noexcept {
    if (!try_stage(v)) return false;
    flush();
    return true;
  }

  /// Producer: writes `v` into the next slot without publishing it; `flush` publishes every
  /// staged element at once (one index update per burst instead of one per element, as
  /// rte_ring's burst enqueue). False when the ring is full (counting staged elements).
  bool try_stage(const T& v) noexcept {
    const std::size_t t = _staged;
    if (t - _head_cache == capacity()) {
      _head_cache = _head.load(std::memory_order_acquire);
      if (t - _head_cache == capacity()) return false;
    }
    _slots[t & _mask] = v;
    _staged = t + 1;
    return true;
  }
  /// Producer: publishes the staged elements; returns true when there were any.
  bool flush() noexcept {
    if (_staged == _tail.load(std::memory_order_relaxed)) return false;
    _tail.store(_staged, std::memory_order_release);
    return true;
  }

  /// Consumer: removes up to `n` of the oldest elements into `out`, publishing the freed slots
  /// once; returns how many.
  std::size_t try_pop_burst(T* out, std::size_t n) noexcept {
    const std::size_t h = _head.load(std::memory_order_relaxed);
    if (h + n > _tail_cache) _tail_cache = _tail.load(std::memory_order_acquire);
    const std::size_t k = std::min(n, _tail_cache - h);
    for (std::size_t i = 0; i < k; ++i) out[i] = _slots[(h + i) & _mask];
    if (k > 0) _head.store(h + k, std::memory_order_release);
    return k;
  }

  /// Consumer: removes the oldest element into `out`; false when empty.
  bool try_pop(T& out) noexcept {
    const std::size_t h = _head.load(std::memory_order_relaxed);
    if (h == _tail_cache) {
      _tail_cache = _tail.load(std::memory_order_acquire);
      if (h == _tail_cache) return false;
    }
    out = _slots[h & _mask];
    _head.store(h + 1, std::memory_order_release);
    return true;
  }

  /// Any thread: an instantaneous (possibly stale) count of queued elements.
  std::size_t size() const noexcept {
    return _tail.load(std::memory_order_acquire) - _head.load(std::memory_order_acquire);
  }
  bool empty() const noexcept { return size() == 0; }

private:
  const std::size_t _mask;
  std::unique_ptr<T[]> _slots;
  alignas(cache_line) std::atomic<std::size_t> _head{0};
  std::size_t _tail_cache = 0; // consumer's copy of _tail
  alignas(cache_line) std::atomic<std::size_t> _tail{0};
  std::size_t _head_cache = 0; // producer's copy of _head
  std::size_t _staged = 0;     // producer's next slot (== _tail when nothing is staged)
};

/// Bounded multi-producer multi-consumer queue (D. Vyukov's bounded MPMC algorithm). Any thread
/// may push and pop; no locks, no allocation after construction.
template <class T> class mpmc_queue {
  static_assert(std::is_trivially_copyable_v<T>);
  struct cell {
    std::atomic<std::size_t> seq;
    T value;
  };

public:
  explicit mpmc_queue(std::size_t capacity)
      : _mask(std::bit_ceil(capacity < 2 ? std::size_t{2} : capacity) - 1), _cells(new cell[_mask + 1]) {
    for (std::size_t i = 0; i <= _mask; ++i) _cells[i].seq.store(i, std::memory_order_relaxed);
  }

  std::size_t capacity() const { return _mask + 1; }

  bool try_push(const T& v) noexcept {
    std::size_t pos = _enq.load(std::memory_order_relaxed);
    for (;;) {
      cell& c = _cells[pos & _mask];
      const std::size_t seq = c.seq.load(std::memory_order_acquire);
      const auto diff = static_cast<std::ptrdiff_t>(seq) - static_cast<std::ptrdiff_t>(pos);
      if (diff == 0) {
        if (_enq.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.value = v;
          c.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = _enq.load(std::memory_order_relaxed);
      }
    }
  }

  bool try_pop(T& out) noexcept {
    std::size_t pos = _deq.load(std::memory_order_relaxed);
    for (;;) {
      cell& c = _cells[pos & _mask];
      const std::size_t seq = c.seq.load(std::memory_order_acquire);
      const auto diff = static_cast<std::ptrdiff_t>(seq) - static_cast<std::ptrdiff_t>(pos + 1);
      if (diff == 0) {
        if (_deq.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          out = c.value;
          c.seq.store(pos + _mask + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = _deq.load(std::memory_order_relaxed);
      }
    }
  }

  /// Any thread: true when the queue looked empty (a possibly stale answer).
  bool empty_approx() const noexcept {
    return _enq.load(std::memory_order_acquire) == _deq.load(std::memory_order_acquire);
  }

private:
  const std::size_t _mask;
  std::unique_ptr<cell[]> _cells;
  alignas(cache_line) std::atomic<std::size_t> _enq{0};
  alignas(cache_line) std::atomic<std::size_t> _deq{0};
};

} // namespace spin::rt
