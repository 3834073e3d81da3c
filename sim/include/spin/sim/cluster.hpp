// Virtual time: a whole cluster (hosts' sPIN NICs, switches, links) as a discrete-event
// simulation in one process (docs/virtual-time.md).
//
// What runs is what runs in wall-clock mode: every node has a real spin::rt::runtime, which
// runs the real handlers (their counted objects, spinc --count-instructions) on real frames,
// and host programs (spin::coll communicators included) drive the nodes through
// emu::nic_control as they drive spin-emu's. What changes is the clock: each event (a frame's
// last byte at a port, an HPU starting a packet, a DMA completing, a host waking) happens at a
// virtual time the models give, in picoseconds, and events run one at a time in (time, order of
// scheduling) order. The same inputs give the same timings on any machine under any load.
//
// The models (emu::nic_model, emu::switch_model, emu::link_model; the topology file's [nic],
// [switch_nic], [switch_model] and link keys):
//  - a link direction is a port's egress queue (queue_packets, tail drop) feeding a wire with
//    LogGP costs: a packet of s bytes starts when the wire is free, occupies it max(g, s*G),
//    arrives s*G + L after its start (G = 8/rate_gbps ns per byte, g = gap_ns, L = latency_ns);
//    loss, duplication and reordering as in wall-clock mode, from the link's seed;
//  - a switch forwards a frame for another rank to its egress port after switch_model::latency;
//    a frame for the switch itself goes to its handler unit (switch_nic), which is a NIC model;
//  - a NIC: a packet that arrives takes room in the L2 packet buffer (dropped when full), after
//    the scheduler latency and its copy into L1 (one copy engine per cluster) it queues for an
//    HPU of its message's home cluster (runtime::hpu_of), and an HPU runs its handlers: each
//    invocation costs invocation_cycles + its counted instructions x cpi + command_cycles per
//    command, and waits for blocking DMAs (one DMA engine: pcie_latency, pcie_gbps). Payload
//    handlers of a message start after its header handler has ended, and its completion
//    handler after its last payload handler. A handler's sends leave tx_latency after the
//    command; its events reach the host after a DMA of 8 bytes;
//  - a host program (an actor) runs in zero virtual time between its waits; its messages reach
//    the NIC pcie_latency after the doorbell, their payload by DMA (inline up to 256 bytes);
//  - a host's own traffic (send_host_traffic: MPI's messages) takes the same DMA engines, port
//    queues and links, past the HPUs, and is never lost.
//
// Threads. One thread runs the simulation: the thread in run(), or the thread that waits on a
// NIC (wait_events) while no actor exists. Host programs run as actors (spawn): each on a thread
// of its own, but only one thread at a time runs, handing over to the next at each wait, so the
// order of everything is decided by virtual time alone.
#pragma once

#include <spin/emu/nic_control.hpp>
#include <spin/emu/topology.hpp>
#include <spin/result.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace spin::sim {

/// Virtual time in picoseconds since the simulation began.
using picoseconds = std::chrono::duration<std::uint64_t, std::pico>;

/// How a simulated cluster is built (the topology gives nodes, links and models).
struct options {
  /// Largest payload of one packet (bytes) a node's handlers and host messages send. 64..9000.
  std::uint32_t payload_bytes = 4096;
  /// Every `sample_interval` of virtual time, a row of the queue depths (every port, every
  /// NIC's packet buffer and waiting packets) is recorded (cluster::samples); 0: none.
  picoseconds sample_interval{0};
  /// Rows kept at most; later ones are counted as dropped_samples.
  std::uint32_t max_samples = 100000;
};

/// Histogram of durations (ps), with the runtime's log-linear buckets (8 per power of two,
/// rt::detail::latency_histogram). Single writer: the simulation thread.
struct histogram {
  std::vector<std::uint64_t> buckets = std::vector<std::uint64_t>(64 * 8, 0);
  std::uint64_t count = 0;
  std::uint64_t max = 0;
  long double sum = 0;
  void add(std::uint64_t v) noexcept;
  /// The value below which a fraction `q` (0..1) of the recorded values lie (a bucket's upper
  /// end, so at most 1/8 above the true value; never above max); 0 when empty.
  std::uint64_t quantile(double q) const noexcept;
  double mean() const noexcept { return count ? static_cast<double>(sum / count) : 0.0; }
};

/// Why the simulation dropped a frame.
enum class drop : std::uint8_t {
  packet_buffer_full,  ///< a NIC's L2 packet buffer had no room for an arriving packet
  queue_full,          ///< an egress port held queue_packets frames (a handler's send gets no_space)
  link_loss,           ///< the link model lost it (link_model::loss)
  unroutable,          ///< no route to the destination rank
  frame_too_large,     ///< a host message or handler send whose frame exceeds the payload limit
  count_
};
inline constexpr std::size_t drop_count = static_cast<std::size_t>(drop::count_);
const char* drop_name(drop d) noexcept;

