// The control server: I/O on one Asio thread, requests on a small worker pool, the event pump
// on the I/O thread. Shared tables (regions, ECs, rings) are guarded by one mutex that is never
// held across a NIC operation.
#include <spin/emu/control.hpp>
#include <spin/emu/shm.hpp>
#include <spin/rt/loader.hpp>

#include "fd_message.hpp"

#include <utility>  // before Asio under C++20

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

namespace spin::emu {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;
using json = nlohmann::json;

namespace {

constexpr std::size_t max_fds_per_message = detail::max_passed_fds;
constexpr std::size_t read_chunk_bytes = 16 * 1024;
constexpr auto pump_period = std::chrono::microseconds(100);
constexpr std::size_t pump_burst = 256;
constexpr std::uint64_t max_send_timeout_ms = 600'000;
constexpr std::size_t max_name_bytes = 64;
constexpr std::size_t max_path_bytes = 4096;

std::string errno_text(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

/// Owns a file descriptor.
class unique_fd {
public:
  unique_fd() = default;
  explicit unique_fd(int fd) : _fd(fd) {}
  ~unique_fd() { reset(); }
  unique_fd(unique_fd&& o) noexcept : _fd(std::exchange(o._fd, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      _fd = std::exchange(o._fd, -1);
    }
    return *this;
  }
  int get() const { return _fd; }
  /// Gives up ownership.
  int release() { return std::exchange(_fd, -1); }
  void reset() {
    if (_fd >= 0) ::close(_fd);
    _fd = -1;
  }

private:
  int _fd = -1;
};

/// A request that failed validation or execution: becomes the error reply.
struct request_error {
  errc code;
  std::string message;
};

[[noreturn]] void reject(std::string message) { throw request_error{errc::invalid_argument, std::move(message)}; }

std::string pow2_text(std::uint64_t v) {
  if (v == std::numeric_limits<std::uint64_t>::max()) return "2^64-1";
  return std::to_string(v);
}

/// Reads the fields of one JSON object, checking types and ranges, and at the end that no key
/// was left unread (unknown keys are errors).
class fields {
public:
  fields(const json& j, std::string where) : _j(j), _where(std::move(where)) {
    if (!_j.is_object()) reject(_where + " must be a JSON object");
  }

  std::uint64_t u64(const char* key, std::uint64_t lo, std::uint64_t hi) {
    const json* v = find(key);
    if (v == nullptr) reject("missing field " + name(key));
    return as_u64(*v, key, lo, hi);
  }
  std::optional<std::uint64_t> opt_u64(const char* key, std::uint64_t lo, std::uint64_t hi) {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    return as_u64(*v, key, lo, hi);
  }
  std::string str(const char* key, std::size_t max_bytes) {
    const json* v = find(key);
    if (v == nullptr) reject("missing field " + name(key));
    if (!v->is_string()) reject("field " + name(key) + " must be a string");
    const auto& s = v->get_ref<const std::string&>();
    if (s.empty() || s.size() > max_bytes)
      reject("field " + name(key) + " must have 1.." + std::to_string(max_bytes) + " bytes");
    for (unsigned char c : s)
      if (c < 0x20 || c == 0x7f) reject("field " + name(key) + " contains a control character");
    return s;
  }
  std::optional<std::string> opt_str(const char* key, std::size_t max_bytes) {
    if (find(key) == nullptr) return std::nullopt;
    return str(key, max_bytes);
  }
  bool opt_bool(const char* key, bool dflt) {
    const json* v = find(key);
    if (v == nullptr) return dflt;
    if (!v->is_boolean()) reject("field " + name(key) + " must be true or false");
    return v->get<bool>();
  }
  /// A nested object (null when absent and optional).
  const json* obj(const char* key, bool required) {
    const json* v = find(key);
    if (v == nullptr) {
      if (required) reject("missing field " + name(key));
      return nullptr;
    }
    if (!v->is_object()) reject("field " + name(key) + " must be a JSON object");
    return v;
  }
  std::string name(const char* key) const { return "'" + (_where.empty() ? std::string() : _where + ".") + key + "'"; }
  const std::string& where() const { return _where; }

  /// Fails on any key that was not read.
  void done() const {
    for (auto it = _j.begin(); it != _j.end(); ++it)
      if (!_used.contains(it.key())) {
        std::string k = it.key();
        if (k.size() > 64) k = k.substr(0, 64) + "...";
        reject("unknown field " + name(k.c_str()));
      }
  }

private:
  const json* find(const char* key) {
    _used.insert(key);
    auto it = _j.find(key);
    return it == _j.end() ? nullptr : &*it;
  }
  std::uint64_t as_u64(const json& v, const char* key, std::uint64_t lo, std::uint64_t hi) const {
    const std::string range = " must be an integer in " + std::to_string(lo) + ".." + pow2_text(hi);
    if (v.is_number_unsigned()) {
      const auto x = v.get<std::uint64_t>();
      if (x < lo || x > hi) reject("field " + name(key) + range + ", not " + std::to_string(x));
      return x;
    }
    if (v.is_number_integer()) reject("field " + name(key) + range + ", not " + std::to_string(v.get<std::int64_t>()));
    reject("field " + name(key) + range);
  }

  const json& _j;
  std::string _where;
  std::set<std::string, std::less<>> _used;
};

/// A reply on its way out: the JSON line and, for "events", a file descriptor to pass.
struct reply {
  json body;
  unique_fd fd;
  bool close_after = false;  ///< close the connection once sent (oversize line, refused peer)
  bool stop_after = false;   ///< run on_stop once sent
};

json error_body(const json& id, errc code, const std::string& message) {
  return json{{"id", id}, {"ok", false}, {"error", {{"code", errc_name(code)}, {"message", message}}}};
}

std::string dump_line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

} // namespace

// ---- the server ----------------------------------------------------------------------------

class control_server_impl {
public:
  explicit control_server_impl(server_options opts)
      : _opts(std::move(opts)), _acceptor(_io), _accept_retry(_io), _pump_timer(_io), _pool(_opts.workers) {}
  ~control_server_impl() { stop(); }

