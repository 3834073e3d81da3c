// Block formats (MX and BFP) in the collectives: allreduce, reduce-scatter and allgather on the
// edge ring and through the switch. The rule (spin/coll/types.hpp, docs/collectives.md "Block
// formats"): the result is encode(the float32 reduction of the decoded inputs in the fixed
// order), bit for bit, on every rank, across runs and under loss. The reference here decodes
// and encodes with the codecs (tested on their own against the specs by tests mx and bfp) and
// folds in the documented order itself.
#include "block_codecs.hpp"
#include "coll_world.hpp"

#include <spin/coll/bfp.hpp>
#include <spin/coll/mx.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace spin;
using namespace spin::coll;
using spin::coll::test::world;

namespace {

using bytes = std::vector<std::uint8_t>;
using spin::coll::test::block_dtypes;
using spin::coll::test::decode_block;
using spin::coll::test::encode_block;

float combine(op o, float a, float b) {
  if (o == op::sum) return a + b;
  if (o == op::min) return a < b ? a : b < a ? b : std::signbit(a) ? a : b;  // inputs hold no NaN
  return a > b ? a : b > a ? b : std::signbit(a) ? b : a;
}

// Rank r's `count` blocks: values of a spread of binades that differs per rank and per block
// (so sums round in float32 and the scales differ between ranks), with zeros and negative zeros.
bytes make_input(dtype t, std::uint32_t r, std::uint64_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003 + r * 7919 + static_cast<std::uint64_t>(t));
  const std::uint32_t nv = block_values(t), eb = elem_bytes(t);
  bytes out(count * eb);
  std::vector<std::uint32_t> v(nv);
  for (std::uint64_t b = 0; b < count; ++b) {
    const int centre = static_cast<int>(rng() % 24) - 12 + static_cast<int>(r % 3) * 5;
    for (auto& x : v) {
      const std::uint64_t k = rng() % 20;
      float f = 0.0f;
      if (k == 1) f = -0.0f;
      if (k > 1) {
        const float m = 1.0f + static_cast<float>(rng() % 4096) / 4096.0f;
        f = std::ldexp(m, centre - static_cast<int>(rng() % 10)) * ((rng() & 1) != 0 ? -1.0f : 1.0f);
      }
      x = std::bit_cast<std::uint32_t>(f);
    }
    encode_block(t, v.data(), out.data() + b * eb);
  }
  return out;
}

// encode(the reduction of the decoded inputs, folded from rank c+1 around to rank c for an
// element of chunk c) over `count` elements cut into `chunks` chunks (one epoch: the counts here
// are far below an epoch).
bytes reference(dtype t, op o, const std::vector<bytes>& in, std::uint64_t count, std::uint32_t n) {
  const std::uint32_t nv = block_values(t), eb = elem_bytes(t);
  bytes out(count * eb);
  std::vector<std::uint32_t> acc(nv), x(nv);
  const std::uint64_t base = count / n, extra = count % n;
  for (std::uint64_t c = 0, lo = 0; c < n; ++c) {
    const std::uint64_t len = base + (c < extra ? 1 : 0);
    for (std::uint64_t i = lo; i < lo + len; ++i) {
      decode_block(t, in[(c + 1) % n].data() + i * eb, acc.data());
      for (std::uint32_t k = 2; k <= n; ++k) {
        decode_block(t, in[(c + k) % n].data() + i * eb, x.data());
        for (std::uint32_t j = 0; j < nv; ++j)
          acc[j] = std::bit_cast<std::uint32_t>(combine(o, std::bit_cast<float>(acc[j]), std::bit_cast<float>(x[j])));
      }
      encode_block(t, acc.data(), out.data() + i * eb);
    }
    lo += len;
  }
  return out;
}

long long first_wrong(const bytes& got, const bytes& want, std::uint32_t eb) {
  for (std::size_t i = 0; i < want.size(); i += eb)
    if (std::memcmp(got.data() + i, want.data() + i, eb) != 0) return static_cast<long long>(i / eb);
  return -1;
}

