// Sparse allreduce (communicator::allreduce_sparse, spin/coll/sparse.hpp, docs/collectives.md
// "Sparse allreduce"): the result is the float32 sum of the ranks' scattered vectors (absent
// values are +0) in the fixed order (window w of chunk c summed from rank c+1 around to rank
// c), rounded to the value type once; bit for bit on every rank, on the edge ring and through
// the switch, across runs and under loss; bad arguments give a clear error on every rank. The
// reference here scatters the pairs and adds in that order itself.
#include "coll_world.hpp"

#include <spin/coll/sparse.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace spin;
using namespace spin::coll;
using spin::coll::test::world;

namespace {

constexpr std::uint32_t W = sparse::window_values;

// One rank's pairs; values as raw bits of the value type (low 16 bits for bf16 and f16).
struct pairs {
  std::vector<std::uint32_t> index;
  std::vector<std::uint32_t> bits;
};

std::uint32_t vbytes(dtype t) { return t == dtype::f32 ? 4 : 2; }

std::uint32_t widen(dtype t, std::uint32_t v) {
  if (t == dtype::f32) return v;
  if (t == dtype::bf16) return bf16_to_f32_bits(static_cast<std::uint16_t>(v));
  return f16_to_f32_bits(static_cast<std::uint16_t>(v));
}
std::uint32_t narrow(dtype t, std::uint32_t a) {
  if (t == dtype::f32) return (a & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : a;
  if (t == dtype::bf16) return f32_to_bf16_bits(a);
  return f32_to_f16_bits(a);
}
std::uint32_t from_float(dtype t, float f) { return narrow(t, std::bit_cast<std::uint32_t>(f)); }

std::vector<std::byte> raw_values(dtype t, const pairs& p) {
  const std::uint32_t vb = vbytes(t);
  std::vector<std::byte> out(p.bits.size() * vb);
  for (std::size_t k = 0; k < p.bits.size(); ++k) {
    if (vb == 4) std::memcpy(out.data() + 4 * k, &p.bits[k], 4);
    else {
      const auto h = static_cast<std::uint16_t>(p.bits[k]);
      std::memcpy(out.data() + 2 * k, &h, 2);
    }
  }
  return out;
}

// The result, value by value as raw bits of t, in the documented order: epochs of `seg` windows
// (communicator::epoch_elements), each cut into n chunks, chunk c added from rank c+1 around.
std::vector<std::uint32_t> reference(dtype t, const std::vector<pairs>& in, std::uint64_t length,
                                     std::uint64_t seg = std::uint64_t{1} << 40) {
  const auto n = static_cast<std::uint32_t>(in.size());
  std::vector<std::vector<float>> dense(n, std::vector<float>(length, 0.0f));
  for (std::uint32_t r = 0; r < n; ++r)
    for (std::size_t k = 0; k < in[r].index.size(); ++k) dense[r][in[r].index[k]] = std::bit_cast<float>(widen(t, in[r].bits[k]));
  std::vector<std::uint32_t> out(length);
  const std::uint64_t nw = (length + W - 1) / W;
  for (std::uint64_t e0 = 0; e0 < nw; e0 += seg) {
    const std::uint64_t m = std::min(seg, nw - e0), base = m / n, extra = m % n;
    for (std::uint64_t c = 0, lo = e0; c < n; ++c) {
      const std::uint64_t len = base + (c < extra ? 1 : 0);
      for (std::uint64_t i = lo * W; i < std::min<std::uint64_t>((lo + len) * W, length); ++i) {
        float acc = dense[(c + 1) % n][i];
        for (std::uint32_t k = 2; k <= n; ++k) acc = acc + dense[(c + k) % n][i];
        out[i] = narrow(t, std::bit_cast<std::uint32_t>(acc));
      }
      lo += len;
    }
  }
  return out;
}

// Rank r's pairs over `length`: each index with probability `density` (all of them at 1), values
// of a spread of binades and signs, with some -0 and explicit +0 values; `shared` makes every
// rank pick the same indices.
pairs make_pairs(dtype t, std::uint32_t r, std::uint64_t length, double density, bool shared, std::uint64_t seed) {
  std::mt19937_64 pick(seed * 7919 + (shared ? 0 : r + 1)), val(seed * 104729 + r);
  std::uniform_real_distribution<double> u(0, 1);
  pairs p;
  for (std::uint64_t i = 0; i < length; ++i) {
    if (density < 1 && u(pick) >= density) continue;
    const double x = u(val);
    float f;
    if (x < 0.03) f = -0.0f;
    else if (x < 0.05) f = 0.0f;
    else f = std::ldexp(static_cast<float>(u(val) * 2 - 1), static_cast<int>(u(val) * 24) - 12);
    p.index.push_back(static_cast<std::uint32_t>(i));
    p.bits.push_back(from_float(t, f));
  }
  return p;
}

// The pairs form of a result: every index whose value (vb bytes, little-endian) is not +0,
// ascending, with its value, as `want` (the dense result, one value per u32) holds them.
void expect_pairs(const std::vector<std::uint32_t>& idx, const std::vector<std::byte>& values, const std::vector<std::uint32_t>& want,
                  std::uint32_t vb) {
  std::vector<std::uint32_t> wi, wv;
  for (std::uint64_t i = 0; i < want.size(); ++i)
    if (want[i] != 0) {
      wi.push_back(static_cast<std::uint32_t>(i));
      wv.push_back(want[i]);
    }
  REQUIRE(idx == wi);
  REQUIRE(values.size() == wv.size() * vb);
  for (std::size_t k = 0; k < wv.size(); ++k) {
    std::uint32_t got = 0;
    std::memcpy(&got, values.data() + k * vb, vb);
    REQUIRE(got == wv[k]);
  }
}

void check(world& w, dtype t, const std::vector<pairs>& in, std::uint64_t length, algorithm a, const std::string& what) {
  const std::uint32_t n = w.size(), vb = vbytes(t);
  const auto want = reference(t, in, length, w.comms[0]->epoch_elements(window_type_of(t)));
  std::vector<std::vector<std::byte>> vals(n), dense(n, std::vector<std::byte>(length * vb, std::byte{0xa5}));
  for (std::uint32_t r = 0; r < n; ++r) vals[r] = raw_values(t, in[r]);
  auto res = w.run([&](std::uint32_t r) {
    return w.comms[r]->allreduce_sparse(in[r].index, vals[r].data(), length, t, dense[r].data(), a);
  });
  std::vector<std::vector<std::uint32_t>> idx(n);
  std::vector<std::vector<std::byte>> pv(n);
  auto res2 = w.run([&](std::uint32_t r) {
    return w.comms[r]->allreduce_sparse(in[r].index, vals[r].data(), length, t, idx[r], pv[r], a);
  });
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO(what << ": ranks " << n << " rank " << r << " " << std::string(name(t)) << " length " << length << " "
              << std::string(name(a)));
    if (!res[r].ok()) {
      auto k = w.comms[r]->engine_counters();
      if (k.ok()) {
        std::string d;
        for (std::uint32_t i = 0; i < proto::dr_count; ++i) d += std::to_string(k.value().drops[i]) + " ";
        MESSAGE("drops by reason: " << d);
      }
    }
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    REQUIRE_MESSAGE(res2[r].ok(), (res2[r].ok() ? std::string() : res2[r].err().message));
    long long bad = -1;
    for (std::uint64_t i = 0; i < length && bad < 0; ++i) {
      std::uint32_t got = 0;
      std::memcpy(&got, dense[r].data() + i * vb, vb);
      if (got != want[i]) bad = static_cast<long long>(i);
    }
    REQUIRE_MESSAGE(bad < 0, "first wrong value " << bad << " of the dense result");
    expect_pairs(idx[r], pv[r], want, vb);
  }
}

void check_random(world& w, dtype t, std::uint64_t length, double density, algorithm a, std::uint64_t seed, bool shared = false) {
  std::vector<pairs> in;
  for (std::uint32_t r = 0; r < w.size(); ++r) in.push_back(make_pairs(t, r, length, density, shared, seed));
  check(w, t, in, length, a, "density " + std::to_string(density) + (shared ? " shared" : ""));
}

// ---- MX values (windows of sparse_mx*: float32 values in and out) ----
// The reference: each rank's window blocks of 32 (the last one of a window: 28 values and four
// +0) encoded from its float32 values and decoded with mx.hpp's run-time codec, the decoded
// values added in the fixed order, the sums encoded and decoded once.
void mx_round_trip(mx::element e, std::uint32_t* v32) {
  std::uint8_t codes[32];
  const std::uint8_t scale = mx::encode_block(e, v32, codes);
  for (std::uint32_t i = 0; i < 32; ++i) v32[i] = mx::decode(e, scale, codes[i]);
}
void mx_round_trip_windows(mx::element e, std::vector<std::uint32_t>& v) {  // v: whole windows
  for (std::size_t w = 0; w < v.size(); w += W)
    for (std::uint32_t j = 0; j < sparse::mx_blocks; ++j) {
      std::uint32_t b[32] = {};
      for (std::uint32_t i = 0; i < 32 && j * 32 + i < W; ++i) b[i] = v[w + j * 32 + i];
      mx_round_trip(e, b);
      for (std::uint32_t i = 0; i < 32 && j * 32 + i < W; ++i) v[w + j * 32 + i] = b[i];
    }
}
std::vector<std::uint32_t> reference_mx(mx::element e, const std::vector<pairs>& in, std::uint64_t length) {
  const auto n = static_cast<std::uint32_t>(in.size());
  const std::uint64_t nw = (length + W - 1) / W, padded = nw * W;
  std::vector<std::vector<std::uint32_t>> dense(n, std::vector<std::uint32_t>(padded, 0));
  for (std::uint32_t r = 0; r < n; ++r) {
    for (std::size_t k = 0; k < in[r].index.size(); ++k) dense[r][in[r].index[k]] = in[r].bits[k];
    mx_round_trip_windows(e, dense[r]);
  }
  std::vector<std::uint32_t> sum(padded);
  const std::uint64_t base = nw / n, extra = nw % n;
  for (std::uint64_t c = 0, lo = 0; c < n; ++c) {
    const std::uint64_t len = base + (c < extra ? 1 : 0);
    for (std::uint64_t i = lo * W; i < (lo + len) * W; ++i) {
      float acc = std::bit_cast<float>(dense[(c + 1) % n][i]);
      for (std::uint32_t k = 2; k <= n; ++k) acc = acc + std::bit_cast<float>(dense[(c + k) % n][i]);
      sum[i] = std::bit_cast<std::uint32_t>(acc);
    }
    lo += len;
  }
  mx_round_trip_windows(e, sum);
  sum.resize(length);
  return sum;
}

// Both forms of the call; float32 values in and out, compared bit for bit on every rank.
void check_mx(world& w, dtype t, const std::vector<pairs>& in, std::uint64_t length, algorithm a, const std::string& what) {
  const std::uint32_t n = w.size();
  mx::element e{};
  REQUIRE(mx_element_of(t, e));
  const auto want = reference_mx(e, in, length);
  std::vector<std::vector<std::uint32_t>> dense(n, std::vector<std::uint32_t>(length, 0xa5a5a5a5u)), idx(n);
  std::vector<std::vector<std::byte>> pv(n);
  auto res = w.run([&](std::uint32_t r) {
    return w.comms[r]->allreduce_sparse(in[r].index, in[r].bits.data(), length, t, dense[r].data(), a);
  });
  auto res2 = w.run([&](std::uint32_t r) {
    return w.comms[r]->allreduce_sparse(in[r].index, in[r].bits.data(), length, t, idx[r], pv[r], a);
  });
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO(what << ": ranks " << n << " rank " << r << " " << std::string(name(t)) << " length " << length << " "
              << std::string(name(a)));
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    REQUIRE_MESSAGE(res2[r].ok(), (res2[r].ok() ? std::string() : res2[r].err().message));
    long long bad = -1;
    for (std::uint64_t i = 0; i < length && bad < 0; ++i)
      if (dense[r][i] != want[i]) bad = static_cast<long long>(i);
    REQUIRE_MESSAGE(bad < 0, "first wrong value " << bad << " of the dense result: " << std::hex
                                                  << (bad < 0 ? 0 : dense[r][bad]) << " want " << (bad < 0 ? 0 : want[bad]));
    expect_pairs(idx[r], pv[r], want, 4);
  }
}

