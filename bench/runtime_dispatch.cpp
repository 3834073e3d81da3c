// runtime_dispatch: nanoseconds per packet through the sPIN runtime (parse, steering, match,
// message tracking, ordering, running the handlers to completion), printed beside the cost of
// moving the same packet descriptors through bare SPSC rings to the same number of consumer
// threads in the same run. With N HPUs this thread drives HPU 0 (every burst goes to it, as to
// an lcore that owns the port) and N-1 threads drive the others, which get their messages'
// packets through the runtime's steering.
//
// Every timed packet is a real wire-format frame (Ethernet/IPv4/UDP/spin, 64-byte payload);
// messages have 64 packets (--message-packets) with start/end flags and distinct ids, so they
// open, complete and retire; one-packet messages show the per-message costs alone. The runtime
// does not copy frames, so each round re-encodes the frame pool with fresh message ids before the
// clock starts. A round is timed from the first rx_burst until every packet was released; round 0 is a
// warm-up; the median of the remaining rounds is reported.
//
// Exit status: 0 when every packet of every round was accepted, handled and released exactly
// as expected; 1 when any packet was lost, dropped or rejected, or a round timed out; 2 on bad
// arguments or set-up errors. Missing a performance aim does not change the exit status.
#include <spin/handler.hpp>
#include <spin/rt/ring.hpp>
#include <spin/rt/runtime.hpp>
#include <spin/rt/wire.hpp>

#include "common.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// Empty handlers: the cost measured is the runtime's, not the handler's. Called through
// function pointers by the runtime, so they are never inlined away.
SPIN_HEADER_HANDLER(bench_empty_header) {
  return spin::ret::success;
}
SPIN_PAYLOAD_HANDLER(bench_empty_payload) {
  return spin::ret::success;
}
SPIN_COMPLETION_HANDLER(bench_empty_completion) {
  return spin::ret::success;
}

