// Block floating point (spin/coll/bfp.hpp) against a double-precision reference written here
// from the format's definition, its equality with MXINT8, and the block-format reductions of
// spin/coll/types.hpp (MX and BFP): in-place kernels against the value forms, and the rule
// result = encode(float32 reduction in order).
#include "block_codecs.hpp"

#include <spin/coll/bfp.hpp>
#include <spin/coll/types.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace spin;
using namespace spin::coll;

namespace {

constexpr bfp::format all[] = {{16, 8}, {32, 8}, {16, 16}, {32, 16}};

std::string label(bfp::format f) { return "bfp" + std::to_string(f.bits) + "_" + std::to_string(f.block); }
float f32(std::uint32_t b) { return std::bit_cast<float>(b); }
std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }

// The value of mantissa m under exponent byte x, by the definition: m x 2^(x-127) x 2^-(w-2).
double ref_value(bfp::format f, int x, int m) { return std::ldexp(static_cast<double>(m), x - 127 - (int(f.bits) - 2)); }

// The reference mantissa of value v under shared exponent se: v / 2^(se-(w-2)) rounded to
// nearest, ties to even, clamped to +-(2^(w-1) - 1).
int ref_mantissa(bfp::format f, double v, int se) {
  const double r = std::ldexp(v, -(se - (int(f.bits) - 2)));
  double q = std::nearbyint(r);  // the default rounding mode: nearest, ties to even
  const double lim = std::ldexp(1.0, int(f.bits) - 1) - 1;
  if (q > lim) q = lim;
  if (q < -lim) q = -lim;
  return static_cast<int>(q);
}

int ref_shared_exponent(const std::vector<float>& v) {
  double mx = 0;
  for (float x : v) mx = std::max(mx, std::fabs(static_cast<double>(x)));
  if (mx == 0) return -127;
  return std::max(-127, static_cast<int>(std::floor(std::log2(mx))));
}

std::vector<std::uint8_t> ref_encode(bfp::format f, const std::vector<float>& v) {
  std::vector<std::uint8_t> out(bfp::block_bytes(f), 0);
  for (float x : v)
    if (!std::isfinite(x)) {
      out[0] = 0xff;
      return out;
    }
  const int se = ref_shared_exponent(v);
  out[0] = static_cast<std::uint8_t>(se + 127);
  for (std::uint32_t i = 0; i < f.block; ++i) {
    const int m = ref_mantissa(f, v[i], se);
    if (f.bits == 8) {
      out[1 + i] = static_cast<std::uint8_t>(m);
    } else {
      out[1 + 2 * i] = static_cast<std::uint8_t>(m);
      out[2 + 2 * i] = static_cast<std::uint8_t>(static_cast<unsigned>(m) >> 8);
    }
  }
  return out;
}

// Random float32 values over a range of binades, with zeros, negative zeros and exact ties.
std::vector<float> random_block(std::mt19937_64& rng, std::uint32_t n, int lo_exp, int hi_exp) {
  if (hi_exp < lo_exp) hi_exp = lo_exp;
  std::vector<float> v(n);
  for (auto& x : v) {
    const std::uint64_t k = rng() % 16;
    if (k == 0) {
      x = 0.0f;
    } else if (k == 1) {
      x = -0.0f;
    } else {
      const int e = lo_exp + static_cast<int>(rng() % static_cast<std::uint64_t>(hi_exp - lo_exp + 1));
      const float m = 1.0f + static_cast<float>(rng() % (1u << 23)) / static_cast<float>(1u << 23);
      x = std::ldexp(k == 2 ? 1.5f : m, e) * ((rng() & 1) != 0 ? -1.0f : 1.0f);  // 1.5: a tie for small mantissas
    }
  }
  return v;
}

} // namespace

TEST_CASE("every BFP mantissa under every exponent decodes exactly to m x 2^(x-127-(w-2))") {
  constexpr double f32_max = 3.4028234663852886e38;
  for (bfp::format f : all) {
    INFO(label(f));
    const int lim = (1 << (f.bits - 1)) - 1;
    const int step = f.bits == 8 ? 1 : 7;  // 16-bit: every 7th mantissa and the ends
    for (int x = 0; x < 255; ++x) {
      for (int m = -lim - 1; m <= lim; m += (m > -lim && m < lim - step ? step : 1)) {
        const double want = ref_value(f, x, m);
        const std::uint32_t got = bfp::decode(f, static_cast<std::uint8_t>(x), m);
        INFO("x " << x << " m " << m);
        if (std::fabs(want) > f32_max) {  // only the most negative mantissa (never encoded) under exponent 254
          REQUIRE(m == -lim - 1);
          REQUIRE(x == 254);
          REQUIRE(got == 0xff800000u);
          REQUIRE(bfp::decode_native(f, static_cast<std::uint8_t>(x), m) == got);
          continue;
        }
        REQUIRE(static_cast<double>(static_cast<float>(want)) == want);  // every other BFP value is a float32
        REQUIRE(got == bits(static_cast<float>(want)));
        REQUIRE(bfp::decode_native(f, static_cast<std::uint8_t>(x), m) == got);
      }
    }
    CHECK(bfp::decode(f, 0xff, 5) == 0x7fc00000u);
    CHECK(bfp::decode(f, 0xff, 0) == 0x7fc00000u);
    CHECK(bfp::decode_native(f, 0xff, -3) == 0x7fc00000u);
  }
}

