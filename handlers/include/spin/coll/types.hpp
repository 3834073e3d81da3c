// Datatypes and reduction operations of the collectives, freestanding: the same definitions
// run in NIC and switch handlers (compiled by spinc) and in host code (spin::coll, tests).
//
// A reduction is three functions on one element (docs/collectives.md, "Reductions"):
//   widen(x)      element -> accumulator (exact for every standard type)
//   combine(a, b) accumulator x accumulator -> accumulator; a holds the contributions of the
//                 ranks that come earlier in the combination order, b the later ones
//   narrow(a)     accumulator -> element, the one rounding step
// Narrow floats (float16, bfloat16) accumulate in float32 and are rounded once, at the end
// (Hoefler, Khalilov et al. 2026, obstacle 1). Every collective combines contributions in a
// fixed order (docs/collectives.md, "Combination order"), so float results do not depend on
// arrival order.
//
// Semantics (independent of arrival order, loss and retransmission):
//   - integers: sum and prod wrap modulo 2^bits (two's complement); min/max are exact.
//   - floats: IEEE 754 binary arithmetic with round-to-nearest-even in the accumulator type;
//     overflow gives infinity; a NaN result is the canonical quiet NaN (positive, payload 0:
//     0x7fc00000 for float32, 0x7ff8000000000000 for float64, 0x7e00 for float16, 0x7fc0 for
//     bfloat16), whatever NaNs the inputs carried;
//   - float min/max propagate NaN (any NaN operand gives NaN, IEEE 754-2019 minimum/maximum)
//     and order -0 below +0, which makes them commutative and associative. (The handler API's
//     float_min/float_max atomics follow minNum/maxNum instead.)
//   - block formats (MX, BFP): an element is a block; widen decodes it into float32 values
//     (exactly: every MX and BFP value is a float32, except values past float32's range, which
//     only scales near 2^127 make and become infinities), combine works on those float32
//     values as above, and
//     narrow encodes the block once, choosing its scale from the float32 result (Hoefler,
//     Khalilov et al. 2026, obstacle 2: never accumulate in the narrow type). The result is
//     therefore encode(the float32 reduction in the fixed order), bit for bit; a block with a
//     NaN or an infinity in that result encodes as the NaN block.
#pragma once

#include <spin/coll/bfp.hpp>
#include <spin/coll/mx.hpp>
#include <spin/coll/sparse.hpp>
#include <spin/handler.hpp>

