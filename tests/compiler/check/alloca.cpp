// Allocates stack space sized by the packet: the stack size of a handler must be known at
// compile time.
#include <spin/handler.hpp>

using namespace spin;

extern "C" void* alloca(decltype(sizeof 0) size);

SPIN_PAYLOAD_HANDLER(alloca_payload) {
  const u64 n = ctx->packet.size();
  u8* copy = static_cast<u8*>(alloca(n)); // expected-error {{call to 'alloca' is not allowed in a handler: the stack size must be known at compile time; use a constant-size array (T a[N] with constexpr N) or the scratchpad}}
  u64* sums = static_cast<u64*>(__builtin_alloca(8 * n)); // expected-error {{call to '__builtin_alloca' is not allowed in a handler}}
  copy[0] = 0;
  sums[0] = n;
  return ret::success;
}