/// One node's NIC in virtual time.
struct node_stats {
  std::string name;
  std::uint32_t rank = 0;
  bool is_switch = false;
  std::uint64_t packets_in = 0, bytes_in = 0;  ///< frames for this node that reached its NIC
  std::uint64_t forwarded = 0;                  ///< transit frames sent on
  std::uint64_t handled = 0;                    ///< packets an HPU ran
  std::uint64_t moved = 0;                      ///< of those, run by another cluster than the message's home (its HPUs were all busy)
  std::uint64_t invocations = 0;                ///< handler invocations
  std::uint64_t instructions = 0;               ///< counted instructions of all invocations
  std::uint64_t host_packets = 0;               ///< packets of host messages
  std::array<std::uint64_t, drop_count> drops{};
  picoseconds hpu_busy{0};      ///< sum over HPUs of the time they ran handlers
  std::uint32_t hpus = 0;       ///< clusters x HPUs per cluster
  picoseconds dma_busy{0};      ///< time the DMA engine moved bytes (both directions together: up to twice the time)
  std::uint64_t dma_bytes = 0;
  std::uint64_t packet_buffer_max = 0;  ///< bytes, high-water mark
  std::uint32_t waiting_max = 0;        ///< packets waiting for an HPU, high-water mark (all clusters)
  /// Per packet: from its last byte at the NIC to the end of its handlers (ps).
  histogram latency;
  /// Per packet: from its last byte at the NIC to the start of its handlers (ps).
  histogram wait;
};

/// One egress port (one direction of a link).
struct port_stats {
  std::string from, to;
  std::uint64_t packets = 0, bytes = 0;  ///< sent on the wire
  std::uint64_t dropped_queue_full = 0, dropped_loss = 0;
  std::uint32_t depth_max = 0;           ///< frames queued, high-water mark
  double depth_mean = 0;                 ///< frames queued, averaged over time
  picoseconds busy{0};                   ///< time the wire was occupied
};

/// A snapshot.
struct cluster_stats {
  picoseconds now{0};
  std::uint64_t events = 0;       ///< events run so far
  std::uint64_t actor_switches = 0;  ///< hand-overs to actors
  std::vector<node_stats> nodes;  ///< topology order
  std::vector<port_stats> ports;  ///< two per link: a->b, then b->a
};
/// Text tables (one row per node, one per port with traffic) and JSON.
std::string to_text(const cluster_stats& s);
std::string to_json(const cluster_stats& s);

/// One row of cluster::samples: queue depths at `at`.
struct sample {
  picoseconds at{0};
  std::vector<std::uint32_t> port_depth;        ///< frames queued, per port (cluster_stats::ports order)
  std::vector<std::uint64_t> packet_buffer;     ///< bytes, per node
  std::vector<std::uint32_t> waiting;           ///< packets waiting for an HPU, per node
  std::vector<std::uint32_t> busy_hpus;         ///< HPUs running handlers, per node
};

/// A simulated cluster.
class cluster {
public:
  /// Builds every node (a runtime in virtual time: runtime_config::observer) and link of `t`,
  /// with its models. Errors: invalid_argument (validate(t)'s message; options out of range),
  /// those of runtime::create.
  static result<std::unique_ptr<cluster>> create(const emu::topology& t, const options& o = {});
  /// Destroys the nodes. No actor may be running (run() has returned).
  ~cluster();
  cluster(const cluster&) = delete;
  cluster& operator=(const cluster&) = delete;

  /// Node `index` of the topology as a NIC host programs drive (hosts first). Its now() is the
  /// virtual clock, its wait_events waits in virtual time. Any thread that is an actor, or the
  /// one thread driving the simulation.
  emu::nic_control& node(std::uint32_t index) noexcept;
  /// The NIC of host `rank`, or null.
  emu::nic_control* host(std::uint32_t rank) noexcept;
  std::uint32_t node_count() const noexcept;
  /// Every node's control interface, in topology order (for coll::fabric::create).
  std::vector<emu::nic_control*> controls();
  const emu::topology& topo() const noexcept;

  /// Runs `body` as an actor: a host program in virtual time, on a thread of its own that only
  /// runs while the simulation hands over to it (run()). Actors start in the order spawned, at
  /// the virtual time run() finds them. Call before run() or from an actor.
  void spawn(std::string name, std::function<void()> body);
  /// Runs the simulation until every actor has returned and no event is left (frames in
  /// flight land, handlers run; a wait that ended early leaves nothing behind). Errors: timeout (virtual time would pass
  /// `limit`; the actors still wait and run() may be called again), bad_state (actors wait for
  /// events none of which can come: the message names them).
  result<void> run(picoseconds limit = picoseconds::max());
  /// Virtual time now.
  picoseconds now() const noexcept;