namespace spin::coll {

/// Datatype ids (`coll_desc::dtype` on the wire).
enum class dtype : u8 {
  f32 = 1,
  f64 = 2,
  f16 = 3,   ///< IEEE binary16
  bf16 = 4,  ///< bfloat16 (the upper half of a float32)
  i32 = 5,
  i64 = 6,
  u32 = 7,
  u64 = 8,
  // Block formats (docs/collectives.md, "Block formats"): one element is a whole block, as it
  // travels (block_values values in block_bytes bytes); sum, min and max only.
  mxfp8_e4m3 = 9,   ///< OCP MX v1.0: 32 FP8 E4M3 elements and an E8M0 scale (33 bytes)
  mxfp8_e5m2 = 10,  ///< OCP MX v1.0: 32 FP8 E5M2 (33 bytes)
  mxfp6_e3m2 = 11,  ///< OCP MX v1.0: 32 FP6 E3M2 (25 bytes)
  mxfp6_e2m3 = 12,  ///< OCP MX v1.0: 32 FP6 E2M3 (25 bytes)
  mxfp4_e2m1 = 13,  ///< OCP MX v1.0: 32 FP4 E2M1 (17 bytes)
  mxint8 = 14,      ///< OCP MX v1.0: 32 INT8 (33 bytes)
  bfp8_16 = 15,     ///< block floating point: 16 8-bit mantissas, one 8-bit exponent (17 bytes)
  bfp8_32 = 16,     ///< 32 8-bit mantissas (33 bytes; the same bits as mxint8)
  bfp16_16 = 17,    ///< 16 16-bit mantissas (33 bytes)
  bfp16_32 = 18,    ///< 32 16-bit mantissas (65 bytes)
  // Sparse windows (spin/coll/sparse.hpp, docs/collectives.md "Sparse allreduce"): one element
  // is a window of sparse::window_values values in pairs or dense form, sent in as many bytes as
  // its form takes; sum only, float32 accumulators. allreduce_sparse uses them.
  sparse_f32 = 19,   ///< float32 values (a window: at most 4084 bytes)
  sparse_bf16 = 20,  ///< bfloat16 values (at most 2044 bytes)
  sparse_f16 = 21,   ///< float16 values (at most 2044 bytes)
  // Sparse windows of OCP MX values (sparse.hpp, "windows of MX values": 32 blocks with E8M0
  // scales; codes listed by offset, or dense); sum only, float32 accumulators.
  sparse_mxfp8_e4m3 = 22,  ///< FP8 E4M3 codes (at most 1060 bytes)
  sparse_mxfp8_e5m2 = 23,  ///< FP8 E5M2 (1060)
  sparse_mxfp6_e3m2 = 24,  ///< FP6 E3M2 (804)
  sparse_mxfp6_e2m3 = 25,  ///< FP6 E2M3 (804)
  sparse_mxfp4_e2m1 = 26,  ///< FP4 E2M1 (548)
  sparse_mxint8 = 27,      ///< INT8 (1060)
  custom = 255,  ///< a user reduction's own element type
};

/// Reduction operation ids (`coll_desc::op` on the wire).
enum class op : u8 {
  sum = 1,
  min = 2,
  max = 3,
  prod = 4,
  custom = 255,  ///< a user reduction
};

/// Static names ("f32", "sum", ...); "?" for an unknown id.
constexpr const char* name(dtype t) {
  switch (t) {
  case dtype::f32: return "f32";
  case dtype::f64: return "f64";
  case dtype::f16: return "f16";
  case dtype::bf16: return "bf16";
  case dtype::i32: return "i32";
  case dtype::i64: return "i64";
  case dtype::u32: return "u32";
  case dtype::u64: return "u64";
  case dtype::mxfp8_e4m3: return "mxfp8_e4m3";
  case dtype::mxfp8_e5m2: return "mxfp8_e5m2";
  case dtype::mxfp6_e3m2: return "mxfp6_e3m2";
  case dtype::mxfp6_e2m3: return "mxfp6_e2m3";
  case dtype::mxfp4_e2m1: return "mxfp4_e2m1";
  case dtype::mxint8: return "mxint8";
  case dtype::bfp8_16: return "bfp8_16";
  case dtype::bfp8_32: return "bfp8_32";
  case dtype::bfp16_16: return "bfp16_16";
  case dtype::bfp16_32: return "bfp16_32";
  case dtype::sparse_f32: return "sparse_f32";
  case dtype::sparse_bf16: return "sparse_bf16";
  case dtype::sparse_f16: return "sparse_f16";
  case dtype::sparse_mxfp8_e4m3: return "sparse_mxfp8_e4m3";
  case dtype::sparse_mxfp8_e5m2: return "sparse_mxfp8_e5m2";
  case dtype::sparse_mxfp6_e3m2: return "sparse_mxfp6_e3m2";
  case dtype::sparse_mxfp6_e2m3: return "sparse_mxfp6_e2m3";
  case dtype::sparse_mxfp4_e2m1: return "sparse_mxfp4_e2m1";
  case dtype::sparse_mxint8: return "sparse_mxint8";
  case dtype::custom: return "custom";
  }
  return "?";
}
constexpr const char* name(op o) {
  switch (o) {
  case op::sum: return "sum";
  case op::min: return "min";
  case op::max: return "max";
  case op::prod: return "prod";
  case op::custom: return "custom";
  }
  return "?";
}

// ---- bit-exact conversions ---------------------------------------------------------------------

/// float32 bits -> float16 bits, round to nearest even; overflow gives infinity; NaN gives the
/// canonical 0x7e00 (with the sign cleared).
constexpr u16 f32_to_f16_bits(u32 x) {
  const u32 sign = (x >> 16) & 0x8000u;
  const u32 a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7e00u;                     // NaN
  if (a >= 0x477ff000u) return static_cast<u16>(sign | 0x7c00u);  // rounds to or above 65520: inf
  if (a < 0x38800000u) {                                    // below 2^-14: float16 subnormal or 0
    if (a < 0x33000000u) return static_cast<u16>(sign);     // at most 2^-25: rounds to zero
    const u32 e = a >> 23;                                  // 102..112
    const u32 m = (a & 0x7fffffu) | 0x800000u;
    const u32 shift = 126 - e;                              // 14..24
    u32 q = m >> shift;
    const u32 rest = m & ((1u << shift) - 1);
    const u32 half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
    return static_cast<u16>(sign | q);
  }
  const u32 r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;  // round on the 13 dropped bits
  return static_cast<u16>(sign | (r >> 13));
}

/// float16 bits -> float32 bits (exact). NaN payloads are kept.
constexpr u32 f16_to_f32_bits(u16 h) {
  const u32 sign = static_cast<u32>(h & 0x8000u) << 16;
  const u32 e = (h >> 10) & 0x1fu;
  u32 m = h & 0x3ffu;
  if (e == 0x1f) return sign | 0x7f800000u | (m << 13);
  if (e == 0) {
    if (m == 0) return sign;
    u32 s = 0;
    for (u32 i = 0; i < 10; ++i) {  // normalise the subnormal (at most 10 steps)
      if ((m & 0x400u) != 0) break;
      m <<= 1;
      ++s;
    }
    return sign | ((113 - s) << 23) | ((m & 0x3ffu) << 13);
  }
  return sign | ((e + 112) << 23) | (m << 13);
}

/// float32 bits -> bfloat16 bits, round to nearest even; NaN gives the canonical 0x7fc0.
constexpr u16 f32_to_bf16_bits(u32 x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return static_cast<u16>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
/// bfloat16 bits -> float32 bits (exact).
constexpr u32 bf16_to_f32_bits(u16 h) { return static_cast<u32>(h) << 16; }

namespace detail {
template <class F> constexpr bool is_nan(F v) { return v != v; }
template <class F> struct float_bits;
template <> struct float_bits<float> {
  using word = u32;
  static constexpr word canonical_nan = 0x7fc00000u;
  static constexpr word sign = 0x80000000u;
};
template <> struct float_bits<double> {
  using word = u64;
  static constexpr word canonical_nan = 0x7ff8000000000000ull;
  static constexpr word sign = 0x8000000000000000ull;
};
template <class F> F canonical(F v) {
  return is_nan(v) ? spin::detail::bit_cast<F>(float_bits<F>::canonical_nan) : v;
}
template <class F> bool sign_bit(F v) {
  return (spin::detail::bit_cast<typename float_bits<F>::word>(v) & float_bits<F>::sign) != 0;
}
// minimum/maximum of IEEE 754-2019: NaN propagates, -0 < +0.
template <class F> F fmin(F a, F b) {
  if (is_nan(a) || is_nan(b)) return spin::detail::bit_cast<F>(float_bits<F>::canonical_nan);
  if (a < b) return a;
  if (b < a) return b;
  return sign_bit(a) ? a : b;
}
template <class F> F fmax(F a, F b) {
  if (is_nan(a) || is_nan(b)) return spin::detail::bit_cast<F>(float_bits<F>::canonical_nan);
  if (a > b) return a;
  if (b > a) return b;
  return sign_bit(a) ? b : a;
}
// Wrapping integer arithmetic through the unsigned type (signed overflow is undefined in C++).
template <class T> struct unsigned_of;
template <> struct unsigned_of<i32> { using type = u32; };
template <> struct unsigned_of<i64> { using type = u64; };
template <> struct unsigned_of<u32> { using type = u32; };
template <> struct unsigned_of<u64> { using type = u64; };
template <class T> T wrap_add(T a, T b) {
  using U = typename unsigned_of<T>::type;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}
template <class T> T wrap_mul(T a, T b) {
  using U = typename unsigned_of<T>::type;
  return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
}
} // namespace detail

// ---- the standard reductions ---------------------------------------------------------------------
// Each is a type with `elem` and `acc` (element and accumulator types) and static widen,
// combine and narrow: the shape a user's reduction has too (docs/handler-guide.md,
// "Custom reductions").

/// A float16 element as stored (its bits).
struct f16_bits {
  u16 bits;
};
/// A bfloat16 element as stored (its bits).
struct bf16_bits {
  u16 bits;
};

namespace detail {
template <class T> struct int_ops {
  using elem = T;
  using acc = T;
  static acc widen(elem x) { return x; }
  static elem narrow(acc a) { return a; }
};
template <class F> struct float_ops {
  using elem = F;
  using acc = F;
  static acc widen(elem x) { return x; }
  static elem narrow(acc a) { return canonical(a); }
};
struct f16_ops {
  using elem = f16_bits;
  using acc = float;
  static acc widen(elem x) { return spin::detail::bit_cast<float>(f16_to_f32_bits(x.bits)); }
  static elem narrow(acc a) { return elem{f32_to_f16_bits(spin::detail::bit_cast<u32>(a))}; }
};
struct bf16_ops {
  using elem = bf16_bits;
  using acc = float;
  static acc widen(elem x) { return spin::detail::bit_cast<float>(bf16_to_f32_bits(x.bits)); }
  static elem narrow(acc a) { return elem{f32_to_bf16_bits(spin::detail::bit_cast<u32>(a))}; }
};
/// A block format as the reductions see it: `values` float32 values in `bytes` bytes.
template <mx::element E> struct mx_codec {
  static constexpr u32 values = mx::block_elements;
  static constexpr u32 bytes = mx::block_bytes(E);
  static void decode(const u8* in, u32* out) {
    for (u32 i = 0; i < values; ++i) out[i] = value(in, i);
  }
  static u32 value(const u8* in, u32 i) { return mx::decode_native<E>(in[0], mx::code_at(E, in + 1, i)); }
  static void encode(const u32* in, u8* out) { mx::encode_packed_native<E>(in, out); }
};
template <u32 Block, u32 Bits> struct bfp_codec {
  static constexpr bfp::format f{Block, Bits};
  static constexpr u32 values = Block;
  static constexpr u32 bytes = bfp::block_bytes(f);
  static u32 value(const u8* in, u32 i) { return bfp::decode_native(f, in[0], bfp::mantissa(f, in, i)); }
  static void decode(const u8* in, u32* out) {
    for (u32 i = 0; i < values; ++i) out[i] = value(in, i);
  }
  static void encode(const u32* in, u8* out) { bfp::encode_block_native<Block, Bits>(in, out); }
};
/// The value forms every reduction has (widen, combine, narrow), for a reduction R that has
/// in-place forms (widen_into, combine_into, narrow_into): block_ops, sum_sparse and
/// sum_sparse_mx derive from value_forms<themselves>. The kernels use the in-place forms; these
/// are for callers that hold single values. Self is R, named late so that R is complete.
template <class R> struct value_forms {
  template <class Self = R> static typename Self::acc widen(const typename Self::elem& x) {
    typename Self::acc a;
    Self::widen_into(a, x);
    return a;
  }
  template <class Self = R> static typename Self::acc combine(typename Self::acc a, const typename Self::acc& b) {
    Self::combine_into(a, b);
    return a;
  }
  template <class Self = R> static typename Self::elem narrow(const typename Self::acc& a) {
    typename Self::elem e;
    Self::narrow_into(e, a);
    return e;
  }
};

/// A block element and its float32 accumulator (kept as bits, so that the codec writes and
/// reads it in place). `Op::apply(float, float)` combines two values. Besides the value forms
/// every reduction has (widen, combine, narrow), a block reduction has in-place forms, which
/// the kernels below use (`in_place`): a block is 128 or more bytes, and value forms would put
/// several copies of one on a handler's stack.
template <class Codec, class Op> struct block_ops : detail::value_forms<block_ops<Codec, Op>> {
  struct elem {
    u8 b[Codec::bytes];
  };
  struct acc {
    u32 bits[Codec::values];  ///< float32 values as bits
  };
  static constexpr bool in_place = true;
  static constexpr u32 values = Codec::values;
  static void widen_into(acc& a, const elem& x) { Codec::decode(x.b, a.bits); }
  static u32 apply(u32 a, u32 b) {
    return spin::detail::bit_cast<u32>(Op::apply(spin::detail::bit_cast<float>(a), spin::detail::bit_cast<float>(b)));
  }
  static void combine_into(acc& a, const acc& b) {
    for (u32 i = 0; i < Codec::values; ++i) a.bits[i] = apply(a.bits[i], b.bits[i]);
  }
  static void fold_into(acc& a, const elem& x) {
    for (u32 i = 0; i < Codec::values; ++i) a.bits[i] = apply(a.bits[i], Codec::value(x.b, i));
  }
  static void narrow_into(elem& e, const acc& a) { Codec::encode(a.bits, e.b); }
};
struct add_op {
  static float apply(float x, float y) { return x + y; }
};
struct min_op {
  static float apply(float x, float y) { return fmin(x, y); }
};
struct max_op {
  static float apply(float x, float y) { return fmax(x, y); }
};
/// Whether reduction R has in-place forms (block formats).
template <class R> constexpr bool has_in_place() {
  if constexpr (requires { R::in_place; }) return R::in_place;
  return false;
}
/// A reduction whose elements and accumulators travel in fewer bytes than their size
/// (sum_sparse): the engine asks it for their lengths and checks them with it.
template <class R> constexpr bool is_compact() {
  if constexpr (requires { R::compact; }) return R::compact;
  return false;
}
} // namespace detail

/// Element-wise sum, min and max of block formats, on the float32 values of the blocks.
/// Sum of sparse windows (spin/coll/sparse.hpp) of values V (sparse_value_f32, _bf16, _f16).
/// The accumulator of a window is the dense window of float32 sums in handler memory; that of a
/// span (several windows: sparse.hpp, "Spans") the sorted list of its offsets whose sums are not
/// +0, at most max_pairs(4) of them. An element (and, on the wire, an accumulator: pack_acc)
/// takes the form with fewer bytes. Every value an element does not list is +0 and is added as
/// +0, so the result is the dense sum of the scattered vectors bit for bit (fixed order,
/// float32, rounded to V once at the end).
template <class V> struct sum_sparse : detail::value_forms<sum_sparse<V>> {
  static constexpr u32 W = sparse::window_values;
  static constexpr u32 vb = V::bytes;
  struct elem {
    u8 b[sparse::dense_bytes(vb)];
  };
  struct acc {
    u32 head;     ///< mode << 16 | listed count (see below)
    u32 bits[W];  ///< float32 values as bits, or a span's list
  };
  static constexpr bool in_place = true;
  static constexpr bool compact = true;
  static constexpr u32 values = W;

  // ---- the accumulator's modes ----
  // dense: bits[0..W) are a window's float32 sums (head unused).
  // list: a span's `listed` offsets (u16, strictly ascending) in the first 2C bytes of bits,
  //   their sums (none +0) at bits[list_vals + k]; every other offset of the span sums to +0.
  // overflow: a span whose union outgrew C, or a window met a span: ranks that cut different
  //   spans (the agreement prevents it). Its packed form and result are form_overflow, which
  //   every receiver drops as malformed: the collective times out, nothing wrong is delivered.
  static constexpr u32 C = sparse::max_pairs_4;  // 679: a list packs into one packet
  static constexpr u32 list_vals = (2 * C + 3) / 4;
  static_assert(list_vals + C <= W);
  static constexpr u32 mode_dense = 0, mode_list = 1, mode_overflow = 2;
  static u32 mode(const acc& a) { return a.head >> 16; }
  static u32 listed(const acc& a) { return a.head & 0xffffu; }
  static void set_head(acc& a, u32 m, u32 n) { a.head = (m << 16) | n; }
  static u32 off_at(const acc& a, u32 k) { return sparse::load16(reinterpret_cast<const u8*>(a.bits) + 2 * k); }
  static void set_off(acc& a, u32 k, u32 o) { sparse::store16(reinterpret_cast<u8*>(a.bits) + 2 * k, static_cast<u16>(o)); }

  static u32 raw(const u8* p, u32 k) {
    if constexpr (vb == 4) {
      u32 v;
      __builtin_memcpy(&v, p + 4 * k, 4);
      return v;
    } else {
      return sparse::load16(p + 2 * k);
    }
  }
  static void put(u8* p, u32 k, u32 v) {
    if constexpr (vb == 4) __builtin_memcpy(p + 4 * k, &v, 4);
    else sparse::store16(p + 2 * k, static_cast<u16>(v));
  }
  static u32 add(u32 a, u32 b) {
    return spin::detail::bit_cast<u32>(spin::detail::bit_cast<float>(a) + spin::detail::bit_cast<float>(b));
  }
  /// Writes the window whose values are vals[0..W) (bits of `bytes` bytes each, already in the
  /// wire type) at `out` in its smaller form; returns its length.
  template <u32 Bytes, class Get> static u32 encode(u8* out, Get get) {
    u32 n = 0;
    for (u32 i = 0; i < W; ++i) n += get(i) != 0 ? 1u : 0u;
    if (!sparse::pairs_smaller(n, Bytes)) {
      sparse::store16(out, static_cast<u16>(W));
      sparse::store16(out + 2, sparse::form_dense);
      u8* d = out + sparse::head_bytes;
      for (u32 i = 0; i < W; ++i) {
        const u32 v = get(i);
        if constexpr (Bytes == 4) __builtin_memcpy(d + 4 * i, &v, 4);
        else sparse::store16(d + 2 * i, static_cast<u16>(v));
      }
      return sparse::dense_bytes(Bytes);
    }
    sparse::store16(out, static_cast<u16>(n));
    sparse::store16(out + 2, sparse::form_pairs);
    u8* off = out + sparse::head_bytes;
    u8* val = off + sparse::offset_bytes(n);
    if ((n & 1) != 0) sparse::store16(off + 2 * n, 0);  // the padding, defined
    // Groups of 20 values whose bits are all zero are skipped whole (a loop the compiler
    // vectorises): a sparse window costs little more than its count pass.
    constexpr u32 G = 20;
    static_assert(W % G == 0);
    u32 k = 0;
    for (u32 g = 0; g < W; g += G) {
      u32 any = 0;
      for (u32 j = 0; j < G; ++j) any |= get(g + j);
      if (any == 0) continue;
      for (u32 i = g; i < g + G; ++i) {
        const u32 v = get(i);
        if (v == 0) continue;
        sparse::store16(off + 2 * k, static_cast<u16>(i));
        if constexpr (Bytes == 4) __builtin_memcpy(val + 4 * k, &v, 4);
        else sparse::store16(val + 2 * k, static_cast<u16>(v));
        ++k;
      }
    }
    return sparse::pairs_bytes(n, Bytes);
  }
  /// a[i] = a[i] + x_i for every i (x_i = +0 where x lists none), x's values widened by `wid`.
  template <u32 Bytes, class Widen> static void add_window(u32* a, const u8* x, Widen wid) {
    if (sparse::form_of(x) == sparse::form_dense) {
      const u8* d = sparse::dense_values(x);
      for (u32 i = 0; i < W; ++i) a[i] = add(a[i], wid(Bytes == 4 ? raw4(d, i) : sparse::load16(d + 2 * i)));
      return;
    }
    // Unlisted values add +0 (which turns -0 into +0, as in a dense sum): the runs between
    // listed offsets are plain loops the compiler vectorises; listed values are added to the
    // accumulator as it was. Offsets are ascending in a valid window; an offset that is not
    // (a host's malformed window) only skips values, never writes outside the window.
    const u32 n = pairs_in(x, Bytes);
    const u8* off = sparse::offsets(x);
    const u8* val = off + sparse::offset_bytes(n);
    u32 from = 0;
    for (u32 k = 0; k < n; ++k) {
      const u32 i = sparse::load16(off + 2 * k);
      if (i < from || i >= W) continue;
      for (u32 j = from; j < i; ++j) a[j] = add(a[j], 0);
      a[i] = add(a[i], wid(Bytes == 4 ? raw4(val, k) : sparse::load16(val + 2 * k)));
      from = i + 1;
    }
    for (u32 j = from; j < W; ++j) a[j] = add(a[j], 0);
  }
  // Pairs of window x to read: its count, but never past the window's bytes (windows from the
  // network are checked before they get here; a host's are not).
  static u32 pairs_in(const u8* x, u32 bytes) {
    const u32 n = sparse::count_of(x), most = sparse::max_pairs(bytes);
    return n < most ? n : most;
  }
  static u32 raw4(const u8* p, u32 k) {
    u32 v;
    __builtin_memcpy(&v, p + 4 * k, 4);
    return v;
  }
  template <u32 Bytes, class Widen> static void set_window(u32* a, const u8* x, Widen wid) {
    if (sparse::form_of(x) == sparse::form_dense) {
      const u8* d = sparse::dense_values(x);
      for (u32 i = 0; i < W; ++i) a[i] = wid(Bytes == 4 ? raw4(d, i) : sparse::load16(d + 2 * i));
      return;
    }
    for (u32 i = 0; i < W; ++i) a[i] = 0;
    const u32 n = pairs_in(x, Bytes);
    const u8* off = sparse::offsets(x);
    const u8* val = off + sparse::offset_bytes(n);
    for (u32 k = 0; k < n; ++k) {
      const u32 i = sparse::load16(off + 2 * k);
      if (i < W) a[i] = wid(Bytes == 4 ? raw4(val, k) : sparse::load16(val + 2 * k));
    }
  }

  // List a's values from span x (values of Bytes bytes, widened by `wid`): those whose float32
  // bits are +0 are left out; offsets out of order (a host's malformed span) are skipped.
  template <u32 Bytes, class Widen> static void set_list(acc& a, const u8* x, Widen wid) {
    const u32 n = pairs_in(x, Bytes);  // <= max_pairs(Bytes) <= C
    const u8* off = sparse::offsets(x);
    const u8* val = off + sparse::offset_bytes(n);
    u32 k = 0, prev = 0;
    for (u32 j = 0; j < n; ++j) {
      const u32 o = sparse::load16(off + 2 * j);
      const u32 v = wid(Bytes == 4 ? raw4(val, j) : sparse::load16(val + 2 * j));
      if ((k > 0 && o <= prev) || v == 0) continue;
      set_off(a, k, o);
      a.bits[list_vals + k] = v;
      prev = o;
      ++k;
    }
    set_head(a, mode_list, k);
  }
  // a = a + s, a in list mode, s the sorted list of m entries off(k), val(k) (float32 bits),
  // every offset either does not list adding as +0, as the dense sum has it. Merged from the
  // back in place: the write position never passes an entry of a not yet read. A union larger
  // than C makes a overflow.
  template <class Off, class Val> static void merge_list(acc& a, u32 m, Off off, Val val) {
    const u32 n = listed(a);
    u32 i = 0, j = 0, u = 0;
    for (u32 k = 1; k < m; ++k)  // a source out of order (a malformed span of a host's): overflow
      if (off(k) <= off(k - 1)) {
        set_head(a, mode_overflow, 0);
        return;
      }
    while (i < n || j < m) {
      if (j == m || (i < n && off_at(a, i) < off(j))) ++i;
      else if (i == n || off(j) < off_at(a, i)) ++j;
      else ++i, ++j;
      ++u;
    }
    if (u > C) {
      set_head(a, mode_overflow, 0);
      return;
    }
    i = n;
    j = m;
    for (u32 p = u; p-- > 0;) {
      u32 o, v;
      if (j == 0 || (i > 0 && off_at(a, i - 1) > off(j - 1))) {
        --i;
        o = off_at(a, i);
        v = add(a.bits[list_vals + i], 0);
      } else if (i == 0 || off(j - 1) > off_at(a, i - 1)) {
        --j;
        o = off(j);
        v = add(0, val(j));
      } else {
        --i;
        --j;
        o = off_at(a, i);
        v = add(a.bits[list_vals + i], val(j));
      }
      set_off(a, p, o);
      a.bits[list_vals + p] = v;
    }
    u32 k = 0;  // sums that came to +0 (-0 + +0, x + -x) are unlisted again
    for (u32 p = 0; p < u; ++p) {
      const u32 v = a.bits[list_vals + p];
      if (v == 0) continue;
      set_off(a, k, off_at(a, p));
      a.bits[list_vals + k] = v;
      ++k;
    }
    set_head(a, mode_list, k);
  }
  // A span's list at `out` (values narrowed by `nar`; those that become +0 are left out), or
  // form_overflow when more remain than a packet of Bytes-byte values holds. Returns its length.
  template <u32 Bytes, class Narrow> static u32 write_list(u8* out, const acc& a, Narrow nar) {
    const u32 n = mode(a) == mode_list ? listed(a) : 0;
    u32 m = 0;
    for (u32 k = 0; k < n; ++k) m += nar(a.bits[list_vals + k]) != 0 ? 1u : 0u;
    if (mode(a) != mode_list || m > sparse::max_pairs(Bytes)) {
      sparse::store16(out, 0);
      sparse::store16(out + 2, sparse::form_overflow);
      return sparse::head_bytes;
    }
    sparse::store16(out, static_cast<u16>(m));
    sparse::store16(out + 2, sparse::form_span);
    u8* off = out + sparse::head_bytes;
    u8* val = off + sparse::offset_bytes(m);
    if ((m & 1) != 0) sparse::store16(off + 2 * m, 0);  // the padding, defined
    u32 j = 0;
    for (u32 k = 0; k < n; ++k) {
      const u32 v = nar(a.bits[list_vals + k]);
      if (v == 0) continue;
      sparse::store16(off + 2 * j, static_cast<u16>(off_at(a, k)));
      if constexpr (Bytes == 4) __builtin_memcpy(val + 4 * j, &v, 4);
      else sparse::store16(val + 2 * j, static_cast<u16>(v));
      ++j;
    }
    return sparse::pairs_bytes(m, Bytes);
  }

  static void widen_into(acc& a, const elem& x) {
    if (sparse::form_of(x.b) == sparse::form_span) {
      set_list<vb>(a, x.b, [](u32 v) { return V::widen(v); });
      return;
    }
    set_head(a, mode_dense, 0);
    set_window<vb>(a.bits, x.b, [](u32 v) { return V::widen(v); });
  }
  static void fold_into(acc& a, const elem& x) {
    const bool span = sparse::form_of(x.b) == sparse::form_span;
    if (mode(a) == mode_dense && !span) {
      add_window<vb>(a.bits, x.b, [](u32 v) { return V::widen(v); });
    } else if (mode(a) == mode_list && span) {
      const u32 m = pairs_in(x.b, vb);
      const u8* off = sparse::offsets(x.b);
      const u8* val = off + sparse::offset_bytes(m);
      merge_list(
          a, m, [off](u32 k) { return static_cast<u32>(sparse::load16(off + 2 * k)); },
          [val](u32 k) { return V::widen(vb == 4 ? raw4(val, k) : sparse::load16(val + 2 * k)); });
    } else {
      set_head(a, mode_overflow, 0);
    }
  }
  static void combine_into(acc& a, const acc& b) {
    if (mode(a) == mode_dense && mode(b) == mode_dense) {
      combine_dense(a.bits, b.bits);
    } else if (mode(a) == mode_list && mode(b) == mode_list) {
      merge_list(
          a, listed(b), [&b](u32 k) { return off_at(b, k); }, [&b](u32 k) { return b.bits[list_vals + k]; });
    } else {
      set_head(a, mode_overflow, 0);
    }
  }
  static void narrow_into(elem& e, const acc& a) {
    if (mode(a) == mode_dense) encode<vb>(e.b, [&a](u32 i) { return V::narrow(a.bits[i]); });
    else write_list<vb>(e.b, a, [](u32 v) { return V::narrow(v); });
  }
  // ---- dense windows of float32 sums alone (sum_sparse_mx's accumulators) ----
  static void combine_dense(u32* a, const u32* b) {
    for (u32 i = 0; i < W; ++i) a[i] = add(a[i], b[i]);
  }
  static u32 pack_dense(u8* out, const u32* a) {
    return encode<4>(out, [a](u32 i) { return a[i]; });
  }
  static void unpack_dense(u32* a, const u8* in) {
    set_window<4>(a, in, [](u32 v) { return v; });
  }
  // ---- the wire form (engine: compact reductions) ----
  /// Bytes of element `e` as it travels.
  static u32 elem_length(const elem& e) { return sparse::length(e.b, vb); }
  static bool elem_valid(const u8* p, u64 len) { return sparse::valid(p, len, vb); }
  static bool acc_valid(const u8* p, u64 len) { return sparse::valid(p, len, 4); }
  /// Writes accumulator `a` at `out` in its smaller form (float32 values, bits kept; a span's
  /// list as a span); returns its length.
  static u32 pack_acc(u8* out, const acc& a) {
    if (mode(a) == mode_dense) return pack_dense(out, a.bits);
    return write_list<4>(out, a, [](u32 v) { return v; });
  }
  /// The accumulator that packed window or span `in` (valid) stands for.
  static void unpack_acc(acc& a, const u8* in) {
    if (sparse::form_of(in) == sparse::form_span) {
      set_list<4>(a, in, [](u32 v) { return v; });
      return;
    }
    set_head(a, mode_dense, 0);
    unpack_dense(a.bits, in);
  }
};

/// Value types of sparse windows: their bytes, widening to float32 bits (exact) and narrowing
/// from them (rounding once; a NaN becomes the type's canonical NaN).
struct sparse_value_f32 {
  static constexpr u32 bytes = 4;
  static u32 widen(u32 v) { return v; }
  static u32 narrow(u32 a) { return (a & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : a; }
};
struct sparse_value_bf16 {
  static constexpr u32 bytes = 2;
  static u32 widen(u32 v) { return bf16_to_f32_bits(static_cast<u16>(v)); }
  static u32 narrow(u32 a) { return f32_to_bf16_bits(a); }
};
struct sparse_value_f16 {
  static constexpr u32 bytes = 2;
  static u32 widen(u32 v) { return f16_to_f32_bits(static_cast<u16>(v)); }
  static u32 narrow(u32 a) { return f32_to_f16_bits(a); }
};

/// Sum of sparse windows of MX values of element type E (spin/coll/sparse.hpp, "windows of MX
/// values"). The accumulator is sum_sparse's: the dense window of float32 sums, packed the same
/// way on the wire. Values are decoded exactly (mx::decode_native), added in float32 (every
/// value a window does not list as the +0 it stands for) and encoded once at the end, each block's
/// scale chosen from its float32 sums (OCP MX v1.0, section 6.3; mx::encode_block_native), so the
/// result is the dense MX encoding of the dense float32 sum, whatever form each window took.
template <mx::element E> struct sum_sparse_mx : detail::value_forms<sum_sparse_mx<E>> {
  static constexpr u32 W = sparse::window_values;
  static constexpr mx::element element = E;
  static constexpr u32 bits = mx::spec_of(E).bits;
  static constexpr u32 B = mx::block_elements;
  static constexpr u32 block_code_bytes = B * bits / 8;
  using f32_windows = sum_sparse<sparse_value_f32>;
  struct elem {
    u8 b[sparse::mx_dense_bytes(bits)];
  };
  using acc = typename f32_windows::acc;
  static constexpr bool in_place = true;
  static constexpr bool compact = true;
  static constexpr u32 values = W;

  static u32 add(u32 a, u32 b) { return f32_windows::add(a, b); }
  // Visits every value of window x in order, v its float32 bits: one(i, v) for a value a code
  // gives, run(lo, hi, v) for values lo..hi-1 that are all v (the +0 of unlisted codes and
  // blocks, or NaN under a NaN scale), so that callers add them in plain loops the compiler
  // vectorises. A malformed window (a host's: those from the network are checked first) never
  // makes it read outside the window's bytes: offsets out of order are skipped, counts clamped.
  template <class One, class Run> static void each(const u8* x, One one, Run run) {
    if (sparse::form_of(x) == sparse::form_dense) {
      const u8* sc = x + sparse::head_bytes;
      const u8* codes = sc + sparse::mx_blocks;
      for (u32 j = 0; j < sparse::mx_blocks; ++j) {
        const u32 lo = j * B, hi = lo + B < W ? lo + B : W;
        for (u32 i = lo; i < hi; ++i) one(i, mx::decode_native<E>(sc[j], mx::code_at(E, codes + j * block_code_bytes, i - lo)));
      }
      return;
    }
    const u32 mask = sparse::mx_mask(x);
    const u32 nb = sparse::ones(mask);
    const u32 most = sparse::mx_max_pairs(nb, bits);
    const u32 n = sparse::count_of(x) < most ? sparse::count_of(x) : most;
    const u8* sc = sparse::mx_scales(x);
    const u8* off = sparse::mx_offsets(x);
    const u8* code = off + sparse::offset_bytes(n);
    u32 k = 0, listed = 0, from = 0;  // values before `from` are visited
    for (u32 j = 0; j < sparse::mx_blocks; ++j) {
      const u32 lo = j * B, hi = lo + B < W ? lo + B : W;
      if (((mask >> j) & 1u) == 0) {
        while (k < n && sparse::load16(off + 2 * k) < hi) ++k;  // (none in a valid window)
        continue;  // +0: in the run up to the next listed block
      }
      run(from, lo, 0u);
      const u8 scale = sc[listed++];
      const u32 zero = mx::decode_native<E>(scale, 0);  // +0, or NaN under a NaN scale
      u32 i = lo;
      for (; k < n; ++k) {
        const u32 o = sparse::load16(off + 2 * k);
        if (o >= hi) break;
        if (o < i) continue;  // out of order or repeated (none in a valid window)
        run(i, o, zero);
        one(o, mx::decode_native<E>(scale, code[k]));
        i = o + 1;
      }
      run(i, hi, zero);
      from = hi;
    }
    run(from, W, 0u);
  }
  static void widen_into(acc& a, const elem& x) {
    each(
        x.b, [&a](u32 i, u32 v) { a.bits[i] = v; },
        [&a](u32 lo, u32 hi, u32 v) {
          for (u32 i = lo; i < hi; ++i) a.bits[i] = v;
        });
  }
  static void fold_into(acc& a, const elem& x) {
    each(
        x.b, [&a](u32 i, u32 v) { a.bits[i] = add(a.bits[i], v); },
        [&a](u32 lo, u32 hi, u32 v) {
          for (u32 i = lo; i < hi; ++i) a.bits[i] = add(a.bits[i], v);
        });
  }
  static void combine_into(acc& a, const acc& b) { f32_windows::combine_dense(a.bits, b.bits); }
  // Block j's 32 values (the last block's padding: +0).
  static void block_of(const acc& a, u32 j, u32* in) {
    const u32 lo = j * B;
    for (u32 i = 0; i < B; ++i) in[i] = lo + i < W ? a.bits[lo + i] : 0u;
  }
  static void narrow_into(elem& e, const acc& a) {
    // Pass 1: the dense form (every block's scale and packed codes), and the codes that are
    // not 0. A window that stays dense is encoded once.
    u8 count[sparse::mx_blocks];
    u32 in[B];
    u8 codes[B];
    u32 n = 0, nb = 0, mask = 0;
    u8* out = e.b;
    u8* scale = out + sparse::head_bytes;
    u8* packed = scale + sparse::mx_blocks;
    for (u32 j = 0; j < sparse::mx_blocks; ++j) {
      block_of(a, j, in);
      u32 any = 0;
      for (u32 i = 0; i < B; ++i) any |= in[i];
      if (any == 0) {  // all +0: code 0 under the smallest scale, not listed
        scale[j] = static_cast<u8>(mx::shared_exponent(E, 0) + mx::scale_bias);
        for (u32 i = 0; i < block_code_bytes; ++i) packed[j * block_code_bytes + i] = 0;
        count[j] = 0;
        continue;
      }
      scale[j] = mx::encode_block_native<E>(in, codes);
      mx::pack(E, codes, packed + j * block_code_bytes);
      u32 c = 0;
      for (u32 i = 0; i < B; ++i) c += codes[i] != 0 ? 1u : 0u;
      count[j] = static_cast<u8>(c);
      if (c != 0 || scale[j] == mx::scale_nan) {
        mask |= 1u << j;
        ++nb;
        n += c;
      }
    }
    if (!sparse::mx_pairs_smaller(n, nb, bits)) {
      sparse::store16(out, static_cast<u16>(W));
      sparse::store16(out + 2, sparse::form_dense);
      return;
    }
    // Pairs: the listed blocks' scales (pass 1 left them where the pairs form goes), then their
    // codes again.
    u8 listed[sparse::mx_blocks];
    for (u32 j = 0, k = 0; j < sparse::mx_blocks; ++j)
      if (((mask >> j) & 1u) != 0) listed[k++] = scale[j];
    sparse::store16(out, static_cast<u16>(n));
    sparse::store16(out + 2, sparse::form_pairs);
    sparse::store32(out + sparse::head_bytes, mask);
    u8* sc = out + sparse::head_bytes + 4;
    for (u32 k = 0; k < nb; ++k) sc[k] = listed[k];
    for (u32 k = nb; k < ((nb + 3) & ~3u); ++k) sc[k] = 0;  // the padding, defined
    u8* off = sc + ((nb + 3) & ~3u);
    u8* code = off + sparse::offset_bytes(n);
    if ((n & 1) != 0) sparse::store16(off + 2 * n, 0);
    u32 k = 0;
    for (u32 j = 0; j < sparse::mx_blocks; ++j) {
      if (count[j] == 0) continue;
      block_of(a, j, in);
      mx::encode_block_native<E>(in, codes);
      for (u32 i = 0; i < B && j * B + i < W; ++i) {
        if (codes[i] == 0) continue;
        sparse::store16(off + 2 * k, static_cast<u16>(j * B + i));
        code[k] = codes[i];
        ++k;
      }
    }
  }
  // ---- the wire form (engine: compact reductions) ----
  static u32 elem_length(const elem& e) { return sparse::mx_length(e.b, bits); }
  static bool elem_valid(const u8* p, u64 len) { return sparse::mx_valid(p, len, bits); }
  static bool acc_valid(const u8* p, u64 len) { return sparse::valid(p, len, 4, false); }  // windows only
  static u32 pack_acc(u8* out, const acc& a) { return f32_windows::pack_dense(out, a.bits); }
  static void unpack_acc(acc& a, const u8* in) { f32_windows::unpack_dense(a.bits, in); }
};

template <class Codec> struct sum_block : detail::block_ops<Codec, detail::add_op> {};
template <class Codec> struct min_block : detail::block_ops<Codec, detail::min_op> {};
template <class Codec> struct max_block : detail::block_ops<Codec, detail::max_op> {};

template <class T> struct sum_int : detail::int_ops<T> {
  static T combine(T a, T b) { return detail::wrap_add(a, b); }
};
template <class T> struct prod_int : detail::int_ops<T> {
  static T combine(T a, T b) { return detail::wrap_mul(a, b); }
};
template <class T> struct min_int : detail::int_ops<T> {
  static T combine(T a, T b) { return b < a ? b : a; }
};
template <class T> struct max_int : detail::int_ops<T> {
  static T combine(T a, T b) { return b > a ? b : a; }
};
template <class Base> struct sum_float : Base {
  static typename Base::acc combine(typename Base::acc a, typename Base::acc b) { return a + b; }
};
template <class Base> struct prod_float : Base {
  static typename Base::acc combine(typename Base::acc a, typename Base::acc b) { return a * b; }
};
template <class Base> struct min_float : Base {
  static typename Base::acc combine(typename Base::acc a, typename Base::acc b) { return detail::fmin(a, b); }
};
template <class Base> struct max_float : Base {
  static typename Base::acc combine(typename Base::acc a, typename Base::acc b) { return detail::fmax(a, b); }
};

// ---- element-wise kernels over byte buffers ----------------------------------------------------
// Buffers are naturally aligned for their types (packet payloads and scratchpads are 8-byte
// aligned). n is a count of elements.

/// acc[i] = widen(elem[i])
template <class R> void widen_n(void* acc, const void* elem, u32 n) {
  auto* a = static_cast<typename R::acc*>(acc);
  const auto* e = static_cast<const typename R::elem*>(elem);
  if constexpr (detail::has_in_place<R>())
    for (u32 i = 0; i < n; ++i) R::widen_into(a[i], e[i]);
  else
    for (u32 i = 0; i < n; ++i) a[i] = R::widen(e[i]);
}
/// acc[i] = combine(acc[i], widen(elem[i])): the element comes later in the order.
template <class R> void fold_n(void* acc, const void* elem, u32 n) {
  auto* a = static_cast<typename R::acc*>(acc);
  const auto* e = static_cast<const typename R::elem*>(elem);
  if constexpr (detail::has_in_place<R>())
    for (u32 i = 0; i < n; ++i) R::fold_into(a[i], e[i]);
  else
    for (u32 i = 0; i < n; ++i) a[i] = R::combine(a[i], R::widen(e[i]));
}
/// acc[i] = combine(widen(first[i]), widen(second[i])): widen_n then fold_n in one pass.
template <class R> void widen_fold_n(void* acc, const void* first, const void* second, u32 n) {
  auto* a = static_cast<typename R::acc*>(acc);
  const auto* x = static_cast<const typename R::elem*>(first);
  const auto* y = static_cast<const typename R::elem*>(second);
  if constexpr (detail::has_in_place<R>()) {
    for (u32 i = 0; i < n; ++i) {
      R::widen_into(a[i], x[i]);
      R::fold_into(a[i], y[i]);
    }
  } else {
    for (u32 i = 0; i < n; ++i) a[i] = R::combine(R::widen(x[i]), R::widen(y[i]));
  }
}
/// elem[i] = narrow(combine(acc[i], widen(last[i]))): fold_n then narrow_n in one pass.
/// Afterwards acc[i] holds either its old value or the combination.
template <class R> void fold_narrow_n(void* elem, void* acc, const void* last, u32 n) {
  auto* e = static_cast<typename R::elem*>(elem);
  const auto* l = static_cast<const typename R::elem*>(last);
  auto* a = static_cast<typename R::acc*>(acc);
  if constexpr (detail::has_in_place<R>()) {
    for (u32 i = 0; i < n; ++i) {
      R::fold_into(a[i], l[i]);
      R::narrow_into(e[i], a[i]);
    }
  } else {
    for (u32 i = 0; i < n; ++i) e[i] = R::narrow(R::combine(a[i], R::widen(l[i])));
  }
}
/// acc[i] = combine(acc[i], later[i])
template <class R> void combine_n(void* acc, const void* later, u32 n) {
  auto* a = static_cast<typename R::acc*>(acc);
  const auto* b = static_cast<const typename R::acc*>(later);
  if constexpr (detail::has_in_place<R>())
    for (u32 i = 0; i < n; ++i) R::combine_into(a[i], b[i]);
  else
    for (u32 i = 0; i < n; ++i) a[i] = R::combine(a[i], b[i]);
}
/// elem[i] = narrow(acc[i])
template <class R> void narrow_n(void* elem, const void* acc, u32 n) {
  auto* e = static_cast<typename R::elem*>(elem);
  const auto* a = static_cast<const typename R::acc*>(acc);
  if constexpr (detail::has_in_place<R>())
    for (u32 i = 0; i < n; ++i) R::narrow_into(e[i], a[i]);
  else
    for (u32 i = 0; i < n; ++i) e[i] = R::narrow(a[i]);
}

/// Calls f.template operator()<R>() with the standard reduction R of (o, t) and returns true,
/// or returns false when the pair is not a standard reduction. One switch: handlers use it to
/// dispatch without function pointers; host code (spin/coll/kernels.hpp) finds the same kernels.
template <class F> bool with_standard(op o, dtype t, F&& f) {
  using detail::bf16_ops;
  using detail::f16_ops;
  using detail::float_ops;
  switch (t) {
  case dtype::i32:
  case dtype::i64:
  case dtype::u32:
  case dtype::u64: {
    auto pick = [&](auto zero) -> bool {
      using T = decltype(zero);
      switch (o) {
      case op::sum: f.template operator()<sum_int<T>>(); return true;
      case op::prod: f.template operator()<prod_int<T>>(); return true;
      case op::min: f.template operator()<min_int<T>>(); return true;
      case op::max: f.template operator()<max_int<T>>(); return true;
      default: return false;
      }
    };
    if (t == dtype::i32) return pick(i32{});
    if (t == dtype::i64) return pick(i64{});
    if (t == dtype::u32) return pick(u32{});
    return pick(u64{});
  }
  case dtype::f32:
  case dtype::f64:
  case dtype::f16:
  case dtype::bf16: {
    auto pick = [&](auto base) -> bool {
      using B = decltype(base);
      switch (o) {
      case op::sum: f.template operator()<sum_float<B>>(); return true;
      case op::prod: f.template operator()<prod_float<B>>(); return true;
      case op::min: f.template operator()<min_float<B>>(); return true;
      case op::max: f.template operator()<max_float<B>>(); return true;
      default: return false;
      }
    };
    if (t == dtype::f32) return pick(float_ops<float>{});
    if (t == dtype::f64) return pick(float_ops<double>{});
    if (t == dtype::f16) return pick(f16_ops{});
    return pick(bf16_ops{});
  }
  case dtype::mxfp8_e4m3:
  case dtype::mxfp8_e5m2:
  case dtype::mxfp6_e3m2:
  case dtype::mxfp6_e2m3:
  case dtype::mxfp4_e2m1:
  case dtype::mxint8:
  case dtype::bfp8_16:
  case dtype::bfp8_32:
  case dtype::bfp16_16:
  case dtype::bfp16_32: {
    auto pick = [&](auto codec) -> bool {
      using C = decltype(codec);
      switch (o) {
      case op::sum: f.template operator()<sum_block<C>>(); return true;
      case op::min: f.template operator()<min_block<C>>(); return true;
      case op::max: f.template operator()<max_block<C>>(); return true;
      default: return false;
      }
    };
    using detail::bfp_codec;
    using detail::mx_codec;
    switch (t) {
    case dtype::mxfp8_e4m3: return pick(mx_codec<mx::element::fp8_e4m3>{});
    case dtype::mxfp8_e5m2: return pick(mx_codec<mx::element::fp8_e5m2>{});
    case dtype::mxfp6_e3m2: return pick(mx_codec<mx::element::fp6_e3m2>{});
    case dtype::mxfp6_e2m3: return pick(mx_codec<mx::element::fp6_e2m3>{});
    case dtype::mxfp4_e2m1: return pick(mx_codec<mx::element::fp4_e2m1>{});
    case dtype::mxint8: return pick(mx_codec<mx::element::int8>{});
    case dtype::bfp8_16: return pick(bfp_codec<16, 8>{});
    case dtype::bfp8_32: return pick(bfp_codec<32, 8>{});
    case dtype::bfp16_16: return pick(bfp_codec<16, 16>{});
    default: return pick(bfp_codec<32, 16>{});
    }
  }
  case dtype::sparse_f32:
  case dtype::sparse_bf16:
  case dtype::sparse_f16:
    if (o != op::sum) return false;
    if (t == dtype::sparse_f32) f.template operator()<sum_sparse<sparse_value_f32>>();
    else if (t == dtype::sparse_bf16) f.template operator()<sum_sparse<sparse_value_bf16>>();
    else f.template operator()<sum_sparse<sparse_value_f16>>();
    return true;
  case dtype::sparse_mxfp8_e4m3:
  case dtype::sparse_mxfp8_e5m2:
  case dtype::sparse_mxfp6_e3m2:
  case dtype::sparse_mxfp6_e2m3:
  case dtype::sparse_mxfp4_e2m1:
  case dtype::sparse_mxint8: {
    if (o != op::sum) return false;
    using E = mx::element;
    switch (t) {
    case dtype::sparse_mxfp8_e4m3: f.template operator()<sum_sparse_mx<E::fp8_e4m3>>(); break;
    case dtype::sparse_mxfp8_e5m2: f.template operator()<sum_sparse_mx<E::fp8_e5m2>>(); break;
    case dtype::sparse_mxfp6_e3m2: f.template operator()<sum_sparse_mx<E::fp6_e3m2>>(); break;
    case dtype::sparse_mxfp6_e2m3: f.template operator()<sum_sparse_mx<E::fp6_e2m3>>(); break;
    case dtype::sparse_mxfp4_e2m1: f.template operator()<sum_sparse_mx<E::fp4_e2m1>>(); break;
    default: f.template operator()<sum_sparse_mx<E::int8>>(); break;
    }
    return true;
  }
  default: return false;
  }
}

/// Values in one element of `t`: 32 or 16 for a block format, 1 for the others (0 for an
/// unknown id or custom).
inline u32 block_values(dtype t) {
  u32 v = 0;
  with_standard(op::sum, t, [&]<class R>() {
    if constexpr (detail::has_in_place<R>()) v = R::values;
    else v = 1;
  });
  return v;
}

/// The sparse-window datatype of value type t (sparse_f32 for f32, sparse_bf16, sparse_f16,
/// sparse_mxfp8_e4m3 for mxfp8_e4m3, ... for the six MX types); custom for any other.
constexpr dtype window_type_of(dtype t) {
  switch (t) {
  case dtype::f32: return dtype::sparse_f32;
  case dtype::bf16: return dtype::sparse_bf16;
  case dtype::f16: return dtype::sparse_f16;
  case dtype::mxfp8_e4m3: return dtype::sparse_mxfp8_e4m3;
  case dtype::mxfp8_e5m2: return dtype::sparse_mxfp8_e5m2;
  case dtype::mxfp6_e3m2: return dtype::sparse_mxfp6_e3m2;
  case dtype::mxfp6_e2m3: return dtype::sparse_mxfp6_e2m3;
  case dtype::mxfp4_e2m1: return dtype::sparse_mxfp4_e2m1;
  case dtype::mxint8: return dtype::sparse_mxint8;
  default: return dtype::custom;
  }
}

/// The OCP MX element type of t, an MX datatype (mxfp8_e4m3, ...) or its sparse window type
/// (sparse_mxfp8_e4m3, ...); false for any other.
constexpr bool mx_element_of(dtype t, mx::element& e) {
  switch (t) {
  case dtype::mxfp8_e4m3: case dtype::sparse_mxfp8_e4m3: e = mx::element::fp8_e4m3; return true;
  case dtype::mxfp8_e5m2: case dtype::sparse_mxfp8_e5m2: e = mx::element::fp8_e5m2; return true;
  case dtype::mxfp6_e3m2: case dtype::sparse_mxfp6_e3m2: e = mx::element::fp6_e3m2; return true;
  case dtype::mxfp6_e2m3: case dtype::sparse_mxfp6_e2m3: e = mx::element::fp6_e2m3; return true;
  case dtype::mxfp4_e2m1: case dtype::sparse_mxfp4_e2m1: e = mx::element::fp4_e2m1; return true;
  case dtype::mxint8: case dtype::sparse_mxint8: e = mx::element::int8; return true;
  default: return false;
  }
}

/// Whether elements of `t` travel in fewer bytes than their size (sparse windows).
inline bool compact_type(dtype t) {
  bool c = false;
  with_standard(op::sum, t, [&]<class R>() { c = detail::is_compact<R>(); });
  return c;
}

/// Whether the element of compact type `t` at `p` (its in-memory size, as a host holds it) is
/// well-formed: what its form says fits, and the reduction's check accepts it (sparse.hpp:
/// form, count, ascending offsets in range). True for any element of a type that is not compact.
inline bool compact_elem_ok(dtype t, const u8* p) {
  bool ok = true;
  with_standard(op::sum, t, [&]<class R>() {
    if constexpr (detail::is_compact<R>())
      ok = R::elem_valid(p, R::elem_length(*reinterpret_cast<const typename R::elem*>(p)));
  });
  return ok;
}

/// The dtype whose name(t) is `s` (a NUL-terminated string); false when none is.
inline bool dtype_named(const char* s, dtype& out) {
  for (u32 k = 1; k < 255; ++k) {
    const char* n = name(static_cast<dtype>(k));
    u32 i = 0;
    while (n[i] != 0 && n[i] == s[i]) ++i;
    if (n[0] != '?' && n[i] == 0 && s[i] == 0) {
      out = static_cast<dtype>(k);
      return true;
    }
  }
  return false;
}

} // namespace spin::coll