  result<void> open_socket();
  void run() {
    _thread = std::thread([this] {
      do_accept();
      _io.run();
    });
  }
  void stop();

  const server_options& opts() const { return _opts; }
  std::size_t connections() const { return _nconn.load(); }
  control_server::tracked tracked_objects() const {
    std::lock_guard lk(_mu);
    return {_regions.size(), _ecs.size(), _rings.size()};
  }

private:
  struct connection;
  using conn_ptr = std::shared_ptr<connection>;

  /// File descriptors that arrived with one recvmsg; they belong to the request line that
  /// contains byte `at` of the stream (the last byte that recvmsg returned: Linux ends a read
  /// after the data that carried descriptors, and clients send a line and its descriptors in
  /// one sendmsg).
  struct fd_batch {
    std::uint64_t at = 0;
    std::vector<unique_fd> fds;
    bool truncated = false;  ///< MSG_CTRUNC: more descriptors than we accept
  };

  struct connection : std::enable_shared_from_this<connection> {
    explicit connection(stream::socket s, std::uint64_t id) : sock(std::move(s)), session(id) {}
    stream::socket sock;
    std::uint64_t session;
    std::string in;               ///< received bytes not yet consumed
    std::uint64_t in_offset = 0;  ///< stream offset of in[0]
    std::deque<fd_batch> fds;
    bool busy = false;            ///< a request is with the workers or its reply is being written
    bool eof = false;
    bool closed = false;
  };

  struct region_entry {
    std::uint32_t node;
    rt::region_id id;
    shm_region map;
    std::uint64_t owner;  ///< session; 0: orphan (kept for a persistent EC's window)
  };
  struct ec_entry {
    std::uint32_t node;
    rt::ec_id id;
    bool persist;
    std::uint64_t owner;
  };
  struct ring_entry {
    std::uint32_t node;
    rt::ec_id ec;
    event_ring_producer ring;
    std::uint64_t owner;
  };

  // I/O thread.
  void do_accept();
  void on_accept(stream::socket s);
  void start_read(const conn_ptr& c);
  void on_readable(const conn_ptr& c);
  void process_next(const conn_ptr& c);
  void send_reply(const conn_ptr& c, std::shared_ptr<reply> r);
  void write_some(const conn_ptr& c, std::shared_ptr<reply> r, std::shared_ptr<std::string> bytes, std::size_t done);
  void close_conn(const conn_ptr& c);
  void kick_pump();
  void pump();

  // Workers.
  reply handle(std::uint64_t session, const std::string& line, std::vector<unique_fd> fds, bool fds_truncated);
  json execute(std::uint64_t session, const std::string& op, fields& f, std::vector<unique_fd>& fds, reply& r);
  nic_control& node_of(fields& f, std::uint32_t& index);
  void release_session(std::uint64_t session);
  void retry_orphans(std::uint32_t node);
  void forget_ec(std::uint32_t node, rt::ec_id ec);

  server_options _opts;
  asio::io_context _io;
  stream::acceptor _acceptor;
  asio::steady_timer _accept_retry;
  asio::steady_timer _pump_timer;
  asio::thread_pool _pool;
  std::thread _thread;
  bool _pump_running = false;  // I/O thread
  bool _stopping = false;      // I/O thread
  std::set<conn_ptr> _conns;   // I/O thread
  std::atomic<std::size_t> _nconn{0};
  std::uint64_t _next_session = 1;  // I/O thread
  std::once_flag _stopped;
  dev_t _sock_dev = 0;
  ino_t _sock_ino = 0;

