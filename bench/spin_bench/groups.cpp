// spin-bench groups: G groups of M members on a star of H emulated hosts (group g's members are
// hosts (g x M + k) mod H, so every host serves G x M / H groups), each with its own
// communicator per member, run C allreduces of S bytes (int32 sum) at once, one thread per rank.
// Every call is timed on its rank's thread; the report gives p50, p99 and max over all calls of
// all ranks, and checks every result exactly. Groups that got switch slots (a fabric of one
// switch, first come, first served) aggregate there; the others run on the edge ring.
#include "groups.hpp"

#include "../common.hpp"
#include "repair_options.hpp"

#include <spin/coll/coll.hpp>
#include <spin/emu/cluster.hpp>
#include <spin/emu/eal.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include <unistd.h>

namespace spin::bench {

namespace {
using clock_type = std::chrono::steady_clock;

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto k = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(k, v.size() - 1)];
}
} // namespace

int run_groups(const groups_options& o) {
  if (o.members < 2 || o.members > o.hosts) {
    std::fprintf(stderr, "spin-bench groups: --members must be 2 .. --hosts (%u)\n", o.hosts);
    return 2;
  }
  if (o.bytes < 4 || o.bytes % 4 != 0) {
    std::fprintf(stderr, "spin-bench groups: --bytes must be a positive multiple of 4 (int32 elements)\n");
    return 2;
  }
  const run_conditions cond = measure_conditions();
  cond.print("spin-bench groups");
  if (auto r = emu::eal_init(emu::default_eal_args("spin-bench-groups-" + std::to_string(::getpid()))); !r) {
    std::fprintf(stderr, "spin-bench groups: %s\n", r.err().message.c_str());
    return 2;
  }
  emu::cluster_options co;
  co.lcores = o.lcores;
  auto cluster = emu::cluster::create(emu::star(o.hosts, emu::link_model{}), co);
  if (!cluster) {
    std::fprintf(stderr, "spin-bench groups: %s\n", cluster.err().message.c_str());
    return 2;
  }
  emu::cluster_runner running(*cluster.value());
  auto fab = coll::fabric::create(*cluster.value());
  if (!fab) {
    std::fprintf(stderr, "spin-bench groups: %s\n", fab.err().message.c_str());
    return 2;
  }
  coll::options copt;
  copt.switches = fab.value().get();
  copt.arena_bytes = std::size_t{1} << 20;  // small messages: a small arena per communicator
  copt.staging_bytes = std::size_t{128} << 10;
  copt.timeout = std::chrono::seconds(60);
  set_repair_timer(copt, o.repair_min_us, o.repair_max_ms);
  copt.log = [](const std::string&) {};  // groups without switch slots run on the edge ring: expected here
  const std::uint32_t ranks = o.groups * o.members;
  std::printf("%u groups of %u members on %u emulated hosts and a switch (%u lcores of %u hardware threads), %u rank threads; "
              "%u allreduces of %llu bytes (int32 sum) per group\n",
              o.groups, o.members, o.hosts, cluster.value()->lcores(), std::max(1u, std::thread::hardware_concurrency()), ranks,
              o.calls, static_cast<unsigned long long>(o.bytes));
  std::fflush(stdout);
  std::vector<std::unique_ptr<coll::communicator>> comms(ranks);
  for (std::uint32_t g = 0; g < o.groups; ++g) {
    coll::group grp;
    grp.id = g + 1;
    for (std::uint32_t k = 0; k < o.members; ++k) grp.members.push_back((g * o.members + k) % o.hosts);
    std::sort(grp.members.begin(), grp.members.end());
    if (std::adjacent_find(grp.members.begin(), grp.members.end()) != grp.members.end()) {
      std::fprintf(stderr, "spin-bench groups: group %u would list a host twice (members > hosts?)\n", g);
      return 2;
    }
    for (std::uint32_t k = 0; k < o.members; ++k) {
      grp.me = k;
      auto c = coll::communicator::create(*cluster.value()->host(grp.members[k]), grp, copt);
      if (!c) {
        std::fprintf(stderr, "spin-bench groups: communicator of group %u, member %u (host %u): %s\n", g, k, grp.members[k],
                     c.err().message.c_str());
        return 2;
      }
      comms[g * o.members + k] = std::move(c.value());
    }
  }
  const std::uint64_t count = o.bytes / 4;
  std::vector<std::vector<double>> times(ranks);
  std::vector<std::uint64_t> wrong(ranks, 0), failed(ranks, 0);
  std::vector<std::string> first_error(ranks);
  std::atomic<std::uint32_t> ready{0};
  std::vector<std::thread> threads;
  const auto t0 = clock_type::now();
  for (std::uint32_t r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      const std::uint32_t g = r / o.members, k = r % o.members;
      std::vector<std::int32_t> in(count), out(count);
      ready++;
      while (ready.load() < ranks) std::this_thread::sleep_for(std::chrono::microseconds(100));
      for (std::uint32_t c = 0; c < o.calls; ++c) {
        for (std::uint64_t i = 0; i < count; ++i) in[i] = static_cast<std::int32_t>(g * 1000 + c * 100 + k + i);
        const auto s = clock_type::now();
        auto res = comms[r]->allreduce(in.data(), out.data(), count, coll::dtype::i32, coll::op::sum);
        times[r].push_back(std::chrono::duration<double, std::micro>(clock_type::now() - s).count());
        if (!res) {
          ++failed[r];
          if (first_error[r].empty()) first_error[r] = res.err().message;
          break;
        }
        for (std::uint64_t i = 0; i < count; ++i) {
          const std::int64_t want = static_cast<std::int64_t>(o.members) * (g * 1000 + c * 100 + i) + o.members * (o.members - 1) / 2;
          wrong[r] += out[i] != static_cast<std::int32_t>(want);
        }
      }
    });
  for (auto& t : threads) t.join();
  const double wall_s = std::chrono::duration<double>(clock_type::now() - t0).count();
  std::vector<double> all;
  std::uint64_t total_wrong = 0, total_failed = 0;
  for (std::uint32_t r = 0; r < ranks; ++r) {
    all.insert(all.end(), times[r].begin(), times[r].end());
    total_wrong += wrong[r];
    total_failed += failed[r];
  }
  const auto usage = fab.value()->usage();
  std::uint32_t switch_groups = 0;
  for (const auto& u : usage) switch_groups += u.groups;
  const double p50 = percentile(all, 50), p99 = percentile(all, 99), mx = all.empty() ? 0 : *std::max_element(all.begin(), all.end());
  std::uint64_t ticks = 0, repairs = 0;
  for (const auto& c : comms) {
    const coll::comm_stats s = c->stats();
    ticks += s.repair_ticks;
    repairs += s.repaired_epochs;
  }
  std::printf("calls %zu (%u groups aggregated on the switch, the others on the edge ring), wall %.2f s\n", all.size(), switch_groups,
              wall_s);
  std::printf("call time: p50 %.0f us, p99 %.0f us, max %.0f us\n", p50, p99, mx);
  std::printf("repair timer (%u us .. %u ms): %llu ticks, %llu repaired epochs (lossless links: every repair was spurious)\n", o.repair_min_us,
              o.repair_max_ms, static_cast<unsigned long long>(ticks), static_cast<unsigned long long>(repairs));
  std::printf("aim: slowest call under 1 s: %s (%.3f s)\n", mx < 1e6 ? "met" : "MISSED", mx / 1e6);
  for (std::uint32_t r = 0; r < ranks; ++r)
    if (!first_error[r].empty()) {
      std::printf("FAIL rank %u of group %u: %s\n", r % o.members, r / o.members, first_error[r].c_str());
      break;
    }
  std::printf("result: %s (#wrong %llu, failed calls %llu)\n", total_wrong == 0 && total_failed == 0 ? "every result exact" : "FAILED",
              static_cast<unsigned long long>(total_wrong), static_cast<unsigned long long>(total_failed));
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  nlohmann::json j = {{"conditions", cond.to_json()},
                      {"options", {{"hosts", o.hosts}, {"groups", o.groups}, {"members", o.members}, {"calls", o.calls}, {"bytes", o.bytes},
                                   {"lcores", cluster.value()->lcores()}, {"repair_min_us", o.repair_min_us},
                                   {"repair_max_ms", o.repair_max_ms}}},
                      {"repair_ticks", ticks},
                      {"repaired_epochs", repairs},
                      {"calls", all.size()},
                      {"switch_groups", switch_groups},
                      {"wall_s", wall_s},
                      {"p50_us", p50},
                      {"p99_us", p99},
                      {"max_us", mx},
                      {"wrong", total_wrong},
                      {"failed_calls", total_failed}};
  const std::string path = o.out_dir + "/groups.json";
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) {
    std::fprintf(stderr, "spin-bench groups: cannot write %s\n", path.c_str());
    return 2;
  }
  std::printf("wrote %s\n", path.c_str());
  comms.clear();  // uninstall while the cluster runs
  return total_wrong == 0 && total_failed == 0 ? 0 : 1;
}

} // namespace spin::bench
