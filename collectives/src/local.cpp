// spin_coll_local: what spin::coll needs to drive NICs of this process (cluster mode): the
// local NIC handle, communicator::create and fabric::create. The one part of spin::coll that links
// the emulator (and so DPDK); the rank side (spin_coll_rank) does not.
#include "nic_handle.hpp"
#include "switch_engine.hpp"

#include <spin/coll/coll.hpp>
#include <spin/coll/protocol.hpp>
#include <spin/coll/switch_agent.hpp>
#include <spin/emu/cluster.hpp>
#include <spin/emu/nic_control.hpp>
#include <spin/rt/loader.hpp>

#include <sys/mman.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

namespace spin::coll {
namespace detail {
namespace {

// Packages loaded in this process, by the decoded package they came from: a communicator's
// engines and a fabric's groups install the same package many times; each load maps the code
// anew. An entry goes when its package does (engine_package holds it by make_shared, so its
// address is not reused while the weak pointer lives).
result<rt::loaded_package> load_cached(const engine_package& pkg) {
  struct entry {
    std::weak_ptr<const rt::package> pkg;
    rt::loaded_package loaded;
  };
  static std::mutex m;
  static std::vector<entry> cache;
  if (!pkg.package) return fail(errc::invalid_argument, "engine package: not decoded");
  std::lock_guard g(m);
  std::erase_if(cache, [](const entry& e) { return e.pkg.expired(); });
  for (const auto& e : cache)
    if (e.pkg.lock() == pkg.package) return e.loaded;
  auto lp = rt::load_package(*pkg.package);
  if (!lp.ok()) return lp.err();
  cache.push_back(entry{pkg.package, lp.value()});
  return lp.value();
}

// ---- in this process ------------------------------------------------------------------------

class local_memory final : public nic_memory {
public:
  local_memory(emu::nic_control& nic, std::byte* p, std::size_t n) : _nic(nic) { bytes = {p, n}; }
  ~local_memory() override {
    if (_registered) (void)_nic.unregister_host_memory(region);
    ::munmap(bytes.data(), bytes.size());
  }
  bool _registered = false;

private:
  emu::nic_control& _nic;
};

class local final : public nic_handle {
public:
  explicit local(emu::nic_control& nic) : _nic(nic), _owner(emu::group_registry::local_owner()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", static_cast<const void*>(&nic));
    _key = std::string("local:") + buf;
  }
  ~local() override { _nic.groups().release(_owner); }
  std::uint32_t rank() const noexcept override { return _nic.rank(); }
  const std::string& name() const noexcept override { return _nic.name(); }
  std::uint32_t max_payload_bytes() const noexcept override { return _nic.max_payload_bytes(); }
  const std::string& key() const noexcept override { return _key; }

  result<std::unique_ptr<nic_memory>> alloc(std::size_t bytes) override {
    // Reserved, not touched: the pages appear when the NIC or the host first writes them.
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return fail(errc::no_memory, "cannot map " + std::to_string(bytes) + " bytes of host memory");
    auto m = std::make_unique<local_memory>(_nic, static_cast<std::byte*>(p), bytes);
    auto reg = _nic.register_host_memory(m->bytes);
    if (!reg.ok()) return reg.err();
    m->region = reg.value();
    m->_registered = true;
    return std::unique_ptr<nic_memory>(std::move(m));
  }

  result<rt::ec_id> install(const engine_package& pkg, const rt::ec_config& s) override {
    auto loaded = load_cached(pkg);
    if (!loaded.ok()) return loaded.err();
    rt::ec_config cfg = s;
    if (auto r = loaded.value().bind(cfg); !r.ok()) return r.err();
    return _nic.install(cfg);
  }
  result<void> uninstall(rt::ec_id ec) override { return _nic.uninstall(ec); }
  std::chrono::steady_clock::time_point now() const noexcept override { return _nic.now(); }
  void sleep_for(std::chrono::nanoseconds d) override { _nic.sleep_for(d); }
  bool virtual_time() const noexcept override { return _nic.virtual_time(); }
  void charge_host(host::work op, std::uint64_t bytes) override { _nic.charge_host(op, bytes); }
  std::size_t poll_events(rt::ec_id ec, std::span<rt::host_event> out) override { return _nic.poll_events(ec, out); }
  std::size_t wait_events(rt::ec_id ec, std::span<rt::host_event> out, std::chrono::nanoseconds timeout) override {
    return _nic.wait_events(ec, out, timeout);
  }
  result<void> send(const host::message& m) override { return _nic.send(m, std::chrono::milliseconds(1000)); }
  result<void> post(const host::message& m) override { return _nic.post(m); }