constexpr dtype mx_types[] = {dtype::mxfp8_e4m3, dtype::mxfp8_e5m2, dtype::mxfp6_e3m2,
                              dtype::mxfp6_e2m3, dtype::mxfp4_e2m1, dtype::mxint8};

std::uint64_t link_bytes(world& w) {
  std::uint64_t b = 0;
  for (const auto& l : w.cluster->stats().links) b += l.stats.bytes_in;
  return b;
}

} // namespace

TEST_CASE("sparse windows: sizes, the switch-over point and validation") {
  CHECK(elem_bytes(dtype::sparse_f32) == 4 + 4 * W);
  CHECK(elem_bytes(dtype::sparse_bf16) == 4 + 2 * W);
  CHECK(elem_bytes(dtype::sparse_f16) == 4 + 2 * W);
  CHECK(compact_type(dtype::sparse_f32));
  CHECK(!compact_type(dtype::f32));
  CHECK(!compact_type(dtype::mxfp8_e4m3));
  // Dense once pairs would take as many bytes: 2/3 of the window for 4-byte values, 1/2 for 2.
  CHECK(sparse::max_pairs(4) == 679);
  CHECK(sparse::max_pairs(2) == 509);
  CHECK(sparse::pairs_bytes(679, 4) < sparse::dense_bytes(4));
  CHECK(sparse::pairs_bytes(680, 4) >= sparse::dense_bytes(4));
  std::uint8_t w[8] = {};
  sparse::store16(w, 1);
  sparse::store16(w + 2, sparse::form_pairs);
  sparse::store16(w + 4, 7);
  CHECK(sparse::valid(w, sparse::pairs_bytes(1, 2), 2));
  CHECK(!sparse::valid(w, sparse::pairs_bytes(1, 2) + 1, 2));  // longer than its form
  sparse::store16(w + 4, W);                                    // offset past the window
  CHECK(!sparse::valid(w, sparse::pairs_bytes(1, 2), 2));
  sparse::store16(w + 2, 7);  // unknown form
  CHECK(!sparse::valid(w, sparse::pairs_bytes(1, 2), 2));
  std::uint8_t two[12] = {};
  sparse::store16(two, 2);
  sparse::store16(two + 4, 5);
  sparse::store16(two + 6, 5);  // offsets not strictly ascending
  CHECK(!sparse::valid(two, sparse::pairs_bytes(2, 2), 2));
  sparse::store16(two + 6, 6);
  CHECK(sparse::valid(two, sparse::pairs_bytes(2, 2), 2));
  // Spans: offsets up to 64 windows' values, the pairs form's layout, never dense; only where
  // spans are allowed (sum_sparse's elements and accumulators, not the MX windows' partial sums).
  CHECK(sparse::span_values_max == 64 * W);
  sparse::store16(w, 1);
  sparse::store16(w + 2, sparse::form_span);
  sparse::store16(w + 4, static_cast<std::uint16_t>(sparse::span_values_max - 1));
  CHECK(sparse::valid(w, sparse::pairs_bytes(1, 2), 2));
  CHECK(!sparse::valid(w, sparse::pairs_bytes(1, 2), 2, false));
  CHECK(!sum_sparse_mx<mx::element::fp8_e4m3>::acc_valid(w, sparse::pairs_bytes(1, 2)));
  sparse::store16(w + 4, static_cast<std::uint16_t>(sparse::span_values_max));
  CHECK(!sparse::valid(w, sparse::pairs_bytes(1, 2), 2));
  sparse::store16(w, sparse::max_pairs(2) + 1);  // more than a packet of 2-byte values holds
  CHECK(!sparse::valid(w, sparse::pairs_bytes(sparse::max_pairs(2) + 1, 2), 2));
  sparse::store16(w, 0);
  sparse::store16(w + 2, sparse::form_overflow);  // an overflowed sum: never valid
  CHECK(!sparse::valid(w, sparse::head_bytes, 4));
  sparse::store16(w + 2, sparse::form_span);
  CHECK(sparse::valid(w, sparse::head_bytes, 4));  // an empty span (padding)
}

