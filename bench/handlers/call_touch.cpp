// Handler of bench/handler_call: the same integer code built for the native and eBPF targets.
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(4096, 0);

// The least a handler does: read the message descriptor, touch one word of handler memory.
SPIN_PAYLOAD_HANDLER(call_touch) {
  u64* count = ctx->mem<u64>(0);
  if (count == nullptr) return ret::drop;
  *count += ctx->msg.packet_index + 1;
  return ret::success;
}
