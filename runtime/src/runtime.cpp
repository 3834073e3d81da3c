// The sPIN engine. Layout of this file:
//   clock            TSC ticks and their calibration
//   structures       task/done records, messages, ECs, HPUs, invocations
//   handler API      the functions behind spin::api_table (run on HPU threads)
//   HPU loop         runs tasks, measures, enforces the budget
//   watchdog         detects over-budget invocations and preempts them
//   scheduler        parsing, matching, message table, ordering, dispatch (scheduler thread)
//   control path     create, install, uninstall, stats
#include <spin/rt/arena.hpp>
#include <spin/rt/ring.hpp>
#include <spin/rt/runtime.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace spin::rt {

class runtime_core;

namespace {

// ---- clock ---------------------------------------------------------------------------------

std::uint64_t ticks() noexcept {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

void cpu_relax() noexcept {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

#if defined(__x86_64__)
// One steady_clock reading with the tick count at that moment: the midpoint of the ticks read
// just before and after it. A pair that took long (the thread was preempted between the reads)
// is read again, so that a descheduled moment cannot skew the calibration below.
std::pair<std::chrono::steady_clock::time_point, double> paired_now() {
  std::pair<std::chrono::steady_clock::time_point, double> best{};
  std::uint64_t best_spread = UINT64_MAX;
  for (int k = 0; k < 16; ++k) {
    const std::uint64_t a = ticks();
    const auto t = std::chrono::steady_clock::now();
    const std::uint64_t b = ticks();
    if (b - a < best_spread) {
      best_spread = b - a;
      best = {t, static_cast<double>(a) + static_cast<double>(b - a) / 2};
    }
    if (best_spread < 2000) break;  // well under a microsecond: not preempted
  }
  return best;
}
#endif

// Ticks per ns, measured once per process against steady_clock over ~20 ms, from paired
// readings (an unpaired 5 ms calibration was seen 10% off on a loaded VM, which made
// hpu_stats::busy_ns exceed wall time).
double ticks_per_ns() {
  static const double v = [] {
#if defined(__x86_64__)
    const auto [t0, c0] = paired_now();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto [t1, c1] = paired_now();
    const double ns = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    return ns > 0 && c1 > c0 ? (c1 - c0) / ns : 1.0;
#else
    return 1.0;
#endif
  }();
  return v;
}

// 1 / ticks_per_ns(), set once by the first runtime::create before any HPU thread starts.
double g_ns_per_tick = 1.0;

std::uint64_t ns_to_ticks(std::uint64_t ns) { return static_cast<std::uint64_t>(static_cast<double>(ns) * ticks_per_ns()); }
std::uint64_t ticks_to_ns(std::uint64_t t) { return static_cast<std::uint64_t>(static_cast<double>(t) * g_ns_per_tick); }

constexpr std::uint32_t none = UINT32_MAX;
// Lock-wait time a handler is not charged for, in multiples of its budget.
constexpr std::uint64_t lock_wait_cap = 10;

// Single-writer increment (the scheduler): no locked read-modify-write on the packet path.
void bump(std::atomic<std::uint64_t>& c) noexcept { c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }

bool is_drop(ret r) { return r == ret::drop || r == ret::drop_pending; }
bool is_proceed(ret r) { return r == ret::proceed || r == ret::proceed_pending; }
bool is_pending(ret r) { return r == ret::success_pending || r == ret::drop_pending || r == ret::proceed_pending; }
bool is_valid(std::int32_t r) { return r >= 0 && r <= static_cast<std::int32_t>(ret::proceed_pending); }

} // namespace

// ---- structures ----------------------------------------------------------------------------

namespace {

enum class task_kind : std::uint8_t { header, payload, completion, deposit };

// A task crosses from the scheduler's core to an HPU's: kept to 48 bytes. The HPU rebuilds the
// message descriptor from the frame's spin header (already validated) or, for a completion, from
// the message entry, whose fields are stable while the completion runs.
enum task_flag : std::uint8_t { then_payload = 1, then_deposit = 2 };
struct task {
  std::byte* frame;            // null for a completion task
  std::uint64_t cookie;
  std::byte* scratch;
  std::uint32_t frame_len;
  std::uint32_t msg_idx;
  std::uint32_t payload_len;
  std::uint32_t packet_count;  // of the message, 0 while its end packet is unseen
  std::uint16_t spin_off;
  std::uint16_t payload_off;
  std::uint16_t ec_slot;
  task_kind kind;
  std::uint8_t flags;          // task_flag
};
static_assert(sizeof(task) == 48);

// What the HPUs' API calls did, per HPU and EC slot; written only by that HPU, summed by stats().
struct tally {
  detail::counter dma_to, dma_from, dma_ops, sends, send_bytes, send_failed, events, events_lost, api_errors, deposit;
  void reset() {
    for (detail::counter* c : {&dma_to, &dma_from, &dma_ops, &sends, &send_bytes, &send_failed, &events, &events_lost,
                               &api_errors, &deposit})
      c->reset();
  }
};

// The record an HPU sends back per task: 32 bytes.
enum done_flag : std::uint8_t {
  ran_payload = 1,
  over_budget = 2,  // a handler was stopped: over budget, or faulted (with `faulted`)
  deposit_failed = 4,
  skipped_aborted = 8,
  skipped_proceed = 16,
  faulted = 32,
};
struct done {
  std::uint32_t msg_idx;
  std::uint32_t payload_len;
  std::int32_t ret_first;
  std::int32_t ret_payload;
  std::uint32_t ns_first;     // saturates at ~4.3 s
  std::uint32_t ns_payload;
  std::uint16_t ec_slot;
  task_kind kind;
  std::uint8_t flags;         // done_flag
};
static_assert(sizeof(done) == 28 || sizeof(done) == 32);

enum class msg_state : std::uint8_t { free, open, held, retired };
enum skip_flag : std::uint8_t { skip_aborted = 1, skip_proceed = 2 };
enum class outcome : std::uint8_t { ok, dropped, aborted };

struct message {
  std::uint32_t source = 0;
  std::uint32_t hash = 0;  // key_hash(source, id): its index slot without recomputing
  std::uint64_t id = 0;
  std::uint64_t match_bits = 0;
  std::uint64_t len_bytes = 0;
  msg_state state = msg_state::free;
  outcome result = outcome::ok;
  bool header_started = false, header_done = false, proceed = false, pending = false, eom_seen = false,
       completion_started = false, in_retry = false;
  std::uint32_t packet_count = 0;  // 0 until the end packet is seen
  std::uint32_t base = 0;          // lowest seq not yet received
  std::uint32_t highest = 0;       // highest seq + 1 received
  std::uint32_t inflight = 0;      // tasks of this message on HPUs
  std::uint32_t scratch_slot = none;
  std::uint32_t park_head = none, park_tail = none;
};

struct parked {
  packet pkt;
  std::uint16_t spin_off, payload_off;
  std::uint32_t payload_len;
  std::uint32_t next;
};

struct ec {
  ec_id id = 0;
  std::uint32_t slot = 0;
  bool draining = false;
  ec_config cfg;
  arena_block mem_block, scratch_block;
  std::byte* mem = nullptr;
  std::byte* scratch_base = nullptr;
  std::uint64_t scratch_stride = 0;
  std::byte* host = nullptr;  // start of the window in host memory
  std::uint64_t host_len = 0;
  std::uint64_t budget_ticks = 0;
  std::uint32_t window = 0;        // reorder window in packets (ec_limits::window_packets rounded up to 64)
  std::uint32_t window_words = 0;  // bitmap words per message: a power of two >= window / 64
  std::uint32_t bit_mask = 0;      // window_words x 64 - 1: a seq's bit, without a division
  std::unique_ptr<detail::mpmc_queue<host_event>> events;

  // Per message: skip_aborted / skip_proceed, set by the scheduler, read by HPUs before a
  // queued payload handler starts, so that it is skipped as the return codes promise.
  std::unique_ptr<std::atomic<std::uint8_t>[]> skip;

  // Read by HPUs only for completion tasks (message fields are stable while it runs).
  std::vector<message> msgs;
  std::vector<std::uint64_t> bitmaps;  // window_words per message

  // Scheduler-owned from here on, apart from the HPUs' lines above.
  alignas(detail::cache_line) std::vector<std::uint32_t> free_msgs, free_scratch;
  // Open addressing with linear probing: (low 32 bits of the key's hash << 32) | (msg idx + 1),
  // 0 = empty. The stored hash lets lookups and deletions skip other messages' entries without
  // reading them (a miss probes about 2.5 slots at the index's load of one half).
  std::vector<std::uint64_t> index;
  std::uint32_t index_mask = 0;
  std::vector<std::uint64_t> retired;  // FIFO of retired messages: hash << 32 | index
  std::uint32_t retired_head = 0, retired_count = 0;
  std::vector<parked> parking;
  std::uint32_t park_free = none;
  std::vector<std::uint32_t> retry;    // messages waiting for HPU room (parked release, completion)
  std::uint32_t inflight = 0;
  detail::ec_counters ctr;
  detail::counter skipped;
};

struct hpu;

struct dma_slot {
  std::uint64_t done_tick = 0;
  std::uint32_t gen = 0;
  bool live = false;
};

// State of the invocation an HPU is running; spin::ctx::rt points here.
struct invocation {
  spin::ctx c{};
  runtime_core* rt = nullptr;
  hpu* h = nullptr;
  ec* e = nullptr;
  tally* t = nullptr;
  std::uint64_t locks[8] = {};
  std::uint32_t nlocks = 0;
  std::uint32_t dma_live = 0;  // slots possibly live (high-water mark of this invocation)
  std::vector<dma_slot> dma;
};

// Fields are grouped by the thread that writes them, each group on its own cache lines, so the
// scheduler and the HPU never invalidate each other's lines except through the rings.
struct hpu {
  // Set at create, read-only afterwards.
  std::uint32_t index = 0;
  std::thread th;
  pthread_t native{};
  clockid_t cpu_clock{};
  std::unique_ptr<tally[]> tallies;  // one per EC slot; written by this HPU only
  detail::spsc_ring<task> in;
  detail::spsc_ring<done> out;

  // Scheduler-owned.
  alignas(detail::cache_line) std::uint32_t outstanding = 0;  // tasks staged minus records popped
  bool staged = false;                                        // tasks staged but not yet published

  // Sleep handshake between the HPU and the scheduler.
  alignas(detail::cache_line) std::atomic<std::uint32_t> doorbell{0};
  std::atomic<bool> sleeping{false};

  // Written by the HPU per invocation. Watchdog protocol: run id and start of the current
  // invocation (0 = idle); the watchdog stores the id of an over-budget run in abort_run.
  alignas(detail::cache_line) std::atomic<std::uint64_t> run_id{0};
  std::atomic<std::uint64_t> run_start{0};
  std::atomic<std::uint64_t> run_budget{0};
  std::atomic<std::uint64_t> abort_run{0};
  std::atomic<std::uint64_t> run_wait{0};  // ticks this invocation waited for locks
  volatile sig_atomic_t in_handler = 0;
  volatile sig_atomic_t in_api = 0;
  volatile sig_atomic_t fault_sig = 0;  // signal of the fault that stopped the last invocation
  sigjmp_buf jb;
  bool last_faulted = false;            // the last invoke() ended in a fault

  detail::counter tasks, busy_ns, preempted;
  invocation inv;

  hpu(std::size_t depth) : in(depth), out(depth) {}
};

thread_local hpu* tls_hpu __attribute__((tls_model("initial-exec"))) = nullptr;

bool abort_requested(const hpu* h) noexcept {
  return h->abort_run.load(std::memory_order_relaxed) == h->run_id.load(std::memory_order_relaxed);
}

// Signal handler of the preemption signal: leaves the handler code of an over-budget run.
void on_preempt(int) {
  hpu* h = tls_hpu;
  if (h != nullptr && h->in_handler && !h->in_api && abort_requested(h)) siglongjmp(h->jb, 1);
}

// Synchronous faults (bad memory access, division trap, illegal instruction). In handler code
// on an HPU they stop the invocation like an overrun does; anywhere else they go to whoever
// handled them before us (the default action, or a sanitizer), so runtime bugs still crash.
constexpr int fault_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
struct sigaction previous_fault_action[std::size(fault_signals)];

void on_fault(int sig, siginfo_t* info, void* uc) {
  hpu* h = tls_hpu;
  if (h != nullptr && h->in_handler && !h->in_api) {
    h->fault_sig = sig;
    siglongjmp(h->jb, 2);
  }
  for (std::size_t i = 0; i < std::size(fault_signals); ++i) {
    if (fault_signals[i] != sig) continue;
    const struct sigaction& prev = previous_fault_action[i];
    if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction != nullptr) {
      prev.sa_sigaction(sig, info, uc);
      return;
    }
    if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler != nullptr) {
      prev.sa_handler(sig);
      return;
    }
  }
  // Default action: restore it; the faulting instruction runs again and the process dies as
  // it would have without us.
  signal(sig, SIG_DFL);
}

// Installed by every runtime that is created, when a fault signal's handler is not already
// ours (a test framework or an application may have replaced it since): the handler found is
// kept and gets every fault outside handler code. Never removed: other runtimes may rely on it.
std::mutex fault_install_mu;

bool install_fault_handler() {
  std::lock_guard lk(fault_install_mu);
  for (std::size_t i = 0; i < std::size(fault_signals); ++i) {
    struct sigaction cur {};
    if (sigaction(fault_signals[i], nullptr, &cur) != 0) return false;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_fault) continue;
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    previous_fault_action[i] = cur;
    if (sigaction(fault_signals[i], &sa, nullptr) != 0) return false;
  }
  return true;
}

} // namespace

