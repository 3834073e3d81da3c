// Allocates flow records on the heap: the NIC has none. Placement new into handler memory
// allocates nothing and is fine.
#include <spin/handler.hpp>

using namespace spin;

inline void* operator new(decltype(sizeof 0), void* where) noexcept { return where; }

struct flow {
  u64 bytes;
  u32 packets;
};

SPIN_PAYLOAD_HANDLER(new_flow_payload) {
  flow* f = new flow{}; // expected-error {{'new' is not allowed in a handler: the NIC has no heap; keep state in handler memory (ctx->mem<T>(off)) or in the message scratchpad (ctx->scratchpad<T>(off))}}
  u32* sizes = new u32[16]; // expected-error {{'new[]' is not allowed in a handler: the NIC has no heap}}
  f->bytes = ctx->packet.size();
  sizes[0] = 1;
  flow* in_place = new (ctx->mem<flow>(0)) flow{ctx->packet.size(), 1};
  return in_place != nullptr ? ret::success : ret::drop;
}