  mutable std::mutex _mu;  // guards the tables below; never held across a NIC call
  std::vector<std::unique_ptr<region_entry>> _regions;
  std::vector<ec_entry> _ecs;
  std::vector<std::unique_ptr<ring_entry>> _rings;
};

result<void> control_server_impl::open_socket() {
  const std::string& path = _opts.socket_path;
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return fail(errc::invalid_argument, "control socket path '" + path + "' must have 1.." +
                                            std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);

  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return fail(errc::exists, "control socket path '" + path + "' exists and is not a socket; not replacing it");
    unique_fd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.get() < 0) return fail(errc::bad_state, "socket: " + errno_text(errno));
    if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0)
      return fail(errc::exists, "a server already listens on '" + path + "'");
    if (errno != ECONNREFUSED)
      return fail(errc::exists, "control socket '" + path + "' exists and cannot be probed: " + errno_text(errno));
    if (::unlink(path.c_str()) != 0)
      return fail(errc::bad_state, "removing the stale socket '" + path + "': " + errno_text(errno));
  }

  unique_fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return fail(errc::bad_state, "socket: " + errno_text(errno));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0)
    return fail(errc::bad_state, "bind '" + path + "': " + errno_text(errno));
  // No connection can succeed before listen(), so setting the mode here leaves no window
  // (and avoids umask, which is process-wide).
  if (::chmod(path.c_str(), 0600) != 0 || ::lstat(path.c_str(), &st) != 0) {
    const int e = errno;
    ::unlink(path.c_str());
    return fail(errc::bad_state, "chmod 0600 '" + path + "': " + errno_text(e));
  }
  _sock_dev = st.st_dev;
  _sock_ino = st.st_ino;
  if (::listen(fd.get(), 64) != 0) {
    const int e = errno;
    ::unlink(path.c_str());
    return fail(errc::bad_state, "listen '" + path + "': " + errno_text(e));
  }
  boost::system::error_code ec;
  _acceptor.assign(stream(), fd.get(), ec);
  if (ec) {
    ::unlink(path.c_str());
    return fail(errc::bad_state, "control socket: " + ec.message());
  }
  (void)fd.release();  // the acceptor owns it now
  return {};
}

void control_server_impl::stop() {
  std::call_once(_stopped, [this] {
    if (_thread.joinable()) {
      asio::post(_io, [this] {
        _stopping = true;
        boost::system::error_code ec;
        _acceptor.close(ec);
        _accept_retry.cancel();
        _pump_timer.cancel();
        for (const auto& c : _conns) {
          c->closed = true;
          c->sock.close(ec);
        }
        _nconn = 0;
        _conns.clear();
      });
      _pool.join();  // requests in flight finish; nothing new starts
      _io.stop();
      _thread.join();
    } else {
      _pool.join();
    }
    // Release everything the server created. Persistent ECs go too: the regions they use are
    // mapped by this server. A region the NIC refuses to forget stays mapped (leaked) so that the
    // NIC never touches unmapped memory.
    std::vector<std::pair<std::uint32_t, rt::ec_id>> ecs;
    {
      std::lock_guard lk(_mu);
      _rings.clear();
      for (const auto& e : _ecs) ecs.emplace_back(e.node, e.id);
      _ecs.clear();
    }
    for (auto [node, ec] : ecs) (void)_opts.nodes[node]->uninstall(ec);
    std::lock_guard lk(_mu);
    for (auto& r : _regions) {
      if (!_opts.nodes[r->node]->unregister_host_memory(r->id).ok()) (void)r.release();
    }
    _regions.clear();
    if (_acceptor.is_open()) {
      boost::system::error_code ec;
      _acceptor.close(ec);
    }
    struct stat st {};
    if (_sock_ino != 0 && ::lstat(_opts.socket_path.c_str(), &st) == 0 && st.st_dev == _sock_dev && st.st_ino == _sock_ino)
      ::unlink(_opts.socket_path.c_str());
  });
}

// ---- I/O thread ----------------------------------------------------------------------------

void control_server_impl::do_accept() {
  _acceptor.async_accept([this](const boost::system::error_code& ec, stream::socket s) {
    if (_stopping || ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors or similar: try again a little later instead of spinning.
      _accept_retry.expires_after(std::chrono::milliseconds(20));
      _accept_retry.async_wait([this](const boost::system::error_code& e) {
        if (!e && !_stopping) do_accept();
      });
      return;
    }
    on_accept(std::move(s));
    do_accept();
  });
}

