// SipHash-2-4 as the engine and the host compute it (spin/siphash.hpp): the reference
// vectors of the SipHash paper's implementation (key 00..0f, messages 00, 00 01, ..., of
// lengths 0 to 15), and every length up to 64 bytes differs from its neighbours.
#include <spin/siphash.hpp>

#include <doctest/doctest.h>

#include <set>

using namespace spin;

TEST_SUITE("collectives") {

TEST_CASE("siphash24 gives the reference vectors of SipHash-2-4") {
  const u64 k0 = 0x0706050403020100ull, k1 = 0x0f0e0d0c0b0a0908ull;
  u8 msg[64];
  for (u32 i = 0; i < 64; ++i) msg[i] = static_cast<u8>(i);
  CHECK(siphash24(k0, k1, msg, 0) == 0x726fdb47dd0e0e31ull);
  CHECK(siphash24(k0, k1, msg, 1) == 0x74f839c593dc67fdull);
  CHECK(siphash24(k0, k1, msg, 8) == 0x93f5f5799a932462ull);
  CHECK(siphash24(k0, k1, msg, 15) == 0xa129ca6149be45e5ull);
  std::set<u64> seen;
  for (u32 n = 0; n <= 64; ++n) seen.insert(siphash24(k0, k1, msg, n));
  CHECK(seen.size() == 65);
  CHECK(siphash24(k0 ^ 1, k1, msg, 15) != 0xa129ca6149be45e5ull);
  // The key as its 16 bytes 00..0f, as the reference implementation takes it.
  CHECK(siphash24(msg, msg, 15) == 0xa129ca6149be45e5ull);
}

TEST_CASE("siphash24 of a prefix and a tail equals siphash24 of their concatenation") {
  const u64 k0 = 0x0706050403020100ull, k1 = 0x0f0e0d0c0b0a0908ull;
  u8 msg[64];
  for (u32 i = 0; i < 64; ++i) msg[i] = static_cast<u8>(i);
  CHECK(siphash24(k0, k1, msg, 8, msg + 8, 7) == 0xa129ca6149be45e5ull);
  for (u32 p = 0; p <= 64; p += 8)
    for (u32 n = 0; p + n <= 64; ++n) CHECK(siphash24(k0, k1, msg, p, msg + p, n) == siphash24(k0, k1, msg, p + n));
}

} // TEST_SUITE