TEST_CASE("BFP blocks encode as the reference: shared exponent, nearest-even rounding, clamping, zero and NaN blocks") {
  std::mt19937_64 rng(7);
  for (bfp::format f : all) {
    INFO(label(f));
    for (int trial = 0; trial < 2000; ++trial) {
      const int lo = -150 + static_cast<int>(rng() % 270);
      std::vector<float> v = random_block(rng, f.block, std::max(-149, lo), std::min(127, lo + static_cast<int>(rng() % 40)));
      if (trial % 50 == 1) v.assign(f.block, 0.0f);
      if (trial % 50 == 2) v[rng() % f.block] = std::numeric_limits<float>::quiet_NaN();
      if (trial % 50 == 3) v[rng() % f.block] = -std::numeric_limits<float>::infinity();
      std::vector<std::uint32_t> in(f.block);
      for (std::uint32_t i = 0; i < f.block; ++i) in[i] = bits(v[i]);
      std::vector<std::uint8_t> got(bfp::block_bytes(f));
      bfp::encode_block(f, in.data(), got.data());
      const auto want = ref_encode(f, v);
      INFO("trial " << trial);
      REQUIRE(got == want);
      // Decoding gives the values the mantissas stand for; NaN blocks give NaN everywhere.
      std::vector<std::uint32_t> dec(f.block);
      bfp::decode_block(f, got.data(), dec.data());
      for (std::uint32_t i = 0; i < f.block; ++i) {
        if (got[0] == 0xff) {
          REQUIRE(dec[i] == 0x7fc00000u);
        } else {
          const int m = f.bits == 8 ? static_cast<std::int8_t>(got[1 + i])
                                    : static_cast<std::int16_t>(got[1 + 2 * i] | got[2 + 2 * i] << 8);
          REQUIRE(f32(dec[i]) == static_cast<float>(ref_value(f, got[0], m)));
        }
      }
    }
  }
}

TEST_CASE("BFP rounding: ties go to the even mantissa, the largest value saturates, the most negative code is never made") {
  const bfp::format f{16, 8};
  std::vector<std::uint32_t> in(16, bits(0.0f));
  std::vector<std::uint8_t> out(bfp::block_bytes(f));
  // Max 1.0: exponent 0 (byte 127), units of 2^-6. 2.5 units -> 2, 3.5 units -> 4, -2.5 -> -2.
  in[0] = bits(1.0f);
  in[1] = bits(2.5f / 64);
  in[2] = bits(3.5f / 64);
  in[3] = bits(-2.5f / 64);
  in[4] = bits(-1.999f);  // largest magnitude: exponent 0; -1.999 x 64 = -127.9 -> -128, clamped to -127
  bfp::encode_block(f, in.data(), out.data());
  CHECK(out[0] == 127);
  CHECK(static_cast<std::int8_t>(out[1]) == 64);
  CHECK(static_cast<std::int8_t>(out[2]) == 2);
  CHECK(static_cast<std::int8_t>(out[3]) == 4);
  CHECK(static_cast<std::int8_t>(out[4]) == -2);
  CHECK(static_cast<std::int8_t>(out[5]) == -127);
}

