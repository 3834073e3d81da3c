// The MX codec (spin/coll/mx.hpp) against the OCP MX v1.0 specification: every code point of
// every element type, every scale, rounding and saturation against an independent reference
// built here in double precision from the spec's definitions, block conversion, wire packing.
#include <spin/coll/mx.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace spin;
using namespace spin::coll;

namespace {

constexpr mx::element all[] = {mx::element::fp8_e4m3, mx::element::fp8_e5m2, mx::element::fp6_e3m2,
                               mx::element::fp6_e2m3, mx::element::fp4_e2m1, mx::element::int8};

// The spec's table (section 5.3), written out again here: exponent and mantissa bits, bias,
// and which codes are special. Values in double; NaN and infinity as such.
struct ref_format {
  int bits, ebits, mbits, bias;
  double max_normal;
};
ref_format ref_of(mx::element e) {
  switch (e) {
  case mx::element::fp8_e4m3: return {8, 4, 3, 7, 448.0};
  case mx::element::fp8_e5m2: return {8, 5, 2, 15, 57344.0};
  case mx::element::fp6_e3m2: return {6, 3, 2, 3, 28.0};
  case mx::element::fp6_e2m3: return {6, 2, 3, 1, 7.5};
  case mx::element::fp4_e2m1: return {4, 2, 1, 1, 6.0};
  case mx::element::int8: return {8, 0, 0, 0, 127.0 / 64};
  }
  return {};
}

double ref_value(mx::element e, unsigned code) {
  const ref_format f = ref_of(e);
  if (e == mx::element::int8) return static_cast<std::int8_t>(code) / 64.0;
  const unsigned s = code >> (f.bits - 1) & 1, ef = code >> f.mbits & ((1u << f.ebits) - 1), m = code & ((1u << f.mbits) - 1);
  const double sign = s ? -1.0 : 1.0;
  if (e == mx::element::fp8_e4m3 && ef == 15 && m == 7) return std::nan("");
  if (e == mx::element::fp8_e5m2 && ef == 31) return m == 0 ? sign * INFINITY : std::nan("");
  if (ef == 0) return sign * std::ldexp(m / double(1 << f.mbits), 1 - f.bias);
  return sign * std::ldexp(1.0 + m / double(1 << f.mbits), int(ef) - f.bias);
}

float f32(std::uint32_t b) { return std::bit_cast<float>(b); }
std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }

// The reference conversion of one value r (already divided by the scale): the nearest finite
// code, ties to the even code (mantissa LSB 0; for INT8 the even integer), magnitudes above
// the largest normal clamped to it. Returns the code's value.
double ref_quantize(mx::element e, double r) {
  const ref_format f = ref_of(e);
  if (e == mx::element::int8) {
    double q = std::nearbyint(r * 64);  // the default rounding mode: to nearest, ties to even
    q = std::fmin(std::fmax(q, -127), 127);
    return q / 64;
  }
  if (std::fabs(r) >= f.max_normal) return std::copysign(f.max_normal, r);
  double best = 0, best_d = INFINITY;
  unsigned best_code = 0;
  for (unsigned c = 0; c < (1u << f.bits); ++c) {
    const double v = ref_value(e, c);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(v - r);
    if (d < best_d || (d == best_d && (c & 1) == 0 && (best_code & 1) != 0)) {
      best = v;
      best_d = d;
      best_code = c;
    }
  }
  return best == 0 ? std::copysign(0.0, r) : best;
}

// f.template operator()<E>() for each of the six element types, in mx::element's order.
template <class F> void for_each_element(F&& f) {
  f.template operator()<mx::element::fp8_e4m3>();
  f.template operator()<mx::element::fp8_e5m2>();
  f.template operator()<mx::element::fp6_e3m2>();
  f.template operator()<mx::element::fp6_e2m3>();
  f.template operator()<mx::element::fp4_e2m1>();
  f.template operator()<mx::element::int8>();
}

} // namespace

