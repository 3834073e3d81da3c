#include <spin/host/host.hpp>

#include <spin/host/fd_passing.hpp>
#include <spin/host/protocol.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace spin::host {

namespace {
// client::set_while_waiting: one hook for every client of the process.
std::function<void()>& while_waiting() {
  static std::function<void()> hook;
  return hook;
}
std::chrono::milliseconds& wait_every() {
  static std::chrono::milliseconds every{1};
  return every;
}
} // namespace

namespace proto = protocol;

namespace {

constexpr std::size_t max_reply_bytes = 64 * 1024 * 1024;
constexpr std::size_t max_fds = detail::max_passed_fds;

std::string errno_text(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

void close_all(std::vector<int>& fds) {
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
  fds.clear();
}

} // namespace

// ---- event_queue ---------------------------------------------------------------------------

result<rt::host_event> event_queue::wait(std::chrono::milliseconds timeout) {
  if (!_ring) return fail(errc::bad_state, "event queue: not open");
  rt::host_event e;
  if (_ring->pop_wait(std::span(&e, 1), timeout) == 0)
    return fail(errc::timeout, "no event of EC " + std::to_string(_ec.id) + " within " + std::to_string(timeout.count()) + " ms");
  return e;
}

std::size_t event_queue::wait_burst(std::span<rt::host_event> out, std::chrono::milliseconds timeout) noexcept {
  return _ring ? _ring->pop_wait(out, timeout) : 0;
}

std::uint64_t event_queue::dropped() const noexcept { return _ring ? _ring->dropped() : 0; }
std::uint32_t event_queue::capacity() const noexcept { return _ring ? _ring->capacity() : 0; }

// ---- client --------------------------------------------------------------------------------

client::client(client&& o) noexcept
    : _fd(std::exchange(o._fd, -1)), _next_id(o._next_id), _in(std::move(o._in)), _reply_timeout(o._reply_timeout),
      _virtual(o._virtual), _socket(std::move(o._socket)), _clock(std::move(o._clock)),
      _barriers(std::move(o._barriers)) {}

client& client::operator=(client&& o) noexcept {
  if (this != &o) {
    close_fd();
    _fd = std::exchange(o._fd, -1);
    _next_id = o._next_id;
    _in = std::move(o._in);
    _reply_timeout = o._reply_timeout;
    _virtual = o._virtual;
    _socket = std::move(o._socket);
    _barriers = std::move(o._barriers);
    _clock = std::move(o._clock);
  }
  return *this;
}

client::~client() { close_fd(); }

void client::close_fd() noexcept {
  if (_fd >= 0) ::close(_fd);
  _fd = -1;
  _in.clear();
}

result<client> client::connect(const std::string& socket_path) {
  sockaddr_un addr{};
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path))
    return fail(errc::invalid_argument, "control socket path '" + socket_path + "' must have 1.." +
                                            std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(errc::bad_state, "socket: " + errno_text(errno));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int e = errno;
    ::close(fd);
    return fail(e == ENOENT ? errc::not_found : errc::bad_state, "connect to '" + socket_path + "': " + errno_text(e));
  }
  client c(fd);
  auto hello = c.call<proto::hello_reply>(proto::hello{});
  if (!hello) return hello.err();
  if (hello->protocol != proto::version)
    return fail(errc::bad_state, "'" + socket_path + "' speaks control protocol " + std::to_string(hello->protocol) +
                                     ", this library speaks " + std::to_string(proto::version));
  c._virtual = hello->virtual_time;
  c._socket = socket_path;
  return c;
}

