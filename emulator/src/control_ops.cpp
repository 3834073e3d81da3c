// The control server's operations: one function per request of the protocol
// (spin/host/protocol.hpp); execute() visits the request. Each checks what needs
// the server's state (the node exists, the region was registered here, the package is trusted),
// calls the NIC, and records what the session now owns.
#include "control_impl.hpp"

#include <fstream>
#include <iterator>

namespace spin::emu {

using detail::errno_text;

nic_control& control_server_impl::node_of(std::uint32_t index) {
  if (index >= _opts.nodes.size())
    throw request_error{errc::not_found, "node " + std::to_string(index) + " does not exist (" +
                                             std::to_string(_opts.nodes.size()) + " nodes)"};
  return *_opts.nodes[index];
}

group_agent& control_server_impl::agent_of(std::uint32_t index) {
  nic_control& n = node_of(index);
  if (index >= _opts.agents.size() || _opts.agents[index] == nullptr)
    throw request_error{errc::not_supported, n.name() + " runs no group agent: in-band joins (\"via\") need one"};
  return *_opts.agents[index];
}

namespace {
[[noreturn]] void pass(const error& e) { throw request_error{e.code, e.message}; }
} // namespace

// Refuses a native package that is not byte for byte one of the trusted ones (the bytes are
// read once here; the loader reads the file again, which only this user may write: the socket
// admits no other).
void control_server_impl::check_trusted(const std::string& path) const {
  auto pkg = rt::read_package_file(path);
  if (!pkg) pass(pkg.err());
  if (pkg->manifest.target != rt::package_target::native_x86_64) return;
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& t : _opts.trusted_packages)
    if (t.size() == bytes.size() && std::memcmp(t.data(), bytes.data(), bytes.size()) == 0) return;
  throw request_error{errc::not_supported,
                      "this spin-emu is a shared switch: it runs native packages only when they are its own standard "
                      "collective engine, and '" + pkg->manifest.source_name + "' is another native package (build it for eBPF, or "
                      "start spin-emu with --native-packages any on a switch that one job owns)"};
}

proto::reply control_server_impl::execute(std::uint64_t session, pid_t pid, const proto::request& req,
                                          std::vector<unique_fd>& fds, reply& r,
                                          std::function<void(const proto::reply&)> reply_now) {
  call c{session, pid, fds, r, std::move(reply_now)};
  return std::visit([&](const auto& q) { return op(q, c); }, req);
}

proto::reply control_server_impl::op(const proto::hello&, call&) {
  return proto::hello_reply{proto::version, "spin-emu", static_cast<std::uint32_t>(_opts.nodes.size()), _opts.scheduler != nullptr};
}

proto::reply control_server_impl::op(const proto::nodes&, call&) {
  proto::nodes_reply out;
  for (std::size_t i = 0; i < _opts.nodes.size(); ++i)
    out.nodes.push_back({static_cast<std::uint32_t>(i), _opts.nodes[i]->name(), _opts.nodes[i]->rank(),
                         _opts.nodes[i]->max_payload_bytes()});
  return out;
}

proto::reply control_server_impl::op(const proto::register_memory& q, call& c) {
  nic_control& nic = node_of(q.node);
  auto map = host::shm_region::map_fd(c.fds[0].get(), static_cast<std::size_t>(q.bytes));
  if (!map) pass(map.err());
  auto id = nic.register_host_memory(map->span());
  if (!id) pass(id.err());
  std::lock_guard lk(_mu);
  _regions.push_back(std::make_unique<region_entry>(region_entry{q.node, *id, std::move(map.value()), c.session}));
  return proto::register_reply{*id};
}

proto::reply control_server_impl::op(const proto::unregister_memory& q, call&) {
  nic_control& nic = node_of(q.node);
  const std::uint32_t node = q.node;
  const rt::region_id region = q.region;
  {
    std::lock_guard lk(_mu);
    if (std::none_of(_regions.begin(), _regions.end(), [&](const auto& e) { return e->node == node && e->id == region; }))
      throw request_error{errc::not_found, "region " + std::to_string(region) + " of node " + std::to_string(node) +
                                               " was not registered through this socket"};
  }
  if (auto res = nic.unregister_host_memory(region); !res) pass(res.err());
  std::lock_guard lk(_mu);
  std::erase_if(_regions, [&](const auto& e) { return e->node == node && e->id == region; });
  return proto::done{};
}

proto::reply control_server_impl::op(const proto::install& q, call& c) {
  nic_control& nic = node_of(q.node);
  if (q.package.front() != '/') throw request_error{errc::invalid_argument, "field 'package' must be an absolute path"};
  rt::ec_config cfg = q;  // the EC as the request describes it; bind adds the package's handlers
  rt::load_options lo;
  lo.bpf = q.bpf;
  if (_opts.native == server_options::native_policy::trusted) check_trusted(q.package);
  auto lp = rt::load_package_file(q.package, lo);
  if (!lp) pass(lp.err());
  if (auto b = lp->bind(cfg); !b) pass(b.err());
  auto ec = nic.install(cfg);
  if (!ec) pass(ec.err());
  std::lock_guard lk(_mu);
  _ecs.push_back(ec_entry{q.node, *ec, q.persist, c.session});
  return proto::install_reply{*ec};
}

