// Keeps per-core counters in thread-local storage: the NIC has none.
#include <spin/handler.hpp>

using namespace spin;

thread_local u64 packets_on_this_core; // expected-error {{thread-local variable 'packets_on_this_core' is not allowed in a handler: the NIC has no thread-local storage; keep per-message state in the scratchpad (ctx->scratchpad<T>(off)) and per-EC state in handler memory (ctx->mem<T>(off))}}
__thread u32 last_hpu; // expected-error {{thread-local variable 'last_hpu' is not allowed in a handler}}

SPIN_PAYLOAD_HANDLER(thread_local_payload) {
  static thread_local u64 bytes = 0; // expected-error {{thread-local variable 'bytes' is not allowed in a handler}}
  thread_local const u32 hpu_mask = 0xf; // expected-error {{thread-local variable 'hpu_mask' is not allowed in a handler}}
  ++packets_on_this_core;
  bytes += ctx->packet.size();
  last_hpu = ctx->hpu & hpu_mask;
  return ret::success;
}
