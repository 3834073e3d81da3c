// Breaks the rule of ctx::forward on purpose: forwards its packet, changes it, and forwards it
// again. Posts which forwards went: bit 0 the first, bit 1 the second, bit 2 the second failed
// with bad_state. On eBPF the change stays in the program's copy and the second forward fails;
// natively the change reaches the shared frame (the rule is the handler's to keep).
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(8, 0);

SPIN_PAYLOAD_HANDLER(reforward_payload) {
  const errc first = ctx->forward(ctx->msg.source_rank);
  u8* b = ctx->payload<u8>(0);
  if (b == nullptr) return ret::drop;
  b[0] ^= 0xff;
  const errc second = ctx->forward(ctx->msg.source_rank);
  u64 bits = 0;
  if (first == errc::ok) bits |= 1;
  if (second == errc::ok) bits |= 2;
  if (second == errc::bad_state) bits |= 4;
  ctx->post_event(bits);
  return ret::success;
}
