// spinc test input: a loop with a constant bound (so the checker accepts it) that its author
// told clang not to unroll. spinc asks clang to unroll every loop for BPF, but a user's
// '#pragma nounroll' wins, so the loop reaches the object, where spinc must find it (DPDK's
// validator would refuse the program).
#include <spin/handler.hpp>

using namespace spin;

SPIN_PAYLOAD_HANDLER(sum_words) {
  const u64* v = ctx->payload<u64>(0, 64);
  if (v == nullptr) return ret::drop;
  u64 sum = 0;
#pragma nounroll
  for (u32 i = 0; i < 64; ++i) sum += v[i] * (i + 1); // line 14: the loop
  ctx->post_event(sum);
  return ret::success;
}
