// spin::coll::fabric: the switches of a cluster as pools of aggregator slots shared by groups
// (docs/collectives.md, "Switch aggregation" and "Several jobs").
#include <spin/coll/coll.hpp>
#include <spin/coll/engine.hpp>
#include <spin/coll/protocol.hpp>

#include "engine_ec.hpp"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

namespace spin::coll {
namespace {
namespace pr = proto;
using clock = std::chrono::steady_clock;
} // namespace

struct fabric::impl {
  struct sw {
    std::uint32_t node = 0;  // topology index
    std::uint32_t rank = 0;
    std::uint32_t free = 0;
    std::uint32_t groups = 0;
  };
  // One engine EC of a group on one switch.
  struct placement {
    std::uint32_t sw = 0;  // index into switches
    rt::ec_id ec = 0;
    rt::region_id region = 0;
    bool ec_ok = false, region_ok = false;
    std::vector<std::byte> mem;  // the EC's host window: the set-up descriptor
  };
  struct job {
    std::vector<std::uint32_t> members;
    std::uint32_t asked = 0;
    lease l;
    std::uint32_t refs = 0;
    std::vector<placement> placed;  // the root first, then the leaves
  };

  emu::cluster& c;
  fabric_options o;
  mutable std::mutex m;
  std::condition_variable cv;
  std::vector<sw> switches;
  std::map<std::uint32_t, job> jobs;
  emu::routing_table table;

  impl(emu::cluster& cl, const fabric_options& opts) : c(cl), o(opts), table(emu::routes(cl.topo())) {}

  // The aggregation switch of a group: the one closest to all members (the smallest largest
  // hop count, then the smallest total, then the first), which is a switch linked to every
  // member when there is one, and the spine of a leaf-spine network. -1 when no switch reaches
  // every member.
  std::int32_t switch_for(const std::vector<std::uint32_t>& members) const {
    std::int32_t best = -1;
    std::uint64_t best_max = ~0ull, best_sum = ~0ull;
    for (std::size_t i = 0; i < switches.size(); ++i) {
      std::uint64_t mx = 0, sum = 0;
      bool all = true;
      for (std::uint32_t r : members) {
        const auto d = table.distance(switches[i].node, r);
        if (!d) {
          all = false;
          break;
        }
        mx = std::max<std::uint64_t>(mx, *d);
        sum += *d;
      }
      if (all && (mx < best_max || (mx == best_max && sum < best_sum))) {
        best = static_cast<std::int32_t>(i);
        best_max = mx;
        best_sum = sum;
      }
    }
    return best;
  }

  std::int32_t index_of_node(std::uint32_t node) const {
    for (std::size_t i = 0; i < switches.size(); ++i)
      if (switches[i].node == node) return static_cast<std::int32_t>(i);
    return -1;
  }
  bool linked(std::uint32_t a, std::uint32_t b) const {
    const emu::topology& t = c.topo();
    for (std::uint32_t l : t.nodes[a].ports)
      if ((t.links[l].a == a && t.links[l].b == b) || (t.links[l].b == a && t.links[l].a == b)) return true;
    return false;
  }

  // A two-level tree below `root`: each member's leaf (the one switch it is linked to, linked
  // to the root), or empty when the members are linked to the root directly or the network
  // is not such a tree.
  std::vector<std::int32_t> leaves_for(const std::vector<std::uint32_t>& members, std::int32_t root) const {
    const emu::topology& t = c.topo();
    std::vector<std::int32_t> leaf(members.size(), -1);
    bool any_indirect = false;
    for (std::size_t i = 0; i < members.size(); ++i) {
      const auto host = t.host_of_rank(members[i]);
      if (!host) return {};
      std::int32_t found = -1;
      for (std::uint32_t l : t.nodes[*host].ports) {
        const std::uint32_t other = t.links[l].a == *host ? t.links[l].b : t.links[l].a;
        if (t.nodes[other].kind != emu::node_kind::switch_) continue;
        if (found >= 0) return {};  // linked to two switches: not a tree
        found = index_of_node(other);
      }
      if (found < 0) return {};
      if (found == root) return {};  // a member right at the root: aggregate there flat
      if (!linked(switches[static_cast<std::size_t>(found)].node, switches[static_cast<std::size_t>(root)].node)) return {};
      leaf[i] = found;
      any_indirect = true;
    }
    if (!any_indirect) return {};
    return leaf;
  }

