#include <spin/emu/eal.hpp>
#include <spin/emu/lcore.hpp>

#include <algorithm>
#include <cstdint>
#include <thread>

#include <rte_errno.h>
#include <rte_lcore.h>

#include <cstdio>
#include <string>

#include <emmintrin.h>
#include <pthread.h>
#include <sched.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

namespace spin::emu {

doorbell::doorbell() noexcept : _fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

doorbell::~doorbell() {
  if (_fd >= 0) ::close(_fd);
}

void doorbell::ring() noexcept {
  // The fence orders the caller's publication of its work (ring enqueues, plain stores) before
  // the load of the flag: without it x86 may satisfy the load while those stores still sit in
  // the store buffer, the owner arms, polls, finds nothing and sleeps unrung (its arm() is a
  // seq_cst store, a full fence, so the other half of the handshake holds).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!_sleeping.load(std::memory_order_relaxed)) return;
  if (_fd < 0) return;
  const std::uint64_t one = 1;
  (void)!::write(_fd, &one, sizeof one);
}

void doorbell::arm() noexcept { _sleeping.store(true, std::memory_order_seq_cst); }

void doorbell::disarm() noexcept { _sleeping.store(false, std::memory_order_relaxed); }

bool doorbell::sleep(std::chrono::microseconds timeout) noexcept {
  bool rung = false;
  if (_fd < 0) {
    std::this_thread::sleep_for(timeout);
  } else {
    pollfd p{_fd, POLLIN, 0};
    // ppoll, not poll: poll() has millisecond resolution.
    timespec ts{static_cast<time_t>(timeout.count() / 1'000'000), static_cast<long>(timeout.count() % 1'000'000) * 1000};
    if (::ppoll(&p, 1, &ts, nullptr) > 0) {
      std::uint64_t v = 0;
      rung = ::read(_fd, &v, sizeof v) == sizeof v;
    }
  }
  _sleeping.store(false, std::memory_order_seq_cst);
  if (!rung && _fd >= 0) {
    // A producer that saw the flag between the timeout and the store above rang all the same:
    // take that ring now (the eventfd is non-blocking), so that it counts as one and does not
    // cut the next sleep short.
    std::uint64_t v = 0;
    rung = ::read(_fd, &v, sizeof v) == sizeof v;
  }
  return rung;
}

bool idle_backoff::idle() noexcept {
  ++_empty;
  if (_empty <= _pause) {
    _mm_pause();
    return false;
  }
  if (_empty < spin_rounds) {
    std::this_thread::yield();
    return false;
  }
  return true;
}

std::chrono::microseconds idle_backoff::sleep_step() noexcept {
  const std::int64_t us = std::int64_t{10} << std::min<std::uint32_t>(_sleeps, 20);
  ++_sleeps;
  return std::chrono::microseconds(std::min<std::int64_t>(us, _max.count()));
}

result<std::thread> start_lcore(std::function<void()> fn, int cpu) {
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (cpu >= 0 && (cpu >= CPU_SETSIZE || (online > 0 && cpu >= online)))
    return fail(errc::invalid_argument, "cannot pin an lcore to CPU " + std::to_string(cpu) + " (this machine has " +
                                            std::to_string(online) + " online CPUs)");
  std::thread t([fn = std::move(fn)] {
    const bool registered = rte_thread_register() == 0;
    if (!registered) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true))
        std::fprintf(stderr, "spin-emu: an lcore could not register with EAL (%s; DPDK has %d lcore ids): it runs without mbuf caches\n",
                     rte_strerror(rte_errno), RTE_MAX_LCORE);
    }
    fn();
    if (registered) rte_thread_unregister();
  });
  // Unpinned: on every CPU the process may use, not on the CPU EAL pinned the creating thread to
  // (a new thread inherits its creator's affinity).
  cpu_set_t set;
  CPU_ZERO(&set);
  if (cpu >= 0)
    CPU_SET(cpu, &set);
  else
    for (int c : process_cpus()) CPU_SET(c, &set);
  if (pthread_setaffinity_np(t.native_handle(), sizeof set, &set) != 0 && cpu >= 0) {
    // The thread runs already; it is returned anyway so the caller can stop and join it.
    std::fprintf(stderr, "spin-emu: cannot pin an lcore to CPU %d; it runs unpinned\n", cpu);
  }
  return t;
}

} // namespace spin::emu
