// The control socket of spin-emu: a Unix domain stream socket on which the host library
// (spin::host) and spinctl register host memory, install and remove ECs, open event rings, send
// messages, read statistics and stop the emulator. This comment is the protocol's reference.
//
// Protocol (version 1). Newline-delimited JSON: each request is one JSON object on one line,
// each reply one object on one line, in request order. Requests: {"id": <0..2^63-1>, "op": "<name>",
// ...fields}; replies: {"id": <same>, "ok": true, ...results} or {"id": <same>, "ok": false,
// "error": {"code": "<spin::errc name>", "message": "..."}} ("id" is null when the request had
// no usable id). File descriptors travel as SCM_RIGHTS ancillary data of the sendmsg that
// carries the request or reply line (the client sends a line and its descriptors in one
// sendmsg). Operations (node: index into nodes; integers are non-negative JSON integers; ids
// and ranks are u32, sizes, offsets and match bits u64):
//
//   hello                                  -> protocol (1), server ("spin-emu"), nodes (count)
//   nodes                                  -> nodes: [{node, name, rank}]
//   register   node, bytes       + 1 fd    -> region      (fd: a memfd of at least `bytes` bytes)
//   unregister node, region                -> {}
//   install    node, package, name, match {bits, ignore_mask}
//              [handler_mem_bytes, scratchpad_bytes, window {region, offset_bytes, len_bytes},
//               limits {max_messages, retired_history, window_packets, max_parked_packets,
//               handler_budget_ns, event_queue_depth, read_only_multicast (bool)},
//               scratchpad ("zeroed"|"undefined"), bpf ("jit"|"interpreter"), persist (bool)]
//                                          -> ec
//   uninstall  node, ec                    -> {}
//   events     node, ec, capacity          -> capacity, bytes  + 1 fd (the event ring memfd)
//   close_events node, ec                  -> {}
//   send       node, dest_rank, match_bits, message_id, region, offset_bytes, len_bytes,
//              timeout_ms                  -> {}   (up to host::post_inline_bytes: posted, see
//                                                   nic_control::post; larger: nic_control::send)
//   stats                                  -> stats: [{node, name, rank, stats: <stats_json>}]
//   stop                                   -> {}   (then server_options::on_stop runs)
//   group_pool   node, [set {slots, slot_bytes}]
//                                          -> slots, slot_bytes, free, groups, waiting
//   group_join   node, group, members [u32], slots, proof (u64), me, [packet_bytes, via]
//                                          -> state ("install"|"wait"|"granted"|"refused"),
//                                             lease [u32], reason, installer (bool)
//   group_decide node, group, granted (bool), lease [u32], reason, [via]
//                                          -> {}
//   group_leave  node, group, me, [via]    -> {}
//              (the node's group registry, spin/emu/groups.hpp: the slot pool that groups of
//               every connection share; a connection's joins are its own and leave with it.
//               With "via" (a switch's rank), the node's group agent asks that switch in-band:
//               spin/emu/group_agent.hpp; not_supported when the server has no agent for it)
//
// Access. The socket file is mode 0600 and every connection's peer user (SO_PEERCRED) must be
// server_options::allowed_uid; anyone else gets one reply with error code "permission" (the one
// code that is not an errc name) and is disconnected.
//
// Validation. A request is checked completely before anything happens: a line that is not
// UTF-8 JSON, not an object, has an unknown op, an unknown or missing key, a value of the wrong
// type or out of range, or file descriptors it does not expect gets an invalid_argument reply
// and changes nothing (a node index past the list gets not_found); the connection stays usable. A line longer than max_request_bytes gets an
// invalid_argument reply and the connection is closed. Errors of the NIC pass through with their
// errc name and message.
//
// Session ownership. What a connection creates belongs to it: when it closes, its group joins
// leave (emu::group_registry::release), its event rings are closed, its ECs uninstalled and its regions unregistered, in that order. An install with
// "persist": true (spinctl installs that way) outlives the connection; a region that still holds
// a persistent EC's window is kept until that EC is uninstalled (by anyone), then unregistered.
// Any connection may uninstall any EC and open events of any EC (all peers are the same user).
// "unregister" accepts only regions registered through the socket. When the server stops, it
// uninstalls every EC it installed (persistent ones too: their regions are mapped by the
// server) and unregisters its regions.
//
// Virtual time (server_options::scheduler; docs/virtual-time.md):
//   attach     node                        -> now_ns, events (0)
//   wait       node, ec, max_events, timeout_ns
//                                          -> now_ns, events (moved into the EC's ring)
//   sleep      node, ns                    -> now_ns, events (0)
//   charge     node, work ("copy"|"reduce"), bytes
//                                          -> now_ns, events (0)
//   barrier    node, members [u32], seq (u64)
//                                          -> now_ns, events (0)
//              (request_scheduler::barrier: waits until the host programs of every node in
//               members have asked for barrier seq over the same members)
//   p2p_send   node, dest, match_bits, bytes, sync (u64; 0: buffered)
//                                          -> now_ns, events (0)
//   p2p_recv   node, recv (u64 id, not 0), source (u32; 4294967295: any), match_bits,
//              ignore_bits                 -> now_ns, events (0)
//   p2p_wait   node, ids [u64], need, timeout_ns
//                                          -> now_ns, done [{id, source, match_bits, bytes, order}]
//   p2p_probe  node, source, match_bits, ignore_bits, timeout_ns
//                                          -> now_ns, done [{id (0), source, match_bits, bytes, order (0)}]
//              (request_scheduler::p2p_send and the rest; envelopes only, the bytes travel
//               outside spin)
//              ("hello" adds virtual_time: true; a wall-clock server refuses these nine with
//               not_supported, and all but attach need an attached connection whose process
//               is bound to a host node: bad_state otherwise)
//
// Events. A pump on the server thread moves events from nic_control::poll_events into each
// open ring every 100 microseconds (bursts of up to 256 per EC), so an event reaches the host
// at most ~100 us plus the consumer's polling interval after the handler posted it. When the
// ring is full the rest of the burst is dropped and counted in the ring's header.
#pragma once

