#include <spin/emu/cluster.hpp>
#include <spin/emu/eal.hpp>

#include "mbuf_sync.hpp"

#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <optional>
#include <thread>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

namespace spin::emu {

namespace {
std::atomic<unsigned> cluster_seq{0};
// Empty rounds in which an idle lcore still helps the others (of idle_backoff::spin_rounds).
constexpr std::uint32_t help_rounds = 64;

void free_ring(rte_ring* r) noexcept {
  if (r == nullptr) return;
  void* m = nullptr;
  while (rte_ring_dequeue(r, &m) == 0) detail::mbuf_free(static_cast<rte_mbuf*>(m));
  rte_ring_free(r);
}
}  // namespace

result<std::unique_ptr<cluster>> cluster::create(const topology& t, const cluster_options& o) {
  if (auto v = validate(t); !v) return v.err();
  std::uint32_t switches = 0;
  for (const auto& n : t.nodes)
    if (n.kind == node_kind::switch_) ++switches;
  for (const auto& n : t.nodes)
    if (n.kind == node_kind::host && n.rank > max_rank - switches)
      return fail(errc::invalid_argument, "host " + n.name + " has rank " + std::to_string(n.rank) + ", which the cluster gives to switch " +
                                              std::to_string(max_rank - n.rank) + " (host ranks must stay below " +
                                              std::to_string(max_rank + 1 - switches) + ")");
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  for (int cpu : o.lcore_cpus)
    if (cpu < 0 || cpu >= CPU_SETSIZE || (online > 0 && cpu >= online))
      return fail(errc::invalid_argument, "cluster: cannot pin an lcore to CPU " + std::to_string(cpu) + " (this machine has " +
                                              std::to_string(online) + " online CPUs)");
  std::unique_ptr<cluster> c(new cluster());
  c->_topo = t;
  c->_opts = o;

  // Lcores: node lanes round-robin (lanes of one node on consecutive lcores), each link
  // direction with the lane 0 of the node it delivers to, so that a link's output is received
  // where it is produced.
  std::uint32_t work_items = 0;
  for (const auto& n : t.nodes) work_items += n.kind == node_kind::host ? n.hpus : 1;
  std::uint32_t lcores = o.lcores;
  if (lcores == 0) lcores = static_cast<std::uint32_t>(process_cpus().size());
  lcores = std::clamp<std::uint32_t>(lcores, 1, std::max<std::uint32_t>(work_items, 1));
  c->_lcores.resize(lcores);
  for (auto& w : c->_lcores) w.bell = std::make_unique<doorbell>();
  c->_lane_lcore.resize(t.nodes.size());
  for (std::uint32_t i = 0, next = 0; i < t.nodes.size(); ++i) {
    const std::uint32_t lanes = t.nodes[i].kind == node_kind::host ? t.nodes[i].hpus : 1;
    for (std::uint32_t k = 0; k < lanes; ++k) {
      c->_lane_lcore[i].push_back(next);
      c->_lcores[next].lanes.emplace_back(i, k);
      next = next + 1 == lcores ? 0 : next + 1;
    }
  }
  const unsigned id = cluster_seq.fetch_add(1);
  const std::string tag = "c" + std::to_string(id) + "_";

  bool any_dup = false;
  for (const auto& l : t.links) any_dup |= l.model.duplicate > 0;
  if (any_dup) {
    c->_dup_pool = rte_pktmbuf_pool_create((tag + "dup").c_str(), o.dup_pool_mbufs, 0, 0,
                                           static_cast<std::uint16_t>(o.port.mbuf_data_bytes + RTE_PKTMBUF_HEADROOM), SOCKET_ID_ANY);
    if (c->_dup_pool == nullptr)
      return fail(errc::no_memory, "cluster: cannot create the pool for duplicated packets: " + std::string(rte_strerror(rte_errno)));
  }

  // Two directions per link; direction 2l is a->b, 2l+1 is b->a.
  for (std::uint32_t l = 0; l < t.links.size(); ++l) {
    const auto& ls = t.links[l];
    for (int d = 0; d < 2; ++d) {
      direction dir;
      dir.from = d == 0 ? ls.a : ls.b;
      dir.to = d == 0 ? ls.b : ls.a;
      const std::string base = tag + std::to_string(l) + (d == 0 ? "f" : "r");
      dir.tx = rte_ring_create((base + "t").c_str(), o.cable_ring_packets, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
      dir.rx = rte_ring_create((base + "r").c_str(), o.cable_ring_packets, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
      if (dir.tx == nullptr || dir.rx == nullptr) {
        free_ring(dir.tx);
        free_ring(dir.rx);
        return fail(errc::no_memory, "cluster: cannot create the rings of link " + std::to_string(l) + ": " + rte_strerror(rte_errno));
      }
      link_model m = ls.model;
      m.seed = ls.model.seed * 2 + static_cast<std::uint64_t>(d);  // each direction draws its own fates
      auto st = link::create(dir.tx, dir.rx, c->_dup_pool, m);
      if (!st) {
        free_ring(dir.tx);
        free_ring(dir.rx);
        return fail(st.err().code, "link " + t.nodes[dir.from].name + " -> " + t.nodes[dir.to].name + ": " + st.err().message);
      }
      dir.stage = std::move(st.value());
      dir.lcore = c->_lane_lcore[dir.to][0];
      c->_lcores[dir.lcore].dirs.push_back(static_cast<std::uint32_t>(c->_dirs.size()));
      c->_dirs.push_back(std::move(dir));
    }
  }

  const routing_table routes = emu::routes(t);
  std::uint32_t max_host_rank = 0;
  for (const auto& n : t.nodes)
    if (n.kind == node_kind::host) max_host_rank = std::max(max_host_rank, n.rank);
  // Switches have addresses too (switch_rank): a host's handler may send to one (Core-INC).
  std::vector<std::pair<std::uint32_t, std::vector<std::uint32_t>>> to_switch;  // rank, port per node
  for (std::uint32_t i = 0, k = 0; i < t.nodes.size(); ++i)
    if (t.nodes[i].kind == node_kind::switch_) to_switch.emplace_back(switch_rank(k++), ports_towards(t, i));
  std::uint32_t sw = 0;
  for (std::uint32_t i = 0; i < t.nodes.size(); ++i) {
    const emu::node& n = t.nodes[i];
    nic_config nc;
    nc.name = n.name;
    nc.rank = n.kind == node_kind::host ? n.rank : switch_rank(sw++);
    nc.port = o.port;
    nc.runtime = o.runtime;
    nc.runtime.hpus = n.kind == node_kind::host ? n.hpus : 1;
    nc.payload_bytes = o.payload_bytes;
    nc.burst = o.burst;
    for (std::uint32_t lc : c->_lane_lcore[i]) nc.lane_doorbells.push_back(c->_lcores[lc].bell.get());
    if (!o.capture_dir.empty()) nc.capture_path = o.capture_dir + "/" + n.name + ".pcap";
    // Port p of the node is the ring port of link n.ports[p], in the node's direction.
    for (std::uint32_t p = 0; p < n.ports.size(); ++p) {
      const std::uint32_t l = n.ports[p];
      const bool is_a = t.links[l].a == i && t.links[l].a_port == p;
      const direction& out = c->_dirs[2 * l + (is_a ? 0 : 1)];
      const direction& in = c->_dirs[2 * l + (is_a ? 1 : 0)];
      auto pid = port_from_rings(tag + n.name + "_" + std::to_string(p), in.rx, out.tx);
      if (!pid) return pid.err();
      c->_ports.push_back(*pid);
      nc.ports.push_back(*pid);
    }
    nc.routes.assign(to_switch.empty() ? max_host_rank + 1 : std::size_t{max_rank} + 1, -1);
    for (std::uint32_t r = 0; r <= max_host_rank; ++r)
      if (auto np = routes.next_port(i, r)) nc.routes[r] = static_cast<std::int32_t>(*np);
    for (const auto& [rank, ports] : to_switch)
      if (ports[i] != no_port) nc.routes[rank] = static_cast<std::int32_t>(ports[i]);
    auto made = nic::create(nc);
    if (!made) return fail(made.err().code, "node " + n.name + ": " + made.err().message);
    c->_nodes.push_back(std::move(made.value()));
  }
  return c;
}

cluster::~cluster() {
  // Mbufs travel between nodes, so each may belong to another node's pool: first every node
  // and link lets go of what it holds, then the cables are emptied, and only then do the NICs
  // free their pools.
  for (auto& n : _nodes) n->stop();
  for (auto& d : _dirs) d.stage.reset();
  for (auto& d : _dirs) {
    void* m = nullptr;
    while (rte_ring_dequeue(d.tx, &m) == 0) detail::mbuf_free(static_cast<rte_mbuf*>(m));
    while (rte_ring_dequeue(d.rx, &m) == 0) detail::mbuf_free(static_cast<rte_mbuf*>(m));
  }
  _nodes.clear();
  for (std::uint16_t p : _ports) (void)rte_eth_dev_close(p);
  for (auto& d : _dirs) {
    rte_ring_free(d.tx);
    rte_ring_free(d.rx);
  }
  if (_dup_pool != nullptr) rte_mempool_free(_dup_pool);
}

std::uint32_t cluster::poll() noexcept {
  std::uint32_t work = 0;
  for (auto& n : _nodes) work += n->poll();
  const std::uint64_t now = link::now_ns();
  for (auto& d : _dirs) work += d.stage->poll(now);
  return work;
}

std::uint32_t cluster::lcore_of_lane(std::uint32_t node, std::uint32_t lane) const noexcept {
  return node < _lane_lcore.size() && lane < _lane_lcore[node].size() ? _lane_lcore[node][lane] : 0;
}

std::uint32_t cluster::poll_dir(direction& d, std::uint64_t now) noexcept {
  std::atomic<bool>& f = *d.polling;
  if (f.load(std::memory_order_relaxed) || f.exchange(true, std::memory_order_acquire)) return 0;
  const std::uint32_t work = d.stage->poll(now);
  f.store(false, std::memory_order_release);
  return work;
}

std::uint32_t cluster::round(std::uint32_t lcore) noexcept {
  lcore_work& w = _lcores[lcore];
  std::uint32_t work = 0;
  for (const auto& [node, lane] : w.lanes) work += _nodes[node]->poll_lane(lane);
  if (!w.dirs.empty()) {
    const std::uint64_t now = link::now_ns();
    for (std::uint32_t d : w.dirs) work += poll_dir(_dirs[d], now);
  }
  return work;
}

// An lcore whose own round was empty polls the other lcores' lanes and links, each one it finds
// free (a lane's mutex, a link's flag): a static partition cannot suit every collective (a
// switch-aggregated allreduce loads the switch as much as all hosts together; an edge ring
// leaves it nearly idle), so the idle lcore takes whatever work is waiting.
std::uint32_t cluster::help(std::uint32_t lcore) noexcept {
  std::uint32_t work = 0;
  const std::uint64_t now = link::now_ns();
  for (std::uint32_t k = 1; k < _lcores.size(); ++k) {
    const lcore_work& w = _lcores[(lcore + k) % _lcores.size()];
    for (const auto& [node, lane] : w.lanes) work += _nodes[node]->poll_lane(lane);
    for (std::uint32_t d : w.dirs) work += poll_dir(_dirs[d], now);
  }
  return work;
}

// One lcore's loop: rounds to completion; after a round that moved something, the other lcores
// are rung (one load each unless one sleeps: what this lcore sent may be theirs to move). An
// idle lcore backs off, then sleeps on its doorbell until rung, until its next link delivery is
// due, or for at most idle_sleep_max (it notices `stop` then).
void cluster::lcore_loop(std::uint32_t lcore, const std::atomic<bool>& stop) noexcept {
  lcore_work& w = _lcores[lcore];
  idle_backoff b(_opts.idle_sleep_max, _opts.idle_pause_rounds);
  auto ring_others = [&] {
    for (std::uint32_t k = 0; k < _lcores.size(); ++k)
      if (k != lcore) _lcores[k].bell->ring();
  };
  rt::counter* ctr = w.ctr.get();  // busy, helped, empty, sleeps, busy_ns, unrung
  bool slept_unrung = false;  // the last sleep ran its full length, neither rung nor due to a link
  while (!stop.load(std::memory_order_relaxed)) {
    const std::uint64_t t0 = link::now_ns();
    if (round(lcore) != 0) {
      if (slept_unrung) ctr[5].add(1);
      slept_unrung = false;
      ctr[0].add(1);
      ctr[4].add(link::now_ns() - t0);
      b.busy();
      ring_others();
      continue;
    }
    // Help only in the first empty rounds, not once backing off further (then the others have
    // little to do).
    if (_opts.help && _lcores.size() > 1 && b.empty_rounds() < help_rounds && _partition_final.load(std::memory_order_acquire) &&
        help(lcore) != 0) {
      ctr[1].add(1);
      ctr[4].add(link::now_ns() - t0);
      ring_others();
      continue;
    }
    ctr[2].add(1);
    slept_unrung = false;
    if (!b.idle()) continue;
    w.bell->arm();
    if (round(lcore) != 0 || stop.load(std::memory_order_relaxed)) {
      w.bell->disarm();
      b.busy();
      ring_others();
      continue;
    }
    auto sleep = b.sleep_step();
    std::optional<std::uint64_t> due;
    for (std::uint32_t d : w.dirs) {
      // Under the link's flag: a helping lcore may be polling it (then it is not idle anyway).
      std::atomic<bool>& f = *_dirs[d].polling;
      if (f.exchange(true, std::memory_order_acquire)) {
        due = link::now_ns();
        continue;
      }
      const auto t = _dirs[d].stage->next_due_ns();
      f.store(false, std::memory_order_release);
      if (t && (!due || *t < *due)) due = t;
    }
    bool for_link = false;
    if (due) {
      const std::uint64_t now = link::now_ns();
      const auto until = std::chrono::microseconds(*due > now ? (*due - now) / 1000 : 0);
      for_link = until <= sleep;
      sleep = std::min(sleep, until);
    }
    if (sleep.count() > 0) {
      ctr[3].add(1);
      const bool rung = w.bell->sleep(sleep);
      // Only full-length sleeps: after a short one (10 us at first), work that arrived just
      // after the timeout, which its producer rightly did not ring for, is too likely.
      slept_unrung = !rung && !for_link && sleep >= _opts.idle_sleep_max;
    } else
      w.bell->disarm();
  }
}

void cluster::run(const std::atomic<bool>& stop) noexcept {
  std::vector<std::thread> threads;
  std::uint32_t started = 1;
  for (; started < _lcores.size(); ++started) {
    const std::uint32_t k = started;
    const int cpu = _opts.lcore_cpus.empty() ? -1 : _opts.lcore_cpus[k % _opts.lcore_cpus.size()];
    auto t = start_lcore([this, k, &stop] { lcore_loop(k, stop); }, cpu);
    if (!t) {
      std::fprintf(stderr, "cluster: %s; lcore 0 also runs the nodes and links of lcores %u..%zu\n", t.err().message.c_str(), k,
                   _lcores.size() - 1);
      break;
    }
    threads.push_back(std::move(t.value()));
  }
  // Work of lcores that did not start moves to lcore 0 (their doorbells are not lcore 0's: it
  // finds that work within idle_sleep_max).
  for (std::uint32_t k = started; k < _lcores.size(); ++k) {
    auto& w0 = _lcores[0];
    w0.lanes.insert(w0.lanes.end(), _lcores[k].lanes.begin(), _lcores[k].lanes.end());
    w0.dirs.insert(w0.dirs.end(), _lcores[k].dirs.begin(), _lcores[k].dirs.end());
    _lcores[k].lanes.clear();
    _lcores[k].dirs.clear();
  }
  if (!_opts.lcore_cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(_opts.lcore_cpus[0], &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
      std::fprintf(stderr, "cluster: cannot pin lcore 0 to CPU %d; it runs unpinned\n", _opts.lcore_cpus[0]);
  }
  _partition_final.store(true, std::memory_order_release);
  lcore_loop(0, stop);
  _partition_final.store(false, std::memory_order_relaxed);
  for (auto& t : threads) t.join();
}

std::vector<cluster_lcore_stats> cluster::lcore_stats() const {
  std::vector<cluster_lcore_stats> out;
  for (const auto& w : _lcores) {
    cluster_lcore_stats s;
    s.busy_rounds = w.ctr[0].get();
    s.helped_rounds = w.ctr[1].get();
    s.empty_rounds = w.ctr[2].get();
    s.sleeps = w.ctr[3].get();
    s.busy_ns = w.ctr[4].get();
    s.unrung_wakeups = w.ctr[5].get();
    out.push_back(s);
  }
  return out;
}

bool cluster::quiesce(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    poll();
    bool quiet = true;
    for (auto& d : _dirs)
      if (rte_ring_count(d.tx) != 0 || rte_ring_count(d.rx) != 0 || d.stage->next_due_ns()) quiet = false;
    for (auto& n : _nodes)
      if (!n->idle()) quiet = false;
    if (quiet) return true;
    std::this_thread::yield();
  }
  return false;
}

nic* cluster::host(std::uint32_t rank) noexcept {
  const auto i = _topo.host_of_rank(rank);
  return i ? _nodes[*i].get() : nullptr;
}

std::vector<nic_control*> cluster::controls() {
  std::vector<nic_control*> out;
  for (auto& n : _nodes) out.push_back(n.get());
  return out;
}

cluster_stats cluster::stats() const {
  cluster_stats s;
  for (const auto& n : _nodes) s.nodes.push_back(n->stats());
  for (const auto& d : _dirs) s.links.push_back({_topo.nodes[d.from].name, _topo.nodes[d.to].name, d.stage->stats()});
  return s;
}

std::string to_json(const cluster_stats& s) {
  nlohmann::ordered_json j;
  auto& nodes = j["nodes"] = nlohmann::ordered_json::array();
  for (const auto& n : s.nodes) nodes.push_back(nlohmann::ordered_json::parse(to_json(n)));
  auto& links = j["links"] = nlohmann::ordered_json::array();
  for (const auto& l : s.links)
    links.push_back({{"from", l.from}, {"to", l.to}, {"stats", nlohmann::ordered_json::parse(to_json(l.stats))}});
  return j.dump();
}

std::string to_text(const cluster_stats& s) {
  std::string out;
  for (const auto& n : s.nodes) out += to_text(n);
  if (s.links.empty()) return out;
  auto num = [](std::uint64_t v) { return std::to_string(v); };
  rt::text_table t({"link", "in packets", "in bytes", "delivered", "delivered bytes", "lost", "queue full",
                            "duplicated", "dup no mbuf", "reordered", "output stalls", "held"});
  for (const auto& l : s.links) {
    const auto& k = l.stats;
    t.row({l.from + "->" + l.to, num(k.packets_in), num(k.bytes_in), num(k.packets_delivered), num(k.bytes_delivered),
           num(k.dropped_loss), num(k.dropped_queue_full), num(k.duplicated), num(k.dup_no_mbuf), num(k.reordered),
           num(k.output_stalls), num(k.held)});
  }
  return out + t.str("");
}

}  // namespace spin::emu