TEST_CASE("a span's accumulator: merged as the dense sum adds, -0 and cancellations unlisted, overflow never delivered") {
  using R = sum_sparse<sparse_value_f32>;
  // Three contributions to one span, as a switch slot gets them: widen the first, fold the others.
  auto span_of = [](std::vector<std::pair<std::uint16_t, float>> v) {
    R::elem e{};
    sparse::store16(e.b, static_cast<std::uint16_t>(v.size()));
    sparse::store16(e.b + 2, sparse::form_span);
    std::uint8_t* off = e.b + sparse::head_bytes;
    std::uint8_t* val = off + sparse::offset_bytes(static_cast<std::uint32_t>(v.size()));
    for (std::size_t k = 0; k < v.size(); ++k) {
      sparse::store16(off + 2 * k, v[k].first);
      std::memcpy(val + 4 * k, &v[k].second, 4);
    }
    return e;
  };
  const R::elem a = span_of({{3, -0.0f}, {900, 1.5f}, {5000, 1e-3f}, {65000, 2.0f}});
  const R::elem b = span_of({{900, -1.5f}, {4000, -0.0f}, {5000, 1e8f}});
  const R::elem c = span_of({{3, -0.0f}, {5000, -1e8f}, {64000, std::numeric_limits<float>::quiet_NaN()}});
  R::acc acc{};
  R::widen_into(acc, a);
  R::fold_into(acc, b);
  R::fold_into(acc, c);
  R::elem out{};
  R::narrow_into(out, acc);
  REQUIRE(sparse::valid(out.b, sparse::length(out.b, 4), 4));
  REQUIRE(sparse::form_of(out.b) == sparse::form_span);
  // The dense sums: 3: -0 + +0 + -0 = +0; 900: 1.5 - 1.5 = +0; 4000: +0 + -0 + +0 = +0;
  // 5000: (1e-3 + 1e8) - 1e8 = 0 in float32 (1e-3 is lost) = +0; 64000: NaN; 65000: 2.
  REQUIRE(sparse::count_of(out.b) == 2);
  CHECK(sparse::load16(sparse::offsets(out.b)) == 64000);
  CHECK(sparse::load16(sparse::offsets(out.b) + 2) == 65000);
  float v0, v1;
  std::memcpy(&v0, sparse::pair_values(out.b), 4);
  std::memcpy(&v1, sparse::pair_values(out.b) + 4, 4);
  CHECK(std::isnan(v0));
  CHECK(v1 == 2.0f);
  // -0 from the only contribution stays -0 (listed); a later rank's unlisted +0 makes it +0.
  R::widen_into(acc, span_of({{7, -0.0f}}));
  R::narrow_into(out, acc);
  REQUIRE(sparse::count_of(out.b) == 1);
  CHECK(sparse::load32(sparse::pair_values(out.b)) == 0x80000000u);
  R::fold_into(acc, span_of({}));
  R::narrow_into(out, acc);
  CHECK(sparse::count_of(out.b) == 0);
  // A union larger than a packet's pairs (ranks that cut different spans): overflow, whose
  // result and packed partial sum are malformed, so no receiver takes them.
  std::vector<std::pair<std::uint16_t, float>> first, second;
  for (std::uint16_t k = 0; k < 400; ++k) {
    first.push_back({static_cast<std::uint16_t>(2 * k), 1.0f});
    second.push_back({static_cast<std::uint16_t>(2 * k + 1), 1.0f});
  }
  R::widen_into(acc, span_of(first));
  R::fold_into(acc, span_of(second));
  R::narrow_into(out, acc);
  CHECK(!sparse::valid(out.b, sparse::length(out.b, 4), 4));
  std::uint8_t packed[4096];
  const std::uint32_t len = R::pack_acc(packed, acc);
  CHECK(!R::acc_valid(packed, len));
  // A host's span out of order (the kernels take the host's elements unchecked): overflow, no
  // read outside the list (this read 4 GiB past it before the check).
  R::widen_into(acc, span_of({{4, 1.0f}}));
  R::fold_into(acc, span_of({{5, 1.0f}, {4, 1.0f}}));
  R::narrow_into(out, acc);
  CHECK(!sparse::valid(out.b, sparse::length(out.b, 4), 4));
  // A window met by a span is the same fault.
  R::elem win{};
  sparse::store16(win.b, 0);
  sparse::store16(win.b + 2, sparse::form_pairs);
  R::widen_into(acc, win);
  R::fold_into(acc, span_of({{1, 1.0f}}));
  R::narrow_into(out, acc);
  CHECK(!sparse::valid(out.b, sparse::length(out.b, 4), 4));
}

