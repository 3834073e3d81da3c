// Decodes one MX block per packet into handler memory with spin/coll/mx.hpp's branch-free
// decode_of, natively and on eBPF, for the loader test: payload byte 0 is the element type
// (mx::element), then the block's wire layout (scale byte and packed codes); the 32 float32
// results go to handler memory at element type x 128 bytes; FP6 and FP4 codes are unpacked into
// the 32 bytes after them (eBPF's 512-byte stack does not hold the unrolled loops' spills too).
#include <spin/coll/mx.hpp>
#include <spin/handler.hpp>

using namespace spin;
namespace mx = spin::coll::mx;

SPIN_MEMORY(mx::element_count * mx::block_elements * 4 + mx::block_elements, 0);

namespace {
template <mx::element E> void decode_block(const u8* block, u32* out, u8* codes) {
  if constexpr (mx::spec_of(E).bits == 8) {  // one code per byte: decode in place
    for (u32 i = 0; i < mx::block_elements; ++i) out[i] = mx::decode_of<E>(block[0], block[1 + i]);
  } else {
    mx::unpack(E, block + 1, codes);
    for (u32 i = 0; i < mx::block_elements; ++i) out[i] = mx::decode_of<E>(block[0], codes[i]);
  }
}
} // namespace

SPIN_PAYLOAD_HANDLER(mx_decode_payload) {
  const u8* p = ctx->payload<u8>(0, 34);
  if (p == nullptr || p[0] >= mx::element_count) return ret::drop;
  u32* out = ctx->mem<u32>(u64{p[0]} * mx::block_elements * 4, mx::block_elements);
  u8* codes = ctx->mem<u8>(mx::element_count * mx::block_elements * 4, mx::block_elements);
  if (out == nullptr || codes == nullptr) return ret::drop;
  switch (static_cast<mx::element>(p[0])) {  // one branch per packet; none per element
  case mx::element::fp8_e4m3: decode_block<mx::element::fp8_e4m3>(p + 1, out, codes); break;
  case mx::element::fp8_e5m2: decode_block<mx::element::fp8_e5m2>(p + 1, out, codes); break;
  case mx::element::fp6_e3m2: decode_block<mx::element::fp6_e3m2>(p + 1, out, codes); break;
  case mx::element::fp6_e2m3: decode_block<mx::element::fp6_e2m3>(p + 1, out, codes); break;
  case mx::element::fp4_e2m1: decode_block<mx::element::fp4_e2m1>(p + 1, out, codes); break;
  case mx::element::int8: decode_block<mx::element::int8>(p + 1, out, codes); break;
  }
  return ret::success;
}
