// Test handler of the multi-process tests: no payload handler, so the NIC deposits each packet's
// payload at its message offset in the EC's host window (default deposit); the completion
// handler posts the message length as an event, so the host learns that the bytes are all in.
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(8, 0);

SPIN_COMPLETION_HANDLER(landing_completion) {
  ctx->post_event(ctx->msg.message_len_bytes);
  return ret::success;
}
