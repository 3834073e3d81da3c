// For the virtual-time tests (tests/sim/sim_test.cpp): every payload packet's bytes go to the
// host window at the packet's message offset, by one DMA write; nothing else.
#include <spin/handler.hpp>

using namespace spin;

SPIN_PAYLOAD_HANDLER(to_host_payload) {
  const u64 len = ctx->packet.size();
  const u8* data = ctx->payload<u8>(0, len);
  if (data == nullptr && len > 0) return ret::drop;
  return ctx->dma_to_host(ctx->msg.offset_bytes, data, len) == errc::ok ? ret::success : ret::drop;
}
