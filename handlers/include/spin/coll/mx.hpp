// OCP Microscaling (MX) formats, v1.0 (Open Compute Project, "OCP Microscaling Formats (MX)
// Specification", version 1.0, September 2023): a block of 32 elements shares one E8M0 scale.
// This header is the one codec of spinnic's MX types: freestanding, constexpr and integer only
// (but for decode_native, which multiplies floats, for native handlers and host code), so NIC
// and switch handlers and host code (spin::coll, tests) share it. On eBPF, handlers decode
// with decode_of<E> (branch-free, so that DPDK's validator can load a loop over a block) and
// unpack; encode_block does not build for eBPF yet (clang's BPF back end puts its unrolled
// 32-element loop over the 512-byte stack), so encoding runs in native handlers.
//
// What it implements, with the spec's section:
//   - element encodings (section 5.3): FP8 E4M3 and E5M2 (bias 7 and 15; E4M3 has no infinity
//     and one NaN per sign, S.1111.111; E5M2 has infinities S.11111.00 and NaNs S.11111.{01,10,11}),
//     FP6 E3M2 and E2M3, FP4 E2M1 (bias 3, 1, 1; no infinity, no NaN), and INT8 (two's
//     complement with an implicit scale of 2^-6: -2 .. 127/64);
//   - the E8M0 scale (section 5.4): 2^(s - 127) for s = 0 .. 254; s = 255 is NaN, and a block
//     with a NaN scale decodes to NaN in every element;
//   - conversion of a block of float32 values (section 6.3): shared_exp = floor(log2(max |V_i|))
//     - emax_elem, with emax_elem the exponent of the element type's largest normal power of two
//     (E4M3 8, E5M2 15, E3M2 4, E2M3 2, E2M1 2, INT8 0), clamped to the scale's range -127 .. 127;
//     each element is V_i / 2^shared_exp rounded to nearest, ties to even, and a magnitude above
//     the element type's largest normal is clamped to it (saturation: E4M3 448, E5M2 57344,
//     E3M2 28, E2M3 7.5, E2M1 6, INT8 127/64; INT8 never encodes -128, so its range is
//     symmetric). A block whose values are all zero gets the smallest scale, 2^-127.
//   - Where the spec leaves a choice, spinnic's choice: a block with a NaN or infinite input
//     encodes the NaN scale (every element then decodes to NaN, as the spec defines for that
//     scale), with element codes 0; the sign of a zero input is kept where the element type
//     has a negative zero (the FP types), not in INT8.
// Decoding gives float32 bits: exact, except that a value beyond float32's range (large
// elements of any type under scales near 2^127, e.g. E2M1's 6 under 2^126) gives an infinity
// of its sign. A NaN decodes to the
// canonical quiet NaN 0x7fc00000.
//
// Wire layout of one block (block_bytes): the scale byte, then the 32 element codes packed:
// FP8 and INT8 one byte each; FP6 four codes in three bytes, code i at bits 6i .. 6i+5 of the
// little-endian bit string; FP4 two codes per byte, the even one in the low nibble.
#pragma once

#include <spin/handler.hpp>

