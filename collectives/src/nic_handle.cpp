// How spin::coll reaches a NIC of another spin-emu process: through its control socket.
#include "nic_handle.hpp"

#include <spin/host/host.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

namespace spin::coll::detail {
namespace {

// ---- in a spin-emu process --------------------------------------------------------------------

class remote_memory final : public nic_memory {
public:
  remote_memory(host::client& c, host::memory m) : _c(c), _m(std::move(m)) {
    bytes = _m.bytes();
    region = _m.region();
  }
  ~remote_memory() override { (void)_c.free_memory(_m); }

private:
  host::client& _c;
  host::memory _m;
};

class remote final : public nic_handle {
public:
  remote(host::client c, std::uint32_t node, std::uint32_t rank, std::uint32_t max_payload, std::string name, std::string key)
      : _c(std::move(c)), _node(node), _rank(rank), _max_payload(max_payload), _name(std::move(name)), _key(std::move(key)) {}
  ~remote() override {
    // ECs this client installed go with its connection; their event queues close here.
    _events.clear();
  }
  std::uint32_t rank() const noexcept override { return _rank; }
  const std::string& name() const noexcept override { return _name; }
  std::uint32_t max_payload_bytes() const noexcept override { return _max_payload; }
  const std::string& key() const noexcept override { return _key; }

  // Virtual time (spin-emu --virtual-time): the clock is the simulation's, and waits are
  // requests, so that the simulation knows this process waits (host::client::attach).
  std::chrono::steady_clock::time_point now() const noexcept override {
    if (!_c.virtual_time()) return std::chrono::steady_clock::now();
    return std::chrono::steady_clock::time_point(_c.virtual_now());
  }
  void sleep_for(std::chrono::nanoseconds d) override {
    if (!_c.virtual_time()) return std::this_thread::sleep_for(d);
    if (!_c.sleep_for(_node, d).ok()) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the server is gone: no busy loop
  }
  void charge_host(host::work op, std::uint64_t bytes) override {
    if (_c.virtual_time()) (void)_c.charge_host(_node, op, bytes);
  }
  bool virtual_time() const noexcept override { return _c.virtual_time(); }

  result<std::unique_ptr<nic_memory>> alloc(std::size_t bytes) override {
    auto m = _c.alloc_memory(_node, bytes);
    if (!m.ok()) return m.err();
    return std::unique_ptr<nic_memory>(std::make_unique<remote_memory>(_c, std::move(m.value())));
  }

  result<rt::ec_id> install(const engine_package& pkg, const rt::ec_config& s) override {
    // The package's declared memory sizes, as the NIC's bind will see them.
    std::uint64_t handler_mem = s.handler_mem_bytes, scratchpad = s.scratchpad_bytes;
    if (auto r = rt::raise_to_declared(pkg.package->manifest, s.name, handler_mem, scratchpad); !r.ok()) return r.err();
    // spin-emu loads packages from files: a private copy of the bytes, removed once installed.
    std::filesystem::path dir;
    {
      std::error_code ec;
      dir = std::filesystem::temp_directory_path(ec);
      if (ec) dir = "/tmp";
    }
    std::string path = (dir / "spin-coll-XXXXXX").string();
    const int fd = ::mkstemp(path.data());
    if (fd < 0) return fail(errc::no_memory, "cannot create a package file in " + dir.string() + ": " + std::strerror(errno));
    std::size_t done = 0;
    while (done < pkg.bytes.size()) {
      const ssize_t w = ::write(fd, pkg.bytes.data() + done, pkg.bytes.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int e = errno;
        ::close(fd);
        ::unlink(path.c_str());
        return fail(errc::no_memory, "cannot write the package file " + path + ": " + std::strerror(e));
      }
      done += static_cast<std::size_t>(w);
    }
    ::close(fd);
    host::install_options io;
    static_cast<rt::ec_config&>(io) = s;
    io.handlers = {};  // the package gives them
    io.package = path;
    io.handler_mem_bytes = handler_mem;
    io.scratchpad_bytes = scratchpad;
    auto ec = _c.install(_node, io);
    ::unlink(path.c_str());
    if (!ec.ok()) return ec.err();
    auto q = _c.open_events(ec.value(), s.limits.event_queue_depth);
    if (!q.ok()) {
      (void)_c.uninstall(ec.value());
      return fail(q.err().code, "opening the events of " + s.name + ": " + q.err().message);
    }
    _events.emplace(ec.value().id, std::move(q.value()));
    return ec.value().id;
  }

