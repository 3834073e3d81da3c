// The collective engine, switch aggregation, switch side: aggregator slots with shadow copies,
// multicast of results, probes, hierarchies (docs/collectives.md, "Switch aggregation").
// Part of spin/coll/engine.hpp, which declares engine<Red> and includes this file last.
#pragma once

namespace spin::coll::engine_detail {

template <class Red>
slot_hdr* engine<Red>::slot_at(spin::ctx* ctx, const state* s, u32 slot, u32 shadow) {
  return ctx->mem<slot_hdr>(slots_offset() + (u64{slot} * 2 + shadow) * s->slot_stride);
}

template <class Red>
u64 engine<Red>::slot_off(const state* s, u32 slot, u32 shadow) { return slots_offset() + (u64{slot} * 2 + shadow) * s->slot_stride; }

template <class Red>
u8* engine<Red>::slot_data(spin::ctx* ctx, const state* s, u32 slot, u32 shadow, u32 k, u64 bytes) {
  return ctx->mem<u8>(slot_off(s, slot, shadow) + sizeof(slot_hdr) + u64{k} * s->slot_bytes, bytes);
}

template <class Red>
bool engine<Red>::key_newer(u32 e, u32 j, const slot_hdr* h) {
  return epoch_newer(e, h->epoch) || (e == h->epoch && j > h->pkt);
}

template <class Red>
ret engine<Red>::on_up(spin::ctx* ctx, state* s, bool from_leaf) {
  const u32 n_in = from_leaf ? s->nleaves : s->nranks;
  const u32* who = from_leaf ? s->leaves : s->members;
  u32 sender = n_in;
  for (u32 i = 0; i < n_in; ++i)
    if (who[i] == ctx->msg.source_rank) {
      sender = i;
      break;
    }
  if (sender == n_in) return drop(s, dr_stranger), ret::drop;
  const u32 j = ctx->coll.aux & 0xffffu, c = ctx->coll.aux >> 16, n = ctx->coll.elem_count;
  const u32 slot = ctx->coll.slot & 0x7fffu, shadow = static_cast<u32>(ctx->coll.slot >> 15);
  u32 eb = 0, ab = 0;
  if (!Red::dispatch(ctx->coll.op, ctx->coll.dtype, size_fn{&eb, &ab}) || slot >= s->slots || c >= max_ranks ||
      !wire_ok(ctx, ctx->coll.op, ctx->coll.dtype, false, n, eb) || u64{n} * eb > s->slot_bytes || ab > max_packet_bytes)
    return drop(s, dr_malformed), ret::drop;
  slot_hdr* h = slot_at(ctx, s, slot, shadow);
  // A compact reduction's elements arrive in fewer bytes than n x eb (wire_ok checked them);
  // they are kept and read as they came.
  const u32 in_len = static_cast<u32>(ctx->packet.size());
  const u8* in = ctx->payload<u8>(0, in_len);
  u8* mine = slot_data(ctx, s, slot, shadow, sender, s->slot_bytes);
  u8* result = slot_data(ctx, s, slot, shadow, s->nranks, s->slot_bytes);
  if (h == nullptr || (in == nullptr && n > 0) || mine == nullptr || result == nullptr) return drop(s, dr_malformed), ret::drop;
  const u64 lk = slot_off(s, slot, shadow);
  if (ctx->lock(lk) != errc::ok) return ret::drop;
  const u32 epoch = ctx->coll.epoch;
  if (h->used == 0 || key_newer(epoch, j, h)) {
    // A new packet for this copy: every worker already holds the result of the packet it held
    // (it sent this one only after its previous result came back).
    h->used = 1;
    h->epoch = epoch;
    h->pkt = j;
    h->chunk = c;
    h->nelems = n;
    h->count = 0;
    h->complete = 0;
    h->final = 0;
    h->op = ctx->coll.op;
    h->dtype = ctx->coll.dtype;
    for (u32 w = 0; w < max_ranks / 64; ++w) h->bits[w] = 0;
  } else if (h->epoch != epoch || h->pkt != j) {
    ctx->unlock(lk);
    return drop(s, dr_stale), ret::drop;
  }
  if (h->nelems != n || h->chunk != c || h->op != ctx->coll.op || h->dtype != ctx->coll.dtype) {
    ctx->unlock(lk);
    return drop(s, dr_malformed), ret::drop;
  }
  const bool leaf = s->role == role_leaf;
  const u64 bit = 1ull << (sender & 63);
  if ((h->bits[sender >> 6] & bit) != 0) {
    const bool complete = h->complete != 0, final = h->final != 0;
    ctx->unlock(lk);
    // The sender lost the result: send it again. A leaf without the root's result yet sends
    // its partial up again instead (the root answers it the same way).
    const params hp = h_params(ctx);
    if (complete && leaf && !final)
      send_to_rank(ctx, s, s->parent, k_up2, epoch, ctx->coll.aux, n, result, elem_len(hp, result, n), hp, ctx->coll.slot);
    else if (complete)
      send_to_rank(ctx, s, who[sender], from_leaf ? k_down2 : k_down, epoch, ctx->coll.aux, n, result, elem_len(hp, result, n),
                   hp, ctx->coll.slot);
    return drop(s, dr_duplicate), ret::drop;
  }
  h->bits[sender >> 6] |= bit;
  bool done = ++h->count == n_in;
  // The contribution that completes the slot is read from its packet; the others wait in
  // the slot.
  // A copy, not a byte loop: an HPU copies words (and a virtual-time HPU is charged so).
  if (!done && in_len != 0) __builtin_memcpy(mine, in, in_len);
  if (done) {
    u8* acc = ctx->scratchpad<u8>(max_packet_bytes, max_packet_bytes);
    if (acc == nullptr) {
      ctx->unlock(lk);
      return ret::drop;
    }
    // The fixed order of the flat case; a hierarchy's reductions do not depend on it. The
    // result is narrow(combine(...combine(widen(c0), widen(c1))..., widen(cn-1))) in that
    // order, the first two and the last steps fused with their neighbours (three passes over
    // the data for four contributions, not five).
    const u32 first = from_leaf || leaf ? 0 : (c + 1 >= n_in ? 0 : c + 1);
    // By value: a reference would put `in` in memory, where every byte the copy loops store
    // may alias it (the loops then reload it per byte instead of vectorising).
    auto contribution = [ctx, s, slot, shadow, first, n_in, sender, in](u32 k) -> const u8* {
      const u32 from = first + k >= n_in ? first + k - n_in : first + k;
      return from == sender ? in : slot_data(ctx, s, slot, shadow, from, s->slot_bytes);
    };
    // Accumulators can be larger than elements (float32 for bfloat16, a block's 32 float32
    // values for MX): the packet is combined in parts whose accumulators fit the scratchpad.
    const u32 part = static_cast<u32>(spin::div(u64{max_packet_bytes}, u64{ab}));
    for (u32 lo = 0; lo < n; lo += part) {
      const u32 m = n - lo < part ? n - lo : part;
      const u64 at = u64{lo} * eb;
      u8* out = result + at;
      if (n_in == 1) {
        Red::dispatch(h->op, h->dtype, widen_fn{acc, contribution(0) + at, m});
        Red::dispatch(h->op, h->dtype, narrow_fn{out, acc, m});
      } else {
        const u32 last = n_in - 1;
        if (n_in == 2)
          Red::dispatch(h->op, h->dtype, widen_fn{acc, contribution(0) + at, m});
        else
          Red::dispatch(h->op, h->dtype, widen_fold_fn{acc, contribution(0) + at, contribution(1) + at, m});
        for (u32 k = 2; k < last; ++k) Red::dispatch(h->op, h->dtype, fold_fn{acc, contribution(k) + at, m});
        Red::dispatch(h->op, h->dtype, fold_narrow_fn{out, acc, contribution(last) + at, m});
      }
    }
    h->complete = 1;
  }
  ctx->unlock(lk);
  // Multicast (or, at a leaf, up to the root). The copy cannot be reused before every member
  // has this result (see above).
  if (done) {
    const params hp = h_params(ctx);
    const u32 len = elem_len(hp, result, n);
    if (leaf)
      send_to_rank(ctx, s, s->parent, k_up2, epoch, ctx->coll.aux, n, result, len, hp, ctx->coll.slot);
    else
      send_all(ctx, s, who, n_in, from_leaf ? k_down2 : k_down, epoch, ctx->coll.aux, n, result, len, hp, ctx->coll.slot);
  }
  return ret::success;
}

template <class Red>
ret engine<Red>::on_down2(spin::ctx* ctx, state* s) {
  if (ctx->msg.source_rank != s->parent) return drop(s, dr_stranger), ret::drop;
  const u32 j = ctx->coll.aux & 0xffffu, n = ctx->coll.elem_count;
  const u32 slot = ctx->coll.slot & 0x7fffu, shadow = static_cast<u32>(ctx->coll.slot >> 15);
  u32 eb = 0, ab = 0;
  if (!Red::dispatch(ctx->coll.op, ctx->coll.dtype, size_fn{&eb, &ab}) || slot >= s->slots ||
      !wire_ok(ctx, ctx->coll.op, ctx->coll.dtype, false, n, eb) || u64{n} * eb > s->slot_bytes)
    return drop(s, dr_malformed), ret::drop;
  slot_hdr* h = slot_at(ctx, s, slot, shadow);
  const u32 in_len = static_cast<u32>(ctx->packet.size());
  const u8* in = ctx->payload<u8>(0, in_len);
  u8* result = slot_data(ctx, s, slot, shadow, s->nranks, s->slot_bytes);
  if (h == nullptr || (in == nullptr && n > 0) || result == nullptr) return drop(s, dr_malformed), ret::drop;
  const u64 lk = slot_off(s, slot, shadow);
  if (ctx->lock(lk) != errc::ok) return ret::drop;
  const bool fresh = h->used != 0 && h->complete != 0 && h->final == 0 && h->epoch == ctx->coll.epoch && h->pkt == j &&
                     h->nelems == n;
  if (fresh) {
    if (in_len != 0) __builtin_memcpy(result, in, in_len);
    h->final = 1;
  }
  ctx->unlock(lk);
  if (!fresh) return drop(s, dr_duplicate), ret::drop;
  send_all(ctx, s, s->members, s->nranks, k_down, ctx->coll.epoch, ctx->coll.aux, n, result, in_len, h_params(ctx), ctx->coll.slot);
  return ret::success;
}

template <class Red>
ret engine<Red>::on_probe(spin::ctx* ctx, state* s) {
  const u32 n_in = s->nranks;
  u32 sender = n_in;
  for (u32 i = 0; i < n_in; ++i)
    if (s->members[i] == ctx->msg.source_rank) {
      sender = i;
      break;
    }
  if (sender == n_in) return drop(s, dr_stranger), ret::drop;
  const probe* q = ctx->payload<probe>(0);
  // At most probe_max_packets (a member's results may come back out of order, so its
  // outstanding packets can span more than `slots`): two slot locks per packet named.
  if (q == nullptr || ctx->packet.size() != sizeof(probe) || q->count == 0 || q->count > probe_max_packets || q->slots == 0 ||
      q->slots > s->slots || u64{q->first} + q->count > max_packets)
    return drop(s, dr_malformed), ret::drop;
  const u32 words = (q->count + 63) / 64;
  probe* a = ctx->scratchpad<probe>(0);
  u64* waiting = ctx->scratchpad<u64>(sizeof(probe), words);
  if (a == nullptr || waiting == nullptr) return ret::drop;
  *a = *q;
  for (u32 w = 0; w < words; ++w) waiting[w] = 0;
  const u32 epoch = ctx->coll.epoch;
  const u64 bit = 1ull << (sender & 63);
  for (u32 i = 0; i < q->count; ++i) {
    const u64 j = u64{q->first} + i;
    const u32 slot = static_cast<u32>(spin::rem(j, u64{q->slots}));
    for (u32 shadow = 0; shadow < 2; ++shadow) {
      const slot_hdr* h = slot_at(ctx, s, slot, shadow);
      const u64 lk = slot_off(s, slot, shadow);
      if (h == nullptr || ctx->lock(lk) != errc::ok) return ret::drop;
      const bool held = h->used != 0 && h->epoch == epoch && h->pkt == j && (h->bits[sender >> 6] & bit) != 0 && h->complete == 0;
      ctx->unlock(lk);
      if (held) waiting[i >> 6] |= 1ull << (i & 63);
    }
  }
  send_to_rank(ctx, s, s->members[sender], k_probe_ans, epoch, ctx->coll.aux, 0, a, static_cast<u32>(sizeof(probe) + u64{words} * 8),
               h_params(ctx));
  return ret::success;
}

template <class Red>
ret engine<Red>::on_probe_ans(spin::ctx* ctx, state* s) {
  bank* b = find(s, ctx->coll.epoch);
  pin pn;
  if (b == nullptr || !pn.enter(b, ctx->coll.epoch, ph_running)) return drop(s, dr_stale), ret::drop;
  const roles r = roles::of(b, s->me);
  if (!r.via_switch || r.multicast() || ctx->msg.source_rank != b->d.switch_rank) return drop(s, dr_stranger), ret::drop;
  const probe* q = ctx->payload<probe>(0);
  if (q == nullptr || q->count == 0 || q->count > probe_max_packets || q->sender != s->me)
    return drop(s, dr_malformed), ret::drop;
  const u32 words = (q->count + 63) / 64;
  const u64* waiting = ctx->payload<u64>(sizeof(probe), words);
  if (waiting == nullptr || ctx->packet.size() != sizeof(probe) + u64{words} * 8) return drop(s, dr_malformed), ret::drop;
  u64 out = load_acq(&b->next_orig);
  if (out > r.g.total) out = r.g.total;
  u32 resent = 0;
  for (u32 i = 0; i < q->count; ++i) {
    const u64 j = u64{q->first} + i;
    if (j >= out) break;
    // Packet j went out when the result of j - slots came back; one that did not go out yet
    // must not: its slot copy may still hold a result that another member lacks.
    if (test_bit(b->held, j) || (j >= r.slots && !test_bit(b->held, j - r.slots))) continue;
    if (((waiting[i >> 6] >> (i & 63)) & 1) != 0) continue;
    originate_up(ctx, s, b, r, j);
    ++resent;
  }
  if (resent > 0) store_rel(&b->repaired, 1);
  return ret::success;
}

template <class Red>
ret engine<Red>::on_mcast(spin::ctx* ctx, state* s) {
  bool member = false;
  for (u32 i = 0; i < s->nranks; ++i) member = member || s->members[i] == ctx->msg.source_rank;
  if (!member) return drop(s, dr_stranger), ret::drop;
  const u8* data = ctx->payload<u8>(0, ctx->packet.size());
  if (data == nullptr && ctx->packet.size() > 0) return drop(s, dr_malformed), ret::drop;
  const u32 len = static_cast<u32>(ctx->packet.size());
  send_all(ctx, s, s->members, s->nranks, k_mdown, ctx->coll.epoch, ctx->coll.aux, ctx->coll.elem_count, data, len, h_params(ctx),
           ctx->coll.slot);
  return ret::success;
}

} // namespace spin::coll::engine_detail
