// The collective engine, commands: what this NIC's host asks (set-up, start, xfer, stats) and the
// hello exchange (docs/collectives.md, "Commands").
// Part of spin/coll/engine.hpp, which declares engine<Red> and includes this file last.
#pragma once

namespace spin::coll::engine_detail {

template <class Red>
bool engine<Red>::valid_start(spin::ctx* ctx, state* s, const start_desc* d, u32& why) {
  u32 eb = 0, ab = 0;
  const bool known = Red::dispatch(d->p.op, d->p.dtype, size_fn{&eb, &ab});
  const coll_kind k = static_cast<coll_kind>(d->p.kind);
  const bool kind_ok = k == coll_kind::allreduce || k == coll_kind::reduce_scatter || k == coll_kind::allgather ||
                       k == coll_kind::broadcast;
  const bool reduces = k == coll_kind::allreduce || k == coll_kind::reduce_scatter;
  const bool via_switch = d->p.algo == static_cast<u8>(algo::switch_agg);
  why = se_params;
  if (via_switch && (k == coll_kind::reduce_scatter || d->p.slots == 0 || d->p.slots > max_switch_slots)) return false;
  const bool via_host = d->p.algo == static_cast<u8>(algo::host_ring);
  if (via_host && k != coll_kind::allreduce) return false;
  if (!via_switch && !via_host && d->p.algo != static_cast<u8>(algo::edge_ring)) return false;
  if (!kind_ok || (reduces && (!known || eb != d->p.elem_bytes || ab != d->p.acc_bytes)) || d->p.elem_bytes == 0 ||
      d->p.nranks != s->nranks || d->p.pkt_elems == 0 || d->p.root >= d->p.nranks ||
      u64{d->p.pkt_elems} * (via_switch || d->p.elem_bytes > d->p.acc_bytes ? d->p.elem_bytes : d->p.acc_bytes) >
          max_packet_bytes ||
      d->window == 0 || d->window > max_window || d->p.count > d->p.total_count || d->p.count > (1ull << 40))
    return false;
  const u32 chunks = k == coll_kind::broadcast ? 1 : d->p.nranks;
  const ring_geom g = ring_geom::make(d->p.count, chunks, d->p.pkt_elems);
  if (g.total > max_packets) return false;
  why = se_window;
  const buffer_desc recv{d->recv_off, 0, 0, 0};
  return buffer_fits(d->in, g, chunks, d->p.elem_bytes, ctx->host_window_len_bytes) &&
         buffer_fits(d->out, g, chunks, d->p.elem_bytes, ctx->host_window_len_bytes) &&
         (!via_host || buffer_fits(recv, g, chunks, d->p.acc_bytes, ctx->host_window_len_bytes));
}

template <class Red>
bool engine<Red>::authentic(spin::ctx* ctx, const cmd* c) {
  // DMA lands in the invocation's own memory: the command's scratchpad, used after this.
  cmd_key* key = ctx->scratchpad<cmd_key>(0);
  if (key == nullptr || ctx->dma_from_host(key, cmd_key_off, sizeof(cmd_key)) != errc::ok) return false;
  const u64 k0 = key->k0, k1 = key->k1;
  if ((k0 | k1) == 0) return false;
  return siphash24(k0, k1, reinterpret_cast<const u8*>(c), cmd_mac_bytes) == c->mac;
}

template <class Red>
ret engine<Red>::on_cmd(spin::ctx* ctx, state* s) {
  const cmd* c = ctx->payload<cmd>(0);
  if (c == nullptr || ctx->packet.size() != sizeof(cmd)) return drop(s, dr_malformed), ret::drop;
  if (!authentic(ctx, c)) return drop(s, dr_forged), ret::drop;
  if (c->type == cmd_setup) {
    // Once only: afterwards commands must come from this rank's own address.
    if (load_acq(&s->nranks) != 0) return drop(s, dr_stranger), ret::drop;
    u32 ok = c->nranks >= 1 && c->nranks <= max_ranks && c->me < c->nranks ? 1 : 0;
    if (ok && ctx->dma_from_host(s->members, c->desc_off, u64{c->nranks} * sizeof(u32)) != errc::ok) ok = 0;
    if (ok) {
      s->me = c->me;
      s->comm_id = comm_of(ctx->msg.match_bits);
      __atomic_store_n(&s->nranks, c->nranks, __ATOMIC_RELEASE);
    }
    ctx->post_event(event(ev_setup, 0, ok ? 0 : 1));
    return ret::success;
  }
  if (c->type == cmd_switch_setup) {
    if (load_acq(&s->nranks) != 0) return drop(s, dr_stranger), ret::drop;
    switch_setup* w = ctx->scratchpad<switch_setup>(0);
    u32 ok = w != nullptr && ctx->dma_from_host(w, c->desc_off, sizeof(switch_setup)) == errc::ok ? 1 : 0;
    ok = ok && w->nranks >= 1 && w->nranks <= max_ranks && w->slots >= 1 && w->slots <= max_switch_slots &&
         w->slot_bytes >= 8 && w->slot_bytes <= max_packet_bytes && w->slot_bytes % 8 == 0 &&
         (w->role == switch_root || w->role == switch_leaf) && w->nleaves <= max_leaves &&
         (w->role == switch_root || w->nleaves == 0);
    // Contributions come from members or from leaves: room for the larger count.
    const u32 inputs = ok && w->nleaves > w->nranks ? w->nleaves : (ok ? w->nranks : 0);
    const u64 stride = ok ? slot_stride_bytes(inputs, w->slot_bytes) : 0;
    ok = ok && slots_offset() + u64{w->slots} * 2 * stride <= ctx->handler_mem.len_bytes &&
         ctx->dma_from_host(s->members, c->desc_off + sizeof(switch_setup), u64{w->nranks} * sizeof(u32)) == errc::ok &&
         (w->nleaves == 0 || ctx->dma_from_host(s->leaves, c->desc_off + sizeof(switch_setup) + u64{w->nranks} * sizeof(u32),
                                                u64{w->nleaves} * sizeof(u32)) == errc::ok);
    if (ok) {
      s->role = w->role == switch_leaf ? role_leaf : role_switch;
      s->parent = w->parent;
      s->nleaves = w->nleaves;
      s->me = 0;
      s->comm_id = comm_of(ctx->msg.match_bits);
      s->slots = w->slots;
      s->slot_bytes = w->slot_bytes;
      s->slot_stride = stride;
      __atomic_store_n(&s->nranks, w->nranks, __ATOMIC_RELEASE);
    }
    ctx->post_event(event(ev_setup, 0, ok ? 0 : 1));
    return ret::success;
  }
  if (load_acq(&s->nranks) == 0) return drop(s, dr_stranger), ret::drop;
  if (s->role != role_member) {
    // A switch's control plane only reads its counters.
    if (c->type != cmd_stats) return drop(s, dr_malformed), ret::drop;
  } else if (ctx->msg.source_rank != s->members[s->me]) {
    return drop(s, dr_stranger), ret::drop;
  }
  if (c->type == cmd_repair) {
    bank* b = find(s, c->epoch);
    pin pn;
    if (b == nullptr || !pn.enter(b, c->epoch, 0) || b->d.recovery == 0) return ret::success;
    const u64 now = load_acq(&b->progress);
    if (now != b->progress_seen) {
      b->progress_seen = now;  // something moved since the last tick: wait
      return ret::success;
    }
    // No event: the host learns it from ev_done (an event per repair would wake the waiting
    // rank for nothing; with hundreds of ranks on two cores those wake-ups alone stall the NICs).
    // Through a switch the probe's answer sets it, and only when a contribution was missing
    // (hello requests the same tick may send do not count: they cost one small packet each,
    // and a lost hello is rare).
    const roles r = roles::of(b, s->me);
    if (!(load_acq(&b->phase) == ph_running && r.via_switch && !r.multicast())) store_rel(&b->repaired, 1);
    repair(ctx, s, b);
    return ret::success;
  }
  if (c->type == cmd_xfer) return on_xfer_cmd(ctx, s, c);
  if (c->type == cmd_stats) {
    engine_counters* k = ctx->scratchpad<engine_counters>(0);
    if (k == nullptr) return ret::drop;
    for (u32 i = 0; i < 8; ++i) k->drops[i] = i < dr_count ? load_acq(&s->drops[i]) : 0;
    for (u32 i = 0; i < kind_count; ++i) k->sent[i] = load_acq(&s->sent[i]);
    if (ctx->dma_to_host(c->desc_off, k, sizeof(engine_counters)) != errc::ok) return drop(s, dr_dma), ret::drop;
    ctx->post_event(event(ev_stats, 0, 0));
    return ret::success;
  }
  if (c->type != cmd_start) return drop(s, dr_malformed), ret::drop;
  bank* b = claim(ctx, s, c->epoch);
  if (b == nullptr) return drop(s, dr_stale), ret::drop;
  start_desc* d = ctx->scratchpad<start_desc>(0);
  if (d == nullptr || ctx->dma_from_host(d, c->desc_off, sizeof(start_desc)) != errc::ok) {
    ctx->post_event(event(ev_error, c->epoch, se_desc));
    return ret::success;
  }
  u32 why = 0;
  if (!valid_start(ctx, s, d, why)) {
    ctx->post_event(event(ev_error, c->epoch, why));
    return ret::success;
  }
  const u64 lk = offset_of_lock(s, b);
  if (ctx->lock(lk) != errc::ok) return ret::drop;
  const bool fresh = b->phase == ph_idle;
  if (fresh) {
    b->d = *d;
    b->hellos[s->me] = d->p;
    set_bit(b->hello_bits, s->me);
    store_rel(&b->phase, ph_started);
  }
  ctx->unlock(lk);
  if (!fresh) return drop(s, dr_stale), ret::drop;
  add(&b->progress, 1);
  for (u32 i = 0; i < s->nranks; ++i)
    if (i != s->me) send_hello(ctx, s, b, i);
  if (starts_early(s, roles::of(b, s->me))) run(ctx, s, b);
  verdict(ctx, s, b);
  return ret::success;
}

template <class Red>
ret engine<Red>::on_hello(spin::ctx* ctx, state* s) {
  const hello* h = ctx->payload<hello>(0);
  const u32 n = load_acq(&s->nranks);
  if (h == nullptr || ctx->packet.size() != sizeof(hello) || n == 0 || h->sender >= n || h->sender == s->me)
    return drop(s, dr_malformed), ret::drop;
  if (ctx->msg.source_rank != s->members[h->sender]) return drop(s, dr_stranger), ret::drop;
  bank* b = claim(ctx, s, ctx->coll.epoch);
  if (b == nullptr) return drop(s, dr_stale), ret::drop;
  b->hellos[h->sender] = h->p;  // before the bit: verdict reads hellos after seeing it
  if (set_bit(b->hello_bits, h->sender)) add(&b->progress, 1);
  verdict(ctx, s, b);
  return ret::success;
}

template <class Red>
ret engine<Red>::on_ctl(spin::ctx* ctx, state* s, u32 kind) {
  const ctl* c = ctx->payload<ctl>(0);
  const u32 n = load_acq(&s->nranks);
  if (c == nullptr || ctx->packet.size() != sizeof(ctl) || n == 0 || c->sender >= n)
    return drop(s, dr_malformed), ret::drop;
  if (ctx->msg.source_rank != s->members[c->sender]) return drop(s, dr_stranger), ret::drop;
  bank* b = find(s, ctx->coll.epoch);
  pin pn;
  if (b == nullptr || !pn.enter(b, ctx->coll.epoch, 0)) return drop(s, dr_stale), ret::drop;
  const roles r = roles::of(b, s->me);
  if (kind == k_hello_req) {
    send_hello(ctx, s, b, c->sender);
  } else if (kind == k_done) {
    if (r.kind == coll_kind::reduce_scatter) {
      if (set_bit(b->done_bits, c->sender)) add(&b->progress, 1);
    } else {
      if (c->sender != r.succ_of(s->me)) return drop(s, dr_stranger), ret::drop;
      if (swap(&b->succ_complete, 1) == 0) add(&b->progress, 1);
    }
    post_done_if_ready(ctx, s, b, r);
  } else {  // k_done_req
    if (load_acq(&b->complete) != 0) send_ctl(ctx, s, c->sender, k_done, b->epoch, b->d.p, s->me);
  }
  return ret::success;
}

} // namespace spin::coll::engine_detail