void check_allreduce(world& w, dtype t, op o, std::uint64_t count, algorithm a, bool in_place = false, std::uint64_t seed = 1) {
  const std::uint32_t n = w.size(), eb = elem_bytes(t);
  std::vector<bytes> in(n), out(n, bytes(count * eb, 0xa5));
  for (std::uint32_t r = 0; r < n; ++r) in[r] = make_input(t, r, count, seed);
  const bytes want = reference(t, o, in, count, n);
  if (in_place) out = in;
  auto res = w.run([&](std::uint32_t r) {
    return w.comms[r]->allreduce(in_place ? out[r].data() : in[r].data(), out[r].data(), count, t, o, a);
  });
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO("ranks " << n << " rank " << r << " " << name(t) << " " << name(o) << " count " << count << " " << name(a)
                  << (in_place ? " in place" : ""));
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    const long long bad = first_wrong(out[r], want, eb);
    REQUIRE_MESSAGE(bad < 0, "first wrong block " << bad);
  }
}

void check_reduce_scatter(world& w, dtype t, std::uint64_t block, algorithm a) {
  const std::uint32_t n = w.size(), eb = elem_bytes(t);
  std::vector<bytes> in(n), out(n, bytes(block * eb, 0xa5));
  for (std::uint32_t r = 0; r < n; ++r) in[r] = make_input(t, r, block * n, 2);
  const bytes want = reference(t, op::sum, in, block * n, n);
  auto res = w.run([&](std::uint32_t r) { return w.comms[r]->reduce_scatter(in[r].data(), out[r].data(), block, t, op::sum, a); });
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO("ranks " << n << " rank " << r << " " << name(t) << " block " << block);
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    REQUIRE(test::same_bytes(out[r].data(), want.data() + r * block * eb, block * eb));
  }
}

void check_allgather(world& w, dtype t, std::uint64_t block, algorithm a) {
  const std::uint32_t n = w.size(), eb = elem_bytes(t);
  std::vector<bytes> in(n), out(n, bytes(block * n * eb, 0xa5));
  bytes want;
  for (std::uint32_t r = 0; r < n; ++r) {
    in[r] = make_input(t, r, block, 3);
    want.insert(want.end(), in[r].begin(), in[r].end());
  }
  auto res = w.run([&](std::uint32_t r) { return w.comms[r]->allgather(in[r].data(), out[r].data(), block, t, a); });
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO("ranks " << n << " rank " << r << " " << name(t) << " block " << block << " " << name(a));
    REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
    REQUIRE(out[r] == want);
  }
}

} // namespace

TEST_CASE("block formats: datatype sizes and names") {
  const std::uint32_t want_bytes[] = {33, 33, 25, 25, 17, 33, 17, 33, 33, 65};
  const std::uint32_t want_values[] = {32, 32, 32, 32, 32, 32, 16, 32, 16, 32};
  for (std::size_t i = 0; i < std::size(block_dtypes); ++i) {
    CHECK(elem_bytes(block_dtypes[i]) == want_bytes[i]);
    CHECK(block_values(block_dtypes[i]) == want_values[i]);
  }
  CHECK(std::string(name(dtype::mxfp4_e2m1)) == "mxfp4_e2m1");
  CHECK(std::string(name(dtype::bfp16_32)) == "bfp16_32");
  CHECK(block_values(dtype::f32) == 1);
  CHECK(block_values(dtype::custom) == 0);
}

