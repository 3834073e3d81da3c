// One host program of a virtual-time spin-emu (tests/sim/remote_test.cpp): rank NODE of a group
// of the topology's first HOSTS hosts, through communicator::connect, with the switch at node
// SWITCH (fabric::connect). It runs rank_body.hpp's allreduces (COUNT int32 values, ITERS times
// per algorithm, every result checked exactly) and prints its line:
//   rank <node> <ok|wrong> switch <ns> <ns>... edge_ring <ns>... host_ring <ns>...
//
//   remote_rank SOCKET NODE HOSTS SWITCH COUNT ITERS
#include "rank_body.hpp"

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
  const auto [g, o] = spin::test::rank_group(ranks, node, fab->get());
  auto comm = coll::communicator::connect(socket, node, g, o);
  if (!comm) return std::fprintf(stderr, "rank %u: communicator: %s\n", node, comm.err().message.c_str()), 1;

  bool ok = false;
  const std::string line = spin::test::run_rank(**comm, node, hosts, count, iters, ok);
  std::printf("%s\n", line.c_str());
  return ok ? 0 : 3;
}