result<client::reply_line> client::exchange(const std::string& line, std::span<const int> fds,
                                            std::chrono::milliseconds extra) {
  if (_fd < 0) return fail(errc::bad_state, "control connection is closed");
  if (fds.size() > max_fds) return fail(errc::invalid_argument, "at most " + std::to_string(max_fds) + " descriptors per request");
  // One sendmsg carries the whole line and its descriptors (the server attaches descriptors to
  // the line they arrive with); a partial write sends the rest without them.
  const std::string out = line + "\n";
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = detail::send_with_fds(_fd, out.data() + done, out.size() - done,
                                                 done == 0 ? fds : std::span<const int>(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) break;  // the server may have replied before closing
    if (n < 0) {
      const int e = errno;
      close_fd();
      return fail(errc::bad_state, "control connection: send: " + errno_text(e));
    }
    done += static_cast<std::size_t>(n);
  }

  const auto deadline = std::chrono::steady_clock::now() + _reply_timeout + extra;
  reply_line r;
  for (;;) {
    if (const std::size_t nl = _in.find('\n'); nl != std::string::npos) {
      r.text = _in.substr(0, nl);
      _in.erase(0, nl + 1);
      return r;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      close_all(r.fds);
      close_fd();
      return fail(errc::timeout, "no reply from the control socket within " +
                                     std::to_string((_reply_timeout + extra).count()) + " ms; connection closed");
    }
    pollfd p{_fd, POLLIN, 0};
    const auto& hook = while_waiting();
    const auto slice = hook ? std::min(left, wait_every()) : left;
    const int pr = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(slice.count(), std::numeric_limits<int>::max())));
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0 && hook) hook();
    if (pr <= 0) continue;
    std::array<char, 16 * 1024> buf;
    bool truncated = false;
    const ssize_t n = detail::recv_with_fds(_fd, buf, r.fds, truncated, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : 0;
      close_all(r.fds);
      close_fd();
      return fail(errc::bad_state, n == 0 ? "the control server closed the connection"
                                          : "control connection: receive: " + errno_text(e));
    }
    _in.append(buf.data(), static_cast<std::size_t>(n));
    if (_in.size() > max_reply_bytes) {
      close_all(r.fds);
      close_fd();
      return fail(errc::bad_state, "control reply longer than 64 MiB; connection closed");
    }
  }
}

template <class R>
result<R> client::call(const protocol::request& req, std::span<const int> fds, std::chrono::milliseconds extra,
                       std::vector<int>* fds_out) {
  const std::uint64_t id = _next_id++;
  auto line = exchange(proto::encode_request(id, req), fds, extra);
  if (!line) return line.err();
  std::vector<int> got = std::move(line->fds);
  bool other_id = false;
  auto rep = proto::decode_reply<R>(line->text, id, other_id);
  if (other_id) {
    close_all(got);
    close_fd();
    return fail(rep.err().code, rep.err().message + "; connection closed");
  }
  if (!rep.ok() || fds_out == nullptr)
    close_all(got);
  else
    *fds_out = std::move(got);
  return rep;
}

result<std::vector<node_info>> client::nodes() {
  auto rep = call<proto::nodes_reply>(proto::nodes{});
  if (!rep) return rep.err();
  std::vector<node_info> out;
  for (const auto& n : rep->nodes) out.push_back(node_info{n.node, n.name, n.rank, n.max_payload_bytes});
  return out;
}

result<pool_usage> client::group_pool(std::uint32_t node, const std::optional<slot_pool>& set) {
  auto rep = call<proto::pool_reply>(proto::pool{node, set});
  if (!rep) return rep.err();
  return rep->usage;
}

result<group_answer> client::join_group(std::uint32_t node, const group_join& j, std::uint32_t me) {
  auto rep = call<proto::join_reply>(proto::join{node, j, me});
  if (!rep) return rep.err();
  return std::move(rep->answer);
}

result<void> client::decide_group(std::uint32_t node, const group_decision& d) {
  auto rep = call<proto::done>(proto::decide{node, d});
  if (!rep) return rep.err();
  return {};
}

result<void> client::leave_group(std::uint32_t node, std::uint32_t group, std::uint32_t me, std::uint32_t via) {
  auto rep = call<proto::done>(proto::leave{node, group, me, via});
  if (!rep) return rep.err();
  return {};
}

result<memory> client::alloc_memory(std::uint32_t node, std::size_t bytes) {
  auto map = shm_region::create("spin-host-memory", bytes);
  if (!map) return map.err();
  const int fd = map->fd();
  auto rep = call<proto::register_reply>(proto::register_memory{node, bytes}, std::span(&fd, 1));
  if (!rep) return rep.err();
  return memory(std::move(map.value()), node, rep->region);
}

result<void> client::free_memory(memory& m) {
  auto rep = call<proto::done>(proto::unregister_memory{m._node, m._region});
  if (!rep) return rep.err();
  m = memory();
  return {};
}

