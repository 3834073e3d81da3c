// The handler API: the functions behind spin::api_table that native handlers call through
// their context and eBPF handlers through the bridge (bpf_engine.cpp). They run on the thread
// driving the HPU, inside a handler invocation.
#include "core.hpp"

#include <atomic>
#include <cstring>

namespace spin::rt::detail {

namespace {

invocation& inv_of(spin::ctx* c) { return *static_cast<invocation*>(c->rt); }

// Marks the HPU as inside the runtime for the duration of an API call: the preemption signal
// never cuts a runtime function in half; an abort requested meanwhile is honoured on exit.
class api_guard {
public:
  explicit api_guard(invocation& i) : _h(*i.l) { _h.in_api = 1; }
  ~api_guard() {
    _h.in_api = 0;
    if (_h.in_handler && abort_requested(&_h)) siglongjmp(_h.jb, 1);
  }
  api_guard(const api_guard&) = delete;
  api_guard& operator=(const api_guard&) = delete;

private:
  lane& _h;
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

// Virtual time: tells the observer what the running invocation does, and after how many of its
// instructions (runtime_config::observer).
void report(invocation& i, action_kind k, std::uint64_t bytes, std::uint32_t copies = 1, std::uint64_t dma_id = 0) {
  if (invocation_observer* ob = i.rt->cfg.observer; ob != nullptr)
    ob->action(action_info{k, i.counter != nullptr ? *i.counter - i.count0 : 0, bytes, copies, dma_id});
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
  report(i, to_host ? action_kind::dma_to_host : action_kind::dma_from_host, len, 1,
         h == nullptr ? 0 : (std::uint64_t{i.dma[slot].gen + 1} << 16) | slot);
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
  report(i, action_kind::dma_wait, 0, 1, h.id);
  while (d->done_tick != 0 && ticks() < d->done_tick) {
    api_guard g(i);  // lets an over-budget wait be aborted
    cpu_relax();
  }
  d->live = false;
  return 0;
}

// Checks a send descriptor and builds the spin header of the packet it describes. Errors as
// ctx::send's. `data_checked`: the runtime built `d` around the received packet itself
// (forward), whose payload need not lie in the handler's view of it.
errc send_header(invocation& i, const send_desc* d, wire::header& h, bool data_checked = false) {
  // A handler built before send_desc::coll existed passes the older, smaller size.
  if (d == nullptr || d->size_bytes < offsetof(send_desc, coll)) return errc::invalid_argument;
  const bool coll = (d->flags & msg_coll) != 0;
  if (coll && d->size_bytes < sizeof(send_desc)) return errc::invalid_argument;
  if (!data_checked && !local_ok(i, d->data, d->len_bytes)) return errc::out_of_bounds;
  if (d->offset_bytes > d->message_len_bytes || d->len_bytes > d->message_len_bytes - d->offset_bytes ||
      ((d->flags & msg_start) != 0 && d->packet_index != 0) ||
      ((d->flags & msg_end) != 0 && d->offset_bytes + d->len_bytes != d->message_len_bytes) ||
      (d->flags & ~static_cast<std::uint32_t>(msg_start | msg_end | msg_retransmit | msg_coll)) != 0)
    return errc::invalid_argument;
  h = wire::header{};
  h.type = wire::packet_type::data;
  h.flags = wire::wire_flags_of(d->flags);  // the same bits (wire::flag)
  if (coll)
    h.coll = wire::coll_ext{d->coll.op, d->coll.dtype, d->coll.slot, d->coll.elem_count, d->coll.epoch, d->coll.aux};
  h.source_rank = i.rt->cfg.rank;
  h.match_bits = d->match_bits;
  h.message_id = d->message_id;
  h.seq = d->packet_index;
  h.payload_len = d->len_bytes;
  h.message_len = d->message_len_bytes;
  h.offset = d->offset_bytes;
  // An EC with a frame key signs what its handlers send; the tag does not cover message_id, so
  // every copy of a multicast (ids h.message_id + i) carries this one.
  if (!i.e->key.none()) {
    h.flags = static_cast<std::uint16_t>(h.flags | wire::flag_auth);
    h.auth_tag = wire::auth_tag(i.e->key, h, std::span<const std::byte>(static_cast<const std::byte*>(d->data), d->len_bytes));
  }
  return errc::ok;
}

std::int32_t api_send(spin::ctx* c, const send_desc* d) {
  invocation& i = inv_of(c);
  api_guard g(i);
  wire::header h;
  if (const errc e = send_header(i, d, h); e != errc::ok) return err(i, e);
  transmitter* tx = i.rt->cfg.tx;
  if (tx == nullptr) {
    i.t->send_failed.add(1);
    return err(i, errc::not_supported);
  }
  if (d->len_bytes > tx->max_payload_bytes()) return err(i, errc::out_of_bounds);
  report(i, action_kind::send, d->len_bytes);
  const errc r = tx->send(i.l->index, d->dest_rank, h,
                          std::span<const std::byte>(static_cast<const std::byte*>(d->data), d->len_bytes));
  if (r != errc::ok) {
    i.t->send_failed.add(1);
    return err(i, r);
  }
  i.t->sends.add(1);
  i.t->send_bytes.add(d->len_bytes);
  return 0;
}

std::int32_t api_multicast(spin::ctx* c, const send_desc* d, const std::uint32_t* dests, std::uint32_t count) {
  invocation& i = inv_of(c);
  api_guard g(i);
  if (count == 0 || count > max_multicast) return err(i, errc::invalid_argument);
  if (!local_ok(i, dests, std::uint64_t{count} * sizeof(std::uint32_t))) return err(i, errc::out_of_bounds);
  wire::header h;
  if (const errc e = send_header(i, d, h); e != errc::ok) return err(i, e);
  transmitter* tx = i.rt->cfg.tx;
  if (tx == nullptr) {
    i.t->send_failed.add(count);
    return err(i, errc::not_supported);
  }
  if (d->len_bytes > tx->max_payload_bytes()) return err(i, errc::out_of_bounds);
  errc last = errc::ok;
  report(i, action_kind::multicast, d->len_bytes, count);
  const std::uint32_t sent = tx->multicast(i.l->index, std::span<const std::uint32_t>(dests, count), h,
                                           std::span<const std::byte>(static_cast<const std::byte*>(d->data), d->len_bytes), last);
  i.t->sends.add(sent);
  i.t->send_bytes.add(std::uint64_t{sent} * d->len_bytes);
  if (sent < count) i.t->send_failed.add(count - sent);
  return static_cast<std::int32_t>(sent);
}

// The received packet, unchanged, to `dest_rank`: its own buffer where the transmitter can send
// it (transmitter::forward), its payload as the frame holds it (on eBPF the bridge has written the
// program's changes back first).
std::int32_t api_forward(spin::ctx* c, std::uint32_t dest_rank) {
  invocation& i = inv_of(c);
  api_guard g(i);
  send_desc d = c->forward_desc(dest_rank);
  d.data = i.payload;  // the frame: on eBPF c->packet is the program's bounce buffer
  d.len_bytes = i.payload_len;
  wire::header h;
  if (const errc e = send_header(i, &d, h, true); e != errc::ok) return err(i, e);
  transmitter* tx = i.rt->cfg.tx;
  if (tx == nullptr) {
    i.t->send_failed.add(1);
    return err(i, errc::not_supported);
  }
  if (d.len_bytes > tx->max_payload_bytes()) return err(i, errc::out_of_bounds);
  const std::span<const std::byte> payload(i.payload, i.payload_len);
  report(i, action_kind::forward, d.len_bytes);
  const errc r = i.pkt != nullptr && i.payload_len > 0 ? tx->forward(i.l->index, dest_rank, h, i.pkt->cookie, payload)
                                                       : tx->send(i.l->index, dest_rank, h, payload);
  if (r != errc::ok) {
    i.t->send_failed.add(1);
    return err(i, r);
  }
  i.t->sends.add(1);
  i.t->send_bytes.add(d.len_bytes);
  if (i.pkt != nullptr) i.forwarded = true;
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
  report(i, action_kind::post_event, sizeof(ev.value));
  if (!i.e->events->post(ev)) {
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
  lane& h = *i.l;
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

bool packet_forwarded(const spin::ctx* c) noexcept {
  return static_cast<const invocation*>(c->rt)->forwarded;
}

void fill_api(api_table& api) noexcept {
  api.size_bytes = sizeof(api_table);
  api.abi_version = spin::abi_version;
  api.dma_to_host = api_dma_to_host;
  api.dma_from_host = api_dma_from_host;
  api.dma_test = api_dma_test;
  api.dma_wait = api_dma_wait;
  api.send = api_send;
  api.post_event = api_post_event;
  api.lock = api_lock;
  api.unlock = api_unlock;
  api.multicast = api_multicast;
  api.forward = api_forward;
}

} // namespace spin::rt::detail
