// Streaming float32 sum: every packet of every message of the EC adds its float32 elements into
// the accumulator in handler memory, at the element index its message offset gives; the
// completion handler counts messages and, when `expected_messages` have completed, DMAs the sum
// to the host and posts an event. The in-NIC reduction of SwitchML (NSDI 2021) and SHARP, at the
// edge (Edge-INC). Layout and rules: stdh::fsum_state (<spin/std/fsum.hpp>).
//
// Native target only (eBPF has no floating point). A lock per block of elements keeps payload
// handlers of other messages that add into the same block from losing updates; the add loop is
// a plain loop over the block, which clang vectorises.
#include <spin/handler.hpp>

#include <spin/std/fsum.hpp>

using namespace spin;
using spin::stdh::fsum_state;

SPIN_MEMORY(sizeof(fsum_state), 0);

// Header handler: refuses a contribution whose length does not match the configured vector.
SPIN_HEADER_HANDLER(fsum_header) {
  const fsum_state* s = ctx->mem<fsum_state>(0);
  if (s == nullptr) return ret::drop;
  if (s->elements == 0 || s->elements > stdh::fsum_max_elements || ctx->msg.message_len_bytes != s->elements * sizeof(float)) {
    ctx->fetch_add<u64>(offsetof(fsum_state, rejected), 1);
    return ret::drop;
  }
  return ret::success;
}

SPIN_PAYLOAD_HANDLER(fsum_payload) {
  fsum_state* s = ctx->mem<fsum_state>(0);
  const u64 n = ctx->packet.size() / sizeof(float);
  const u64 first = ctx->msg.offset_bytes / sizeof(float);
  const float* v = ctx->payload<float>(0, n);
  if (s == nullptr || ctx->packet.size() % sizeof(float) != 0 || ctx->msg.offset_bytes % sizeof(float) != 0 ||
      n > stdh::fsum_max_packet_elements || first + n > s->elements || (v == nullptr && n > 0)) {
    ctx->fetch_add<u64>(offsetof(fsum_state, rejected), 1);
    return ret::drop;
  }
  // One lock block at a time: [e, end) lies inside block e / fsum_elements_per_lock.
  u64 e = first;
  const u64 last = first + n;
  while (e < last) {
    const u64 block = e / stdh::fsum_elements_per_lock;
    const u64 block_end = (block + 1) * stdh::fsum_elements_per_lock;
    const u64 end = block_end < last ? block_end : last;
    const u64 lock_off = offsetof(fsum_state, locks) + block * sizeof(u64);
    if (ctx->lock(lock_off) != errc::ok) return ret::drop;
    float* acc = s->acc + e;
    const float* in = v + (e - first);
    for (u64 i = 0; i < end - e; ++i) acc[i] += in[i];
    ctx->unlock(lock_off);
    e = end;
  }
  ctx->fetch_add<u64>(offsetof(fsum_state, packets), 1);
  return ret::success;
}

SPIN_COMPLETION_HANDLER(fsum_completion) {
  fsum_state* s = ctx->mem<fsum_state>(0);
  if (s == nullptr) return ret::drop;
  u64 before = 0;
  ctx->fetch_add<u64>(offsetof(fsum_state, messages), 1, &before);
  if (before + 1 != s->expected_messages) return ret::success;
  // Every payload handler of every expected message has returned: the sum is final.
  if (ctx->dma_to_host(0, s->acc, s->elements * sizeof(float)) != errc::ok) return ret::drop;
  ctx->post_event(before + 1);
  return ret::success;
}
