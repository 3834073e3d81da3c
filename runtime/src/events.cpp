// Host events: the queue HPUs post to and hosts read, with a futex for hosts that wait.
#include "core.hpp"

#include <climits>
#include <ctime>
#include <thread>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace spin::rt::detail {

namespace {
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds timeout) noexcept {
  const auto ns = timeout.count();
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}
void futex_wake(std::atomic<std::uint32_t>& word) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}
} // namespace

// Dekker-style: the poster publishes the event, fences, then looks for waiters; a waiter
// registers, then looks at the queue, then sleeps on the sequence word it read before looking.
// A syscall happens only when someone waits.
bool event_channel::post(const host_event& ev) noexcept {
  if (!_q.try_push(ev)) return false;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (_waiters.load(std::memory_order_relaxed) != 0) {
    _seq.fetch_add(1, std::memory_order_release);
    futex_wake(_seq);
  }
  return true;
}

std::size_t event_channel::take(std::span<host_event> out) noexcept {
  std::size_t n = 0;
  while (n < out.size() && _q.try_pop(out[n])) ++n;
  return n;
}

std::size_t event_channel::wait(std::span<host_event> out, std::chrono::nanoseconds timeout) noexcept {
  if (const std::size_t n = take(out); n > 0 || timeout.count() <= 0) return n;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Events first, then the flag: an event posted before the EC was closed is still returned.
  for (std::uint32_t k = 0; k < yield_rounds; ++k) {
    std::this_thread::yield();
    if (const std::size_t n = take(out); n > 0) return n;
    if (_closed.load(std::memory_order_acquire)) return 0;
    if (std::chrono::steady_clock::now() >= deadline) return 0;
  }
  _waiters.fetch_add(1, std::memory_order_seq_cst);
  // The other half of post()'s fence: the registration is ordered before the loads of the queue.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::size_t n = 0;
  for (;;) {
    const std::uint32_t seq = _seq.load(std::memory_order_acquire);
    if ((n = take(out)) > 0) break;
    if (_closed.load(std::memory_order_acquire)) break;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    futex_wait(_seq, seq, deadline - now);
  }
  _waiters.fetch_sub(1, std::memory_order_relaxed);
  return n;
}

// The flag before the bump: a waiter that read the old sequence word is woken by the bump (or
// does not sleep, the word having changed) and then sees the flag.
void event_channel::close() noexcept {
  _closed.store(true, std::memory_order_release);
  _seq.fetch_add(1, std::memory_order_release);
  futex_wake(_seq);
}

} // namespace spin::rt::detail
