// spin::coll behind the backend's C++17-visible facade (spin_group.hpp).
#include "spin_group.hpp"

#include <spin/coll/coll.hpp>
#include <spin/host/env.hpp>
#include <spin/host/host.hpp>

#include <algorithm>
#include <map>
#include <mutex>

namespace spin::torch_backend {

namespace {
coll::dtype to_dtype(elem t) { return static_cast<coll::dtype>(static_cast<std::uint8_t>(t)); }
coll::op to_op(red r) {
  switch (r) {
  case red::sum: return coll::op::sum;
  case red::min: return coll::op::min;
  case red::max: return coll::op::max;
  case red::prod: return coll::op::prod;
  }
  return coll::op::sum;
}
coll::algorithm to_algorithm(algo a) {
  switch (a) {
  case algo::automatic: return coll::algorithm::automatic;
  case algo::edge_ring: return coll::algorithm::edge_ring;
  case algo::host_ring: return coll::algorithm::host_ring;
  case algo::switch_agg: return coll::algorithm::switch_agg;
  }
  return coll::algorithm::automatic;
}
std::string text(const result<void>& r) {
  return r.ok() ? std::string() : std::string(errc_name(r.err().code)) + ": " + r.err().message;
}
} // namespace

std::optional<std::uint64_t> env_number(const char* name, std::uint64_t max, std::string& error) {
  auto r = host::env_number(name, max);
  if (r.ok()) return r.value();
  error = r.err().message;
  return std::nullopt;
}

std::optional<secret> env_secret(const char* name, std::string& error) {
  auto r = host::env_secret(name);
  if (r.ok()) return r.value();
  error = r.err().message;
  return std::nullopt;
}

secret random_secret(std::string& error) {
  auto r = host::random_secret();
  if (r.ok()) return r.value();
  error = r.err().message;
  return {};
}

std::uint32_t nic_rank(const std::string& socket, std::uint32_t node, std::string& error) {
  auto cl = host::client::connect(socket);
  if (!cl.ok()) {
    error = "no spin-emu at " + socket + " (" + errc_name(cl.err().code) + ": " + cl.err().message + "; set SPIN_TORCH_SOCKET)";
    return 0;
  }
  auto nodes = cl.value().nodes();
  if (!nodes.ok()) {
    error = "spin-emu at " + socket + ": " + nodes.err().message;
    return 0;
  }
  for (const auto& n : nodes.value())
    if (n.node == node) return n.rank;
  error = "spin-emu at " + socket + " has no node " + std::to_string(node) + " (" + std::to_string(nodes.value().size()) +
          " nodes; set SPIN_TORCH_NODE)";
  return 0;
}

namespace {
// One connection per socket for virtual time's barriers (null: wall-clock time, or none).
struct vt_link {
  std::unique_ptr<host::client> cl;
  bool attached = false;
};
std::mutex vt_mu;
std::map<std::string, vt_link> vt_links;

vt_link& link_of(const std::string& socket) {  // under vt_mu
  auto [it, fresh] = vt_links.try_emplace(socket);
  if (fresh)
    if (auto c = host::client::connect(socket); c.ok() && c.value().virtual_time())
      it->second.cl = std::make_unique<host::client>(std::move(c.value()));
  return it->second;
}
} // namespace

bool in_virtual_time(const std::string& socket) {
  std::lock_guard g(vt_mu);
  return link_of(socket).cl != nullptr;
}

std::string virtual_time_barrier(const std::string& socket, std::uint32_t node, std::vector<std::uint32_t> nodes) {
  std::lock_guard g(vt_mu);
  vt_link& l = link_of(socket);
  if (!l.cl) return "";
  if (!l.attached) {
    // Joins this process's actor (its communicator's connection bound it), or binds it.
    if (auto a = l.cl->attach(node); !a.ok()) return std::string("virtual time: ") + errc_name(a.err().code) + ": " + a.err().message;
    l.attached = true;
  }
  auto r = l.cl->barrier(node, std::move(nodes));
  return r.ok() ? std::string() : std::string("virtual time: the members' barrier failed: ") + errc_name(r.err().code) + ": " + r.err().message;
}

std::int64_t virtual_time_ns(const std::string& socket) {
  std::lock_guard g(vt_mu);
  vt_link& l = link_of(socket);
  return l.cl ? l.cl->virtual_now().count() : -1;
}

struct group::impl {
  std::unique_ptr<coll::fabric> switches;  // outlives comm
  std::unique_ptr<coll::communicator> comm;
  coll::algorithm a = coll::algorithm::automatic;
};

group::group(const std::string& socket, std::uint32_t node, std::uint32_t id, const std::vector<std::uint32_t>& members,
             std::uint32_t me, std::chrono::milliseconds timeout, algo a, const std::string& switch_socket,
             std::optional<std::uint32_t> switch_node, std::optional<std::uint32_t> switch_rank, const secret& job_secret,
             std::string& error)
    : _p(std::make_unique<impl>()) {
  _p->a = to_algorithm(a);
  coll::group g;
  g.id = id;
  g.members = members;
  g.me = me;
  coll::options o;
  o.timeout = timeout;
  o.job_secret = job_secret;
  // SPIN_TORCH_FRAME_AUTH=0: frames without tags (coll::options::authenticate_frames).
  if (auto a = host::env_number("SPIN_TORCH_FRAME_AUTH", 1); !a.ok()) {
    error = a.err().message;
    return;
  } else if (a.value()) {
    o.authenticate_frames = *a.value() == 1;
  }
  if (switch_node || switch_rank) {
    // The switch's spin-emu keeps the slot pool and the group's one answer; this fabric is a
    // view of it over a connection of its own, or in-band through this rank's own NIC.
    auto f = switch_node ? coll::fabric::connect({coll::remote_switch{switch_socket, *switch_node, members}})
                         : coll::fabric::in_band({socket, node, *switch_rank});
    if (!f.ok()) {
      error = std::string(switch_node ? "the switch (SPIN_TORCH_SWITCH_NODE): " : "the switch (SPIN_TORCH_SWITCH_RANK): ") +
              errc_name(f.err().code) + ": " + f.err().message;
      return;
    }
    _p->switches = std::move(f.value());
    o.switches = _p->switches.get();
  }
  auto c = coll::communicator::connect(socket, node, g, o);
  if (!c.ok()) {
    error = std::string("spin communicator: ") + errc_name(c.err().code) + ": " + c.err().message;
    return;
  }
  _p->comm = std::move(c.value());
}

group::~group() = default;

std::string group::allreduce(void* data, std::uint64_t count, elem t, red r) {
  if (!_p->comm) return "not connected";
  return text(_p->comm->allreduce(data, data, count, to_dtype(t), to_op(r), _p->a));
}
std::string group::broadcast(void* data, std::uint64_t count, elem t, std::uint32_t root) {
  if (!_p->comm) return "not connected";
  return text(_p->comm->broadcast(data, data, count, to_dtype(t), root, _p->a));
}
std::string group::allgather(const void* in, void* out, std::uint64_t block_count, elem t) {
  if (!_p->comm) return "not connected";
  return text(_p->comm->allgather(in, out, block_count, to_dtype(t), _p->a));
}
std::string group::reduce_scatter(const void* in, void* out, std::uint64_t block_count, elem t, red r) {
  if (!_p->comm) return "not connected";
  const auto a = _p->a == coll::algorithm::switch_agg ? coll::algorithm::edge_ring : _p->a;
  return text(_p->comm->reduce_scatter(in, out, block_count, to_dtype(t), to_op(r), a));
}

} // namespace spin::torch_backend