void control_server_impl::on_accept(stream::socket s) {
  boost::system::error_code ec;
  s.non_blocking(true, ec);
  auto c = std::make_shared<connection>(std::move(s), _next_session++);
  ucred cred{};
  socklen_t len = sizeof(cred);
  std::optional<std::pair<errc, std::string>> refuse;
  if (ec || ::getsockopt(c->sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred))
    refuse.emplace(errc::bad_state, "cannot read the peer's credentials");
  else if (cred.uid != _opts.allowed_uid)
    refuse.emplace(errc::not_supported, "user " + std::to_string(cred.uid) + " may not use this socket (only user " +
                                            std::to_string(_opts.allowed_uid) + ")");
  else if (_conns.size() >= _opts.max_connections)
    refuse.emplace(errc::no_space, "too many connections (" + std::to_string(_opts.max_connections) + ")");
  _conns.insert(c);
  _nconn = _conns.size();
  if (refuse) {
    auto r = std::make_shared<reply>();
    r->body = error_body(nullptr, refuse->first, refuse->second);
    if (refuse->first == errc::not_supported) r->body["error"]["code"] = "permission";
    r->close_after = true;
    c->busy = true;
    send_reply(c, std::move(r));
    return;
  }
  start_read(c);
}

void control_server_impl::start_read(const conn_ptr& c) {
  c->sock.async_wait(stream::socket::wait_read, [this, c](const boost::system::error_code& ec) {
    if (c->closed || _stopping) return;
    if (ec) return close_conn(c);
    on_readable(c);
  });
}

void control_server_impl::on_readable(const conn_ptr& c) {
  std::array<char, read_chunk_bytes> buf;
  std::vector<int> got;
  fd_batch batch;
  const ssize_t n = detail::recv_with_fds(c->sock.native_handle(), buf, got, batch.truncated, MSG_DONTWAIT);
  for (int fd : got) batch.fds.emplace_back(fd);  // owned from here, closed on every path
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return start_read(c);
  if (n < 0) return close_conn(c);
  if (n == 0) {
    c->eof = true;
  } else {
    if (!batch.fds.empty() || batch.truncated) {
      batch.at = c->in_offset + c->in.size() + static_cast<std::uint64_t>(n) - 1;
      c->fds.push_back(std::move(batch));
    }
    c->in.append(buf.data(), static_cast<std::size_t>(n));
  }
  process_next(c);
}