TEST_CASE("sparse allreduce: the float32 sum in the fixed order, dense and as pairs, edge ring and switch, ranks 1 to 8") {
  options o;
  o.switch_slots = 4;  // few slots: every slot is reused, both shadow copies
  for (std::uint32_t n : {1u, 2u, 3u, 4u, 8u}) {
    world w(emu::star(n, {}), o, 1, test::switches::fabric);
    for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg}) {
      for (std::uint64_t length : {0ull, 1ull, W - 1ull, 1ull * W, W + 1ull, 1ull * n * W + 5})
        check_random(w, dtype::f32, length, 0.01, a, length + n);
      for (dtype t : {dtype::f32, dtype::bf16, dtype::f16})
        for (double d : {0.0, 0.001, 0.05, 0.4, 0.6, 1.0}) check_random(w, t, 3 * W + 17, d, a, 11);
      // Every rank on the same indices (no fill-in), and disjoint ones (fill-in n-fold).
      check_random(w, dtype::f32, 4 * W, 0.3, a, 5, true);
      std::vector<pairs> disjoint(n);
      for (std::uint32_t r = 0; r < n; ++r)
        for (std::uint32_t i = r; i < 2 * W; i += n) {
          disjoint[r].index.push_back(i);
          disjoint[r].bits.push_back(from_float(dtype::bf16, static_cast<float>(i % 7) - 3.5f));
        }
      check(w, dtype::bf16, disjoint, 2 * W + 3, a, "disjoint");
    }
  }
}

