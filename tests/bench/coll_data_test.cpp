// spin-bench coll's data (bench/spin_bench/coll_data.hpp): the inputs every implementation gets,
// the exact expected sum and how #wrong counts against it, and nccl-tests' size sweep.
#include "../../bench/spin_bench/coll_data.hpp"

#include <doctest/doctest.h>

#include <cstdint>
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

}
