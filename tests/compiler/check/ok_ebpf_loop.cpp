// expected-no-diagnostics
// The eBPF loop pattern (--target ebpf): compile-time constant bounds, the run-time size as a
// guard in the body. Also the spin API and integer helpers, which are fine on eBPF.
#include <spin/handler.hpp>

using namespace spin;

constexpr u32 max_elements = 64;
constexpr u32 lanes = 4;

SPIN_PAYLOAD_HANDLER(ebpf_ok_payload) {
  const u64 n = ctx->packet.size() / sizeof(u32);
  const u32* v = ctx->payload<u32>(0, max_elements);
  u64* acc = ctx->mem<u64>(0, max_elements);
  if (v == nullptr || acc == nullptr) return ret::drop;
  for (u32 i = 0; i < max_elements; ++i)
    if (i < n) acc[i] += v[i];
  for (u32 i = max_elements; i > 0; --i) acc[i - 1] += 1;
  for (u32 i = 0; i < max_elements; i += lanes)
    for (u32 l = 0; l < lanes; ++l) acc[i + l] ^= l;
  for (i32 i = -8; i <= 8; i += 2) acc[0] += static_cast<u64>(i);
  u32 k = 0;
  for (k = 0; k != 16; k += 4) acc[k] += k;
  const u64 pair[2] = {acc[0], acc[1]};
  for (u64 x : pair) acc[2] += x;
  do {
    acc[3] += 1;
  } while (false);
  u8 buf[16];
  __builtin_memcpy(buf, v, sizeof buf);
  __builtin_memset(buf, 0, 8);
  u64 old = 0;
  ctx->fetch_add<u64>(0, div(acc[0], n) + rem(acc[1], u64{10}), &old);
  ctx->post_event(old + buf[9] + acc[0] / 4);
  return ret::success;
}
