// SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF", INDOCRYPT 2012,
// section 2): the keyed MAC that authenticates the collective engine's commands and the
// runtime's authenticated frames (docs/wire-format.md, "Authentication tag"). Freestanding: the
// engine (a handler), the runtime and the host library compute it with this one definition.
#pragma once

#include <spin/handler.hpp>

namespace spin {

namespace siphash_detail {
constexpr u64 rotl(u64 x, u32 b) { return (x << b) | (x >> (64 - b)); }
struct state {
  u64 v0, v1, v2, v3;
  constexpr void round() {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  }
  constexpr void absorb(u64 m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};
// Little-endian 8-byte word at p (byte by byte: compilers emit one load on x86-64).
constexpr u64 le64(const u8* p) {
  u64 m = 0;
  for (u32 b = 0; b < 8; ++b) m |= u64{p[b]} << (8 * b);
  return m;
}
} // namespace siphash_detail

/// SipHash-2-4 of the `plen` bytes at `prefix` followed by the `len` bytes at `data`, under the
/// 128-bit key (k0, k1) (the key's bytes 0..7 and 8..15, little-endian): the same value as
/// SipHash-2-4 of the concatenation. `plen` must be a multiple of 8; `len` is any length. Reads
/// whole 8-byte words where it can (no alignment needed).
constexpr u64 siphash24(u64 k0, u64 k1, const u8* prefix, u64 plen, const u8* data, u64 len) {
  siphash_detail::state s{k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull, k0 ^ 0x6c7967656e657261ull,
                          k1 ^ 0x7465646279746573ull};
  for (u64 i = 0; i + 8 <= plen; i += 8) s.absorb(siphash_detail::le64(prefix + i));
  const u64 whole = len / 8 * 8;
  for (u64 i = 0; i < whole; i += 8) s.absorb(siphash_detail::le64(data + i));
  u64 last = ((plen + len) & 0xff) << 56;
  for (u64 b = 0; b < len - whole; ++b) last |= u64{data[whole + b]} << (8 * b);
  s.absorb(last);
  s.v2 ^= 0xff;
  s.round();
  s.round();
  s.round();
  s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

/// SipHash-2-4 of `len` bytes at `data` under the 128-bit key (k0, k1). Any length.
constexpr u64 siphash24(u64 k0, u64 k1, const u8* data, u64 len) { return siphash24(k0, k1, data, 0, data, len); }

/// SipHash-2-4 of `len` bytes at `data` under the 16 key bytes at `key` (k0 = bytes 0..7,
/// k1 = bytes 8..15, little-endian, as the paper's reference implementation reads its key).
constexpr u64 siphash24(const u8* key, const u8* data, u64 len) {
  return siphash24(siphash_detail::le64(key), siphash_detail::le64(key + 8), data, len);
}

} // namespace spin
