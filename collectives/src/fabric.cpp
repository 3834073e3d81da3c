// spin::coll::fabric: the switches of a cluster as pools of aggregator slots shared by groups
// (docs/collectives.md, "Switch aggregation" and "Several jobs").
#include <spin/coll/coll.hpp>
#include <spin/coll/engine.hpp>
#include <spin/coll/protocol.hpp>

#include "job_secret.hpp"
#include "nic_handle.hpp"
#include "switch_engine.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace spin::coll {
namespace {
namespace pr = proto;
using clock = std::chrono::steady_clock;
} // namespace

struct fabric::impl {
  struct sw {
    std::unique_ptr<detail::nic_handle> nic;
    std::uint32_t vertex = 0;  // in g
    std::uint32_t rank = 0;
    std::string name;
  };
  // One engine EC of a group on one switch, installed by this fabric (the group's first member
  // was one of its communicators).
  struct placement {
    std::uint32_t sw = 0;  // index into switches
    detail::switch_engine eng;
  };
  // A group that communicators of this fabric joined.
  struct job {
    std::uint32_t root = 0;                // switch index where its members join
    std::set<std::uint32_t> mine;          // member indices of this fabric's communicators
    std::uint32_t installer_me = ~0u;      // this fabric set the group up as this member
    std::vector<std::uint32_t> leaf_sw;    // switches below the root where it joined too (installer)
    std::vector<placement> placed;         // the root first, then the leaves (installer)
  };
  // The network as the fabric knows it: hosts and switches, by rank, and their links.
  struct vertex {
    std::uint32_t rank = 0;
    std::int32_t sw = -1;  // index into switches, or -1 for a host
    std::vector<std::uint32_t> adj;
  };

  fabric_options o;
  bool in_band = false;  // one switch, reached through a member's NIC; members linked to it
  mutable std::mutex m;  // guards the ports (one call at a time) and jobs
  std::vector<sw> switches;
  std::vector<vertex> g;
  std::map<std::uint32_t, std::uint32_t> host_vertex;  // host rank -> vertex
  std::map<std::uint32_t, job> jobs;

  explicit impl(const fabric_options& opts) : o(opts) {}

  void link(std::uint32_t a, std::uint32_t b) {
    if (std::find(g[a].adj.begin(), g[a].adj.end(), b) == g[a].adj.end()) g[a].adj.push_back(b);
    if (std::find(g[b].adj.begin(), g[b].adj.end(), a) == g[b].adj.end()) g[b].adj.push_back(a);
  }

  // Hop counts from vertex `from` to every vertex (~0u: unreachable).
  std::vector<std::uint32_t> hops_from(std::uint32_t from) const {
    std::vector<std::uint32_t> d(g.size(), ~0u);
    std::vector<std::uint32_t> q{from};
    d[from] = 0;
    for (std::size_t i = 0; i < q.size(); ++i)
      for (std::uint32_t n : g[q[i]].adj)
        if (d[n] == ~0u) {
          d[n] = d[q[i]] + 1;
          q.push_back(n);
        }
    return d;
  }

  // The aggregation switch of a group: the one closest to all members (the smallest largest
  // hop count, then the smallest total, then the first), which is a switch linked to every
  // member when there is one, and the spine of a leaf-spine network. -1 when no switch reaches
  // every member.
  std::int32_t switch_for(const std::vector<std::uint32_t>& members) const {
    if (in_band) return 0;
    std::int32_t best = -1;
    std::uint64_t best_max = ~0ull, best_sum = ~0ull;
    for (std::size_t i = 0; i < switches.size(); ++i) {
      const std::vector<std::uint32_t> d = hops_from(switches[i].vertex);
      std::uint64_t mx = 0, sum = 0;
      bool all = true;
      for (std::uint32_t r : members) {
        auto it = host_vertex.find(r);
        if (it == host_vertex.end() || d[it->second] == ~0u) {
          all = false;
          break;
        }
        mx = std::max<std::uint64_t>(mx, d[it->second]);
        sum += d[it->second];
      }
      if (all && (mx < best_max || (mx == best_max && sum < best_sum))) {
        best = static_cast<std::int32_t>(i);
        best_max = mx;
        best_sum = sum;
      }
    }
    return best;
  }

