// How an lcore that polls waits when it has nothing to do, so that on a machine with fewer cores
// than threads (lcores, rank threads) nobody spins while others need the core (DPDK's
// l3fwd-power does the same with RX interrupts).
#pragma once

#include <spin/result.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

namespace spin::emu {

/// An eventfd an idle lcore sleeps on and producers ring. A ring costs a syscall only while the
/// owner sleeps (it says so in a flag); otherwise one load. No wake-up is lost: the owner arms
/// the bell, polls once more, and only then sleeps (Dekker-style handshake with ring()).
class doorbell {
public:
  /// Without an eventfd (the process ran out of descriptors) sleep() just sleeps its timeout.
  doorbell() noexcept;
  ~doorbell();
  doorbell(const doorbell&) = delete;
  doorbell& operator=(const doorbell&) = delete;

  /// Any thread, after publishing the work the owner should see.
  void ring() noexcept;
  /// Owner: announces that it is about to sleep. Poll once more after it; then sleep() or
  /// disarm().
  void arm() noexcept;
  void disarm() noexcept;
  /// Owner, after arm(): sleeps until rung or `timeout` passed; disarms. Returns true when rung,
  /// also by a ring that landed between the timeout and the disarm.
  bool sleep(std::chrono::microseconds timeout) noexcept;

private:
  int _fd = -1;
  std::atomic<bool> _sleeping{false};
};

/// The back-off of a polling loop: `pause` for the first `pause_rounds` empty rounds, yield in
/// the rest of the first 255, then sleep on a doorbell in steps that double from 10 us up to
/// `max_sleep`.
///
/// Pausing keeps the core; it suits an lcore with a core of its own. Where threads outnumber
/// cores (an emulated cluster's lcores beside the rank threads that feed it), the thread that
/// would give the idle lcore its next work (a rank posting a command, another lcore forwarding)
/// often waits for that very core: 64 rounds of pause held it for tens of microseconds per idle
/// spell, and a 4 KiB switch allreduce of 4 ranks on 2 lcores and 2 cores took 75 to 105 us per
/// call against 52 to 60 us yielding at once (docs/benchmarks.md, sixth session). Hence the
/// default 0.
class idle_backoff {
public:
  /// Empty rounds before the first sleep (pause, then yield), unless pause_rounds exceeds it:
  /// then pause_rounds + 1.
  static constexpr std::uint32_t spin_rounds = 256;
  explicit idle_backoff(std::chrono::microseconds max_sleep, std::uint32_t pause_rounds = 0) noexcept
      : _max(max_sleep), _pause(pause_rounds) {}
  /// After a round that did work.
  void busy() noexcept { _empty = _sleeps = 0; }
  /// After an empty round: returns true when the caller should arm its doorbell, poll once more
  /// and, if that round is empty too, call sleep_step().
  bool idle() noexcept;
  /// The sleep of this step (the caller passes it to doorbell::sleep).
  std::chrono::microseconds sleep_step() noexcept;
  /// Rounds without work so far.
  std::uint32_t empty_rounds() const noexcept { return _empty; }

private:
  std::chrono::microseconds _max;
  std::uint32_t _pause;
  std::uint32_t _empty = 0;
  std::uint32_t _sleeps = 0;
};

/// Runs `round` (one poll round; returns the work it did) until `stop` is true, backing off on
/// `bell` when rounds are empty (idle_backoff with `max_sleep` and `pause_rounds`).
template <class Round>
void poll_loop(const std::atomic<bool>& stop, doorbell& bell, std::chrono::microseconds max_sleep, std::uint32_t pause_rounds,
               Round&& round) {
  idle_backoff b(max_sleep, pause_rounds);
  while (!stop.load(std::memory_order_relaxed)) {
    if (round() != 0) {
      b.busy();
      continue;
    }
    if (!b.idle()) continue;
    bell.arm();
    if (round() != 0 || stop.load(std::memory_order_relaxed)) {
      bell.disarm();
      b.busy();
      continue;
    }
    bell.sleep(b.sleep_step());
  }
}

/// Starts `fn` on a new thread that registers with EAL as an lcore while it runs (so that it
/// allocates mbufs from per-lcore caches), pinned to `cpu` unless it is negative. Needs EAL.
/// Errors: invalid_argument (a CPU that is not online, or pinning refused by the OS; the
/// message names the CPU).
result<std::thread> start_lcore(std::function<void()> fn, int cpu);

} // namespace spin::emu
