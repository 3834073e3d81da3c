// Copies a packet into a stack array sized by the packet: the stack size of a handler must be
// known at compile time.
#include <spin/handler.hpp>

using namespace spin;

SPIN_PAYLOAD_HANDLER(vla_payload) {
  const u64 n = ctx->packet.size();
  const u8* bytes = ctx->payload<u8>(0, n);
  if (bytes == nullptr) return ret::drop;
  u8 copy[n]; // expected-error {{variable-length array 'copy' is not allowed in a handler: the stack size must be known at compile time; use a constant-size array (T a[N] with constexpr N) and guard the accesses with if (i < n), or use the scratchpad}}
  for (u64 i = 0; i < n; ++i) copy[n - 1 - i] = bytes[i];
  return ctx->dma_to_host(0, copy, n) == errc::ok ? ret::success : ret::drop;
}