TEST_CASE("sparse allreduce: spans carry several windows per packet where values are rare, and add as the windows do") {
  // 8 ranks on the same indices (shared) or on their own, values of many binades, so that the
  // order of their float32 additions shows in the bits; a small staging buffer cuts the call
  // into epochs of 64 windows. The result must be the windows' bit for bit: every value added
  // in its window's chunk order, whichever span carried it (an earlier cut, by the spans' own
  // count, gave 72 wrong values in spin-bench sparse -n 8 --density 0.01).
  constexpr std::uint32_t n = 8;
  options o;
  o.staging_bytes = 256 << 10;  // epochs of 64 windows, chunks of 8
  world w(emu::star(n, {}), o, 1, test::switches::fabric);
  REQUIRE(w.comms[0]->epoch_elements(dtype::sparse_f32) == (256u << 10) / elem_bytes(dtype::sparse_f32));
  const std::uint64_t length = 100 * W + 7;
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg}) {
    for (double d : {0.0005, 0.005, 0.03}) {
      check_random(w, dtype::f32, length, d, a, 31, true);
      check_random(w, dtype::f32, length, d, a, 37, false);
    }
    check_random(w, dtype::bf16, length, 0.005, a, 41, true);
    check_random(w, dtype::f16, length, 0.002, a, 43, false);
    // Dense windows (alone in their packets) beside rare values (spans): chunks of different
    // element counts, which the padding must align with the windows' chunks.
    for (std::uint64_t dense_windows : {4ull, 13ull, 70ull}) {
      std::vector<pairs> mixed;
      for (std::uint32_t r = 0; r < n; ++r) {
        pairs p = make_pairs(dtype::f32, r, dense_windows * W, 0.5, false, 53);
        const pairs q = make_pairs(dtype::f32, r, length - dense_windows * W, 0.002, false, 59);
        for (std::size_t k = 0; k < q.index.size(); ++k) {
          p.index.push_back(static_cast<std::uint32_t>(q.index[k] + dense_windows * W));
          p.bits.push_back(q.bits[k]);
        }
        mixed.push_back(std::move(p));
      }
      check(w, dtype::f32, mixed, length, a, "dense then rare, " + std::to_string(dense_windows) + " dense windows");
    }
  }
  // Where values are rare, far fewer packets than windows: 0.05% of 400 windows' values per rank,
  // against the dense float32 allreduce of the same length (a packet per window's worth), with
  // the default staging (one epoch, chunks of 50 windows: a span each). A sparse call has three
  // epochs (the arguments, the counts, the sum), each with its hellos: at 100 windows those
  // alone made half a dense call's packets.
  world d(emu::star(n, {}), options{}, 1, test::switches::fabric);
  const std::uint64_t longer = 400 * W + 7;
  std::vector<pairs> in;
  for (std::uint32_t r = 0; r < n; ++r) in.push_back(make_pairs(dtype::f32, r, longer, 0.0005, false, 47));
  auto packets = [&] {
    std::uint64_t p = 0;
    for (const auto& l : d.cluster->stats().links) p += l.stats.packets_in;
    return p;
  };
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg}) {
    INFO(std::string(name(a)));
    const std::uint64_t p0 = packets();
    check(d, dtype::f32, in, longer, a, "few packets");  // two calls
    const std::uint64_t p1 = packets();
    std::vector<std::vector<float>> x(n, std::vector<float>(longer, 1.0f));
    for (int call = 0; call < 2; ++call) {
      auto res = d.run([&](std::uint32_t r) { return d.comms[r]->allreduce(x[r].data(), x[r].data(), longer, dtype::f32, op::sum, a); });
      for (std::uint32_t r = 0; r < n; ++r) REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    }
    const std::uint64_t p2 = packets();
    INFO((p1 - p0) << " packets on the links for two sparse calls, " << (p2 - p1) << " for two dense ones");
    CHECK(4 * (p1 - p0) < p2 - p1);
  }
}

TEST_CASE("sparse allreduce in place: the pairs given in the result's own buffers") {
  // Dense: each rank's values lie at the start of its dense result buffer. As pairs: the index
  // and values given are the vectors the result replaces. Both read their input before writing.
  constexpr std::uint32_t n = 3;
  const std::uint64_t length = 2 * W + 9;
  world w(emu::star(n, {}), options{}, 1, test::switches::fabric);
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg})
    for (dtype t : {dtype::f32, dtype::bf16, dtype::mxfp8_e4m3}) {
      INFO(std::string(name(t)) << " " << std::string(name(a)));
      const bool mx_t = block_values(t) > 1;
      const std::uint32_t vb = mx_t ? 4 : vbytes(t);
      std::vector<pairs> in;
      for (std::uint32_t r = 0; r < n; ++r) in.push_back(make_pairs(mx_t ? dtype::f32 : t, r, length, 0.2, false, 23));
      std::vector<std::uint32_t> want;
      if (mx_t) {
        mx::element e{};
        REQUIRE(mx_element_of(t, e));
        want = reference_mx(e, in, length);
      } else {
        want = reference(t, in, length);
      }
      // Each rank's values as the call takes them (MX: float32), copied to the start of its
      // dense result and into the vectors the pairs result replaces.
      std::vector<std::vector<std::byte>> dense(n, std::vector<std::byte>(length * vb)), pv(n);
      std::vector<std::vector<std::uint32_t>> idx(n);
      for (std::uint32_t r = 0; r < n; ++r) {
        pv[r] = raw_values(mx_t ? dtype::f32 : t, in[r]);
        idx[r] = in[r].index;
        REQUIRE(pv[r].size() <= dense[r].size());
        if (!pv[r].empty()) std::memcpy(dense[r].data(), pv[r].data(), pv[r].size());
      }
      auto res = w.run([&](std::uint32_t r) {
        return w.comms[r]->allreduce_sparse(in[r].index, dense[r].data(), length, t, dense[r].data(), a);
      });
      for (std::uint32_t r = 0; r < n; ++r) {
        REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
        for (std::uint64_t i = 0; i < length; ++i) {
          std::uint32_t got = 0;
          std::memcpy(&got, dense[r].data() + i * vb, vb);
          REQUIRE_MESSAGE(got == want[i], "rank " << r << " value " << i);
        }
      }
      auto res2 = w.run([&](std::uint32_t r) {
        return w.comms[r]->allreduce_sparse(idx[r], pv[r].data(), length, t, idx[r], pv[r], a);
      });
      for (std::uint32_t r = 0; r < n; ++r) {
        REQUIRE_MESSAGE(res2[r].ok(), (res2[r].ok() ? std::string() : res2[r].err().message));
        expect_pairs(idx[r], pv[r], want, vb);
      }
    }
}