TEST_CASE("quantize_native and encode_block_native (float arithmetic) give quantize's mantissas and encode_block's bytes") {
  std::mt19937_64 rng(20261207);
  auto check = [&]<std::uint32_t Block, std::uint32_t Bits>() {
    constexpr bfp::format f{Block, Bits};
    CAPTURE(label(f));
    // Under every shared exponent: every mantissa's value, the midpoints between neighbours and
    // one float32 ulp either side, tiny values, random magnitudes below 2^(se+1); both signs.
    const int frac = static_cast<int>(Bits) - 2, most = (1 << (Bits - 1)) - 1;
    std::size_t wrong = 0, tried = 0;
    std::string first;
    for (int se = -127; se <= 127; ++se) {
      std::vector<float> vals;
      auto probe = [&](double x) {
        if (!(x <= FLT_MAX) || x >= std::ldexp(1.0, se + 1)) return;
        const float fx = static_cast<float>(x);
        for (float v : {fx, std::nextafter(fx, INFINITY), std::nextafter(fx, 0.0f)}) vals.push_back(v);
      };
      const int step = Bits == 8 ? 1 : 61;  // 16-bit mantissas: every 61st, and the top ones
      for (int m = 0; m <= most; m += (m > most - 200 ? 1 : step)) {
        probe(std::ldexp(static_cast<double>(m), se - frac));
        probe(std::ldexp(m + 0.5, se - frac));
      }
      for (double x : {1e-30, 1e-40, 3e-39}) probe(x);
      for (int k = 0; k < 200; ++k)
        probe(std::ldexp(std::uniform_real_distribution<double>(1, 2)(rng), se - static_cast<int>(rng() % 40) - 1));
      for (float v : vals)
        for (float sv : {v, -v}) {
          ++tried;
          const int got = bfp::quantize_native<Bits>(bits(sv), se), want = bfp::quantize(f, bits(sv), se);
          if (got != want && wrong++ == 0)
            first = "v " + std::to_string(sv) + " (" + std::to_string(bits(sv)) + ") se " + std::to_string(se) + ": got " +
                    std::to_string(got) + " want " + std::to_string(want);
        }
    }
    CHECK(tried > 100000);
    CHECK_MESSAGE(wrong == 0, first);
    // Whole blocks: random dynamic ranges, zeros of both signs, subnormals, NaN and infinity.
    for (int b = 0; b < 20000; ++b) {
      std::uint32_t in[Block];
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
      if (b % 1000 == 999) in[rng() % Block] = b % 2000 == 999 ? 0x7fc00000u : 0xff800000u;
      std::uint8_t o1[bfp::block_bytes(f)], o2[bfp::block_bytes(f)];
      bfp::encode_block_native<Block, Bits>(in, o1);
      bfp::encode_block(f, in, o2);
      INFO("block " << b);
      REQUIRE(std::memcmp(o1, o2, sizeof o1) == 0);
    }
  };
  check.template operator()<16, 8>();
  check.template operator()<32, 8>();
  check.template operator()<16, 16>();
  check.template operator()<32, 16>();
}

TEST_CASE("bfp8_32 blocks are MXINT8 blocks bit for bit") {
  std::mt19937_64 rng(11);
  const bfp::format f{32, 8};
  REQUIRE(bfp::block_bytes(f) == mx::block_bytes(mx::element::int8));
  for (int trial = 0; trial < 3000; ++trial) {
    const int lo = -150 + static_cast<int>(rng() % 270);
    std::vector<float> v = random_block(rng, 32, std::max(-149, lo), std::min(127, lo + static_cast<int>(rng() % 30)));
    if (trial % 100 == 1) v[3] = std::numeric_limits<float>::infinity();
    std::vector<std::uint32_t> in(32);
    for (int i = 0; i < 32; ++i) in[i] = bits(v[i]);
    std::vector<std::uint8_t> a(33), b(33);
    bfp::encode_block(f, in.data(), a.data());
    mx::encode_packed(mx::element::int8, in.data(), b.data());
    INFO("trial " << trial);
    REQUIRE(a == b);
    std::vector<std::uint32_t> da(32), db(32);
    bfp::decode_block(f, a.data(), da.data());
    mx::decode_block(mx::element::int8, b.data(), db.data());
    REQUIRE(da == db);
  }
}

namespace {

// The element-wise kernels of the standard reduction of (o, t), as an engine calls them.
struct kernels {
  std::uint32_t elem_bytes = 0, acc_bytes = 0;
  void (*widen)(void*, const void*, std::uint32_t) = nullptr;
  void (*fold)(void*, const void*, std::uint32_t) = nullptr;
  void (*narrow)(void*, const void*, std::uint32_t) = nullptr;
  void (*widen_fold)(void*, const void*, const void*, std::uint32_t) = nullptr;  // the switch's fused first step
  void (*fold_narrow)(void*, void*, const void*, std::uint32_t) = nullptr;     // and its fused last step
  void (*combine)(void*, const void*, std::uint32_t) = nullptr;
};
kernels kernels_for(op o, dtype t) {
  kernels k;
  REQUIRE(with_standard(o, t, [&]<class R>() {
    k = {sizeof(typename R::elem), sizeof(typename R::acc), &widen_n<R>, &fold_n<R>, &narrow_n<R>, &widen_fold_n<R>,
         &fold_narrow_n<R>, &combine_n<R>};
  }));
  return k;
}

using spin::coll::test::block_dtypes;

// Decodes block `b` of dtype t into float32 values, with the codecs' own block functions.
std::vector<float> decode_any(dtype t, const std::uint8_t* b) {
  std::vector<std::uint32_t> u(block_values(t));
  spin::coll::test::decode_block(t, b, u.data());
  std::vector<float> v(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) v[i] = f32(u[i]);
  return v;
}
// IEEE 754-2019 minimum and maximum on values without NaN: -0 below +0.
float ref_min(float a, float b) { return a < b ? a : b < a ? b : std::signbit(a) ? a : b; }
float ref_max(float a, float b) { return a > b ? a : b > a ? b : std::signbit(a) ? b : a; }

void encode_any(dtype t, const std::vector<float>& v, std::uint8_t* b) {
  std::vector<std::uint32_t> u(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) u[i] = bits(v[i]);
  spin::coll::test::encode_block(t, u.data(), b);
}

} // namespace

