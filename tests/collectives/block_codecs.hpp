// Test helpers: the block datatypes of spin::coll and the run-time dispatch from a dtype to its
// codec's own block functions (mx.hpp, bfp.hpp), shared by tests bfp and block_format. They call
// the codecs directly, not the reductions' kernels, so a test can compare the two.
#pragma once

#include <spin/coll/bfp.hpp>
#include <spin/coll/mx.hpp>
#include <spin/coll/types.hpp>

#include <cstdint>
#include <stdexcept>

namespace spin::coll::test {

inline constexpr dtype block_dtypes[] = {dtype::mxfp8_e4m3, dtype::mxfp8_e5m2, dtype::mxfp6_e3m2, dtype::mxfp6_e2m3,
                                         dtype::mxfp4_e2m1, dtype::mxint8,     dtype::bfp8_16,    dtype::bfp8_32,
                                         dtype::bfp16_16,   dtype::bfp16_32};

// Decodes one block of t at `b` into block_values(t) float32 bit patterns. Throws
// std::invalid_argument if t is not a block format.
inline void decode_block(dtype t, const std::uint8_t* b, std::uint32_t* out) {
  switch (t) {
  case dtype::mxfp8_e4m3: mx::decode_block(mx::element::fp8_e4m3, b, out); break;
  case dtype::mxfp8_e5m2: mx::decode_block(mx::element::fp8_e5m2, b, out); break;
  case dtype::mxfp6_e3m2: mx::decode_block(mx::element::fp6_e3m2, b, out); break;
  case dtype::mxfp6_e2m3: mx::decode_block(mx::element::fp6_e2m3, b, out); break;
  case dtype::mxfp4_e2m1: mx::decode_block(mx::element::fp4_e2m1, b, out); break;
  case dtype::mxint8: mx::decode_block(mx::element::int8, b, out); break;
  case dtype::bfp8_16: bfp::decode_block({16, 8}, b, out); break;
  case dtype::bfp8_32: bfp::decode_block({32, 8}, b, out); break;
  case dtype::bfp16_16: bfp::decode_block({16, 16}, b, out); break;
  case dtype::bfp16_32: bfp::decode_block({32, 16}, b, out); break;
  default: throw std::invalid_argument("not a block format");
  }
}

// Encodes block_values(t) float32 bit patterns into one block of t at `b`. Throws
// std::invalid_argument if t is not a block format.
inline void encode_block(dtype t, const std::uint32_t* in, std::uint8_t* b) {
  switch (t) {
  case dtype::mxfp8_e4m3: mx::encode_packed(mx::element::fp8_e4m3, in, b); break;
  case dtype::mxfp8_e5m2: mx::encode_packed(mx::element::fp8_e5m2, in, b); break;
  case dtype::mxfp6_e3m2: mx::encode_packed(mx::element::fp6_e3m2, in, b); break;
  case dtype::mxfp6_e2m3: mx::encode_packed(mx::element::fp6_e2m3, in, b); break;
  case dtype::mxfp4_e2m1: mx::encode_packed(mx::element::fp4_e2m1, in, b); break;
  case dtype::mxint8: mx::encode_packed(mx::element::int8, in, b); break;
  case dtype::bfp8_16: bfp::encode_block({16, 8}, in, b); break;
  case dtype::bfp8_32: bfp::encode_block({32, 8}, in, b); break;
  case dtype::bfp16_16: bfp::encode_block({16, 16}, in, b); break;
  case dtype::bfp16_32: bfp::encode_block({32, 16}, in, b); break;
  default: throw std::invalid_argument("not a block format");
  }
}

} // namespace spin::coll::test