  bool linked(std::uint32_t va, std::uint32_t vb) const {
    return std::find(g[va].adj.begin(), g[va].adj.end(), vb) != g[va].adj.end();
  }

  // A two-level tree below `root`: each member's leaf (the one switch it is linked to, linked
  // to the root), or empty when the members are linked to the root directly or the network
  // is not such a tree.
  std::vector<std::int32_t> leaves_for(const std::vector<std::uint32_t>& members, std::int32_t root) const {
    if (in_band) return {};
    std::vector<std::int32_t> leaf(members.size(), -1);
    bool any_indirect = false;
    for (std::size_t i = 0; i < members.size(); ++i) {
      auto host = host_vertex.find(members[i]);
      if (host == host_vertex.end()) return {};
      std::int32_t found = -1;
      for (std::uint32_t other : g[host->second].adj) {
        if (g[other].sw < 0) continue;
        if (found >= 0) return {};  // linked to two switches: not a tree
        found = g[other].sw;
      }
      if (found < 0) return {};
      if (found == root) return {};  // a member right at the root: aggregate there flat
      if (!linked(switches[static_cast<std::size_t>(found)].vertex, switches[static_cast<std::size_t>(root)].vertex)) return {};
      leaf[i] = found;
      any_indirect = true;
    }
    if (!any_indirect) return {};
    return leaf;
  }

  result<void> install(placement& pl, std::uint32_t wire_id, std::uint32_t slots, const pr::switch_setup& setup,
                       const std::vector<std::uint32_t>& members, const std::vector<std::uint32_t>& leaves,
                       const engine_package& pkg, const detail::job_key& frame_key) {
    return detail::install_switch_engine(*switches[pl.sw].nic, pl.eng, wire_id, slots, o.slot_bytes, setup, members, leaves, pkg,
                                         frame_key);
  }

  void undo(placement& pl) { detail::remove_switch_engine(*switches[pl.sw].nic, pl.eng); }
  // Undoes what this fabric set up for group `wire_id` as its installer: the engine ECs, and
  // its joins on the leaves.
  void undo_setup(std::uint32_t wire_id, job& j) {
    for (auto& pl : j.placed) undo(pl);
    j.placed.clear();
    for (std::uint32_t lf : j.leaf_sw) (void)switches[lf].nic->leave_group(wire_id, j.installer_me);
    j.leaf_sw.clear();
  }

  // The installer's part (its slots on the root are reserved): slots on the leaves of a
  // two-level tree below the root (now or never: a leaf that has none free refuses the group,
  // so that no group holds one switch while it waits for another), then the engine ECs. On
  // error the caller undoes what was done (undo_setup).
  result<lease> set_up(std::uint32_t wire_id, job& j, const std::vector<std::uint32_t>& members, std::uint32_t slots,
                       const engine_package& pkg, const detail::job_key& frame_key) {
    const auto root = static_cast<std::int32_t>(j.root);
    const std::vector<std::int32_t> leaf_of = leaves_for(members, root);
    std::vector<std::uint32_t> used = {j.root};
    for (std::int32_t lf : leaf_of)
      if (std::find(used.begin(), used.end(), static_cast<std::uint32_t>(lf)) == used.end()) used.push_back(static_cast<std::uint32_t>(lf));
    for (std::size_t k = 1; k < used.size(); ++k) {
      sw& leaf = switches[used[k]];
      auto a = leaf.nic->join_group(host::group_join{wire_id, members, slots}, j.installer_me);
      if (!a.ok()) return fail(a.err().code, "joining the leaf " + leaf.name + ": " + a.err().message);
      j.leaf_sw.push_back(used[k]);
      if (a.value().state != host::join_state::install)
        return fail(errc::no_space, a.value().state == host::join_state::refused ? a.value().reason
                                                                                 : a.value().reason + " (a leaf below " + switches[j.root].name + ")");
    }
    std::vector<std::uint32_t> leaf_ranks;
    for (std::size_t k = 1; k < used.size(); ++k) leaf_ranks.push_back(switches[used[k]].rank);
    pr::switch_setup rs{};
    rs.nranks = static_cast<std::uint32_t>(members.size());
    rs.slots = slots;
    rs.slot_bytes = o.slot_bytes;
    rs.role = pr::switch_root;
    rs.nleaves = static_cast<std::uint32_t>(leaf_ranks.size());
    j.placed.push_back({j.root, {}});
    if (auto r = install(j.placed.back(), wire_id, slots, rs, members, leaf_ranks, pkg, frame_key); !r.ok()) return r.err();
    for (std::size_t k = 1; k < used.size(); ++k) {
      std::vector<std::uint32_t> local;
      for (std::size_t i = 0; i < members.size(); ++i)
        if (leaf_of[i] == static_cast<std::int32_t>(used[k])) local.push_back(members[i]);
      pr::switch_setup ls{};
      ls.nranks = static_cast<std::uint32_t>(local.size());
      ls.slots = slots;
      ls.slot_bytes = o.slot_bytes;
      ls.role = pr::switch_leaf;
      ls.parent = switches[j.root].rank;
      j.placed.push_back({used[k], {}});
      if (auto r = install(j.placed.back(), wire_id, slots, ls, local, {}, pkg, frame_key); !r.ok()) return r.err();
    }
    lease l;
    l.switch_rank = switches[j.root].rank;
    l.slots = slots;
    for (std::int32_t lf : leaf_of) l.leaf_rank.push_back(switches[static_cast<std::size_t>(lf)].rank);
    return l;
  }
};
fabric::fabric(std::unique_ptr<impl> p) : _p(std::move(p)) {}