class runtime_core {
public:
  runtime_config cfg;
  nic_arena arena;
  std::vector<std::unique_ptr<ec>> ecs;       // slot -> EC (null when free)
  std::vector<std::uint32_t> active;          // slots in installation order
  std::vector<std::unique_ptr<hpu>> hpus;
  std::vector<std::span<std::byte>> regions;
  std::uint32_t next_ec_id = 1;
  std::atomic<bool> running{true};
  bool preempt = false;
  bool catch_faults = false;
  hpu_thread_fn thread_start = nullptr, thread_stop = nullptr;
  void* thread_user = nullptr;
  int preempt_sig = 0;
  alignas(detail::cache_line) api_table api{};  // read by HPUs on every API call

  // Written by the scheduler per packet.
  alignas(detail::cache_line) std::uint32_t rr = 0;
  std::uint32_t room = 0;                     // free task slots over all HPUs
  std::uint32_t total_inflight = 0;
  wire::parser_stats parser;
  detail::counter unknown_ec;
  alignas(detail::cache_line) mutable std::mutex control_mu;              // guards ecs/active against stats() readers

  std::thread watchdog;
  std::mutex wd_mu;
  std::condition_variable wd_cv;
  std::atomic<std::uint64_t> wd_tick_ns{1'000'000};

  explicit runtime_core(const runtime_config& c) : cfg(c), arena(c.nic_memory_bytes) {}
  ~runtime_core();

  // scheduler
  void handle(const packet& p) noexcept;
  std::uint32_t poll_done() noexcept;
  void retry_all() noexcept;
  bool dispatch(const task& t) noexcept;  // stages the task; publish() makes it visible
  void publish() noexcept;
  void release(const packet& p) noexcept {
    if (cfg.release != nullptr) cfg.release(cfg.release_user, p.cookie);
  }
  void drop(ec& e, const packet& p, drop_reason r) noexcept {
    e.ctr.drops[static_cast<std::size_t>(r)].add(1);
    release(p);
  }
  std::uint32_t find_msg(const ec& e, std::uint32_t hash, std::uint32_t source, std::uint64_t id) const noexcept;
  std::uint32_t open_msg(ec& e, const wire::header& h, std::uint32_t hash) noexcept;
  void index_erase(ec& e, std::uint32_t idx) noexcept;
  void free_msg(ec& e, std::uint32_t idx) noexcept;
  void retire(ec& e, std::uint32_t idx) noexcept;
  void settle(ec& e, std::uint32_t idx) noexcept;  // moves a finished message to the retired history
  void check_done(ec& e, std::uint32_t idx) noexcept;
  void dispatch_payload(ec& e, std::uint32_t idx, const packet& p, std::uint16_t spin_off, std::uint16_t payload_off,
                        std::uint32_t len) noexcept;
  bool release_parked(ec& e, std::uint32_t idx) noexcept;
  void drop_parked(ec& e, std::uint32_t idx, drop_reason r) noexcept;
  void want_retry(ec& e, std::uint32_t idx) noexcept;
  void apply(const done& d) noexcept;
  void set_proceed(ec& e, std::uint32_t idx) noexcept;

  // HPU side
  void hpu_loop(hpu& h) noexcept;
  void run(hpu& h, const task& t) noexcept;
  std::int32_t invoke(hpu& h, const handler_ref& fn, bool& over, std::uint32_t& ns) noexcept;

  void watchdog_loop();
  void free_ec(std::uint32_t slot);
};

// ---- handler API ---------------------------------------------------------------------------

namespace {

invocation& inv_of(spin::ctx* c) { return *static_cast<invocation*>(c->rt); }

// Marks the HPU as inside the runtime for the duration of an API call: the preemption signal
// never cuts a runtime function in half; an abort requested meanwhile is honoured on exit.
class api_guard {
public:
  explicit api_guard(invocation& i) : _h(*i.h) { _h.in_api = 1; }
  ~api_guard() {
    _h.in_api = 0;
    if (_h.in_handler && abort_requested(&_h)) siglongjmp(_h.jb, 1);
  }
  api_guard(const api_guard&) = delete;
  api_guard& operator=(const api_guard&) = delete;

private:
  hpu& _h;
};

bool inside(const void* p, std::uint64_t len, const byte_view& v) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const auto b = reinterpret_cast<std::uintptr_t>(v.data);
  return v.data != nullptr && a >= b && a - b <= v.len_bytes && len <= v.len_bytes - (a - b);
}

// True when [p, p+len) lies in memory the invocation owns: its packet, its EC's handler
// memory or its message's scratchpad.
bool local_ok(const invocation& i, const void* p, std::uint64_t len) {
  if (len == 0) return true;
  if (p == nullptr) return false;
  return inside(p, len, i.c.packet) || inside(p, len, i.c.handler_mem) || inside(p, len, i.c.scratch);
}

std::int32_t err(invocation& i, errc e) {
  i.t->api_errors.add(1);
  return static_cast<std::int32_t>(e);
}

std::uint64_t dma_done_tick(const runtime_config& cfg, std::uint64_t len) {
  std::uint64_t ns = static_cast<std::uint64_t>(cfg.dma.latency.count());
  if (cfg.dma.bandwidth_gbps > 0) ns += static_cast<std::uint64_t>(static_cast<double>(len) * 8.0 / cfg.dma.bandwidth_gbps);
  return ns == 0 ? 0 : ticks() + ns_to_ticks(ns);
}

std::int32_t dma_common(spin::ctx* c, bool to_host, void* local, std::uint64_t host_off, std::uint64_t len,
                        dma_handle* h) {
  invocation& i = inv_of(c);
  api_guard g(i);
  if (!local_ok(i, local, len)) return err(i, local == nullptr ? errc::invalid_argument : errc::out_of_bounds);
  if (host_off > i.e->host_len || len > i.e->host_len - host_off) return err(i, errc::out_of_bounds);
  std::uint32_t slot = none;
  if (h != nullptr) {
    for (std::uint32_t s = 0; s < i.dma.size(); ++s)
      if (!i.dma[s].live) {
        slot = s;
        break;
      }
    if (slot == none) return err(i, errc::no_space);
  }
  if (len > 0) {
    if (to_host)
      std::memmove(i.e->host + host_off, local, len);
    else
      std::memmove(local, i.e->host + host_off, len);
  }
  (to_host ? i.t->dma_to : i.t->dma_from).add(len);
  i.t->dma_ops.add(1);
  const std::uint64_t done_at = dma_done_tick(i.rt->cfg, len);
  if (h == nullptr) {
    while (done_at != 0 && ticks() < done_at) cpu_relax();
    return 0;
  }
  dma_slot& d = i.dma[slot];
  d.live = true;
  if (slot >= i.dma_live) i.dma_live = slot + 1;
  d.gen += 1;
  d.done_tick = done_at;
  h->id = (std::uint64_t{d.gen} << 16) | slot;
  return 0;
}

std::int32_t api_dma_to_host(spin::ctx* c, std::uint64_t host_off, const void* src, std::uint64_t len, dma_handle* h) {
  return dma_common(c, true, const_cast<void*>(src), host_off, len, h);
}
std::int32_t api_dma_from_host(spin::ctx* c, void* dst, std::uint64_t host_off, std::uint64_t len, dma_handle* h) {
  return dma_common(c, false, dst, host_off, len, h);
}

