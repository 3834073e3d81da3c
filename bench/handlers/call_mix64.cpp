// Handler of bench/handler_call: the same integer code built for the native and eBPF targets.
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(4096, 0);

// Integer work without memory traffic: 64 rounds of a xorshift/multiply mix over the first
// payload word, the result stored once.
SPIN_PAYLOAD_HANDLER(call_mix64) {
  const u64* w = ctx->payload<u64>(0);
  u64* out = ctx->mem<u64>(8);
  if (w == nullptr || out == nullptr) return ret::drop;
  u64 x = *w | 1;
  for (u32 i = 0; i < 64; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x *= 0x9e3779b97f4a7c15ull;
  }
  *out = x;
  return ret::success;
}
