// custom_reduction: a reduction spin::coll does not ship, run by the NICs of an emulated
// cluster. Each rank holds a vector of complex numbers; allreduce multiplies them element-wise
// across the ranks with the complex_prod reduction (complex_prod.hpp), whose package spinc built
// from complex_prod.cpp. The program checks every element against an exact reference and
// prints the time per allreduce.
//
//   custom_reduction [--ranks 4] [--count 10000] [--iterations 5] [--package PATH]
//
// Exit status: 0 when every element on every rank is exact; 1 on a wrong element or a failed
// collective; 2 on bad arguments or when the cluster cannot start.
#include "complex_prod.hpp"

#include <spin/coll/coll.hpp>
#include <spin/emu/cluster.hpp>
#include <spin/emu/eal.hpp>
#include <spin/rt/package.hpp>

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#ifndef CUSTOM_REDUCTION_PACKAGE
#define CUSTOM_REDUCTION_PACKAGE ""  // built without spinc: --package is required
#endif

namespace {

struct options {
  std::uint32_t ranks = 4;
  std::uint64_t count = 10000;
  std::uint32_t iterations = 5;
  std::string package = CUSTOM_REDUCTION_PACKAGE;
};

// Small Gaussian integers: every partial product is an integer below 2^24 in magnitude, which
// float32 holds exactly, so the exact reference is the integer product.
complex_f32 factor(std::uint32_t rank, std::uint64_t i) {
  const auto a = static_cast<int>((i * 7 + rank * 3) % 5) - 2, b = static_cast<int>((i * 3 + rank * 5) % 3) - 1;
  return {static_cast<float>(a), static_cast<float>(b)};
}

int cannot_run(const std::string& msg) {
  std::fprintf(stderr, "custom_reduction: %s\n", msg.c_str());
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  // ---- arguments ----
  options opt;
  CLI::App app{"Allreduce with a user reduction (complex product) on an emulated cluster"};
  app.add_option("--ranks", opt.ranks, "hosts in the cluster")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--count", opt.count, "complex numbers per rank")->check(CLI::Range(0, 1 << 24))->capture_default_str();
  app.add_option("--iterations", opt.iterations, "allreduce calls")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--package", opt.package, "complex_prod package built by spinc")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is a ParseError with exit code 0; bad arguments: 2
  }
  if (opt.package.empty()) return cannot_run("--package is required (this build has no spinc)");

  // ---- init: EAL, the cluster (a ring of hosts, a star for one or two), the package ----
  if (auto r = spin::emu::eal_init(spin::emu::default_eal_args("custom-reduction-" + std::to_string(getpid()))); !r)
    return cannot_run(r.err().message);
  const spin::emu::topology topo = opt.ranks >= 3 ? spin::emu::ring(opt.ranks, {}) : spin::emu::star(opt.ranks, {});
  auto cluster = spin::emu::cluster::create(topo, {});
  if (!cluster) return cannot_run(cluster.err().message);
  auto pkg = spin::rt::read_package_file(opt.package);
  if (!pkg) return cannot_run(pkg.err().message);
  std::atomic<bool> stop{false};
  std::thread driver([&] { cluster.value()->run(stop); });

  spin::coll::reduction red;
  red.name = "complex_prod";
  red.package = pkg.value();
  red.host = spin::coll::kernels_of<complex_prod>();
  spin::coll::group g;
  g.id = 7;
  for (std::uint32_t r = 0; r < opt.ranks; ++r) g.members.push_back(r);
  std::vector<std::unique_ptr<spin::coll::communicator>> comms;
  std::vector<spin::coll::custom_op> ops;
  int status = 0;
  for (std::uint32_t r = 0; r < opt.ranks && status == 0; ++r) {
    g.me = r;
    auto c = spin::coll::communicator::create(*cluster.value()->host(r), g);
    if (!c) {
      status = cannot_run(c.err().message);
      break;
    }
    auto op = c.value()->add_reduction(red);
    if (!op) {
      status = cannot_run(op.err().message);
      break;
    }
    ops.push_back(op.value());
    comms.push_back(std::move(c.value()));
  }

  // ---- per-rank loop: each rank is a host thread that calls allreduce ----
  std::vector<std::vector<complex_f32>> in(opt.ranks), out(opt.ranks);
  for (std::uint32_t r = 0; r < opt.ranks && status == 0; ++r) {
    in[r].resize(opt.count);
    out[r].resize(opt.count);
    for (std::uint64_t i = 0; i < opt.count; ++i) in[r][i] = factor(r, i);
  }
  std::atomic<std::uint64_t> failures{0};
  double seconds = 0;
  if (status == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ranks;
    for (std::uint32_t r = 0; r < opt.ranks; ++r)
      ranks.emplace_back([&, r] {
        for (std::uint32_t it = 0; it < opt.iterations; ++it)
          if (auto res = comms[r]->allreduce(in[r].data(), out[r].data(), opt.count, ops[r]); !res) {
            std::fprintf(stderr, "custom_reduction: rank %u: %s\n", r, res.err().message.c_str());
            failures.fetch_add(1);
            return;
          }
      });
    for (auto& t : ranks) t.join();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // ---- check against the exact product ----
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < opt.count && status == 0 && failures == 0; ++i) {
    long long re = 1, im = 0;
    for (std::uint32_t r = 0; r < opt.ranks; ++r) {
      const complex_f32 f = factor(r, i);
      const long long nre = re * static_cast<long long>(f.re) - im * static_cast<long long>(f.im);
      im = re * static_cast<long long>(f.im) + im * static_cast<long long>(f.re);
      re = nre;
    }
    for (std::uint32_t r = 0; r < opt.ranks; ++r)
      if (out[r][i].re != static_cast<float>(re) || out[r][i].im != static_cast<float>(im)) ++wrong;
  }

  // ---- stop and report ----
  comms.clear();
  stop = true;
  driver.join();
  if (status != 0) return status;
  if (failures != 0 || wrong != 0) {
    std::printf("custom_reduction: %llu failed calls, %llu wrong elements\n", static_cast<unsigned long long>(failures.load()),
                static_cast<unsigned long long>(wrong));
    return 1;
  }
  std::printf("custom_reduction: %u ranks x %llu complex numbers, %u allreduces, all exact, %.3f ms per allreduce\n",
              opt.ranks, static_cast<unsigned long long>(opt.count), opt.iterations, seconds * 1e3 / opt.iterations);
  return 0;
}
