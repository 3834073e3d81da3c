// Host programs in other processes as actors of a simulated cluster: the request scheduler of
// spin-emu's control server in virtual time (spin-emu --virtual-time; docs/virtual-time.md,
// "Host programs in other processes").
//
// Each host node in `hosts` has an actor per round. A process whose connection attaches naming
// that node is bound to it; from then on the requests of every attached connection of that
// process run on the actor's thread, one at a time, and a "wait" or "sleep" among them is the
// actor's wait in virtual time. While the process computes between two requests the actor holds
// the simulation (conservative synchronisation: virtual time moves only while every bound
// process waits in a request, and before that, while some host node has no process yet, it
// does not move at all). So a run's timings depend on what the programs ask and in which order,
// never on the wall clock, as with in-process actors (cluster::spawn).
//
// Requests of connections that did not attach (spinctl), and of attached connections whose
// process is not bound yet (a fabric's connection to a switch, opened before the rank's own
// NIC), run where the simulation is stopped: on the thread of the actor that holds it while it
// waits for its process, or between events (cluster::set_between_events).
//
// A round ends when every bound process has closed its attached connections and no event is
// left (cluster::run returns); spin-emu then starts the next round on the same clock.
#pragma once

#include <spin/emu/control.hpp>
#include <spin/result.hpp>
#include <spin/sim/cluster.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace spin::sim {

/// What remote_hosts served (a snapshot).
struct remote_stats {
  std::uint64_t rounds = 0;      ///< rounds whose actors all returned
  std::uint64_t processes = 0;   ///< processes bound to a host node so far
  std::uint64_t actor_requests = 0;  ///< requests run on the actors
  std::uint64_t other_requests = 0;  ///< requests of connections that were not bound, run where the simulation stood still
  std::uint64_t p2p_messages = 0;    ///< p2p_send envelopes sent
  std::uint64_t p2p_matched = 0;     ///< of those, matched by a receive
  std::uint64_t p2p_dropped = 0;     ///< of those, dropped: their destination's program had left when they arrived
};

class remote_hosts final : public emu::request_scheduler {
public:
  /// Schedules the control requests of host programs that drive nodes `hosts` of `c` (node
  /// indexes, topology order; each must be a host node, no repeats, at least one). `c` must
  /// outlive this object. Errors: invalid_argument (the message names the node).
  static result<std::unique_ptr<remote_hosts>> create(cluster& c, std::vector<std::uint32_t> hosts);
  ~remote_hosts() override;
  remote_hosts(const remote_hosts&) = delete;
  remote_hosts& operator=(const remote_hosts&) = delete;

  /// Spawns this round's actors, one per host node, each waiting for its process. Call before
  /// cluster::run, from the thread that calls it, and again after run returned for the next
  /// round. Counts the round that ended (remote_stats::rounds) from the second call on.
  void spawn_round();
  /// Stops: actors waiting for a process or for its next request return (their processes get
  /// bad_state from then on), later submits are refused and releases dropped. An actor inside a
  /// request ends it first (a wait ends at its virtual deadline). Any thread; idempotent.
  void stop();
  /// Host nodes without a bound process in this round (for a progress line). Any thread.
  std::vector<std::uint32_t> unbound() const;
  remote_stats stats() const;

  // emu::request_scheduler
  bool submit(std::uint64_t session, std::function<void()> job) override;
  void closed(std::uint64_t session, std::function<void()> release) override;
  result<void> attach(std::uint64_t session, pid_t pid, std::uint32_t node) override;
  bool may_wait(std::uint64_t session) const noexcept override;
  /// The meeting (cluster::meet) of the bound programs of `nodes` for `seq`; a program that
  /// leaves its round cancels the meetings that wait for it.
  result<void> barrier(std::uint64_t session, std::vector<std::uint32_t> nodes, std::uint64_t seq,
                       const std::function<void()>& reply) override;
  /// Point-to-point envelopes: matched per destination slot (posted receives in post order,
  /// unexpected messages in arrival order). A message's bytes, and a synchronous send's
  /// acknowledgement, cross the network as host traffic (cluster::send_host_traffic); an
  /// envelope arrives with its last byte, after every earlier one of its sender to the same
  /// node. A program that leaves drops what waits for it; a message for it is dropped on
  /// arrival (remote_stats::p2p_dropped).
  result<void> p2p_send(std::uint64_t session, const host::protocol::p2p_send& q) override;
  result<void> p2p_recv(std::uint64_t session, const host::protocol::p2p_recv& q) override;
  result<std::vector<host::protocol::p2p_match>> p2p_wait(std::uint64_t session, const host::protocol::p2p_wait& q) override;
  result<std::vector<host::protocol::p2p_match>> p2p_probe(std::uint64_t session, const host::protocol::p2p_probe& q) override;

  struct state;

private:
  remote_hosts(cluster& c, std::vector<std::uint32_t> hosts);
  std::unique_ptr<state> _s;
};

} // namespace spin::sim