TEST_CASE("block-format allreduce is encode(float32 reduction in the ring order) on the edge ring and through the switch, ranks 1 to 8") {
  options o;
  o.switch_slots = 4;  // few slots: every slot is reused, both shadow copies
  for (std::uint32_t n : {1u, 2u, 3u, 4u, 7u, 8u}) {
    world w(emu::star(n, {}), o, 1, test::switches::fabric);
    // Packets of the ring hold 4096 / accumulator bytes blocks (32 or 16 float32 each), the
    // switch's 4096 / element bytes.
    for (dtype t : block_dtypes) {
      for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg}) {
        const std::uint32_t p = a == algorithm::edge_ring ? 4096 / (4 * block_values(t)) : 4096 / elem_bytes(t);
        for (std::uint64_t count : {0ull, 1ull, n + 1ull, p - 1ull, p + 1ull, 1ull * n * p + 1})
          check_allreduce(w, t, op::sum, count, a);
      }
    }
    for (dtype t : {dtype::mxfp8_e4m3, dtype::mxfp4_e2m1, dtype::bfp16_32}) {
      for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg}) {
        const std::uint32_t p = a == algorithm::edge_ring ? 4096 / (4 * block_values(t)) : 4096 / elem_bytes(t);
        for (std::uint64_t count : {2ull, n - 1ull, 1ull * n, 1ull * p, 1ull * n * p - 1, 1ull * n * p, 3ull * n * p + 7, 4ull * p + 1})
          check_allreduce(w, t, op::sum, count, a);
        check_allreduce(w, t, op::min, 3ull * p + 5, a);
        check_allreduce(w, t, op::max, 3ull * p + 5, a);
        check_allreduce(w, t, op::sum, 2ull * p + 3, a, true);  // in place
      }
    }
  }
}

TEST_CASE("block-format reduce-scatter and allgather on the edge ring, allgather through the switch, ranks 1 to 8") {
  for (std::uint32_t n : {1u, 2u, 3u, 4u, 7u, 8u}) {
    world w(emu::star(n, {}), {}, 1, test::switches::fabric);
    for (dtype t : block_dtypes)
      for (std::uint64_t block : {0ull, 1ull, 31ull, 32ull, 33ull, 300ull}) {
        check_reduce_scatter(w, t, block, algorithm::edge_ring);
        check_allgather(w, t, block, algorithm::edge_ring);
      }
    for (dtype t : {dtype::mxfp6_e2m3, dtype::bfp8_16})
      for (std::uint64_t block : {1ull, 124ull, 125ull, 300ull}) check_allgather(w, t, block, algorithm::switch_agg);
  }
}

TEST_CASE("block-format results are identical on every rank, across runs and under loss, duplication and reordering") {
  const std::uint32_t n = 4;
  for (double loss : {0.0, 0.02}) {
    options o;
    o.repair_interval = std::chrono::microseconds(1000);
    o.repair_max_interval = o.repair_interval;
    o.switch_slots = 8;
    world w(emu::star(n, test::lossy(loss, 17, 0.05)), o, 1, test::switches::fabric);
    for (int run = 0; run < 2; ++run)
      for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg})
        for (dtype t : {dtype::mxfp8_e5m2, dtype::mxint8, dtype::bfp16_16}) check_allreduce(w, t, op::sum, 2000, a, run == 1, 5);
    for (dtype t : {dtype::mxfp6_e3m2, dtype::bfp8_32}) {
      check_reduce_scatter(w, t, 700, algorithm::edge_ring);
      check_allgather(w, t, 700, algorithm::switch_agg);
    }
    if (loss > 0) {
      std::uint64_t lost = 0;
      for (const auto& l : w.cluster->stats().links) lost += l.stats.dropped_loss;
      CHECK(lost > 0);
    }
  }
}