namespace spin::coll::mx {

/// Elements per block (spec: k = 32 for every MX-compliant format).
inline constexpr u32 block_elements = 32;
/// The E8M0 scale's bias and its NaN code.
inline constexpr i32 scale_bias = 127;
inline constexpr u8 scale_nan = 0xff;
/// The canonical quiet NaN a decode returns.
inline constexpr u32 f32_nan = 0x7fc00000u;

/// MX element types (the `mxfp8_e4m3`, ..., `mxint8` datatypes).
enum class element : u8 { fp8_e4m3, fp8_e5m2, fp6_e3m2, fp6_e2m3, fp4_e2m1, int8 };
inline constexpr u32 element_count = 6;

/// Static names ("fp8_e4m3", ...); "?" for an unknown id.
constexpr const char* name(element e) {
  switch (e) {
  case element::fp8_e4m3: return "fp8_e4m3";
  case element::fp8_e5m2: return "fp8_e5m2";
  case element::fp6_e3m2: return "fp6_e3m2";
  case element::fp6_e2m3: return "fp6_e2m3";
  case element::fp4_e2m1: return "fp4_e2m1";
  case element::int8: return "int8";
  }
  return "?";
}

/// An element type's encoding parameters (section 5.3). For INT8 only bits and emax apply.
struct format {
  u32 bits = 8;          ///< code width
  u32 ebits = 0;         ///< exponent field width (0: INT8)
  u32 mbits = 0;         ///< mantissa field width
  i32 bias = 0;          ///< exponent bias
  i32 emax = 0;          ///< exponent of the largest normal power of two (emax_elem)
  u32 max_exp_field = 0; ///< the largest normal: exponent field ...
  u32 max_mantissa = 0;  ///< ... and mantissa field
};

constexpr format spec_of(element e) {
  switch (e) {
  case element::fp8_e4m3: return {8, 4, 3, 7, 8, 15, 6};
  case element::fp8_e5m2: return {8, 5, 2, 15, 15, 30, 3};
  case element::fp6_e3m2: return {6, 3, 2, 3, 4, 7, 3};
  case element::fp6_e2m3: return {6, 2, 3, 1, 2, 3, 7};
  case element::fp4_e2m1: return {4, 2, 1, 1, 2, 3, 1};
  case element::int8: return {8, 0, 0, 0, 0, 0, 0};
  }
  return {};
}

/// Bytes of one block on the wire: the scale byte and the packed codes (33, 25 or 17).
constexpr u32 block_bytes(element e) { return 1 + block_elements * spec_of(e).bits / 8; }

/// An element's value exactly: (-1)^sign x q x 2^exp2, or an infinity or a NaN.
struct exact {
  u32 sign = 0;
  u32 q = 0;     ///< at most 2^(mbits+1) - 1, or 128 for INT8
  i32 exp2 = 0;
  u8 kind = 0;   ///< 0 finite, 1 infinity, 2 NaN
};

/// The value of one element code (the code's low `bits` bits; higher bits are ignored).
constexpr exact decode_element(element e, u8 code) {
  const format f = spec_of(e);
  exact x;
  if (e == element::int8) {
    const i32 v = code >= 128 ? static_cast<i32>(code) - 256 : static_cast<i32>(code);
    x.sign = v < 0 ? 1u : 0u;
    x.q = static_cast<u32>(v < 0 ? -v : v);
    x.exp2 = -6;
    return x;
  }
  const u32 c = code & ((1u << f.bits) - 1);
  x.sign = c >> (f.bits - 1);
  const u32 ef = (c >> f.mbits) & ((1u << f.ebits) - 1);
  const u32 m = c & ((1u << f.mbits) - 1);
  if (e == element::fp8_e4m3 && ef == 15 && m == 7) {
    x.kind = 2;
    return x;
  }
  if (e == element::fp8_e5m2 && ef == 31) {
    x.kind = m == 0 ? 1 : 2;
    return x;
  }
  if (ef == 0) {
    x.q = m;
    x.exp2 = 1 - f.bias - static_cast<i32>(f.mbits);
  } else {
    x.q = m | (1u << f.mbits);
    x.exp2 = static_cast<i32>(ef) - f.bias - static_cast<i32>(f.mbits);
  }
  return x;
}

namespace detail {

/// Index of the highest set bit of v (v > 0).
constexpr i32 top_bit(u64 v) {
  i32 t = 0;
  for (u32 i = 0; i < 6; ++i) {  // binary search: steps of 32, 16, 8, 4, 2, 1 bits
    const u32 step = 32u >> i;
    if ((v >> step) != 0) {
      v >>= step;
      t += static_cast<i32>(step);
    }
  }
  return t;
}

/// v / 2^s rounded to nearest, ties to even (v < 2^40); v x 2^-s for s <= 0 (s >= -16).
constexpr u64 rne_shift(u64 v, i32 s) {
  if (s <= 0) return v << static_cast<u32>(-s);
  if (s >= 48) return 0;
  const u64 q = v >> static_cast<u32>(s);
  const u64 rem = v & ((u64{1} << static_cast<u32>(s)) - 1);
  const u64 half = u64{1} << static_cast<u32>(s - 1);
  return q + ((rem > half || (rem == half && (q & 1) != 0)) ? 1 : 0);
}

/// float32 bits of (-1)^sign x q x 2^exp2 (q < 2^24): correctly rounded (nearest, ties to
/// even); beyond float32's range an infinity of that sign.
constexpr u32 f32_from(u32 sign, u64 q, i32 exp2) {
  const u32 s = sign << 31;
  if (q == 0) return s;
  const i32 t = top_bit(q);
  const i32 e = exp2 + t;  // value = 1.f x 2^e
  if (e > 127) return s | 0x7f800000u;
  if (e >= -126) {
    // A normal: round q to 24 significant bits (q < 2^24 already is).
    const u64 m = t > 23 ? rne_shift(q, t - 23) : q << static_cast<u32>(23 - t);
    // A carry out of rounding gives 2^24, which moves into the exponent field: still right.
    return s | static_cast<u32>((static_cast<u64>(e + 126) << 23) + m);
  }
  // A subnormal: q x 2^exp2 in units of 2^-149.
  return s | static_cast<u32>(rne_shift(q, -149 - exp2));
}

} // namespace detail

/// float32 bits of element `code` under scale byte `scale` (0x7fc00000 for any NaN).
constexpr u32 decode(element e, u8 scale, u8 code) {
  if (scale == scale_nan) return f32_nan;
  const exact x = decode_element(e, code);
  if (x.kind == 2) return f32_nan;
  if (x.kind == 1) return (x.sign << 31) | 0x7f800000u;
  return detail::f32_from(x.sign, x.q, x.exp2 + static_cast<i32>(scale) - scale_bias);
}

namespace detail {
/// All ones when a < 0, else 0. The operand is hidden from the optimiser before the shift and
/// the bit after it: clang would otherwise turn the shift back into a comparison, which eBPF
/// can only materialise with a branch.
/// The mask itself is hidden too: known to be 0 or all ones, `(m & a) | (~m & b)` would become
/// a select, which is a branch again.
constexpr u32 neg_mask(i32 a) {
  return spin::detail::opaque(0u - spin::detail::opaque(spin::detail::opaque(static_cast<u32>(a)) >> 31));
}
/// All ones when a == 0, else 0 (hidden like neg_mask).
constexpr u32 zero_mask(u32 a) { return spin::detail::opaque(0u - (1 - spin::detail::nonzero(a))); }
} // namespace detail

/// decode for an element type known at compile time, without a branch: what eBPF handlers use.
/// Each branch in a loop over a block's 32 elements doubles the paths DPDK's validator walks
/// when it loads the program; 32 of them make a program it cannot load. Same bits as decode
/// for every scale and code (test mx).
template <element E> constexpr u32 decode_of(u8 scale, u8 code) {
  using detail::neg_mask;
  using detail::zero_mask;
  constexpr format f = spec_of(E);
  u32 sign = 0, q = 0, nan_m = 0, inf_m = 0;
  i32 exp2 = -6;
  if constexpr (E == element::int8) {
    const u32 neg = spin::detail::opaque(0u - (static_cast<u32>(code) >> 7));
    sign = neg & 1;
    q = ((static_cast<u32>(code) | (neg << 8)) ^ neg) - neg;  // |two's complement value|, 0 .. 128
  } else {
    const u32 c = code & ((1u << f.bits) - 1);
    sign = c >> (f.bits - 1);
    const u32 ef = (c >> f.mbits) & ((1u << f.ebits) - 1);
    const u32 m = c & ((1u << f.mbits) - 1);
    const u32 normal = spin::detail::nonzero(ef);
    q = m | (normal << f.mbits);
    exp2 = static_cast<i32>(ef + (1 - normal)) - f.bias - static_cast<i32>(f.mbits);
    if constexpr (E == element::fp8_e4m3) nan_m = zero_mask((ef ^ 15) | (m ^ 7));
    if constexpr (E == element::fp8_e5m2) {
      const u32 top = zero_mask(ef ^ 31);
      nan_m = top & ~zero_mask(m);
      inf_m = top & zero_mask(m);
    }
  }
  // q x 2^x with q <= 128: 1.f x 2^e, a float32 subnormal, or beyond float32's range.
  const i32 x = exp2 + static_cast<i32>(scale) - scale_bias;
  u32 t = 0;  // floor(log2 q) for q >= 1
  for (u32 k = 1; k < 8; ++k) t += static_cast<u32>(lt(u64{(1u << k) - 1}, u64{q}));
  const i32 e = x + static_cast<i32>(t);
  const u32 normal_bits = (static_cast<u32>(e + 127) << 23) + ((q << (23 - t)) & 0x7fffffu);
  const u32 sub_bits = q << (static_cast<u32>(x + 149) & 31);  // used only when e < -126: x + 149 in 0 .. 22
  const u32 is_sub = neg_mask(e + 126), is_ovf = neg_mask(127 - e);
  u32 mag = (sub_bits & is_sub) | (normal_bits & ~is_sub);
  mag = (0x7f800000u & is_ovf) | (mag & ~is_ovf);
  mag &= ~zero_mask(q);
  u32 r = (sign << 31) | mag;
  r = (inf_m & ((sign << 31) | 0x7f800000u)) | (r & ~inf_m);
  const u32 nan_all = nan_m | zero_mask(static_cast<u32>(scale) ^ scale_nan);
  return (nan_all & f32_nan) | (r & ~nan_all);
}

/// The element code of float32 bits `v` divided by 2^shared_exp (finite v), rounded to
/// nearest, ties to even, magnitudes above the largest normal clamped to it (section 6.3), for
/// an element type known at compile time (quantize dispatches to it).
template <element E> constexpr u8 quantize_of(u32 v, i32 shared_exp) {
  constexpr format f = spec_of(E);
  const u32 sign = v >> 31;
  const u32 ef32 = (v >> 23) & 0xff;
  const u64 mant = v & 0x7fffffu;
  const u64 m32 = ef32 == 0 ? mant : (mant | (u64{1} << 23));
  const i32 e32 = ef32 == 0 ? -149 : static_cast<i32>(ef32) - 150;  // v = m32 x 2^e32
  if (m32 == 0) return E == element::int8 ? u8{0} : static_cast<u8>(sign << (f.bits - 1));
  const i32 e_r = e32 - shared_exp;  // r = v / 2^shared_exp = m32 x 2^e_r
  if constexpr (E == element::int8) {
    if (detail::top_bit(m32) + e_r >= 7) return static_cast<u8>(sign != 0 ? 0x81 : 0x7f);  // |r| >= 128: clamped
    u64 q = detail::rne_shift(m32, -6 - e_r);  // units of 2^-6
    if (q > 127) q = 127;
    const i32 iv = sign != 0 ? -static_cast<i32>(q) : static_cast<i32>(q);
    return static_cast<u8>(iv & 0xff);
  } else {
    const i32 k = detail::top_bit(m32) + e_r;  // floor(log2 r)
    const i32 emin = 1 - f.bias;
    i32 uexp = (k > emin ? k : emin) - static_cast<i32>(f.mbits);  // the ulp at r's binade
    // Far below the smallest subnormal the shift is large and q is 0; far above, the code saturates.
    const i32 top = static_cast<i32>(f.max_exp_field) - f.bias + 2;  // above every finite code
    u32 ef = 0, m = 0;
    if (k >= top) {
      ef = f.max_exp_field;
      m = f.max_mantissa;
    } else {
      u64 q = detail::rne_shift(m32, uexp - e_r);
      if (q >= (u64{1} << (f.mbits + 1))) {  // rounding carried into the next binade
        q >>= 1;
        ++uexp;
      }
      if (q == 0) return static_cast<u8>(sign << (f.bits - 1));
      if (q < (u64{1} << f.mbits)) {  // subnormal
        ef = 0;
        m = static_cast<u32>(q);
      } else {
        const i32 efi = uexp + static_cast<i32>(f.mbits) + f.bias;
        ef = static_cast<u32>(efi);
        m = static_cast<u32>(q) - (1u << f.mbits);
        if (ef > f.max_exp_field || (ef == f.max_exp_field && m > f.max_mantissa)) {
          ef = f.max_exp_field;
          m = f.max_mantissa;
        }
      }
    }
    return static_cast<u8>((sign << (f.bits - 1)) | (ef << f.mbits) | m);
  }
}

/// quantize_of for an element type given at run time.
constexpr u8 quantize(element e, u32 v, i32 shared_exp) {
  switch (e) {
  case element::fp8_e4m3: return quantize_of<element::fp8_e4m3>(v, shared_exp);
  case element::fp8_e5m2: return quantize_of<element::fp8_e5m2>(v, shared_exp);
  case element::fp6_e3m2: return quantize_of<element::fp6_e3m2>(v, shared_exp);
  case element::fp6_e2m3: return quantize_of<element::fp6_e2m3>(v, shared_exp);
  case element::fp4_e2m1: return quantize_of<element::fp4_e2m1>(v, shared_exp);
  case element::int8: return quantize_of<element::int8>(v, shared_exp);
  }
  return 0;
}

/// The shared exponent of a block whose largest magnitude has float32 bits `max_abs` (finite,
/// sign bit clear): floor(log2 max_abs) - emax_elem, clamped to -127 .. 127; -127 for zero.
constexpr i32 shared_exponent(element e, u32 max_abs) {
  if (max_abs == 0) return -scale_bias;
  const u32 ef32 = max_abs >> 23;
  const i32 flog2 = ef32 == 0 ? detail::top_bit(max_abs) - 149 : static_cast<i32>(ef32) - 127;
  i32 se = flog2 - spec_of(e).emax;
  if (se < -scale_bias) se = -scale_bias;
  if (se > scale_bias) se = scale_bias;
  return se;
}

/// Encodes one block: `in` holds 32 float32 values as bits; writes the scale byte and one code
/// per element (unpacked, codes[i] for in[i]). Returns the scale byte.
template <element E> constexpr u8 encode_block_of(const u32* in, u8* codes) {
  u32 max_abs = 0;
  bool special = false;
  for (u32 i = 0; i < block_elements; ++i) {
    const u32 a = in[i] & 0x7fffffffu;
    special = special || a >= 0x7f800000u;
    max_abs = a > max_abs ? a : max_abs;
  }
  if (special) {
    for (u32 i = 0; i < block_elements; ++i) codes[i] = 0;
    return scale_nan;
  }
  const i32 se = shared_exponent(E, max_abs);
  for (u32 i = 0; i < block_elements; ++i) codes[i] = quantize_of<E>(in[i], se);
  return static_cast<u8>(se + scale_bias);
}
/// encode_block_of for an element type given at run time.
constexpr u8 encode_block(element e, const u32* in, u8* codes) {
  switch (e) {
  case element::fp8_e4m3: return encode_block_of<element::fp8_e4m3>(in, codes);
  case element::fp8_e5m2: return encode_block_of<element::fp8_e5m2>(in, codes);
  case element::fp6_e3m2: return encode_block_of<element::fp6_e3m2>(in, codes);
  case element::fp6_e2m3: return encode_block_of<element::fp6_e2m3>(in, codes);
  case element::fp4_e2m1: return encode_block_of<element::fp4_e2m1>(in, codes);
  case element::int8: return encode_block_of<element::int8>(in, codes);
  }
  return scale_nan;
}

/// Packs 32 codes into the wire layout's element bytes (block_bytes(e) - 1 of them).
constexpr void pack(element e, const u8* codes, u8* out) {
  const u32 bits = spec_of(e).bits;
  if (bits == 8) {
    for (u32 i = 0; i < block_elements; ++i) out[i] = codes[i];
  } else if (bits == 4) {
    for (u32 i = 0; i < block_elements / 2; ++i)
      out[i] = static_cast<u8>((codes[2 * i] & 0xf) | ((codes[2 * i + 1] & 0xf) << 4));
  } else {  // 6 bits: four codes in three bytes
    for (u32 g = 0; g < block_elements / 4; ++g) {
      const u32 w = (codes[4 * g] & 0x3fu) | (u32(codes[4 * g + 1] & 0x3fu) << 6) | (u32(codes[4 * g + 2] & 0x3fu) << 12) |
                    (u32(codes[4 * g + 3] & 0x3fu) << 18);
      out[3 * g] = static_cast<u8>(w);
      out[3 * g + 1] = static_cast<u8>(w >> 8);
      out[3 * g + 2] = static_cast<u8>(w >> 16);
    }
  }
}

/// Unpacks the element bytes of the wire layout into 32 codes.
constexpr void unpack(element e, const u8* in, u8* codes) {
  const u32 bits = spec_of(e).bits;
  if (bits == 8) {
    for (u32 i = 0; i < block_elements; ++i) codes[i] = in[i];
  } else if (bits == 4) {
    for (u32 i = 0; i < block_elements / 2; ++i) {
      codes[2 * i] = in[i] & 0xf;
      codes[2 * i + 1] = static_cast<u8>(in[i] >> 4);
    }
  } else {
    for (u32 g = 0; g < block_elements / 4; ++g) {
      const u32 w = u32(in[3 * g]) | (u32(in[3 * g + 1]) << 8) | (u32(in[3 * g + 2]) << 16);
      for (u32 j = 0; j < 4; ++j) codes[4 * g + j] = static_cast<u8>((w >> (6 * j)) & 0x3f);
    }
  }
}

/// 2^(scale - 127) as float32 bits, for scale bytes 0 .. 254 (2^-127 is a subnormal: exact).
constexpr u32 scale_bits(u8 scale) { return scale == 0 ? 0x00400000u : static_cast<u32>(scale) << 23; }

/// decode by float arithmetic, for native handlers and host code (eBPF has no floats): the
/// element's value, exact in float32, times the scale's power of two, one correctly rounded
/// multiplication, so the same bits as decode for every scale and code (test mx), in the
/// default floating-point environment (round to nearest, no flush-to-zero: handlers and spinnic
/// are not built with fast-math). `scale` is the block's scale byte. About ten times faster than decode: what the collectives' block
/// reductions use.
template <element E> inline u32 decode_native(u8 scale, u8 code) {
  constexpr format f = spec_of(E);
  // Selects, not branches: a loop over a block's elements then vectorises.
  u32 v = 0;  // the element's value under scale 2^0, as float32 bits (exact)
  if constexpr (E == element::int8) {
    v = spin::detail::bit_cast<u32>(static_cast<float>(static_cast<i32>(code ^ 0x80u) - 0x80) * 0.015625f);  // x 2^-6
  } else {
    const u32 c = code & ((1u << f.bits) - 1);
    const u32 sign = c >> (f.bits - 1);
    const u32 ef = (c >> f.mbits) & ((1u << f.ebits) - 1);
    const u32 m = c & ((1u << f.mbits) - 1);
    // A normal's float32 bits directly; a subnormal is m x 2^(1 - bias - mbits), exact too.
    const u32 normal = (sign << 31) | ((ef + 127 - static_cast<u32>(f.bias)) << 23) | (m << (23 - f.mbits));
    constexpr float sub_ulp = static_cast<float>(1.0 / static_cast<double>(1u << (f.bias - 1 + static_cast<i32>(f.mbits))));
    const u32 sub = spin::detail::bit_cast<u32>(static_cast<float>(m) * sub_ulp) | (sign << 31);
    v = ef != 0 ? normal : sub;
  }
  u32 r = spin::detail::bit_cast<u32>(spin::detail::bit_cast<float>(v) * spin::detail::bit_cast<float>(scale_bits(scale)));
  if constexpr (E == element::fp8_e4m3) r = (code & 0x7fu) == 0x7fu ? f32_nan : r;  // S.1111.111
  if constexpr (E == element::fp8_e5m2) {
    const u32 m = code & 3u;
    const u32 special = m == 0 ? ((code & 0x80u) << 24) | 0x7f800000u : f32_nan;  // S.11111.00 infinity, else NaN
    r = (code & 0x7cu) == 0x7cu ? special : r;
  }
  return scale == scale_nan ? f32_nan : r;
}

/// 2^k as float32 bits, k in -127 .. 127.
constexpr u32 pow2_bits(i32 k) { return k >= -126 ? static_cast<u32>(k + 127) << 23 : 0x00400000u; }

/// quantize_of by float arithmetic, for native handlers and host code (eBPF has no floats), for
/// values of a block whose shared exponent is `shared_exp` (|v| < 2^(shared_exp + emax + 2)):
/// the same code as quantize_of (test mx), in the default floating-point environment. Scaling by
/// powers of two is exact but where the scaled value falls below float32's normal range, and
/// there every element type's code is 0 (of the value's sign) either way; rounding to the
/// element's grid adds and subtracts 2^23 (round to nearest, ties to even). Selects, not
/// branches: a loop over a block vectorises. About ten times faster than quantize_of: what the
/// collectives' block reductions use.
template <element E> inline u8 quantize_native(u32 v, i32 shared_exp) {
  constexpr format f = spec_of(E);
  const u32 sign = v >> 31;
  const float r = spin::detail::bit_cast<float>(v & 0x7fffffffu) * spin::detail::bit_cast<float>(pow2_bits(-shared_exp));
  if constexpr (E == element::int8) {
    float q = (r * 64.0f + 0x1p23f) - 0x1p23f;  // units of 2^-6, rounded
    q = q < 127.0f ? q : 127.0f;                 // symmetric: never -128
    const u32 m = static_cast<u32>(q);
    return static_cast<u8>((sign != 0 ? 0u - m : m) & 0xffu);
  } else {
    constexpr i32 emin = 1 - f.bias;
    constexpr u32 mmask = (1u << f.mbits) - 1;
    // The largest normal, (2^m + max_mantissa) x 2^(max_exp_field - bias - m), and 2^emin.
    const float max_normal = static_cast<float>((1u << f.mbits) + f.max_mantissa) *
                                 spin::detail::bit_cast<float>(pow2_bits(static_cast<i32>(f.max_exp_field) - f.bias - static_cast<i32>(f.mbits)));
    const float min_normal = spin::detail::bit_cast<float>(pow2_bits(emin));
    const i32 er = static_cast<i32>(spin::detail::bit_cast<u32>(r) >> 23) - 127;  // floor(log2 r); -127 below normal
    const i32 eu = (er > emin ? er : emin) - static_cast<i32>(f.mbits);           // the ulp at r's binade
    const float q = (r * spin::detail::bit_cast<float>(pow2_bits(-eu)) + 0x1p23f) - 0x1p23f;
    float y = q * spin::detail::bit_cast<float>(pow2_bits(eu));  // r rounded to the grid, exact
    y = y < max_normal ? y : max_normal;
    const u32 yb = spin::detail::bit_cast<u32>(y);
    const u32 normal = ((static_cast<u32>(static_cast<i32>(yb >> 23) - 127 + f.bias)) << f.mbits) | ((yb >> (23 - f.mbits)) & mmask);
    const u32 sub = static_cast<u32>(y * spin::detail::bit_cast<float>(pow2_bits(static_cast<i32>(f.mbits) - emin)));
    const u32 code = y >= min_normal ? normal : sub;
    return static_cast<u8>((sign << (f.bits - 1)) | code);
  }
}

/// encode_block_of with quantize_native: the same scale and codes (test mx).
template <element E> inline u8 encode_block_native(const u32* in, u8* codes) {
  u32 max_abs = 0;
  u32 special = 0;
  for (u32 i = 0; i < block_elements; ++i) {
    const u32 a = in[i] & 0x7fffffffu;
    special |= a >= 0x7f800000u ? 1u : 0u;
    max_abs = a > max_abs ? a : max_abs;
  }
  if (special != 0) {
    for (u32 i = 0; i < block_elements; ++i) codes[i] = 0;
    return scale_nan;
  }
  const i32 se = shared_exponent(E, max_abs);
  for (u32 i = 0; i < block_elements; ++i) codes[i] = quantize_native<E>(in[i], se);
  return static_cast<u8>(se + scale_bias);
}

/// Element code i (0 .. 31) of a block's packed codes (the wire layout's element bytes).
constexpr u8 code_at(element e, const u8* packed, u32 i) {
  const u32 bits = spec_of(e).bits;
  if (bits == 8) return packed[i];
  if (bits == 4) return static_cast<u8>((packed[i / 2] >> (4 * (i % 2))) & 0xf);
  const u32 bit = 6 * i, lo = bit / 8, sh = bit % 8;  // a code spans at most two bytes
  const u32 w = u32{packed[lo]} | (sh > 2 ? u32{packed[lo + 1]} << 8 : 0u);
  return static_cast<u8>((w >> sh) & 0x3f);
}

/// Decodes one block in the wire layout (`block_bytes(e)` bytes: the scale, then the packed
/// codes) into 32 float32 values as bits.
constexpr void decode_block(element e, const u8* block, u32* out) {
  u8 codes[block_elements] = {};
  unpack(e, block + 1, codes);
  for (u32 i = 0; i < block_elements; ++i) out[i] = decode(e, block[0], codes[i]);
}

/// encode_packed for an element type known at compile time: the same bytes, without a
/// run-time dispatch per element (integer arithmetic: any target).
template <element E> constexpr void encode_packed_of(const u32* in, u8* block) {
  u8 codes[block_elements] = {};
  block[0] = encode_block_of<E>(in, codes);
  pack(E, codes, block + 1);
}

/// encode_packed_of with encode_block_native: the same bytes, by float arithmetic (native
/// handlers and host code). What the collectives' block reductions use.
template <element E> inline void encode_packed_native(const u32* in, u8* block) {
  u8 codes[block_elements] = {};
  block[0] = encode_block_native<E>(in, codes);
  pack(E, codes, block + 1);
}

/// Encodes 32 float32 values (as bits) into one block in the wire layout (`block_bytes(e)`
/// bytes): encode_block, then pack.
constexpr void encode_packed(element e, const u32* in, u8* block) {
  u8 codes[block_elements] = {};
  block[0] = encode_block(e, in, codes);
  pack(e, codes, block + 1);
}

} // namespace spin::coll::mx
