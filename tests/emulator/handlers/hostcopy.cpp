// Test handler of the control-socket tests: every payload packet is copied by DMA to the host
// window at its message offset, and the completion handler posts the message length as an
// event. The host then finds the message in its shared memory and learns by the event that
// it is complete.
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(8, 0);

SPIN_PAYLOAD_HANDLER(hostcopy_payload) {
  const u64 len = ctx->packet.size();
  const u8* data = ctx->payload<u8>(0, len);
  if (data == nullptr || ctx->dma_to_host(ctx->msg.offset_bytes, data, len) != errc::ok) return ret::drop;
  return ret::success;
}

SPIN_COMPLETION_HANDLER(hostcopy_completion) {
  ctx->post_event(ctx->msg.message_len_bytes);
  return ret::success;
}