proto::reply control_server_impl::op(const proto::uninstall& q, call&) {
  nic_control& nic = node_of(q.node);
  if (auto res = nic.uninstall(q.ec); !res) pass(res.err());
  forget_ec(q.node, q.ec);
  retry_orphans(q.node);
  return proto::done{};
}

proto::reply control_server_impl::op(const proto::open_events& q, call& c) {
  nic_control& nic = node_of(q.node);
  const std::uint32_t node = q.node;
  const rt::ec_id ec = q.ec;
  const auto st = nic.runtime_stats();
  if (std::none_of(st.ecs.begin(), st.ecs.end(), [&](const rt::ec_stats& s) { return s.ec_id == ec; }))
    throw request_error{errc::not_found, "EC " + std::to_string(ec) + " is not installed on node " + std::to_string(node)};
  auto ring = host::event_ring_producer::create(q.capacity);
  if (!ring) pass(ring.err());
  const int dup = ::fcntl(ring->region().fd(), F_DUPFD_CLOEXEC, 0);
  if (dup < 0) throw request_error{errc::no_memory, "events: dup: " + errno_text(errno)};
  unique_fd passed(dup);
  proto::events_reply out{ring->capacity(), ring->region().size_bytes()};
  {
    std::lock_guard lk(_mu);
    if (std::any_of(_rings.begin(), _rings.end(), [&](const auto& e) { return e->node == node && e->ec == ec; }))
      throw request_error{errc::exists, "EC " + std::to_string(ec) + " of node " + std::to_string(node) +
                                            " already has an event ring (close_events first)"};
    _rings.push_back(std::make_unique<ring_entry>(ring_entry{node, ec, std::move(ring.value()), c.session}));
  }
  c.r.fd = std::move(passed);
  kick_pump();
  return out;
}

proto::reply control_server_impl::op(const proto::close_events& q, call&) {
  (void)node_of(q.node);
  std::lock_guard lk(_mu);
  if (std::erase_if(_rings, [&](const auto& e) { return e->node == q.node && e->ec == q.ec; }) == 0)
    throw request_error{errc::not_found, "EC " + std::to_string(q.ec) + " of node " + std::to_string(q.node) +
                                             " has no event ring"};
  return proto::done{};
}

proto::reply control_server_impl::op(const proto::send& q, call&) {
  nic_control& nic = node_of(q.node);
  // A message the NIC copies when it queues it (a command, at most post_inline_bytes) is
  // posted: no waiting for the lanes to step aside, as a real NIC's doorbell. Larger ones wait
  // for room in the transmit queue up to the request's timeout.
  if (q.msg.len_bytes <= host::post_inline_bytes) {
    if (auto res = nic.post(q.msg); !res) pass(res.err());
  } else if (auto res = nic.send(q.msg, q.timeout); !res) {
    pass(res.err());
  }
  return proto::done{};
}

proto::reply control_server_impl::op(const proto::pool& q, call&) {
  auto u = node_of(q.node).groups().pool(q.set);
  if (!u) pass(u.err());
  return proto::pool_reply{*u};
}

proto::reply control_server_impl::op(const proto::join& q, call& c) {
  auto a = q.group.via == host::group_join::own_registry ? node_of(q.node).groups().join(c.session, q.group, q.me)
                                                           : agent_of(q.node).join(c.session, q.group.via, q.group, q.me);
  if (!a) pass(a.err());
  return proto::join_reply{std::move(a.value())};
}

proto::reply control_server_impl::op(const proto::decide& q, call& c) {
  if (auto d = q.decision.via == host::group_join::own_registry ? node_of(q.node).groups().decide(c.session, q.decision)
                                                                  : agent_of(q.node).give_up(c.session, q.decision.via, q.decision);
      !d)
    pass(d.err());
  return proto::done{};
}

proto::reply control_server_impl::op(const proto::leave& q, call& c) {
  if (q.via == host::group_join::own_registry)
    node_of(q.node).groups().leave(c.session, q.group, q.me);
  else
    agent_of(q.node).leave(c.session, q.via, q.group, q.me);
  return proto::done{};
}

proto::reply control_server_impl::op(const proto::stats&, call&) {
  proto::stats_reply out;
  for (std::size_t i = 0; i < _opts.nodes.size(); ++i)
    out.nodes.push_back({static_cast<std::uint32_t>(i), _opts.nodes[i]->stats()});
  return out;
}

proto::reply control_server_impl::op(const proto::stop&, call& c) {
  c.r.stop_after = true;
  return proto::done{};
}