fabric::~fabric() {
  std::lock_guard<std::mutex> l(_p->m);
  // The groups' joins leave with the ports (their owners) right after this.
  for (auto& [id, j] : _p->jobs) _p->undo_setup(id, j);
}

namespace {
error check_options(const fabric_options& o) {
  if (o.slots_per_switch < 1 || o.slots_per_switch > pr::max_switch_slots)
    return fail(errc::invalid_argument, "fabric: slots_per_switch out of 1..32767");
  if (o.slot_bytes < 8 || o.slot_bytes > pr::max_packet_bytes || o.slot_bytes % 8 != 0)
    return fail(errc::invalid_argument, "fabric: slot_bytes must be a multiple of 8 in 8..4096");
  return error{};
}
} // namespace

result<std::unique_ptr<fabric>> fabric::over(std::vector<std::unique_ptr<detail::nic_handle>> switches,
                                             const std::vector<std::pair<std::uint32_t, std::uint32_t>>& links,
                                             const fabric_options& o) {
  if (auto e = check_options(o); e.code != errc::ok) return e;
  if (switches.empty()) return fail(errc::not_found, "fabric: no switch");
  auto p = std::make_unique<impl>(o);
  std::map<std::uint32_t, std::uint32_t> switch_vertex;  // rank -> vertex
  for (auto& nic : switches) {
    impl::sw s;
    s.rank = nic->rank();
    s.name = nic->name();
    s.nic = std::move(nic);
    s.vertex = static_cast<std::uint32_t>(p->g.size());
    if (!switch_vertex.emplace(s.rank, s.vertex).second)
      return fail(errc::invalid_argument, "fabric: two switches have rank " + std::to_string(s.rank) + " (" + s.name + ")");
    impl::vertex v;
    v.rank = s.rank;
    v.sw = static_cast<std::int32_t>(p->switches.size());
    p->g.push_back(std::move(v));
    p->switches.push_back(std::move(s));
  }
  // Every linked rank that is not a switch of this fabric is a host.
  auto vertex_of = [&](std::uint32_t rank) {
    if (auto it = switch_vertex.find(rank); it != switch_vertex.end()) return it->second;
    if (auto h = p->host_vertex.find(rank); h != p->host_vertex.end()) return h->second;
    const auto v = static_cast<std::uint32_t>(p->g.size());
    impl::vertex hv;
    hv.rank = rank;
    p->g.push_back(std::move(hv));
    p->host_vertex[rank] = v;
    return v;
  };
  for (const auto& [a, b] : links) {
    const std::uint32_t va = vertex_of(a), vb = vertex_of(b);
    if (va == vb) return fail(errc::invalid_argument, "fabric: a link from rank " + std::to_string(a) + " to itself");
    p->link(va, vb);
  }
  // Each switch's pool takes the fabric's size, unless groups use it already with another size
  // (the registry refuses then: the pool belongs to the switch, not to one fabric).
  for (auto& s : p->switches)
    if (auto u = s.nic->group_pool(host::slot_pool{o.slots_per_switch, o.slot_bytes}); !u.ok())
      return fail(u.err().code, "fabric: " + u.err().message);
  return std::unique_ptr<fabric>(new fabric(std::move(p)));
}

