// Test fixture of the collectives: a cluster of a topology, its driving thread, and one
// communicator per host; run() calls a collective on every rank at once, one thread per rank.
#pragma once

#include <doctest/doctest.h>

#include <spin/coll/coll.hpp>
#include <spin/emu/cluster.hpp>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace spin::coll::test {

struct driver {
  std::atomic<bool> stop{false};
  std::thread th;
  void start(emu::cluster& c) {
    th = std::thread([this, &c] { c.run(stop); });
  }
  ~driver() {
    stop = true;
    if (th.joinable()) th.join();
  }
};

/// Whether a world's communicators get the cluster's switches (a fabric).
enum class switches { none, fabric };

struct world {
  std::unique_ptr<emu::cluster> cluster;
  driver drv;  // stops before the cluster goes
  std::unique_ptr<fabric> fab;
  std::vector<std::unique_ptr<communicator>> comms;  // go first: they uninstall on a running cluster

  world(const emu::topology& t, options o = {}, std::uint32_t group_id = 1, switches sw = switches::none,
        const fabric_options& fo = {}, std::uint32_t lcores = 0) {
    start(t, sw, fo, lcores);
    if (fab) o.switches = fab.get();
    group g;
    g.id = group_id;
    const auto hosts = static_cast<std::uint32_t>(t.host_count());
    for (std::uint32_t i = 0; i < hosts; ++i) g.members.push_back(t.nodes[i].rank);
    for (std::uint32_t i = 0; i < hosts; ++i) {
      g.me = i;
      auto cm = communicator::create(*cluster->host(g.members[i]), g, o);
      REQUIRE_MESSAGE(cm.ok(), (cm.ok() ? "" : cm.err().message));
      comms.push_back(std::move(cm.value()));
    }
  }
  /// The cluster and its switches' fabric only: the test makes its own groups.
  world(const emu::topology& t, const fabric_options& fo) { start(t, switches::fabric, fo, 0); }
  std::uint32_t size() const { return static_cast<std::uint32_t>(comms.size()); }

  /// Runs f(rank) on one thread per rank and returns each rank's result.
  std::vector<result<void>> run(const std::function<result<void>(std::uint32_t)>& f) {
    std::vector<result<void>> out(size());
    std::vector<std::thread> th;
    for (std::uint32_t r = 0; r < size(); ++r) th.emplace_back([&, r] { out[r] = f(r); });
    for (auto& t : th) t.join();
    return out;
  }

private:
  void start(const emu::topology& t, switches sw, const fabric_options& fo, std::uint32_t lcores) {
    emu::cluster_options co;
    co.lcores = lcores;
    auto c = emu::cluster::create(t, co);
    REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.err().message));
    cluster = std::move(c.value());
    drv.start(*cluster);
    if (sw == switches::fabric) {
      auto f = fabric::create(*cluster, fo);
      REQUIRE_MESSAGE(f.ok(), (f.ok() ? "" : f.err().message));
      fab = std::move(f.value());
    }
  }
};

/// memcmp that allows n == 0 with null pointers (empty vectors), which memcmp itself does not.
inline bool same_bytes(const void* a, const void* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

/// A link model that loses `loss` of the packets and, when it loses any, also duplicates 1% and
/// reorders `reorder` of them; fates drawn from `seed`.
inline emu::link_model lossy(double loss, std::uint64_t seed, double reorder = 0.03) {
  emu::link_model m;
  m.loss = loss;
  m.duplicate = loss > 0 ? 0.01 : 0.0;
  m.reorder = loss > 0 ? reorder : 0.0;
  m.seed = seed;
  return m;
}

/// A leaf-spine network: leaf i ("l<i>") holds hosts_per_leaf[i] hosts (ranks in order), every
/// leaf hangs off one spine ("sp"); link k gets model m with seed m.seed + k.
inline emu::topology leaf_spine(const std::vector<std::uint32_t>& hosts_per_leaf, const emu::link_model& m = {}) {
  emu::topology t;
  std::uint32_t hosts = 0;
  for (std::uint32_t n : hosts_per_leaf) hosts += n;
  for (std::uint32_t h = 0; h < hosts; ++h) t.nodes.push_back({emu::node_kind::host, "h" + std::to_string(h), h, 1, {}});
  for (std::uint32_t l = 0; l < hosts_per_leaf.size(); ++l)
    t.nodes.push_back({emu::node_kind::switch_, "l" + std::to_string(l), 0, 1, {}});
  const auto spine = static_cast<std::uint32_t>(t.nodes.size());
  t.nodes.push_back({emu::node_kind::switch_, "sp", 0, 1, {}});
  auto link = [&](std::uint32_t a, std::uint32_t b) {
    emu::link_spec l;
    l.a = a;
    l.b = b;
    l.a_port = static_cast<std::uint32_t>(t.nodes[a].ports.size());
    l.b_port = static_cast<std::uint32_t>(t.nodes[b].ports.size());
    l.model = m;
    l.model.seed = m.seed + t.links.size();
    t.nodes[a].ports.push_back(static_cast<std::uint32_t>(t.links.size()));
    t.nodes[b].ports.push_back(static_cast<std::uint32_t>(t.links.size()));
    t.links.push_back(l);
  };
  std::uint32_t h = 0;
  for (std::uint32_t l = 0; l < hosts_per_leaf.size(); ++l)
    for (std::uint32_t k = 0; k < hosts_per_leaf[l]; ++k) link(h++, hosts + l);
  for (std::uint32_t l = 0; l < hosts_per_leaf.size(); ++l) link(hosts + l, spine);
  REQUIRE(emu::validate(t).ok());
  return t;
}

inline emu::topology topology_for(std::uint32_t n, const emu::link_model& m = {}) {
  if (n == 1 || n > 8) return emu::star(n, m);
  if (n == 2) return emu::pair(m);
  return emu::ring(n, m);
}

} // namespace spin::coll::test
