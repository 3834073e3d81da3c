// The runtime's internal structures, shared by its parts:
//   lane.cpp      the per-HPU packet path: parse, steer, match, order, run handlers to completion
//   actions.cpp   the handler API (spin::api_table) behind spin::ctx
//   watchdog.cpp  the handler budget: watchdog thread, preemption and fault signals
//   runtime.cpp   the control path: create, install, uninstall, statistics
#pragma once

#include "clock.hpp"
#include "message_table.hpp"

#include <spin/rt/arena.hpp>
#include <spin/rt/ring.hpp>
#include <spin/rt/runtime.hpp>

#include <atomic>
#include <condition_variable>
#include <csetjmp>
#include <csignal>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include <pthread.h>
#include <time.h>

namespace spin::rt::detail {

// The process's watchdog dozes (watchdog.cpp): the next invocation wakes it.
extern std::atomic<bool> watchdog_asleep;

class runtime_core;

// Lock-wait time a handler is not charged for, in multiples of its budget.
inline constexpr std::uint64_t lock_wait_cap = 10;

/// Free scratchpad slots of one EC, shared by its HPUs: opening a message takes one, settling it
/// gives it back, so that max_messages bounds the open messages of the whole EC exactly. With
/// one HPU a plain stack; with several the stack is guarded by a spin lock held for a push or a
/// pop (per message, not per packet; a lock-free queue can look empty or full for a moment while
/// another HPU is half-way through an operation, which would drop a message or lose a slot).
class slot_pool {
public:
  void init(std::uint32_t n, bool shared) {
    _shared = shared;
    _stack.reserve(n);
    for (std::uint32_t i = n; i-- > 0;) _stack.push_back(i);
  }
  bool take(std::uint32_t& slot) noexcept {
    guard g(*this);
    if (_stack.empty()) return false;
    slot = _stack.back();
    _stack.pop_back();
    return true;
  }
  // Never beyond the reserved capacity: there are exactly as many slots as places.
  void give(std::uint32_t slot) noexcept {
    guard g(*this);
    _stack.push_back(slot);
  }

private:
  class guard {
  public:
    explicit guard(slot_pool& p) noexcept : _p(p) {
      if (!_p._shared) return;
      while (_p._lock.exchange(true, std::memory_order_acquire))
        while (_p._lock.load(std::memory_order_relaxed)) cpu_relax();
    }
    ~guard() {
      if (_p._shared) _p._lock.store(false, std::memory_order_release);
    }

  private:
    slot_pool& _p;
  };
  bool _shared = false;
  std::atomic<bool> _lock{false};
  std::vector<std::uint32_t> _stack;
};

/// An EC's host events: a bounded MPMC queue and a futex word that waiters sleep on. Shared
/// (shared_ptr) so that a waiter may sleep on it while the EC is uninstalled.
class event_channel {
public:
  explicit event_channel(std::uint32_t depth) : _q(depth) {}
  /// HPU side: queues `ev` and wakes a waiter; false when the queue is full.
  bool post(const host_event& ev) noexcept;
  /// Reads up to out.size() events without waiting.
  std::size_t take(std::span<host_event> out) noexcept;
  /// Reads up to out.size() events, waiting up to `timeout` for the first: it first polls the
  /// queue for `yield_rounds` rounds, yielding its core between them (no waiter is registered
  /// yet, so a post costs the HPU no syscall), then sleeps on the futex. Returns 0 as soon as
  /// the channel is closed.
  std::size_t wait(std::span<host_event> out, std::chrono::nanoseconds timeout) noexcept;
  /// Ends every wait, present and future (uninstall); queued events stay readable by take().
  void close() noexcept;

  /// Rounds a waiter polls, yielding, before it sleeps. Where rank threads and lcores share
  /// the cores, a result usually arrives within a few rounds of the other threads, and a
  /// sleeping waiter costs the poster a futex wake and itself a scheduler wake-up: a 4 KiB
  /// switch allreduce of 4 ranks on 2 cores took 49 to 90 us per call sleeping at once, 28 to
  /// 40 us with 16 rounds (docs/benchmarks.md, sixth session). 128 groups of 4 ranks (512
  /// waiters) were no slower.
  static constexpr std::uint32_t yield_rounds = 16;

private:
  mpmc_queue<host_event> _q;
  alignas(cache_line) std::atomic<std::uint32_t> _seq{0};  // the futex word: bumped when a waiter is woken
  std::atomic<std::uint32_t> _waiters{0};
  std::atomic<bool> _closed{false};
};

/// An installed EC: what every HPU reads. Written only by control calls (no HPU runs then),
/// apart from its slot pool and event queue, which are thread-safe.
struct ec {
  ec_id id = 0;
  std::uint32_t slot = 0;
  ec_config cfg;
  arena_block mem_block, scratch_block;
  std::byte* mem = nullptr;
  std::byte* scratch_base = nullptr;
  std::uint64_t scratch_stride = 0;
  std::byte* host = nullptr;  // start of the window in host memory
  std::uint64_t host_len = 0;
  std::uint64_t budget_ticks = 0;
  wire::auth_key key;  // cfg.frame_key's; none(): frames are not authenticated
  slot_pool scratch_slots;
  std::shared_ptr<event_channel> events;

