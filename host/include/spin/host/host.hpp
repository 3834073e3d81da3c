// The host library: what an application on the host uses to drive spin-emu through its control
// socket (spin/emu/control.hpp describes the protocol). It registers shared memory that
// handlers DMA into, installs ECs from handler packages, sends messages and waits for events.
//
// Threads. A client is one connection with one request in flight at a time: use one client per
// thread, or lock around every call. memory and event_queue objects are independent of their
// client once created (an event_queue may be waited on from another thread than the client's;
// one thread at a time per queue). Errors never throw: every call returns a result whose error
// carries the server's errc and message ("permission" refusals arrive as errc::not_supported).
#pragma once

#include <spin/host/message.hpp>
#include <spin/host/protocol.hpp>
#include <spin/host/stats.hpp>
#include <spin/host/shm.hpp>
#include <spin/rt/package.hpp>
#include <spin/result.hpp>
#include <spin/rt/runtime.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace spin::host {

/// One NIC of the emulator as "nodes" lists it.
struct node_info {
  std::uint32_t node = 0;  ///< index used in every other call
  std::string name;        ///< "host0", ...
  std::uint32_t rank = 0;  ///< address in the emulated network
  std::uint32_t max_payload_bytes = 0;  ///< largest payload of one packet its handlers can send
};

/// Host memory shared with a NIC: a memory file mapped here and in spin-emu, registered as
/// region `region()` of node `node()`. Handlers' DMA to a window in it lands in bytes().
/// Move-only; the mapping lives as long as this object (the NIC keeps its own mapping until the
/// region is unregistered, by client::free_memory or when the client's connection closes).
class memory {
public:
  memory() = default;
  /// The shared bytes.
  std::span<std::byte> bytes() const noexcept { return _map.span(); }
  /// The region id to use in windows and messages.
  rt::region_id region() const noexcept { return _region; }
  /// The node it is registered with.
  std::uint32_t node() const noexcept { return _node; }

private:
  friend class client;
  memory(shm_region m, std::uint32_t node, rt::region_id region) : _map(std::move(m)), _node(node), _region(region) {}
  shm_region _map;
  std::uint32_t _node = 0;
  rt::region_id _region = 0;
};

/// Whether an installed EC outlives the connection that installed it.
enum class lifetime {
  session,  ///< uninstalled when the client disconnects (the default)
  persist,  ///< stays until uninstalled explicitly or spin-emu stops (spinctl installs so)
};

/// What client::install needs.
///
/// The EC itself is the runtime's one description of an EC (rt::ec_config): its name (1..64
/// bytes, no control characters), match rule, memory sizes (0: what the package declares; else
/// at least that), scratchpad contents, host window (bytes of a region registered here; none: no
/// window), limits (every field is sent) and frame key (it travels over the control connection,
/// which only processes of this host can reach). Its `handlers` stay empty: the package gives
/// them (client::install refuses handlers with invalid_argument).
struct install_options : rt::ec_config {
  std::string package;                   ///< handler package path; made absolute against this process's cwd
  rt::bpf_exec bpf = rt::bpf_exec::jit;  ///< for eBPF packages
  lifetime life = lifetime::session;
};

/// An installed EC.
struct ec {
  std::uint32_t node = 0;
  rt::ec_id id = 0;
};

/// The host end of an EC's event ring (shared memory the server fills). Move-only.
class event_queue {
public:
  event_queue() = default;
  /// Waits up to `timeout` for the next event. Errors: timeout (none arrived), bad_state (the
  /// queue is empty: default-constructed or moved from).
  result<rt::host_event> wait(std::chrono::milliseconds timeout);
  /// Reads up to out.size() events, waiting up to `timeout` for the first. Returns the count
  /// (0 on timeout).
  std::size_t wait_burst(std::span<rt::host_event> out, std::chrono::milliseconds timeout) noexcept;
  /// Events lost because the ring was full when the server moved them in.
  std::uint64_t dropped() const noexcept;
  /// Capacity in events (a power of two).
  std::uint32_t capacity() const noexcept;
  /// The EC whose events these are.
  const host::ec& owner() const noexcept { return _ec; }

private:
  friend class client;
  event_queue(event_ring_consumer c, host::ec e) : _ring(std::move(c)), _ec(e) {}
  std::optional<event_ring_consumer> _ring;
  host::ec _ec;
};