namespace {

using namespace spin;
using clock_type = std::chrono::steady_clock;

constexpr std::uint32_t payload_bytes = 64;
constexpr std::uint32_t max_message_packets = 64;
constexpr std::uint64_t bench_match_bits = 0x5b1dull;
constexpr std::uint32_t source_rank = 1;
constexpr std::uint32_t queue_depth = 256;  // the ring baseline's depth (the old HPU task queue's)
// Frames sit 64-byte aligned, one per stride (a ~150-byte frame spans three cache lines).
constexpr std::size_t frame_stride = 192;

// Aims from the issue: runtime cost at most 3x the bare ring cost, and at most 50 ns of HPU
// time per packet (wall ns/packet x HPUs: what each HPU spends per packet at that throughput).
constexpr double aim_ratio = 3.0;
constexpr double aim_ns_per_hpu = 50.0;

void cpu_relax() noexcept {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// ---- release counting ------------------------------------------------------------------------

// The release callback of both the runtime and the ring baseline. Counts releases and sums
// their cookies (each cookie is released once per round, so the sum is known) in per-thread
// slots: a shared atomic would make HPUs contend on one cache line and bill that to whichever
// path is measured. One instance per process (slots are found through a thread_local).
class release_counter {
public:
  static void release(void* user, std::uint64_t cookie) noexcept { static_cast<release_counter*>(user)->add(cookie); }

  std::uint64_t count() const noexcept {
    std::uint64_t n = _shared.n.load(std::memory_order_relaxed);
    for (const auto& s : _slots) n += s.n.load(std::memory_order_relaxed);
    return n;
  }
  std::uint64_t cookie_sum() const noexcept {
    std::uint64_t n = _shared.sum.load(std::memory_order_relaxed);
    for (const auto& s : _slots) n += s.sum.load(std::memory_order_relaxed);
    return n;
  }

private:
  struct alignas(rt::cache_line) slot {
    std::atomic<std::uint64_t> n{0}, sum{0};
  };

  void add(std::uint64_t cookie) noexcept {
    thread_local slot* mine = nullptr;
    if (mine == nullptr) {
      const std::uint32_t k = _next.fetch_add(1, std::memory_order_relaxed);
      mine = k < _slots.size() ? &_slots[k] : &_shared;
    }
    if (mine == &_shared) {  // more threads than slots: correct, just slower
      _shared.n.fetch_add(1, std::memory_order_relaxed);
      _shared.sum.fetch_add(cookie, std::memory_order_relaxed);
      return;
    }
    // Single writer per slot: load + store, no read-modify-write (as rt::counter).
    mine->n.store(mine->n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    mine->sum.store(mine->sum.load(std::memory_order_relaxed) + cookie, std::memory_order_relaxed);
  }

  std::array<slot, 64> _slots;
  slot _shared;
  std::atomic<std::uint32_t> _next{0};
};

// ---- frames ----------------------------------------------------------------------------------

// N real frames in one buffer; packet k is packet k % P of message base + k / P (P packets per
// message).
class frame_pool {
public:
  frame_pool(std::uint64_t packets, std::uint32_t packets_per_message)
      : _per_msg(packets_per_message), _bytes(new (std::align_val_t{rt::cache_line}) std::byte[packets * frame_stride]), _pkts(packets) {
    for (std::uint64_t k = 0; k < packets; ++k) _pkts[k] = rt::packet{_bytes.get() + k * frame_stride, 0, k};
    for (std::uint32_t i = 0; i < payload_bytes; ++i) _payload[i] = static_cast<std::byte>(i * 7 + 1);
  }

  // Writes every frame for messages base_id, base_id + 1, ... Not timed.
  bool encode(std::uint64_t base_id) {
    const rt::wire::endpoint src = rt::wire::rank_endpoint(source_rank);
    const rt::wire::endpoint dst = rt::wire::rank_endpoint(0);
    for (std::uint64_t k = 0; k < _pkts.size(); ++k) {
      const auto seq = static_cast<std::uint32_t>(k % _per_msg);
      rt::wire::header h;
      h.source_rank = source_rank;
      h.match_bits = bench_match_bits;
      h.message_id = base_id + k / _per_msg;
      h.seq = seq;
      h.message_len = std::uint64_t{payload_bytes} * _per_msg;
      h.offset = std::uint64_t{seq} * payload_bytes;
      h.flags = static_cast<std::uint16_t>((seq == 0 ? rt::wire::flag_start : 0) |
                                           (seq + 1 == _per_msg ? rt::wire::flag_end : 0));
      const std::size_t n = rt::wire::encode(src, dst, h, _payload, std::span<std::byte>(_pkts[k].frame, frame_stride));
      if (n == 0) return false;
      _pkts[k].frame_len = static_cast<std::uint32_t>(n);
    }
    return true;
  }

  std::span<const rt::packet> packets() const { return _pkts; }
  std::uint64_t messages() const { return _pkts.size() / _per_msg; }
  std::uint32_t packets_per_message() const { return _per_msg; }
  std::uint32_t frame_len() const { return _pkts.empty() ? 0 : _pkts[0].frame_len; }
  // Sum of all cookies: what one round adds to release_counter::cookie_sum.
  std::uint64_t cookie_sum() const { return _pkts.size() * (_pkts.size() - 1) / 2; }

private:
  struct aligned_delete {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{rt::cache_line}); }
  };
  std::uint32_t _per_msg;
  std::unique_ptr<std::byte[], aligned_delete> _bytes;
  std::vector<rt::packet> _pkts;
  std::array<std::byte, payload_bytes> _payload{};
};

// ---- measurements ----------------------------------------------------------------------------

struct options {
  std::uint64_t packets = 1u << 18;
  std::uint32_t reps = 5;
  std::uint32_t burst = 32;
  std::uint32_t message_packets = max_message_packets;
  std::string json_path;
  std::string only = "all";               // one variant by name, or all
  std::vector<std::uint32_t> hpus{1, 2};  // HPU counts (and ring consumer counts)
};

using spin::bench::median;

double ns_per_packet(clock_type::duration d, std::uint64_t packets) {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()) / static_cast<double>(packets);
}