result<ec> client::install(std::uint32_t node, const install_options& o) {
  std::error_code fec;
  const std::string path = std::filesystem::absolute(o.package, fec).string();
  if (fec) return fail(errc::invalid_argument, "package path '" + o.package + "': " + fec.message());
  if (o.handlers.header || o.handlers.payload || o.handlers.completion)
    return fail(errc::invalid_argument, "install: the package gives the handlers; install_options::handlers must be empty");
  proto::install req;
  static_cast<rt::ec_config&>(req) = o;
  req.node = node;
  req.package = path;
  req.bpf = o.bpf;
  req.persist = o.life == lifetime::persist;
  auto rep = call<proto::install_reply>(std::move(req));
  if (!rep) return rep.err();
  return ec{node, rep->ec};
}

result<void> client::uninstall(const ec& e) {
  auto rep = call<proto::done>(proto::uninstall{e.node, e.id});
  if (!rep) return rep.err();
  return {};
}

result<event_queue> client::open_events(const ec& e, std::uint32_t capacity) {
  std::vector<int> fds;
  auto rep = call<proto::events_reply>(proto::open_events{e.node, e.id, capacity}, {}, std::chrono::milliseconds(0), &fds);
  if (!rep) return rep.err();
  if (fds.size() != 1) {
    close_all(fds);
    (void)call<proto::done>(proto::close_events{e.node, e.id});
    return fail(errc::bad_state, "'events' reply without its ring descriptor");
  }
  auto map = shm_region::map_fd(fds[0], static_cast<std::size_t>(rep->bytes));
  close_all(fds);
  if (!map) return map.err();
  auto ring = event_ring_consumer::attach(std::move(map.value()));
  if (!ring) return ring.err();
  return event_queue(std::move(ring.value()), e);
}

result<void> client::close_events(const ec& e) {
  auto rep = call<proto::done>(proto::close_events{e.node, e.id});
  if (!rep) return rep.err();
  return {};
}

result<void> client::send(std::uint32_t node, const message& m, std::chrono::milliseconds timeout) {
  if (timeout.count() < 0 || timeout > std::chrono::milliseconds(proto::max_send_timeout_ms))
    return fail(errc::invalid_argument, "send timeout must be 0..600000 ms");
  auto rep = call<proto::done>(
      proto::send{node, m, timeout}, {}, timeout);
  if (!rep) return rep.err();
  return {};
}

result<std::vector<node_stats>> client::stats() {
  auto rep = call<proto::stats_reply>(proto::stats{});
  if (!rep) return rep.err();
  return std::move(rep->nodes);
}

result<void> client::stop_emulator() {
  auto rep = call<proto::done>(proto::stop{});
  if (!rep) return rep.err();
  return {};
}

// ---- virtual time ----------------------------------------------------------------------------

namespace {
// One virtual clock per server and process: every attached client of this process to the same
// socket shares it, since all of them are one actor of the simulation.
std::shared_ptr<std::atomic<std::int64_t>> process_clock(const std::string& socket) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<std::atomic<std::int64_t>>> clocks;
  std::error_code ec;
  const auto canon = std::filesystem::weakly_canonical(socket, ec);
  std::lock_guard lk(mu);
  auto& c = clocks[ec ? socket : canon.string()];
  if (!c) c = std::make_shared<std::atomic<std::int64_t>>(0);
  return c;
}
} // namespace

result<void> client::clocked(const protocol::request& req, std::uint32_t* events) {
  if (!_virtual) return fail(errc::not_supported, "this spin-emu runs in wall-clock time; virtual-time requests need spin-emu --virtual-time");
  auto rep = call<proto::clock_reply>(req);
  if (!rep) return rep.err();
  if (_clock) _clock->store(rep->now.count(), std::memory_order_relaxed);
  if (events != nullptr) *events = rep->events;
  return {};
}

result<std::chrono::nanoseconds> client::attach(std::uint32_t node) {
  if (!_virtual) return fail(errc::not_supported, "this spin-emu runs in wall-clock time; attach needs spin-emu --virtual-time");
  if (!_clock) _clock = process_clock(_socket);
  if (auto r = clocked(proto::attach{node}); !r) return r.err();
  // The simulation decides when each request runs: no reply deadline from here on.
  _reply_timeout = std::chrono::hours(24 * 365 * 100);
  return virtual_now();
}

