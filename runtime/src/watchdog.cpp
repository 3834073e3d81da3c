// The handler budget (docs/architecture.md, "Handler budget"): one watchdog thread for every
// runtime of the process finds invocations over their budget and stops them with a signal to
// the thread running them; the fault handler stops a handler that faults.
#include "core.hpp"

#include <algorithm>
#include <cstring>

namespace spin::rt::detail {

thread_local lane* tls_lane __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

// Signal handler of the preemption signal: leaves the handler code of an over-budget run.
void on_preempt(int) {
  lane* l = tls_lane;
  if (l != nullptr && l->in_handler && !l->in_api && abort_requested(l)) siglongjmp(l->jb, 1);
}

// Synchronous faults (bad memory access, division trap, illegal instruction). In handler code
// they stop the invocation like an overrun does; anywhere else they go to whoever handled them
// before us (the default action, or a sanitizer), so runtime bugs still crash.
constexpr int fault_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
struct sigaction previous_fault_action[std::size(fault_signals)];

void on_fault(int sig, siginfo_t* info, void* uc) {
  lane* l = tls_lane;
  if (l != nullptr && l->in_handler && !l->in_api) {
    l->fault_sig = sig;
    siglongjmp(l->jb, 2);
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

std::mutex signal_install_mu;

// The alternate signal stack this library gave a thread; disabled and freed when the thread
// ends.
struct altstack {
  std::unique_ptr<std::byte[]> mem;
  bool checked = false;
  ~altstack() {
    if (mem == nullptr) return;
    stack_t cur{};
    if (sigaltstack(nullptr, &cur) == 0 && cur.ss_sp == mem.get()) {
      stack_t off{};
      off.ss_flags = SS_DISABLE;
      sigaltstack(&off, nullptr);
    }
  }
};
thread_local altstack tls_altstack;

} // namespace

// Installed by every runtime that is created, when a fault signal's handler is not already
// ours (a test framework or an application may have replaced it since): the handler found is
// kept and gets every fault outside handler code. Never removed: other runtimes may rely on it.
bool install_fault_handler() {
  std::lock_guard lk(signal_install_mu);
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

bool install_preempt_handler(int sig) {
  std::lock_guard lk(signal_install_mu);
  struct sigaction sa {};
  sa.sa_handler = on_preempt;
  sa.sa_flags = SA_NODEFER | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  return sigaction(sig, &sa, nullptr) == 0;
}

void ensure_altstack() noexcept {
  altstack& a = tls_altstack;
  if (a.checked) return;
  a.checked = true;
  stack_t cur{};
  if (sigaltstack(nullptr, &cur) == 0 && !(cur.ss_flags & SS_DISABLE)) return;  // the thread has one (a sanitizer's)
  constexpr std::size_t bytes = 64 * 1024;
  a.mem.reset(new (std::nothrow) std::byte[bytes]);
  if (a.mem == nullptr) return;
  stack_t ss{};
  ss.ss_sp = a.mem.get();
  ss.ss_size = bytes;
  if (sigaltstack(&ss, nullptr) != 0) a.mem.reset();
}

std::atomic<bool> watchdog_asleep{false};

namespace {

// One watchdog thread serves every runtime of the process. A thread per runtime woke each of
// them every millisecond while handlers ran: a 16-host cluster (17 runtimes) took 17,000
// wake-ups a second, each a context switch on a core an lcore needed (measured: 636,000 context
// switches for 400 calls of `spin-bench coll -n 16 -b 4194304 -e 4194304 --algorithm switch`,
// 90 % of them the watchdogs'). Its cost now does not grow with the number of runtimes.
class watchdog_service {
public:
  // Never destroyed: a runtime may outlive the static objects (one a test leaks, or one
  // destroyed by another static's destructor); the thread stops with the last runtime.
  static watchdog_service& get() {
    static watchdog_service* s = new watchdog_service();
    return *s;
  }

  // Starts the thread with the first runtime. Throws std::system_error when it cannot.
  void attach(runtime_core* c) {
    std::lock_guard life(life_mu);
    {
      std::lock_guard lk(mu);
      c->wd_last.assign(c->lanes.size(), {});
      c->wd_last_run.assign(c->lanes.size(), 0);
      cores.push_back(c);
      if (thread.joinable()) {
        quiet_ticks = 0;  // a new runtime's first tick comes at its rate, not after a doze
        cv.notify_all();
        return;
      }
      stop = false;
      quiet_ticks = 0;
    }
    try {
      thread = std::thread([this] { loop(); });
    } catch (...) {
      std::lock_guard lk(mu);
      std::erase(cores, c);
      throw;
    }
  }

  // After it returns the watchdog does not touch `c` again; the last runtime stops the thread.
  void detach(runtime_core* c) noexcept {
    std::lock_guard life(life_mu);
    bool last = false;
    {
      std::lock_guard lk(mu);
      std::erase(cores, c);
      last = cores.empty();
      if (last) stop = true;
    }
    cv.notify_all();
    if (last && thread.joinable()) thread.join();
  }

  void wake() noexcept {
    if (!watchdog_asleep.exchange(false, std::memory_order_acq_rel)) return;
    std::lock_guard lk(mu);
    cv.notify_all();
  }

private:
  watchdog_service() = default;

  // Ticks at the shortest tick of the runtimes it serves. After 64 ticks in which no
  // invocation ran in any of them it dozes (ten wake-ups per second) until an invocation starts
  // and wakes it (invoke() reads `watchdog_asleep` once per invocation, without a fence: a run
  // that starts just as the watchdog dozes off is seen at the next wake-up, at most 100 ms
  // late), so that idle NICs cost almost no CPU.
  void loop() {
    std::unique_lock lk(mu);
    while (!stop) {
      std::uint64_t tick_ns = 1'000'000;
      for (const runtime_core* c : cores) tick_ns = std::min(tick_ns, c->wd_tick_ns.load(std::memory_order_relaxed));
      if (quiet_ticks >= 64) {
        // Dozing: it stays so (quiet_ticks is not reset) until a wake-up finds an invocation.
        watchdog_asleep.store(true, std::memory_order_seq_cst);
        bool running = false;
        for (const runtime_core* c : cores)
          for (const auto& l : c->lanes) running |= l->run_start.load(std::memory_order_acquire) != 0;
        if (!running) cv.wait_for(lk, std::chrono::milliseconds(100));
        watchdog_asleep.store(false, std::memory_order_relaxed);
      } else {
        cv.wait_for(lk, std::chrono::nanoseconds(tick_ns));
      }
      if (stop) break;
      const std::uint64_t now = ticks();
      bool any = false;
      for (runtime_core* c : cores) any |= c->watchdog_tick(now, tick_ns);
      quiet_ticks = any ? 0 : std::min<std::uint32_t>(quiet_ticks + 1, 64);
    }
  }

  std::mutex life_mu;  // serialises attach and detach (the thread's start and join)
  std::mutex mu;       // guards what follows; the thread holds it while it checks
  std::condition_variable cv;
  std::vector<runtime_core*> cores;
  std::uint32_t quiet_ticks = 0;
  bool stop = false;
  std::thread thread;
};

std::uint64_t thread_cpu_ns(clockid_t clk) noexcept {
  timespec ts{};
  if (clock_gettime(clk, &ts) != 0) return 0;
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

} // namespace

void runtime_core::start_watchdog() { watchdog_service::get().attach(this); }

void runtime_core::stop_watchdog() noexcept { watchdog_service::get().detach(this); }

void runtime_core::wake_watchdog() noexcept { watchdog_service::get().wake(); }

// The budget is CPU time of the thread running the handler, not wall time: on a machine with
// more threads than cores the OS may deschedule it in the middle of a handler, which is not the
// handler's fault. Wall time is the cheap first filter; the thread's CPU clock decides. CPU time
// is counted from the tick that first saw the invocation, so detection lags by at most one
// tick. Runs on the watchdog thread, under its lock.
bool runtime_core::watchdog_tick(std::uint64_t now, std::uint64_t tick_ns) noexcept {
  wd_wakeups.fetch_add(1, std::memory_order_relaxed);
  bool any = false;
  for (std::size_t k = 0; k < lanes.size(); ++k) {
    lane& l = *lanes[k];
    const std::uint64_t start = l.run_start.load(std::memory_order_acquire);
    const std::uint64_t id = l.run_id.load(std::memory_order_relaxed);
    if (id != wd_last_run[k]) {
      wd_last_run[k] = id;
      any = true;
    }
    if (start == 0) continue;
    any = true;
    if (!l.driver_clock_ok.load(std::memory_order_relaxed)) continue;
    const clockid_t clk = l.driver_clock.load(std::memory_order_relaxed);
    if (wd_last[k].id != id) {
      wd_last[k] = {id, thread_cpu_ns(clk)};
      continue;
    }
    const std::uint64_t budget = l.run_budget.load(std::memory_order_relaxed);
    if (now <= start || now - start <= budget) continue;
    const std::uint64_t used = thread_cpu_ns(clk) - wd_last[k].cpu_base_ns + tick_ns;
    // Lock waits are not charged, up to lock_wait_cap budgets: a longer wait is a deadlock or
    // a stuck holder, and then the waiter is charged too.
    const std::uint64_t waited = std::min(l.run_wait.load(std::memory_order_relaxed), budget * lock_wait_cap);
    const std::uint64_t used_ticks = ns_to_ticks(used);
    if (used_ticks <= waited || used_ticks - waited <= budget) continue;
    if (l.abort_run.load(std::memory_order_relaxed) == id) continue;
    l.abort_run.store(id, std::memory_order_relaxed);
    if (preempt && l.run_id.load(std::memory_order_relaxed) == id)
      pthread_kill(static_cast<pthread_t>(l.driver_id.load(std::memory_order_relaxed)), preempt_sig);
  }
  return any;
}

} // namespace spin::rt::detail
