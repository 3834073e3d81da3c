// Streaming integer sum: every packet of every message of the EC adds its int32 elements into a
// wide (int64) accumulator in handler memory, at the element index its message offset gives;
// the completion handler counts messages and, when `expected_messages` have completed, DMAs
// the accumulator to the host and posts an event. Integer addition is associative, so the
// result does not depend on arrival order.
//
// Written for both targets: every loop has a constant trip count (eBPF has no loops), and each
// block of at most 16 elements is one window (ctx->payload / ctx->mem).
#include <spin/handler.hpp>

#include <spin/std/isum.hpp>

using namespace spin;
using namespace spin::stdh;

SPIN_MEMORY(sizeof(isum_state), 0);

namespace {
constexpr u32 chunk = 16;
constexpr u32 max_chunks = isum_max_packet_elements / chunk;

// Adds N consecutive elements (one window each side). The lock of the elements' block keeps
// concurrent payload handlers of other messages from losing updates.
template <u32 N> ret add_block(spin::ctx* ctx, u64 elem, u64 byte_off) {
  const i32* v = ctx->payload<i32>(byte_off, N);
  i64* acc = ctx->mem<i64>(offsetof(isum_state, acc) + elem * sizeof(i64), N);
  if (v == nullptr || acc == nullptr) return ret::drop;
  const u64 lock_off = offsetof(isum_state, locks) + (elem / isum_elements_per_lock % isum_locks) * sizeof(u64);
  if (ctx->lock(lock_off) != errc::ok) return ret::drop;
  for (u32 i = 0; i < N; ++i) acc[i] += v[i];
  ctx->unlock(lock_off);
  return ret::success;
}

// Adds the last `cnt` (< chunk) elements of a packet in blocks of 8, 4, 2 and 1: every loop
// keeps a constant trip count, which is what lets clang unroll it for eBPF.
ret add_tail(spin::ctx* ctx, u64 elem, u64 byte_off, u64 cnt) {
  if (cnt & 8) {
    if (add_block<8>(ctx, elem, byte_off) != ret::success) return ret::drop;
    elem += 8;
    byte_off += 8 * sizeof(i32);
  }
  if (cnt & 4) {
    if (add_block<4>(ctx, elem, byte_off) != ret::success) return ret::drop;
    elem += 4;
    byte_off += 4 * sizeof(i32);
  }
  if (cnt & 2) {
    if (add_block<2>(ctx, elem, byte_off) != ret::success) return ret::drop;
    elem += 2;
    byte_off += 2 * sizeof(i32);
  }
  if (cnt & 1) return add_block<1>(ctx, elem, byte_off);
  return ret::success;
}
} // namespace

// Header handler: refuses a contribution whose length does not match the configured vector.
SPIN_HEADER_HANDLER(isum_header) {
  u64 elements = 0;
  ctx->load<u64>(offsetof(isum_state, elements), &elements);
  if (ctx->msg.message_len_bytes != elements * sizeof(i32) || elements > isum_max_elements) {
    ctx->fetch_add<u64>(offsetof(isum_state, rejected), 1);
    return ret::drop;
  }
  return ret::success;
}

SPIN_PAYLOAD_HANDLER(isum_payload) {
  const u64 n = ctx->packet.size() / sizeof(i32);
  const u64 first = ctx->msg.offset_bytes / sizeof(i32);
  if (n > isum_max_packet_elements || ctx->packet.size() % sizeof(i32) != 0) return ret::drop;
  for (u32 c = 0; c < max_chunks; ++c) {
    const u64 base = u64{c} * chunk;
    if (base >= n) break;
    if (base + chunk > n) {
      if (add_tail(ctx, first + base, base * sizeof(i32), n - base) != ret::success) return ret::drop;
      break;
    }
    if (add_block<chunk>(ctx, first + base, base * sizeof(i32)) != ret::success) return ret::drop;
  }
  ctx->fetch_add<u64>(offsetof(isum_state, packets), 1);
  return ret::success;
}

SPIN_COMPLETION_HANDLER(isum_completion) {
  u64 before = 0, expected = 0, elements = 0;
  ctx->fetch_add<u64>(offsetof(isum_state, messages), 1, &before);
  ctx->load<u64>(offsetof(isum_state, expected_messages), &expected);
  ctx->load<u64>(offsetof(isum_state, elements), &elements);
  if (before + 1 != expected) return ret::success;
  // The result goes out one window at a time.
  for (u32 w = 0; w < isum_max_elements * sizeof(i64) / bpf_window_bytes; ++w) {
    const u64 off = u64{w} * bpf_window_bytes;
    if (off >= elements * sizeof(i64)) break;
    const u64 rest = elements * sizeof(i64) - off;
    const u64 len = rest < bpf_window_bytes ? rest : bpf_window_bytes;
    const u8* src = ctx->mem<u8>(offsetof(isum_state, acc) + off, len);
    if (src == nullptr || ctx->dma_to_host(off, src, len) != errc::ok) return ret::drop;
  }
  ctx->post_event(expected);
  return ret::success;
}
