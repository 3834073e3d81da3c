// The control server: I/O on one Asio thread, requests on a small worker pool, the event pump
// on the I/O thread, the sessions and what they own. Shared tables (regions, ECs, rings) are
// guarded by one mutex that is never held across a NIC operation. The operations themselves are
// in control_ops.cpp.
#include "control_impl.hpp"

namespace spin::emu {

using detail::errno_text;
using detail::max_fds_per_message;
using detail::pump_burst;
using detail::pump_period;
using detail::read_chunk_bytes;

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
  c->pid = refuse ? 0 : cred.pid;
  _conns.insert(c);
  _nconn = _conns.size();
  if (refuse) {
    auto r = std::make_shared<reply>();
    r->line = proto::encode_error(std::nullopt, refuse->first == errc::not_supported ? "permission" : errc_name(refuse->first),
                                  refuse->second);
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
  const ssize_t n = host::detail::recv_with_fds(c->sock.native_handle(), buf, got, batch.truncated, MSG_DONTWAIT);
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
    r->line = proto::encode_error(std::nullopt, errc_name(errc::invalid_argument),
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
  const pid_t pid = c->pid;
  auto job = [this, c, session, pid, line = std::move(line), fds = std::move(fds), truncated]() mutable {
    const std::function<void(std::string)> send_now = [this, c](std::string l) {
      auto early = std::make_shared<reply>();
      early->line = std::move(l);
      asio::post(_io, [this, c, early]() mutable { send_reply(c, std::move(early)); });
    };
    auto r = std::make_shared<reply>(handle(session, pid, line, std::move(fds), truncated, send_now));
    if (r->sent) return;  // its reply went out before the operation returned
    asio::post(_io, [this, c, r]() mutable { send_reply(c, std::move(r)); });
  };
  if (_opts.scheduler == nullptr) return asio::post(_pool, std::move(job));
  // Virtual time: the scheduler runs it when the simulation lets this session run.
  auto shared = std::make_shared<decltype(job)>(std::move(job));
  if (!_opts.scheduler->submit(session, [shared] { (*shared)(); })) {
    auto r = std::make_shared<reply>();
    r->line = proto::encode_error(std::nullopt, errc_name(errc::bad_state), "spin-emu is stopping: the simulation runs no more requests");
    send_reply(c, std::move(r));
  }
}

void control_server_impl::send_reply(const conn_ptr& c, std::shared_ptr<reply> r) {
  if (c->closed) return;
  auto bytes = std::make_shared<std::string>(r->line + "\n");
  write_some(c, std::move(r), std::move(bytes), 0);
}

void control_server_impl::write_some(const conn_ptr& c, std::shared_ptr<reply> r, std::shared_ptr<std::string> bytes,
                                     std::size_t done) {
  if (c->closed) return;
  while (done < bytes->size()) {
    const int fd = r->fd.get();
    const std::span<const int> fds = done == 0 && fd >= 0 ? std::span<const int>(&fd, 1) : std::span<const int>();
    const ssize_t n = host::detail::send_with_fds(c->sock.native_handle(), bytes->data() + done, bytes->size() - done, fds,
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
  if (_opts.scheduler != nullptr)
    _opts.scheduler->closed(session, [this, session] { release_session(session); });
  else
    asio::post(_pool, [this, session] { release_session(session); });
}

void control_server_impl::kick_pump() {
  if (_opts.scheduler != nullptr) return;  // virtual time: events move only through "wait"
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

reply control_server_impl::handle(std::uint64_t session, pid_t pid, const std::string& line, std::vector<unique_fd> fds,
                                  bool fds_truncated, const std::function<void(std::string line)>& send_now) {
  reply r;
  std::optional<std::uint64_t> id;
  auto fail_with = [&](errc code, const std::string& message) {
    r.line = proto::encode_error(id, errc_name(code), message);
    r.fd.reset();
    r.stop_after = false;
  };
  try {
    auto req = proto::decode_request(line, id);
    if (!req) {
      fail_with(req.err().code, req.err().message);
      return r;
    }
    if (fds_truncated) {
      fail_with(errc::invalid_argument, "more than " + std::to_string(max_fds_per_message) + " file descriptors with one request");
      return r;
    }
    const std::size_t want = proto::fds_of(req->req);
    if (fds.size() != want) {
      fail_with(errc::invalid_argument, "'" + std::string(proto::op_name(req->req)) + "' takes " + std::to_string(want) +
                                            " file descriptor" + (want == 1 ? "" : "s") + ", the request carried " +
                                            std::to_string(fds.size()));
      return r;
    }
    const std::uint64_t rid = req->id;
    r.line = proto::encode_reply(req->id, execute(session, pid, req->req, fds, r, [&r, rid, &send_now](const proto::reply& rep) {
                                   r.sent = true;
                                   send_now(proto::encode_reply(rid, rep));
                                 }));
  } catch (const request_error& e) {
    fail_with(e.code, e.message);
  } catch (const std::exception& e) {  // allocation failure and the like: the request fails
    fail_with(errc::no_memory, std::string("request failed: ") + e.what());
  }
  return r;  // unused descriptors close with `fds`
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
  // Its groups first: their slots go back to the pools (the engine ECs follow below).
  for (nic_control* n : _opts.nodes) n->groups().release(session);
  for (group_agent* a : _opts.agents)
    if (a != nullptr) a->release(session);
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
