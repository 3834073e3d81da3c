// The body of one rank in the virtual-time tests (remote_rank.cpp in its own process,
// remote_test.cpp as an in-process actor): allreduce `count` int32 values `iters` times with each
// algorithm (switch, edge ring, host ring), check every result exactly, and return the line
//   rank <me> <ok|wrong> switch <ns>... edge_ring <ns>... host_ring <ns>...
// where each <ns> is one call's virtual time (communicator::now before and after), or an error
// line "rank <me>: ...".
#pragma once

#include <spin/coll/coll.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace spin::test {

/// The group (id 1) of the ranks `members`, as member `me`, and options that aggregate on `fab`.
inline std::pair<coll::group, coll::options> rank_group(const std::vector<std::uint32_t>& members, std::uint32_t me, coll::fabric* fab) {
  coll::group g;
  g.id = 1;
  g.members = members;
  g.me = me;
  coll::options o;
  o.switches = fab;
  return {g, o};
}

inline std::string run_rank(coll::communicator& comm, std::uint32_t me, std::uint32_t hosts, std::size_t count, int iters, bool& ok) {
  std::vector<std::int32_t> in(count), out(count), want(count, 0);
  auto value = [](std::uint32_t r, std::size_t i) {
    return static_cast<std::int32_t>((r + 1) * (i % 1000)) - static_cast<std::int32_t>(7 * r);
  };
  for (std::size_t i = 0; i < count; ++i) in[i] = value(me, i);
  for (std::uint32_t r = 0; r < hosts; ++r)
    for (std::size_t i = 0; i < count; ++i) want[i] += value(r, i);
  ok = true;
  std::string times;
  for (auto [a, name] : {std::pair{coll::algorithm::switch_agg, "switch"}, std::pair{coll::algorithm::edge_ring, "edge_ring"},
                         std::pair{coll::algorithm::host_ring, "host_ring"}}) {
    times += std::string(" ") + name;
    for (int k = 0; k < iters; ++k) {
      std::fill(out.begin(), out.end(), 0);
      const auto t0 = comm.now();
      auto r = comm.allreduce(in.data(), out.data(), count, coll::dtype::i32, coll::op::sum, a);
      const auto t1 = comm.now();
      if (!r) {
        ok = false;
        return "rank " + std::to_string(me) + ": " + name + " allreduce: " + r.err().message;
      }
      ok = ok && out == want;
      times += " " + std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    }
  }
  return "rank " + std::to_string(me) + (ok ? " ok" : " wrong") + times;
}

} // namespace spin::test
