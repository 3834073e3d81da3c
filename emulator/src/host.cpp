#include <spin/host/host.hpp>

#include "fd_message.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace spin::host {

using json = nlohmann::json;

namespace {

constexpr std::size_t max_reply_bytes = 64 * 1024 * 1024;
constexpr std::size_t max_fds = emu::detail::max_passed_fds;

std::string errno_text(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

void close_all(std::vector<int>& fds) {
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
  fds.clear();
}

errc errc_from_name(const std::string& name) {
  for (int v = 0; v >= -13; --v)
    if (name == errc_name(static_cast<errc>(v))) return static_cast<errc>(v);
  if (name == "permission") return errc::not_supported;
  return errc::bad_state;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

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
    : _fd(std::exchange(o._fd, -1)), _next_id(o._next_id), _in(std::move(o._in)), _reply_timeout(o._reply_timeout) {}

client& client::operator=(client&& o) noexcept {
  if (this != &o) {
    close_fd();
    _fd = std::exchange(o._fd, -1);
    _next_id = o._next_id;
    _in = std::move(o._in);
    _reply_timeout = o._reply_timeout;
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
  auto hello = c.call(json{{"op", "hello"}}, {}, std::chrono::milliseconds(0), nullptr);
  if (!hello) return hello.err();
  const json& h = *hello;
  if (!h.contains("protocol") || h["protocol"] != 1)
    return fail(errc::bad_state, "'" + socket_path + "' speaks control protocol " + dump(h.value("protocol", json())) +
                                     ", this library speaks 1");
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
    const ssize_t n = emu::detail::send_with_fds(_fd, out.data() + done, out.size() - done,
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
    const int pr = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), std::numeric_limits<int>::max())));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    std::array<char, 16 * 1024> buf;
    bool truncated = false;
    const ssize_t n = emu::detail::recv_with_fds(_fd, buf, r.fds, truncated, MSG_DONTWAIT);
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

template <class Json>
result<Json> client::call(Json req, std::span<const int> fds, std::chrono::milliseconds extra, std::vector<int>* fds_out) {
  const std::uint64_t id = _next_id++;
  req["id"] = id;
  auto line = exchange(dump(req), fds, extra);
  if (!line) return line.err();
  std::vector<int> got = std::move(line->fds);
  json rep = json::parse(line->text, nullptr, false);
  if (rep.is_discarded() || !rep.is_object() || !rep.contains("ok") || !rep["ok"].is_boolean()) {
    close_all(got);
    return fail(errc::bad_state, "control reply is not a protocol object: " + line->text.substr(0, 200));
  }
  if (!rep["ok"].get<bool>()) {
    close_all(got);
    const json& e = rep.value("error", json::object());
    const std::string code = e.is_object() && e.contains("code") && e["code"].is_string() ? e["code"].get<std::string>() : "";
    const std::string msg =
        e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>() : line->text;
    return fail(errc_from_name(code), msg);
  }
  if (!rep.contains("id") || rep["id"] != id) {
    close_all(got);
    close_fd();
    return fail(errc::bad_state, "control reply for another request (id " + dump(rep.value("id", json())) + ", expected " +
                                     std::to_string(id) + "); connection closed");
  }
  if (fds_out != nullptr)
    *fds_out = std::move(got);
  else
    close_all(got);
  return rep;
}

result<std::vector<node_info>> client::nodes() {
  auto rep = call(json{{"op", "nodes"}}, {}, std::chrono::milliseconds(0), nullptr);
  if (!rep) return rep.err();
  std::vector<node_info> out;
  try {
    for (const auto& n : rep->at("nodes"))
      out.push_back(node_info{n.at("node").get<std::uint32_t>(), n.at("name").get<std::string>(), n.at("rank").get<std::uint32_t>(),
                              n.at("max_payload_bytes").get<std::uint32_t>()});
  } catch (const json::exception& e) {
    return fail(errc::bad_state, std::string("malformed 'nodes' reply: ") + e.what());
  }
  return out;
}

result<memory> client::alloc_memory(std::uint32_t node, std::size_t bytes) {
  auto map = emu::shm_region::create("spin-host-memory", bytes);
  if (!map) return map.err();
  const int fd = map->fd();
  auto rep = call(json{{"op", "register"}, {"node", node}, {"bytes", bytes}}, std::span(&fd, 1), std::chrono::milliseconds(0), nullptr);
  if (!rep) return rep.err();
  if (!rep->contains("region") || !(*rep)["region"].is_number_unsigned())
    return fail(errc::bad_state, "malformed 'register' reply: " + dump(*rep));
  return memory(std::move(map.value()), node, (*rep)["region"].get<rt::region_id>());
}

result<void> client::free_memory(memory& m) {
  auto rep = call(json{{"op", "unregister"}, {"node", m._node}, {"region", m._region}}, {}, std::chrono::milliseconds(0), nullptr);
  if (!rep) return rep.err();
  m = memory();
  return {};
}

result<ec> client::install(std::uint32_t node, const install_options& o) {
  std::error_code fec;
  const std::string path = std::filesystem::absolute(o.package, fec).string();
  if (fec) return fail(errc::invalid_argument, "package path '" + o.package + "': " + fec.message());
  json req{{"op", "install"},
           {"node", node},
           {"package", path},
           {"name", o.name},
           {"match", {{"bits", o.match.bits}, {"ignore_mask", o.match.ignore_mask}}},
           {"limits",
            {{"max_messages", o.limits.max_messages},
             {"retired_history", o.limits.retired_history},
             {"window_packets", o.limits.window_packets},
             {"max_parked_packets", o.limits.max_parked_packets},
             {"handler_budget_ns", o.limits.handler_budget.count()},
             {"event_queue_depth", o.limits.event_queue_depth},
             {"read_only_multicast", o.limits.read_only_multicast}}},
           {"bpf", o.bpf == rt::bpf_exec::jit ? "jit" : "interpreter"},
           {"persist", o.life == lifetime::persist}};
  if (o.handler_mem_bytes != 0) req["handler_mem_bytes"] = o.handler_mem_bytes;
  if (o.scratchpad_bytes != 0) req["scratchpad_bytes"] = o.scratchpad_bytes;
  if (o.scratchpad == rt::scratchpad_init::undefined) req["scratchpad"] = "undefined";
  if (o.window)
    req["window"] = {{"region", o.window->region}, {"offset_bytes", o.window->offset_bytes}, {"len_bytes", o.window->len_bytes}};
  auto rep = call(std::move(req), {}, std::chrono::milliseconds(0), nullptr);
  if (!rep) return rep.err();
  if (!rep->contains("ec") || !(*rep)["ec"].is_number_unsigned())
    return fail(errc::bad_state, "malformed 'install' reply: " + dump(*rep));
  return ec{node, (*rep)["ec"].get<rt::ec_id>()};
}

result<void> client::uninstall(const ec& e) {
  auto rep = call(json{{"op", "uninstall"}, {"node", e.node}, {"ec", e.id}}, {}, std::chrono::milliseconds(0), nullptr);
  if (!rep) return rep.err();
  return {};
}

result<event_queue> client::open_events(const ec& e, std::uint32_t capacity) {
  std::vector<int> fds;
  auto rep = call(json{{"op", "events"}, {"node", e.node}, {"ec", e.id}, {"capacity", capacity}}, {}, std::chrono::milliseconds(0), &fds);
  if (!rep) return rep.err();
  if (fds.size() != 1 || !rep->contains("bytes") || !(*rep)["bytes"].is_number_unsigned()) {
    close_all(fds);
    (void)call(json{{"op", "close_events"}, {"node", e.node}, {"ec", e.id}}, {}, std::chrono::milliseconds(0), nullptr);
    return fail(errc::bad_state, "'events' reply without its ring descriptor or size");
  }
  auto map = emu::shm_region::map_fd(fds[0], (*rep)["bytes"].get<std::size_t>());
  close_all(fds);
  if (!map) return map.err();
  auto ring = emu::event_ring_consumer::attach(std::move(map.value()));
  if (!ring) return ring.err();
  return event_queue(std::move(ring.value()), e);
}

result<void> client::close_events(const ec& e) {
  auto rep = call(json{{"op", "close_events"}, {"node", e.node}, {"ec", e.id}}, {}, std::chrono::milliseconds(0), nullptr);
  if (!rep) return rep.err();
  return {};
}

result<void> client::send(std::uint32_t node, const message& m) {
  if (m.timeout.count() < 0 || m.timeout > std::chrono::minutes(10))
    return fail(errc::invalid_argument, "send timeout must be 0..600000 ms");
  auto rep = call(json{{"op", "send"},
                       {"node", node},
                       {"dest_rank", m.dest_rank},
                       {"match_bits", m.match_bits},
                       {"message_id", m.message_id},
                       {"region", m.region},
                       {"offset_bytes", m.offset_bytes},
                       {"len_bytes", m.len_bytes},
                       {"timeout_ms", m.timeout.count()}},
                  {}, m.timeout, nullptr);
  if (!rep) return rep.err();
  return {};
}

result<std::string> client::stats_json() {
  auto rep = call(json{{"op", "stats"}}, {}, std::chrono::milliseconds(0), nullptr);
  if (!rep) return rep.err();
  if (!rep->contains("stats")) return fail(errc::bad_state, "malformed 'stats' reply");
  return dump((*rep)["stats"]);
}

result<void> client::stop_emulator() {
  auto rep = call(json{{"op", "stop"}}, {}, std::chrono::milliseconds(0), nullptr);
  if (!rep) return rep.err();
  return {};
}

result<std::string> client::raw_request(const std::string& line, std::span<const int> fds) {
  auto r = exchange(line, fds, std::chrono::milliseconds(0));
  if (!r) return r.err();
  close_all(r->fds);
  return std::move(r->text);
}

} // namespace spin::host