/// A connection to spin-emu's control socket. Move-only; closing it (destruction) releases
/// everything it created that was not installed with lifetime::persist.
class client {
public:
  /// Connects and checks the protocol version ("hello"). Errors: invalid_argument (path too
  /// long), not_found (no socket at the path), bad_state (connection refused or failed, a server
  /// that does not speak protocol 1), not_supported (the server refused this user:
  /// "permission"), timeout (no answer within the reply timeout).
  static result<client> connect(const std::string& socket_path);

  client(client&&) noexcept;
  client& operator=(client&&) noexcept;
  client(const client&) = delete;
  client& operator=(const client&) = delete;
  ~client();

  /// How long any call waits for its reply (default 30 s, plus the message timeout for send).
  /// On timeout the call fails with errc::timeout and the connection is closed (a late reply
  /// could not be matched otherwise); later calls fail with bad_state.
  void set_reply_timeout(std::chrono::milliseconds t) noexcept { _reply_timeout = t; }

  /// The emulator's NICs.
  result<std::vector<node_info>> nodes();

  /// Creates `bytes` bytes of zeroed shared memory and registers it with node `node`. Errors:
  /// invalid_argument (bytes 0 or too large), no_memory (memfd or mmap failed), not_found (no
  /// such node), and those of the NIC's register_host_memory.
  result<memory> alloc_memory(std::uint32_t node, std::size_t bytes);
  /// Unregisters `m` and unmaps it here. Errors: not_found, bad_state (an installed EC's window
  /// lies in it, or a send from it is in progress); `m` is unchanged on error.
  result<void> free_memory(memory& m);

  /// Installs an EC from a handler package on node `node`. Errors: those of loading the package
  /// (rt::load_package_file) and binding it, of the NIC's install, invalid_argument for options
  /// the protocol refuses (name length, limits out of range).
  result<ec> install(std::uint32_t node, const install_options& opts);
  /// Uninstalls an EC (also one another client installed). Errors: not_found, timeout (the EC's
  /// handlers are still running: it keeps draining; try again).
  result<void> uninstall(const ec& e);

  /// Opens the event ring of EC `e` with room for `capacity` events (rounded up to a power of
  /// two, 1..2^24). One ring per EC. Errors: not_found (no such EC), exists (the EC already has
  /// a ring), invalid_argument, no_memory.
  result<event_queue> open_events(const ec& e, std::uint32_t capacity);
  /// Closes the ring of EC `e` on the server side (the event_queue stops receiving). Errors:
  /// not_found (no ring).
  result<void> close_events(const ec& e);

  /// Sends a message from node `node`'s NIC; returns once the NIC copied it: a message of at most
  /// post_inline_bytes is posted (copied at once and sent as soon as the transmit queue has room,
  /// as a doorbell; `timeout` does not apply), a larger one waits up to `timeout` (at most 600 s)
  /// for room in the transmit queue. The buffer may be reused when this returns. Errors: those
  /// of nic_control::post and send (not_found, out_of_bounds, invalid_argument, timeout),
  /// invalid_argument (timeout out of range).
  result<void> send(std::uint32_t node, const message& m, std::chrono::milliseconds timeout = std::chrono::seconds(5));

  /// Node `node`'s slot pool (its group registry, spin/emu/groups.hpp), first resized to `set`
  /// when given. Errors: not_found (no such node), those of emu::group_registry::pool.
  result<pool_usage> group_pool(std::uint32_t node, const std::optional<slot_pool>& set = std::nullopt);
  /// Member `me` of j.members asks to join j.group on node `node`; asking again polls. The
  /// join is this connection's: closing the connection leaves. With j.via, node `node` asks the
  /// switch of that rank in-band (its group agent, spin/emu/group_agent.hpp). Errors: not_found,
  /// those of emu::group_registry::join and emu::group_agent::join, not_supported (j.via on a
  /// spin-emu that runs no group agents).
  result<group_answer> join_group(std::uint32_t node, const group_join& j, std::uint32_t me);
  /// The installer's decision (with d.via: only a refusal, sent in-band). Errors: not_found,
  /// those of emu::group_registry::decide and emu::group_agent::give_up.
  result<void> decide_group(std::uint32_t node, const group_decision& d);
  /// Member `me` leaves `group` on node `node`. Errors: not_found (no such node).
  result<void> leave_group(std::uint32_t node, std::uint32_t group, std::uint32_t me,
                           std::uint32_t via = group_join::own_registry);