TEST_CASE("sparse allreduce: windows turn dense where the union fills in, and the wire carries the smaller form") {
  const std::uint32_t n = 4;
  world w(emu::star(n, {}), {}, 1, test::switches::fabric);
  const std::uint64_t length = 64 * W;
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg}) {
    std::vector<pairs> in;
    for (std::uint32_t r = 0; r < n; ++r) in.push_back(make_pairs(dtype::f32, r, length, 0.001, false, 3));
    const std::uint64_t before = link_bytes(w);
    std::vector<std::vector<std::byte>> vals(n), out(n, std::vector<std::byte>(length * 4));
    for (std::uint32_t r = 0; r < n; ++r) vals[r] = raw_values(dtype::f32, in[r]);
    auto res = w.run([&](std::uint32_t r) {
      return w.comms[r]->allreduce_sparse(in[r].index, vals[r].data(), length, dtype::f32, out[r].data(), a);
    });
    for (auto& x : res) REQUIRE_MESSAGE(x.ok(), (x.ok() ? std::string() : x.err().message));
    const std::uint64_t sparse_bytes = link_bytes(w) - before;
    // The same vector, dense.
    std::vector<std::vector<float>> dense(n, std::vector<float>(length, 0.0f));
    for (std::uint32_t r = 0; r < n; ++r)
      for (std::size_t k = 0; k < in[r].index.size(); ++k) dense[r][in[r].index[k]] = std::bit_cast<float>(in[r].bits[k]);
    const std::uint64_t before_dense = link_bytes(w);
    auto res2 = w.run([&](std::uint32_t r) {
      return w.comms[r]->allreduce(dense[r].data(), dense[r].data(), length, dtype::f32, op::sum, a);
    });
    for (auto& x : res2) REQUIRE_MESSAGE(x.ok(), (x.ok() ? std::string() : x.err().message));
    const std::uint64_t dense_bytes = link_bytes(w) - before_dense;
    INFO(name(a) << ": sparse " << sparse_bytes << " bytes, dense " << dense_bytes);
    // At 0.1% density about one pair per window and rank: frame and packet heads dominate.
    CHECK(sparse_bytes * 10 < dense_bytes);
  }
  // Dense inputs: every window goes dense, and costs its 4-byte head more than float32.
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg}) check_random(w, dtype::f32, 8 * W, 1.0, a, 9);
}

TEST_CASE("sparse allreduce: identical on every rank, across runs and under loss, duplication and reordering") {
  const std::uint32_t n = 4;
  for (double loss : {0.0, 0.02}) {
    options o;
    o.repair_interval = std::chrono::microseconds(1000);
    o.repair_max_interval = o.repair_interval;
    o.switch_slots = 8;
    world w(emu::star(n, test::lossy(loss, 23, 0.05)), o, 1, test::switches::fabric);
    for (int run = 0; run < 2; ++run)
      for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg})
        for (double d : {0.002, 0.3, 0.9}) check_random(w, dtype::bf16, 20 * W + 1, d, a, 31);
    if (loss > 0) {
      std::uint64_t lost = 0;
      for (const auto& l : w.cluster->stats().links) lost += l.stats.dropped_loss;
      CHECK(lost > 0);
    }
  }
}

TEST_CASE("sparse allreduce: bad arguments give a clear error on every rank, and the communicator goes on") {
  const std::uint32_t n = 3;
  world w(emu::star(n, {}), {}, 1, test::switches::fabric);
  const std::uint64_t length = 5000;
  auto run = [&](const std::vector<std::vector<std::uint32_t>>& idx, const std::vector<std::uint64_t>& len,
                 const std::vector<dtype>& t, algorithm a) {
    std::vector<std::vector<float>> out(n, std::vector<float>(length + 10));
    std::vector<std::vector<float>> vals(n);
    for (std::uint32_t r = 0; r < n; ++r) vals[r].assign(idx[r].size(), 1.0f);
    return w.run([&](std::uint32_t r) {
      return w.comms[r]->allreduce_sparse(idx[r], vals[r].data(), len[r], t[r], out[r].data(), a);
    });
  };
  const std::vector<std::uint32_t> good = {1, 5, 4000};
  const std::vector<std::uint64_t> same_len(n, length);
  const std::vector<dtype> f32s(n, dtype::f32);
  auto expect_all = [&](const std::vector<result<void>>& res, errc code, const std::string& text) {
    for (std::uint32_t r = 0; r < n; ++r) {
      INFO("rank " << r << ", expected: " << text);
      REQUIRE(!res[r].ok());
      CHECK(res[r].err().code == code);
      CHECK_MESSAGE(res[r].err().message.find(text) != std::string::npos, res[r].err().message);
    }
  };
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg}) {
    expect_all(run({good, {1, 7, 3}, good}, same_len, f32s, a), errc::invalid_argument, "rank 1's arguments are refused: its indices are not strictly ascending");
    expect_all(run({good, good, {2, 2}}, same_len, f32s, a), errc::invalid_argument, "rank 2's arguments are refused: its indices are not strictly ascending");
    expect_all(run({good, {3, 5000}, {9, 6000}}, same_len, f32s, a), errc::invalid_argument, "rank 1's arguments are refused: an index is not below length");
    expect_all(run({good, good, good}, {length, length, length + 1}, f32s, a), errc::invalid_argument, "different lengths");
    expect_all(run({good, good, good}, same_len, {dtype::f32, dtype::bf16, dtype::f32}, a), errc::invalid_argument,
               "different datatypes");
    expect_all(run({good, good, good}, same_len, {dtype::i32, dtype::i32, dtype::i32}, a), errc::invalid_argument,
               "rank 0's arguments are refused: its datatype is not f32, bf16, f16 or an MX type");
    // The faulting rank's own message says where.
    auto res = run({good, {1, 7, 3}, good}, same_len, f32s, a);
    CHECK(res[1].err().message.find("index[2] = 3 is not above index[1] = 7") != std::string::npos);
    // The typed forms: a rank whose counts differ (or whose output is too short) is a rank at
    // fault for every rank, not a rank that leaves the others to time out.
    {
      std::vector<std::vector<float>> out(n, std::vector<float>(length));
      const std::vector<float> three(3, 1.0f), two(2, 1.0f);
      auto typed = w.run([&](std::uint32_t r) {
        return w.comms[r]->allreduce_sparse<float>(good, r == 2 ? std::span<const float>(two) : std::span<const float>(three),
                                                   length, std::span<float>(out[r]), a);
      });
      expect_all(typed, errc::invalid_argument, "rank 2's arguments are refused");
      CHECK(typed[2].err().message.find("its index and value counts differ") != std::string::npos);
      CHECK(typed[0].err().message.find("its arguments do not match") != std::string::npos);
      std::vector<std::vector<std::uint32_t>> io(n);
      std::vector<std::vector<float>> vo(n);
      auto typed2 = w.run([&](std::uint32_t r) {
        return w.comms[r]->allreduce_sparse<float>(good, r == 0 ? std::span<const float>(two) : std::span<const float>(three),
                                                   length, io[r], vo[r], a);
      });
      expect_all(typed2, errc::invalid_argument, "rank 0's arguments are refused");
      auto typed3 = w.run([&](std::uint32_t r) {
        return w.comms[r]->allreduce_sparse<float>(good, three, length,
                                                   std::span<float>(out[r]).first(r == 1 ? length - 1 : length), a);
      });
      expect_all(typed3, errc::invalid_argument, "rank 1's arguments are refused");
      CHECK(typed3[1].err().message.find("its output does not hold length values") != std::string::npos);
    }
    // Then a good call.
    std::vector<pairs> in(n);
    for (std::uint32_t r = 0; r < n; ++r) in[r].index = good, in[r].bits.assign(3, 0x3f800000u);
    check(w, dtype::f32, in, length, a, "after errors");
  }
  expect_all(run({good, good, good}, same_len, f32s, algorithm::host_ring), errc::not_supported, "host_ring");
  // The windows themselves, given to allreduce directly: a malformed one is refused.
  {
    std::vector<std::uint32_t> win(elem_bytes(dtype::sparse_f32) / 4, 0);
    auto* b = reinterpret_cast<std::uint8_t*>(win.data());
    sparse::store16(b, 2);
    sparse::store16(b + 4, 9);
    sparse::store16(b + 6, 3);
    auto r = w.comms[0]->allreduce(win.data(), win.data(), 1, dtype::sparse_f32, op::sum, algorithm::edge_ring);
    REQUIRE(!r.ok());
    CHECK(r.err().code == errc::invalid_argument);
    CHECK(r.err().message.find("window 0 of sparse_f32 is malformed") != std::string::npos);
    auto r2 = w.comms[0]->reduce_scatter(win.data(), win.data(), 1, dtype::sparse_f32, op::sum, algorithm::edge_ring);
    CHECK(r2.err().code == errc::not_supported);
  }
}