dma_slot* find_dma(invocation& i, dma_handle h) {
  const std::uint64_t slot = h.id & 0xffff;
  if (slot >= i.dma.size()) return nullptr;
  dma_slot& d = i.dma[slot];
  if (!d.live || d.gen != static_cast<std::uint32_t>(h.id >> 16)) return nullptr;
  return &d;
}

std::int32_t api_dma_test(spin::ctx* c, dma_handle h) {
  invocation& i = inv_of(c);
  api_guard g(i);
  dma_slot* d = find_dma(i, h);
  if (d == nullptr) return err(i, errc::not_found);
  if (d->done_tick != 0 && ticks() < d->done_tick) return 0;
  d->live = false;
  return 1;
}

std::int32_t api_dma_wait(spin::ctx* c, dma_handle h) {
  invocation& i = inv_of(c);
  dma_slot* d = find_dma(i, h);
  if (d == nullptr) {
    api_guard g(i);
    return err(i, errc::not_found);
  }
  while (d->done_tick != 0 && ticks() < d->done_tick) {
    api_guard g(i);  // lets an over-budget wait be aborted
    cpu_relax();
  }
  d->live = false;
  return 0;
}

std::int32_t api_send(spin::ctx* c, const send_desc* d) {
  invocation& i = inv_of(c);
  api_guard g(i);
  // A handler built before send_desc::coll existed passes the older, smaller size.
  if (d == nullptr || d->size_bytes < offsetof(send_desc, coll)) return err(i, errc::invalid_argument);
  const bool coll = (d->flags & msg_coll) != 0;
  if (coll && d->size_bytes < sizeof(send_desc)) return err(i, errc::invalid_argument);
  if (!local_ok(i, d->data, d->len_bytes)) return err(i, errc::out_of_bounds);
  tx_port* tx = i.rt->cfg.tx;
  if (tx == nullptr) {
    i.t->send_failed.add(1);
    return err(i, errc::not_supported);
  }
  if (d->len_bytes > tx->max_payload_bytes()) return err(i, errc::out_of_bounds);
  if (d->offset_bytes > d->message_len_bytes || d->len_bytes > d->message_len_bytes - d->offset_bytes ||
      ((d->flags & msg_start) != 0 && d->packet_index != 0) ||
      ((d->flags & msg_end) != 0 && d->offset_bytes + d->len_bytes != d->message_len_bytes) ||
      (d->flags & ~static_cast<std::uint32_t>(msg_start | msg_end | msg_retransmit | msg_coll)) != 0)
    return err(i, errc::invalid_argument);
  wire::header h;
  h.type = wire::packet_type::data;
  h.flags = static_cast<std::uint16_t>(((d->flags & msg_start) ? wire::flag_start : 0) |
                                       ((d->flags & msg_end) ? wire::flag_end : 0) |
                                       ((d->flags & msg_retransmit) ? wire::flag_retransmit : 0) |
                                       (coll ? wire::flag_coll : 0));
  if (coll)
    h.coll = wire::coll_ext{d->coll.op, d->coll.dtype, d->coll.slot, d->coll.elem_count, d->coll.epoch, d->coll.aux};
  h.source_rank = i.rt->cfg.rank;
  h.match_bits = d->match_bits;
  h.message_id = d->message_id;
  h.seq = d->packet_index;
  h.payload_len = d->len_bytes;
  h.message_len = d->message_len_bytes;
  h.offset = d->offset_bytes;
  const errc r = tx->send(i.h->index, d->dest_rank, h,
                          std::span<const std::byte>(static_cast<const std::byte*>(d->data), d->len_bytes));
  if (r != errc::ok) {
    i.t->send_failed.add(1);
    return err(i, r);
  }
  i.t->sends.add(1);
  i.t->send_bytes.add(d->len_bytes);
  return 0;
}

std::int32_t api_post_event(spin::ctx* c, std::uint64_t value) {
  invocation& i = inv_of(c);
  api_guard g(i);
  host_event ev;
  ev.type = host_event::kind::handler;
  ev.source_rank = c->msg.source_rank;
  ev.message_id = c->msg.message_id;
  ev.value = value;
  if (!i.e->events->try_push(ev)) {
    i.t->events_lost.add(1);
    return err(i, errc::no_space);
  }
  i.t->events.add(1);
  return 0;
}

std::uint64_t* lock_word(invocation& i, std::uint64_t off, errc& e) {
  std::uint64_t* w = i.c.handler_mem.at<std::uint64_t>(off);
  if (w == nullptr)
    e = (off > i.c.handler_mem.len_bytes || i.c.handler_mem.len_bytes - off < 8) ? errc::out_of_bounds : errc::misaligned;
  return w;
}

std::int32_t api_lock(spin::ctx* c, std::uint64_t off) {
  invocation& i = inv_of(c);
  hpu& h = *i.h;
  errc e = errc::ok;
  std::uint64_t* w;
  {
    api_guard g(i);
    w = lock_word(i, off, e);
    if (w == nullptr) return err(i, e);
    for (std::uint32_t k = 0; k < i.nlocks; ++k)
      if (i.locks[k] == off) return err(i, errc::bad_state);  // would deadlock on itself
    if (i.nlocks == std::size(i.locks)) return err(i, errc::no_space);
  }
  std::atomic_ref<std::uint64_t> word(*w);
  const std::uint64_t token = (h.run_id.load(std::memory_order_relaxed) << 8) | (h.index + 1);
  const std::uint64_t wait_before = h.run_wait.load(std::memory_order_relaxed);
  const std::uint64_t start = ticks();
  for (std::uint32_t spins = 0;; ++spins) {
    api_guard g(i);  // a handler stuck waiting for a lock can be aborted
    std::uint64_t expected = 0;
    if (word.compare_exchange_weak(expected, token, std::memory_order_acquire, std::memory_order_relaxed)) {
      // Recorded before the guard's destructor may leave the handler, so that an abort right
      // here still releases the lock.
      i.locks[i.nlocks++] = off;
      break;
    }
    cpu_relax();
    // Time spent waiting for another handler's lock is reported to the watchdog, which does not
    // charge it (up to a cap) to this handler's budget: the holder may simply be descheduled.
    if ((spins & 63) == 63) h.run_wait.store(wait_before + (ticks() - start), std::memory_order_relaxed);
  }
  return 0;
}

std::int32_t api_unlock(spin::ctx* c, std::uint64_t off) {
  invocation& i = inv_of(c);
  api_guard g(i);
  errc e = errc::ok;
  std::uint64_t* w = lock_word(i, off, e);
  if (w == nullptr) return err(i, e);
  for (std::uint32_t k = 0; k < i.nlocks; ++k) {
    if (i.locks[k] != off) continue;
    std::atomic_ref<std::uint64_t>(*w).store(0, std::memory_order_release);
    i.locks[k] = i.locks[--i.nlocks];
    return 0;
  }
  return err(i, errc::bad_state);
}

} // namespace

// ---- HPU loop ------------------------------------------------------------------------------

std::int32_t runtime_core::invoke(hpu& h, const handler_ref& fn, bool& over, std::uint32_t& ns) noexcept {
  invocation& i = h.inv;
  const std::uint64_t id = h.run_id.load(std::memory_order_relaxed) + 1;
  h.run_budget.store(i.e->budget_ticks, std::memory_order_relaxed);
  h.run_wait.store(0, std::memory_order_relaxed);
  h.run_id.store(id, std::memory_order_relaxed);
  const std::uint64_t start = ticks();
  h.run_start.store(start, std::memory_order_release);
  volatile std::int32_t r = -1;
  bool preempted = false;
  bool faulted = false;
  h.in_handler = 1;
  if (const int jumped = sigsetjmp(h.jb, 0); jumped == 0) {  // both signals use SA_NODEFER: no mask to restore
    r = fn.native != nullptr ? static_cast<std::int32_t>(fn.native(&i.c)) : fn.engine(fn.prog, &i.c);
    h.in_handler = 0;
  } else {
    h.in_handler = 0;
    h.in_api = 0;
    (jumped == 2 ? faulted : preempted) = true;
  }
  h.last_faulted = faulted;
  const std::uint64_t end = ticks();
  h.run_start.store(0, std::memory_order_release);
  // Locks a handler still holds when it returns or is stopped are released, so a stopped
  // handler cannot wedge its EC; returning with a lock held counts as an API error.
  for (std::uint32_t k = 0; k < i.nlocks; ++k) {
    std::uint64_t* w = i.c.handler_mem.at<std::uint64_t>(i.locks[k]);
    if (w != nullptr) std::atomic_ref<std::uint64_t>(*w).store(0, std::memory_order_release);
    if (!preempted && !faulted) i.t->api_errors.add(1);
  }
  i.nlocks = 0;
  for (std::uint32_t k = 0; k < i.dma_live; ++k) i.dma[k].live = false;
  i.dma_live = 0;
  ns = static_cast<std::uint32_t>(std::min<std::uint64_t>(ticks_to_ns(end - start), UINT32_MAX));
  over = preempted || faulted || abort_requested(&h);
  if (preempted) h.preempted.add(1);
  if (over) {
    host_event ev;
    ev.type = host_event::kind::error;
    ev.code = faulted ? errc::fault : errc::aborted;
    ev.source_rank = i.c.msg.source_rank;
    ev.message_id = i.c.msg.message_id;
    ev.value = i.c.kind;
    if (!i.e->events->try_push(ev)) i.t->events_lost.add(1);
  }
  return over ? -1 : r;
}

namespace {
// Default action for a packet of an EC without payload handler (Portals put semantics): the
// payload lands in the host window at its message offset.
bool deposit(ec& e, const task& t, std::uint64_t offset, tally& ta) noexcept {
  if (offset > e.host_len || t.payload_len > e.host_len - offset) return false;
  std::memcpy(e.host + offset, t.frame + t.payload_off, t.payload_len);
  ta.deposit.add(t.payload_len);
  return true;
}

message_desc desc_of(ec_id id, const wire::header& h, std::uint32_t packet_count) noexcept {
  message_desc d{};
  d.ec_id = id;
  d.source_rank = h.source_rank;
  d.message_id = h.message_id;
  d.match_bits = h.match_bits;
  d.offset_bytes = h.offset;
  d.message_len_bytes = h.message_len;
  d.packet_index = h.seq;
  d.flags = ((h.flags & wire::flag_start) || h.seq == 0 ? msg_start : 0u) | ((h.flags & wire::flag_end) ? msg_end : 0u) |
            ((h.flags & wire::flag_retransmit) ? msg_retransmit : 0u) | ((h.flags & wire::flag_coll) ? msg_coll : 0u);
  d.packet_count = packet_count;
  return d;
}

bool continues(std::int32_t r) {
  return r == static_cast<std::int32_t>(ret::success) || r == static_cast<std::int32_t>(ret::success_pending);
}
} // namespace

