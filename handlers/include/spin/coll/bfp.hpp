// Block floating point (BFP): a block of 16 or 32 two's-complement mantissas of 8 or 16 bits
// shares one 8-bit exponent. This is the format of HBFP (Drumond et al., "Training DNNs with
// Hybrid Block Floating Point", NeurIPS 2018) and of MSFP (Darvish Rouhani et al., "Pushing the
// Limits of Narrow Precision Inferencing at Cloud Scale with Microsoft Floating Point",
// NeurIPS 2020), written with MX's conventions so that the two families read alike: the
// shared exponent is an E8M0 byte (2^(x - 127); 0xff is NaN), and each mantissa is a fixed-point
// number with w - 2 fraction bits (w = 8 or 16), so an element's value is
//   m x 2^(x - 127) x 2^-(w - 2),   m in -(2^(w-1) - 1) .. 2^(w-1) - 1.
// With w = 8 and 32 mantissas a block is exactly an OCP MXINT8 block (spin/coll/mx.hpp; test
// bfp checks the two bit for bit).
//
// Conversion of a block of float32 values (as MX's section 6.3 with emax_elem = 0):
//   - shared exponent: floor(log2(max |V_i|)), clamped to -127 .. 127; -127 for an all-zero block;
//   - each mantissa: V_i / 2^(shared - (w - 2)) rounded to nearest, ties to even, clamped to
//     +-(2^(w-1) - 1) (symmetric: the most negative code is never produced);
//   - a NaN or an infinity in the block gives the NaN exponent and mantissas 0; every element
//     of such a block decodes to NaN.
// Decoding is exact: every BFP value is a float32 (subnormals included), except that the most
// negative mantissa, which encoding never produces, under exponent byte 254 gives -infinity.
//
// Wire layout of one block (block_bytes): the exponent byte, then the mantissas in order, each
// little-endian. 17 (8-bit x 16), 33 (8-bit x 32 or 16-bit x 16) or 65 (16-bit x 32) bytes.
// Freestanding and constexpr: NIC and switch handlers and host code share it.
#pragma once

#include <spin/coll/mx.hpp>
#include <spin/handler.hpp>

