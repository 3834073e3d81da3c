// Sparse windows: how spin::coll's sparse allreduce carries a dense vector whose values are
// mostly +0 (docs/collectives.md, "Sparse allreduce"). Freestanding: the same code runs in NIC
// and switch handlers (compiled by spinc) and in host code.
//
// The vector is cut into windows of `window_values` consecutive values. A window travels whole
// in one packet, in one of two forms, whichever has fewer bytes:
//   pairs: head{count, form_pairs}, count u16 offsets into the window (strictly ascending),
//          padded to 4 bytes, then count values;
//   dense: head{window_values, form_dense}, then window_values values.
// The pairs form lists exactly the values whose bits are not those of +0 (-0 and NaN are
// listed); every value it does not list is +0. Both forms therefore stand for the same dense
// window, and a sum of windows equals the dense sum bit for bit: the sparse allreduce is the
// dense allreduce of the scattered vectors, with a wire form that shrinks with the density.
//
// Switch-over (after SparCML, Renggli et al., SC 2019, section 5.2, whose dynamic sparse
// allreduce turns dense when nnz x (index + value bytes) passes the dense size, and OmniReduce,
// Fei et al., SIGCOMM 2021, section 3, which sends only non-zero blocks of a fixed size): the
// decision is made per window and per hop, by byte count. With 2-byte offsets a window turns
// dense past density v / (2 + v): 2/3 for float32 values (and float32 partial sums), 1/2 for
// bfloat16 and float16. Bytes on the wire never exceed the dense form's plus the 4-byte head of
// each window (0.1% of a 4084-byte dense window).
//
// Spans: several windows in one packet. Where values are rare, a window per packet would send as
// many packets as the dense allreduce, each nearly empty. An element may therefore stand for a
// span of 2 to span_windows_max consecutive windows, in a third form:
//   span:  head{count, form_span}, count u16 offsets into the span (strictly ascending, below
//          span_values_max), padded to 4, then count values: the pairs form's layout.
// The ranks first agree on each window's largest count over all ranks (allreduce_sparse: a u64
// max allreduce) and cut the same spans from it: consecutive windows whose union bound (ranks x
// largest count, at most window_values) adds up to at most max_pairs(vb), so that every partial
// sum of a span fits a packet as pairs of float32 sums and never needs the dense form; a window
// whose bound is larger travels alone, as pairs or dense. Spans never cross the chunks of an
// allreduce of the windows, so every value is added in the windows' order. Switch slots and
// NIC accumulators hold a span's partial sum as a sorted list of (offset, float32 sum) (types.hpp,
// sum_sparse), merged with each contribution; unlisted values are +0 there too, so the sum is
// still the dense sum bit for bit. SparCML's sparse streams (section 4) merged this way, with
// the fixed packet plan that the collective engine's epochs and repairs need.
#pragma once

#include <spin/coll/mx.hpp>
#include <spin/handler.hpp>