  /// How a meet ended.
  enum class meet_result : std::uint8_t {
    met,        ///< `count` actors came
    timed_out,  ///< `timeout` passed first
    cancelled,  ///< cancel_meeting, or the cluster is going away
  };
  /// A rendezvous of actors in virtual time: the calling actor waits until `count` actors
  /// (itself included) have called meet with the same `key`; all of them then go on at the
  /// virtual time the last one came, in the order they came (the last one first: it does not
  /// wait). A wait outside the NICs that the simulation can see: spin-emu's "barrier" for host
  /// programs that synchronise through MPI (remote_hosts::barrier). `count` >= 1; callers of
  /// one key must agree on it (the first caller's count holds). Only an actor may call it
  /// (a thread that is not one gets cancelled).
  meet_result meet(const std::string& key, std::uint32_t count, std::chrono::nanoseconds timeout);
  /// Ends every wait in meeting `key` with meet_result::cancelled (one of its members cannot
  /// come: its program left); a later meet of that key starts a new meeting. No meeting of that
  /// key: nothing happens. Only from an actor, or from the thread driving the simulation.
  void cancel_meeting(const std::string& key);
  /// Ends every wait in meeting `key` with meet_result::met: the wake-up of actors that wait
  /// (meet with a count no one reaches) for something the caller decides, such as a message
  /// matching a posted receive (remote_hosts' point-to-point messages). No meeting of that key:
  /// nothing happens. Only from an actor, the thread driving the simulation, or an event's
  /// callback (send_host_traffic's).
  void release_meeting(const std::string& key);
  /// Sends `bytes` bytes of a host's own traffic, not handler work (libspin-mpi's MPI
  /// messages: remote_hosts' point-to-point envelopes), from host node `from` to host node `to`
  /// through the network, and calls `arrived` (as an event on the simulation's thread) when
  /// its last byte is in `to`'s host memory. It travels as max(1, ceil(bytes /
  /// options::payload_bytes)) packets with the largest header (rt::wire::max_overhead), and
  /// leaves as a host message does: the doorbell over PCIe, each packet read by `from`'s DMA
  /// engine, the transmit latency; then the same port queues and links as every frame (so it
  /// contends with spin's packets), and `to`'s DMA engine writes each payload to host memory,
  /// past the HPUs and the packet buffer. It is never dropped: a full queue takes it (as host
  /// messages), and the link model neither loses nor duplicates it (a reliable transport; its
  /// retransmissions are not modelled). Counted in node_stats::host_packets (sender) and
  /// packets_in, bytes_in (receiver). Only from an actor or an `arrived` callback. Errors:
  /// not_found (a node that is not a host, or no route), invalid_argument (2^32 packets or more).
  result<void> send_host_traffic(std::uint32_t from, std::uint32_t to, std::uint64_t bytes, std::function<void()> arrived);
  /// A message's way through the network when nothing else uses it (transfer_time).
  struct transfer {
    picoseconds first{0};     ///< the first packet's last byte at the destination, after it left
    picoseconds gap{0};       ///< the bottleneck gap: one packet after another
    std::uint64_t packets = 1;
    /// The last packet's arrival after the first left.
    picoseconds total() const noexcept { return first + gap * (packets - 1); }
  };
  /// How a message of `bytes` bytes goes from node `from` to node `to` over the routes by the
  /// links' LogGP parameters when nothing else uses them: it travels as
  /// max(1, ceil(bytes / options::payload_bytes)) packets, each with the largest header
  /// (rt::wire::max_overhead); the first packet crosses every hop (s*G + L, plus the forwarding
  /// latency of each switch or host it passes), the others follow it one bottleneck gap
  /// (max over hops of max(g, s*G)) apart. From a node to itself: all 0. The NICs' models take
  /// no part (a host-to-host transfer outside spin: remote_hosts' point-to-point messages).
  /// Errors: not_found (no such node, or no route).
  result<transfer> transfer_time(std::uint32_t from, std::uint32_t to, std::uint64_t bytes) const;
  /// Work that must not overlap the simulation but is not an actor's (spin-emu's control
  /// requests of processes that are not host programs: remote_hosts): run() calls `hook` on its
  /// thread before each event and each hand-over to an actor. It must not wait on a NIC. Set
  /// before run(); empty: none.
  void set_between_events(std::function<void()> hook);

  cluster_stats stats() const;
  /// The queue samples recorded so far (options::sample_interval).
  const std::vector<sample>& samples() const noexcept;

  class impl;

private:
  explicit cluster(std::unique_ptr<impl> p);
  std::unique_ptr<impl> _p;
};

} // namespace spin::sim