struct variant {
  const char* name;
  const char* what;
  rt::handler_set handlers;
};

struct runtime_result {
  std::string variant;
  std::uint32_t hpus = 0;
  std::vector<double> ns;        // ns/packet of each measured round
  double hpu_busy_ns_per_task = 0;  // hpu_stats busy_ns / tasks (measured rounds)
  double tasks_per_packet = 0;
  bool ok = true;                // every packet accounted for in every round
};

struct ring_result {
  std::uint32_t consumers = 0;
  std::vector<double> ns;
  bool ok = true;
};

// Checks one round's counter deltas; prints what is wrong and returns false on any loss.
bool check_round(const char* label, std::uint32_t round, const rt::runtime_stats& before, const rt::runtime_stats& after,
                 const variant& v, std::uint64_t n, std::uint64_t msgs, std::uint64_t released, std::uint64_t cookies,
                 std::uint64_t expect_cookies) {
  bool ok = true;
  auto bad = [&](const std::string& what) {
    std::fprintf(stderr, "FAIL %s round %u: %s\n", label, round, what.c_str());
    ok = false;
  };
  const auto& eb = before.ecs.at(0);
  const auto& ea = after.ecs.at(0);
  auto delta = [](std::uint64_t a, std::uint64_t b) { return std::to_string(a - b); };
  if (ea.packets_in - eb.packets_in != n) bad("packets_in grew by " + delta(ea.packets_in, eb.packets_in) + ", expected " + std::to_string(n));
  if (after.frames_accepted - before.frames_accepted != n) bad("frames_accepted grew by " + delta(after.frames_accepted, before.frames_accepted));
  for (std::size_t r = 0; r < rt::wire::reject_count; ++r)
    if (after.frames_rejected[r] != before.frames_rejected[r])
      bad(std::string("frames rejected as ") + rt::wire::reject_name(static_cast<rt::wire::reject>(r)));
  if (after.unknown_ec != before.unknown_ec) bad("frames matched no EC");
  for (std::size_t r = 0; r < rt::drop_reason_count; ++r)
    if (ea.drops[r] != eb.drops[r])
      bad(std::string("dropped ") + delta(ea.drops[r], eb.drops[r]) + " as " + rt::drop_reason_name(static_cast<rt::drop_reason>(r)));
  if (ea.packets_skipped != eb.packets_skipped) bad("packets skipped");
  if (ea.messages_completed - eb.messages_completed != msgs)
    bad("messages_completed grew by " + delta(ea.messages_completed, eb.messages_completed) + ", expected " + std::to_string(msgs));
  auto invocations = [&](handler_kind k) {
    const auto i = static_cast<std::size_t>(k);
    return ea.kinds[i].invocations - eb.kinds[i].invocations;
  };
  const std::uint64_t want_hh = v.handlers.header ? msgs : 0, want_ph = v.handlers.payload ? n : 0,
                      want_ch = v.handlers.completion ? msgs : 0;
  if (invocations(handler_kind::header) != want_hh) bad("header handler ran " + std::to_string(invocations(handler_kind::header)) + " times");
  if (invocations(handler_kind::payload) != want_ph) bad("payload handler ran " + std::to_string(invocations(handler_kind::payload)) + " times");
  if (invocations(handler_kind::completion) != want_ch)
    bad("completion handler ran " + std::to_string(invocations(handler_kind::completion)) + " times");
  for (std::size_t k = 0; k < 3; ++k)
    if (ea.kinds[k].over_budget != eb.kinds[k].over_budget) bad("handler over budget");
  if (released != n) bad("release callback called " + std::to_string(released) + " times, expected " + std::to_string(n));
  if (cookies != expect_cookies) bad("released cookies do not match the frames fed (a frame released twice or never)");
  return ok;
}