  /// Every node's statistics (spin/host/stats.hpp), in node order; host::to_json and to_text
  /// print them. Errors: those of every call, and bad_state when the server's statistics lack
  /// a counter this client knows (a server of another version; the message names it).
  result<std::vector<node_stats>> stats();

  /// Asks spin-emu to stop (its on_stop runs after the reply).
  result<void> stop_emulator();

  // ---- virtual time (spin-emu --virtual-time; docs/virtual-time.md) --------------------------

  /// True when the server's NICs are in virtual time ("hello" said so). A host program there
  /// attaches every connection it drives NICs through (attach) and waits through the server
  /// (wait_events, sleep_for): the simulation moves virtual time only while every attached
  /// program waits in such a request, and the event ring gets events only from them.
  bool virtual_time() const noexcept { return _virtual; }
  /// Makes this connection's process the host program of node `node` in virtual time
  /// (protocol::attach): the process's requests run one at a time with the other programs',
  /// ordered by virtual time. Every connection of the process attaches; the first naming a host
  /// node binds the process to that node's actor. From here on this client waits for its
  /// replies without a limit (the simulation, not the wall clock, decides when a request runs;
  /// a call fails only when the server closes the connection). Returns the virtual time.
  /// Errors: not_supported (a wall-clock server), not_found (no such node), exists (another
  /// process drives that host node, or this connection attached already), bad_state (the
  /// server is stopping).
  result<std::chrono::nanoseconds> attach(std::uint32_t node);
  /// Waits up to `timeout` (virtual) for events of EC `e`, at most `max_events`
  /// (1..protocol::max_wait_events); the server moves them into the EC's ring before replying,
  /// and this returns how many it moved (read them with event_queue::wait_burst and a zero
  /// timeout). Errors: bad_state (not attached to a host node), not_found (no such EC or its
  /// ring is not open), not_supported (a wall-clock server), invalid_argument.
  result<std::uint32_t> wait_events(const ec& e, std::uint32_t max_events, std::chrono::nanoseconds timeout);
  /// Waits `d` of virtual time on node `node` (nic_control::sleep_for). Errors: as wait_events.
  result<void> sleep_for(std::uint32_t node, std::chrono::nanoseconds d);
  /// Charges the host model's time for `bytes` of `op` on node `node` (nic_control::charge_host).
  /// Errors: as wait_events.
  result<void> charge_host(std::uint32_t node, work op, std::uint64_t bytes);
  /// Waits in virtual time until the host programs of every node in `members` (host node
  /// indexes of this server, `node` among them) have called barrier with the same members and
  /// `seq`; all return at the virtual time the last one called (protocol::barrier). For a
  /// program that also synchronises with the others outside spin: call it before the outside
  /// wait (an MPI collective), which then ends without the simulation having to move. Members
  /// must number each barrier over the same members alike (a counter per member set). Errors:
  /// as wait_events; invalid_argument (a node twice, a node without a host program, `node`
  /// missing), bad_state (also: a member's program left), timeout (100 virtual days passed).
  result<void> barrier(std::uint32_t node, std::vector<std::uint32_t> members, std::uint64_t seq);
  /// barrier with `seq` numbered by this client: the next of its barriers over the same member
  /// set (in any order). For a process that makes all its barriers through one client (each
  /// member then counts the same barriers alike).
  result<void> barrier(std::uint32_t node, std::vector<std::uint32_t> members);
  // Point-to-point messages whose bytes travel outside spin (libspin-mpi's MPI_Send and
  // MPI_Recv), made visible to the simulation so a receive ends at the virtual time its
  // message arrives (protocol::p2p_send and the rest; docs/virtual-time.md, "MPI programs").
  // Common errors: those of wait_events; invalid_argument (a node without a host program),
  // exists (an id that is pending already), not_found (an id that is not pending).

