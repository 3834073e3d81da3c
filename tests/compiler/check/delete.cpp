// Frees a flow record when the message completes: the NIC has no heap.
#include <spin/handler.hpp>

using namespace spin;

struct flow {
  u64 bytes;
  u32 packets;
};

SPIN_COMPLETION_HANDLER(delete_flow_completion) {
  flow** slot = ctx->mem<flow*>(0);
  u32** sizes = ctx->mem<u32*>(8);
  if (slot == nullptr || sizes == nullptr) return ret::drop;
  delete *slot; // expected-error {{'delete' is not allowed in a handler: the NIC has no heap; keep state in handler memory (ctx->mem<T>(off)) or in the message scratchpad (ctx->scratchpad<T>(off))}}
  delete[] *sizes; // expected-error {{'delete[]' is not allowed in a handler: the NIC has no heap}}
  *slot = nullptr;
  return ret::success;
}