runtime_result run_runtime(const variant& v, std::uint32_t hpus, frame_pool& pool, const options& o, release_counter& rc,
                           std::uint64_t& next_id) {
  runtime_result res;
  res.variant = v.name;
  res.hpus = hpus;
  rt::runtime_config cfg;
  cfg.hpus = hpus;
  cfg.release = &release_counter::release;
  cfg.release_user = &rc;
  auto created = rt::runtime::create(cfg);
  if (!created) {
    std::fprintf(stderr, "runtime::create: %s\n", created.err().message.c_str());
    res.ok = false;
    return res;
  }
  rt::runtime& r = *created.value();

  rt::ec_config ec;
  ec.name = v.name;
  ec.match.bits = bench_match_bits;
  ec.handlers = v.handlers;
  ec.handler_mem_bytes = 64;
  ec.scratchpad_bytes = 64;
  // Sized so that nothing is dropped: in-order feeding keeps far fewer than 1024 messages open,
  // and every open message can park all its non-header packets.
  ec.limits.max_messages = 1024;
  ec.limits.max_parked_packets = 1024 * pool.packets_per_message();
  auto id = r.install(ec);
  if (!id) {
    std::fprintf(stderr, "install: %s\n", id.err().message.c_str());
    res.ok = false;
    return res;
  }

  const auto pkts = pool.packets();
  const std::uint64_t n = pkts.size();
  std::uint64_t hpu_tasks = 0, hpu_busy = 0;
  // HPUs 1.. run on threads of their own (spin, then yield, when their inbox is empty).
  std::atomic<bool> stop{false};
  std::vector<std::thread> lcores;
  for (std::uint32_t k = 1; k < hpus; ++k)
    lcores.emplace_back([&r, &stop, k] {
      std::uint32_t idle = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (r.poll(k) != 0) {
          idle = 0;
        } else if (++idle < 2000) {
          cpu_relax();
        } else {
          std::this_thread::yield();
        }
      }
    });
  for (std::uint32_t round = 0; round <= o.reps; ++round) {
    if (!pool.encode(next_id)) {
      std::fprintf(stderr, "wire::encode failed\n");
      res.ok = false;
      break;
    }
    next_id += pool.messages();
    const rt::runtime_stats before = r.stats();
    const std::uint64_t rel0 = rc.count(), sum0 = rc.cookie_sum();

    const auto t0 = clock_type::now();
    std::uint64_t i = 0;
    while (i < n) {
      const auto want = static_cast<std::uint32_t>(std::min<std::uint64_t>(o.burst, n - i));
      const std::uint32_t got = r.rx_burst(0, pkts.data() + i, want);
      i += got;
      if (got < want) cpu_relax();  // another HPU's inbox is full: it runs meanwhile
    }
    // The other HPUs finish what was steered to them; HPU 0 runs its own inbox meanwhile.
    const auto deadline = t0 + std::chrono::seconds(60);
    bool idle = true;
    while (rc.count() - rel0 < n) {
      if (r.poll(0) == 0) cpu_relax();
      if (clock_type::now() > deadline) {
        idle = false;
        break;
      }
    }
    const auto t1 = clock_type::now();

    const rt::runtime_stats after = r.stats();
    const std::string label = std::string(v.name) + "/" + std::to_string(hpus) + " HPU";
    if (!idle) {
      std::fprintf(stderr, "FAIL %s round %u: packets still held after 60 s\n", label.c_str(), round);
      res.ok = false;
    }
    res.ok &= check_round(label.c_str(), round, before, after, v, n, pool.messages(), rc.count() - rel0,
                          rc.cookie_sum() - sum0, pool.cookie_sum());
    if (round == 0) continue;  // warm-up
    res.ns.push_back(ns_per_packet(t1 - t0, n));
    for (std::size_t h = 0; h < after.hpus.size(); ++h) {
      hpu_tasks += after.hpus[h].tasks - before.hpus[h].tasks;
      hpu_busy += after.hpus[h].busy_ns - before.hpus[h].busy_ns;
    }
  }
  stop.store(true);
  for (auto& t : lcores) t.join();
  res.hpu_busy_ns_per_task = hpu_tasks ? static_cast<double>(hpu_busy) / static_cast<double>(hpu_tasks) : 0;
  res.tasks_per_packet = static_cast<double>(hpu_tasks) / static_cast<double>(n * o.reps);
  return res;
}