void runtime_core::run(hpu& h, const task& t) noexcept {
  invocation& i = h.inv;
  ec& e = *ecs[t.ec_slot];
  i.e = &e;
  i.t = &h.tallies[t.ec_slot];
  i.nlocks = 0;
  spin::ctx& c = i.c;
  c.size_bytes = sizeof(spin::ctx);
  c.abi_version = spin::abi_version;
  c.api = &api;
  c.rt = &i;
  wire::header hdr;
  if (t.frame != nullptr) {
    wire::decode_spin(t.frame + t.spin_off, hdr);
    c.packet = byte_view{reinterpret_cast<u8*>(t.frame + t.payload_off), t.payload_len};
  } else {
    const message& m = e.msgs[t.msg_idx];
    hdr.source_rank = m.source;
    hdr.message_id = m.id;
    hdr.match_bits = m.match_bits;
    hdr.message_len = m.len_bytes;
    hdr.offset = m.len_bytes;
    hdr.seq = m.packet_count;
    hdr.flags = wire::flag_end;
    c.packet = byte_view{nullptr, 0};
  }
  c.msg = desc_of(e.id, hdr, t.packet_count);
  c.handler_mem = byte_view{reinterpret_cast<u8*>(e.mem), e.cfg.handler_mem_bytes};
  c.scratch = byte_view{reinterpret_cast<u8*>(t.scratch), t.scratch != nullptr ? e.cfg.scratchpad_bytes : 0};
  c.host_window_len_bytes = e.host_len;
  c.hpu = h.index;
  c.coll = spin::coll_desc{hdr.coll.op, hdr.coll.dtype, hdr.coll.slot, hdr.coll.elem_count, hdr.coll.epoch, hdr.coll.aux};

  done d{};
  d.ec_slot = t.ec_slot;
  d.msg_idx = t.msg_idx;
  d.kind = t.kind;
  d.payload_len = t.payload_len;
  bool over = false;
  switch (t.kind) {
  case task_kind::header:
    c.kind = static_cast<u32>(handler_kind::header);
    d.ret_first = invoke(h, e.cfg.handlers.header, over, d.ns_first);
    if (over) {
      d.flags |= over_budget | (h.last_faulted ? faulted : 0);
    } else if ((t.flags & then_payload) && continues(d.ret_first)) {
      c.kind = static_cast<u32>(handler_kind::payload);
      d.ret_payload = invoke(h, e.cfg.handlers.payload, over, d.ns_payload);
      d.flags |= ran_payload | (over ? over_budget : 0) | (over && h.last_faulted ? faulted : 0);
      if (over)
        e.skip[t.msg_idx].fetch_or(skip_aborted, std::memory_order_relaxed);
      else if (is_valid(d.ret_payload) && is_proceed(static_cast<ret>(d.ret_payload)))
        e.skip[t.msg_idx].fetch_or(skip_proceed, std::memory_order_relaxed);
    } else if ((t.flags & then_deposit) && continues(d.ret_first)) {
      if (!deposit(e, t, c.msg.offset_bytes, *i.t)) d.flags |= deposit_failed;
    }
    break;
  case task_kind::payload:
    if (const std::uint8_t sk = e.skip[t.msg_idx].load(std::memory_order_relaxed); sk != 0) {
      d.flags |= (sk & skip_aborted) ? skipped_aborted : skipped_proceed;
      break;
    }
    c.kind = static_cast<u32>(handler_kind::payload);
    d.ret_first = invoke(h, e.cfg.handlers.payload, over, d.ns_first);
    if (over) d.flags |= over_budget | (h.last_faulted ? faulted : 0);
    // Tell the other queued payload handlers of this message at once, without waiting for the
    // scheduler to see this record (the scheduler sets the same flags when it does).
    if (over)
      e.skip[t.msg_idx].fetch_or(skip_aborted, std::memory_order_relaxed);
    else if (is_valid(d.ret_first) && is_proceed(static_cast<ret>(d.ret_first)))
      e.skip[t.msg_idx].fetch_or(skip_proceed, std::memory_order_relaxed);
    break;
  case task_kind::completion:
    c.kind = static_cast<u32>(handler_kind::completion);
    d.ret_first = invoke(h, e.cfg.handlers.completion, over, d.ns_first);
    if (over) d.flags |= over_budget | (h.last_faulted ? faulted : 0);
    break;
  case task_kind::deposit: {
    const std::uint64_t t0 = ticks();
    if (!deposit(e, t, c.msg.offset_bytes, *i.t)) d.flags |= deposit_failed;
    d.ns_first = static_cast<std::uint32_t>(std::min<std::uint64_t>(ticks_to_ns(ticks() - t0), UINT32_MAX));
    break;
  }
  }
  if (t.frame != nullptr && cfg.release != nullptr) cfg.release(cfg.release_user, t.cookie);
  h.tasks.add(1);
  // Busy time is the handlers' (and deposits') own time, measured once per invocation: a TSC
  // read costs ~10 ns in a VM, so run() takes no extra readings.
  h.busy_ns.add(std::uint64_t{d.ns_first} + d.ns_payload);
  // Never full: the scheduler keeps at most queue-depth tasks outstanding per HPU. Published by
  // hpu_loop after its burst.
  while (!h.out.try_stage(d)) cpu_relax();
}

void runtime_core::hpu_loop(hpu& h) noexcept {
  tls_hpu = &h;
  if (thread_start != nullptr) thread_start(thread_user, h.index);
  // Faults (a handler's stack overflow among them) are handled on a stack of their own.
  std::unique_ptr<std::byte[]> altstack;
  if (catch_faults) {
    constexpr std::size_t altstack_bytes = 64 * 1024;
    altstack.reset(new (std::nothrow) std::byte[altstack_bytes]);
    if (altstack != nullptr) {
      stack_t ss{};
      ss.ss_sp = altstack.get();
      ss.ss_size = altstack_bytes;
      if (sigaltstack(&ss, nullptr) != 0) altstack.reset();
    }
  }
  constexpr std::size_t burst = 16;
  task batch[burst];
  std::uint32_t idle = 0;
  while (true) {
    if (const std::size_t n = h.in.try_pop_burst(batch, burst); n > 0) {
      for (std::size_t k = 0; k < n; ++k) run(h, batch[k]);
      h.out.flush();
      idle = 0;
      continue;
    }
    if (!running.load(std::memory_order_acquire)) break;
    if (++idle < 2000) {
      cpu_relax();
      continue;
    }
    if (idle < 2200) {
      std::this_thread::yield();
      continue;
    }
    // Sleep until the scheduler rings the doorbell (Dekker-style handshake with dispatch()).
    const std::uint32_t bell = h.doorbell.load(std::memory_order_acquire);
    h.sleeping.store(true, std::memory_order_seq_cst);
    if (h.in.empty() && running.load(std::memory_order_acquire)) h.doorbell.wait(bell, std::memory_order_acquire);
    h.sleeping.store(false, std::memory_order_relaxed);
    idle = 0;
  }
  if (altstack != nullptr) {
    stack_t off{};
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, nullptr);
  }
  if (thread_stop != nullptr) thread_stop(thread_user, h.index);
  tls_hpu = nullptr;
}

// ---- watchdog ------------------------------------------------------------------------------

// The budget is CPU time of the HPU thread, not wall time: on a machine with more HPU threads
// than cores the OS may deschedule an HPU in the middle of a handler, which is not the handler's
// fault. Wall time is the cheap first filter; the thread's CPU clock decides. CPU time is
// counted from the tick that first saw the invocation, so detection lags by at most one tick.
void runtime_core::watchdog_loop() {
  struct seen {
    std::uint64_t id = 0;
    std::uint64_t cpu_base_ns = 0;
  };
  std::vector<seen> last(hpus.size());
  auto cpu_ns = [](clockid_t clk) -> std::uint64_t {
    timespec ts{};
    if (clock_gettime(clk, &ts) != 0) return 0;
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
  };
  std::unique_lock lk(wd_mu);
  while (running.load(std::memory_order_acquire)) {
    const std::uint64_t tick_ns = wd_tick_ns.load(std::memory_order_relaxed);
    wd_cv.wait_for(lk, std::chrono::nanoseconds(tick_ns));
    const std::uint64_t now = ticks();
    for (std::size_t k = 0; k < hpus.size(); ++k) {
      hpu& h = *hpus[k];
      const std::uint64_t start = h.run_start.load(std::memory_order_acquire);
      const std::uint64_t id = h.run_id.load(std::memory_order_relaxed);
      if (start == 0) continue;
      if (last[k].id != id) {
        last[k] = seen{id, cpu_ns(h.cpu_clock)};
        continue;
      }
      const std::uint64_t budget = h.run_budget.load(std::memory_order_relaxed);
      if (now <= start || now - start <= budget) continue;
      const std::uint64_t used = cpu_ns(h.cpu_clock) - last[k].cpu_base_ns + tick_ns;
      // Lock waits are not charged, up to lock_wait_cap budgets: a longer wait is a deadlock or
      // a stuck holder, and then the waiter is charged too.
      const std::uint64_t waited = std::min(h.run_wait.load(std::memory_order_relaxed), budget * lock_wait_cap);
      const std::uint64_t used_ticks = ns_to_ticks(used);
      if (used_ticks <= waited || used_ticks - waited <= budget) continue;
      if (h.abort_run.load(std::memory_order_relaxed) == id) continue;
      h.abort_run.store(id, std::memory_order_relaxed);
      if (preempt && h.run_id.load(std::memory_order_relaxed) == id) pthread_kill(h.native, preempt_sig);
    }
  }
}

// ---- scheduler -----------------------------------------------------------------------------

// Publishes the tasks staged by dispatch() and wakes HPUs that went to sleep (Dekker-style
// handshake with hpu_loop: publish, full fence, then read `sleeping`).
void runtime_core::publish() noexcept {
  for (auto& hp : hpus) {
    hpu& h = *hp;
    if (!h.staged) continue;
    h.staged = false;
    h.in.flush();
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (h.sleeping.load(std::memory_order_relaxed)) {
      h.doorbell.fetch_add(1, std::memory_order_release);
      h.doorbell.notify_one();
    }
  }
}

