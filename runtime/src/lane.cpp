// The per-HPU packet path (run to completion): a frame is parsed, steered to the HPU that owns
// its message, matched to an EC, checked against its message's window, and handled at once:
// the header handler when its header packet arrives, then that packet's payload handler, then
// those of the packets parked before it, then the payload handler of every later packet the
// header handler let through, then the completion handler when the last packet is in. Nothing
// crosses to another core on this path but steered frames.
#include "core.hpp"

#include <algorithm>
#include <cstring>

namespace spin::rt::detail {

namespace {

bool is_drop(ret r) { return r == ret::drop || r == ret::drop_pending; }
bool is_proceed(ret r) { return r == ret::proceed || r == ret::proceed_pending; }
bool is_pending(ret r) { return r == ret::success_pending || r == ret::drop_pending || r == ret::proceed_pending; }
bool is_valid(std::int32_t r) { return r >= 0 && r <= static_cast<std::int32_t>(ret::proceed_pending); }
bool continues(std::int32_t r) {
  return r == static_cast<std::int32_t>(ret::success) || r == static_cast<std::int32_t>(ret::success_pending);
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
  d.flags = wire::message_flags_of(h.flags) | (h.seq == 0 ? msg_start : 0u);
  d.packet_count = packet_count;
  return d;
}

// Default action for a packet of an EC without payload handler (Portals put semantics): the
// payload lands in the host window at its message offset.
bool deposit(ec& e, lane_ec& le, const std::byte* payload, std::uint32_t len, std::uint64_t offset) noexcept {
  if (offset > e.host_len || len > e.host_len - offset) return false;
  std::memcpy(e.host + offset, payload, len);
  le.t.deposit.add(len);
  return true;
}

} // namespace

void runtime_core::attach(lane& l) noexcept {
  const pthread_t self = pthread_self();
  if (l.has_driver && pthread_equal(l.driver, self)) return;
  l.driver = self;
  l.has_driver = true;
  clockid_t clk{};
  const bool ok = pthread_getcpuclockid(self, &clk) == 0;
  l.driver_id.store(static_cast<std::uint64_t>(self), std::memory_order_relaxed);
  l.driver_clock.store(clk, std::memory_order_relaxed);
  l.driver_clock_ok.store(ok, std::memory_order_release);
  if (catch_faults) ensure_altstack();
}

std::int32_t runtime_core::invoke(lane& l, ec& e, lane_ec& le, const handler_ref& fn, handler_kind kind,
                                  std::uint32_t msg_idx, const wire::header& hdr, const packet* p, std::uint16_t payload_off,
                                  std::uint32_t payload_len, bool& over) noexcept {
  invocation& i = l.inv;
  i.e = &e;
  i.t = &le.t;
  i.nlocks = 0;
  const message& m = le.table[msg_idx];
  spin::ctx& c = i.c;
  i.pkt = p;
  i.forwarded = p != nullptr && l.forwarded_carry;
  l.forwarded_carry = false;
  i.payload = p != nullptr ? payload_of(*p, payload_off) : nullptr;
  i.payload_len = p != nullptr ? payload_len : 0;
  c.packet = byte_view{reinterpret_cast<u8*>(i.payload), i.payload_len};
  c.msg = desc_of(e.id, hdr, m.packet_count);
  c.handler_mem = byte_view{reinterpret_cast<u8*>(e.mem), e.cfg.handler_mem_bytes};
  std::byte* scratch = m.scratch_slot != none ? e.scratch_of(m.scratch_slot) : nullptr;
  c.scratch = byte_view{reinterpret_cast<u8*>(scratch), scratch != nullptr ? e.cfg.scratchpad_bytes : 0};
  c.host_window_len_bytes = e.host_len;
  c.coll = spin::coll_desc{hdr.coll.op, hdr.coll.dtype, hdr.coll.slot, hdr.coll.elem_count, hdr.coll.epoch, hdr.coll.aux};
  c.kind = static_cast<u32>(kind);

  // Virtual time: the counted twin, reported to the observer with its instruction count.
  invocation_observer* const ob = cfg.observer;
  handler_fn counted = nullptr;
  if (ob != nullptr) {
    const counted_handlers& k = e.cfg.handlers.counted;
    counted = kind == handler_kind::header ? k.header : kind == handler_kind::payload ? k.payload : k.completion;
    i.counter = k.counter;
    i.count0 = *k.counter;
    ob->begin(l.index, e.id, kind, c.msg.source_rank, c.msg.message_id, c.msg.packet_count);
  }
  const std::uint64_t id = l.run_id.load(std::memory_order_relaxed) + 1;
  l.run_budget.store(e.budget_ticks, std::memory_order_relaxed);
  l.run_wait.store(0, std::memory_order_relaxed);
  l.run_id.store(id, std::memory_order_relaxed);
  const std::uint64_t start = ticks();
  l.run_start.store(start, std::memory_order_release);
  if (watchdog_dozing()) wake_watchdog();
  volatile std::int32_t r = -1;
  bool preempted = false;
  bool faulted = false;
  tls_lane = &l;
  l.in_handler = 1;
  if (const int jumped = sigsetjmp(l.jb, 0); jumped == 0) {  // both signals use SA_NODEFER: no mask to restore
    r = counted != nullptr    ? static_cast<std::int32_t>(counted(&c))
        : fn.native != nullptr ? static_cast<std::int32_t>(fn.native(&c))
                               : fn.engine(fn.prog, &c);
    l.in_handler = 0;
  } else {
    l.in_handler = 0;
    l.in_api = 0;
    (jumped == 2 ? faulted : preempted) = true;
  }
  tls_lane = nullptr;
  i.pkt = nullptr;
  const std::uint64_t end = ticks();
  l.run_start.store(0, std::memory_order_release);
  // Locks a handler still holds when it returns or is stopped are released, so a stopped
  // handler cannot wedge its EC; returning with a lock held counts as an API error.
  for (std::uint32_t k = 0; k < i.nlocks; ++k) {
    std::uint64_t* w = c.handler_mem.at<std::uint64_t>(i.locks[k]);
    if (w != nullptr) std::atomic_ref<std::uint64_t>(*w).store(0, std::memory_order_release);
    if (!preempted && !faulted) le.t.api_errors.add(1);
  }
  i.nlocks = 0;
  for (std::uint32_t k = 0; k < i.dma_live; ++k) i.dma[k].live = false;
  i.dma_live = 0;
  const std::uint64_t ns = ticks_to_ns(end - start);
  auto& kc = le.ctr.kinds[static_cast<std::size_t>(kind)];
  kc.invocations.add(1);
  kc.bytes.add(payload_len);
  kc.time.record(ns);
  l.tasks.add(1);
  l.busy_ns.add(ns);
  over = preempted || faulted || abort_requested(&l);
  if (ob != nullptr) {
    ob->end(*i.counter - i.count0, over);
    i.counter = nullptr;
  }
  if (preempted) l.preempted.add(1);
  if (over) {
    (faulted ? kc.faults : kc.over_budget).add(1);
    host_event ev;
    ev.type = host_event::kind::error;
    ev.code = faulted ? errc::fault : errc::aborted;
    ev.source_rank = c.msg.source_rank;
    ev.message_id = c.msg.message_id;
    ev.value = c.kind;
    if (!e.events->post(ev)) le.t.events_lost.add(1);
  }
  return over ? -1 : r;
}

void runtime_core::drop_parked(lane_ec& le, std::uint32_t idx, drop_reason r) noexcept {
  message& m = le.table[idx];
  while (m.park_head != none) {
    const std::uint32_t n = m.park_head;
    parked& pk = le.parking[n];
    m.park_head = pk.next;
    drop(le, pk.pkt, r);
    pk.next = le.park_free;
    le.park_free = n;
  }
  m.park_tail = none;
}

// Runs the payload handler of a packet whose message's header handler has returned (or that
// has none), or deposits its payload; releases the packet.
void runtime_core::run_payload(lane& l, ec& e, lane_ec& le, std::uint32_t idx, const wire::header& h, const packet& p,
                               std::uint16_t payload_off, std::uint32_t len) noexcept {
  message& m = le.table[idx];
  if (m.result == outcome::aborted) return drop(le, p, drop_reason::message_aborted);
  if (m.result == outcome::dropped) return drop(le, p, drop_reason::handler_drop);
  if (m.proceed) {
    le.skipped.add(1);
    return release(p);
  }
  if (len == 0) return release(p);
  if (e.cfg.handlers.payload != nullptr) {
    bool over = false;
    const std::int32_t r = invoke(l, e, le, e.cfg.handlers.payload, handler_kind::payload, idx, h, &p, payload_off, len, over);
    if (over) {
      m.result = outcome::aborted;
    } else if (!is_valid(r)) {
      le.ctr.drops[static_cast<std::size_t>(drop_reason::bad_return)].add(1);
    } else {
      const ret v = static_cast<ret>(r);
      if (is_drop(v)) le.ctr.drops[static_cast<std::size_t>(drop_reason::handler_drop)].add(1);
      if (is_proceed(v)) m.proceed = true;
      if (is_pending(v)) m.pending = true;
    }
  } else if (e.host != nullptr) {
    const std::uint64_t t0 = ticks();
    if (invocation_observer* ob = cfg.observer; ob != nullptr) ob->action(action_info{action_kind::deposit, 0, len, 1, 0});
    if (!deposit(e, le, payload_of(p, payload_off), len, h.offset))
      le.ctr.drops[static_cast<std::size_t>(drop_reason::host_window)].add(1);
    l.tasks.add(1);
    l.busy_ns.add(ticks_to_ns(ticks() - t0));
  }
  release(p);
}

void runtime_core::run_parked(lane& l, ec& e, lane_ec& le, std::uint32_t idx) noexcept {
  message& m = le.table[idx];
  while (m.park_head != none) {
    const std::uint32_t n = m.park_head;
    const parked pk = le.parking[n];
    m.park_head = pk.next;
    if (m.park_head == none) m.park_tail = none;
    le.parking[n].next = le.park_free;
    le.park_free = n;
    wire::header h;
    wire::decode_spin(pk.pkt.frame + pk.spin_off, h);
    run_payload(l, e, le, idx, h, pk.pkt, pk.payload_off, pk.payload_len);
  }
}

// The header packet: the header handler, then (when it lets the message continue) this
// packet's own payload handler or deposit, then every packet parked behind it.
void runtime_core::run_header(lane& l, ec& e, lane_ec& le, std::uint32_t idx, const wire::header& h, const packet& p,
                              std::uint16_t payload_off, std::uint32_t len) noexcept {
  message& m = le.table[idx];
  bool over = false;
  const std::int32_t r = invoke(l, e, le, e.cfg.handlers.header, handler_kind::header, idx, h, &p, payload_off, len, over);
  m.header_done = true;
  if (over) {
    m.result = outcome::aborted;
    drop(le, p, drop_reason::message_aborted);
    drop_parked(le, idx, drop_reason::message_aborted);
    return;
  }
  if (!is_valid(r) || is_drop(static_cast<ret>(r))) {
    m.result = outcome::dropped;
    le.ctr.drops[static_cast<std::size_t>(is_valid(r) ? drop_reason::handler_drop : drop_reason::bad_return)].add(1);
    if (is_valid(r) && is_pending(static_cast<ret>(r))) m.pending = true;
    release(p);
    drop_parked(le, idx, drop_reason::handler_drop);
    return;
  }
  if (is_pending(static_cast<ret>(r))) m.pending = true;
  if (continues(r)) {
    l.forwarded_carry = l.inv.forwarded;  // the same packet's payload handler: invoke takes it over
    run_payload(l, e, le, idx, h, p, payload_off, len);
    l.forwarded_carry = false;
  } else {  // proceed: the payload handlers of this packet and all later ones are skipped
    m.proceed = true;
    if (len > 0 && e.cfg.handlers.payload != nullptr) le.skipped.add(1);
    release(p);
  }
  run_parked(l, e, le, idx);
}

void runtime_core::settle(ec& e, lane_ec& le, std::uint32_t idx) noexcept {
  message& m = le.table[idx];
  if (m.scratch_slot != none) {
    e.scratch_slots.give(m.scratch_slot);
    m.scratch_slot = none;
  }
  le.table.settle(idx);
}

void runtime_core::retire(ec& e, lane_ec& le, std::uint32_t idx) noexcept {
  message& m = le.table[idx];
  switch (m.result) {
  case outcome::ok: le.ctr.messages_completed.add(1); break;
  case outcome::dropped: le.ctr.messages_dropped.add(1); break;
  case outcome::aborted: le.ctr.messages_aborted.add(1); break;
  }
  if (m.pending) {
    m.state = msg_state::held;  // keeps its scratchpad until release_message
    return;
  }
  settle(e, le, idx);
}

void runtime_core::check_done(lane& l, ec& e, lane_ec& le, std::uint32_t idx) noexcept {
  message& m = le.table[idx];
  if (m.state != msg_state::open || !m.eom_seen || m.base < m.packet_count || m.park_head != none) return;
  if (m.result == outcome::ok && e.cfg.handlers.completion != nullptr) {
    wire::header h;
    h.source_rank = m.source;
    h.message_id = m.id;
    h.match_bits = m.match_bits;
    h.message_len = m.len_bytes;
    h.offset = m.len_bytes;
    h.seq = m.packet_count;
    h.flags = wire::flag_end;
    bool over = false;
    const std::int32_t r = invoke(l, e, le, e.cfg.handlers.completion, handler_kind::completion, idx, h, nullptr, 0, 0, over);
    if (over) {
      m.result = outcome::aborted;
    } else if (!is_valid(r)) {
      le.ctr.drops[static_cast<std::size_t>(drop_reason::bad_return)].add(1);
      m.result = outcome::dropped;
    } else {
      const ret v = static_cast<ret>(r);
      if (is_pending(v)) m.pending = true;
      if (is_drop(v)) m.result = outcome::dropped;
    }
  }
  retire(e, le, idx);
}

// Returns false only when the frame belongs to another HPU whose inbox is full (the caller
// keeps it).
bool runtime_core::handle(lane& l, const packet& in, bool may_steer) noexcept {
  wire::parsed ps;
  wire::reject why;
  lane_counters& lc = lane_ctr[l.index];
  packet p = in;
  const wire::segment segs[2] = {{p.frame, p.frame_len}, {p.tail, p.tail_len}};
  if (!wire::parse(std::span<const wire::segment>(segs, p.tail != nullptr ? 2 : 1), cfg.udp_port, ps, why)) {
    lc.parser.rejected[static_cast<std::size_t>(why)].store(
        lc.parser.rejected[static_cast<std::size_t>(why)].load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    l.frames.add(1);
    release(p);
    return true;
  }
  const wire::header& h = ps.hdr;
  const std::uint32_t hash = key_hash(h.source_rank, h.message_id);
  if (may_steer && lanes.size() > 1) {
    const std::uint32_t owner = hpu_of_hash(hash, static_cast<std::uint32_t>(lanes.size()));
    if (owner != l.index) {
      if (!lanes[owner]->inbox->try_push(p)) return false;
      l.steered.add(1);
      if (std::find(l.steer_to.begin(), l.steer_to.end(), owner) == l.steer_to.end()) l.steer_to.push_back(owner);
      return true;
    }
  }
  l.frames.add(1);
  lc.parser.accepted.store(lc.parser.accepted.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  std::uint32_t slot = none;
  for (std::uint32_t s : active)
    if (ecs[s]->cfg.match.matches(h.match_bits)) {
      slot = s;
      break;
    }
  if (slot == none) {
    lc.unknown_ec.add(1);
    release(p);
    return true;
  }
  ec& e = *ecs[slot];
  lane_ec& le = *l.ecs[slot];
  if (h.type != wire::packet_type::data && h.type != wire::packet_type::result) {
    drop(le, p, drop_reason::not_data);
    return true;
  }
  // Whether the frame crossed a link, before a private copy (unshare) replaces the packet.
  const bool from_link = !p.local;
  // A payload in a second buffer reaches the handlers in place only when it is exactly that
  // buffer; a shared one only when the EC's handlers do not write such packets.
  if (((p.tail != nullptr && ps.payload_offset != p.frame_len) || (p.shared && !e.cfg.limits.read_only_multicast)) &&
      (cfg.unshare == nullptr || !cfg.unshare(cfg.release_user, p))) {
    drop(le, p, drop_reason::no_private_copy);
    return true;
  }
  // An EC with a frame key takes from links only frames whose tag verifies (the payload is
  // contiguous here: in the frame, or exactly its tail).
  if (!e.key.none() && from_link &&
      ((h.flags & wire::flag_auth) == 0 ||
       wire::auth_tag(e.key, h, std::span<const std::byte>(payload_of(p, ps.payload_offset), h.payload_len)) != h.auth_tag)) {
    drop(le, p, drop_reason::unauthenticated);
    return true;
  }

  message_table& tb = le.table;
  std::uint32_t idx = tb.find(hash, h.source_rank, h.message_id);
  if (idx != none && tb[idx].state != msg_state::open) {
    drop(le, p, tb[idx].result == outcome::aborted ? drop_reason::message_aborted : drop_reason::duplicate);
    return true;
  }
  const bool has_header = e.cfg.handlers.header != nullptr;
  if (idx == none) {
    if (h.seq >= tb.window()) {
      drop(le, p, drop_reason::out_of_window);
      return true;
    }
    // A packet that would have to wait for its header handler but finds no parking space must
    // not open a message it can never complete.
    if (has_header && h.seq != 0 && le.park_free == none) {
      drop(le, p, drop_reason::parking_full);
      return true;
    }
    std::uint32_t scratch = none;
    if (!e.scratch_slots.take(scratch)) {
      drop(le, p, drop_reason::no_message_slot);
      return true;
    }
    idx = tb.open(hash, h.source_rank, h.message_id);
    if (idx == none) {  // every entry of this HPU open or held
      e.scratch_slots.give(scratch);
      drop(le, p, drop_reason::no_message_slot);
      return true;
    }
    message& m = tb[idx];
    m.match_bits = h.match_bits;
    m.len_bytes = h.message_len;
    m.scratch_slot = scratch;
    m.header_done = !has_header;
    if (e.cfg.scratchpad_bytes > 0 && e.cfg.scratchpad == scratchpad_init::zeroed)
      std::memset(e.scratch_of(scratch), 0, e.cfg.scratchpad_bytes + e.cfg.handlers.guard_bytes);
    le.ctr.messages_started.add(1);
  }
  message& m = tb[idx];
  if (h.message_len != m.len_bytes) {
    drop(le, p, drop_reason::inconsistent);
    return true;
  }
  const bool end = (h.flags & wire::flag_end) != 0;
  const seq_verdict v = tb.check(idx, h.seq, end);
  switch (v) {
  case seq_verdict::bad_sequence: drop(le, p, drop_reason::bad_sequence); return true;
  case seq_verdict::duplicate: drop(le, p, drop_reason::duplicate); return true;
  case seq_verdict::out_of_window: drop(le, p, drop_reason::out_of_window); return true;
  case seq_verdict::accept:
  case seq_verdict::in_order: break;
  }
  const bool park = !m.header_done && m.result == outcome::ok && h.seq != 0;
  if (park && le.park_free == none) {
    drop(le, p, drop_reason::parking_full);
    return true;
  }
  tb.mark(idx, h.seq, end, v);
  le.ctr.packets_in.add(1);
  le.ctr.bytes_in.add(h.payload_len);
  const auto payload_off = static_cast<std::uint16_t>(ps.payload_offset);

  if (park) {
    const std::uint32_t n = le.park_free;
    parked& pk = le.parking[n];
    le.park_free = pk.next;
    pk = parked{p, static_cast<std::uint16_t>(ps.spin_offset), payload_off, h.payload_len, none};
    if (m.park_tail == none)
      m.park_head = n;
    else
      le.parking[m.park_tail].next = n;
    m.park_tail = n;
  } else if (!m.header_done && m.result == outcome::ok) {
    run_header(l, e, le, idx, h, p, payload_off, h.payload_len);
  } else {
    run_payload(l, e, le, idx, h, p, payload_off, h.payload_len);
  }
  check_done(l, e, le, idx);
  return true;
}

std::uint32_t runtime_core::take_inbox(lane& l, std::uint32_t max) noexcept {
  std::uint32_t n = 0;
  packet p;
  while (n < max && l.inbox->try_pop(p)) {
    handle(l, p, false);
    ++n;
  }
  return n;
}

std::uint32_t runtime_core::rx(lane& l, const packet* pkts, std::uint32_t n) noexcept {
  attach(l);
  if (lanes.size() > 1) take_inbox(l, static_cast<std::uint32_t>(l.inbox->capacity()));
  std::uint32_t i = 0;
  for (; i < n; ++i)
    if (!handle(l, pkts[i], true)) break;
  if (!l.steer_to.empty()) {
    if (cfg.wake != nullptr)
      for (std::uint32_t h : l.steer_to) cfg.wake(cfg.wake_user, h);
    l.steer_to.clear();
  }
  return i;
}

} // namespace spin::rt::detail