#include <spin/emu/group_agent.hpp>
#include <spin/emu/nic_control.hpp>
#include <span>
#include <spin/host/protocol.hpp>
#include <spin/result.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <sys/types.h>
#include <unistd.h>

namespace spin::emu {

/// Version of the control protocol this server speaks ("hello" returns it).
inline constexpr int control_protocol_version = host::protocol::version;

/// Where a control server runs its requests when its NICs are in virtual time (spin-emu
/// --virtual-time): spin::sim's remote host programs (spin/sim/remote.hpp) run the requests of
/// each attached process on that process's actor, in virtual-time order, and the others' where
/// the simulation is stopped. Without one, requests run on the server's worker threads.
/// Every member is called from the server's threads and must be thread-safe.
class request_scheduler {
public:
  /// A host program's wait or sleep in virtual time lasts at most this long (longer ones are
  /// cut to it): every wait has a deadline, so a program that waits for an event that never
  /// comes on an idle cluster gets its answer (none) instead of stopping the simulation.
  static constexpr std::chrono::hours max_wait{24 * 100};

  virtual ~request_scheduler() = default;
  /// Runs `job`, one request of connection `session` (it replies itself), on a thread that may
  /// use the NICs. A session's jobs come one at a time. Returns false, without running it, once
  /// the scheduler has stopped (the server then replies bad_state).
  virtual bool submit(std::uint64_t session, std::function<void()> job) = 0;
  /// Connection `session` closed; `release` frees what it owned and runs as the session's last
  /// job (dropped once the scheduler has stopped: control_server::stop releases everything).
  virtual void closed(std::uint64_t session, std::function<void()> release) = 0;
  /// "attach": connection `session` of process `pid` drives node `node` in virtual time.
  /// Called from a job of that session. Errors: its own (exists, not_found, bad_state).
  virtual result<void> attach(std::uint64_t session, pid_t pid, std::uint32_t node) = 0;
  /// True when the calling thread runs `session`'s requests as a host program bound to an
  /// actor: only such a request may wait in virtual time (wait, sleep, charge).
  virtual bool may_wait(std::uint64_t session) const noexcept = 0;
  /// "barrier": the calling host program (connection `session`, on the thread that runs its
  /// requests: may_wait) waits in virtual time until the programs of every host node in `nodes`
  /// (its own included) have asked for barrier `seq` over the same nodes; all go on at the
  /// virtual time the last one asked. The wait of a program that synchronises with the others
  /// outside spin (libspin-mpi's MPI collectives), made visible to the simulation. Errors:
  /// invalid_argument (a node twice, a node no host program can drive, its own node missing),
  /// bad_state (not bound; a member's program left, before or during the wait), timeout
  /// (max_wait passed). `reply` sends this member's success reply: on success it has been
  /// called, once, by the thread of the member that came last, at the virtual time the barrier
  /// ended and before any member goes on (each member's process must learn it at once: the
  /// one whose actor runs first holds the simulation until its process's next request, which
  /// may come only after an MPI call that needs every member). Not called on failure.
  virtual result<void> barrier(std::uint64_t session, std::vector<std::uint32_t> nodes, std::uint64_t seq,
                               const std::function<void()>& reply) = 0;

  // Point-to-point messages of host programs that move their bytes outside spin (libspin-mpi's
  // MPI_Send and MPI_Recv), made visible to the simulation (protocol::p2p_send and the rest
  // give the semantics). Each is called from a job of `session`, on the thread that runs its
  // requests (may_wait). Common errors: bad_state (not bound to a host node), invalid_argument
  // (a node that has no host program), exists (an id that is pending already), not_found (an
  // id that is not pending).

