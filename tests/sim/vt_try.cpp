#include <spin/sim/cluster.hpp>
#include <spin/coll/coll.hpp>
#include <cstdio>
#include <cstring>
using namespace spin;
int main(int argc, char** argv) {
  const unsigned n = argc > 1 ? atoi(argv[1]) : 4;
  const std::size_t count = argc > 2 ? atoll(argv[2]) : 1 << 16;
  emu::link_model lm; lm.rate_gbps = 100; lm.latency = std::chrono::nanoseconds(500);
  auto t = emu::star(n, lm);
  auto c = sim::cluster::create(t);
  if (!c) { printf("create: %s\n", c.err().message.c_str()); return 1; }
  auto fab = coll::fabric::create(t, c.value()->controls());
  if (!fab) { printf("fabric: %s\n", fab.err().message.c_str()); return 1; }
  std::vector<std::vector<float>> out(n);
  std::vector<std::string> errs(n);
  std::vector<double> times(n);
  for (unsigned r = 0; r < n; ++r) {
    c.value()->spawn("rank" + std::to_string(r), [&, r] {
      coll::group g; g.id = 1; g.me = r; for (unsigned i = 0; i < n; ++i) g.members.push_back(i);
      coll::options o; o.switches = fab.value().get(); o.arena_bytes = 64 << 20; o.staging_bytes = 8 << 20;
      auto cm = coll::communicator::create(*c.value()->host(r), g, o);
      if (!cm) { errs[r] = "create: " + cm.err().message; return; }
      std::vector<float> in(count); for (std::size_t i = 0; i < count; ++i) in[i] = float(r + i % 7);
      out[r].resize(count);
      for (auto algo : {coll::algorithm::switch_agg, coll::algorithm::edge_ring}) {
        auto t0 = c.value()->host(r)->now();
        auto res = cm.value()->allreduce(in.data(), out[r].data(), count, coll::dtype::f32, coll::op::sum, algo);
        auto t1 = c.value()->host(r)->now();
        if (!res) { errs[r] = "allreduce: " + res.err().message; return; }
        if (r == 0) printf("rank 0 %s: %.3f us\n", algo == coll::algorithm::switch_agg ? "switch" : "edge_ring", std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    });
  }
  auto rr = c.value()->run();
  printf("run: %s\n", rr ? "ok" : rr.err().message.c_str());
  for (unsigned r = 0; r < n; ++r) if (!errs[r].empty()) printf("rank %u: %s\n", r, errs[r].c_str());
  unsigned wrong = 0;
  for (unsigned r = 0; r < n; ++r) for (std::size_t i = 0; i < count; ++i) { float want = 0; for (unsigned k = 0; k < n; ++k) want += float(k + i % 7); if (out[r].size() != count || out[r][i] != want) { ++wrong; } }
  printf("wrong %u\n", wrong);
  auto st = c.value()->stats();
  printf("%s", sim::to_text(st).c_str());
  for (auto& nd : st.nodes) for (std::size_t i = 0; i < sim::drop_count; ++i) if (nd.drops[i]) printf("%s %s %llu\n", nd.name.c_str(), sim::drop_name(sim::drop(i)), (unsigned long long)nd.drops[i]);
}
