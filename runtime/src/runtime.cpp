// The control path of the sPIN engine: create, install and uninstall ECs, host memory,
// statistics. The packet path is lane.cpp, the handler API actions.cpp, the budget watchdog.cpp.
#include "core.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include <unistd.h>

namespace spin::rt {

using namespace detail;

class runtime_impl : public runtime_core {
public:
  using runtime_core::runtime_core;
};

namespace detail {

runtime_core::~runtime_core() {
  stop_watchdog();
  // Whatever waits in an inbox runs now; what is parked goes back to its owner.
  for (auto& l : lanes) take_inbox(*l, UINT32_MAX);
  for (std::uint32_t s = 0; s < ecs.size(); ++s)
    if (ecs[s]) free_ec(s);
}

void runtime_core::free_ec(std::uint32_t slot) {
  for (auto& l : lanes) {
    lane_ec& le = *l->ecs[slot];
    for (std::uint32_t i = 0; i < le.table.entries(); ++i)
      if (le.table[i].state != msg_state::free && le.table[i].park_head != none) drop_parked(le, i, drop_reason::ec_removed);
  }
  std::lock_guard lk(control_mu);  // stats() reads the arena's accounting and the EC list
  ec& e = *ecs[slot];
  e.events->close();
  arena.free(e.mem_block);
  arena.free(e.scratch_block);
  active.erase(std::remove(active.begin(), active.end(), slot), active.end());
  for (auto& l : lanes) l->ecs[slot].reset();
  ecs[slot].reset();
}

} // namespace detail

runtime::runtime(std::unique_ptr<runtime_impl> impl) : _impl(std::move(impl)) {}

result<std::unique_ptr<runtime>> runtime::create(const runtime_config& cfg) {
  if (cfg.hpus < 1 || cfg.hpus > 256) return fail(errc::invalid_argument, "runtime: hpus must be 1..256, got " + std::to_string(cfg.hpus));
  if (cfg.inbox_packets == 0 || cfg.inbox_packets > 65536)
    return fail(errc::invalid_argument, "runtime: inbox_packets must be 1..65536, got " + std::to_string(cfg.inbox_packets));
  if (cfg.dma.latency.count() < 0 || cfg.dma.latency > std::chrono::seconds(1) || !(cfg.dma.bandwidth_gbps >= 0) ||
      (cfg.dma.bandwidth_gbps > 0 && cfg.dma.bandwidth_gbps < 0.001))
    return fail(errc::invalid_argument, "runtime: DMA model needs latency in [0, 1 s] and bandwidth 0 (unlimited) or >= 0.001 Gbit/s");
  if (cfg.max_dma_in_flight > 65536)
    return fail(errc::invalid_argument, "runtime: max_dma_in_flight must be at most 65536 (DMA handles hold a 16-bit slot)");
  if (cfg.nic_memory_bytes == 0) return fail(errc::invalid_argument, "runtime: nic_memory_bytes must be > 0");
  if (cfg.max_ecs == 0 || cfg.max_ecs > UINT16_MAX) return fail(errc::invalid_argument, "runtime: max_ecs must be 1..65535");
  auto impl = std::make_unique<runtime_impl>(cfg);
  runtime_core& c = *impl;
  if (c.arena.capacity_bytes() == 0) return fail(errc::no_memory, "runtime: cannot reserve the NIC memory arena");
  (void)ticks_per_ns();  // calibrates once per process, before any handler is timed
  fill_api(c.api);
  c.ecs.resize(cfg.max_ecs);
#if defined(SPIN_TSAN)
  c.preempt = false;
  c.catch_faults = false;
#else
  c.preempt = cfg.preempt;
  c.catch_faults = cfg.catch_faults;
#endif
  c.preempt_sig = cfg.preempt_signal != 0 ? cfg.preempt_signal : SIGRTMIN + 4;
  if (c.catch_faults && !install_fault_handler())
    return fail(errc::invalid_argument, "runtime: cannot install the fault signal handlers");
  if (c.preempt && !install_preempt_handler(c.preempt_sig))
    return fail(errc::invalid_argument, "runtime: cannot install the preemption signal handler");
  c.lane_ctr = std::make_unique<runtime_core::lane_counters[]>(cfg.hpus);
  for (std::uint32_t i = 0; i < cfg.hpus; ++i) {
    auto l = std::make_unique<lane>();
    l->index = i;
    l->inbox = std::make_unique<mpmc_queue<packet>>(cfg.inbox_packets);
    l->ecs.resize(cfg.max_ecs);
    l->steer_to.reserve(cfg.hpus);
    l->inv.rt = &c;
    l->inv.l = l.get();
    l->inv.dma.resize(cfg.max_dma_in_flight);
    spin::ctx& x = l->inv.c;
    x.size_bytes = sizeof(spin::ctx);
    x.abi_version = spin::abi_version;
    x.api = &c.api;
    x.rt = &l->inv;
    x.hpu = i;
    c.lanes.push_back(std::move(l));
  }
  c.start_watchdog();
  return std::unique_ptr<runtime>(new runtime(std::move(impl)));
}

runtime::~runtime() = default;

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
  if (c.cfg.observer != nullptr) {
    const handler_set& h = cfg.handlers;
    const counted_handlers& k = h.counted;
    if (k.counter == nullptr ? (h.header || h.payload || h.completion)
                             : (bool(h.header) != (k.header != nullptr) || bool(h.payload) != (k.payload != nullptr) ||
                                bool(h.completion) != (k.completion != nullptr)))
      return fail(errc::not_supported, "install \"" + cfg.name + "\": this NIC runs in virtual time, which charges each handler the "
                                       "instructions it executes; its handlers do not count them (rebuild the package with "
                                       "spinc --count-instructions)");
  }
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

