// Ping-pong (PsPIN, ISCA 2021, section 6.1): the payload handler sends every packet straight
// back to its source, as the same message, without the host. Handler memory counts the
// packets echoed and the sends the TX queue refused.
#include <spin/handler.hpp>

using namespace spin;

/// Handler memory of a ping-pong EC.
struct pingpong_state {
  u64 echoed;   ///< packets sent back
  u64 refused;  ///< sends the TX queue refused (the packet is dropped, counted here)
};

SPIN_MEMORY(sizeof(pingpong_state), 0);

SPIN_PAYLOAD_HANDLER(pingpong_payload) {
  const errc e = ctx->forward(ctx->msg.source_rank);
  ctx->fetch_add<u64>(e == errc::ok ? offsetof(pingpong_state, echoed) : offsetof(pingpong_state, refused), 1);
  return e == errc::ok ? ret::success : ret::drop;
}
