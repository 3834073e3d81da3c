// The collective engine, epochs: sending, banks, the hello verdict, start and completion
// (docs/collectives.md, "Protocol": epochs, completion).
// Part of spin/coll/engine.hpp, which declares engine<Red> and includes this file last.
#pragma once

namespace spin::coll::engine_detail {

template <class Red>
errc engine<Red>::send(spin::ctx* ctx, state* s, u32 to, u32 kind, u32 epoch, u32 aux, u32 elems,
    const void* data, u32 len, const params& p, u16 slot) {
  return send_to_rank(ctx, s, s->members[to], kind, epoch, aux, elems, data, len, p, slot);
}

template <class Red>
send_desc engine<Red>::engine_desc(const state* s, u32 kind, u32 epoch, u32 aux, u32 elems, const void* data,
    u32 len, const params& p, u16 slot) {
  send_desc d{};
  d.size_bytes = sizeof(send_desc);
  d.match_bits = match_bits(s->comm_id, kind);
  d.offset_bytes = 0;
  d.message_len_bytes = len;
  d.data = data;
  d.len_bytes = len;
  d.flags = msg_start | msg_end | msg_coll;
  d.coll = coll_desc{p.op, p.dtype, slot, elems, epoch, aux};
  return d;
}

template <class Red>
errc engine<Red>::send_to_rank(spin::ctx* ctx, state* s, u32 dest, u32 kind, u32 epoch, u32 aux, u32 elems,
    const void* data, u32 len, const params& p, u16 slot) {
  send_desc d = engine_desc(s, kind, epoch, aux, elems, data, len, p, slot);
  d.dest_rank = dest;
  return send_built(ctx, s, d, kind);
}

template <class Red>
errc engine<Red>::send_built(spin::ctx* ctx, state* s, send_desc& d, u32 kind) {
  d.message_id = add(&s->send_seq, 1);
  const errc e = ctx->send(d);
  if (e != errc::ok) drop(s, dr_send);
  else add(&s->sent[kind % kind_count], 1);
  return e;
}

template <class Red>
void engine<Red>::send_all(spin::ctx* ctx, state* s, const u32* to, u32 count, u32 kind, u32 epoch, u32 aux,
    u32 elems, const void* data, u32 len, const params& p, u16 slot) {
  send_desc d = engine_desc(s, kind, epoch, aux, elems, data, len, p, slot);
  d.message_id = add(&s->send_seq, count);  // one id per copy: message_id .. + count - 1
  const i32 sent = ctx->multicast(d, to, count);
  if (sent > 0) add(&s->sent[kind % kind_count], static_cast<u64>(sent));
  for (u32 i = sent > 0 ? static_cast<u32>(sent) : 0; i < count; ++i) drop(s, dr_send);
}

template <class Red>
void engine<Red>::send_ctl(spin::ctx* ctx, state* s, u32 to, u32 kind, u32 epoch, const params& p, u32 aux,
    u16 slot) {
  ctl* c = ctx->scratchpad<ctl>(max_packet_bytes - sizeof(ctl));
  if (c == nullptr) return;
  c->sender = s->me;
  c->reserved = 0;
  send(ctx, s, to, kind, epoch, aux, 0, c, sizeof(ctl), p, slot);
}

template <class Red>
void engine<Red>::send_hello(spin::ctx* ctx, state* s, bank* b, u32 to) {
  hello* h = ctx->scratchpad<hello>(0);
  if (h == nullptr) return;
  h->sender = s->me;
  h->reserved = 0;
  h->p = b->d.p;
  send(ctx, s, to, k_hello, b->epoch, s->me, 0, h, sizeof(hello), b->d.p);
}

template <class Red>
bank* engine<Red>::claim(spin::ctx* ctx, state* s, u32 epoch) {
  bank* b = &s->banks[epoch & 1];
  if (load_acq(&b->epoch) == epoch && load_acq(&b->phase) != ph_idle) return b;
  const u64 lk = offset_of_lock(s, b);
  if (ctx->lock(lk) != errc::ok) return nullptr;
  bank* r = b;
  if (b->epoch != epoch) {
    if (epoch_newer(epoch, b->epoch) || b->phase == ph_idle) {
      // Close the bank to handlers of the old epoch, wait for those inside, then clear
      // everything after the lock and active words up to the start's buffers (their contents
      // are written before they are read; clearing them would cost 4096 counted stores).
      store_rel(&b->phase, ph_idle);
      while (load_acq(&b->active) != 0) {
      }
      u8* first = reinterpret_cast<u8*>(&b->epoch);
      const u64 n = __builtin_offsetof(bank, burst) - 2 * sizeof(u64);
      __builtin_memset(first, 0, n);  // a word loop on an HPU, not a byte loop
      __atomic_store_n(&b->epoch, epoch, __ATOMIC_RELEASE);
    } else {
      r = nullptr;
    }
  }
  ctx->unlock(lk);
  return r;
}

template <class Red>
bank* engine<Red>::find(state* s, u32 epoch) {
  bank* b = &s->banks[epoch & 1];
  return load_acq(&b->epoch) == epoch ? b : nullptr;
}

template <class Red>
bool engine<Red>::all_bits(const u64* words, u32 n) {
  for (u32 w = 0; w < max_ranks / 64; ++w) {
    const u64 lo = u64{w} * 64;
    if (lo >= n) break;
    const u64 want = n - lo >= 64 ? ~0ull : (1ull << (n - lo)) - 1;
    if ((load_acq(&words[w]) & want) != want) return false;
  }
  return true;
}

template <class Red>
void engine<Red>::post_done_if_ready(spin::ctx* ctx, state* s, bank* b, const roles& r) {
  if (load_sc(&b->complete) == 0) return;
  // switch_agg: the switch serves repairs from its slots, never from this rank's memory; the
  // data went up before the verdict (see cmd_start), so the verdict must be in.
  const bool ready = r.via_switch && !r.multicast() ? load_sc(&b->agreed) != 0
                     : r.kind == coll_kind::reduce_scatter ? all_bits(b->done_bits, s->nranks)
                                                           : load_acq(&b->succ_complete) != 0;
  if (!ready || swap(&b->done_posted, 1) != 0) return;
  if (r.via_switch && !r.multicast()) advance_parity(s, r.g.total, r.slots);  // before the host may start the next call
  // The packets this rank originated: the host divides the epoch's time by its windows of
  // them for a round-trip sample (docs/collectives.md, "Repair timer").
  const u64 mine = r.via_switch && !r.multicast() ? r.g.total : r.my_chunk_packets();
  u64 sent = load_acq(&b->next_orig);
  if (sent > mine) sent = mine;
  ctx->post_event(event(ev_done, b->epoch, done_detail(load_acq(&b->repaired) != 0, sent)));
}

template <class Red>
void engine<Red>::check_complete(spin::ctx* ctx, state* s, bank* b, const roles& r) {
  if (load_acq(&b->results) < r.results_needed() || load_acq(&b->acks) < r.my_chunk_packets()) return;
  if (swap_sc(&b->complete, 1) != 0) return;
  add(&b->progress, 1);
  if (r.via_switch && !r.multicast()) {
    // nothing to tell: see post_done_if_ready
  } else if (r.kind == coll_kind::reduce_scatter) {
    set_bit(b->done_bits, s->me);
    for (u32 i = 0; i < s->nranks; ++i)
      if (i != s->me) send_ctl(ctx, s, i, k_done, b->epoch, b->d.p, s->me);
  } else {
    send_ctl(ctx, s, r.pred_of(s->me), k_done, b->epoch, b->d.p, s->me);
  }
  post_done_if_ready(ctx, s, b, r);
}

template <class Red>
void engine<Red>::run(spin::ctx* ctx, state* s, bank* b) {
  const u64 lk = offset_of_lock(s, b);
  if (ctx->lock(lk) != errc::ok) return;
  const bool go = b->phase == ph_started;
  if (go) store_rel(&b->phase, ph_running);
  ctx->unlock(lk);
  if (!go) return;
  add(&b->progress, 1);
  const roles r = roles::of(b, s->me);
  if (r.via_host) {
    ctx->post_event(event(ev_go, b->epoch, 0));  // the host drives every step
    return;
  }
  if (r.via_switch && !r.multicast()) {
    // One packet per slot: the first `slots` packets go at once (SwitchML's worker start).
    originate_up_burst(ctx, s, b, r);
  } else {
    originate_next(ctx, s, b, r, b->d.window);
  }
  check_complete(ctx, s, b, r);
}

template <class Red>
params engine<Red>::h_params(spin::ctx* ctx) {
  params p{};
  p.op = ctx->coll.op;
  p.dtype = ctx->coll.dtype;
  return p;
}

template <class Red>
bool engine<Red>::starts_early(const state* s, const roles& r) {
  return r.via_switch && !r.multicast() && load_acq(&s->agreed_once) != 0;
}

template <class Red>
void engine<Red>::verdict(spin::ctx* ctx, state* s, bank* b) {
  const u32 ph = load_acq(&b->phase);
  if ((ph != ph_started && ph != ph_running) || !all_bits(b->hello_bits, s->nranks) || load_acq(&b->agreed) != 0) return;
  for (u32 i = 1; i < s->nranks; ++i) {
    const field f = first_difference(b->hellos[0], b->hellos[i]);
    if (f != field::none) {
      const u64 lk = offset_of_lock(s, b);
      if (ctx->lock(lk) != errc::ok) return;
      const bool first = b->phase == ph_started || b->phase == ph_running;
      if (first) store_rel(&b->phase, ph_failed);
      ctx->unlock(lk);
      if (first) ctx->post_event(event(ev_mismatch, b->epoch, (static_cast<u32>(f) << 16) | i));
      return;
    }
  }
  if (swap_sc(&b->agreed, 1) != 0) return;
  store_rel(&s->agreed_once, 1);
  add(&b->progress, 1);
  if (ph == ph_started) run(ctx, s, b);
  // Started early, or run by another handler since `ph` was read: completion may have come
  // first and waited for this.
  pin pn;
  if (!pn.enter(b, b->epoch, ph_running)) return;
  post_done_if_ready(ctx, s, b, roles::of(b, s->me));
}

template <class Red>
bool engine<Red>::data_bank(spin::ctx* ctx, state* s, u32 epoch, pin& pn) {
  bank* b = find(s, epoch);
  if (b == nullptr) {
    drop(s, dr_stale);
    return false;
  }
  // A peer sends data only after it saw every hello agree, so data proves the verdict.
  if (load_acq(&b->phase) == ph_started) run(ctx, s, b);  // before the pin: run takes the lock
  if (!pn.enter(b, epoch, ph_running)) {
    drop(s, load_acq(&b->phase) == ph_idle ? dr_early : dr_stale);
    return false;
  }
  return true;
}

} // namespace spin::coll::engine_detail
