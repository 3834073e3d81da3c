// User reductions: a package built by spinc from SPIN_COLL_ENGINE(single_reduction<R>) runs
// allreduce and reduce-scatter on every rank's NIC.
#include "coll_world.hpp"
#include "handlers/argmax.hpp"

#include <spin/coll/kernels.hpp>
#include <spin/rt/package.hpp>

#include <string>

using namespace spin;
using namespace spin::coll;
using spin::coll::test::world;

namespace {
reduction argmax_reduction(const std::string& name) {
  auto pkg = rt::read_package_file(SPIN_ARGMAX_PACKAGE);
  REQUIRE_MESSAGE(pkg.ok(), (pkg.ok() ? std::string() : pkg.err().message));
  return reduction{name, pkg.value(), kernels_of<argmax>()};
}

value_index input(std::uint32_t rank, std::uint64_t i) {
  return {static_cast<float>((i * 5 + rank * 11) % 13), static_cast<std::uint32_t>(rank * 100000 + i)};
}
} // namespace

TEST_SUITE("collectives") {

TEST_CASE("a user reduction runs allreduce (edge ring and host ring) and reduce-scatter on every rank") {
  for (std::uint32_t n : {1u, 3u, 4u}) {
    world w(test::topology_for(n));
    std::vector<custom_op> ops;
    for (auto& c : w.comms) {
      auto op = c->add_reduction(argmax_reduction("argmax"));
      REQUIRE_MESSAGE(op.ok(), (op.ok() ? std::string() : op.err().message));
      CHECK(op.value().elem_bytes == 8);
      ops.push_back(op.value());
    }
    for (std::uint64_t count : {0ull, 1ull, 127ull, 128ull, 129ull, 4099ull}) {
      std::vector<std::vector<value_index>> in(n, std::vector<value_index>(count)), out(n, std::vector<value_index>(count));
      std::vector<value_index> want(count);
      for (std::uint64_t i = 0; i < count; ++i) {
        value_index best = input(0, i);
        for (std::uint32_t r = 0; r < n; ++r) {
          in[r][i] = input(r, i);
          best = argmax::combine(best, in[r][i]);
        }
        want[i] = best;
      }
      for (algorithm a : {algorithm::edge_ring, algorithm::host_ring}) {
        auto res = w.run([&](std::uint32_t r) { return w.comms[r]->allreduce(in[r].data(), out[r].data(), count, ops[r], a); });
        for (std::uint32_t r = 0; r < n; ++r) {
          INFO(std::string(name(a)) << " ranks " << n << " rank " << r << " count " << count);
          REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
          for (std::uint64_t i = 0; i < count; ++i) {
            REQUIRE(out[r][i].value == want[i].value);
            REQUIRE(out[r][i].index == want[i].index);
          }
        }
      }
      // Reduce-scatter of blocks of count / n elements (the whole vector when n is 1).
      const std::uint64_t block = count / n;
      std::vector<std::vector<value_index>> part(n, std::vector<value_index>(block));
      auto res = w.run([&](std::uint32_t r) { return w.comms[r]->reduce_scatter(in[r].data(), part[r].data(), block, ops[r]); });
      for (std::uint32_t r = 0; r < n; ++r) {
        REQUIRE_MESSAGE(res[r].ok(), (res[r].ok() ? std::string() : res[r].err().message));
        for (std::uint64_t i = 0; i < block; ++i) {
          value_index best = input(0, r * block + i);
          for (std::uint32_t q = 0; q < n; ++q) best = argmax::combine(best, input(q, r * block + i));
          REQUIRE(part[r][i].index == best.index);
        }
      }
    }
  }
}

TEST_CASE("ranks that name different reductions all get the same error") {
  world w(test::topology_for(3));
  std::vector<custom_op> ops;
  for (std::uint32_t r = 0; r < 3; ++r) {
    auto op = w.comms[r]->add_reduction(argmax_reduction(r == 2 ? "argmax-v2" : "argmax"));
    REQUIRE(op.ok());
    ops.push_back(op.value());
  }
  std::vector<std::vector<value_index>> in(3, std::vector<value_index>(10)), out(3, std::vector<value_index>(10));
  auto res = w.run([&](std::uint32_t r) { return w.comms[r]->allreduce(in[r].data(), out[r].data(), 10, ops[r]); });
  for (std::uint32_t r = 0; r < 3; ++r) {
    REQUIRE_FALSE(res[r].ok());
    CHECK(res[r].err().message.find("reduction") != std::string::npos);
  }
}

TEST_CASE("add_reduction refuses what is not a collective engine, and kernels that do not fit") {
  world w(test::topology_for(2));
  reduction r = argmax_reduction("argmax");
  r.host.elem_bytes = 0;
  CHECK(w.comms[0]->add_reduction(r).err().code == errc::invalid_argument);
  r = argmax_reduction("argmax");
  r.package.object.resize(r.package.object.size() / 2);  // not an ELF object any more
  CHECK(w.comms[0]->add_reduction(r).err().code == errc::invalid_argument);
  // A custom_op from nowhere.
  custom_op bogus;
  bogus.slot = 9;
  bogus.elem_bytes = 8;
  std::vector<value_index> v(4);
  CHECK(w.comms[0]->allreduce(v.data(), v.data(), 4, bogus).err().code == errc::invalid_argument);
}

}
