// The collective engine, switch aggregation, worker side: contributions up to the switch, results
// down (docs/collectives.md, "Switch aggregation"; SwitchML, NSDI 2021).
// Part of spin/coll/engine.hpp, which declares engine<Red> and includes this file last.
#pragma once

namespace spin::coll::engine_detail {

template <class Red>
void engine<Red>::originate_up(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 j) {
  const u64 c = r.g.chunk_of(j);
  const u32 n = static_cast<u32>(r.g.packet_len(c, j));
  const params& p = b->d.p;
  u8* el = ctx->scratchpad<u8>(0, max_packet_bytes);
  if (el == nullptr) return;
  if (ctx->dma_from_host(el, addr(b->d.in, r.g, c, r.g.packet_lo(c, j), p.elem_bytes), u64{n} * p.elem_bytes) != errc::ok) {
    drop(s, dr_dma);
    return;
  }
  send_desc d;
  send_up(ctx, s, b, r, j, el, d);
}

template <class Red>
void engine<Red>::originate_up_burst(spin::ctx* ctx, state* s, bank* b, const roles& r) {
  const u64 count = r.g.total < r.slots ? r.g.total : u64{r.slots};
  // Step j sends packet j - burst_bufs (its read issued burst_bufs steps earlier) and reads
  // packet j into the buffer that packet just left. A packet whose read failed is counted
  // (dr_dma) and not sent, as in originate_up.
  b->burst_ok = 0;
  for (u64 j = 0; j < count + burst_bufs; ++j) {
    const u32 i = static_cast<u32>(spin::rem(j, u64{burst_bufs}));
    if (j >= burst_bufs && (b->burst_ok >> i & 1u) != 0) {
      if (ctx->dma_wait(b->burst_dma[i]) == errc::ok) send_up(ctx, s, b, r, j - burst_bufs, b->burst[i], b->burst_desc);
      else drop(s, dr_dma);
    }
    if (j >= count) continue;
    const u64 c = r.g.chunk_of(j);
    if (ctx->dma_from_host_nb(b->burst[i], addr(b->d.in, r.g, c, r.g.packet_lo(c, j), b->d.p.elem_bytes),
                              r.g.packet_len(c, j) * b->d.p.elem_bytes, b->burst_dma[i]) == errc::ok) {
      b->burst_ok |= 1u << i;
    } else {
      b->burst_ok &= ~(1u << i);
      drop(s, dr_dma);
    }
  }
}

template <class Red>
void engine<Red>::send_up(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 j, u8* el, send_desc& d) {
  const u64 c = r.g.chunk_of(j);
  const u32 n = static_cast<u32>(r.g.packet_len(c, j));
  const params& p = b->d.p;
  const u32 slot = static_cast<u32>(spin::rem(j, u64{r.slots})), shadow = shadow_of(s, r, j);
  d = engine_desc(s, k_up, b->epoch, switch_aux(c, j), n, el, elem_len(p, el, n), p, switch_slot(slot, shadow));
  d.dest_rank = b->d.switch_rank;
  send_built(ctx, s, d, k_up);
  // The highest packet sent so far bounds what repair resends.
  u64 hi = load_acq(&b->next_orig);
  while (hi < j + 1 && !__atomic_compare_exchange_n(&b->next_orig, &hi, j + 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
  }
}

template <class Red>
u32 engine<Red>::shadow_of(const state* s, const roles& r, u64 j) {
  const u64 x = spin::rem(j, u64{r.slots});
  return static_cast<u32>((spin::div(j, u64{r.slots}) & 1) ^ (test_bit(s->slot_parity, x) ? 1u : 0u));
}

template <class Red>
void engine<Red>::advance_parity(state* s, u64 total, u32 slots) {
  const u64 full = spin::div(total, u64{slots}), rest = spin::rem(total, u64{slots});
  auto flip = [s](u64 n) {  // bits [0, n)
    for (u64 w = 0; w * 64 < n; ++w) {
      const u64 left = n - w * 64;
      __atomic_fetch_xor(&s->slot_parity[w], left >= 64 ? ~0ull : (1ull << left) - 1, __ATOMIC_ACQ_REL);
    }
  };
  if (full & 1) flip(slots);
  flip(rest);
}

template <class Red>
ret engine<Red>::on_down(spin::ctx* ctx, state* s) {
  pin pn;
  if (!data_bank(ctx, s, ctx->coll.epoch, pn)) return ret::drop;
  bank* b = pn.b;
  const params& p = b->d.p;
  const roles r = roles::of(b, s->me);
  if (!r.via_switch || ctx->msg.source_rank != b->d.switch_rank) return drop(s, dr_stranger), ret::drop;
  const u64 j = ctx->coll.aux & 0xffffu, c = ctx->coll.aux >> 16;
  if (j >= r.g.total || r.g.chunk_of(j) != c) return drop(s, dr_malformed), ret::drop;
  const u32 n = static_cast<u32>(r.g.packet_len(c, j));
  if (ctx->coll.elem_count != n || ctx->coll.op != p.op || ctx->coll.dtype != p.dtype || !wire_ok(ctx, p.op, p.dtype, false, n, p.elem_bytes))
    return drop(s, dr_malformed), ret::drop;
  if (test_bit(b->held, j)) return drop(s, dr_duplicate), ret::drop;
  const u32 len = static_cast<u32>(ctx->packet.size());  // checked
  const u8* el = ctx->payload<u8>(0, len);
  if (el == nullptr) return drop(s, dr_malformed), ret::drop;
  if (ctx->dma_to_host(addr(b->d.out, r.g, c, r.g.packet_lo(c, j), p.elem_bytes), el, len) != errc::ok)
    return drop(s, dr_dma), ret::drop;
  if (!set_bit(b->held, j)) return drop(s, dr_duplicate), ret::drop;
  add(&b->results, 1);
  add(&b->progress, 1);
  // The slot's result came back: it may take the next packet (self-clocking).
  if (j + r.slots < r.g.total) originate_up(ctx, s, b, r, j + r.slots);
  check_complete(ctx, s, b, r);
  return ret::success;
}

template <class Red>
ret engine<Red>::on_mdown(spin::ctx* ctx, state* s) {
  pin pn;
  data_pkt d;
  bank* sb = find(s, ctx->coll.epoch);
  if (sb == nullptr) return drop(s, dr_stale), ret::drop;
  if (!data_packet(ctx, s, sb->d.switch_rank, false, pn, d)) return ret::drop;
  bank* b = d.b;
  const params& p = b->d.p;
  const roles& r = d.r;
  const u64 pkt = d.pkt, c = d.c;
  if (!r.multicast()) return drop(s, dr_stranger), ret::drop;
  if (r.owner(c) == s->me) {  // this rank's own packet came back
    delivered(ctx, s, b, r, pkt);
    check_complete(ctx, s, b, r);
    return ret::success;
  }
  if (test_bit(b->held, pkt)) return drop(s, dr_duplicate), ret::drop;
  const u32 len = static_cast<u32>(ctx->packet.size());  // checked
  const u8* el = ctx->payload<u8>(0, len);
  if (el == nullptr) return drop(s, dr_malformed), ret::drop;
  if (ctx->dma_to_host(addr(b->d.out, r.g, c, r.g.packet_lo(c, pkt), p.elem_bytes), el, len) != errc::ok)
    return drop(s, dr_dma), ret::drop;
  if (!set_bit(b->held, pkt)) return drop(s, dr_duplicate), ret::drop;
  add(&b->results, 1);
  add(&b->progress, 1);
  check_complete(ctx, s, b, r);
  return ret::success;
}

} // namespace spin::coll::engine_detail