bool runtime_core::dispatch(const task& t) noexcept {
  const std::uint32_t n = static_cast<std::uint32_t>(hpus.size());
  std::uint32_t i = rr < n ? rr : 0;
  for (std::uint32_t k = 0; k < n; ++k, i = i + 1 < n ? i + 1 : 0) {
    hpu& h = *hpus[i];
    if (h.outstanding >= h.in.capacity()) continue;
    if (!h.in.try_stage(t)) continue;
    ++h.outstanding;
    --room;
    ++total_inflight;
    rr = i + 1;
    h.staged = true;
    ec& e = *ecs[t.ec_slot];
    ++e.inflight;
    ++e.msgs[t.msg_idx].inflight;
    return true;
  }
  return false;
}

namespace {
// A message key's hash (its index slot is hash & index_mask). Computed once per packet, stored
// in the message and in the retired FIFO, so that erasing an old key reads nothing else.
std::uint32_t key_hash(std::uint32_t source, std::uint64_t id) {
  std::uint64_t x = id ^ (std::uint64_t{source} * 0x9e3779b97f4a7c15ull);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<std::uint32_t>(x);
}
} // namespace

std::uint32_t runtime_core::find_msg(const ec& e, std::uint32_t hash, std::uint32_t source, std::uint64_t id) const noexcept {
  for (std::uint32_t p = hash & e.index_mask;; p = (p + 1) & e.index_mask) {
    const std::uint64_t v = e.index[p];
    if (v == 0) return none;
    if (static_cast<std::uint32_t>(v >> 32) != hash) continue;
    const auto idx = static_cast<std::uint32_t>(v) - 1;
    const message& m = e.msgs[idx];
    if (m.source == source && m.id == id) return idx;
  }
}

void runtime_core::index_erase(ec& e, std::uint32_t idx) noexcept {
  std::uint32_t p = e.msgs[idx].hash & e.index_mask;
  while (static_cast<std::uint32_t>(e.index[p]) != idx + 1) p = (p + 1) & e.index_mask;
  // Backward-shift deletion keeps linear probing free of tombstones.
  std::uint32_t hole = p;
  for (std::uint32_t q = (p + 1) & e.index_mask; e.index[q] != 0; q = (q + 1) & e.index_mask) {
    const std::uint32_t home = static_cast<std::uint32_t>(e.index[q] >> 32) & e.index_mask;
    // Move q into the hole when its home does not lie cyclically in (hole, q].
    const bool stays = hole <= q ? (home > hole && home <= q) : (home > hole || home <= q);
    if (!stays) {
      e.index[hole] = e.index[q];
      hole = q;
    }
  }
  e.index[hole] = 0;
}

namespace {
// The oldest retired message (retired_count > 0). The ring wraps by comparison: a division per
// packet would cost more than the rest of the bookkeeping.
std::uint32_t pop_retired(ec& e) noexcept {
  const std::uint64_t old = e.retired[e.retired_head];
  if (++e.retired_head == e.retired.size()) e.retired_head = 0;
  --e.retired_count;
  return static_cast<std::uint32_t>(old);
}

// Starts loading what evicting the oldest retired message will touch (its entry and its index
// slot), when the next open or settle will evict it: no free entry left, or the FIFO full. In
// steady state every new message evicts one, long after it was last touched.
void prefetch_victim(const ec& e) noexcept {
  if (e.retired_count == 0 || (!e.free_msgs.empty() && e.retired_count < e.retired.size())) return;
  const std::uint64_t v = e.retired[e.retired_head];
  __builtin_prefetch(&e.msgs[static_cast<std::uint32_t>(v)], 1);
  __builtin_prefetch(&e.index[static_cast<std::uint32_t>(v >> 32) & e.index_mask], 1);
}
} // namespace

void runtime_core::free_msg(ec& e, std::uint32_t idx) noexcept {
  index_erase(e, idx);
  message& m = e.msgs[idx];
  // Bits stay set only for packets received ahead of base (seq in (base, highest)): clear them
  // here, so that a message opens with a clean window without touching it.
  if (m.highest > m.base)
    std::fill_n(e.bitmaps.begin() + static_cast<std::ptrdiff_t>(std::uint64_t{idx} * e.window_words), e.window_words, 0);
  if (m.scratch_slot != none) e.free_scratch.push_back(m.scratch_slot);
  m.state = msg_state::free;  // open_msg initialises every field
  m.scratch_slot = none;
  e.free_msgs.push_back(idx);
}

std::uint32_t runtime_core::open_msg(ec& e, const wire::header& h, std::uint32_t hash) noexcept {
  if (e.free_scratch.empty()) return none;
  if (e.free_msgs.empty()) {
    if (e.retired_count == 0) return none;
    free_msg(e, pop_retired(e));
  }
  const std::uint32_t idx = e.free_msgs.back();
  e.free_msgs.pop_back();
  message& m = e.msgs[idx];
  m = message{};
  m.source = h.source_rank;
  m.hash = hash;
  m.id = h.message_id;
  m.match_bits = h.match_bits;
  m.len_bytes = h.message_len;
  m.state = msg_state::open;
  e.skip[idx].store(0, std::memory_order_relaxed);
  m.scratch_slot = e.free_scratch.back();
  e.free_scratch.pop_back();
  if (e.cfg.scratchpad_bytes > 0)
    std::memset(e.scratch_base + std::uint64_t{m.scratch_slot} * e.scratch_stride, 0,
                e.cfg.scratchpad_bytes + e.cfg.handlers.guard_bytes);
  std::uint32_t p = hash & e.index_mask;
  while (e.index[p] != 0) p = (p + 1) & e.index_mask;
  e.index[p] = (std::uint64_t{hash} << 32) | (idx + 1);
  e.ctr.messages_started.add(1);
  return idx;
}

void runtime_core::retire(ec& e, std::uint32_t idx) noexcept {
  message& m = e.msgs[idx];
  switch (m.result) {
  case outcome::ok: e.ctr.messages_completed.add(1); break;
  case outcome::dropped: e.ctr.messages_dropped.add(1); break;
  case outcome::aborted: e.ctr.messages_aborted.add(1); break;
  }
  if (m.pending) {
    m.state = msg_state::held;  // keeps its scratchpad until release_message
    return;
  }
  settle(e, idx);
}

void runtime_core::settle(ec& e, std::uint32_t idx) noexcept {
  message& m = e.msgs[idx];
  m.state = msg_state::retired;
  if (m.scratch_slot != none) {
    e.free_scratch.push_back(m.scratch_slot);
    m.scratch_slot = none;
  }
  if (e.retired.empty()) {
    free_msg(e, idx);
    return;
  }
  if (e.retired_count == e.retired.size()) {
    free_msg(e, pop_retired(e));
  }
  std::uint32_t tail = e.retired_head + e.retired_count;
  if (tail >= e.retired.size()) tail -= static_cast<std::uint32_t>(e.retired.size());
  e.retired[tail] = std::uint64_t{m.hash} << 32 | idx;
  ++e.retired_count;
  prefetch_victim(e);
}

void runtime_core::want_retry(ec& e, std::uint32_t idx) noexcept {
  message& m = e.msgs[idx];
  if (m.in_retry) return;
  m.in_retry = true;
  e.retry.push_back(idx);  // capacity reserved at install: one entry per message
}

void runtime_core::dispatch_payload(ec& e, std::uint32_t idx, const packet& p, std::uint16_t spin_off,
                                    std::uint16_t payload_off, std::uint32_t len) noexcept {
  message& m = e.msgs[idx];
  if (m.proceed) {
    e.skipped.add(1);
    release(p);
    return;
  }
  task t{};
  if (e.cfg.handlers.payload != nullptr && len > 0) {
    t.kind = task_kind::payload;
  } else if (e.cfg.handlers.payload == nullptr && e.host != nullptr && len > 0) {
    t.kind = task_kind::deposit;
  } else {
    release(p);
    return;
  }
  t.frame = p.frame;
  t.cookie = p.cookie;
  t.frame_len = p.frame_len;
  t.scratch = m.scratch_slot != none ? e.scratch_base + std::uint64_t{m.scratch_slot} * e.scratch_stride : nullptr;
  t.msg_idx = idx;
  t.payload_len = len;
  t.packet_count = m.packet_count;
  t.spin_off = spin_off;
  t.payload_off = payload_off;
  t.ec_slot = static_cast<std::uint16_t>(e.slot);
  // The caller guaranteed room (rx_burst checks before each packet, parked release stops when
  // room runs out), so this cannot fail here.
  if (!dispatch(t)) drop(e, p, drop_reason::parking_full);
}

bool runtime_core::release_parked(ec& e, std::uint32_t idx) noexcept {
  message& m = e.msgs[idx];
  while (m.park_head != none) {
    if (room == 0) return false;
    const std::uint32_t n = m.park_head;
    parked& pk = e.parking[n];
    m.park_head = pk.next;
    if (m.park_head == none) m.park_tail = none;
    dispatch_payload(e, idx, pk.pkt, pk.spin_off, pk.payload_off, pk.payload_len);
    pk.next = e.park_free;
    e.park_free = n;
  }
  return true;
}

void runtime_core::drop_parked(ec& e, std::uint32_t idx, drop_reason r) noexcept {
  message& m = e.msgs[idx];
  while (m.park_head != none) {
    const std::uint32_t n = m.park_head;
    parked& pk = e.parking[n];
    m.park_head = pk.next;
    drop(e, pk.pkt, r);
    pk.next = e.park_free;
    e.park_free = n;
  }
  m.park_tail = none;
}

void runtime_core::check_done(ec& e, std::uint32_t idx) noexcept {
  if (e.draining) return;  // an EC being uninstalled starts no completion handler
  message& m = e.msgs[idx];
  if (m.state != msg_state::open || !m.eom_seen || m.base < m.packet_count || m.inflight > 0 || m.park_head != none)
    return;
  if (e.cfg.handlers.header != nullptr && !m.header_done && m.result == outcome::ok) return;
  if (m.result == outcome::ok && e.cfg.handlers.completion != nullptr) {
    if (m.completion_started) return;
    task t{};
    t.ec_slot = static_cast<std::uint16_t>(e.slot);
    t.msg_idx = idx;
    t.kind = task_kind::completion;
    t.packet_count = m.packet_count;
    t.scratch = m.scratch_slot != none ? e.scratch_base + std::uint64_t{m.scratch_slot} * e.scratch_stride : nullptr;
    if (dispatch(t)) {
      m.completion_started = true;
    } else {
      want_retry(e, idx);
    }
    return;
  }
  retire(e, idx);
}