  /// Tells the simulation that node `node`'s program sends `bytes` bytes with `match_bits` to
  /// host node `dest`. `sync` 0: complete at once; else an id for p2p_wait, complete when a
  /// receive has matched the message and word of it has come back. Returns at once.
  result<void> p2p_send(std::uint32_t node, std::uint32_t dest, std::uint64_t match_bits, std::uint64_t bytes,
                        std::uint64_t sync = 0);
  /// Posts receive `id` (not 0) for a message from host node `source` (or protocol::any_source)
  /// whose match bits equal `match_bits` except where `ignore_bits` is set. Returns at once.
  result<void> p2p_recv(std::uint32_t node, std::uint64_t id, std::uint32_t source, std::uint64_t match_bits,
                        std::uint64_t ignore_bits);
  /// Waits in virtual time, up to `timeout`, until `need` of `ids` are complete, and returns
  /// every one complete by then (each once). A zero `timeout` tests without waiting (fewer than
  /// `need`, even none, is then no error). Errors: also timeout (fewer than `need` by the
  /// deadline; they stay pending).
  result<std::vector<protocol::p2p_match>> p2p_wait(std::uint32_t node, std::vector<std::uint64_t> ids, std::uint32_t need,
                                                    std::chrono::nanoseconds timeout);
  /// Waits in virtual time, up to `timeout` (0: look only), for a message that has arrived and
  /// that no receive has taken, from `source` with `match_bits` under `ignore_bits`; returns
  /// the first in arrival order, or nullopt.
  result<std::optional<protocol::p2p_match>> p2p_probe(std::uint32_t node, std::uint32_t source, std::uint64_t match_bits,
                                                       std::uint64_t ignore_bits, std::chrono::nanoseconds timeout);

  /// While any client of this process waits for a reply, `hook` runs every `every` of wall-clock
  /// time on the waiting thread (empty: none). For a program that must keep another library
  /// moving while it waits in virtual time: libspin-mpi progresses its buffered MPI sends, also
  /// while spin::coll's own clients wait (a rank that receives them may hold the simulation in
  /// MPI until they move). Set it before any client waits; the hook must not use a client.
  static void set_while_waiting(std::function<void()> hook, std::chrono::milliseconds every);

  /// The virtual time (since the simulation began) that the last attach, wait, sleep, charge or
  /// barrier reply of any client of this process to the same server gave: between two of its waits a
  /// host program takes no virtual time, so this is the simulation's time whenever the program
  /// runs. 0 before the first attach. Any thread.
  std::chrono::nanoseconds virtual_now() const noexcept;

  /// Sends one raw request line (a JSON object without the trailing newline; an "id" is
  /// not added) with optional file descriptors, and returns the raw reply line. For tools and
  /// tests of the protocol itself. Errors: bad_state (connection closed), timeout.
  result<std::string> raw_request(const std::string& line, std::span<const int> fds = {});

private:
  client(int fd) : _fd(fd) {}
  result<void> clocked(const protocol::request& req, std::uint32_t* events = nullptr);
  struct reply_line {
    std::string text;
    std::vector<int> fds;  // owned by the caller
  };
  /// Sends `line` (plus newline) with `fds` and reads one reply line with the descriptors that
  /// came with it, waiting up to the reply timeout plus `extra`.
  result<reply_line> exchange(const std::string& line, std::span<const int> fds, std::chrono::milliseconds extra);
  /// Sends `req` with a fresh id, reads its reply and decodes it as R: the result, or the
  /// server's error. A reply to another request closes the connection.
  template <class R> result<R> call(const protocol::request& req, std::span<const int> fds = {},
                                    std::chrono::milliseconds extra = std::chrono::milliseconds(0),
                                    std::vector<int>* fds_out = nullptr);
  void close_fd() noexcept;
  int _fd = -1;
  std::uint64_t _next_id = 1;
  std::string _in;  // bytes after the last reply line
  std::chrono::milliseconds _reply_timeout{std::chrono::seconds(30)};
  bool _virtual = false;
  std::string _socket;                              // as connect was given it
  std::shared_ptr<std::atomic<std::int64_t>> _clock;  // the process's virtual clock of this server (attach)
  std::map<std::vector<std::uint32_t>, std::uint64_t> _barriers;  // barriers so far, per member set
};

} // namespace spin::host