namespace spin::coll::bfp {

/// The E8M0 exponent's bias and its NaN code (as MX's scale).
inline constexpr i32 exp_bias = 127;
inline constexpr u8 exp_nan = 0xff;

/// A BFP layout: mantissas per block (16 or 32) and bits per mantissa (8 or 16).
struct format {
  u32 block = 32;
  u32 bits = 8;
};

/// Whether `f` is one of the four layouts this codec implements.
constexpr bool valid(format f) { return (f.block == 16 || f.block == 32) && (f.bits == 8 || f.bits == 16); }

/// Bytes of one block on the wire: the exponent byte and the mantissas.
constexpr u32 block_bytes(format f) { return 1 + f.block * f.bits / 8; }

/// Largest mantissa magnitude: 2^(w-1) - 1.
constexpr u32 max_mantissa(format f) { return (1u << (f.bits - 1)) - 1; }

/// float32 bits of mantissa `m` under exponent byte `exp` (0x7fc00000 for the NaN exponent).
constexpr u32 decode(format f, u8 exp, i32 m) {
  if (exp == exp_nan) return mx::f32_nan;
  const u32 sign = m < 0 ? 1u : 0u;
  const u64 q = static_cast<u64>(m < 0 ? -static_cast<i64>(m) : static_cast<i64>(m));
  return mx::detail::f32_from(sign, q, static_cast<i32>(exp) - exp_bias - static_cast<i32>(f.bits - 2));
}

/// decode by float arithmetic, for native handlers and host code: m times the power of two,
/// one correctly rounded multiplication, so the same bits as decode (test bfp) in the default
/// floating-point environment (no flush-to-zero).
inline u32 decode_native(format f, u8 exp, i32 m) {
  if (exp == exp_nan) return mx::f32_nan;
  const i32 e = static_cast<i32>(exp) - exp_bias - static_cast<i32>(f.bits - 2);  // -141 .. 121
  const u32 pow2 = e >= -126 ? static_cast<u32>(e + 127) << 23 : 1u << static_cast<u32>(e + 149);
  return spin::detail::bit_cast<u32>(static_cast<float>(m) * spin::detail::bit_cast<float>(pow2));
}

/// The shared exponent of a block whose largest magnitude has float32 bits `max_abs` (finite,
/// sign bit clear): floor(log2 max_abs), clamped to -127 .. 127; -127 for zero.
constexpr i32 shared_exponent(u32 max_abs) {
  if (max_abs == 0) return -exp_bias;
  const u32 ef32 = max_abs >> 23;
  i32 se = ef32 == 0 ? mx::detail::top_bit(max_abs) - 149 : static_cast<i32>(ef32) - 127;
  return se < -exp_bias ? -exp_bias : se;
}

/// The mantissa of float32 bits `v` (finite) under shared exponent `shared_exp`: rounded to
/// nearest, ties to even, clamped to +-max_mantissa(f).
constexpr i32 quantize(format f, u32 v, i32 shared_exp) {
  const u32 sign = v >> 31;
  const u32 ef32 = (v >> 23) & 0xff;
  const u64 mant = v & 0x7fffffu;
  const u64 m32 = ef32 == 0 ? mant : (mant | (u64{1} << 23));
  if (m32 == 0) return 0;
  const i32 e32 = ef32 == 0 ? -149 : static_cast<i32>(ef32) - 150;  // v = m32 x 2^e32
  const i32 frac = static_cast<i32>(f.bits - 2);
  const i32 e_r = e32 - shared_exp;  // v / 2^shared_exp = m32 x 2^e_r
  const i32 top = mx::detail::top_bit(m32) + e_r;  // floor(log2 |v / 2^shared_exp|)
  u64 q = static_cast<u64>(max_mantissa(f));
  if (top < 1) {  // below 2: in range but for rounding up to 2^(w-1), clamped below
    q = top < -frac - 1 ? 0 : mx::detail::rne_shift(m32, -frac - e_r);  // units of 2^-frac
    if (q > max_mantissa(f)) q = max_mantissa(f);
  }
  return sign != 0 ? -static_cast<i32>(q) : static_cast<i32>(q);
}

/// Encodes one block: `in` holds f.block float32 values as bits; writes block_bytes(f) bytes
/// in the wire layout.
constexpr void encode_block(format f, const u32* in, u8* out) {
  u32 max_abs = 0;
  bool special = false;
  for (u32 i = 0; i < f.block; ++i) {
    const u32 a = in[i] & 0x7fffffffu;
    special = special || a >= 0x7f800000u;
    max_abs = a > max_abs ? a : max_abs;
  }
  const u32 step = f.bits / 8;
  if (special) {
    out[0] = exp_nan;
    for (u32 i = 0; i < f.block * step; ++i) out[1 + i] = 0;
    return;
  }
  const i32 se = shared_exponent(max_abs);
  out[0] = static_cast<u8>(se + exp_bias);
  for (u32 i = 0; i < f.block; ++i) {
    const u32 m = static_cast<u32>(quantize(f, in[i], se));
    out[1 + i * step] = static_cast<u8>(m);
    if (step == 2) out[2 + i * step] = static_cast<u8>(m >> 8);
  }
}

/// quantize by float arithmetic, for native handlers and host code (eBPF has no floats), for a
/// value of a block whose shared exponent is `shared_exp` (|v| < 2^(shared_exp + 1)): the same
/// mantissa as quantize (test bfp), in the default floating-point environment. As
/// mx::quantize_native for MXINT8: scaling by a power of two is exact wherever the result can
/// round to a mantissa other than 0; rounding to the fixed point adds and subtracts 2^23 (round
/// to nearest, ties to even); the clamp is a select, so a loop over a block vectorises.
template <u32 Bits> inline i32 quantize_native(u32 v, i32 shared_exp) {
  static_assert(Bits == 8 || Bits == 16);
  constexpr float unit = static_cast<float>(1u << (Bits - 2));       // 2^frac
  constexpr float most = static_cast<float>((1u << (Bits - 1)) - 1);  // max_mantissa
  const float r = spin::detail::bit_cast<float>(v & 0x7fffffffu) * spin::detail::bit_cast<float>(mx::pow2_bits(-shared_exp));
  float q = (r * unit + 0x1p23f) - 0x1p23f;
  q = q < most ? q : most;
  const i32 m = static_cast<i32>(q);
  return (v >> 31) != 0 ? -m : m;
}

/// encode_block with quantize_native: the same bytes (test bfp).
template <u32 Block, u32 Bits> inline void encode_block_native(const u32* in, u8* out) {
  constexpr format f{Block, Bits};
  static_assert(valid(f));
  u32 max_abs = 0;
  u32 special = 0;
  for (u32 i = 0; i < Block; ++i) {
    const u32 a = in[i] & 0x7fffffffu;
    special |= a >= 0x7f800000u ? 1u : 0u;
    max_abs = a > max_abs ? a : max_abs;
  }
  if (special != 0) {
    out[0] = exp_nan;
    for (u32 i = 0; i < Block * Bits / 8; ++i) out[1 + i] = 0;
    return;
  }
  const i32 se = shared_exponent(max_abs);
  out[0] = static_cast<u8>(se + exp_bias);
  for (u32 i = 0; i < Block; ++i) {
    const u32 m = static_cast<u32>(quantize_native<Bits>(in[i], se));
    out[1 + i * (Bits / 8)] = static_cast<u8>(m);
    if constexpr (Bits == 16) out[2 + i * 2] = static_cast<u8>(m >> 8);
  }
}

/// Mantissa i of a block in the wire layout.
constexpr i32 mantissa(format f, const u8* block, u32 i) {
  // Sign extension by arithmetic: two's complement of the low `bits` bits.
  if (f.bits == 8) return static_cast<i32>(u32{block[1 + i]} ^ 0x80u) - 0x80;
  return static_cast<i32>((u32{block[1 + 2 * i]} | (u32{block[2 + 2 * i]} << 8)) ^ 0x8000u) - 0x8000;
}

/// Decodes one block in the wire layout into f.block float32 values as bits.
constexpr void decode_block(format f, const u8* block, u32* out) {
  for (u32 i = 0; i < f.block; ++i) out[i] = decode(f, block[0], mantissa(f, block, i));
}

} // namespace spin::coll::bfp
