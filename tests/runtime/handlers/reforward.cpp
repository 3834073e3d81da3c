// Breaks the rule of ctx::forward on purpose: the packet is forwarded, changed, and forwarded
// again. Handler memory word 0 picks where the first forward happens: 0 in the payload
// handler, 1 in the header handler (the payload handler then runs on the forwarded packet).
// Posts bits: 8 the header handler's forward went, 1 the payload handler's first forward went,
// 2 the forward after the change went, 4 it failed with bad_state. On eBPF the change stays in
// the program's copy and the forward after it fails; natively the change reaches the shared
// frame (the rule is the handler's to keep).
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(8, 0);

SPIN_HEADER_HANDLER(reforward_header) {
  const u64* mode = ctx->mem<u64>(0);
  if (mode == nullptr) return ret::drop;
  if (*mode == 1) ctx->post_event(ctx->forward(ctx->msg.source_rank) == errc::ok ? 8 : 0);
  return ret::success;
}

SPIN_PAYLOAD_HANDLER(reforward_payload) {
  const u64* mode = ctx->mem<u64>(0);
  if (mode == nullptr) return ret::drop;
  u64 bits = 0;
  if (*mode == 0 && ctx->forward(ctx->msg.source_rank) == errc::ok) bits |= 1;
  u8* b = ctx->payload<u8>(0);
  if (b == nullptr) return ret::drop;
  b[0] ^= 0xff;
  const errc second = ctx->forward(ctx->msg.source_rank);
  if (second == errc::ok) bits |= 2;
  if (second == errc::bad_state) bits |= 4;
  ctx->post_event(bits);
  return ret::success;
}