void runtime_core::handle(const packet& p) noexcept {
  wire::parsed ps;
  wire::reject why;
  if (!wire::parse(std::span<const std::byte>(p.frame, p.frame_len), cfg.udp_port, ps, why)) {
    bump(parser.rejected[static_cast<std::size_t>(why)]);
    release(p);
    return;
  }
  bump(parser.accepted);
  const wire::header& h = ps.hdr;
  std::uint32_t slot = none;
  for (std::uint32_t s : active)
    if (ecs[s]->cfg.match.matches(h.match_bits)) {
      slot = s;
      break;
    }
  if (slot == none) {
    unknown_ec.add(1);
    release(p);
    return;
  }
  ec& e = *ecs[slot];
  if (e.draining) return drop(e, p, drop_reason::ec_removed);
  if (h.type != wire::packet_type::data && h.type != wire::packet_type::result) return drop(e, p, drop_reason::not_data);

  const std::uint32_t hash = key_hash(h.source_rank, h.message_id);
  std::uint32_t idx = find_msg(e, hash, h.source_rank, h.message_id);
  if (idx != none && e.msgs[idx].state != msg_state::open)
    return drop(e, p, e.msgs[idx].result == outcome::aborted ? drop_reason::message_aborted : drop_reason::duplicate);
  const std::uint32_t window = e.window;
  if (idx == none) {
    if (h.seq >= window) return drop(e, p, drop_reason::out_of_window);
    // A packet that would have to wait for its header handler but finds no parking space must
    // not open a message it can never complete.
    if (e.cfg.handlers.header != nullptr && h.seq != 0 && e.park_free == none)
      return drop(e, p, drop_reason::parking_full);
    idx = open_msg(e, h, hash);
    if (idx == none) return drop(e, p, drop_reason::no_message_slot);
  }
  message& m = e.msgs[idx];
  if (h.message_len != m.len_bytes) return drop(e, p, drop_reason::inconsistent);
  if (m.packet_count != 0 && h.seq >= m.packet_count) return drop(e, p, drop_reason::bad_sequence);
  if ((h.flags & wire::flag_end) != 0 && m.highest > h.seq + 1) return drop(e, p, drop_reason::bad_sequence);
  if (h.seq < m.base) return drop(e, p, drop_reason::duplicate);
  if (h.seq - m.base >= window) return drop(e, p, drop_reason::out_of_window);
  // In-order arrival with nothing received ahead (every one-packet message, most streams) needs
  // no bitmap: all its bits are clear (see free_msg).
  const bool in_order = h.seq == m.base && m.highest <= m.base;
  std::uint64_t* bits = e.bitmaps.data() + std::uint64_t{idx} * e.window_words;
  const std::uint32_t bit = h.seq & e.bit_mask;
  if (!in_order && (bits[bit / 64] & (std::uint64_t{1} << (bit % 64)))) return drop(e, p, drop_reason::duplicate);

  const bool needs_header = e.cfg.handlers.header != nullptr && !m.header_done && m.result == outcome::ok;
  const bool park = needs_header && (h.seq != 0 || m.header_started);
  if (park && e.park_free == none) return drop(e, p, drop_reason::parking_full);

  // Accept: mark the packet received and slide the window over the received prefix.
  if (in_order) {
    ++m.base;
  } else {
    bits[bit / 64] |= std::uint64_t{1} << (bit % 64);
    while (true) {
      const std::uint32_t b = m.base & e.bit_mask;
      if (!(bits[b / 64] & (std::uint64_t{1} << (b % 64)))) break;
      bits[b / 64] &= ~(std::uint64_t{1} << (b % 64));
      ++m.base;
    }
  }
  m.highest = std::max(m.highest, h.seq + 1);
  if (h.flags & wire::flag_end) {
    m.eom_seen = true;
    m.packet_count = h.seq + 1;
  }
  e.ctr.packets_in.add(1);
  e.ctr.bytes_in.add(h.payload_len);
  const auto spin_off = static_cast<std::uint16_t>(ps.spin_offset);
  const auto payload_off = static_cast<std::uint16_t>(ps.payload_offset);

  if (m.result == outcome::aborted) {
    drop(e, p, drop_reason::message_aborted);
  } else if (m.result == outcome::dropped) {
    drop(e, p, drop_reason::handler_drop);
  } else if (park) {
    const std::uint32_t n = e.park_free;
    parked& pk = e.parking[n];
    e.park_free = pk.next;
    pk = parked{p, spin_off, payload_off, h.payload_len, none};
    if (m.park_tail == none)
      m.park_head = n;
    else
      e.parking[m.park_tail].next = n;
    m.park_tail = n;
  } else if (needs_header) {
    task t{};
    t.frame = p.frame;
    t.cookie = p.cookie;
    t.frame_len = p.frame_len;
    t.scratch = e.scratch_base != nullptr ? e.scratch_base + std::uint64_t{m.scratch_slot} * e.scratch_stride : nullptr;
    t.msg_idx = idx;
    t.payload_len = h.payload_len;
    t.packet_count = m.packet_count;
    t.spin_off = spin_off;
    t.payload_off = payload_off;
    t.ec_slot = static_cast<std::uint16_t>(slot);
    t.kind = task_kind::header;
    if (h.payload_len > 0 && e.cfg.handlers.payload != nullptr) t.flags |= then_payload;
    if (h.payload_len > 0 && e.cfg.handlers.payload == nullptr && e.host != nullptr) t.flags |= then_deposit;
    m.header_started = true;
    if (!dispatch(t)) drop(e, p, drop_reason::parking_full);  // unreachable: rx_burst checked room
  } else {
    dispatch_payload(e, idx, p, spin_off, payload_off, h.payload_len);
  }
  check_done(e, idx);
}

void runtime_core::set_proceed(ec& e, std::uint32_t idx) noexcept {
  e.msgs[idx].proceed = true;
  e.skip[idx].fetch_or(skip_proceed, std::memory_order_relaxed);
}

void runtime_core::apply(const done& d) noexcept {
  ec& e = *ecs[d.ec_slot];
  message& m = e.msgs[d.msg_idx];
  --e.inflight;
  --m.inflight;
  --total_inflight;
  const bool ran = (d.flags & ran_payload) != 0, over = (d.flags & over_budget) != 0,
             deposit_bad = (d.flags & deposit_failed) != 0;

  auto account = [&](handler_kind k, std::uint64_t ns, std::uint64_t bytes) {
    auto& kc = e.ctr.kinds[static_cast<std::size_t>(k)];
    kc.invocations.add(1);
    kc.bytes.add(bytes);
    kc.time.record(ns);
  };
  // Reacts to a payload handler's return code.
  auto payload_ret = [&](std::int32_t r) {
    if (!is_valid(r)) {
      e.ctr.drops[static_cast<std::size_t>(drop_reason::bad_return)].add(1);
      return;
    }
    const ret v = static_cast<ret>(r);
    if (is_drop(v)) e.ctr.drops[static_cast<std::size_t>(drop_reason::handler_drop)].add(1);
    if (is_proceed(v)) set_proceed(e, d.msg_idx);
    if (is_pending(v)) m.pending = true;
  };
  auto abort_msg = [&](handler_kind k) {
    auto& kc = e.ctr.kinds[static_cast<std::size_t>(k)];
    ((d.flags & faulted) ? kc.faults : kc.over_budget).add(1);
    if (m.result == outcome::ok) {
      m.result = outcome::aborted;
      e.skip[d.msg_idx].fetch_or(skip_aborted, std::memory_order_relaxed);
    }
  };

  switch (d.kind) {
  case task_kind::header: {
    m.header_done = true;
    account(handler_kind::header, d.ns_first, d.payload_len);
    if (ran) account(handler_kind::payload, d.ns_payload, d.payload_len);
    if (over) {
      abort_msg(ran ? handler_kind::payload : handler_kind::header);
      drop_parked(e, d.msg_idx, drop_reason::message_aborted);
      if (!ran) e.ctr.drops[static_cast<std::size_t>(drop_reason::message_aborted)].add(1);
      break;
    }
    const std::int32_t r = d.ret_first;
    const ret v = static_cast<ret>(r);
    if (!is_valid(r) || is_drop(v)) {
      m.result = outcome::dropped;
      e.ctr.drops[static_cast<std::size_t>(is_valid(r) ? drop_reason::handler_drop : drop_reason::bad_return)].add(1);
      if (is_valid(r) && is_pending(v)) m.pending = true;
      drop_parked(e, d.msg_idx, drop_reason::handler_drop);
      break;
    }
    if (is_pending(v)) m.pending = true;
    if (is_proceed(v)) {
      set_proceed(e, d.msg_idx);
      if (d.payload_len > 0 && e.cfg.handlers.payload != nullptr) e.skipped.add(1);
    }
    if (ran) payload_ret(d.ret_payload);
    if (deposit_bad) e.ctr.drops[static_cast<std::size_t>(drop_reason::host_window)].add(1);
    if (e.draining) {
      drop_parked(e, d.msg_idx, drop_reason::ec_removed);  // uninstall drops what waits
    } else if (!release_parked(e, d.msg_idx)) {
      want_retry(e, d.msg_idx);
    }
    break;
  }
  case task_kind::payload:
    if (d.flags & skipped_aborted) {
      e.ctr.drops[static_cast<std::size_t>(drop_reason::message_aborted)].add(1);
      break;
    }
    if (d.flags & skipped_proceed) {
      e.skipped.add(1);
      break;
    }
    account(handler_kind::payload, d.ns_first, d.payload_len);
    if (over) {
      abort_msg(handler_kind::payload);
      break;
    }
    payload_ret(d.ret_first);
    break;
  case task_kind::completion: {
    account(handler_kind::completion, d.ns_first, 0);
    if (over) {
      abort_msg(handler_kind::completion);
    } else if (!is_valid(d.ret_first)) {
      e.ctr.drops[static_cast<std::size_t>(drop_reason::bad_return)].add(1);
      m.result = outcome::dropped;
    } else {
      const ret v = static_cast<ret>(d.ret_first);
      if (is_pending(v)) m.pending = true;
      if (is_drop(v)) m.result = outcome::dropped;
    }
    retire(e, d.msg_idx);
    return;
  }
  case task_kind::deposit:
    if (deposit_bad) e.ctr.drops[static_cast<std::size_t>(drop_reason::host_window)].add(1);
    break;
  }
  check_done(e, d.msg_idx);
}

