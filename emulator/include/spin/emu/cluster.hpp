// Cluster mode: one process emulates every host's NIC and every switch of a topology, joined by
// net_ring cables whose links run the link model (docs/emulator.md, "Cluster mode").
//
// Each link direction is a chain of two rte_rings: the sending node's port enqueues into the
// first, the link stage (emu::link) applies bandwidth, latency, loss, duplication and
// reordering and moves packets into the second, from which the receiving node's port dequeues.
// Switches are NICs that forward frames by destination rank along the topology's shortest-path
// routes; frames addressed to the switch itself go to its own runtime.
//
// Threads: run() spreads the cluster over L lcores (cluster_options::lcores; default every CPU
// the process may use): each node's lanes (its HPUs) and each link direction belong to one
// lcore, which polls them to completion; a cable between two lcores is an SP/SC ring. An idle
// lcore sleeps on its doorbell, rung by whoever gives it work (another lcore's transmissions,
// steered frames, host messages), or until its next link delivery is due. poll() runs every
// node and link once on the calling thread (one lcore runs any cluster correctly). The NICs'
// control operations (nic_control) may be called from any thread meanwhile.
#pragma once

#include <spin/emu/lcore.hpp>
#include <spin/emu/link.hpp>
#include <spin/emu/nic.hpp>
#include <spin/emu/topology.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace spin::emu {

/// How a cluster is built (the topology says how many nodes, links and HPUs).
struct cluster_options {
  /// Per port of every node. The default pool is small (1023 mbufs of 4 KiB) because a cluster
  /// has many ports and EAL runs without hugepages in 1 GiB.
  port_options port = [] {
    port_options o;
    o.pool_mbufs = 1023;
    o.rx_desc = 512;
    o.tx_desc = 512;
    // A frame with 4 KiB of payload (spin::coll's default packet) in one mbuf: no chain to build
    // and none to linearise at the receiver.
    o.mbuf_data_bytes = 4096 + 128;
    return o;
  }();
  /// Template of every host's runtime (hpus comes from the topology). Switches get 1 HPU.
  rt::runtime_config runtime;
  std::uint32_t payload_bytes = 4096;  ///< payload per packet of host messages (one mbuf of the default port)
  std::uint32_t burst = 32;
  std::uint32_t cable_ring_packets = 1024;  ///< each of the two rings per link direction
  std::uint32_t dup_pool_mbufs = 2047;      ///< mbufs for duplicated packets (all links)
  /// Lcores run() spreads the nodes and links over (at most one per node lane or link); 0: as
  /// many as CPUs this process may run on (emu::process_cpus).
  std::uint32_t lcores = 0;
  /// When non-empty, lcore i is pinned to lcore_cpus[i % size] (lcore 0 is run()'s caller).
  std::vector<int> lcore_cpus;
  /// Each node lane and link direction has a home lcore (round-robin). With `help`, an lcore
  /// whose own round found nothing polls the other lcores' lanes and links that are free (a
  /// lane's lock, a link's flag) before it backs off, so that the work of any collective
  /// spreads over every lcore; without it each lcore polls only its own.
  bool help = true;
  /// Longest sleep of an idle lcore (it wakes earlier when rung or when a link delivery is
  /// due). Each wake-up of an idle cluster costs a round: 5 nodes on 2 lcores used 31 to 41 ms
  /// of CPU per second at 2 ms, 20 to 23 ms at 10 ms (plain build). 10 ms once slowed
  /// scripts/demo from 1.1 to 1.4 s per epoch, which was not explained (at 2 ms
  /// cluster_lcore_stats::unrung_wakeups counts no un-rung work there); since the process has
  /// one watchdog thread, not one per NIC, three alternating pairs gave 5.8 to 6.8 s for the 5
  /// epochs at 2 ms and 6.2 to 6.7 s at 10 ms. Until more runs say so, 2 ms.
  std::chrono::microseconds idle_sleep_max{2000};
  /// Empty rounds an idle lcore spends in `pause` before it yields its core (idle_backoff). A
  /// cluster's lcores share the cores with the rank threads that feed them, so by default none:
  /// 64 made a 4 KiB switch allreduce of 4 ranks on 2 cores take 75 to 105 us instead of 52 to
  /// 60 us (docs/benchmarks.md, sixth session).
  std::uint32_t idle_pause_rounds = 0;
  /// When non-empty, every node captures its ports to `<capture_dir>/<node name>.pcap`.
  std::string capture_dir;
};

/// What one lcore of a running cluster did (cluster::lcore_stats). Busy time is the wall-clock
/// time of rounds that moved something (its own or, helping, another lcore's work).
struct cluster_lcore_stats {
  std::uint64_t busy_rounds = 0;   ///< rounds of its own lanes and links that moved something
  std::uint64_t helped_rounds = 0; ///< rounds over other lcores' lanes and links that moved something
  std::uint64_t empty_rounds = 0;  ///< rounds that found nothing to do
  std::uint64_t sleeps = 0;        ///< times it slept on its doorbell
  std::uint64_t busy_ns = 0;       ///< time in rounds that moved something
  /// Full-length sleeps (cluster_options::idle_sleep_max), neither rung nor cut short for a
  /// link's next delivery, after which the next round moved something: work that reached this
  /// lcore without ringing it and waited up to the limit, or (rarely) work that arrived in the
  /// microseconds between the timeout and that round, which needed no ring.
  std::uint64_t unrung_wakeups = 0;
};

/// Counters of one link direction.
struct cluster_link_stats {
  std::string from, to;  ///< node names
  link_stats stats;
};