  /// "p2p_send": the message leaves now; its bytes cross the network as packets (in spin::sim:
  /// cluster::send_host_traffic) and its envelope arrives with the last of them, after every
  /// earlier message of the same sender to the same node.
  virtual result<void> p2p_send(std::uint64_t session, const host::protocol::p2p_send& q) = 0;
  /// "p2p_recv": posts a receive; it matches at once a message that has arrived and waits.
  virtual result<void> p2p_recv(std::uint64_t session, const host::protocol::p2p_recv& q) = 0;
  /// "p2p_wait": waits (q.timeout, cut to max_wait) until q.need of q.ids are complete; returns
  /// every one complete by then. Errors: also timeout (fewer than q.need by the deadline, when
  /// the timeout is not 0: the ones complete stay pending), bad_state (spin-emu is stopping).
  virtual result<std::vector<host::protocol::p2p_match>> p2p_wait(std::uint64_t session, const host::protocol::p2p_wait& q) = 0;
  /// "p2p_probe": waits (q.timeout, cut to max_wait) for a matching message that has arrived
  /// and was not received; returns it (id 0), or nothing when the timeout passed.
  virtual result<std::vector<host::protocol::p2p_match>> p2p_probe(std::uint64_t session, const host::protocol::p2p_probe& q) = 0;
};

/// How a control server is built.
struct server_options {
  /// Path of the Unix socket (at most 107 bytes). Must not exist, or be a stale socket that no
  /// server listens on (it is then replaced).
  std::string socket_path;
  /// The NICs this server controls; request field "node" indexes this list. Not owned: they
  /// must outlive the server.
  std::vector<nic_control*> nodes;
  /// Called once for each "stop" request, on the server thread, after the reply was sent. It
  /// must not stop or destroy the server (that would wait for its own thread); signal the main
  /// thread instead. May be empty (then "stop" only replies).
  std::function<void()> on_stop;
  /// The only user id allowed to connect (SO_PEERCRED); others get one permission error reply
  /// and are disconnected.
  uid_t allowed_uid = ::geteuid();
  /// Longest request line (bytes, newline excluded).
  std::size_t max_request_bytes = 64 * 1024;
  /// Connections open at once; one more gets a no_space error reply and is closed.
  std::size_t max_connections = 64;
  /// Threads that run requests (NIC operations block: a send may wait for its timeout). Requests
  /// of one connection run one after the other; different connections run in parallel.
  std::uint32_t workers = 2;
  /// Which native (x86-64) packages "install" loads. Native handlers run in this process with
  /// its whole address space: on a switch that several jobs share, one group's user reduction
  /// could read or corrupt another group's slots, or crash the switch for everyone. eBPF
  /// packages run under rte_bpf and are always accepted.
  enum class native_policy {
    any,      ///< every native package (a NIC, or a switch one job owns)
    trusted,  ///< only packages byte-identical to one of trusted_packages (a shared switch)
  };
  native_policy native = native_policy::any;
  /// The packages native_policy::trusted accepts (spin-emu: the standard collective engine it
  /// was built with). Not owned: the bytes must outlive the server.
  std::vector<std::span<const std::byte>> trusted_packages;
  /// Each node's group agent (in-band joins: requests with "via"), by node index; missing or
  /// null: that node has none. Not owned: they must outlive the server.
  std::vector<group_agent*> agents;
  /// Virtual time: where requests run (above); "hello" then says virtual_time, the event pump
  /// is off (events reach a ring only through "wait"), and attach, wait, sleep and charge are
  /// served. Null: wall-clock time, and those four are refused with not_supported. Not owned:
  /// it must outlive the server, and control_server::stop, which releases what the sessions
  /// left on the NICs from the calling thread, must be called while no simulation runs.
  request_scheduler* scheduler = nullptr;
};

class control_server_impl;

/// A running control server: an accept loop and connections on its own thread (Boost.Asio),
/// requests on `workers` threads. Thread-safe: stop() and the destructor may be called from any
/// thread except the server's own (on_stop).
class control_server {
public:
  /// Creates the socket (mode 0600, set before it listens), starts the server thread and
  /// returns. Errors: invalid_argument (empty or too long socket path, no nodes, a null node,
  /// max_request_bytes 0, workers 0), exists (the path exists and is not a socket, or a server
  /// answers on it), bad_state (bind, chmod or listen failed; the message quotes errno).
  static result<std::unique_ptr<control_server>> start(server_options opts);

  /// Stops the server (as stop()).
  ~control_server();
  control_server(const control_server&) = delete;
  control_server& operator=(const control_server&) = delete;

  /// Closes the listening socket and every connection, releases every session's resources as
  /// if each connection had closed (persistent ECs stay installed), joins the threads and
  /// removes the socket file if it is still the one this server created. Idempotent.
  void stop();

  /// Path of the socket.
  const std::string& socket_path() const noexcept;

  /// Connections open now (for tests and statistics).
  std::size_t connections() const;
  /// Regions, ECs and event rings the server tracks now (persistent ones included).
  struct tracked {
    std::size_t regions = 0;
    std::size_t ecs = 0;
    std::size_t rings = 0;
  };
  /// Snapshot of what the server tracks.
  tracked tracked_objects() const;

private:
  explicit control_server(std::unique_ptr<control_server_impl> impl);
  std::unique_ptr<control_server_impl> _impl;
};

} // namespace spin::emu