namespace spin::coll::sparse {

/// Values per window: a dense window of float32 values (4 + 4 x 1020 = 4084 bytes) fits a
/// 4096-byte packet. Fixed, so that every rank cuts the vector alike whatever its packet size.
inline constexpr u32 window_values = 1020;
inline constexpr u16 form_pairs = 0;
inline constexpr u16 form_dense = 1;
inline constexpr u16 form_span = 2;
/// Written (never valid, so receivers drop it as malformed) for the partial sum of a span whose
/// union outgrew a packet, which only ranks that cut different spans can cause.
inline constexpr u16 form_overflow = 3;
/// A span's most windows, and its most values (u16 offsets: 64 x 1020 = 65280).
inline constexpr u32 span_windows_max = 64;
inline constexpr u32 span_values_max = span_windows_max * window_values;
/// Bytes of the head (u16 count, u16 form).
inline constexpr u32 head_bytes = 4;

/// Bytes of the offsets of `count` pairs, padded to 4.
constexpr u32 offset_bytes(u32 count) { return (2 * count + 3) & ~3u; }
/// Bytes of a window in pairs form with `count` values of `vb` bytes each.
constexpr u32 pairs_bytes(u32 count, u32 vb) { return head_bytes + offset_bytes(count) + count * vb; }
/// Bytes of a window in dense form with values of `vb` bytes.
constexpr u32 dense_bytes(u32 vb) { return head_bytes + window_values * vb; }
/// The most pairs a window of `vb`-byte values carries (more take fewer bytes dense): 679 for
/// 4-byte values, 509 for 2-byte ones.
constexpr u32 max_pairs_search(u32 vb) {
  u32 n = 0;
  while (pairs_bytes(n + 1, vb) < dense_bytes(vb)) ++n;
  return n;
}
inline constexpr u32 max_pairs_4 = max_pairs_search(4);
inline constexpr u32 max_pairs_2 = max_pairs_search(2);
/// (Constants for the value sizes in use: handlers call this per packet.)
constexpr u32 max_pairs(u32 vb) { return vb == 4 ? max_pairs_4 : vb == 2 ? max_pairs_2 : max_pairs_search(vb); }
/// Whether `count` listed values of `vb` bytes take fewer bytes as pairs than dense.
constexpr bool pairs_smaller(u32 count, u32 vb) { return pairs_bytes(count, vb) < dense_bytes(vb); }
/// Bytes of a window that lists `count` values of `vb` bytes, in the smaller form.
constexpr u32 window_bytes(u32 count, u32 vb) { return pairs_smaller(count, vb) ? pairs_bytes(count, vb) : dense_bytes(vb); }

inline u16 load16(const u8* p) {
  u16 v;
  __builtin_memcpy(&v, p, 2);
  return v;
}
inline void store16(u8* p, u16 v) { __builtin_memcpy(p, &v, 2); }

/// Count and form of the window at `w`.
inline u32 count_of(const u8* w) { return load16(w); }
inline u32 form_of(const u8* w) { return load16(w + 2); }

/// Bytes of the window or span at `w` as it stands (its head decides), values of `vb` bytes;
/// at most dense_bytes(vb) whatever the head says.
inline u32 length(const u8* w, u32 vb) {
  const u32 n = count_of(w);
  return form_of(w) == form_dense || n > max_pairs(vb) ? dense_bytes(vb) : pairs_bytes(n, vb);
}

/// Whether `len` bytes at `w` are one well-formed window (or, with `spans`, span) of `vb`-byte
/// values: a known form, count at most max_pairs(vb) in pairs and span form (exactly
/// window_values when dense), `len` the form's length, offsets strictly ascending and below
/// window_values (a span's: below span_values_max). Untrusted windows (from the network) are
/// checked with this before any handler reads them.
inline bool valid(const u8* w, u64 len, u32 vb, bool spans = true) {
  if (len < head_bytes) return false;
  const u32 n = count_of(w), f = form_of(w);
  if (f == form_dense) return n == window_values && len == dense_bytes(vb);
  if (!(f == form_pairs || (spans && f == form_span)) || n > max_pairs(vb) || len != pairs_bytes(n, vb)) return false;
  const u32 limit = f == form_span ? span_values_max : window_values;
  u32 prev = 0;
  for (u32 k = 0; k < n; ++k) {
    const u32 i = load16(w + head_bytes + 2 * k);
    if (i >= limit || (k > 0 && i <= prev)) return false;
    prev = i;
  }
  return true;
}

/// Offsets and values of a pairs-form window or a span at `w` (values of `vb` bytes).
inline const u8* offsets(const u8* w) { return w + head_bytes; }
inline const u8* pair_values(const u8* w) { return w + head_bytes + offset_bytes(count_of(w)); }
inline const u8* dense_values(const u8* w) { return w + head_bytes; }

// ---- windows of MX values (OCP MX v1.0 element types, spin/coll/mx.hpp) --------------------
// The window's values form mx_blocks blocks of 32 consecutive values, each with an E8M0 scale
// (the last block holds 28 values, as though padded with four zeros, which leave its scale as
// it is). Two forms, whichever has fewer bytes:
//   pairs: head{count, form_pairs}, a u32 mask (bit j: block j is listed), the listed blocks'
//          scales in block order (padded to 4), count u16 offsets (strictly ascending, each in
//          a listed block; padded to 4), then count codes, one byte each (the code in the low
//          bits);
//   dense: head{window_values, form_dense}, the mx_blocks scales, then every block's 32 codes
//          packed as in an MX block (mx::pack; the last block's four padding codes are 0).
// Value i of block j is mx::decode(scale_j, code_i). The pairs form lists exactly the codes that
// are not 0 and the blocks that hold one or whose scale is NaN (all of whose values are NaN); a
// value it does not list has code 0 (its block listed) or is +0 (its block not listed), which is
// what code 0 stands for under any scale but NaN. Both forms therefore stand for the same
// values. With one byte per listed code (and every block listed), fp8 and int8 windows turn
// dense past a third of their values (339 of 1020), fp6 past a quarter (254), fp4 past a sixth
// (168). An empty window takes 8 bytes, one value 17.

/// Blocks of 32 values in a window (the last one holds window_values - 31 x 32 = 28).
inline constexpr u32 mx_blocks = (window_values + mx::block_elements - 1) / mx::block_elements;
/// Bytes of the codes of a dense window of `bits`-bit codes.
constexpr u32 mx_code_bytes(u32 bits) { return mx_blocks * mx::block_elements * bits / 8; }
/// Bytes of a dense window of `bits`-bit codes: 1060 for fp8 and int8, 804 for fp6, 548 for fp4.
constexpr u32 mx_dense_bytes(u32 bits) { return head_bytes + mx_blocks + mx_code_bytes(bits); }
/// Bytes of a pairs-form window with `count` codes in `blocks` listed blocks.
constexpr u32 mx_pairs_bytes(u32 count, u32 blocks) { return head_bytes + 4 + ((blocks + 3) & ~3u) + offset_bytes(count) + count; }
/// Whether `count` codes in `blocks` listed blocks take fewer bytes as pairs than dense.
constexpr bool mx_pairs_smaller(u32 count, u32 blocks, u32 bits) { return mx_pairs_bytes(count, blocks) < mx_dense_bytes(bits); }

inline u32 load32(const u8* p) {
  u32 v;
  __builtin_memcpy(&v, p, 4);
  return v;
}
inline void store32(u8* p, u32 v) { __builtin_memcpy(p, &v, 4); }
/// Set bits of v (eBPF has no popcount instruction; neither do the handlers need one).
constexpr u32 ones(u32 v) {
  v = v - ((v >> 1) & 0x55555555u);
  v = (v & 0x33333333u) + ((v >> 2) & 0x33333333u);
  return (((v + (v >> 4)) & 0x0f0f0f0fu) * 0x01010101u) >> 24;
}
/// The block mask of a pairs-form MX window.
inline u32 mx_mask(const u8* w) { return load32(w + head_bytes); }
/// The listed scales of a pairs-form MX window, then its offsets and codes.
inline const u8* mx_scales(const u8* w) { return w + head_bytes + 4; }
inline const u8* mx_offsets(const u8* w) { return w + head_bytes + 4 + ((ones(mx_mask(w)) + 3) & ~3u); }
inline const u8* mx_codes(const u8* w) { return mx_offsets(w) + offset_bytes(count_of(w)); }
/// The most codes a pairs-form window with `blocks` listed blocks can carry and stay smaller.
constexpr u32 mx_max_pairs(u32 blocks, u32 bits) {
  u32 n = 0;
  while (mx_pairs_smaller(n + 1, blocks, bits)) ++n;
  return n;
}

/// Bytes of the MX window at `w` (`bits`-bit codes) as it stands; at most mx_dense_bytes(bits)
/// whatever its head and mask say.
inline u32 mx_length(const u8* w, u32 bits) {
  if (form_of(w) == form_dense) return mx_dense_bytes(bits);
  const u32 len = mx_pairs_bytes(count_of(w), ones(mx_mask(w)));
  return len < mx_dense_bytes(bits) ? len : mx_dense_bytes(bits);
}

/// Whether `len` bytes at `w` are one well-formed MX window of `bits`-bit codes: a known form;
/// dense: count window_values and `len` its length; pairs: fewer bytes than dense, `len` its
/// length, offsets strictly ascending and below window_values, each in a listed block. (Codes
/// of any value are well-formed: a code's bits above `bits` are ignored, as mx::decode does.)
inline bool mx_valid(const u8* w, u64 len, u32 bits) {
  if (len < head_bytes) return false;
  const u32 n = count_of(w), f = form_of(w);
  if (f == form_dense) return n == window_values && len == mx_dense_bytes(bits);
  if (f != form_pairs || len < head_bytes + 4) return false;
  const u32 mask = mx_mask(w);
  if (!mx_pairs_smaller(n, ones(mask), bits) || len != mx_pairs_bytes(n, ones(mask))) return false;
  const u8* off = mx_offsets(w);
  u32 prev = 0;
  for (u32 k = 0; k < n; ++k) {
    const u32 i = load16(off + 2 * k);
    if (i >= window_values || (k > 0 && i <= prev) || ((mask >> (i / mx::block_elements)) & 1u) == 0) return false;
    prev = i;
  }
  return true;
}

/// The values a window of MX values of element type `e` stands for once encoded from `v`
/// (window_values float32 values as bits), in place: each block's values become
/// mx::decode(scale, code) of mx::encode_block (the last block padded with +0). Host code: what
/// a rank's values become on the wire in allreduce_sparse with an MX type, and what its result
/// is made of.
inline void mx_round_trip(mx::element e, u32* v) {
  for (u32 j = 0; j < mx_blocks; ++j) {
    u32 b[mx::block_elements];
    u8 codes[mx::block_elements];
    const u32 lo = j * mx::block_elements;
    for (u32 i = 0; i < mx::block_elements; ++i) b[i] = lo + i < window_values ? v[lo + i] : 0u;
    const u8 scale = mx::encode_block(e, b, codes);
    for (u32 i = 0; i < mx::block_elements && lo + i < window_values; ++i) v[lo + i] = mx::decode(e, scale, codes[i]);
  }
}

} // namespace spin::coll::sparse
