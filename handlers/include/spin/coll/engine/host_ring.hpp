// The collective engine, the host ring: the NIC as plain reliable transport for a ring the host
// drives (docs/collectives.md, "Host ring").
// Part of spin/coll/engine.hpp, which declares engine<Red> and includes this file last.
#pragma once

namespace spin::coll::engine_detail {

template <class Red>
u64* engine<Red>::rcv_bits(bank* b, u32 phase) { return phase == xfer_rs ? b->rs_held : b->held; }

template <class Red>
u64* engine<Red>::ack_bits(bank* b, u32 phase) { return phase == xfer_rs ? b->rs_acked : b->acked; }

template <class Red>
u32 engine<Red>::xfer_bytes(const bank* b, u32 phase) { return phase == xfer_rs ? b->d.p.acc_bytes : b->d.p.elem_bytes; }

template <class Red>
void engine<Red>::xfer_send(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 k, bool again) {
  const u64 c = b->xfer_chunk, g = r.g.first_packet(c) + k;
  const u32 n = static_cast<u32>(r.g.packet_len(c, g)), eb = xfer_bytes(b, b->xfer_phase);
  u8* buf = ctx->scratchpad<u8>(0, max_packet_bytes);
  if (buf == nullptr) return;
  if (ctx->dma_from_host(buf, b->xfer_off + k * b->d.p.pkt_elems * eb, u64{n} * eb) != errc::ok) {
    drop(s, dr_dma);
    return;
  }
  send(ctx, s, r.succ_of(s->me), k_xfer, b->epoch, static_cast<u32>(g), n, buf, n * eb, b->d.p,
       static_cast<u16>((b->xfer_phase << 1) | (again ? ring_again : 0)));
}

template <class Red>
void engine<Red>::xfer_next_pkts(spin::ctx* ctx, state* s, bank* b, const roles& r, u32 budget) {
  const u64 npk = r.g.chunk_packets(b->xfer_chunk);
  for (u32 i = 0; i < budget; ++i) {
    const u64 k = add(&b->xfer_next, 1);
    if (k >= npk) return;
    xfer_send(ctx, s, b, r, k, false);
  }
}

template <class Red>
ret engine<Red>::on_xfer_cmd(spin::ctx* ctx, state* s, const cmd* c) {
  bank* b = find(s, c->epoch);
  pin pn;
  if (b == nullptr || !pn.enter(b, c->epoch, ph_running)) return drop(s, dr_stale), ret::drop;
  const roles r = roles::of(b, s->me);
  if (!r.via_host || c->phase > xfer_ag || c->chunk >= r.n) return drop(s, dr_malformed), ret::drop;
  const u64 bytes = r.g.chunk_len(c->chunk) * xfer_bytes(b, c->phase);
  if (c->desc_off > ctx->host_window_len_bytes || bytes > ctx->host_window_len_bytes - c->desc_off)
    return drop(s, dr_malformed), ret::drop;
  // The host starts a transfer only after the previous one was acknowledged whole.
  b->xfer_phase = c->phase;
  b->xfer_chunk = c->chunk;
  b->xfer_off = c->desc_off;
  __atomic_store_n(&b->xfer_acks, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&b->xfer_next, 0, __ATOMIC_RELEASE);
  add(&b->progress, 1);
  if (r.g.chunk_packets(c->chunk) == 0) {
    ctx->post_event(event(ev_sent, b->epoch, (c->phase << 16) | c->chunk));
    return ret::success;
  }
  xfer_next_pkts(ctx, s, b, r, b->d.window);
  return ret::success;
}

template <class Red>
ret engine<Red>::on_xfer(spin::ctx* ctx, state* s) {
  if (ctx->msg.source_rank != s->members[s->me == 0 ? s->nranks - 1 : s->me - 1])
    return drop(s, dr_stranger), ret::drop;
  pin pn;
  if (!data_bank(ctx, s, ctx->coll.epoch, pn)) return ret::drop;
  bank* b = pn.b;
  const roles r = roles::of(b, s->me);
  const u32 phase = ctx->coll.slot >> 1;
  const u64 g = ctx->coll.aux;
  if (!r.via_host || phase > xfer_ag || g >= r.g.total) return drop(s, dr_malformed), ret::drop;
  const u64 c = r.g.chunk_of(g);
  const u32 n = static_cast<u32>(r.g.packet_len(c, g)), eb = xfer_bytes(b, phase);
  if (ctx->coll.elem_count != n || ctx->packet.size() != u64{n} * eb) return drop(s, dr_malformed), ret::drop;
  const u8* data = ctx->payload<u8>(0, u64{n} * eb);
  if (data == nullptr) return drop(s, dr_malformed), ret::drop;
  u64* bits = rcv_bits(b, phase);
  if (!test_bit(bits, g)) {
    const u64 lo = r.g.packet_lo(c, g);
    const u64 at = phase == xfer_rs ? b->d.recv_off + lo * eb : addr(b->d.out, r.g, c, lo, eb);
    if (ctx->dma_to_host(at, data, u64{n} * eb) != errc::ok) return drop(s, dr_dma), ret::drop;
    if (set_bit(bits, g)) {
      add(&b->progress, 1);
      const u32 got = __atomic_add_fetch(&b->rcv_count[phase][c], 1, __ATOMIC_ACQ_REL);
      if (got == r.g.chunk_packets(c)) ctx->post_event(event(ev_recv, b->epoch, (phase << 16) | static_cast<u32>(c)));
    }
  } else {
    drop(s, dr_duplicate);  // acknowledged again below: the first acknowledgement may be lost
  }
  send_ctl(ctx, s, r.pred_of(s->me), k_ack, b->epoch, b->d.p, static_cast<u32>(g), static_cast<u16>(phase << 1));
  return ret::success;
}

template <class Red>
ret engine<Red>::on_xfer_ack(spin::ctx* ctx, state* s, bank* b, const roles& r) {
  const u32 phase = ctx->coll.slot >> 1;
  const u64 g = ctx->coll.aux;
  if (phase != b->xfer_phase || g >= r.g.total || r.g.chunk_of(g) != b->xfer_chunk) return drop(s, dr_stale), ret::drop;
  if (!set_bit(ack_bits(b, phase), g)) return drop(s, dr_duplicate), ret::drop;
  add(&b->progress, 1);
  const u64 acks = add(&b->xfer_acks, 1) + 1;
  xfer_next_pkts(ctx, s, b, r, 1);
  if (acks == r.g.chunk_packets(b->xfer_chunk)) ctx->post_event(event(ev_sent, b->epoch, (phase << 16) | b->xfer_chunk));
  return ret::success;
}

} // namespace spin::coll::engine_detail