  result<host::pool_usage> group_pool(const std::optional<host::slot_pool>& set) override { return _nic.groups().pool(set); }
  result<host::group_answer> join_group(const host::group_join& j, std::uint32_t me) override {
    if (j.via != host::group_join::own_registry)
      return fail(errc::not_supported, "in-band joins go through a spin-emu's group agent, not a NIC of this process");
    return _nic.groups().join(_owner, j, me);
  }
  result<void> decide_group(const host::group_decision& d) override {
    if (d.via != host::group_join::own_registry)
      return fail(errc::not_supported, "in-band joins go through a spin-emu's group agent, not a NIC of this process");
    return _nic.groups().decide(_owner, d);
  }
  result<void> leave_group(std::uint32_t group, std::uint32_t me, std::uint32_t via) override {
    if (via != host::group_join::own_registry)
      return fail(errc::not_supported, "in-band joins go through a spin-emu's group agent, not a NIC of this process");
    _nic.groups().leave(_owner, group, me);
    return {};
  }

private:
  emu::nic_control& _nic;
  std::uint64_t _owner;
  std::string _key;
};

} // namespace

std::unique_ptr<nic_handle> local_nic(emu::nic_control& nic) { return std::make_unique<local>(nic); }

} // namespace detail

result<std::unique_ptr<communicator>> communicator::create(emu::nic_control& nic, const group& g, const options& o) {
  return create_on(detail::local_nic(nic), g, o);
}

result<std::unique_ptr<fabric>> fabric::create(emu::cluster& c, const fabric_options& o) { return create(c.topo(), c.controls(), o); }

result<std::unique_ptr<fabric>> fabric::create(const emu::topology& t, const std::vector<emu::nic_control*>& nodes, const fabric_options& o) {
  if (nodes.size() != t.nodes.size())
    return fail(errc::invalid_argument, "fabric: " + std::to_string(nodes.size()) + " NICs for a topology of " +
                                            std::to_string(t.nodes.size()) + " nodes");
  std::vector<std::unique_ptr<detail::nic_handle>> switches;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> links;
  for (std::uint32_t i = 0; i < t.nodes.size(); ++i)
    if (t.nodes[i].kind == emu::node_kind::switch_) switches.push_back(detail::local_nic(*nodes[i]));
  for (const auto& l : t.links) links.emplace_back(nodes[l.a]->rank(), nodes[l.b]->rank());
  auto f = over(std::move(switches), links, o);
  if (!f.ok() && f.err().code == errc::not_found) return fail(errc::not_found, "fabric: the cluster has no switch");
  return f;
}

namespace {
class installer final : public emu::group_installer {
public:
  explicit installer(emu::nic_control& nic) : _port(detail::local_nic(nic)) {}
  ~installer() override {
    for (auto& [g, e] : _engines) detail::remove_switch_engine(*_port, e);
  }
  result<std::vector<std::uint32_t>> set_up(const host::group_join& j, std::uint32_t slot_bytes) override {
    auto pkg = detail::standard_package();
    if (!pkg.ok()) return pkg.err();
    if (j.members.size() > proto::max_ranks)
      return fail(errc::invalid_argument, "a switch engine aggregates for at most " + std::to_string(proto::max_ranks) + " members");
    proto::switch_setup rs{};
    rs.nranks = static_cast<std::uint32_t>(j.members.size());
    rs.slots = j.slots;
    rs.slot_bytes = slot_bytes;
    rs.role = proto::switch_root;
    auto& e = _engines[j.group];
    if (auto r = detail::install_switch_engine(*_port, e, j.group, j.slots, slot_bytes, rs, j.members, {}, pkg.value(), j.frame_key); !r.ok()) {
      tear_down(j.group);
      return r.err();
    }
    return std::vector<std::uint32_t>{_port->rank()};
  }
  void tear_down(std::uint32_t group) override {
    auto it = _engines.find(group);
    if (it == _engines.end()) return;
    detail::remove_switch_engine(*_port, it->second);
    _engines.erase(it);
  }

private:
  std::unique_ptr<detail::nic_handle> _port;
  std::map<std::uint32_t, detail::switch_engine> _engines;
};
} // namespace

std::unique_ptr<emu::group_installer> switch_group_installer(emu::nic_control& nic) { return std::make_unique<installer>(nic); }

} // namespace spin::coll