  std::byte* scratch_of(std::uint32_t slot) const noexcept {
    return scratch_base != nullptr ? scratch_base + std::uint64_t{slot} * scratch_stride : nullptr;
  }
};

/// What the handler API's calls did, per HPU and EC.
struct tally {
  counter dma_to, dma_from, dma_ops, sends, send_bytes, send_failed, events, events_lost, api_errors, deposit;
};

/// Where the payload of `p` starts: its tail when it has one (runtime_core::handle made sure
/// the payload is exactly the tail), else `payload_off` bytes into the frame.
inline std::byte* payload_of(const packet& p, std::uint32_t payload_off) noexcept {
  return p.tail != nullptr ? p.tail : p.frame + payload_off;
}

struct parked {
  packet pkt;
  std::uint16_t spin_off, payload_off;
  std::uint32_t payload_len;
  std::uint32_t next;
};

/// One HPU's share of one EC: its messages, parked packets and counters. Only the thread
/// driving the HPU touches it (statistics read the counters).
struct lane_ec {
  message_table table;
  std::vector<parked> parking;
  std::uint32_t park_free = none;
  ec_counters ctr;
  tally t;
  counter skipped;
};

struct dma_slot {
  std::uint64_t done_tick = 0;
  std::uint32_t gen = 0;
  bool live = false;
};

struct lane;

/// The invocation an HPU is running; spin::ctx::rt points here.
struct invocation {
  spin::ctx c{};
  runtime_core* rt = nullptr;
  lane* l = nullptr;
  ec* e = nullptr;
  tally* t = nullptr;
  std::uint64_t locks[8] = {};
  std::uint32_t nlocks = 0;
  std::uint32_t dma_live = 0;  // slots possibly live (high-water mark of this invocation)
  std::vector<dma_slot> dma;
  // The received packet (null in completion handlers) and its payload in the frame: what
  // `forward` sends. Not c.packet, which an eBPF program sees as its bounce buffer.
  const packet* pkt = nullptr;
  std::byte* payload = nullptr;
  std::uint32_t payload_len = 0;
  // The packet went out by `forward` (in this invocation, or in its header handler when this
  // is its payload handler): its frame is shared with the outgoing frame now.
  bool forwarded = false;
  // Virtual time (runtime_config::observer): the counted handler's counter and its value when
  // the invocation began; null otherwise.
  const std::uint64_t* counter = nullptr;
  std::uint64_t count0 = 0;
};

/// One HPU: the run-to-completion unit. Fields are grouped by who writes them.
struct lane {
  // Set at create.
  std::uint32_t index = 0;
  std::unique_ptr<mpmc_queue<packet>> inbox;  // frames other HPUs steered here
  std::vector<std::unique_ptr<lane_ec>> ecs;  // by EC slot; control calls create and free them

  // The thread driving this HPU: set when another thread starts to drive it, read by the
  // watchdog (to measure CPU time and to preempt).
  pthread_t driver{};
  bool has_driver = false;
  std::atomic<std::uint64_t> driver_id{0};   // pthread_t of the driver
  std::atomic<clockid_t> driver_clock{0};
  std::atomic<bool> driver_clock_ok{false};

  // Watchdog protocol: run id and start of the current invocation (0 = none running); the
  // watchdog stores the id of an over-budget run in abort_run.
  alignas(cache_line) std::atomic<std::uint64_t> run_id{0};
  std::atomic<std::uint64_t> run_start{0};
  std::atomic<std::uint64_t> run_budget{0};
  std::atomic<std::uint64_t> abort_run{0};
  std::atomic<std::uint64_t> run_wait{0};  // ticks this invocation waited for locks
  volatile sig_atomic_t in_handler = 0;
  volatile sig_atomic_t in_api = 0;
  volatile sig_atomic_t fault_sig = 0;  // signal of the fault that stopped the last invocation
  sigjmp_buf jb;
  bool last_faulted = false;