result<std::unique_ptr<fabric>> fabric::connect(const std::vector<remote_switch>& list, const fabric_options& o) {
  if (auto e = check_options(o); e.code != errc::ok) return e;
  if (list.empty()) return fail(errc::invalid_argument, "fabric: no switch");
  std::vector<std::unique_ptr<detail::nic_handle>> switches;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> links;
  for (const auto& r : list) {
    if (r.links.empty()) return fail(errc::invalid_argument, "fabric: the switch at " + r.socket + " has no links");
    auto nic = detail::remote_nic(r.socket, r.node);
    if (!nic.ok()) return fail(nic.err().code, "fabric: " + nic.err().message);
    for (std::uint32_t to : r.links) links.emplace_back(nic.value()->rank(), to);
    switches.push_back(std::move(nic.value()));
  }
  auto f = over(std::move(switches), links, o);
  if (!f.ok() && f.err().code == errc::not_found) return fail(errc::invalid_argument, f.err().message);
  return f;
}

result<std::unique_ptr<fabric>> fabric::in_band(const inband_switch& s, const fabric_options& o) {
  if (auto e = check_options(o); e.code != errc::ok) return e;
  auto nic = detail::remote_nic(s.nic_socket, s.nic_node);
  if (!nic.ok()) return fail(nic.err().code, "fabric: " + nic.err().message);
  if (nic.value()->rank() == s.switch_rank)
    return fail(errc::invalid_argument, "fabric: " + nic.value()->name() + " is rank " + std::to_string(s.switch_rank) +
                                            ", the switch itself; in-band joins go through a member's own NIC");
  auto p = std::make_unique<impl>(o);
  p->in_band = true;
  impl::sw sw;
  sw.rank = s.switch_rank;
  sw.nic = detail::via_nic(std::move(nic.value()), s.switch_rank);
  sw.name = sw.nic->name();
  impl::vertex v;
  v.rank = s.switch_rank;
  v.sw = 0;
  p->g.push_back(std::move(v));
  p->switches.push_back(std::move(sw));
  return std::unique_ptr<fabric>(new fabric(std::move(p)));
}

std::vector<fabric::switch_usage> fabric::usage() const {
  std::lock_guard<std::mutex> l(_p->m);
  std::vector<switch_usage> out;
  for (const auto& s : _p->switches) {
    switch_usage u{s.name, s.rank, 0, 0, 0, 0};
    if (auto p = s.nic->group_pool(std::nullopt); p.ok()) {
      u.slots = p.value().pool.slots;
      u.free = p.value().free;
      u.groups = p.value().groups;
      u.waiting = p.value().waiting;
    }
    out.push_back(u);
  }
  return out;
}

namespace {
// Lease words as the installer publishes them: the root's rank, then (two-level tree) each
// member's leaf rank.
std::vector<std::uint32_t> lease_words(const fabric::lease& l) {
  std::vector<std::uint32_t> w{l.switch_rank};
  w.insert(w.end(), l.leaf_rank.begin(), l.leaf_rank.end());
  return w;
}
} // namespace