  // Host-side tables first: if they cannot be allocated, no NIC memory was taken. Each HPU gets
  // a table for all max_messages (they share the scratchpad slots) and its own history.
  std::unique_ptr<ec> e;
  std::vector<std::unique_ptr<lane_ec>> shares;
  try {
    e = std::make_unique<ec>();
    e->cfg = cfg;
    e->scratch_slots.init(l.max_messages, c.lanes.size() > 1);
    e->events = std::make_shared<event_channel>(l.event_queue_depth);
    for (std::size_t k = 0; k < c.lanes.size(); ++k) {
      auto le = std::make_unique<lane_ec>();
      le->table.init(l.max_messages, l.retired_history, l.window_packets);
      le->parking.resize(l.max_parked_packets);
      for (std::uint32_t i = 0; i < l.max_parked_packets; ++i) le->parking[i].next = i + 1 < l.max_parked_packets ? i + 1 : none;
      le->park_free = 0;
      shares.push_back(std::move(le));
    }
  } catch (const std::bad_alloc&) {
    return fail(errc::no_memory, "install \"" + cfg.name + "\": host memory for the EC's tables (" +
                                     std::to_string(std::uint64_t{l.max_messages} + l.retired_history) + " message entries and " +
                                     std::to_string(l.max_parked_packets) + " parking places per HPU, " +
                                     std::to_string(c.lanes.size()) + " HPUs)");
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
  e->key = wire::auth_key::from_bytes(cfg.frame_key);
  e->id = c.next_ec_id++;
  e->slot = slot;

  const std::uint64_t tick = std::clamp<std::uint64_t>(static_cast<std::uint64_t>(l.handler_budget.count()) / 4, 20'000, 1'000'000);
  if (tick < c.wd_tick_ns.load()) c.wd_tick_ns.store(tick);
  const ec_id id = e->id;
  for (std::size_t k = 0; k < c.lanes.size(); ++k) c.lanes[k]->ecs[slot] = std::move(shares[k]);
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

result<void> runtime::uninstall(ec_id id) {
  runtime_core& c = *_impl;
  const std::uint32_t slot = slot_of(c, id);
  if (slot == none) return fail(errc::not_found, "uninstall: EC " + std::to_string(id) + " is not installed");
  c.free_ec(slot);
  return {};
}

result<void> runtime::release_message(ec_id id, std::uint32_t source_rank, std::uint64_t message_id) {
  runtime_core& c = *_impl;
  const std::uint32_t slot = slot_of(c, id);
  if (slot == none) return fail(errc::not_found, "release_message: EC " + std::to_string(id) + " is not installed");
  const std::uint32_t hash = key_hash(source_rank, message_id);
  lane_ec& le = *c.lanes[hpu_of_hash(hash, static_cast<std::uint32_t>(c.lanes.size()))]->ecs[slot];
  const std::uint32_t idx = le.table.find(hash, source_rank, message_id);
  if (idx == none || le.table[idx].state != msg_state::held)
    return fail(errc::not_found, "release_message: no held message " + std::to_string(message_id) + " from rank " +
                                     std::to_string(source_rank) + " in EC " + std::to_string(id));
  le.table[idx].pending = false;
  c.settle(*c.ecs[slot], le, idx);
  return {};
}

std::uint32_t runtime::rx_burst(std::uint32_t hpu, const packet* pkts, std::uint32_t n) noexcept {
  runtime_core& c = *_impl;
  if (hpu >= c.lanes.size()) return 0;
  return c.rx(*c.lanes[hpu], pkts, n);
}

std::uint32_t runtime::poll(std::uint32_t hpu) noexcept {
  runtime_core& c = *_impl;
  if (hpu >= c.lanes.size() || c.lanes.size() == 1) return 0;
  lane& l = *c.lanes[hpu];
  c.attach(l);
  return c.take_inbox(l, static_cast<std::uint32_t>(l.inbox->capacity()));
}

bool runtime::has_work(std::uint32_t hpu) const noexcept {
  const runtime_core& c = *_impl;
  return hpu < c.lanes.size() && !c.lanes[hpu]->inbox->empty_approx();
}

std::uint32_t runtime::hpu_of(std::span<const std::byte> frame) const noexcept {
  const runtime_core& c = *_impl;
  if (c.lanes.size() == 1) return 0;
  wire::parsed ps;
  wire::reject why;
  if (!wire::parse(frame, c.cfg.udp_port, ps, why)) return 0;
  return hpu_of_hash(key_hash(ps.hdr.source_rank, ps.hdr.message_id), static_cast<std::uint32_t>(c.lanes.size()));
}

void runtime::drain() noexcept {
  runtime_core& c = *_impl;
  if (c.lanes.size() == 1) return;
  bool more = true;
  while (more) {
    more = false;
    for (auto& l : c.lanes) {
      c.attach(*l);
      more |= c.take_inbox(*l, UINT32_MAX) != 0;
    }
  }
}

std::size_t runtime::poll_events(ec_id id, std::span<host_event> out) noexcept {
  runtime_core& c = *_impl;
  std::lock_guard lk(c.control_mu);
  const std::uint32_t slot = slot_of(c, id);
  if (slot == none) return 0;
  return c.ecs[slot]->events->take(out);
}

std::size_t runtime::wait_events(ec_id id, std::span<host_event> out, std::chrono::nanoseconds timeout) noexcept {
  runtime_core& c = *_impl;
  std::shared_ptr<event_channel> ch;
  {
    std::lock_guard lk(c.control_mu);
    const std::uint32_t slot = slot_of(c, id);
    if (slot == none) return 0;
    ch = c.ecs[slot]->events;
  }
  return ch->wait(out, timeout);
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
  for (std::size_t k = 0; k < c.lanes.size(); ++k) {
    const auto& p = c.lane_ctr[k].parser;
    s.frames_accepted += p.accepted.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < wire::reject_count; ++i) s.frames_rejected[i] += p.rejected[i].load(std::memory_order_relaxed);
    s.unknown_ec += c.lane_ctr[k].unknown_ec.get();
    const lane& l = *c.lanes[k];
    s.hpus.push_back({l.index, l.tasks.get(), l.busy_ns.get(), l.preempted.get(), l.frames.get(), l.steered.get()});
  }
  std::lock_guard lk(c.control_mu);
  s.nic_mem_capacity_bytes = c.arena.capacity_bytes();
  s.nic_mem_used_bytes = c.arena.used_bytes();
  s.nic_mem_peak_bytes = c.arena.peak_bytes();
  s.watchdog_wakeups = c.wd_wakeups.load(std::memory_order_relaxed);
  std::vector<const ec_counters*> ctrs(c.lanes.size());
  for (std::uint32_t slot : c.active) {
    const ec& e = *c.ecs[slot];
    ec_stats es;
    es.ec_id = e.id;
    es.name = e.cfg.name;
    for (std::size_t k = 0; k < c.lanes.size(); ++k) {
      const lane_ec& le = *c.lanes[k]->ecs[slot];
      ctrs[k] = &le.ctr;
      const tally& t = le.t;
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
      es.packets_skipped += le.skipped.get();
    }
    ec_counters::snapshot(ctrs.data(), ctrs.size(), es);
    es.handler_mem_bytes = e.cfg.handler_mem_bytes;
    es.nic_mem_bytes = e.mem_block.len_bytes + e.scratch_block.len_bytes;
    s.ecs.push_back(std::move(es));
  }
  return s;
}

std::uint32_t runtime::hpus() const { return static_cast<std::uint32_t>(_impl->lanes.size()); }

} // namespace spin::rt