// ---- virtual time ----------------------------------------------------------------------------

proto::clock_reply control_server_impl::clock_of(nic_control& nic, std::uint32_t events) const {
  return proto::clock_reply{std::chrono::duration_cast<std::chrono::nanoseconds>(nic.now().time_since_epoch()), events};
}

request_scheduler& control_server_impl::waiting_scheduler(const char* op, std::uint64_t session) {
  if (_opts.scheduler == nullptr)
    throw request_error{errc::not_supported, std::string("'") + op + "' is for virtual time (spin-emu --virtual-time); this spin-emu runs in wall-clock time"};
  if (!_opts.scheduler->may_wait(session))
    throw request_error{errc::bad_state, std::string("'") + op + "' needs a connection whose process is bound to a host node (attach naming a host node first)"};
  return *_opts.scheduler;
}

proto::reply control_server_impl::op(const proto::attach& q, call& c) {
  nic_control& nic = node_of(q.node);
  if (_opts.scheduler == nullptr)
    throw request_error{errc::not_supported, "'attach' is for virtual time (spin-emu --virtual-time); this spin-emu runs in wall-clock time"};
  if (auto r = _opts.scheduler->attach(c.session, c.pid, q.node); !r) pass(r.err());
  return clock_of(nic);
}

proto::reply control_server_impl::op(const proto::wait& q, call& c) {
  nic_control& nic = node_of(q.node);
  (void)waiting_scheduler("wait", c.session);
  {
    std::lock_guard lk(_mu);
    if (std::none_of(_rings.begin(), _rings.end(), [&](const auto& e) { return e->node == q.node && e->ec == q.ec; }))
      throw request_error{errc::not_found, "EC " + std::to_string(q.ec) + " of node " + std::to_string(q.node) +
                                               " has no event ring (open_events first)"};
  }
  std::array<rt::host_event, proto::max_wait_events> buf;
  const std::size_t n = nic.wait_events(q.ec, std::span(buf.data(), q.max_events),
                                        std::min<std::chrono::nanoseconds>(q.timeout, request_scheduler::max_wait));
  std::size_t moved = 0;
  if (n > 0) {
    std::lock_guard lk(_mu);
    for (auto& e : _rings)
      if (e->node == q.node && e->ec == q.ec) moved = e->ring.try_push_burst(std::span<const rt::host_event>(buf.data(), n));
  }
  return clock_of(nic, static_cast<std::uint32_t>(moved));
}

proto::reply control_server_impl::op(const proto::sleep& q, call& c) {
  nic_control& nic = node_of(q.node);
  (void)waiting_scheduler("sleep", c.session);
  nic.sleep_for(std::min<std::chrono::nanoseconds>(q.duration, request_scheduler::max_wait));
  return clock_of(nic);
}

proto::reply control_server_impl::op(const proto::charge& q, call& c) {
  nic_control& nic = node_of(q.node);
  (void)waiting_scheduler("charge", c.session);
  nic.charge_host(q.op, q.bytes);
  return clock_of(nic);
}

proto::reply control_server_impl::op(const proto::barrier& q, call& c) {
  nic_control& nic = node_of(q.node);
  request_scheduler& sched = waiting_scheduler("barrier", c.session);
  // Every member's reply goes out when the last one comes, before any of them runs on: an
  // actor runs only when the simulation hands over to it, and the one that runs first holds it
  // until its process's next request, which may come only after the others' MPI calls.
  if (auto r = sched.barrier(c.session, q.members, q.seq, [&] { c.reply_now(clock_of(nic)); }); !r) pass(r.err());
  return clock_of(nic);
}

proto::reply control_server_impl::op(const proto::p2p_send& q, call& c) {
  nic_control& nic = node_of(q.node);
  if (auto r = waiting_scheduler("p2p_send", c.session).p2p_send(c.session, q); !r) pass(r.err());
  return clock_of(nic);
}

proto::reply control_server_impl::op(const proto::p2p_recv& q, call& c) {
  nic_control& nic = node_of(q.node);
  if (auto r = waiting_scheduler("p2p_recv", c.session).p2p_recv(c.session, q); !r) pass(r.err());
  return clock_of(nic);
}

proto::reply control_server_impl::op(const proto::p2p_wait& q, call& c) {
  nic_control& nic = node_of(q.node);
  auto r = waiting_scheduler("p2p_wait", c.session).p2p_wait(c.session, q);
  if (!r) pass(r.err());
  return proto::p2p_reply{clock_of(nic).now, std::move(*r)};
}

proto::reply control_server_impl::op(const proto::p2p_probe& q, call& c) {
  nic_control& nic = node_of(q.node);
  auto r = waiting_scheduler("p2p_probe", c.session).p2p_probe(c.session, q);
  if (!r) pass(r.err());
  return proto::p2p_reply{clock_of(nic).now, std::move(*r)};
}

} // namespace spin::emu
