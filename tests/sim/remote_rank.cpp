// One host program of a virtual-time spin-emu (tests/sim/remote_test.cpp): rank NODE of a group
// of the topology's first HOSTS hosts, through communicator::connect, with the switch at node
// SWITCH (fabric::connect). It allreduces COUNT int32 values ITERS times with each algorithm
// (switch, edge ring, host ring), checks every result exactly, and prints one line:
//   rank <node> <ok|wrong> switch <ns> <ns>... edge_ring <ns>... host_ring <ns>...
// where each <ns> is one call's virtual time (communicator::now before and after).
//
//   remote_rank SOCKET NODE HOSTS SWITCH COUNT ITERS
#include <spin/coll/coll.hpp>
#include <spin/host/host.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace spin;

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: remote_rank SOCKET NODE HOSTS SWITCH COUNT ITERS\n");
    return 2;
  }
  const std::string socket = argv[1];
  const auto node = static_cast<std::uint32_t>(std::strtoul(argv[2], nullptr, 10));
  const auto hosts = static_cast<std::uint32_t>(std::strtoul(argv[3], nullptr, 10));
  const auto sw = static_cast<std::uint32_t>(std::strtoul(argv[4], nullptr, 10));
  const auto count = static_cast<std::size_t>(std::strtoul(argv[5], nullptr, 10));
  const int iters = std::atoi(argv[6]);

  // The members' NIC ranks, from the emulator's node list (a connection that does not attach).
  std::vector<std::uint32_t> ranks;
  {
    auto c = host::client::connect(socket);
    if (!c) return std::fprintf(stderr, "rank %u: %s\n", node, c.err().message.c_str()), 1;
    auto nodes = c->nodes();
    if (!nodes) return std::fprintf(stderr, "rank %u: %s\n", node, nodes.err().message.c_str()), 1;
    for (std::uint32_t i = 0; i < hosts; ++i) ranks.push_back(nodes.value()[i].rank);
  }
  auto fab = coll::fabric::connect({coll::remote_switch{socket, sw, ranks}});
  if (!fab) return std::fprintf(stderr, "rank %u: fabric: %s\n", node, fab.err().message.c_str()), 1;
  coll::group g;
  g.id = 1;
  g.members = ranks;
  g.me = node;
  coll::options o;
  o.switches = fab->get();
  auto comm = coll::communicator::connect(socket, node, g, o);
  if (!comm) return std::fprintf(stderr, "rank %u: communicator: %s\n", node, comm.err().message.c_str()), 1;

  std::vector<std::int32_t> in(count), out(count), want(count, 0);
  for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<std::int32_t>((node + 1) * (i % 1000)) - static_cast<std::int32_t>(7 * node);
  for (std::uint32_t r = 0; r < hosts; ++r)
    for (std::size_t i = 0; i < count; ++i) want[i] += static_cast<std::int32_t>((r + 1) * (i % 1000)) - static_cast<std::int32_t>(7 * r);

  bool ok = true;
  std::string line = "rank " + std::to_string(node);
  std::string times;
  for (auto [a, name] : {std::pair{coll::algorithm::switch_agg, "switch"}, std::pair{coll::algorithm::edge_ring, "edge_ring"},
                         std::pair{coll::algorithm::host_ring, "host_ring"}}) {
    times += std::string(" ") + name;
    for (int k = 0; k < iters; ++k) {
      std::fill(out.begin(), out.end(), 0);
      const auto t0 = (*comm)->now();
      auto r = (*comm)->allreduce(in.data(), out.data(), count, coll::dtype::i32, coll::op::sum, a);
      const auto t1 = (*comm)->now();
      if (!r) return std::fprintf(stderr, "rank %u: %s allreduce: %s\n", node, name, r.err().message.c_str()), 1;
      ok = ok && out == want;
      times += " " + std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    }
  }
  std::printf("%s %s%s\n", line.c_str(), ok ? "ok" : "wrong", times.c_str());
  return ok ? 0 : 3;
}