  result<void> uninstall(rt::ec_id id) override {
    // An EC whose handlers still run keeps draining: try again for a while (control path).
    result<void> r;
    for (int i = 0; i < 200; ++i) {
      r = _c.uninstall(host::ec{_node, id});
      if (r.ok() || r.err().code != errc::timeout) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    _events.erase(id);
    return r;
  }

  std::size_t poll_events(rt::ec_id ec, std::span<rt::host_event> out) override {
    return wait_events(ec, out, std::chrono::nanoseconds(0));
  }
  std::size_t wait_events(rt::ec_id ec, std::span<rt::host_event> out, std::chrono::nanoseconds timeout) override {
    auto it = _events.find(ec);
    if (it == _events.end() || out.empty()) return 0;
    if (_c.virtual_time()) {
      // Waiting events first move into the ring, then the ring is read without waiting.
      if (const std::size_t queued = it->second.wait_burst(out, std::chrono::milliseconds(0)); queued > 0) return queued;
      const auto max = static_cast<std::uint32_t>(std::min<std::size_t>(out.size(), host::protocol::max_wait_events));
      auto n = _c.wait_events(host::ec{_node, ec}, max, timeout);
      if (!n.ok()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the server is gone: no busy loop
        return 0;
      }
      return it->second.wait_burst(out, std::chrono::milliseconds(0));
    }
    return it->second.wait_burst(out, std::chrono::ceil<std::chrono::milliseconds>(timeout));
  }

  result<void> send(const host::message& m) override { return _c.send(_node, m, std::chrono::milliseconds(1000)); }

  result<host::pool_usage> group_pool(const std::optional<host::slot_pool>& set) override { return _c.group_pool(_node, set); }
  result<host::group_answer> join_group(const host::group_join& j, std::uint32_t me) override {
    return _c.join_group(_node, j, me);
  }
  result<void> decide_group(const host::group_decision& d) override { return _c.decide_group(_node, d); }
  result<void> leave_group(std::uint32_t group, std::uint32_t me, std::uint32_t via) override {
    return _c.leave_group(_node, group, me, via);
  }

private:
  host::client _c;
  std::uint32_t _node;
  std::uint32_t _rank;
  std::uint32_t _max_payload;
  std::string _name, _key;
  std::map<rt::ec_id, host::event_queue> _events;
};

// A switch reached in-band through a member's own NIC.
class via final : public nic_handle {
public:
  via(std::unique_ptr<nic_handle> nic, std::uint32_t sw)
      : _nic(std::move(nic)), _sw(sw), _name("switch rank " + std::to_string(sw) + " (in-band through " + _nic->name() + ")"),
        _key("via:" + _nic->key() + "#" + std::to_string(sw)) {}
  std::uint32_t rank() const noexcept override { return _sw; }
  const std::string& name() const noexcept override { return _name; }
  std::uint32_t max_payload_bytes() const noexcept override { return _nic->max_payload_bytes(); }
  const std::string& key() const noexcept override { return _key; }
  result<std::unique_ptr<nic_memory>> alloc(std::size_t) override { return refuse<std::unique_ptr<nic_memory>>(); }
  result<rt::ec_id> install(const engine_package&, const rt::ec_config&) override { return refuse<rt::ec_id>(); }
  result<void> uninstall(rt::ec_id) override { return refuse<void>(); }
  std::size_t poll_events(rt::ec_id, std::span<rt::host_event>) override { return 0; }
  std::size_t wait_events(rt::ec_id, std::span<rt::host_event>, std::chrono::nanoseconds) override { return 0; }
  result<void> send(const host::message&) override { return refuse<void>(); }
  result<host::pool_usage> group_pool(const std::optional<host::slot_pool>&) override { return refuse<host::pool_usage>(); }
  result<host::group_answer> join_group(const host::group_join& j, std::uint32_t me) override {
    host::group_join v = j;
    v.via = _sw;
    return _nic->join_group(v, me);
  }
  result<void> decide_group(const host::group_decision& d) override {
    host::group_decision v = d;
    v.via = _sw;
    return _nic->decide_group(v);
  }
  result<void> leave_group(std::uint32_t group, std::uint32_t me, std::uint32_t) override { return _nic->leave_group(group, me, _sw); }

private:
  template <class T> result<T> refuse() const {
    return fail(errc::not_supported, _name + ": a switch reached in-band takes group operations only");
  }
  std::unique_ptr<nic_handle> _nic;
  std::uint32_t _sw;
  std::string _name, _key;
};

} // namespace

std::unique_ptr<nic_handle> via_nic(std::unique_ptr<nic_handle> nic, std::uint32_t switch_rank) {
  return std::make_unique<via>(std::move(nic), switch_rank);
}

result<std::unique_ptr<nic_handle>> remote_nic(const std::string& socket, std::uint32_t node) {
  auto c = host::client::connect(socket);
  if (!c.ok()) return fail(c.err().code, "spin-emu at " + socket + ": " + c.err().message);
  auto nodes = c.value().nodes();
  if (!nodes.ok()) return fail(nodes.err().code, "spin-emu at " + socket + ": " + nodes.err().message);
  for (const auto& n : nodes.value()) {
    if (n.node != node) continue;
    // Virtual time: this process is a host program of the simulation (docs/virtual-time.md).
    if (c.value().virtual_time())
      if (auto a = c.value().attach(node); !a.ok()) return fail(a.err().code, "spin-emu at " + socket + ": " + a.err().message);
    std::error_code ec;
    const auto canon = std::filesystem::weakly_canonical(socket, ec);
    std::string key = "remote:" + (ec ? socket : canon.string()) + "#" + std::to_string(node);
    return std::unique_ptr<nic_handle>(std::make_unique<remote>(std::move(c.value()), node, n.rank, n.max_payload_bytes, n.name, std::move(key)));
  }
  return fail(errc::not_found, "spin-emu at " + socket + " has no node " + std::to_string(node) + " (it has " +
                                   std::to_string(nodes.value().size()) + ")");
}

} // namespace spin::coll::detail
