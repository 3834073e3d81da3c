// spin-bench coll's data (bench/spin_bench/coll_data.hpp): the inputs every implementation gets,
// the exact expected sum and how #wrong counts against it, and nccl-tests' size sweep.
#include "../../bench/spin_bench/coll_data.hpp"
#include "../../bench/spin_bench/coll_types.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

using namespace spin::bench;

TEST_SUITE("bench") {

TEST_CASE("the expected allreduce equals the sum of every rank's input, exactly, for every element") {
  for (std::uint32_t n : {2u, 3u, 4u, 8u, 64u}) {
    for (std::uint64_t i : {0ull, 1ull, 8ull, 9ull, 12345ull, (1ull << 26) + 5}) {
      double s = 0;
      for (std::uint32_t r = 0; r < n; ++r) s += coll_input(r, i);
      CHECK(static_cast<double>(coll_expected(n, i)) == s);
    }
  }
}

TEST_CASE("#wrong counts every element that differs from the exact sum, and nothing else") {
  const std::uint32_t n = 4;
  std::vector<float> out(1000);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = coll_expected(n, i);
  CHECK(coll_wrong(n, out.data(), out.size()) == 0);
  out[0] += 1.0f;
  out[500] = -out[500] - 1.0f;
  out[999] = 0.5f;  // expected values are integers: 0.5 is always wrong
  CHECK(coll_wrong(n, out.data(), out.size()) == 3);
  // A rank's input is not the sum (the benchmark would catch a collective that did nothing).
  std::vector<float> untouched(1000);
  coll_fill(0, untouched.data(), untouched.size());
  CHECK(coll_wrong(n, untouched.data(), untouched.size()) > 0);
}

TEST_CASE("message sizes step by the factor from the smallest and always end at the largest") {
  CHECK(coll_sizes(8, 256, 4) == std::vector<std::uint64_t>{8, 32, 128, 256});
  CHECK(coll_sizes(8, 128, 2) == std::vector<std::uint64_t>{8, 16, 32, 64, 128});
  CHECK(coll_sizes(8, 8, 4) == std::vector<std::uint64_t>{8});
  CHECK(coll_sizes(10, 30, 2) == std::vector<std::uint64_t>{8, 20, 28});  // whole float32 elements
}

TEST_CASE("iterations shrink with the message size between one and the maximum") {
  CHECK(coll_iters(8, 64 << 20, 20) == 20);
  CHECK(coll_iters(std::uint64_t{8} << 20, 64 << 20, 20) == 8);
  CHECK(coll_iters(std::uint64_t{256} << 20, 64 << 20, 20) == 1);
}

TEST_CASE("max err is the result's largest distance from the exact float64 sum, over the largest sum") {
  constexpr std::uint32_t n = 4;
  const std::uint64_t count = 100;
  // float32 holds every sum exactly: the expected result has no error; a value off by one has
  // 1 / max |sum|.
  coll_typed_data f(spin::coll::dtype::f32, n);
  std::vector<float> out(count);
  for (std::uint64_t i = 0; i < count; ++i) out[i] = coll_expected(n, i);
  CHECK(f.max_error(out.data(), count) == 0.0);
  double max_sum = 0;
  for (std::uint64_t i = 0; i < 9; ++i) max_sum = std::max(max_sum, std::fabs(static_cast<double>(coll_expected(n, i))));
  REQUIRE(max_sum > 0);
  out[37] += 1.0f;
  CHECK(f.max_error(out.data(), count) == 1.0 / max_sum);
  out[37] = NAN;
  CHECK(std::isnan(f.max_error(out.data(), count)));
  // A block format: the error of its expected result is its rounding of the exact sums, the
  // same whichever element of the period is looked at, and a block that decodes to zeros is off
  // by the sums themselves.
  coll_typed_data m(spin::coll::dtype::mxfp4_e2m1, n);
  std::vector<std::byte> blocks(18 * m.elem_bytes());
  m.fill(0, blocks.data(), 18);  // rank 0's input, not the sum
  const double e_input = m.max_error(blocks.data(), 18);
  CHECK(e_input > 0);
  std::memset(blocks.data(), 0, blocks.size());  // scale 2^-127 and zero codes: every value 0
  CHECK(m.max_error(blocks.data(), 18) == 1.0);
}

}