TEST_CASE("MX sparse windows: sizes, the switch-over point and validation") {
  CHECK(elem_bytes(dtype::sparse_mxfp8_e4m3) == 4 + 32 + 1024);
  CHECK(elem_bytes(dtype::sparse_mxint8) == 1060);
  CHECK(elem_bytes(dtype::sparse_mxfp6_e2m3) == 4 + 32 + 768);
  CHECK(elem_bytes(dtype::sparse_mxfp4_e2m1) == 4 + 32 + 512);
  for (dtype t : mx_types) {
    CHECK(compact_type(window_type_of(t)));
    CHECK(block_values(window_type_of(t)) == W);
  }
  // Pairs cost 3 bytes a code (and a scale byte a listed block): with every block listed fp8
  // turns dense past 339 codes, fp6 past 254, fp4 past 168.
  CHECK(sparse::mx_max_pairs(32, 8) == 339);
  CHECK(sparse::mx_max_pairs(32, 6) == 254);
  CHECK(sparse::mx_max_pairs(32, 4) == 168);
  CHECK(sparse::mx_pairs_bytes(339, 32) < sparse::mx_dense_bytes(8));
  CHECK(sparse::mx_pairs_bytes(340, 32) >= sparse::mx_dense_bytes(8));
  CHECK(sparse::mx_pairs_bytes(0, 0) == 8);  // an empty window
  std::uint8_t w[20] = {};
  sparse::store16(w, 1);
  sparse::store16(w + 2, sparse::form_pairs);
  sparse::store32(w + 4, 1u << 3);  // block 3 listed
  w[8] = 127;                        // its scale
  sparse::store16(w + 12, 3 * 32 + 5);
  w[16] = 0x38;                      // its code
  CHECK(sparse::mx_pairs_bytes(1, 1) == 17);  // head, mask, a scale and an offset each padded to 4, a code
  CHECK(sparse::mx_valid(w, 17, 8));
  CHECK(sparse::mx_length(w, 8) == 17);
  CHECK(!sparse::mx_valid(w, 18, 8));  // longer than its form
  sparse::store16(w + 12, 2 * 32 + 5);  // an offset in a block that is not listed
  CHECK(!sparse::mx_valid(w, 17, 8));
  sparse::store16(w + 12, W);  // past the window
  CHECK(!sparse::mx_valid(w, 17, 8));
  sparse::store16(w + 12, 3 * 32 + 5);
  CHECK(sparse::mx_valid(w, 17, 8));
  sparse::store16(w + 2, 3);  // unknown form
  CHECK(!sparse::mx_valid(w, 17, 8));
  sparse::store16(w + 2, sparse::form_pairs);
  sparse::store16(w, 400);  // more codes than a pairs window may hold
  CHECK(!sparse::mx_valid(w, sparse::mx_pairs_bytes(400, 1), 8));
  // Every window the reduction writes is valid and as long as elem_length says, and a pairs
  // window holds no code 0: the forms of random float32 windows at several densities.
  with_standard(op::sum, dtype::sparse_mxfp6_e3m2, [&]<class R>() {
    if constexpr (requires { R::element; }) {
      std::mt19937 g(5);
      for (double d : {0.0, 0.001, 0.02, 0.1, 0.2, 0.3, 1.0}) {
        typename R::acc a{};
        for (std::uint32_t i = 0; i < W; ++i)
          a.bits[i] = std::uniform_real_distribution<double>(0, 1)(g) < d
                          ? std::bit_cast<std::uint32_t>(std::ldexp(static_cast<float>(g() % 200) - 100.0f, static_cast<int>(g() % 30) - 15))
                          : 0u;
        typename R::elem e;
        R::narrow_into(e, a);
        INFO("density " << d);
        CHECK(sparse::mx_valid(e.b, R::elem_length(e), R::bits));
        CHECK(compact_elem_ok(dtype::sparse_mxfp6_e3m2, e.b));
        if (sparse::form_of(e.b) == sparse::form_pairs)
          for (std::uint32_t k = 0; k < sparse::count_of(e.b); ++k) CHECK(sparse::mx_codes(e.b)[k] != 0);
      }
    }
  });
}

