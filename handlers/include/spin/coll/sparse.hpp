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
#pragma once

#include <spin/handler.hpp>

namespace spin::coll::sparse {

/// Values per window: a dense window of float32 values (4 + 4 x 1020 = 4084 bytes) fits a
/// 4096-byte packet. Fixed, so that every rank cuts the vector alike whatever its packet size.
inline constexpr u32 window_values = 1020;
inline constexpr u16 form_pairs = 0;
inline constexpr u16 form_dense = 1;
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

/// Bytes of the window at `w` as it stands (its head decides), values of `vb` bytes; at most
/// dense_bytes(vb) whatever the head says.
inline u32 length(const u8* w, u32 vb) {
  const u32 n = count_of(w);
  return form_of(w) == form_dense || n > max_pairs(vb) ? dense_bytes(vb) : pairs_bytes(n, vb);
}

/// Whether `len` bytes at `w` are one well-formed window of `vb`-byte values: a known form,
/// count at most max_pairs(vb) in pairs form (exactly window_values when dense), `len` the form's length,
/// offsets strictly ascending and below window_values. Untrusted windows (from the network)
/// are checked with this before any handler reads them.
inline bool valid(const u8* w, u64 len, u32 vb) {
  if (len < head_bytes) return false;
  const u32 n = count_of(w), f = form_of(w);
  if (f == form_dense) return n == window_values && len == dense_bytes(vb);
  if (f != form_pairs || n > max_pairs(vb) || len != pairs_bytes(n, vb)) return false;
  u32 prev = 0;
  for (u32 k = 0; k < n; ++k) {
    const u32 i = load16(w + head_bytes + 2 * k);
    if (i >= window_values || (k > 0 && i <= prev)) return false;
    prev = i;
  }
  return true;
}

/// Offsets and values of a pairs-form window at `w` (values of `vb` bytes).
inline const u8* offsets(const u8* w) { return w + head_bytes; }
inline const u8* pair_values(const u8* w) { return w + head_bytes + offset_bytes(count_of(w)); }
inline const u8* dense_values(const u8* w) { return w + head_bytes; }

} // namespace spin::coll::sparse