std::uint32_t runtime_core::poll_done() noexcept {
  std::uint32_t n = 0;
  for (auto& hp : hpus) {
    hpu& h = *hp;
    done batch[32];
    for (std::size_t k; (k = h.out.try_pop_burst(batch, std::size(batch))) > 0;) {
      for (std::size_t j = 0; j < k; ++j) {
        --h.outstanding;
        ++room;
        apply(batch[j]);
      }
      n += static_cast<std::uint32_t>(k);
    }
  }
  return n;
}

void runtime_core::retry_all() noexcept {
  for (std::uint32_t s : active) {
    ec& e = *ecs[s];
    // Entries that still cannot proceed are appended again by want_retry (the list has room
    // for two entries per message), then the processed prefix is removed.
    const std::size_t n = e.retry.size();
    if (n == 0) continue;
    if (e.draining) {
      for (std::uint32_t idx : e.retry) {
        e.msgs[idx].in_retry = false;
        drop_parked(e, idx, drop_reason::ec_removed);
      }
      e.retry.clear();
      continue;
    }
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint32_t idx = e.retry[k];
      message& m = e.msgs[idx];
      m.in_retry = false;
      if (m.state != msg_state::open) continue;
      if (!release_parked(e, idx)) {
        want_retry(e, idx);
        continue;
      }
      check_done(e, idx);
    }
    e.retry.erase(e.retry.begin(), e.retry.begin() + static_cast<std::ptrdiff_t>(n));
  }
}

runtime_core::~runtime_core() {
  running.store(false, std::memory_order_release);
  {
    std::lock_guard lk(wd_mu);
  }
  wd_cv.notify_all();
  if (watchdog.joinable()) watchdog.join();
  for (auto& h : hpus) {
    h->doorbell.fetch_add(1, std::memory_order_release);
    h->doorbell.notify_one();
    if (h->th.joinable()) h->th.join();
  }
  // Tasks the HPUs had published ran before they stopped; their records are applied. Applying
  // them may stage new tasks that no HPU will run: their packets go back to their owner, as
  // does whatever is parked.
  poll_done();
  for (auto& h : hpus) {
    h->in.flush();
    task t;
    while (h->in.try_pop(t))
      if (t.frame != nullptr) drop(*ecs[t.ec_slot], packet{t.frame, t.frame_len, t.cookie}, drop_reason::ec_removed);
  }
  for (std::uint32_t s = 0; s < ecs.size(); ++s)
    if (ecs[s]) free_ec(s);
}

void runtime_core::free_ec(std::uint32_t slot) {
  ec& e = *ecs[slot];
  for (std::uint32_t i = 0; i < e.msgs.size(); ++i)
    if (e.msgs[i].park_head != none) drop_parked(e, i, drop_reason::ec_removed);
  std::lock_guard lk(control_mu);  // stats() reads the arena's accounting
  arena.free(e.mem_block);
  arena.free(e.scratch_block);
  active.erase(std::remove(active.begin(), active.end(), slot), active.end());
  ecs[slot].reset();
}

// ---- control path --------------------------------------------------------------------------

runtime::runtime(std::unique_ptr<runtime_impl> impl) : _impl(std::move(impl)) {}

class runtime_impl : public runtime_core {
public:
  using runtime_core::runtime_core;
};

result<std::unique_ptr<runtime>> runtime::create(const runtime_config& cfg) {
  if (cfg.hpus < 1 || cfg.hpus > 256) return fail(errc::invalid_argument, "runtime: hpus must be 1..256, got " + std::to_string(cfg.hpus));
  if (cfg.hpu_queue_depth == 0 || cfg.hpu_queue_depth > 65536)
    return fail(errc::invalid_argument, "runtime: hpu_queue_depth must be 1..65536");
  if (cfg.dma.latency.count() < 0 || cfg.dma.latency > std::chrono::seconds(1) || !(cfg.dma.bandwidth_gbps >= 0) ||
      (cfg.dma.bandwidth_gbps > 0 && cfg.dma.bandwidth_gbps < 0.001))
    return fail(errc::invalid_argument, "runtime: DMA model needs latency in [0, 1 s] and bandwidth 0 (unlimited) or >= 0.001 Gbit/s");
  if (cfg.max_dma_in_flight > 65536)
    return fail(errc::invalid_argument, "runtime: max_dma_in_flight must be at most 65536 (DMA handles hold a 16-bit slot)");
  if (cfg.nic_memory_bytes == 0) return fail(errc::invalid_argument, "runtime: nic_memory_bytes must be > 0");
  if (cfg.max_ecs == 0 || cfg.max_ecs > UINT16_MAX) return fail(errc::invalid_argument, "runtime: max_ecs must be 1..65535");
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  for (int cpu : cfg.hpu_cpus)
    if (cpu < 0 || cpu >= CPU_SETSIZE || (online > 0 && cpu >= online))
      return fail(errc::invalid_argument, "runtime: cannot pin an HPU to CPU " + std::to_string(cpu) + " (this machine has " +
                                              std::to_string(online) + " online CPUs)");
  auto impl = std::make_unique<runtime_impl>(cfg);
  runtime_core& c = *impl;
  if (c.arena.capacity_bytes() == 0) return fail(errc::no_memory, "runtime: cannot reserve the NIC memory arena");
  g_ns_per_tick = 1.0 / ticks_per_ns();
  c.api.size_bytes = sizeof(api_table);
  c.api.abi_version = spin::abi_version;
  c.api.dma_to_host = api_dma_to_host;
  c.api.dma_from_host = api_dma_from_host;
  c.api.dma_test = api_dma_test;
  c.api.dma_wait = api_dma_wait;
  c.api.send = api_send;
  c.api.post_event = api_post_event;
  c.api.lock = api_lock;
  c.api.unlock = api_unlock;
  c.ecs.resize(cfg.max_ecs);
#if defined(SPIN_TSAN)
  c.preempt = false;
#else
  c.preempt = cfg.preempt;
#endif
  c.preempt_sig = cfg.preempt_signal != 0 ? cfg.preempt_signal : SIGRTMIN + 4;
#if defined(SPIN_TSAN)
  c.catch_faults = false;
#else
  c.catch_faults = cfg.catch_faults;
#endif
  c.thread_start = cfg.hpu_thread_start;
  c.thread_stop = cfg.hpu_thread_stop;
  c.thread_user = cfg.hpu_thread_user;
  if (c.catch_faults && !install_fault_handler())
    return fail(errc::invalid_argument, "runtime: cannot install the fault signal handlers");
  if (c.preempt) {
    struct sigaction sa {};
    sa.sa_handler = on_preempt;
    sa.sa_flags = SA_NODEFER | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(c.preempt_sig, &sa, nullptr) != 0)
      return fail(errc::invalid_argument, "runtime: cannot install the preemption signal handler");
  }
  for (std::uint32_t i = 0; i < cfg.hpus; ++i) {
    auto h = std::make_unique<hpu>(cfg.hpu_queue_depth);
    h->index = i;
    h->inv.rt = &c;
    h->inv.h = h.get();
    h->inv.dma.resize(cfg.max_dma_in_flight);
    h->tallies = std::make_unique<tally[]>(cfg.max_ecs);
    c.room += static_cast<std::uint32_t>(h->in.capacity());
    c.hpus.push_back(std::move(h));
  }
  for (auto& hp : c.hpus) {
    hpu* h = hp.get();
    h->th = std::thread([&c, h] { c.hpu_loop(*h); });
    h->native = h->th.native_handle();
    if (pthread_getcpuclockid(h->native, &h->cpu_clock) != 0)
      return fail(errc::not_supported, "runtime: no CPU-time clock for HPU threads");
    if (!cfg.hpu_cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cfg.hpu_cpus[h->index % cfg.hpu_cpus.size()], &set);
      if (pthread_setaffinity_np(h->native, sizeof set, &set) != 0)
        return fail(errc::invalid_argument, "runtime: cannot pin HPU " + std::to_string(h->index) + " to CPU " +
                                                std::to_string(cfg.hpu_cpus[h->index % cfg.hpu_cpus.size()]));
    }
  }
  c.watchdog = std::thread([&c] { c.watchdog_loop(); });
  return std::unique_ptr<runtime>(new runtime(std::move(impl)));
}

runtime::~runtime() {
  if (_impl) drain();
}

result<region_id> runtime::register_host_memory(std::span<std::byte> mem) {
  if (mem.data() == nullptr || mem.empty()) return fail(errc::invalid_argument, "register_host_memory: empty region");
  _impl->regions.push_back(mem);
  return static_cast<region_id>(_impl->regions.size() - 1);
}

result<void> runtime::unregister_host_memory(region_id region) {
  runtime_core& c = *_impl;
  if (region >= c.regions.size() || c.regions[region].empty())
    return fail(errc::not_found, "unregister_host_memory: host region " + std::to_string(region) + " is not registered");
  for (const auto& e : c.ecs)
    if (e && e->cfg.window && e->cfg.window->region == region)
      return fail(errc::bad_state, "unregister_host_memory: host region " + std::to_string(region) + " is the window of EC \"" +
                                       e->cfg.name + "\"");
  c.regions[region] = {};
  return {};
}

