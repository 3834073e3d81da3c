// The collective engine, repair: what a host timer tick resends (docs/collectives.md,
// "Reliability").
// Part of spin/coll/engine.hpp, which declares engine<Red> and includes this file last.
#pragma once

namespace spin::coll::engine_detail {

template <class Red>
void engine<Red>::repair(spin::ctx* ctx, state* s, bank* b) {
  const u32 ph = load_acq(&b->phase);
  const params& p = b->d.p;
  if (ph == ph_started || (ph == ph_running && load_acq(&b->agreed) == 0)) {
    // Hellos still missing (a call started early, or one that data proved, still waits for
    // them to complete).
    for (u32 i = 0; i < s->nranks; ++i)
      if (i != s->me && !test_bit(b->hello_bits, i)) send_ctl(ctx, s, i, k_hello_req, b->epoch, p, s->me);
    if (ph == ph_started) return;
  }
  if (ph != ph_running) return;
  const roles r = roles::of(b, s->me);
  if (r.via_host) {
    // The transfer's packets not acknowledged, again: the successor acknowledges duplicates.
    const u64 npk = r.g.chunk_packets(b->xfer_chunk);
    u64 out = load_acq(&b->xfer_next);
    if (out > npk) out = npk;
    const u64 first = r.g.first_packet(b->xfer_chunk);
    u32 budget = b->d.window;
    for (u64 k = 0; k < out && budget > 0; ++k) {
      if (test_bit(ack_bits(b, b->xfer_phase), first + k)) continue;
      xfer_send(ctx, s, b, r, k, true);
      --budget;
    }
    return;
  }
  if (r.via_switch && !r.multicast()) {
    // Contributions sent whose result has not come back. A stalled tick does not send them
    // again at once: it asks the switch which of them it holds (k_probe). On a machine with
    // more threads than cores most stalls are a descheduled lcore, not a loss (at 16 ranks
    // on 2 cores, 4 of every 16 epochs stalled for an interval; resending each rank's whole
    // window cost 15 to 20 % of the call). The probe travels behind the contributions and
    // its answer behind the results, so the answer says what is really missing, and
    // on_probe_ans sends only that (TCP's SACK, after a timeout). A lost probe or answer
    // costs one more tick.
    u64 out = load_acq(&b->next_orig);
    if (out > r.g.total) out = r.g.total;
    u64 first = out;
    for (u64 j = 0; j < out; ++j)
      if (!test_bit(b->held, j)) {
        first = j;
        break;
      }
    if (first == out) return;  // every result sent for is here: nothing to repair
    probe* q = ctx->scratchpad<probe>(max_packet_bytes - sizeof(probe));
    if (q == nullptr) return;
    // Results come back in any order, so [first, out) may span more than `slots` packets; a
    // probe names at most probe_max_packets of them (the rest at a later tick).
    const u64 count = out - first < probe_max_packets ? out - first : probe_max_packets;
    q->sender = s->me;
    q->first = static_cast<u32>(first);
    q->count = static_cast<u32>(count);
    q->slots = r.slots;
    send_to_rank(ctx, s, b->d.switch_rank, k_probe, b->epoch, s->me, 0, q, sizeof(probe), p);
    return;
  }
  // Packets of this rank's chunk not known delivered: originate them again.
  const u64 npk = r.my_chunk_packets();
  if (npk > 0) {
    const u64 first = r.g.first_packet(r.my_chunk());
    u64 out = load_acq(&b->next_orig);
    if (out > npk) out = npk;
    u32 budget = b->d.window;
    for (u64 k = 0; k < out && budget > 0; ++k) {
      if (test_bit(b->acked, first + k)) continue;
      originate(ctx, s, b, r, first + k, true);
      --budget;
    }
  }
  if (load_acq(&b->results) < r.results_needed() && r.gathers()) {
    // Ask the predecessor for every result missing here, a bitmap window per packet.
    nack_head* h = ctx->scratchpad<nack_head>(0);
    u64* words = ctx->scratchpad<u64>(sizeof(nack_head), nack_max_words);
    if (h == nullptr || words == nullptr) return;
    const u64 nwords_total = (r.g.total + 63) / 64;
    u32 packets = 0;
    for (u64 w0 = 0; w0 < nwords_total && packets < 4; w0 += nack_max_words) {
      const u32 nw = static_cast<u32>(nwords_total - w0 < nack_max_words ? nwords_total - w0 : nack_max_words);
      bool missing = false;
      for (u32 i = 0; i < nw; ++i) {
        u64 v = load_acq(&b->held[w0 + i]);
        const u64 lo = (w0 + i) * 64;
        if (r.g.total - lo < 64) v |= ~((1ull << (r.g.total - lo)) - 1);  // bits past the end count as held
        words[i] = v;
        missing = missing || v != ~0ull;
      }
      if (!missing) continue;
      h->sender = s->me;
      h->first_word = static_cast<u32>(w0);
      h->nwords = nw;
      h->reserved = 0;
      send(ctx, s, r.pred_of(s->me), k_nack, b->epoch, s->me, 0, h, static_cast<u32>(sizeof(nack_head) + nw * 8ull), p);
      ++packets;
    }
  }
  if (load_acq(&b->complete) != 0) {
    if (r.kind == coll_kind::reduce_scatter) {
      for (u32 i = 0; i < s->nranks; ++i)
        if (i != s->me && !test_bit(b->done_bits, i)) send_ctl(ctx, s, i, k_done_req, b->epoch, p, s->me);
    } else if (load_acq(&b->succ_complete) == 0) {
      send_ctl(ctx, s, r.succ_of(s->me), k_done_req, b->epoch, p, s->me);
    }
  }
}

} // namespace spin::coll::engine_detail
