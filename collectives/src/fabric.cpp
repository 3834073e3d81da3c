// spin::coll::fabric: the switches of a cluster as pools of aggregator slots shared by groups
// (docs/collectives.md, "Switch aggregation" and "Several jobs").
#include <spin/coll/coll.hpp>
#include <spin/coll/engine.hpp>
#include <spin/coll/protocol.hpp>

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
  struct job {
    std::vector<std::uint32_t> members;
    std::uint32_t asked = 0;
    lease l;
    std::uint32_t refs = 0;
    std::int32_t sw_index = -1;
    rt::ec_id ec = 0;
    rt::region_id region = 0;
    bool ec_ok = false, region_ok = false;
    std::vector<std::byte> mem;  // the switch EC's host window: the set-up descriptor
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

  result<void> install(job& j, sw& s, std::uint32_t wire_id, std::uint32_t packet_bytes, const rt::loaded_package& pkg) {
    emu::nic& nic = c.node(s.node);
    const std::uint32_t n = static_cast<std::uint32_t>(j.members.size());
    const std::uint64_t stride = engine_detail::slot_stride_bytes(n, o.slot_bytes);
    j.mem.assign(4096 + sizeof(pr::switch_setup) + pr::max_ranks * 4, std::byte{0});
    auto reg = nic.register_host_memory(j.mem);
    if (!reg.ok()) return reg.err();
    j.region = reg.value();
    j.region_ok = true;
    rt::ec_config cfg;
    cfg.name = "coll." + std::to_string(wire_id >> 4) + ".switch";
    cfg.match.bits = pr::match_bits(wire_id, 0);
    cfg.match.ignore_mask = pr::match_ignore_mask;
    if (auto r = pkg.bind(cfg); !r.ok()) return r.err();
    cfg.handler_mem_bytes = engine_detail::slots_offset() + std::uint64_t{j.asked} * 2 * stride;
    cfg.window = rt::host_window{j.region, 0, j.mem.size()};
    cfg.limits.max_messages = 256;
    cfg.limits.retired_history = 1u << 16;
    cfg.limits.window_packets = 64;
    cfg.limits.max_parked_packets = 256;
    cfg.limits.event_queue_depth = 64;
    auto ec = nic.install(cfg);
    if (!ec.ok()) return fail(ec.err().code, "installing the aggregation engine on " + nic.name() + ": " + ec.err().message);
    j.ec = ec.value();
    j.ec_ok = true;
    pr::switch_setup w{};
    w.nranks = n;
    w.slots = j.asked;
    w.slot_bytes = o.slot_bytes;
    std::memcpy(j.mem.data() + 64, &w, sizeof(w));
    std::memcpy(j.mem.data() + 64 + sizeof(w), j.members.data(), n * sizeof(std::uint32_t));
    pr::cmd cmd{};
    cmd.type = pr::cmd_switch_setup;
    cmd.desc_off = 64;
    std::memcpy(j.mem.data(), &cmd, sizeof(cmd));
    emu::message_send msg;
    msg.dest_rank = nic.rank();
    msg.match_bits = pr::match_bits(wire_id, pr::k_cmd);
    msg.message_id = 1;
    msg.region = j.region;
    msg.offset_bytes = 0;
    msg.len_bytes = sizeof(cmd);
    if (auto r = nic.send(msg, std::chrono::milliseconds(1000)); !r.ok()) return r;
    (void)packet_bytes;
    const auto deadline = clock::now() + std::chrono::seconds(10);
    std::array<rt::host_event, 4> evs;
    while (clock::now() < deadline) {
      const std::size_t got = nic.poll_events(j.ec, evs);
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

  void undo(job& j, sw& s) {
    emu::nic& nic = c.node(s.node);
    if (j.ec_ok) (void)nic.uninstall(j.ec);
    if (j.region_ok) (void)nic.unregister_host_memory(j.region);
    j.ec_ok = j.region_ok = false;
  }
  void release(job& j) {
    if (j.sw_index < 0) return;
    sw& s = switches[static_cast<std::size_t>(j.sw_index)];
    undo(j, s);
    s.free += j.l.slots;
    --s.groups;
    j.sw_index = -1;
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
  const std::int32_t si = _p->switch_for(members);
  if (si < 0) {
    j.l.reason = "no switch reaches every member";
    return j.l;
  }
  impl::sw& s = _p->switches[static_cast<std::size_t>(si)];
  const std::string sname = _p->c.node(s.node).name();
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
  if (!_p->cv.wait_for(l, wait, [&] { return s.free >= slots; })) {
    j.l.reason = sname + " has " + std::to_string(s.free) + " free slots of " + std::to_string(_p->o.slots_per_switch) +
                 " (" + std::to_string(s.groups) + " groups hold the rest); the group asks for " + std::to_string(slots);
    return j.l;
  }
  if (auto r = _p->install(j, s, wire_id, packet_bytes, pkg); !r.ok()) {
    _p->undo(j, s);
    j.l.reason = r.err().message;
    return j.l;
  }
  s.free -= slots;
  ++s.groups;
  j.sw_index = si;
  j.l.switch_rank = s.rank;
  j.l.slots = slots;
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
