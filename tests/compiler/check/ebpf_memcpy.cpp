// Copies a packet-sized block with __builtin_memcpy: on eBPF a copy whose size is not a
// compile-time constant becomes a call to memcpy, which eBPF cannot make (--target ebpf).
#include <spin/handler.hpp>

using namespace spin;

constexpr u32 block_bytes = 64;

SPIN_PAYLOAD_HANDLER(ebpf_memcpy_payload) {
  const u64 n = ctx->packet.size() < block_bytes ? ctx->packet.size() : block_bytes;
  const u8* src = ctx->payload<u8>(0, block_bytes);
  u8* dst = ctx->scratchpad<u8>(0, block_bytes);
  if (src == nullptr || dst == nullptr) return ret::drop;
  __builtin_memcpy(dst, src, n); // expected-error {{'__builtin_memcpy' with a size that is not a compile-time constant is not allowed on the eBPF target: it becomes a call to 'memcpy', which eBPF cannot make; copy a constant size, or use a constant-bound loop guarded with if (i < n)}}
  __builtin_memset(dst, 0, n); // expected-error {{'__builtin_memset' with a size that is not a compile-time constant is not allowed on the eBPF target}}
  __builtin_memmove(dst + 1, dst, n - 1); // expected-error {{'__builtin_memmove' with a size that is not a compile-time constant is not allowed on the eBPF target}}
  __builtin_memcpy(dst, src, block_bytes);
  for (u32 i = 0; i < block_bytes; ++i)
    if (i < n) dst[i] = src[i];
  return ret::success;
}
