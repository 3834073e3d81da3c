// Handler of bench/handler_call: the same integer code built for the native and eBPF targets.
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(4096, 0);

// A streaming reduction step: adds the first 16 int32 of the payload into 16 int64
// accumulators (one window each side).
SPIN_PAYLOAD_HANDLER(call_sum16) {
  const i32* v = ctx->payload<i32>(0, 16);
  i64* acc = ctx->mem<i64>(64, 16);
  if (v == nullptr || acc == nullptr) return ret::drop;
  for (u32 i = 0; i < 16; ++i) acc[i] += v[i];
  return ret::success;
}