result<fabric::lease> fabric::join(std::uint32_t wire_id, const std::vector<std::uint32_t>& members, std::uint32_t me,
                                   std::uint32_t slots, std::uint32_t packet_bytes, std::chrono::milliseconds wait,
                                   const engine_package& pkg, const std::array<std::uint8_t, 16>& job_secret,
                                   bool authenticate_frames) {
  std::unique_lock<std::mutex> l(_p->m, std::defer_lock);
  detail::lock_on_clock(l, *_p->switches.front().nic);
  lease out;
  const std::int32_t root = _p->switch_for(members);
  if (root < 0) {
    out.reason = "no switch reaches every member";
    return out;
  }
  impl::sw& rs = _p->switches[static_cast<std::size_t>(root)];
  if (!_p->in_band && packet_bytes > _p->o.slot_bytes) {
    out.reason = "packets of " + std::to_string(packet_bytes) + " bytes do not fit the slots of " +
                 std::to_string(_p->o.slot_bytes) + " bytes on " + rs.name;
    return out;
  }
  host::group_join req{wire_id, members, slots, detail::join_proof(job_secret, wire_id, slots, members)};
  req.packet_bytes = packet_bytes;  // an in-band switch checks it against its own slots
  if (authenticate_frames) req.frame_key = detail::group_frame_key(job_secret, wire_id);
  // The installer gives up waiting for slots after `wait`; the other members wait for its
  // decision (it sets the group up, or gives up, within wait plus a set-up).
  const auto start = rs.nic->now();
  const auto give_up = start + wait;
  const auto others_deadline = give_up + std::chrono::seconds(60);
  auto nap = std::chrono::microseconds(200);
  for (;;) {
    auto a = rs.nic->join_group(req, me);
    if (!a.ok()) return fail(a.err().code, "joining group " + std::to_string(wire_id >> 4) + " on " + rs.name + ": " + a.err().message);
    impl::job& j = _p->jobs[wire_id];
    j.root = static_cast<std::uint32_t>(root);
    j.mine.insert(me);
    // On an error after the join the caller has no communicator that would leave: leave here.
    auto abandon = [&](error e) {
      (void)rs.nic->leave_group(wire_id, me);
      j.mine.erase(me);
      if (j.mine.empty()) {
        _p->undo_setup(wire_id, j);
        _p->jobs.erase(wire_id);
      }
      return e;
    };
    const host::group_answer& ans = a.value();
    if (ans.state == host::join_state::granted) {
      if (ans.lease.empty() || (ans.lease.size() != 1 && ans.lease.size() != 1 + members.size()))
        return abandon(fail(errc::bad_state, "group " + std::to_string(wire_id >> 4) + " on " + rs.name + ": a lease of " +
                                                 std::to_string(ans.lease.size()) + " words"));
      out.switch_rank = ans.lease[0];
      out.slots = slots;
      out.leaf_rank.assign(ans.lease.begin() + 1, ans.lease.end());
      return out;
    }
    if (ans.state == host::join_state::refused) {
      out.reason = ans.reason;
      return out;
    }
    if (ans.state == host::join_state::install) {
      j.installer_me = me;
      auto r = _p->set_up(wire_id, j, members, slots, pkg, req.frame_key);
      host::group_decision d;
      d.group = wire_id;
      if (r.ok()) {
        d.granted = true;
        d.lease = lease_words(r.value());
      } else {
        _p->undo_setup(wire_id, j);
        d.reason = r.err().message;
      }
      if (auto dr = rs.nic->decide_group(d); !dr.ok())
        return abandon(fail(dr.err().code, "group " + std::to_string(wire_id >> 4) + " on " + rs.name + ": " + dr.err().message));
      if (r.ok()) return r.value();
      out.reason = d.reason;
      return out;
    }
    // wait
    const auto now = rs.nic->now();
    if (ans.installer && now >= give_up) {
      host::group_decision d;
      d.group = wire_id;
      d.reason = ans.reason;
      if (auto dr = rs.nic->decide_group(d); !dr.ok())
        return abandon(fail(dr.err().code, "group " + std::to_string(wire_id >> 4) + " on " + rs.name + ": " + dr.err().message));
      out.reason = ans.reason;
      return out;
    }
    if (!ans.installer && now >= others_deadline)
      return abandon(fail(errc::timeout, "group " + std::to_string(wire_id >> 4) + " on " + rs.name +
                                             ": its first member did not set it up within 60 s (" + ans.reason + ")"));
    l.unlock();
    rs.nic->sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(10));
    detail::lock_on_clock(l, *rs.nic);
  }
}

void fabric::leave(std::uint32_t wire_id, std::uint32_t me) {
  std::unique_lock<std::mutex> l(_p->m, std::defer_lock);
  detail::lock_on_clock(l, *_p->switches.front().nic);
  auto it = _p->jobs.find(wire_id);
  if (it == _p->jobs.end()) return;
  impl::job& j = it->second;
  j.mine.erase(me);
  if (!j.mine.empty()) {
    (void)_p->switches[j.root].nic->leave_group(wire_id, me);
    return;
  }
  // The last member here: the ECs this fabric installed go first, then the joins.
  _p->undo_setup(wire_id, j);
  (void)_p->switches[j.root].nic->leave_group(wire_id, me);
  _p->jobs.erase(it);
}

} // namespace spin::coll