TEST_SUITE("mx") {

TEST_CASE("every code point of every element type decodes to the spec's value under scale 1") {
  for (mx::element e : all) {
    CAPTURE(mx::name(e));
    const ref_format f = ref_of(e);
    for (unsigned c = 0; c < (1u << f.bits); ++c) {
      CAPTURE(c);
      const double want = ref_value(e, c);
      const std::uint32_t got = mx::decode(e, 127, static_cast<std::uint8_t>(c));
      if (std::isnan(want))
        CHECK(got == mx::f32_nan);
      else
        CHECK(f32(got) == static_cast<float>(want));
      if (!std::isnan(want) && want == 0) CHECK((got >> 31) == (e == mx::element::int8 ? 0u : c >> (f.bits - 1)));
    }
  }
  // Landmarks of the spec's tables.
  CHECK(f32(mx::decode(mx::element::fp8_e4m3, 127, 0x7e)) == 448.0f);
  CHECK(mx::decode(mx::element::fp8_e4m3, 127, 0x7f) == mx::f32_nan);
  CHECK(mx::decode(mx::element::fp8_e4m3, 127, 0xff) == mx::f32_nan);
  CHECK(f32(mx::decode(mx::element::fp8_e4m3, 127, 0x01)) == std::ldexp(1.0f, -9));
  CHECK(f32(mx::decode(mx::element::fp8_e5m2, 127, 0x7b)) == 57344.0f);
  CHECK(mx::decode(mx::element::fp8_e5m2, 127, 0x7c) == 0x7f800000u);
  CHECK(mx::decode(mx::element::fp8_e5m2, 127, 0xfc) == 0xff800000u);
  CHECK(mx::decode(mx::element::fp8_e5m2, 127, 0x7d) == mx::f32_nan);
  CHECK(f32(mx::decode(mx::element::fp8_e5m2, 127, 0x01)) == std::ldexp(1.0f, -16));
  CHECK(f32(mx::decode(mx::element::fp6_e3m2, 127, 0x1f)) == 28.0f);
  CHECK(f32(mx::decode(mx::element::fp6_e3m2, 127, 0x01)) == 0.0625f);
  CHECK(f32(mx::decode(mx::element::fp6_e2m3, 127, 0x1f)) == 7.5f);
  CHECK(f32(mx::decode(mx::element::fp6_e2m3, 127, 0x01)) == 0.125f);
  const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (unsigned c = 0; c < 16; ++c) CHECK(f32(mx::decode(mx::element::fp4_e2m1, 127, std::uint8_t(c))) == (c & 8 ? -e2m1[c & 7] : e2m1[c & 7]));
  CHECK(f32(mx::decode(mx::element::int8, 127, 0x7f)) == 1.984375f);
  CHECK(f32(mx::decode(mx::element::int8, 127, 0x80)) == -2.0f);
  CHECK(mx::block_bytes(mx::element::fp8_e4m3) == 33);
  CHECK(mx::block_bytes(mx::element::fp6_e2m3) == 25);
  CHECK(mx::block_bytes(mx::element::fp4_e2m1) == 17);
  CHECK(mx::block_bytes(mx::element::int8) == 33);
}

TEST_CASE("under every scale, every code decodes to its value x 2^(scale-127), infinity past float32, NaN under scale 255") {
  for (mx::element e : all) {
    CAPTURE(mx::name(e));
    const ref_format f = ref_of(e);
    std::size_t wrong = 0;
    std::string first;
    for (unsigned s = 0; s < 255; ++s)
      for (unsigned c = 0; c < (1u << f.bits); ++c) {
        const double v = ref_value(e, c);
        const std::uint32_t got = mx::decode(e, static_cast<std::uint8_t>(s), static_cast<std::uint8_t>(c));
        bool ok;
        if (std::isnan(v)) {
          ok = got == mx::f32_nan;
        } else {
          const double want = std::ldexp(v, int(s) - 127);  // exact in double
          ok = std::fabs(want) > FLT_MAX ? got == (std::signbit(want) ? 0xff800000u : 0x7f800000u)
                                         : f32(got) == static_cast<float>(want) && (want != 0 || std::signbit(f32(got)) == std::signbit(want));
        }
        if (!ok && wrong++ == 0) first = "scale " + std::to_string(s) + " code " + std::to_string(c);
      }
    CHECK_MESSAGE(wrong == 0, first);
    for (unsigned c = 0; c < (1u << f.bits); ++c) CHECK(mx::decode(e, mx::scale_nan, std::uint8_t(c)) == mx::f32_nan);
  }
}

template <mx::element E> std::size_t decode_of_mismatches() {
  std::size_t wrong = 0;
  for (unsigned s = 0; s < 256; ++s)
    for (unsigned c = 0; c < 256; ++c)
      wrong += mx::decode_of<E>(std::uint8_t(s), std::uint8_t(c)) != mx::decode(E, std::uint8_t(s), std::uint8_t(c));
  return wrong;
}

TEST_CASE("the branch-free decode_of gives decode's bits for every scale and code") {
  CHECK(decode_of_mismatches<mx::element::fp8_e4m3>() == 0);
  CHECK(decode_of_mismatches<mx::element::fp8_e5m2>() == 0);
  CHECK(decode_of_mismatches<mx::element::fp6_e3m2>() == 0);
  CHECK(decode_of_mismatches<mx::element::fp6_e2m3>() == 0);
  CHECK(decode_of_mismatches<mx::element::fp4_e2m1>() == 0);
  CHECK(decode_of_mismatches<mx::element::int8>() == 0);
}

TEST_CASE("conversion rounds to nearest with ties to even and clamps to the largest normal, as the reference does") {
  std::mt19937_64 rng(20261205);
  for (mx::element e : all) {
    CAPTURE(mx::name(e));
    const ref_format f = ref_of(e);
    // Every code's value, the midpoints between neighbours (the ties), and values one float32
    // ulp on either side of them; under shared exponents -20 .. 20.
    std::vector<double> vals;
    for (unsigned c = 0; c < (1u << f.bits); ++c)
      if (std::isfinite(ref_value(e, c))) vals.push_back(ref_value(e, c));
    std::sort(vals.begin(), vals.end());
    std::vector<float> probes;
    for (std::size_t i = 0; i < vals.size(); ++i) {
      probes.push_back(float(vals[i]));
      if (i + 1 < vals.size()) {
        const float mid = float((vals[i] + vals[i + 1]) / 2);  // exact: neighbours differ in few bits
        probes.push_back(mid);
        probes.push_back(std::nextafter(mid, INFINITY));
        probes.push_back(std::nextafter(mid, -INFINITY));
      }
    }
    for (float x : {float(f.max_normal) * 1.0001f, float(f.max_normal) * 1.5f, float(f.max_normal) * 1000.0f, 1e-30f, -1e-30f, 1e-45f})
      probes.push_back(x);
    for (int k = 0; k < 2000; ++k) {
      std::uniform_real_distribution<double> mag(-12, 18);
      probes.push_back(float((rng() & 1 ? -1 : 1) * std::exp2(mag(rng))));
    }
    std::size_t wrong = 0;
    std::string first;
    for (int se = -20; se <= 20; se += 5)
      for (float r : probes) {
        const double scaled = std::ldexp(double(r), se);
        if (!(std::fabs(scaled) <= FLT_MAX) || (scaled != 0 && std::fabs(scaled) < FLT_MIN)) continue;  // not exact in float32
        const std::uint8_t code = mx::quantize(e, bits(float(scaled)), se);
        const double got = ref_value(e, code), want = ref_quantize(e, double(float(scaled)) / std::ldexp(1.0, se));
        if ((got != want || (std::signbit(got) != std::signbit(want) && e != mx::element::int8)) && wrong++ == 0)
          first = "r " + std::to_string(r) + " se " + std::to_string(se) + ": got " + std::to_string(got) + " want " + std::to_string(want);
      }
    CHECK_MESSAGE(wrong == 0, first);
    // The largest normal's code: E4M3 0x7e, E5M2 0x7b, E3M2 and E2M3 0x1f, E2M1 0x7, INT8 0x7f.
    const std::uint8_t max_code = e == mx::element::fp8_e4m3 ? 0x7e
                                  : e == mx::element::fp8_e5m2 ? 0x7b
                                  : e == mx::element::fp4_e2m1 ? 0x7
                                  : e == mx::element::int8     ? 0x7f
                                                               : 0x1f;
    CHECK(ref_value(e, max_code) == f.max_normal);
    CHECK(mx::quantize(e, bits(1e30f), 0) == max_code);
    CHECK(mx::quantize(e, bits(f.max_normal > 1000 ? 1e30f : 1000.0f), -100) == max_code);
    if (e == mx::element::int8) CHECK(mx::quantize(e, bits(-1e30f), 0) == 0x81);  // symmetric: never -128
  }
}

TEST_CASE("a block's scale is floor(log2 max) - emax_elem, and every element is the reference conversion") {
  std::mt19937_64 rng(7);
  for (mx::element e : all) {
    CAPTURE(mx::name(e));
    std::size_t wrong = 0;
    std::string first;
    for (int b = 0; b < 300; ++b) {
      std::uniform_real_distribution<double> mag(-30 + b % 50, -20 + b % 50);
      std::uint32_t in[32];
      for (auto& x : in) x = bits(float((rng() & 1 ? -1 : 1) * std::exp2(mag(rng))));
      if (b % 7 == 0) in[b % 32] = 0x80000000u;  // a negative zero
      std::uint8_t codes[32];
      const std::uint8_t scale = mx::encode_block(e, in, codes);
      double mx_abs = 0;
      for (auto x : in) mx_abs = std::fmax(mx_abs, std::fabs(double(f32(x))));
      const int want_se = std::clamp(std::ilogb(mx_abs) - mx::spec_of(e).emax, -127, 127);
      if (scale != want_se + 127 && wrong++ == 0) first = "block " + std::to_string(b) + ": scale " + std::to_string(scale);
      for (int i = 0; i < 32; ++i) {
        const double want = ref_quantize(e, double(f32(in[i])) / std::ldexp(1.0, want_se));
        const double got = ref_value(e, codes[i]);
        if ((got != want || (std::signbit(got) != std::signbit(want) && e != mx::element::int8)) && wrong++ == 0)
          first = "block " + std::to_string(b) + " element " + std::to_string(i);
        // Decoding gives the quantized value times the scale, exactly.
        if (f32(mx::decode(e, scale, codes[i])) != float(std::ldexp(want, want_se)) && wrong++ == 0)
          first = "block " + std::to_string(b) + " decode of element " + std::to_string(i);
      }
    }
    CHECK_MESSAGE(wrong == 0, first);
  }
}

TEST_CASE("a block of zeros takes the smallest scale; a NaN or an infinity makes the scale NaN and every element NaN") {
  for (mx::element e : all) {
    CAPTURE(mx::name(e));
    std::uint32_t in[32] = {};
    in[3] = 0x80000000u;
    std::uint8_t codes[32];
    CHECK(mx::encode_block(e, in, codes) == 0);
    for (int i = 0; i < 32; ++i) CHECK(f32(mx::decode(e, 0, codes[i])) == 0.0f);
    CHECK(std::signbit(f32(mx::decode(e, 0, codes[3]))) == (e != mx::element::int8));
    for (std::uint32_t special : {0x7fc00000u, 0xffc00001u, 0x7f800000u, 0xff800000u}) {
      std::uint32_t blk[32];
      for (int i = 0; i < 32; ++i) blk[i] = bits(float(i) - 7.5f);
      blk[17] = special;
      CHECK(mx::encode_block(e, blk, codes) == mx::scale_nan);
      for (int i = 0; i < 32; ++i) CHECK(mx::decode(e, mx::scale_nan, codes[i]) == mx::f32_nan);
    }
  }
}

TEST_CASE("every finite code survives decode then encode under every scale that keeps it in float32") {
  for (mx::element e : all) {
    CAPTURE(mx::name(e));
    std::size_t wrong = 0;
    std::string first;
    for (int s = 0; s < 255; ++s)
      for (unsigned c = 0; c < (1u << ref_of(e).bits); ++c) {
        const std::uint32_t v = mx::decode(e, std::uint8_t(s), std::uint8_t(c));
        if (!std::isfinite(ref_value(e, c)) || (v & 0x7f800000u) == 0x7f800000u) continue;
        if (e == mx::element::int8 && c == 0x80) continue;  // -2 clamps to -127/64: the encoder is symmetric
        const std::uint8_t back = mx::quantize(e, v, s - 127);
        if (back != c && wrong++ == 0) first = "scale " + std::to_string(s) + " code " + std::to_string(c) + " -> " + std::to_string(back);
      }
    CHECK_MESSAGE(wrong == 0, first);
  }
}

TEST_CASE("packing puts four FP6 codes in three bytes and two FP4 codes in a byte, and unpacking returns them") {
  std::mt19937 rng(3);
  for (mx::element e : all) {
    CAPTURE(mx::name(e));
    const unsigned b = ref_of(e).bits;
    std::uint8_t codes[32], packed[32] = {}, back[32] = {};
    for (auto& c : codes) c = static_cast<std::uint8_t>(rng() & ((1u << b) - 1));
    mx::pack(e, codes, packed);
    mx::unpack(e, packed, back);
    for (int i = 0; i < 32; ++i) CHECK(back[i] == codes[i]);
  }
  std::uint8_t codes[32] = {0x1, 0x2, 0x3, 0x3f}, packed[32] = {};
  mx::pack(mx::element::fp4_e2m1, codes, packed);
  CHECK(packed[0] == 0x21);
  CHECK(packed[1] == 0xf3);
  mx::pack(mx::element::fp6_e2m3, codes, packed);
  // 0x3f<<18 | 3<<12 | 2<<6 | 1 = 0xfc3081, little endian.
  CHECK(packed[0] == 0x81);
  CHECK(packed[1] == 0x30);
  CHECK(packed[2] == 0xfc);
}

TEST_CASE("code_at reads each packed code as unpack does, and decode_block and encode_packed are unpack+decode and encode+pack") {
  std::mt19937 rng(5);
  for (mx::element e : all) {
    CAPTURE(mx::name(e));
    const unsigned b = ref_of(e).bits;
    for (int trial = 0; trial < 200; ++trial) {
      std::uint8_t block[33] = {}, codes[32], back[32];
      block[0] = static_cast<std::uint8_t>(rng() % 256);
      for (auto& c : codes) c = static_cast<std::uint8_t>(rng() & ((1u << b) - 1));
      mx::pack(e, codes, block + 1);
      mx::unpack(e, block + 1, back);
      std::uint32_t dec[32];
      mx::decode_block(e, block, dec);
      for (std::uint32_t i = 0; i < 32; ++i) {
        REQUIRE(mx::code_at(e, block + 1, i) == codes[i]);
        REQUIRE(dec[i] == mx::decode(e, block[0], codes[i]));
      }
      // Re-encoding the decoded values (finite blocks) gives the same scale and codes as
      // encode_block and pack, byte for byte.
      std::uint8_t again[33] = {}, want_codes[32];
      bool finite = true;
      for (std::uint32_t v : dec) finite = finite && (v & 0x7fffffffu) < 0x7f800000u;
      if (!finite) continue;
      mx::encode_packed(e, dec, again);
      std::uint8_t of[33] = {};
      for_each_element([&]<mx::element E>() {
        if (E == e) mx::encode_packed_of<E>(dec, of);
      });
      REQUIRE(std::equal(again, again + mx::block_bytes(e), of));
      const std::uint8_t scale = mx::encode_block(e, dec, want_codes);
      std::uint8_t want[33] = {};
      want[0] = scale;
      mx::pack(e, want_codes, want + 1);
      REQUIRE(std::equal(again, again + mx::block_bytes(e), want));
    }
  }
}

TEST_CASE("decode_native (float arithmetic) gives decode's bits for every scale and code of every element type") {
  auto check = [&]<mx::element E>() {
    CAPTURE(mx::name(E));
    for (unsigned s = 0; s < 256; ++s)
      for (unsigned c = 0; c < (1u << mx::spec_of(E).bits); ++c) {
        CAPTURE(s);
        CAPTURE(c);
        REQUIRE(mx::decode_native<E>(static_cast<std::uint8_t>(s), static_cast<std::uint8_t>(c)) ==
                mx::decode(E, static_cast<std::uint8_t>(s), static_cast<std::uint8_t>(c)));
      }
  };
  for_each_element(check);
}

TEST_CASE("quantize_native and encode_block_native (float arithmetic) give quantize_of's codes and encode_block_of's blocks") {
  std::mt19937_64 rng(20261206);
  auto check = [&]<mx::element E>() {
    CAPTURE(mx::name(E));
    constexpr mx::format f = mx::spec_of(E);
    // Under every shared exponent: every code's value, the midpoints between neighbours and
    // one float32 ulp either side, values far below the smallest subnormal, random magnitudes
    // over the block's whole range; each with both signs, where float32 holds it exactly.
    std::vector<double> grid;
    for (unsigned c = 0; c < (1u << f.bits); ++c) {
      const float v = std::bit_cast<float>(mx::decode(E, 127, static_cast<std::uint8_t>(c)));
      if (std::isfinite(v) && v >= 0) grid.push_back(v);
    }
    std::sort(grid.begin(), grid.end());
    std::vector<double> probes = grid;
    for (std::size_t i = 0; i + 1 < grid.size(); ++i) probes.push_back((grid[i] + grid[i + 1]) / 2);
    for (double x : {1e-30, 1e-40, 3e-39, std::ldexp(1.0, f.emax + 1) * 0.999, std::ldexp(1.0, f.emax + 1) * 1.5})
      probes.push_back(x);
    std::size_t wrong = 0, tried = 0;
    std::string first;
    for (int se = -127; se <= 127; ++se) {
      std::vector<float> vals;
      for (double p : probes) {
        const double x = std::ldexp(p, se);
        if (!(x <= FLT_MAX)) continue;
        const float fx = static_cast<float>(x);
        vals.push_back(fx);
        vals.push_back(std::nextafter(fx, INFINITY));
        vals.push_back(std::nextafter(fx, 0.0f));
      }
      for (int k = 0; k < 200; ++k) {
        const double x = std::ldexp(std::uniform_real_distribution<double>(1, 2)(rng), se + f.emax - static_cast<int>(rng() % 40));
        if (x <= FLT_MAX) vals.push_back(static_cast<float>(x));
      }
      for (float v : vals)
        for (float sv : {v, -v}) {
          // The precondition: a value of a block whose shared exponent is se.
          if (!std::isfinite(sv) || std::fabs(static_cast<double>(sv)) >= std::ldexp(1.0, se + f.emax + 2)) continue;
          ++tried;
          const std::uint8_t got = mx::quantize_native<E>(bits(sv), se), want = mx::quantize_of<E>(bits(sv), se);
          if (got != want && wrong++ == 0)
            first = "v " + std::to_string(sv) + " (" + std::to_string(bits(sv)) + ") se " + std::to_string(se) + ": got " +
                    std::to_string(got) + " want " + std::to_string(want);
        }
    }
    CHECK(tried > 100000);
    CHECK_MESSAGE(wrong == 0, first);
    // Whole blocks: random dynamic ranges, zeros of both signs, subnormals, NaN and infinity.
    for (int b = 0; b < 20000; ++b) {
      std::uint32_t in[32];
      const int top = static_cast<int>(rng() % 260) - 130, spread = static_cast<int>(rng() % 30);
      for (auto& x : in) {
        const std::uint64_t pick = rng() % 100;
        if (pick < 5) x = pick < 3 ? 0u : 0x80000000u;
        else if (pick < 7) x = static_cast<std::uint32_t>(rng() % 0x00800000u) | (pick == 6 ? 0x80000000u : 0u);
        else {
          const double m = std::ldexp(std::uniform_real_distribution<double>(1, 2)(rng), top - static_cast<int>(rng() % (spread + 1)));
          x = bits(static_cast<float>(m <= FLT_MAX ? m : FLT_MAX)) | (rng() & 1 ? 0x80000000u : 0u);
        }
      }
      if (b % 1000 == 999) in[rng() % 32] = b % 2000 == 999 ? 0x7fc00000u : 0xff800000u;
      std::uint8_t c1[32], c2[32];
      const std::uint8_t s1 = mx::encode_block_native<E>(in, c1), s2 = mx::encode_block_of<E>(in, c2);
      REQUIRE(s1 == s2);
      REQUIRE(std::memcmp(c1, c2, 32) == 0);
    }
  };
  for_each_element(check);
}

TEST_CASE("the codec is constexpr (it runs in handlers on both targets)") {
  static_assert(mx::decode(mx::element::fp8_e4m3, 127, 0x7e) == 0x43e00000u);  // 448
  static_assert(mx::quantize(mx::element::fp4_e2m1, 0x40a00000u, 0) == 0x6);   // 5 -> 4 (tie to even)
  static_assert(mx::quantize(mx::element::fp4_e2m1, 0x40300000u, 0) == 0x5);   // 2.75 -> 3
  static_assert(mx::shared_exponent(mx::element::fp8_e5m2, 0x3f800000u) == -15);
}

} // TEST_SUITE