void control_server_impl::process_next(const conn_ptr& c) {
  if (c->busy || c->closed || _stopping) return;
  const std::size_t nl = c->in.find('\n');
  const std::size_t limit = _opts.max_request_bytes;
  if ((nl == std::string::npos && c->in.size() > limit) || (nl != std::string::npos && nl > limit)) {
    auto r = std::make_shared<reply>();
    r->body = error_body(nullptr, errc::invalid_argument,
                         "request line longer than " + std::to_string(limit) + " bytes; closing the connection");
    r->close_after = true;
    c->busy = true;
    c->in.clear();
    c->fds.clear();
    return send_reply(c, std::move(r));
  }
  if (nl == std::string::npos) {
    if (c->eof) return close_conn(c);
    return start_read(c);
  }
  std::string line = c->in.substr(0, nl);
  const std::uint64_t first = c->in_offset, last = c->in_offset + nl;
  c->in.erase(0, nl + 1);
  c->in_offset = last + 1;
  std::vector<unique_fd> fds;
  bool truncated = false;
  while (!c->fds.empty() && c->fds.front().at <= last) {
    fd_batch& b = c->fds.front();
    if (b.at >= first) {  // earlier batches belong to no line: closed with the batch
      for (auto& f : b.fds) fds.push_back(std::move(f));
      truncated = truncated || b.truncated;
    }
    c->fds.pop_front();
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  c->busy = true;
  const std::uint64_t session = c->session;
  asio::post(_pool, [this, c, session, line = std::move(line), fds = std::move(fds), truncated]() mutable {
    auto r = std::make_shared<reply>(handle(session, line, std::move(fds), truncated));
    asio::post(_io, [this, c, r]() mutable { send_reply(c, std::move(r)); });
  });
}

void control_server_impl::send_reply(const conn_ptr& c, std::shared_ptr<reply> r) {
  if (c->closed) return;
  auto bytes = std::make_shared<std::string>(dump_line(r->body));
  write_some(c, std::move(r), std::move(bytes), 0);
}

void control_server_impl::write_some(const conn_ptr& c, std::shared_ptr<reply> r, std::shared_ptr<std::string> bytes,
                                     std::size_t done) {
  if (c->closed) return;
  while (done < bytes->size()) {
    const int fd = r->fd.get();
    const std::span<const int> fds = done == 0 && fd >= 0 ? std::span<const int>(&fd, 1) : std::span<const int>();
    const ssize_t n = detail::send_with_fds(c->sock.native_handle(), bytes->data() + done, bytes->size() - done, fds,
                                            MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      c->sock.async_wait(stream::socket::wait_write, [this, c, r, bytes, done](const boost::system::error_code& ec) {
        if (c->closed || _stopping) return;
        if (ec) return close_conn(c);
        write_some(c, r, bytes, done);
      });
      return;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return close_conn(c);
    done += static_cast<std::size_t>(n);
  }
  r->fd.reset();
  if (r->close_after) return close_conn(c);
  if (r->stop_after && _opts.on_stop) _opts.on_stop();
  c->busy = false;
  process_next(c);
}

void control_server_impl::close_conn(const conn_ptr& c) {
  if (c->closed) return;
  c->closed = true;
  boost::system::error_code ec;
  c->sock.close(ec);
  c->fds.clear();
  _conns.erase(c);
  _nconn = _conns.size();
  const std::uint64_t session = c->session;
  asio::post(_pool, [this, session] { release_session(session); });
}

void control_server_impl::kick_pump() {
  asio::post(_io, [this] {
    if (_pump_running || _stopping) return;
    _pump_running = true;
    pump();
  });
}

void control_server_impl::pump() {
  std::array<rt::host_event, pump_burst> buf;
  bool any;
  {
    std::lock_guard lk(_mu);
    for (auto& r : _rings) {
      const std::size_t n = _opts.nodes[r->node]->poll_events(r->ec, buf);
      if (n > 0) (void)r->ring.try_push_burst(std::span<const rt::host_event>(buf.data(), n));
    }
    any = !_rings.empty();
  }
  if (!any || _stopping) {
    _pump_running = false;
    return;
  }
  _pump_timer.expires_after(pump_period);
  _pump_timer.async_wait([this](const boost::system::error_code& ec) {
    if (ec || _stopping) {
      _pump_running = false;
      return;
    }
    pump();
  });
}

// ---- requests (worker threads) -------------------------------------------------------------

reply control_server_impl::handle(std::uint64_t session, const std::string& line, std::vector<unique_fd> fds,
                                  bool fds_truncated) {
  reply r;
  json id = nullptr;
  try {
    json req;
    try {
      req = json::parse(line);
    } catch (const json::exception& e) {
      reject(std::string("request is not valid JSON (UTF-8): ") + e.what());
    }
    if (!req.is_object()) reject("request must be a JSON object");
    if (auto it = req.find("id"); it != req.end() && it->is_number_integer()) id = *it;
    fields f(req, "");
    (void)f.u64("id", 0, std::numeric_limits<std::int64_t>::max());
    const std::string op = f.str("op", 32);
    if (fds_truncated) reject("more than " + std::to_string(max_fds_per_message) + " file descriptors with one request");
    json body = execute(session, op, f, fds, r);
    body["id"] = id;
    body["ok"] = true;
    r.body = std::move(body);
  } catch (const request_error& e) {
    r.body = error_body(id, e.code, e.message);
    r.fd.reset();
    r.stop_after = false;
  } catch (const std::exception& e) {  // allocation failure and the like: the request fails
    r.body = error_body(id, errc::no_memory, std::string("request failed: ") + e.what());
    r.fd.reset();
    r.stop_after = false;
  }
  return r;  // unused descriptors close with `fds`
}

nic_control& control_server_impl::node_of(fields& f, std::uint32_t& index) {
  const std::uint64_t n = f.u64("node", 0, std::numeric_limits<std::uint32_t>::max());
  if (n >= _opts.nodes.size())
    throw request_error{errc::not_found, "node " + std::to_string(n) + " does not exist (" +
                                             std::to_string(_opts.nodes.size()) + " nodes)"};
  index = static_cast<std::uint32_t>(n);
  return *_opts.nodes[index];
}

namespace {
[[noreturn]] void pass(const error& e) { throw request_error{e.code, e.message}; }

void expect_fds(const std::vector<unique_fd>& fds, std::size_t n, const std::string& op) {
  if (fds.size() != n)
    reject("'" + op + "' takes " + std::to_string(n) + " file descriptor" + (n == 1 ? "" : "s") + ", the request carried " +
           std::to_string(fds.size()));
}
} // namespace

json control_server_impl::execute(std::uint64_t session, const std::string& op, fields& f, std::vector<unique_fd>& fds,
                                  reply& r) {
  constexpr std::uint64_t u32_max = std::numeric_limits<std::uint32_t>::max();
  constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();
  json out = json::object();

  if (op == "hello") {
    f.done();
    expect_fds(fds, 0, op);
    out["protocol"] = control_protocol_version;
    out["server"] = "spin-emu";
    out["nodes"] = _opts.nodes.size();
    return out;
  }
  if (op == "nodes") {
    f.done();
    expect_fds(fds, 0, op);
    json list = json::array();
    for (std::size_t i = 0; i < _opts.nodes.size(); ++i)
      list.push_back({{"node", i},
                      {"name", _opts.nodes[i]->name()},
                      {"rank", _opts.nodes[i]->rank()},
                      {"max_payload_bytes", _opts.nodes[i]->max_payload_bytes()}});
    out["nodes"] = std::move(list);
    return out;
  }
  if (op == "register") {
    std::uint32_t node;
    nic_control& nic = node_of(f, node);
    const std::uint64_t bytes = f.u64("bytes", 1, std::uint64_t{1} << 46);
    f.done();
    expect_fds(fds, 1, op);
    auto map = shm_region::map_fd(fds[0].get(), static_cast<std::size_t>(bytes));
    if (!map) pass(map.err());
    auto id = nic.register_host_memory(map->span());
    if (!id) pass(id.err());
    std::lock_guard lk(_mu);
    _regions.push_back(std::make_unique<region_entry>(region_entry{node, *id, std::move(map.value()), session}));
    out["region"] = *id;
    return out;
  }
  if (op == "unregister") {
    std::uint32_t node;
    nic_control& nic = node_of(f, node);
    const auto region = static_cast<rt::region_id>(f.u64("region", 0, u32_max));
    f.done();
    expect_fds(fds, 0, op);
    {
      std::lock_guard lk(_mu);
      if (std::none_of(_regions.begin(), _regions.end(), [&](const auto& e) { return e->node == node && e->id == region; }))
        throw request_error{errc::not_found, "region " + std::to_string(region) + " of node " + std::to_string(node) +
                                                 " was not registered through this socket"};
    }
    if (auto res = nic.unregister_host_memory(region); !res) pass(res.err());
    std::lock_guard lk(_mu);
    std::erase_if(_regions, [&](const auto& e) { return e->node == node && e->id == region; });
    return out;
  }
  if (op == "install") {
    std::uint32_t node;
    nic_control& nic = node_of(f, node);
    const std::string package = f.str("package", max_path_bytes);
    rt::ec_config cfg;
    cfg.name = f.str("name", max_name_bytes);
    {
      fields m(*f.obj("match", true), "match");
      cfg.match.bits = m.u64("bits", 0, u64_max);
      cfg.match.ignore_mask = m.u64("ignore_mask", 0, u64_max);
      m.done();
    }
    const auto handler_mem = f.opt_u64("handler_mem_bytes", 0, std::uint64_t{1} << 40);
    const auto scratchpad = f.opt_u64("scratchpad_bytes", 0, std::uint64_t{1} << 40);
    if (const json* w = f.obj("window", false)) {
      fields wf(*w, "window");
      rt::host_window win;
      win.region = static_cast<rt::region_id>(wf.u64("region", 0, u32_max));
      win.offset_bytes = wf.u64("offset_bytes", 0, u64_max);
      win.len_bytes = wf.u64("len_bytes", 0, u64_max);
      wf.done();
      cfg.window = win;
    }
    if (const json* l = f.obj("limits", false)) {
      fields lf(*l, "limits");
      using mx = rt::ec_limits_max;
      auto& lim = cfg.limits;
      lim.max_messages = static_cast<std::uint32_t>(lf.opt_u64("max_messages", 1, mx::messages).value_or(lim.max_messages));
      lim.retired_history =
          static_cast<std::uint32_t>(lf.opt_u64("retired_history", 1, mx::retired_history).value_or(lim.retired_history));
      lim.window_packets =
          static_cast<std::uint32_t>(lf.opt_u64("window_packets", 1, mx::window_packets).value_or(lim.window_packets));
      lim.max_parked_packets =
          static_cast<std::uint32_t>(lf.opt_u64("max_parked_packets", 1, mx::parked_packets).value_or(lim.max_parked_packets));
      const auto budget_max = static_cast<std::uint64_t>(mx::handler_budget.count());
      if (auto b = lf.opt_u64("handler_budget_ns", 1, budget_max)) lim.handler_budget = std::chrono::nanoseconds(*b);
      lim.event_queue_depth =
          static_cast<std::uint32_t>(lf.opt_u64("event_queue_depth", 1, mx::event_queue_depth).value_or(lim.event_queue_depth));
      lim.read_only_multicast = lf.opt_bool("read_only_multicast", lim.read_only_multicast);
      lf.done();
    }
    rt::load_options lo;
    if (auto b = f.opt_str("bpf", 16)) {
      if (*b == "jit")
        lo.bpf = rt::bpf_exec::jit;
      else if (*b == "interpreter")
        lo.bpf = rt::bpf_exec::interpreter;
      else
        reject("field 'bpf' must be \"jit\" or \"interpreter\"");
    }
    if (auto sc = f.opt_str("scratchpad", 16)) {
      if (*sc == "zeroed")
        cfg.scratchpad = rt::scratchpad_init::zeroed;
      else if (*sc == "undefined")
        cfg.scratchpad = rt::scratchpad_init::undefined;
      else
        reject("field 'scratchpad' must be \"zeroed\" or \"undefined\"");
    }
    const bool persist = f.opt_bool("persist", false);
    f.done();
    expect_fds(fds, 0, op);
    if (package.front() != '/') reject("field 'package' must be an absolute path");
    cfg.handler_mem_bytes = handler_mem.value_or(0);
    cfg.scratchpad_bytes = scratchpad.value_or(0);

    auto lp = rt::load_package_file(package, lo);
    if (!lp) pass(lp.err());
    if (auto b = lp->bind(cfg); !b) pass(b.err());
    auto ec = nic.install(cfg);
    if (!ec) pass(ec.err());
    std::lock_guard lk(_mu);
    _ecs.push_back(ec_entry{node, *ec, persist, session});
    out["ec"] = *ec;
    return out;
  }
  if (op == "uninstall") {
    std::uint32_t node;
    nic_control& nic = node_of(f, node);
    const auto ec = static_cast<rt::ec_id>(f.u64("ec", 0, u32_max));
    f.done();
    expect_fds(fds, 0, op);
    if (auto res = nic.uninstall(ec); !res) pass(res.err());
    forget_ec(node, ec);
    retry_orphans(node);
    return out;
  }
  if (op == "events") {
    std::uint32_t node;
    nic_control& nic = node_of(f, node);
    const auto ec = static_cast<rt::ec_id>(f.u64("ec", 0, u32_max));
    const auto capacity = static_cast<std::uint32_t>(f.u64("capacity", 1, event_ring_layout::max_capacity));
    f.done();
    expect_fds(fds, 0, op);
    const auto st = nic.runtime_stats();
    if (std::none_of(st.ecs.begin(), st.ecs.end(), [&](const rt::ec_stats& s) { return s.ec_id == ec; }))
      throw request_error{errc::not_found, "EC " + std::to_string(ec) + " is not installed on node " + std::to_string(node)};
    auto ring = event_ring_producer::create(capacity);
    if (!ring) pass(ring.err());
    const int dup = ::fcntl(ring->region().fd(), F_DUPFD_CLOEXEC, 0);
    if (dup < 0) throw request_error{errc::no_memory, "events: dup: " + errno_text(errno)};
    unique_fd passed(dup);
    out["capacity"] = ring->capacity();
    out["bytes"] = ring->region().size_bytes();
    {
      std::lock_guard lk(_mu);
      if (std::any_of(_rings.begin(), _rings.end(), [&](const auto& e) { return e->node == node && e->ec == ec; }))
        throw request_error{errc::exists, "EC " + std::to_string(ec) + " of node " + std::to_string(node) +
                                              " already has an event ring (close_events first)"};
      _rings.push_back(std::make_unique<ring_entry>(ring_entry{node, ec, std::move(ring.value()), session}));
    }
    r.fd = std::move(passed);
    kick_pump();
    return out;
  }
  if (op == "close_events") {
    std::uint32_t node;
    (void)node_of(f, node);
    const auto ec = static_cast<rt::ec_id>(f.u64("ec", 0, u32_max));
    f.done();
    expect_fds(fds, 0, op);
    std::lock_guard lk(_mu);
    if (std::erase_if(_rings, [&](const auto& e) { return e->node == node && e->ec == ec; }) == 0)
      throw request_error{errc::not_found, "EC " + std::to_string(ec) + " of node " + std::to_string(node) + " has no event ring"};
    return out;
  }
  if (op == "send") {
    std::uint32_t node;
    nic_control& nic = node_of(f, node);
    message_send m;
    m.dest_rank = static_cast<std::uint32_t>(f.u64("dest_rank", 0, u32_max));
    m.match_bits = f.u64("match_bits", 0, u64_max);
    m.message_id = f.u64("message_id", 0, u64_max);
    m.region = static_cast<rt::region_id>(f.u64("region", 0, u32_max));
    m.offset_bytes = f.u64("offset_bytes", 0, u64_max);
    m.len_bytes = f.u64("len_bytes", 0, u64_max);
    const auto timeout = std::chrono::milliseconds(f.u64("timeout_ms", 0, max_send_timeout_ms));
    f.done();
    expect_fds(fds, 0, op);
    if (auto res = nic.send(m, timeout); !res) pass(res.err());
    return out;
  }
  if (op == "stats") {
    f.done();
    expect_fds(fds, 0, op);
    json list = json::array();
    for (std::size_t i = 0; i < _opts.nodes.size(); ++i) {
      json s = json::parse(_opts.nodes[i]->stats_json(), nullptr, false);
      if (s.is_discarded())
        throw request_error{errc::bad_state, "node " + std::to_string(i) + " returned statistics that are not JSON"};
      list.push_back({{"node", i}, {"name", _opts.nodes[i]->name()}, {"rank", _opts.nodes[i]->rank()}, {"stats", std::move(s)}});
    }
    out["stats"] = std::move(list);
    return out;
  }
  if (op == "stop") {
    f.done();
    expect_fds(fds, 0, op);
    r.stop_after = true;
    return out;
  }
  std::string shown = op;
  reject("unknown op '" + shown + "'");
}

void control_server_impl::forget_ec(std::uint32_t node, rt::ec_id ec) {
  std::lock_guard lk(_mu);
  std::erase_if(_ecs, [&](const ec_entry& e) { return e.node == node && e.id == ec; });
  std::erase_if(_rings, [&](const auto& e) { return e->node == node && e->ec == ec; });
}

void control_server_impl::retry_orphans(std::uint32_t node) {
  std::vector<rt::region_id> ids;
  {
    std::lock_guard lk(_mu);
    for (const auto& r : _regions)
      if (r->node == node && r->owner == 0) ids.push_back(r->id);
  }
  for (rt::region_id id : ids) {
    if (!_opts.nodes[node]->unregister_host_memory(id).ok()) continue;
    std::lock_guard lk(_mu);
    std::erase_if(_regions, [&](const auto& e) { return e->node == node && e->id == id; });
  }
}

void control_server_impl::release_session(std::uint64_t session) {
  std::vector<std::pair<std::uint32_t, rt::ec_id>> ecs;
  std::vector<std::pair<std::uint32_t, rt::region_id>> regions;
  {
    std::lock_guard lk(_mu);
    std::erase_if(_rings, [&](const auto& e) { return e->owner == session; });
    for (const auto& e : _ecs)
      if (e.owner == session && !e.persist) ecs.emplace_back(e.node, e.id);
    for (const auto& r : _regions)
      if (r->owner == session) regions.emplace_back(r->node, r->id);
  }
  std::set<std::uint32_t> nodes;
  for (auto [node, ec] : ecs) {
    if (_opts.nodes[node]->uninstall(ec).ok()) {
      forget_ec(node, ec);
      nodes.insert(node);
    } else {
      std::lock_guard lk(_mu);  // still draining: keep it; any connection may uninstall it later
      for (auto& e : _ecs)
        if (e.node == node && e.id == ec) e.owner = 0;
    }
  }
  for (auto [node, id] : regions) {
    const bool gone = _opts.nodes[node]->unregister_host_memory(id).ok();
    std::lock_guard lk(_mu);
    for (auto it = _regions.begin(); it != _regions.end(); ++it)
      if ((*it)->node == node && (*it)->id == id) {
        if (gone)
          _regions.erase(it);
        else
          (*it)->owner = 0;  // a persistent EC's window lies in it: kept until that EC goes
        break;
      }
  }
  for (std::uint32_t node : nodes) retry_orphans(node);
}

// ---- public face ---------------------------------------------------------------------------

result<std::unique_ptr<control_server>> control_server::start(server_options opts) {
  if (opts.nodes.empty()) return fail(errc::invalid_argument, "control server: no nodes");
  if (std::any_of(opts.nodes.begin(), opts.nodes.end(), [](nic_control* n) { return n == nullptr; }))
    return fail(errc::invalid_argument, "control server: a node is null");
  if (opts.max_request_bytes == 0) return fail(errc::invalid_argument, "control server: max_request_bytes is 0");
  if (opts.workers == 0 || opts.workers > 64) return fail(errc::invalid_argument, "control server: workers must be in 1..64");
  if (opts.max_connections == 0) return fail(errc::invalid_argument, "control server: max_connections is 0");
  auto impl = std::make_unique<control_server_impl>(std::move(opts));
  if (auto r = impl->open_socket(); !r) return r.err();
  impl->run();
  return std::unique_ptr<control_server>(new control_server(std::move(impl)));
}

control_server::control_server(std::unique_ptr<control_server_impl> impl) : _impl(std::move(impl)) {}
control_server::~control_server() { stop(); }
void control_server::stop() { _impl->stop(); }
const std::string& control_server::socket_path() const noexcept { return _impl->opts().socket_path; }
std::size_t control_server::connections() const { return _impl->connections(); }
control_server::tracked control_server::tracked_objects() const { return _impl->tracked_objects(); }

} // namespace spin::emu