TEST_CASE("block formats: a sum past float32's range, and NaN inputs, give the NaN block on every rank") {
  const std::uint32_t n = 3;
  world w(emu::star(n, {}), {}, 1, test::switches::fabric);
  const dtype t = dtype::mxfp8_e5m2;
  const std::uint32_t eb = elem_bytes(t);
  {  // each input alone decodes to a finite value
    std::uint32_t one[32];
    std::uint8_t b[33] = {239, 0x7b};
    mx::decode_block(mx::element::fp8_e5m2, b, one);
    REQUIRE(one[0] == std::bit_cast<std::uint32_t>(std::ldexp(1.75f, 127)));
  }
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg, algorithm::host_ring}) {
    std::vector<bytes> in(n, bytes(2 * eb, 0)), out(n, bytes(2 * eb, 0xa5));
    for (std::uint32_t r = 0; r < n; ++r) {
      in[r][0] = 239;   // block 0: scale 2^112, element 0 = 57344 (E5M2 0x7b): 1.75 x 2^127 each, a float32;
      in[r][1] = 0x7b;  // the sum of three is past float32's range -> +inf
      in[r][eb] = 127;  // block 1: 1.0 everywhere, but rank 1's block has the NaN scale
      for (std::uint32_t i = 1; i < eb; ++i) in[r][eb + i] = 0x3c;
    }
    in[1][eb] = mx::scale_nan;
    auto res = w.run([&](std::uint32_t r) { return w.comms[r]->allreduce(in[r].data(), out[r].data(), 2, t, op::sum, a); });
    for (std::uint32_t r = 0; r < n; ++r) {
      INFO(name(a) << " rank " << r);
      REQUIRE(res[r].ok());
      CHECK(out[r][0] == mx::scale_nan);
      CHECK(out[r][eb] == mx::scale_nan);
      for (std::uint32_t i = 1; i < eb; ++i) CHECK(out[r][i] == 0);
    }
    // min and max propagate a NaN block too (IEEE 754-2019 minimum and maximum).
    if (a == algorithm::host_ring) continue;
    for (op o : {op::min, op::max}) {
      res = w.run([&](std::uint32_t r) { return w.comms[r]->allreduce(in[r].data(), out[r].data(), 2, t, o, a); });
      for (std::uint32_t r = 0; r < n; ++r) {
        INFO(name(a) << " " << name(o) << " rank " << r);
        REQUIRE(res[r].ok());
        CHECK(out[r][0] == 239);  // block 0: the same finite block everywhere
        CHECK(out[r][1] == 0x7b);
        CHECK(out[r][eb] == mx::scale_nan);
      }
    }
  }
}

TEST_CASE("block formats on the host ring, and through a leaf-spine network, where every block reduction goes to the root") {
  {
    world w(emu::star(4, {}));
    for (dtype t : {dtype::mxfp8_e4m3, dtype::mxfp6_e2m3, dtype::bfp16_32})
      for (std::uint64_t count : {0ull, 1ull, 5ull, 33ull, 129ull, 700ull}) check_allreduce(w, t, op::sum, count, algorithm::host_ring);
  }
  // Leaves l0 (h0, h1, h2) and l1 (h3, h4) under one spine. Were min or max combined at a leaf,
  // its partial would be encoded once more, with a scale chosen from the partial: values the
  // flat reduction keeps would round.
  world w(test::leaf_spine({3, 2}), {}, 1, test::switches::fabric);
  for (dtype t : {dtype::mxfp8_e4m3, dtype::mxfp4_e2m1, dtype::bfp8_16})
    for (op o : {op::sum, op::min, op::max}) check_allreduce(w, t, o, 500, algorithm::switch_agg, false, 9);
}

TEST_CASE("a block format whose element or accumulator does not fit options::packet_bytes is refused on every rank") {
  options o;
  o.packet_bytes = 64;  // an mxfp8 block's float32 accumulators take 128 bytes
  world w(emu::star(3, {}), o, 1, test::switches::fabric);
  for (algorithm a : {algorithm::edge_ring, algorithm::switch_agg}) {
    auto res = w.run([&](std::uint32_t r) {
      bytes i2(10 * 33), o2(10 * 33);
      return w.comms[r]->allreduce(i2.data(), o2.data(), 10, dtype::mxfp8_e4m3, op::sum, a);
    });
    for (std::uint32_t r = 0; r < 3; ++r) {
      INFO(name(a) << " rank " << r);
      REQUIRE_FALSE(res[r].ok());
      CHECK(res[r].err().code == errc::invalid_argument);
      CHECK(res[r].err().message.find("packet_bytes is 64") != std::string::npos);
    }
  }
  // bfp8_16's 64-byte accumulators fit; it runs.
  check_allreduce(w, dtype::bfp8_16, op::sum, 40, algorithm::edge_ring);
}
