// A program built out of tree with `pkg-config --cflags --libs spin-coll`: the rank side of
// spin::coll, as an MPI rank would link it. With no spin-emu at the socket, connect fails with
// an error.
#include <spin/coll/coll.hpp>

#include <cstdio>

int main() {
  spin::coll::group g;
  g.id = 1;
  g.me = 0;
  g.members = {0};
  auto c = spin::coll::communicator::connect("/nonexistent/spin-emu.sock", 0, g);
  if (c.ok()) return 1;
  std::printf("connect: %s\n", c.err().message.c_str());
  return 0;
}
