// The handler budget (docs/architecture.md, "Handler budget"): a watchdog thread per runtime
// finds invocations over their budget and stops them with a signal to the thread running them;
// the fault handler stops a handler that faults.
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

void runtime_core::start_watchdog() {
  watchdog = std::thread([this] { watchdog_loop(); });
}

void runtime_core::stop_watchdog() noexcept {
  {
    std::lock_guard lk(wd_mu);
    wd_stop = true;
  }
  wd_cv.notify_all();
  if (watchdog.joinable()) watchdog.join();
}

void runtime_core::wake_watchdog() noexcept {
  if (!wd_dozing.exchange(false, std::memory_order_acq_rel)) return;
  std::lock_guard lk(wd_mu);
  wd_cv.notify_all();
}

// The budget is CPU time of the thread running the handler, not wall time: on a machine with
// more threads than cores the OS may deschedule it in the middle of a handler, which is not the
// handler's fault. Wall time is the cheap first filter; the thread's CPU clock decides. CPU time
// is counted from the tick that first saw the invocation, so detection lags by at most one
// tick. After 64 ticks in which no invocation ran the watchdog dozes
// (ten wake-ups per second) until an invocation starts and wakes it (invoke() reads wd_dozing
// once per invocation, without a fence: a run that starts just as the watchdog dozes off is
// seen at the next wake-up, at most 100 ms late), so that an idle NIC costs almost no CPU.
void runtime_core::watchdog_loop() {
  struct seen {
    std::uint64_t id = 0;
    std::uint64_t cpu_base_ns = 0;
  };
  std::vector<seen> last(lanes.size());
  std::vector<std::uint64_t> last_run(lanes.size(), 0);
  auto cpu_ns = [](clockid_t clk) -> std::uint64_t {
    timespec ts{};
    if (clock_gettime(clk, &ts) != 0) return 0;
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
  };
  std::uint32_t quiet_ticks = 0;
  std::unique_lock lk(wd_mu);
  while (!wd_stop) {
    const std::uint64_t tick_ns = wd_tick_ns.load(std::memory_order_relaxed);
    if (quiet_ticks >= 64) {
      // Dozing: it stays so (quiet_ticks is not reset) until a wake-up finds an invocation.
      wd_dozing.store(true, std::memory_order_seq_cst);
      bool running = false;
      for (auto& l : lanes) running |= l->run_start.load(std::memory_order_acquire) != 0;
      if (!running) wd_cv.wait_for(lk, std::chrono::milliseconds(100));
      wd_dozing.store(false, std::memory_order_relaxed);
    } else {
      wd_cv.wait_for(lk, std::chrono::nanoseconds(tick_ns));
    }
    if (wd_stop) break;
    wd_wakeups.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t now = ticks();
    bool any = false;
    for (std::size_t k = 0; k < lanes.size(); ++k) {
      lane& l = *lanes[k];
      const std::uint64_t start = l.run_start.load(std::memory_order_acquire);
      const std::uint64_t id = l.run_id.load(std::memory_order_relaxed);
      if (id != last_run[k]) {
        last_run[k] = id;
        any = true;
      }
      if (start == 0) continue;
      any = true;
      if (!l.driver_clock_ok.load(std::memory_order_relaxed)) continue;
      const clockid_t clk = l.driver_clock.load(std::memory_order_relaxed);
      if (last[k].id != id) {
        last[k] = seen{id, cpu_ns(clk)};
        continue;
      }
      const std::uint64_t budget = l.run_budget.load(std::memory_order_relaxed);
      if (now <= start || now - start <= budget) continue;
      const std::uint64_t used = cpu_ns(clk) - last[k].cpu_base_ns + tick_ns;
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
    quiet_ticks = any ? 0 : std::min<std::uint32_t>(quiet_ticks + 1, 64);
  }
}

} // namespace spin::rt::detail
