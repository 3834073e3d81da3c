// The collective engine, the edge ring: reduce-scatter and result packets along the ring,
// acknowledgements and nacks (docs/collectives.md, "Edge ring").
// Part of spin/coll/engine.hpp, which declares engine<Red> and includes this file last.
#pragma once

namespace spin::coll::engine_detail {

template <class Red>
void engine<Red>::originate(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 pkt, bool again) {
  const u64 c = r.my_chunk();
  const u64 lo = r.g.packet_lo(c, pkt);
  const u32 n = static_cast<u32>(r.g.packet_len(c, pkt));
  const params& p = b->d.p;
  u8* el = ctx->scratchpad<u8>(0, max_packet_bytes);
  u8* acc = ctx->scratchpad<u8>(max_packet_bytes, max_packet_bytes);
  if (el == nullptr || acc == nullptr) return;
  if (ctx->dma_from_host(el, addr(b->d.in, r.g, c, lo, p.elem_bytes), u64{n} * p.elem_bytes) != errc::ok) {
    drop(s, dr_dma);
    return;
  }
  if (r.reduces()) {
    Red::dispatch(p.op, p.dtype, widen_fn{acc, el, n});
    send_acc(ctx, s, r.succ_of(s->me), k_rs, b->epoch, static_cast<u32>(pkt), n, acc, el, p);
    return;
  }
  // Allgather and broadcast: the origin holds its own block too.
  if (ctx->dma_to_host(addr(b->d.out, r.g, c, lo, p.elem_bytes), el, u64{n} * p.elem_bytes) != errc::ok) {
    drop(s, dr_dma);
    return;
  }
  if (set_bit(b->held, pkt)) {
    add(&b->results, 1);
    add(&b->progress, 1);
  }
  const u32 len = elem_len(p, el, n);
  if (r.multicast())
    send_to_rank(ctx, s, b->d.switch_rank, k_mcast, b->epoch, static_cast<u32>(pkt), n, el, len, p);
  else
    send(ctx, s, r.succ_of(s->me), k_ag, b->epoch, static_cast<u32>(pkt), n, el, len, p, again ? ring_again : 0);
}

template <class Red>
void engine<Red>::originate_next(spin::ctx* ctx, state* s, bank* b, const roles& r, u32 budget) {
  const u64 npk = r.my_chunk_packets();
  if (npk == 0) return;
  const u64 first = r.g.first_packet(r.my_chunk());
  for (u32 i = 0; i < budget; ++i) {
    const u64 k = add(&b->next_orig, 1);
    if (k >= npk) return;
    originate(ctx, s, b, r, first + k);
  }
}

template <class Red>
void engine<Red>::delivered(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 pkt) {
  if (!set_bit(b->acked, pkt)) return;
  add(&b->acks, 1);
  add(&b->progress, 1);
  originate_next(ctx, s, b, r, 1);
}

template <class Red>
bool engine<Red>::data_packet(spin::ctx* ctx, state* s, u32 from, bool acc, pin& pn, data_pkt& out) {
  if (ctx->msg.source_rank != from) return drop(s, dr_stranger), false;
  if (!data_bank(ctx, s, ctx->coll.epoch, pn)) return false;
  out.b = pn.b;
  out.r = roles::of(out.b, s->me);
  out.pkt = ctx->coll.aux;
  if (out.pkt >= out.r.g.total) return drop(s, dr_malformed), false;
  out.c = out.r.g.chunk_of(out.pkt);
  out.n = static_cast<u32>(out.r.g.packet_len(out.c, out.pkt));
  const params& p = out.b->d.p;
  if (ctx->coll.elem_count != out.n || ctx->coll.op != p.op || ctx->coll.dtype != p.dtype ||
      !wire_ok(ctx, p.op, p.dtype, acc, out.n, acc ? p.acc_bytes : p.elem_bytes))
    return drop(s, dr_malformed), false;
  return true;
}

template <class Red>
u32 engine<Red>::pred_rank(const state* s) { return s->members[s->me == 0 ? s->nranks - 1 : s->me - 1]; }

template <class Red>
ret engine<Red>::on_rs(spin::ctx* ctx, state* s) {
  pin pn;
  data_pkt d;
  if (!data_packet(ctx, s, pred_rank(s), true, pn, d)) return ret::drop;
  bank* b = d.b;
  const params& p = b->d.p;
  const roles& r = d.r;
  const u64 pkt = d.pkt, c = d.c;
  const u32 n = d.n;
  if (!r.reduces() || r.originator(c) == s->me) return drop(s, dr_malformed), ret::drop;
  const bool owner = r.owner(c) == s->me;
  // Once this rank's host heard it is done, its input may be reused: no fold through it can
  // matter any more (every owner already holds its results; docs/collectives.md, "Completion").
  if (!owner && load_acq(&b->done_posted) != 0) return drop(s, dr_stale), ret::drop;
  if (owner && test_bit(b->held, pkt)) {
    // The originator missed the acknowledgement (reduce-scatter); allreduce repairs the
    // result path with NACKs instead.
    if (r.kind == coll_kind::reduce_scatter) send_ctl(ctx, s, r.succ_of(s->me), k_ack, b->epoch, p, static_cast<u32>(pkt));
    return drop(s, dr_duplicate), ret::drop;
  }
  // A compact reduction's accumulators arrive packed: unpack them into the scratchpad.
  const bool packed = compact(p);
  u8* acc = packed ? ctx->scratchpad<u8>(max_packet_bytes, max_packet_bytes) : ctx->payload<u8>(0, u64{n} * p.acc_bytes);
  u8* el = ctx->scratchpad<u8>(0, max_packet_bytes);
  if (acc == nullptr || el == nullptr) return drop(s, dr_malformed), ret::drop;
  if (packed) Red::dispatch(p.op, p.dtype, unpack_fn{acc, ctx->payload<u8>(0, ctx->packet.size())});
  const u64 lo = r.g.packet_lo(c, pkt);
  if (ctx->dma_from_host(el, addr(b->d.in, r.g, c, lo, p.elem_bytes), u64{n} * p.elem_bytes) != errc::ok)
    return drop(s, dr_dma), ret::drop;
  Red::dispatch(p.op, p.dtype, fold_fn{acc, el, n});
  if (!owner) {
    send_acc(ctx, s, r.succ_of(s->me), k_rs, b->epoch, static_cast<u32>(pkt), n, acc, el, p);
    return ret::success;
  }
  // The owner: round once, keep the result, then pass it on (allreduce) or acknowledge it.
  Red::dispatch(p.op, p.dtype, narrow_fn{el, acc, n});
  const u32 len = elem_len(p, el, n);
  if (ctx->dma_to_host(addr(b->d.out, r.g, c, lo, p.elem_bytes), el, len) != errc::ok)
    return drop(s, dr_dma), ret::drop;
  if (!set_bit(b->held, pkt)) return drop(s, dr_duplicate), ret::drop;
  add(&b->results, 1);
  add(&b->progress, 1);
  if (r.kind == coll_kind::allreduce)
    send(ctx, s, r.succ_of(s->me), k_ag, b->epoch, static_cast<u32>(pkt), n, el, len, p);
  else
    send_ctl(ctx, s, r.succ_of(s->me), k_ack, b->epoch, p, static_cast<u32>(pkt));
  check_complete(ctx, s, b, r);
  return ret::success;
}

template <class Red>
ret engine<Red>::on_ag(spin::ctx* ctx, state* s) {
  pin pn;
  data_pkt d;
  if (!data_packet(ctx, s, pred_rank(s), false, pn, d)) return ret::drop;
  bank* b = d.b;
  const params& p = b->d.p;
  const roles& r = d.r;
  const u64 pkt = d.pkt, c = d.c;
  const u32 n = d.n;
  if (!r.gathers() || r.owner(c) == s->me) return drop(s, dr_malformed), ret::drop;
  const bool last = r.last(c) == s->me;
  const u32 len = static_cast<u32>(ctx->packet.size());  // checked by data_packet
  const u8* el = ctx->payload<u8>(0, len);
  if (el == nullptr) return drop(s, dr_malformed), ret::drop;
  if (test_bit(b->held, pkt)) {
    if (last && r.acks_results()) send_ctl(ctx, s, r.succ_of(s->me), k_ack, b->epoch, p, static_cast<u32>(pkt));
    else if (!last && (ctx->coll.slot & ring_again) != 0)
      send(ctx, s, r.succ_of(s->me), k_ag, b->epoch, static_cast<u32>(pkt), n, el, len, p, ring_again);
    return drop(s, dr_duplicate), ret::drop;
  }
  const u64 lo = r.g.packet_lo(c, pkt);
  // Data first, then the bit: a NACK served from the host copy never reads a half-written result.
  if (ctx->dma_to_host(addr(b->d.out, r.g, c, lo, p.elem_bytes), el, len) != errc::ok)
    return drop(s, dr_dma), ret::drop;
  if (!set_bit(b->held, pkt)) return drop(s, dr_duplicate), ret::drop;
  add(&b->results, 1);
  add(&b->progress, 1);
  if (r.multicast()) {
    // A repair from the predecessor (on_nack): the switch's copies did the spreading.
  } else if (!last) {
    // A new message id: ctx->forward would keep the sender's, which may collide with this
    // NIC's own ids at the next rank (its duplicate filter keys on source and id).
    send(ctx, s, r.succ_of(s->me), k_ag, b->epoch, static_cast<u32>(pkt), n, el, len, p);
  } else if (r.acks_results()) {
    send_ctl(ctx, s, r.succ_of(s->me), k_ack, b->epoch, p, static_cast<u32>(pkt));
  }
  // Allreduce: the originator of chunk c is the first rank of its result path.
  if (r.kind == coll_kind::allreduce && r.originator(c) == s->me) delivered(ctx, s, b, r, pkt);
  check_complete(ctx, s, b, r);
  return ret::success;
}

template <class Red>
ret engine<Red>::on_ack(spin::ctx* ctx, state* s) {
  pin pn;
  if (!data_bank(ctx, s, ctx->coll.epoch, pn)) return ret::drop;
  bank* b = pn.b;
  const roles r = roles::of(b, s->me);
  // host_ring transfers end at the successor; ring paths end at the predecessor.
  if (ctx->msg.source_rank != s->members[r.via_host ? r.succ_of(s->me) : r.pred_of(s->me)])
    return drop(s, dr_stranger), ret::drop;
  if (ctx->packet.size() != sizeof(ctl)) return drop(s, dr_malformed), ret::drop;
  if (r.via_host) return on_xfer_ack(ctx, s, b, r);
  const u64 pkt = ctx->coll.aux;
  if (r.kind == coll_kind::allreduce || pkt >= r.g.total || r.g.chunk_of(pkt) != r.my_chunk() ||
      ctx->packet.size() != sizeof(ctl))
    return drop(s, dr_malformed), ret::drop;
  delivered(ctx, s, b, r, pkt);
  check_complete(ctx, s, b, r);
  return ret::success;
}

template <class Red>
ret engine<Red>::on_nack(spin::ctx* ctx, state* s) {
  if (ctx->msg.source_rank != s->members[s->me + 1 == s->nranks ? 0 : s->me + 1])
    return drop(s, dr_stranger), ret::drop;
  bank* b = find(s, ctx->coll.epoch);
  pin pn;
  if (b == nullptr || !pn.enter(b, ctx->coll.epoch, ph_running)) return drop(s, dr_stale), ret::drop;
  // A late NACK after this rank's host heard it is done: its output may be reused, and the
  // successor holds everything (that was the condition).
  if (load_acq(&b->done_posted) != 0) return drop(s, dr_stale), ret::drop;
  const nack_head* h = ctx->payload<nack_head>(0);
  if (h == nullptr || h->nwords > nack_max_words || ctx->packet.size() != sizeof(nack_head) + u64{h->nwords} * 8 ||
      u64{h->first_word} + h->nwords > max_packets / 64)
    return drop(s, dr_malformed), ret::drop;
  const u64* theirs = ctx->payload<u64>(sizeof(nack_head), h->nwords);
  const params& p = b->d.p;
  const roles r = roles::of(b, s->me);
  u8* el = ctx->scratchpad<u8>(0, max_packet_bytes);
  if ((theirs == nullptr && h->nwords > 0) || el == nullptr || !r.gathers()) return drop(s, dr_malformed), ret::drop;
  const u32 requester = r.succ_of(s->me);
  u32 budget = 4 * b->d.window;
  for (u32 w = 0; w < h->nwords && budget > 0; ++w) {
    const u64 word = h->first_word + w;
    u64 want = load_acq(&b->held[word]) & ~theirs[w];
    while (want != 0 && budget > 0) {
      const u32 bit = static_cast<u32>(__builtin_ctzll(want));
      want &= want - 1;
      const u64 pkt = word * 64 + bit;
      if (pkt >= r.g.total) break;
      const u64 c = r.g.chunk_of(pkt);
      if (r.owner(c) == requester) continue;  // its own chunk: repaired by origination
      const u32 n = static_cast<u32>(r.g.packet_len(c, pkt));
      const u64 lo = r.g.packet_lo(c, pkt);
      if (ctx->dma_from_host(el, addr(b->d.out, r.g, c, lo, p.elem_bytes), u64{n} * p.elem_bytes) != errc::ok)
        return drop(s, dr_dma), ret::drop;
      if (send(ctx, s, requester, k_ag, b->epoch, static_cast<u32>(pkt), n, el, elem_len(p, el, n), p) != errc::ok)
        return ret::success;  // transmit queue full: the next tick asks again
      --budget;
    }
  }
  return ret::success;
}

} // namespace spin::coll::engine_detail