/// Snapshot of a cluster.
struct cluster_stats {
  std::vector<nic_stats> nodes;           ///< hosts, then switches, in topology order
  std::vector<cluster_link_stats> links;  ///< two per topology link: a->b, then b->a
};
/// JSON object {"nodes": [<nic>...], "links": [{"from", "to", "stats"}...]} (docs/emulator.md,
/// "Counters").
std::string to_json(const cluster_stats& s);
/// Every node's tables (host::to_text), then one table of the links, a row per direction.
std::string to_text(const cluster_stats& s);

/// Rank of switch number `i` (0-based among switches) in emulated addresses: 65535 - i; no
/// host may use it.
constexpr std::uint32_t switch_rank(std::uint32_t i) { return max_rank - i; }

/// An emulated cluster.
class cluster {
public:
  /// Builds every node and link of `t`. Needs EAL. Errors: invalid_argument (an invalid
  /// topology: validate()'s message; a host rank that collides with a switch's rank), and those
  /// of nic::create and link::create (no_memory when EAL's memory cannot hold the pools: the
  /// message says which).
  static result<std::unique_ptr<cluster>> create(const topology& t, const cluster_options& o);
  /// Stops every node and frees every mbuf (in NICs, cables and links). The thread that drove
  /// poll() must have stopped.
  ~cluster();
  cluster(const cluster&) = delete;
  cluster& operator=(const cluster&) = delete;

  /// One round: every node polls every lane once, every link direction moves what is due, on
  /// the calling thread. Returns the work done (0: nothing moved). Only while run() does not run.
  std::uint32_t poll() noexcept;
  /// Runs the cluster on its lcores until `stop` is true: lcore 0 on the calling thread, the
  /// others on EAL-registered threads started here and joined before it returns.
  void run(const std::atomic<bool>& stop) noexcept;
  /// Lcores run() uses.
  std::uint32_t lcores() const noexcept { return static_cast<std::uint32_t>(_lcores.size()); }
  /// Which lcore polls lane `lane` of node `node`, and which polls link direction `dir`
  /// (2 x link + 0 for a -> b, + 1 for b -> a).
  std::uint32_t lcore_of_lane(std::uint32_t node, std::uint32_t lane) const noexcept;
  std::uint32_t lcore_of_link(std::uint32_t dir) const noexcept { return _dirs[dir].lcore; }
  /// Counters of each lcore since the cluster was built (any thread, any time).
  std::vector<cluster_lcore_stats> lcore_stats() const;
  /// Polls until every node is idle and no packet is in a cable or link, or `timeout` passes.
  /// Returns true when quiet. Only while no other thread polls.
  bool quiesce(std::chrono::milliseconds timeout);

  const topology& topo() const noexcept { return _topo; }
  /// Node `index` of the topology (hosts first).
  nic& node(std::uint32_t index) noexcept { return *_nodes[index]; }
  std::uint32_t node_count() const noexcept { return static_cast<std::uint32_t>(_nodes.size()); }
  /// The NIC of host `rank`, or null.
  nic* host(std::uint32_t rank) noexcept;
  /// Every node's control interface, in topology order.
  std::vector<nic_control*> controls();
  cluster_stats stats() const;

private:
  cluster() = default;
  struct direction {
    std::uint32_t from = 0, to = 0;
    rte_ring* tx = nullptr;  // sender's port enqueues here
    rte_ring* rx = nullptr;  // receiver's port dequeues here
    std::unique_ptr<link> stage;
    std::uint32_t lcore = 0;
    // Held by the lcore that polls the link now: its home lcore, or an idle one that helps.
    std::unique_ptr<std::atomic<bool>> polling = std::make_unique<std::atomic<bool>>(false);
  };
  struct lcore_work {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> lanes;  // (node, lane)
    std::vector<std::uint32_t> dirs;
    std::unique_ptr<doorbell> bell;
    // Written by the lcore's thread only.
    std::unique_ptr<rt::counter[]> ctr = std::make_unique<rt::counter[]>(6);
  };
  std::uint32_t round(std::uint32_t lcore) noexcept;
  std::uint32_t help(std::uint32_t lcore) noexcept;
  std::uint32_t poll_dir(direction& d, std::uint64_t now) noexcept;
  void lcore_loop(std::uint32_t lcore, const std::atomic<bool>& stop) noexcept;
  topology _topo;
  cluster_options _opts;
  std::vector<lcore_work> _lcores;
  std::vector<std::vector<std::uint32_t>> _lane_lcore;  // [node][lane]
  std::vector<std::unique_ptr<nic>> _nodes;
  std::vector<direction> _dirs;
  std::vector<std::uint16_t> _ports;  // ring ports we created
  rte_mempool* _dup_pool = nullptr;
  // Set by run() once the work of lcores that could not start has moved to lcore 0: before it,
  // no lcore helps (it would read lists run() still changes).
  std::atomic<bool> _partition_final{false};
};

/// Runs a cluster (cluster::run, on its lcores) from construction until destruction: the
/// destructor stops it and joins. Destroy it before the cluster, and after everything that
/// needs the cluster running (communicators uninstall through it).
class cluster_runner {
public:
  explicit cluster_runner(cluster& c) : _t([this, &c] { c.run(_stop); }) {}
  ~cluster_runner() {
    _stop.store(true);
    _t.join();
  }
  cluster_runner(const cluster_runner&) = delete;
  cluster_runner& operator=(const cluster_runner&) = delete;

private:
  std::atomic<bool> _stop{false};
  std::thread _t;
};

} // namespace spin::emu
