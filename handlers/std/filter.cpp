// Filter: a stream of 16-byte records, of which only those whose key lies in a range reach the
// host, appended in arrival order; the rest never cross the PCIe bus. A cursor in handler memory
// hands out host slots atomically, so packets of every message filter at once.
#include <spin/handler.hpp>

#include <spin/std/filter.hpp>

using namespace spin;
using spin::stdh::filter_record;
using spin::stdh::filter_state;

SPIN_MEMORY(sizeof(filter_state), 0);

SPIN_PAYLOAD_HANDLER(filter_payload) {
  filter_state* s = ctx->mem<filter_state>(0);
  if (s == nullptr) return ret::drop;
  const u64 n = ctx->packet.size() / sizeof(filter_record);
  const filter_record* r = ctx->payload<filter_record>(0, n);
  if (ctx->packet.size() % sizeof(filter_record) != 0 || (r == nullptr && n > 0)) {
    ctx->fetch_add<u64>(offsetof(filter_state, rejected), 1);
    return ret::drop;
  }
  u64 kept = 0, dropped = 0, overflow = 0;
  for (u64 i = 0; i < n; ++i) {
    if (r[i].key < s->key_lo || r[i].key > s->key_hi) {
      ++dropped;
      continue;
    }
    const u64 slot = __atomic_fetch_add(&s->cursor, 1, __ATOMIC_RELAXED);
    if (slot >= s->capacity_records ||
        ctx->dma_to_host(slot * sizeof(filter_record), &r[i], sizeof(filter_record)) != errc::ok) {
      ++overflow;
      continue;
    }
    ++kept;
  }
  if (kept != 0) ctx->fetch_add<u64>(offsetof(filter_state, kept), kept);
  if (dropped != 0) ctx->fetch_add<u64>(offsetof(filter_state, dropped), dropped);
  if (overflow != 0) ctx->fetch_add<u64>(offsetof(filter_state, overflow), overflow);
  return ret::success;
}

SPIN_COMPLETION_HANDLER(filter_completion) {
  ctx->post_event(ctx->msg.message_id);
  return ret::success;
}
