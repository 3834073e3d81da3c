// For the instruction counting test (tests/runtime/counted_test.cpp): the payload handler adds
// up its packet's bytes in a loop (so its count grows by the same number per byte), posts the
// sum as an event and DMAs it to the host; the header handler only counts messages.
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(64, 0);

SPIN_HEADER_HANDLER(counted_header) {
  ctx->fetch_add<u64>(0, 1);
  return ret::success;
}

SPIN_PAYLOAD_HANDLER(counted_payload) {
  const u64 len = ctx->packet.size();
  const u8* p = ctx->payload<u8>(0, len);
  if (p == nullptr) return ret::drop;
  u64 sum = 0;
  for (u64 i = 0; i < len; ++i) sum = sum * 31 + p[i];  // a dependency chain: no vectorisation either way
  ctx->post_event(sum);
  u64* slot = ctx->mem<u64>(8);
  if (slot == nullptr) return ret::drop;
  *slot = sum;
  ctx->dma_to_host(0, slot, 8);
  return ret::success;
}
