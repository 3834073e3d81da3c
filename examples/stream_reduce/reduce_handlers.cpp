// Handlers of the stream_reduce example: every rank sends its int32 vector to one NIC, which
// sums the vectors into a wide (int64) accumulator in handler memory and, when the last
// contribution completes, DMAs the result to the host and tells it with an event.
//
// Restricted C++: this file includes nothing but the handler API and is compiled freestanding
// (see meson.build), as a NIC would run it.
#include <spin/handler.hpp>

#include "reduce_layout.hpp"

using namespace spin;

// Header handler: refuses a contribution of the wrong length before any of its payload
// handlers runs (returning drop discards the whole message).
SPIN_HEADER_HANDLER(reduce_header) {
  const reduce_config* cfg = ctx->mem<reduce_config>(0);
  if (cfg == nullptr || ctx->msg.message_len_bytes != cfg->elements * sizeof(i32)) {
    ctx->fetch_add<u64>(offsetof(reduce_config, rejected), 1);
    return ret::drop;
  }
  return ret::success;
}

// Payload handler: adds this packet's elements into the accumulator. Packets of all ranks run
// concurrently on every HPU; a lock per block of the accumulator keeps the sum exact (integer
// addition is associative, so the result does not depend on arrival order).
SPIN_PAYLOAD_HANDLER(reduce_payload) {
  const reduce_config* cfg = ctx->mem<reduce_config>(0);
  const u64 first = ctx->msg.offset_bytes / sizeof(i32);
  const u64 n = ctx->packet.size() / sizeof(i32);
  const i32* v = ctx->payload<i32>(0, n);
  i64* acc = ctx->mem<i64>(cfg->acc_offset, cfg->elements);
  if (v == nullptr || acc == nullptr || first + n > cfg->elements) return ret::drop;
  for (u64 e = first; e < first + n;) {
    const u64 block = e / elements_per_lock;
    const u64 end = (block + 1) * elements_per_lock < first + n ? (block + 1) * elements_per_lock : first + n;
    if (ctx->lock(locks_offset + block * 8) != errc::ok) return ret::drop;
    for (u64 i = e; i < end; ++i) acc[i] += v[i - first];
    ctx->unlock(locks_offset + block * 8);
    e = end;
  }
  return ret::success;
}

// Completion handler: the last contribution delivers the result.
SPIN_COMPLETION_HANDLER(reduce_completion) {
  const reduce_config* cfg = ctx->mem<reduce_config>(0);
  u64 before = 0;
  ctx->fetch_add<u64>(offsetof(reduce_config, contributions), 1, &before);
  if (before + 1 != cfg->ranks) return ret::success;
  const u64 bytes = cfg->elements * sizeof(i64);
  if (ctx->dma_to_host(0, ctx->mem<u8>(cfg->acc_offset, bytes), bytes) != errc::ok) return ret::drop;
  ctx->post_event(cfg->ranks);
  return ret::success;
}
