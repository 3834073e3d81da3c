// The control server's private parts, shared by its I/O side (control.cpp: socket, connections,
// sessions) and its operations (control_ops.cpp: one function per request of the protocol).
#pragma once

#include <spin/emu/control.hpp>
#include <spin/host/shm.hpp>
#include <spin/rt/loader.hpp>

#include <spin/host/fd_passing.hpp>
#include <spin/host/protocol.hpp>

#include <utility>  // before Asio under C++20

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

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
namespace proto = host::protocol;

namespace detail {

constexpr std::size_t max_fds_per_message = host::detail::max_passed_fds;
constexpr std::size_t read_chunk_bytes = 16 * 1024;
constexpr auto pump_period = std::chrono::microseconds(100);
constexpr std::size_t pump_burst = 256;

inline std::string errno_text(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

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

/// A request that failed execution: becomes the error reply.
struct request_error {
  errc code;
  std::string message;
};

/// A reply on its way out: the JSON line and, for "events", a file descriptor to pass.
struct reply {
  std::string line;  ///< without its newline
  unique_fd fd;
  bool close_after = false;  ///< close the connection once sent (oversize line, refused peer)
  bool stop_after = false;   ///< run on_stop once sent
  bool sent = false;         ///< sent already, before the operation returned (call::reply_now)
};


} // namespace detail

using detail::reply;
using detail::request_error;
using detail::unique_fd;

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
    pid_t pid = 0;                ///< the peer process (SO_PEERCRED)
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
    host::shm_region map;
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
    host::event_ring_producer ring;
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
  /// Runs one request line; `send_now` sends a reply line before it returns (call::reply_now).
  reply handle(std::uint64_t session, pid_t pid, const std::string& line, std::vector<unique_fd> fds, bool fds_truncated,
               const std::function<void(std::string line)>& send_now);
  proto::reply execute(std::uint64_t session, pid_t pid, const proto::request& req, std::vector<unique_fd>& fds, reply& r,
                       std::function<void(const proto::reply&)> reply_now);

  // ---- the operations (control_ops.cpp): one per request of the protocol ----
  /// What an operation gets beside its request: the session that sent it, the file
  /// descriptors that came with it (as many as protocol::fds_of says), and the reply, to which
  /// it may attach a descriptor or the order to stop after sending. An operation throws
  /// request_error to fail; what it returns is the success reply.
  struct call {
    std::uint64_t session;
    pid_t pid;
    std::vector<unique_fd>& fds;
    reply& r;
    /// Sends `rep` as this request's success reply now, from any thread (a barrier's members
    /// all learn it met from the thread of the last one); what the operation returns is then
    /// not sent.
    std::function<void(const proto::reply& rep)> reply_now;
  };
  proto::reply op(const proto::hello& q, call& c);
  proto::reply op(const proto::nodes& q, call& c);
  proto::reply op(const proto::register_memory& q, call& c);
  proto::reply op(const proto::unregister_memory& q, call& c);
  proto::reply op(const proto::install& q, call& c);
  proto::reply op(const proto::uninstall& q, call& c);
  proto::reply op(const proto::open_events& q, call& c);
  proto::reply op(const proto::close_events& q, call& c);
  proto::reply op(const proto::send& q, call& c);
  proto::reply op(const proto::pool& q, call& c);
  proto::reply op(const proto::join& q, call& c);
  proto::reply op(const proto::decide& q, call& c);
  proto::reply op(const proto::leave& q, call& c);
  proto::reply op(const proto::stats& q, call& c);
  proto::reply op(const proto::stop& q, call& c);
  proto::reply op(const proto::attach& q, call& c);
  proto::reply op(const proto::wait& q, call& c);
  proto::reply op(const proto::sleep& q, call& c);
  proto::reply op(const proto::charge& q, call& c);
  proto::reply op(const proto::barrier& q, call& c);
  proto::reply op(const proto::p2p_send& q, call& c);
  proto::reply op(const proto::p2p_recv& q, call& c);
  proto::reply op(const proto::p2p_wait& q, call& c);
  proto::reply op(const proto::p2p_probe& q, call& c);
  /// The scheduler of a virtual-time server, for a request that may wait (wait, sleep, charge, barrier).
  request_scheduler& waiting_scheduler(const char* op, std::uint64_t session);
  proto::clock_reply clock_of(nic_control& nic, std::uint32_t events = 0) const;
  nic_control& node_of(std::uint32_t index);
  group_agent& agent_of(std::uint32_t index);
  void check_trusted(const std::string& path) const;
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

} // namespace spin::emu