  counter tasks, busy_ns, preempted, frames, steered;
  std::vector<std::uint32_t> steer_to;  // HPUs this burst pushed frames to (wake them once)
  invocation inv;
  bool forwarded_carry = false;  // run_header to the same packet's payload invocation: inv.forwarded
};

inline bool abort_requested(const lane* l) noexcept {
  return l->abort_run.load(std::memory_order_relaxed) == l->run_id.load(std::memory_order_relaxed);
}

/// The lane whose handler the current thread runs (null outside handlers): signal handlers use
/// it to leave the handler.
extern thread_local lane* tls_lane;

class runtime_core {
public:
  runtime_config cfg;
  nic_arena arena;
  std::vector<std::unique_ptr<ec>> ecs;   // slot -> EC (null when free)
  std::vector<std::uint32_t> active;      // slots in installation order
  std::vector<std::unique_ptr<lane>> lanes;
  std::vector<std::span<std::byte>> regions;
  std::uint32_t next_ec_id = 1;
  bool preempt = false;
  bool catch_faults = false;
  int preempt_sig = 0;
  alignas(cache_line) api_table api{};  // read on every API call

  // Frames rejected by the parser or matching no EC, per HPU (single writer each).
  struct lane_counters {
    wire::parser_stats parser;
    counter unknown_ec;
  };
  std::unique_ptr<lane_counters[]> lane_ctr;

  alignas(cache_line) mutable std::mutex control_mu;  // guards ecs/active/arena against stats() readers

  // Watchdog (watchdog.cpp: one thread serves every runtime of the process).
  std::atomic<std::uint64_t> wd_tick_ns{1'000'000};  // this runtime's tick; the thread takes the shortest
  std::atomic<std::uint64_t> wd_wakeups{0};  // its wake-ups since this runtime started (runtime_stats::watchdog_wakeups)
  struct wd_seen {
    std::uint64_t id = 0;
    std::uint64_t cpu_base_ns = 0;
  };
  std::vector<wd_seen> wd_last;           // per lane: the run the watchdog timed, its CPU clock then
  std::vector<std::uint64_t> wd_last_run;  // per lane: the run id at the last tick (activity)

  explicit runtime_core(const runtime_config& c) : cfg(c), arena(c.nic_memory_bytes) {}
  ~runtime_core();

  // lane.cpp
  void attach(lane& l) noexcept;  // records the calling thread as the HPU's driver
  std::uint32_t rx(lane& l, const packet* pkts, std::uint32_t n) noexcept;
  std::uint32_t take_inbox(lane& l, std::uint32_t max) noexcept;
  bool handle(lane& l, const packet& p, bool may_steer) noexcept;
  void release(const packet& p) noexcept {
    if (cfg.release != nullptr) cfg.release(cfg.release_user, p.cookie);
  }
  void drop(lane_ec& le, const packet& p, drop_reason r) noexcept {
    le.ctr.drops[static_cast<std::size_t>(r)].add(1);
    release(p);
  }
  void drop_parked(lane_ec& le, std::uint32_t idx, drop_reason r) noexcept;
  void check_done(lane& l, ec& e, lane_ec& le, std::uint32_t idx) noexcept;
  void retire(ec& e, lane_ec& le, std::uint32_t idx) noexcept;
  void settle(ec& e, lane_ec& le, std::uint32_t idx) noexcept;
  std::int32_t invoke(lane& l, ec& e, lane_ec& le, const handler_ref& fn, handler_kind kind, std::uint32_t msg_idx,
                      const wire::header& hdr, const packet* p, std::uint16_t payload_off, std::uint32_t payload_len,
                      bool& over) noexcept;
  void run_header(lane& l, ec& e, lane_ec& le, std::uint32_t idx, const wire::header& h, const packet& p,
                  std::uint16_t payload_off, std::uint32_t len) noexcept;
  void run_payload(lane& l, ec& e, lane_ec& le, std::uint32_t idx, const wire::header& h, const packet& p,
                   std::uint16_t payload_off, std::uint32_t len) noexcept;
  void run_parked(lane& l, ec& e, lane_ec& le, std::uint32_t idx) noexcept;

  // watchdog.cpp
  void start_watchdog();          // attaches to the process's watchdog (starts it with the first runtime)
  void stop_watchdog() noexcept;  // detaches; after it the watchdog does not touch this runtime
  static bool watchdog_dozing() noexcept { return watchdog_asleep.load(std::memory_order_relaxed); }
  static void wake_watchdog() noexcept;
  // One tick for this runtime (watchdog thread, under its lock): marks and signals over-budget
  // runs; true when an invocation ran or runs.
  bool watchdog_tick(std::uint64_t now, std::uint64_t tick_ns) noexcept;

  void free_ec(std::uint32_t slot);
};

// actions.cpp
void fill_api(api_table& api) noexcept;

// watchdog.cpp
bool install_fault_handler();
bool install_preempt_handler(int sig);
/// Gives the calling thread an alternate signal stack (for faults such as a stack overflow in a
/// handler) unless it has one; once per thread.
void ensure_altstack() noexcept;

} // namespace spin::rt::detail