TEST_CASE("MX sparse allreduce: the dense MX encoding of the float32 sum of the decoded inputs, every element type") {
  options o;
  o.switch_slots = 4;
  for (std::uint32_t n : {1u, 3u, 4u}) {
    world w(emu::star(n, {}), o, 1, test::switches::fabric);
    for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg})
      for (dtype t : mx_types) {
        if (n == 3 && t != dtype::mxfp8_e4m3 && t != dtype::mxfp4_e2m1) continue;
        for (double d : {0.0, 0.001, 0.05, 0.3, 1.0}) {
          std::vector<pairs> in;
          for (std::uint32_t r = 0; r < n; ++r) in.push_back(make_pairs(dtype::f32, r, 3 * W + 17, d, false, 41));
          check_mx(w, t, in, 3 * W + 17, a, "density " + std::to_string(d));
        }
      }
    // Lengths around windows and blocks; every rank on the same indices.
    for (std::uint64_t length : {1ull, 31ull, 33ull, W - 1ull, 1ull * W, W + 1ull}) {
      std::vector<pairs> in;
      for (std::uint32_t r = 0; r < n; ++r) in.push_back(make_pairs(dtype::f32, r, length, 0.2, true, length));
      check_mx(w, dtype::mxfp8_e5m2, in, length, algorithm::switch_agg, "shared indices");
    }
  }
}

TEST_CASE("MX sparse allreduce: NaN and infinity make their block NaN, -0 and underflow keep their meaning") {
  const std::uint32_t n = 3;
  world w(emu::star(n, {}), {}, 1, test::switches::fabric);
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg})
    for (dtype t : {dtype::mxfp8_e4m3, dtype::mxint8}) {
      std::vector<pairs> in(n);
      auto put = [&](std::uint32_t r, std::uint32_t i, float f) {
        in[r].index.push_back(i);
        in[r].bits.push_back(std::bit_cast<std::uint32_t>(f));
      };
      put(0, 3, 1.0f);
      put(0, 40, std::numeric_limits<float>::quiet_NaN());  // block 1 of window 0: NaN
      put(1, 70, std::numeric_limits<float>::infinity());   // block 2: NaN (MX has no infinity but E5M2's)
      put(1, 100, -0.0f);                                   // alone in block 3: -0 on one rank
      put(2, 130, 1e30f);                                   // block 4: 1e-30 underflows to code 0 beside it
      put(2, 131, 1e-30f);
      put(0, W + 999, -2.5f);  // the last block of window 1 (28 values)
      check_mx(w, t, in, 2 * W, a, "special values");
    }
}

TEST_CASE("MX sparse allreduce: under loss, duplication and reordering; fewer bytes than float32 windows where values are not rare") {
  const std::uint32_t n = 4;
  options o;
  o.repair_interval = std::chrono::microseconds(1000);
  o.repair_max_interval = o.repair_interval;
  o.switch_slots = 8;
  world w(emu::star(n, test::lossy(0.02, 29, 0.05)), o, 1, test::switches::fabric);
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg})
    for (double d : {0.002, 0.3}) {
      std::vector<pairs> in;
      for (std::uint32_t r = 0; r < n; ++r) in.push_back(make_pairs(dtype::f32, r, 12 * W + 1, d, false, 17));
      check_mx(w, dtype::mxfp8_e4m3, in, 12 * W + 1, a, "lossy");
    }
  world clean(emu::star(n, {}), {}, 1, test::switches::fabric);
  const std::uint64_t length = 32 * W;
  std::vector<pairs> in;
  for (std::uint32_t r = 0; r < n; ++r) in.push_back(make_pairs(dtype::f32, r, length, 0.1, false, 3));
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg}) {
    std::uint64_t bytes[2] = {};
    for (int k = 0; k < 2; ++k) {
      const dtype t = k == 0 ? dtype::f32 : dtype::mxfp8_e4m3;
      std::vector<std::vector<float>> out(n, std::vector<float>(length));
      const std::uint64_t before = link_bytes(clean);
      auto res = clean.run([&](std::uint32_t r) {
        return clean.comms[r]->allreduce_sparse(in[r].index, in[r].bits.data(), length, t, out[r].data(), a);
      });
      for (auto& x : res) REQUIRE_MESSAGE(x.ok(), (x.ok() ? std::string() : x.err().message));
      bytes[k] = link_bytes(clean) - before;
    }
    INFO(name(a) << ": float32 windows " << bytes[0] << " bytes, MXFP8 windows " << bytes[1]);
    CHECK(bytes[1] * 10 < bytes[0] * 7);
  }
  // A malformed MX window given to allreduce directly is refused before anything is sent.
  std::vector<std::uint8_t> win(elem_bytes(dtype::sparse_mxfp8_e4m3), 0);
  sparse::store16(win.data(), 1);
  sparse::store32(win.data() + 4, 1u);       // block 0 listed
  sparse::store16(win.data() + 12, 64 + 1);  // an offset in block 2
  auto r = clean.comms[0]->allreduce(win.data(), win.data(), 1, dtype::sparse_mxfp8_e4m3, op::sum, algorithm::switch_agg);
  REQUIRE(!r.ok());
  CHECK(r.err().message.find("window 0 of sparse_mxfp8_e4m3 is malformed") != std::string::npos);
}