  result<void> install(placement& pl, std::uint32_t wire_id, std::uint32_t slots, const pr::switch_setup& setup,
                       const std::vector<std::uint32_t>& members, const std::vector<std::uint32_t>& leaves,
                       const rt::loaded_package& pkg) {
    emu::nic& nic = c.node(switches[pl.sw].node);
    const std::uint32_t inputs = std::max<std::uint32_t>(setup.nranks, setup.nleaves);
    const std::uint64_t stride = engine_detail::slot_stride_bytes(inputs, o.slot_bytes);
    pl.mem.assign(4096 + sizeof(pr::switch_setup) + 2 * pr::max_ranks * 4, std::byte{0});
    auto reg = nic.register_host_memory(pl.mem);
    if (!reg.ok()) return reg.err();
    pl.region = reg.value();
    pl.region_ok = true;
    rt::ec_config cfg;
    cfg.name = "coll." + std::to_string(wire_id >> 4) + (setup.role == pr::switch_leaf ? ".leaf" : ".switch");
    detail::configure_engine_ec(cfg, wire_id, 64);
    if (auto r = pkg.bind(cfg); !r.ok()) return r.err();
    cfg.handler_mem_bytes = engine_detail::slots_offset() + std::uint64_t{slots} * 2 * stride;
    cfg.window = rt::host_window{pl.region, 0, pl.mem.size()};
    auto ec = nic.install(cfg);
    if (!ec.ok()) return fail(ec.err().code, "installing the aggregation engine on " + nic.name() + ": " + ec.err().message);
    pl.ec = ec.value();
    pl.ec_ok = true;
    std::memcpy(pl.mem.data() + 64, &setup, sizeof(setup));
    std::memcpy(pl.mem.data() + 64 + sizeof(setup), members.data(), members.size() * sizeof(std::uint32_t));
    if (!leaves.empty())
      std::memcpy(pl.mem.data() + 64 + sizeof(setup) + members.size() * sizeof(std::uint32_t), leaves.data(),
                  leaves.size() * sizeof(std::uint32_t));
    pr::cmd cmd{};
    cmd.type = pr::cmd_switch_setup;
    cmd.desc_off = 64;
    std::memcpy(pl.mem.data(), &cmd, sizeof(cmd));
    emu::message_send msg;
    msg.dest_rank = nic.rank();
    msg.match_bits = pr::match_bits(wire_id, pr::k_cmd);
    msg.message_id = 1;
    msg.region = pl.region;
    msg.offset_bytes = 0;
    msg.len_bytes = sizeof(cmd);
    if (auto r = nic.send(msg, std::chrono::milliseconds(1000)); !r.ok()) return r;
    const auto deadline = clock::now() + std::chrono::seconds(10);
    std::array<rt::host_event, 4> evs;
    while (clock::now() < deadline) {
      const std::size_t got = nic.poll_events(pl.ec, evs);
      for (std::size_t i = 0; i < got; ++i) {
        if (evs[i].type == rt::host_event::kind::error)
          return fail(errc::fault, "the aggregation engine on " + nic.name() + " failed at set-up");
        if (pr::event_type_of(evs[i].value) == pr::ev_setup)
          return pr::event_detail_of(evs[i].value) == 0
                     ? result<void>()
                     : result<void>(fail(errc::invalid_argument, "the aggregation engine on " + nic.name() + " refused its set-up"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return fail(errc::timeout, "the aggregation engine on " + nic.name() + " did not confirm its set-up");
  }

  void undo(placement& pl) {
    emu::nic& nic = c.node(switches[pl.sw].node);
    if (pl.ec_ok) (void)nic.uninstall(pl.ec);
    if (pl.region_ok) (void)nic.unregister_host_memory(pl.region);
    pl.ec_ok = pl.region_ok = false;
  }
  void release(job& j) {
    for (auto& pl : j.placed) {
      undo(pl);
      switches[pl.sw].free += j.l.slots;
      --switches[pl.sw].groups;
    }
    j.placed.clear();
    cv.notify_all();
  }
};

fabric::fabric(std::unique_ptr<impl> p) : _p(std::move(p)) {}

fabric::~fabric() {
  std::lock_guard<std::mutex> l(_p->m);
  for (auto& [id, j] : _p->jobs) _p->release(j);
}

result<std::unique_ptr<fabric>> fabric::create(emu::cluster& c, const fabric_options& o) {
  if (o.slots_per_switch < 1 || o.slots_per_switch > pr::max_switch_slots)
    return fail(errc::invalid_argument, "fabric: slots_per_switch out of 1..32767");
  if (o.slot_bytes < 8 || o.slot_bytes > pr::max_packet_bytes || o.slot_bytes % 8 != 0)
    return fail(errc::invalid_argument, "fabric: slot_bytes must be a multiple of 8 in 8..4096");
  auto p = std::make_unique<impl>(c, o);
  const emu::topology& t = c.topo();
  for (std::uint32_t i = 0; i < t.nodes.size(); ++i) {
    if (t.nodes[i].kind != emu::node_kind::switch_) continue;
    impl::sw s;
    s.node = i;
    s.rank = c.node(i).rank();
    s.free = o.slots_per_switch;
    p->switches.push_back(std::move(s));
  }
  if (p->switches.empty()) return fail(errc::not_found, "fabric: the cluster has no switch");
  return std::unique_ptr<fabric>(new fabric(std::move(p)));
}

std::vector<fabric::switch_usage> fabric::usage() const {
  std::lock_guard<std::mutex> l(_p->m);
  std::vector<switch_usage> out;
  for (const auto& s : _p->switches)
    out.push_back({_p->c.node(s.node).name(), s.rank, _p->o.slots_per_switch, s.free, s.groups});
  return out;
}

result<fabric::lease> fabric::join(std::uint32_t wire_id, const std::vector<std::uint32_t>& members, std::uint32_t slots,
                                   std::uint32_t packet_bytes, std::chrono::milliseconds wait, const rt::loaded_package& pkg) {
  std::unique_lock<std::mutex> l(_p->m);
  auto it = _p->jobs.find(wire_id);
  if (it != _p->jobs.end()) {
    impl::job& j = it->second;
    if (j.members != members || j.asked != slots)
      return fail(errc::invalid_argument, "switch slots: this member's group (members or switch_slots) differs from the first member's");
    ++j.refs;
    return j.l;
  }
  impl::job& j = _p->jobs[wire_id];
  j.members = members;
  j.asked = slots;
  j.refs = 1;
  const std::int32_t root = _p->switch_for(members);
  if (root < 0) {
    j.l.reason = "no switch reaches every member";
    return j.l;
  }
  // Where the group's slots go: the root, and the leaves of a two-level tree below it.
  const std::vector<std::int32_t> leaf_of = _p->leaves_for(members, root);
  std::vector<std::uint32_t> used = {static_cast<std::uint32_t>(root)};
  for (std::int32_t lf : leaf_of)
    if (std::find(used.begin(), used.end(), static_cast<std::uint32_t>(lf)) == used.end()) used.push_back(static_cast<std::uint32_t>(lf));
  const std::string sname = _p->c.node(_p->switches[static_cast<std::size_t>(root)].node).name();
  if (packet_bytes > _p->o.slot_bytes) {
    j.l.reason = "packets of " + std::to_string(packet_bytes) + " bytes do not fit the slots of " +
                 std::to_string(_p->o.slot_bytes) + " bytes on " + sname;
    return j.l;
  }
  if (slots > _p->o.slots_per_switch) {
    j.l.reason = "the group asks for " + std::to_string(slots) + " slots; " + sname + " has " +
                 std::to_string(_p->o.slots_per_switch);
    return j.l;
  }
  auto enough = [&] {
    for (std::uint32_t i : used)
      if (_p->switches[i].free < slots) return false;
    return true;
  };
  if (!_p->cv.wait_for(l, wait, enough)) {
    for (std::uint32_t i : used) {
      const auto& s = _p->switches[i];
      if (s.free >= slots) continue;
      j.l.reason = _p->c.node(s.node).name() + " has " + std::to_string(s.free) + " free slots of " +
                   std::to_string(_p->o.slots_per_switch) + " (" + std::to_string(s.groups) +
                   " groups hold the rest); the group asks for " + std::to_string(slots);
      break;
    }
    return j.l;
  }
  // The root: every member, and the leaves when there is a tree.
  std::vector<std::uint32_t> leaf_ranks;
  for (std::size_t k = 1; k < used.size(); ++k) leaf_ranks.push_back(_p->switches[used[k]].rank);
  pr::switch_setup rs{};
  rs.nranks = static_cast<std::uint32_t>(members.size());
  rs.slots = slots;
  rs.slot_bytes = _p->o.slot_bytes;
  rs.role = pr::switch_root;
  rs.nleaves = static_cast<std::uint32_t>(leaf_ranks.size());
  j.placed.push_back({static_cast<std::uint32_t>(root), 0, 0, false, false, {}});
  result<void> r = _p->install(j.placed.back(), wire_id, slots, rs, members, leaf_ranks, pkg);
  for (std::size_t k = 1; k < used.size() && r.ok(); ++k) {
    std::vector<std::uint32_t> local;
    for (std::size_t i = 0; i < members.size(); ++i)
      if (leaf_of[i] == static_cast<std::int32_t>(used[k])) local.push_back(members[i]);
    pr::switch_setup ls{};
    ls.nranks = static_cast<std::uint32_t>(local.size());
    ls.slots = slots;
    ls.slot_bytes = _p->o.slot_bytes;
    ls.role = pr::switch_leaf;
    ls.parent = _p->switches[static_cast<std::size_t>(root)].rank;
    j.placed.push_back({used[k], 0, 0, false, false, {}});
    r = _p->install(j.placed.back(), wire_id, slots, ls, local, {}, pkg);
  }
  if (!r.ok()) {
    for (auto& pl : j.placed) _p->undo(pl);
    j.placed.clear();
    j.l.reason = r.err().message;
    return j.l;
  }
  for (std::uint32_t i : used) {
    _p->switches[i].free -= slots;
    ++_p->switches[i].groups;
  }
  j.l.switch_rank = _p->switches[static_cast<std::size_t>(root)].rank;
  j.l.slots = slots;
  for (std::int32_t lf : leaf_of) j.l.leaf_rank.push_back(_p->switches[static_cast<std::size_t>(lf)].rank);
  return j.l;
}

void fabric::leave(std::uint32_t wire_id) {
  std::lock_guard<std::mutex> l(_p->m);
  auto it = _p->jobs.find(wire_id);
  if (it == _p->jobs.end()) return;
  if (--it->second.refs > 0) return;
  _p->release(it->second);
  _p->jobs.erase(it);
}

} // namespace spin::coll