TEST_CASE("block-format reductions: element and accumulator sizes, and encode(float32 reduction in order) for sum, min and max") {
  std::mt19937_64 rng(3);
  for (dtype t : block_dtypes) {
    const std::uint32_t nv = block_values(t);
    const kernels k = kernels_for(op::sum, t);
    INFO(name(t));
    const std::uint32_t want_bytes[] = {33, 33, 25, 25, 17, 33, 17, 33, 33, 65};
    CHECK(k.elem_bytes == want_bytes[static_cast<int>(t) - static_cast<int>(dtype::mxfp8_e4m3)]);
    CHECK(k.acc_bytes == 4 * nv);
    CHECK(!with_standard(op::prod, t, []<class R>() {}));
    for (op o : {op::sum, op::min, op::max}) {
      const kernels kk = kernels_for(o, t);
      INFO(name(o));
      for (int trial = 0; trial < 200; ++trial) {
        const std::uint32_t ranks = 1 + static_cast<std::uint32_t>(rng() % 8), blocks = 1 + static_cast<std::uint32_t>(rng() % 5);
        std::vector<std::vector<std::uint8_t>> in(ranks, std::vector<std::uint8_t>(blocks * kk.elem_bytes));
        for (auto& r : in)
          for (std::uint32_t b = 0; b < blocks; ++b) {
            const int lo = -30 + static_cast<int>(rng() % 50);
            encode_any(t, random_block(rng, nv, lo, lo + static_cast<int>(rng() % 12)), r.data() + b * kk.elem_bytes);
          }
        // The kernels, as an engine runs them: widen the first, fold the others, narrow.
        std::vector<std::uint8_t> acc(blocks * kk.acc_bytes), got(blocks * kk.elem_bytes);
        kk.widen(acc.data(), in[0].data(), blocks);
        for (std::uint32_t r = 1; r < ranks; ++r) kk.fold(acc.data(), in[r].data(), blocks);
        kk.narrow(got.data(), acc.data(), blocks);
        // The rule, computed here: decode, reduce in float32 in rank order, encode once.
        std::vector<std::uint8_t> want(blocks * kk.elem_bytes);
        for (std::uint32_t b = 0; b < blocks; ++b) {
          std::vector<float> a = decode_any(t, in[0].data() + b * kk.elem_bytes);
          for (std::uint32_t r = 1; r < ranks; ++r) {
            const std::vector<float> x = decode_any(t, in[r].data() + b * kk.elem_bytes);
            for (std::uint32_t i = 0; i < nv; ++i)
              a[i] = o == op::sum ? a[i] + x[i] : o == op::min ? ref_min(a[i], x[i]) : ref_max(a[i], x[i]);
          }
          encode_any(t, a, want.data() + b * kk.elem_bytes);
        }
        INFO("ranks " << ranks << " blocks " << blocks);
        REQUIRE(got == want);
        // The switch's fused steps (widen_fold for the first two, fold_narrow for the last) give
        // the same blocks; so does combining widened accumulators (combine_n), as a ring does.
        if (ranks >= 2) {
          std::vector<std::uint8_t> acc2(blocks * kk.acc_bytes), fused(blocks * kk.elem_bytes);
          if (ranks == 2) {
            kk.widen(acc2.data(), in[0].data(), blocks);
          } else {
            kk.widen_fold(acc2.data(), in[0].data(), in[1].data(), blocks);
            for (std::uint32_t r = 2; r + 1 < ranks; ++r) kk.fold(acc2.data(), in[r].data(), blocks);
          }
          kk.fold_narrow(fused.data(), acc2.data(), in[ranks - 1].data(), blocks);
          REQUIRE(fused == want);
          std::vector<std::uint8_t> a0(blocks * kk.acc_bytes), a1(blocks * kk.acc_bytes), combined(blocks * kk.elem_bytes);
          kk.widen(a0.data(), in[0].data(), blocks);
          for (std::uint32_t r = 1; r < ranks; ++r) {
            kk.widen(a1.data(), in[r].data(), blocks);
            kk.combine(a0.data(), a1.data(), blocks);
          }
          kk.narrow(combined.data(), a0.data(), blocks);
          REQUIRE(combined == want);
        }
      }
    }
  }
}