// The same descriptors through bare SPSC rings: the main thread pushes round-robin (skipping a
// full ring, as the runtime's dispatch does) to `consumers` threads that pop and call the same
// release callback. Consumers idle as HPUs do: spin, then yield.
ring_result run_ring(std::uint32_t consumers, const frame_pool& pool, const options& o, release_counter& rc) {
  ring_result res;
  res.consumers = consumers;
  std::vector<std::unique_ptr<rt::spsc_ring<rt::packet>>> rings;
  for (std::uint32_t c = 0; c < consumers; ++c) rings.push_back(std::make_unique<rt::spsc_ring<rt::packet>>(queue_depth));
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (std::uint32_t c = 0; c < consumers; ++c) {
    threads.emplace_back([&rc, &stop, ring = rings[c].get()] {
      rt::packet p;
      std::uint32_t idle = 0;
      for (;;) {
        if (ring->try_pop(p)) {
          release_counter::release(&rc, p.cookie);
          idle = 0;
          continue;
        }
        if (stop.load(std::memory_order_acquire)) break;
        if (++idle < 2000) {
          cpu_relax();
        } else {
          std::this_thread::yield();
        }
      }
    });
  }

  const auto pkts = pool.packets();
  const std::uint64_t n = pkts.size();
  for (std::uint32_t round = 0; round <= o.reps; ++round) {
    const std::uint64_t rel0 = rc.count(), sum0 = rc.cookie_sum();
    const auto t0 = clock_type::now();
    std::uint32_t rr = 0;
    for (std::uint64_t i = 0; i < n;) {
      bool pushed = false;
      for (std::uint32_t k = 0; k < consumers && !pushed; ++k) {
        const std::uint32_t c = (rr + k) % consumers;
        if (rings[c]->try_push(pkts[i])) {
          pushed = true;
          rr = c + 1;
        }
      }
      if (pushed)
        ++i;
      else
        std::this_thread::yield();  // every ring full: let the consumers run
    }
    const auto deadline = clock_type::now() + std::chrono::seconds(60);
    while (rc.count() - rel0 < n && clock_type::now() < deadline) std::this_thread::yield();
    const auto t1 = clock_type::now();
    const std::uint64_t released = rc.count() - rel0, cookies = rc.cookie_sum() - sum0;
    if (released != n || cookies != pool.cookie_sum()) {
      std::fprintf(stderr, "FAIL ring/%u round %u: %lu releases, cookie sum %s\n", consumers, round,
                   static_cast<unsigned long>(released), cookies == pool.cookie_sum() ? "ok" : "wrong");
      res.ok = false;
    }
    if (round > 0) res.ns.push_back(ns_per_packet(t1 - t0, n));
  }
  stop.store(true, std::memory_order_release);
  for (auto& t : threads) t.join();
  return res;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"Nanoseconds per packet through the spinnic runtime, beside bare SPSC ring hand-off of the same packets."};
  app.add_option("--packets", o.packets, "packets per timed round (rounded down to whole messages)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{max_message_packets}, std::uint64_t{1} << 24));
  app.add_option("--message-packets", o.message_packets, "packets per message (1: every packet opens and retires a message)")
      ->capture_default_str()
      ->check(CLI::Range(1u, max_message_packets));
  app.add_option("--reps", o.reps, "measured rounds per variant (after one warm-up round); the median is reported")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u));
  app.add_option("--burst", o.burst, "frames per rx_burst call")->capture_default_str()->check(CLI::Range(1u, 4096u));
  app.add_option("--json", o.json_path, "also write the results as JSON to this file");
  app.add_option("--variant", o.only, "run only this variant (payload, hdr+pay+cmpl, none) or all")
      ->capture_default_str()
      ->check(CLI::IsMember({"all", "payload", "hdr+pay+cmpl", "none"}));
  app.add_option("--hpus", o.hpus, "HPU counts to run (the ring baseline uses as many consumers)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is a ParseError with exit code 0
  }
  o.packets -= o.packets % o.message_packets;
  // A JSON file that cannot be written is found before the run, not after it.
  if (!o.json_path.empty() && !std::ofstream(o.json_path, std::ios::app)) {
    std::fprintf(stderr, "runtime_dispatch: cannot write %s\n", o.json_path.c_str());
    return 2;
  }

  frame_pool pool(o.packets, o.message_packets);
  if (!pool.encode(1)) {
    std::fprintf(stderr, "wire::encode failed\n");
    return 2;
  }

  std::printf("runtime_dispatch: %lu packets/round (%lu messages x %u packets, %u-byte payload, %u-byte frames), "
              "%u measured rounds + 1 warm-up, burst %u, %u hardware threads\n",
              static_cast<unsigned long>(o.packets), static_cast<unsigned long>(pool.messages()), o.message_packets,
              payload_bytes, pool.frame_len(), o.reps, o.burst, std::thread::hardware_concurrency());
  // Other work on the machine competes with the threads that drive the HPUs, which spin: the
  // conditions (build, CPU, load) print first, with a warning for each that spoils the figures.
  spin::bench::run_conditions cond = spin::bench::measure_conditions();
  cond.print("runtime_dispatch");

  release_counter rc;
  const std::array<variant, 3> variants{{
      {"payload", "payload handler only (empty)", {nullptr, bench_empty_payload, nullptr}},
      {"hdr+pay+cmpl", "header, payload and completion handlers (all empty)", {bench_empty_header, bench_empty_payload, bench_empty_completion}},
      {"none", "no handlers: the runtime's own per-packet work alone", {nullptr, nullptr, nullptr}},
  }};
  std::vector<std::uint32_t> hpu_counts = o.hpus;
  std::sort(hpu_counts.begin(), hpu_counts.end());
  hpu_counts.erase(std::unique(hpu_counts.begin(), hpu_counts.end()), hpu_counts.end());

  bool ok = true;
  std::vector<ring_result> rings;
  for (std::uint32_t c : hpu_counts) {
    std::fprintf(stderr, "running bare ring, %u consumer(s)...\n", c);
    rings.push_back(run_ring(c, pool, o, rc));
    ok &= rings.back().ok;
  }
  std::vector<runtime_result> results;
  std::uint64_t next_id = 1;
  for (const auto& v : variants) {
    if (o.only != "all" && o.only != v.name) continue;
    for (std::uint32_t h : hpu_counts) {
      std::fprintf(stderr, "running %s, %u HPU(s)...\n", v.name, h);
      results.push_back(run_runtime(v, h, pool, o, rc, next_id));
      ok &= results.back().ok;
    }
  }

  auto ring_ns = [&](std::uint32_t hpus) {
    for (const auto& r : rings)
      if (r.consumers == hpus) return median(r.ns);
    return 0.0;
  };

  std::printf("\n%-13s %4s %9s %7s %10s %7s %10s %11s %8s %8s\n", "variant", "HPUs", "ns/pkt", "Mpps", "ring ns/pkt", "ratio",
              "ns*HPU/pkt", "HPU ns/task", "<=3x", "<=50ns");
  nlohmann::json jresults = nlohmann::json::array();
  for (const auto& r : results) {
    const double ns = median(r.ns);
    const double ring = ring_ns(r.hpus);
    const double ratio = ring > 0 ? ns / ring : 0;
    const double per_hpu = ns * r.hpus;
    const bool aim_ratio_met = ratio <= aim_ratio;
    const bool aim_hpu_met = per_hpu <= aim_ns_per_hpu;
    char busy[32] = "-";  // no HPU tasks (variant none)
    if (r.tasks_per_packet > 0) std::snprintf(busy, sizeof busy, "%.1f", r.hpu_busy_ns_per_task);
    std::printf("%-13s %4u %9.1f %7.2f %10.1f %7.2f %10.1f %11s %8s %8s%s\n", r.variant.c_str(), r.hpus, ns,
                ns > 0 ? 1e3 / ns : 0, ring, ratio, per_hpu, busy, aim_ratio_met ? "met" : "MISSED",
                aim_hpu_met ? "met" : "MISSED", r.ok ? "" : "  (packets lost: see above)");
    jresults.push_back({
        {"variant", r.variant},
        {"hpus", r.hpus},
        {"ns_per_packet", ns},
        {"mpps", ns > 0 ? 1e3 / ns : 0},
        {"ns_per_packet_rounds", r.ns},
        {"ns_per_packet_min", r.ns.empty() ? 0 : *std::min_element(r.ns.begin(), r.ns.end())},
        {"ring_ns_per_packet", ring},
        {"ratio", ratio},
        {"hpu_ns_per_packet", per_hpu},
        {"hpu_busy_ns_per_task", r.hpu_busy_ns_per_task},
        {"hpu_tasks_per_packet", r.tasks_per_packet},
        {"aim_ratio_met", aim_ratio_met},
        {"aim_hpu_ns_met", aim_hpu_met},
        {"all_packets_accounted", r.ok},
    });
  }
  std::printf("\nvariants: ");
  for (const auto& v : variants)
    if (o.only == "all" || o.only == v.name) std::printf("%s = %s; ", v.name, v.what);
  std::printf("\nring: the same packet descriptors pushed through rt::spsc_ring (depth %u) to 1 or 2 consumer threads "
              "(round-robin) that call the same release callback\n",
              queue_depth);
  for (const auto& r : rings)
    if (!r.ns.empty())
      std::printf("ring rounds, %u consumer(s): %.1f to %.1f ns/packet (a ring that runs near empty pays a cache-line "
                  "transfer per packet; one that runs full moves lines in batches)\n",
                  r.consumers, *std::min_element(r.ns.begin(), r.ns.end()), *std::max_element(r.ns.begin(), r.ns.end()));
  std::printf("aims: runtime at most %.0fx the bare ring cost (ratio), and at most %.0f ns per packet per HPU "
              "(ns*HPU/pkt = wall ns/packet x HPUs)\n",
              aim_ratio, aim_ns_per_hpu);
  std::printf("HPU ns/task: hpu_stats busy_ns / tasks over the measured rounds, as the runtime defines busy_ns "
              "(runtime/include/spin/rt/stats.hpp)\n");
  std::printf("packets: %s\n", ok ? "every packet of every round accounted for" : "LOST OR DROPPED PACKETS (exit status 1)");

  cond.load_after = spin::bench::load_average();
  std::printf("load average after: %.2f %.2f %.2f\n", cond.load_after[0], cond.load_after[1], cond.load_after[2]);
  if (!o.json_path.empty()) {
    nlohmann::json jrings = nlohmann::json::array();
    for (const auto& r : rings)
      jrings.push_back({{"consumers", r.consumers}, {"ns_per_packet", median(r.ns)}, {"ns_per_packet_rounds", r.ns}, {"ok", r.ok}});
    const nlohmann::json doc = {
        {"benchmark", "runtime_dispatch"},
        {"conditions", cond.to_json()},
        {"config",
         {{"packets", o.packets},
          {"messages", pool.messages()},
          {"packets_per_message", o.message_packets},
          {"payload_bytes", payload_bytes},
          {"frame_bytes", pool.frame_len()},
          {"reps", o.reps},
          {"burst", o.burst},
          {"ring_depth", queue_depth},
          {"hardware_threads", std::thread::hardware_concurrency()}}},
        {"aims", {{"max_ratio", aim_ratio}, {"max_ns_per_packet_per_hpu", aim_ns_per_hpu}}},
        {"ring", jrings},
        {"results", jresults},
        {"all_packets_accounted", ok},
    };
    std::ofstream f(o.json_path);
    f << doc.dump(2) << '\n';
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", o.json_path.c_str());
      return 2;
    }
  }
  return ok ? 0 : 1;
}