result<std::uint32_t> client::wait_events(const ec& e, std::uint32_t max_events, std::chrono::nanoseconds timeout) {
  if (max_events == 0 || max_events > proto::max_wait_events)
    return fail(errc::invalid_argument, "wait_events: max_events must be 1.." + std::to_string(proto::max_wait_events));
  std::uint32_t n = 0;
  if (auto r = clocked(proto::wait{e.node, e.id, max_events, std::max(timeout, std::chrono::nanoseconds(0))}, &n); !r) return r.err();
  return n;
}

result<void> client::sleep_for(std::uint32_t node, std::chrono::nanoseconds d) {
  return clocked(proto::sleep{node, std::max(d, std::chrono::nanoseconds(0))});
}

result<void> client::charge_host(std::uint32_t node, work op, std::uint64_t bytes) { return clocked(proto::charge{node, op, bytes}); }

result<void> client::barrier(std::uint32_t node, std::vector<std::uint32_t> members, std::uint64_t seq) {
  if (members.empty()) return fail(errc::invalid_argument, "barrier: no members");
  return clocked(proto::barrier{node, std::move(members), seq});
}

result<void> client::p2p_send(std::uint32_t node, std::uint32_t dest, std::uint64_t match_bits, std::uint64_t bytes,
                              std::uint64_t sync) {
  return clocked(proto::p2p_send{node, dest, match_bits, bytes, sync});
}

result<void> client::p2p_recv(std::uint32_t node, std::uint64_t id, std::uint32_t source, std::uint64_t match_bits,
                              std::uint64_t ignore_bits) {
  if (id == 0) return fail(errc::invalid_argument, "p2p_recv: the id must not be 0");
  return clocked(proto::p2p_recv{node, id, source, match_bits, ignore_bits});
}

result<std::vector<proto::p2p_match>> client::p2p_wait(std::uint32_t node, std::vector<std::uint64_t> ids, std::uint32_t need,
                                                       std::chrono::nanoseconds timeout) {
  if (!_virtual) return fail(errc::not_supported, "this spin-emu runs in wall-clock time; p2p_wait needs spin-emu --virtual-time");
  if (ids.empty() || need == 0 || need > ids.size())
    return fail(errc::invalid_argument, "p2p_wait: need 1..ids.size() of at least one id");
  auto rep = call<proto::p2p_reply>(proto::p2p_wait{node, std::move(ids), need, std::max(timeout, std::chrono::nanoseconds(0))});
  if (!rep) return rep.err();
  if (_clock) _clock->store(rep->now.count(), std::memory_order_relaxed);
  return std::move(rep->done);
}

result<std::optional<proto::p2p_match>> client::p2p_probe(std::uint32_t node, std::uint32_t source, std::uint64_t match_bits,
                                                          std::uint64_t ignore_bits, std::chrono::nanoseconds timeout) {
  if (!_virtual) return fail(errc::not_supported, "this spin-emu runs in wall-clock time; p2p_probe needs spin-emu --virtual-time");
  auto rep = call<proto::p2p_reply>(proto::p2p_probe{node, source, match_bits, ignore_bits, std::max(timeout, std::chrono::nanoseconds(0))});
  if (!rep) return rep.err();
  if (_clock) _clock->store(rep->now.count(), std::memory_order_relaxed);
  if (rep->done.empty()) return std::optional<proto::p2p_match>();
  return std::optional<proto::p2p_match>(rep->done.front());
}

void client::set_while_waiting(std::function<void()> hook, std::chrono::milliseconds every) {
  while_waiting() = std::move(hook);
  wait_every() = std::max(every, std::chrono::milliseconds(1));
}

result<void> client::barrier(std::uint32_t node, std::vector<std::uint32_t> members) {
  if (members.empty()) return fail(errc::invalid_argument, "barrier: no members");
  std::sort(members.begin(), members.end());
  const std::uint64_t seq = ++_barriers[members];
  return barrier(node, std::move(members), seq);
}

std::chrono::nanoseconds client::virtual_now() const noexcept {
  return std::chrono::nanoseconds(_clock ? _clock->load(std::memory_order_relaxed) : 0);
}

result<std::string> client::raw_request(const std::string& line, std::span<const int> fds) {
  auto r = exchange(line, fds, std::chrono::milliseconds(0));
  if (!r) return r.err();
  close_all(r->fds);
  return std::move(r->text);
}

} // namespace spin::host
