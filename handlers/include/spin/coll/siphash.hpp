// SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF", INDOCRYPT 2012,
// section 2): the keyed MAC that authenticates the collective engine's commands. Freestanding:
// the engine (a handler) and the host library compute it with this one definition.
#pragma once

#include <spin/handler.hpp>

namespace spin::coll {

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
} // namespace siphash_detail

/// SipHash-2-4 of `len` bytes at `data` under the 128-bit key (k0, k1) (the key's bytes 0..7 and
/// 8..15, little-endian). Any length; reads the bytes one at a time (no alignment needed).
constexpr u64 siphash24(u64 k0, u64 k1, const u8* data, u64 len) {
  siphash_detail::state s{k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull, k0 ^ 0x6c7967656e657261ull,
                          k1 ^ 0x7465646279746573ull};
  const u64 whole = len / 8 * 8;
  for (u64 i = 0; i < whole; i += 8) {
    u64 m = 0;
    for (u32 b = 0; b < 8; ++b) m |= u64{data[i + b]} << (8 * b);
    s.absorb(m);
  }
  u64 last = (len & 0xff) << 56;
  for (u64 b = 0; b < len - whole; ++b) last |= u64{data[whole + b]} << (8 * b);
  s.absorb(last);
  s.v2 ^= 0xff;
  s.round();
  s.round();
  s.round();
  s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

} // namespace spin::coll
