// spinc test input: the eBPF loop pattern (a compile-time bound, the run-time size as a guard
// in the body). clang's -O2 leaves this 64-iteration loop rolled; spinc has it unrolled, so the
// eBPF object has no loop.
#include <spin/handler.hpp>

using namespace spin;

constexpr u32 max_words = 64;

SPIN_MEMORY(max_words * sizeof(u64), 0);

SPIN_PAYLOAD_HANDLER(add_words) {
  const u64 n = ctx->msg.message_len_bytes / sizeof(u64);
  const u64* v = ctx->payload<u64>(0, max_words);
  u64* acc = ctx->mem<u64>(0, max_words);
  if (v == nullptr || acc == nullptr) return ret::drop;
  for (u32 i = 0; i < max_words; ++i)
    if (i < n) acc[i] += v[i];
  return ret::success;
}