result<ec_id> runtime::install(const ec_config& cfg) {
  runtime_core& c = *_impl;
  const ec_limits& l = cfg.limits;
  if (l.max_messages == 0 || l.window_packets == 0 || l.max_parked_packets == 0 || l.event_queue_depth == 0 ||
      l.handler_budget.count() <= 0)
    return fail(errc::invalid_argument, "install \"" + cfg.name + "\": limits must be > 0");
  if (l.max_messages > ec_limits_max::messages || l.retired_history > ec_limits_max::retired_history ||
      l.window_packets > ec_limits_max::window_packets || l.max_parked_packets > ec_limits_max::parked_packets ||
      l.event_queue_depth > ec_limits_max::event_queue_depth || l.handler_budget > ec_limits_max::handler_budget)
    return fail(errc::invalid_argument, "install \"" + cfg.name + "\": a limit exceeds its maximum (ec_limits_max)");
  std::span<std::byte> host;
  if (cfg.window) {
    if (cfg.window->region >= c.regions.size() || c.regions[cfg.window->region].empty())
      return fail(errc::not_found, "install \"" + cfg.name + "\": host region " + std::to_string(cfg.window->region) + " is not registered");
    const auto r = c.regions[cfg.window->region];
    if (cfg.window->offset_bytes > r.size() || cfg.window->len_bytes > r.size() - cfg.window->offset_bytes)
      return fail(errc::invalid_argument, "install \"" + cfg.name + "\": window [" + std::to_string(cfg.window->offset_bytes) +
                                              ", +" + std::to_string(cfg.window->len_bytes) + ") exceeds region of " +
                                              std::to_string(r.size()) + " bytes");
    host = r.subspan(cfg.window->offset_bytes, cfg.window->len_bytes);
  }
  std::uint32_t slot = none;
  for (std::uint32_t s = 0; s < c.ecs.size(); ++s)
    if (!c.ecs[s]) {
      slot = s;
      break;
    }
  if (slot == none) return fail(errc::no_space, "install \"" + cfg.name + "\": all " + std::to_string(c.ecs.size()) + " EC slots are in use");

  // Host-side tables first: if they cannot be allocated, no NIC memory was taken.
  std::unique_ptr<ec> e;
  const std::uint32_t entries = l.max_messages + l.retired_history;
  try {
    e = std::make_unique<ec>();
    e->cfg = cfg;
    e->window = (l.window_packets + 63) / 64 * 64;
    e->window_words = std::bit_ceil(e->window / 64);
    e->bit_mask = e->window_words * 64 - 1;
    e->msgs.resize(entries);
    e->skip = std::make_unique<std::atomic<std::uint8_t>[]>(entries);
    e->bitmaps.assign(std::uint64_t{entries} * e->window_words, 0);
    e->free_msgs.reserve(entries);
    e->free_scratch.reserve(l.max_messages);
    e->index.assign(std::bit_ceil(std::uint64_t{entries} * 2), 0);
    e->retired.assign(l.retired_history, 0);
    e->parking.resize(l.max_parked_packets);
    e->retry.reserve(std::size_t{entries} * 2);
    e->events = std::make_unique<detail::mpmc_queue<host_event>>(l.event_queue_depth);
  } catch (const std::bad_alloc&) {
    return fail(errc::no_memory, "install \"" + cfg.name + "\": host memory for the EC's tables (" + std::to_string(entries) +
                                     " message entries, " + std::to_string(l.max_parked_packets) + " parking places)");
  }
  // Engine handlers (eBPF) may address up to guard bytes past a region's end: reserve them.
  const std::uint64_t guard = cfg.handlers.guard_bytes;
  if (guard > (1u << 20) || cfg.handler_mem_bytes > UINT64_MAX - guard || cfg.scratchpad_bytes > UINT64_MAX - guard - 63)
    return fail(errc::invalid_argument, "install \"" + cfg.name + "\": handler memory, scratchpad or guard too large");
  const std::uint64_t stride = cfg.scratchpad_bytes == 0 ? 0 : (cfg.scratchpad_bytes + guard + 63) & ~std::uint64_t{63};
  if (cfg.scratchpad_bytes != 0 && stride > UINT64_MAX / l.max_messages)
    return fail(errc::no_memory, "install \"" + cfg.name + "\": scratchpads overflow");
  std::unique_lock arena_lk(c.control_mu);  // stats() reads the arena's accounting
  auto mem = c.arena.allocate(cfg.handler_mem_bytes + guard);
  if (!mem) return fail(errc::no_memory, "install \"" + cfg.name + "\": handler memory: " + mem.err().message);
  auto scr = c.arena.allocate(stride * l.max_messages);
  if (!scr) {
    c.arena.free(*mem);
    return fail(errc::no_memory, "install \"" + cfg.name + "\": scratchpads (" + std::to_string(l.max_messages) + " x " +
                                     std::to_string(stride) + " bytes): " + scr.err().message);
  }
  e->mem_block = *mem;
  e->scratch_block = *scr;
  e->mem = cfg.handler_mem_bytes + guard ? c.arena.data(*mem) : nullptr;
  e->scratch_base = stride ? c.arena.data(*scr) : nullptr;
  e->scratch_stride = stride;
  e->host = host.data();
  e->host_len = host.size();
  e->budget_ticks = ns_to_ticks(static_cast<std::uint64_t>(l.handler_budget.count()));
  for (std::uint32_t i = entries; i-- > 0;) e->free_msgs.push_back(i);
  for (std::uint32_t i = l.max_messages; i-- > 0;) e->free_scratch.push_back(i);
  e->index_mask = static_cast<std::uint32_t>(e->index.size() - 1);
  for (std::uint32_t i = 0; i < l.max_parked_packets; ++i) e->parking[i].next = i + 1 < l.max_parked_packets ? i + 1 : none;
  e->park_free = 0;
  e->id = c.next_ec_id++;
  e->slot = slot;

  const std::uint64_t tick = std::clamp<std::uint64_t>(static_cast<std::uint64_t>(l.handler_budget.count()) / 4, 20'000, 1'000'000);
  if (tick < c.wd_tick_ns.load()) c.wd_tick_ns.store(tick);
  const ec_id id = e->id;
  // No task of this slot is in flight (its last EC drained before it was freed), so the HPUs'
  // counters of the slot can be reset from here.
  for (auto& h : c.hpus) h->tallies[slot].reset();
  c.ecs[slot] = std::move(e);
  c.active.push_back(slot);
  return id;
}

namespace {
std::uint32_t slot_of(const runtime_core& c, ec_id id) {
  for (std::uint32_t s = 0; s < c.ecs.size(); ++s)
    if (c.ecs[s] && c.ecs[s]->id == id) return s;
  return none;
}
} // namespace

result<void> runtime::uninstall(ec_id id, std::chrono::milliseconds timeout) {
  runtime_core& c = *_impl;
  const std::uint32_t slot = slot_of(c, id);
  if (slot == none) return fail(errc::not_found, "uninstall: EC " + std::to_string(id) + " is not installed");
  ec& e = *c.ecs[slot];
  e.draining = true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (e.inflight > 0) {
    c.publish();
    if (c.poll_done() == 0) {
      if (std::chrono::steady_clock::now() > deadline)
        return fail(errc::timeout, "uninstall: EC " + std::to_string(id) + " still has " + std::to_string(e.inflight) +
                                       " handler invocations running");
      std::this_thread::yield();
    }
  }
  c.free_ec(slot);
  return {};
}

result<void> runtime::release_message(ec_id id, std::uint32_t source_rank, std::uint64_t message_id) {
  runtime_core& c = *_impl;
  const std::uint32_t slot = slot_of(c, id);
  if (slot == none) return fail(errc::not_found, "release_message: EC " + std::to_string(id) + " is not installed");
  ec& e = *c.ecs[slot];
  const std::uint32_t idx = c.find_msg(e, key_hash(source_rank, message_id), source_rank, message_id);
  if (idx == none || e.msgs[idx].state != msg_state::held)
    return fail(errc::not_found, "release_message: no held message " + std::to_string(message_id) + " from rank " +
                                     std::to_string(source_rank) + " in EC " + std::to_string(id));
  e.msgs[idx].pending = false;
  c.settle(e, idx);
  return {};
}

std::uint32_t runtime::rx_burst(const packet* pkts, std::uint32_t n) noexcept {
  runtime_core& c = *_impl;
  c.poll_done();
  c.retry_all();
  std::uint32_t i = 0;
  for (; i < n; ++i) {
    if (c.room == 0) {
      c.publish();
      c.poll_done();
      if (c.room == 0) break;
    }
    c.handle(pkts[i]);
  }
  c.publish();
  return i;
}

std::uint32_t runtime::poll() noexcept {
  runtime_core& c = *_impl;
  const std::uint32_t n = c.poll_done();
  c.retry_all();
  c.publish();
  return n;
}

bool runtime::drain(std::chrono::milliseconds timeout) noexcept {
  runtime_core& c = *_impl;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    poll();
    bool retry = false;
    for (std::uint32_t s : c.active) retry |= !c.ecs[s]->retry.empty();
    if (c.total_inflight == 0 && !retry) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
}

std::size_t runtime::poll_events(ec_id id, std::span<host_event> out) noexcept {
  runtime_core& c = *_impl;
  std::lock_guard lk(c.control_mu);
  const std::uint32_t slot = slot_of(c, id);
  if (slot == none) return 0;
  std::size_t n = 0;
  while (n < out.size() && c.ecs[slot]->events->try_pop(out[n])) ++n;
  return n;
}

std::span<std::byte> runtime::handler_memory(ec_id id) {
  runtime_core& c = *_impl;
  const std::uint32_t slot = slot_of(c, id);
  if (slot == none || c.ecs[slot]->mem == nullptr) return {};
  return {c.ecs[slot]->mem, c.ecs[slot]->cfg.handler_mem_bytes};
}

runtime_stats runtime::stats() const {
  const runtime_core& c = *_impl;
  runtime_stats s;
  s.frames_accepted = c.parser.accepted.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < wire::reject_count; ++i) s.frames_rejected[i] = c.parser.rejected[i].load(std::memory_order_relaxed);
  s.unknown_ec = c.unknown_ec.get();
  for (const auto& h : c.hpus) s.hpus.push_back({h->index, h->tasks.get(), h->busy_ns.get(), h->preempted.get()});
  std::lock_guard lk(c.control_mu);
  s.nic_mem_capacity_bytes = c.arena.capacity_bytes();
  s.nic_mem_used_bytes = c.arena.used_bytes();
  s.nic_mem_peak_bytes = c.arena.peak_bytes();
  for (std::uint32_t slot : c.active) {
    const ec& e = *c.ecs[slot];
    ec_stats es;
    es.ec_id = e.id;
    es.name = e.cfg.name;
    e.ctr.snapshot(es);
    for (const auto& h : c.hpus) {
      const tally& t = h->tallies[slot];
      es.dma_to_host_bytes += t.dma_to.get();
      es.dma_from_host_bytes += t.dma_from.get();
      es.dma_ops += t.dma_ops.get();
      es.deposit_bytes += t.deposit.get();
      es.sends += t.sends.get();
      es.send_bytes += t.send_bytes.get();
      es.send_failed += t.send_failed.get();
      es.events_posted += t.events.get();
      es.events_lost += t.events_lost.get();
      es.api_errors += t.api_errors.get();
    }
    es.packets_skipped = e.skipped.get();
    es.handler_mem_bytes = e.cfg.handler_mem_bytes;
    es.nic_mem_bytes = e.mem_block.len_bytes + e.scratch_block.len_bytes;
    s.ecs.push_back(std::move(es));
  }
  return s;
}

double cycle_counter_ghz() { return ticks_per_ns(); }

std::uint32_t runtime::hpus() const { return static_cast<std::uint32_t>(_impl->hpus.size()); }

} // namespace spin::rt
