// spin::sim internals: the event queue, frames, ports, NIC state and actors of one simulated
// cluster (cluster.hpp describes the models).
#pragma once

#include <spin/emu/groups.hpp>
#include <spin/emu/link.hpp>
#include <spin/rt/runtime.hpp>
#include <spin/sim/cluster.hpp>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <semaphore>
#include <thread>
#include <unordered_map>
#include <vector>

namespace spin::sim {

using ps = std::uint64_t;  // picoseconds

class vnic;

/// A frame in flight: its bytes and what the simulation knows about it.
struct frame {
  std::byte* data = nullptr;  // capacity: impl::frame_capacity
  std::uint32_t len = 0;
  std::uint32_t dest_rank = 0;
  std::uint32_t cluster = 0;   // home cluster at the receiving NIC
  bool local = false;          // never crossed a link (sent to the sender's own rank)
  ps ready = 0;                // may leave its egress port from then on
  ps arrived = 0;              // last byte at the receiving NIC
  std::uint64_t seq = 0;       // order of creation: ties in port queues
  frame* next = nullptr;       // the list of frames an HPU frees when done (core_done)
  std::uint32_t traffic = 0;   // a packet of host traffic (cluster::send_host_traffic): its key in impl::traffic; 0: a spin frame
};

/// A message of host traffic on its way (cluster::send_host_traffic).
struct host_traffic {
  std::uint64_t left = 0;      // packets not yet in the destination's host memory
  ps last = 0;                 // when the last of those that arrived is there
  std::function<void()> arrived;
};

enum class ev : std::uint8_t {
  arrive,        // a: node, p: frame — last byte at the node
  port_kick,     // a: port — the port may start its next frame
  nic_ready,     // a: node, p: frame — after scheduler and L1 copy: queue for an HPU
  dispatch,      // a: node, b: cluster << 32 | core, p: frame — an HPU starts it (delayed start)
  core_done,     // a: node, b: cluster << 32 | core, p: frames to free (frame::next)
  host_visible,  // a: node, b: ec — an event reached host memory
  actor_timeout, // a: actor, b: token
  sample,        // record queue depths
  call,          // b: key into impl::calls — a callback (host traffic that arrived)
};

struct event {
  ps t;
  std::uint64_t seq;
  ev kind;
  std::uint32_t a;
  std::uint64_t b;
  frame* p;
};

struct event_later {
  bool operator()(const event& x, const event& y) const noexcept { return x.t != y.t ? x.t > y.t : x.seq > y.seq; }
};

/// One direction of a link: the egress queue of `node`'s port `index`.
struct port {
  std::uint32_t node = 0, index = 0;   // the sending node and its port number
  std::uint32_t peer = 0;              // the receiving node
  emu::link_model model;
  double ps_per_byte = 0;              // LogGP G
  ps gap = 0;                          // LogGP g
  ps latency = 0;                      // LogGP L
  ps reorder_delay = 0;
  emu::prng rng{1};
  std::vector<frame*> queue;           // min-heap by (ready, seq)
  ps busy_until = 0;
  ps kick_at = UINT64_MAX;             // the earliest kick scheduled (a later one may be pending too)
  // statistics
  std::uint64_t packets = 0, bytes = 0, dropped_queue_full = 0, dropped_loss = 0;
  std::uint32_t depth_max = 0;
  long double depth_area = 0;  // sum of depth x ps
  ps depth_since = 0;
  ps busy = 0;
};

/// A message whose handlers span several packets: when its header handler ended and its last
/// payload handler ended (the ordering sPIN guarantees, in modelled time).
struct message_times {
  ps header_end = 0;
  ps payload_end = 0;
};

/// What the HPU that runs a packet has done so far (the observer's cursor).
struct dispatch_ctx {
  std::uint32_t node = 0;
  ps cursor = 0;                 // modelled time of the invocation's progress
  std::uint64_t last_instr = 0;  // instructions already charged in the running invocation
  bool in_invocation = false;
  rt::ec_id ec = 0;
  handler_kind kind = handler_kind::payload;
  std::uint64_t msg_key = 0;
  std::uint32_t packet_count = 0;
  ps tx_time = 0;                // when the frames of the last send command leave
  std::vector<std::pair<std::uint64_t, ps>> dmas;  // non-blocking DMAs: id -> completion
  std::vector<frame*> released;  // frames the runtime released: free at the dispatch's end
  std::uint64_t invocations = 0, instructions = 0;
};

struct cluster_state {
  std::vector<ps> core_free_since;  // unused now; kept for occupancy
  std::vector<bool> busy;
  std::deque<frame*> waiting;
  ps copy_free = 0;                  // the cluster's L1 copy engine
};

class impl_node;

/// An actor: a host program's thread, run one at a time.
struct actor {
  std::string name;
  std::function<void()> body;
  std::thread th;
  std::binary_semaphore go{0};
  bool started = false, done = false, runnable = false;
  std::string failure;           // what went wrong in body (an exception), for run()
  std::uint64_t token = 0;       // invalidates a pending timeout when woken
  // what it waits for
  std::int64_t wait_node = -1;   // a node whose EC it waits on; -1: none (or a meeting)
  rt::ec_id wait_ec = 0;
  ps deadline = 0;
  const std::string* meeting = nullptr;  // the meeting it waits in (key held by impl::meetings)
  cluster::meet_result met = cluster::meet_result::met;
};

/// Actors waiting in one meeting (cluster::meet).
struct meeting {
  std::uint32_t count = 0;
  std::vector<actor*> waiting;  // in the order they came
};

class cluster::impl {
public:
  // ---- set-up and state ----
  emu::topology topo;
  options opts;
  emu::routing_table routes;                     // towards hosts
  std::unordered_map<std::uint32_t, std::vector<std::uint32_t>> switch_routes;  // switch rank -> egress port per node
  /// The egress port of node n towards rank `dest` (a host's or a switch's), or nullopt.
  std::optional<std::uint32_t> next_port(std::uint32_t n, std::uint32_t dest) const;
  std::vector<std::unique_ptr<impl_node>> nodes;
  std::vector<port> ports;                       // two per link: a->b at 2l, b->a at 2l+1
  std::vector<std::vector<std::uint32_t>> port_of;  // [node][port number] -> index into ports
  std::uint32_t frame_capacity = 0;

  // ---- events ----
  std::vector<event> heap;
  std::uint64_t next_seq = 0;
  ps now = 0;
  std::uint64_t events_run = 0;
  std::uint64_t live_events = 0;  // pending events other than samples and actor timeouts
  bool sample_armed = false;      // a sample event is pending
  void schedule(ps t, ev k, std::uint32_t a, std::uint64_t b = 0, frame* p = nullptr);
  bool step();  // runs the earliest event; false when none
  void drop_stale();  // pops stale actor timeouts off the front of the heap
  void run_event(const event& e);

  // ---- frames ----
  std::vector<std::unique_ptr<std::byte[]>> buffers;
  std::vector<frame*> free_frames;
  std::deque<frame> frame_store;
  std::uint64_t frame_seq = 0;
  frame* alloc_frame();
  void free_frame(frame* f);

  // ---- network ----
  /// Sends `f` from node `n` towards f->dest_rank: to its own NIC (local) or into the egress
  /// queue of the port the routes give, eligible from f->ready. False: dropped (`why`; the
  /// caller counts and frees). Without `may_drop` a full queue takes it anyway (a host's
  /// messages wait for room in a real NIC; they are never lost).
  bool route(std::uint32_t n, frame* f, drop& why, bool may_drop = true);
  void port_kick(std::uint32_t pi);
  void arrive(std::uint32_t n, frame* f);

  // ---- NICs (nic.cpp) ----
  dispatch_ctx* current = nullptr;  // the dispatch running on the simulation thread
  void nic_ingress(std::uint32_t n, frame* f);
  void nic_ready(std::uint32_t n, frame* f);
  void try_start(std::uint32_t n, std::uint32_t c);   // cluster c's HPUs take its own waiting packets
  void try_take(std::uint32_t n, std::uint32_t c);    // cluster c's idle HPUs take other clusters' waiting packets
  void start_on(std::uint32_t n, std::uint32_t c, std::uint32_t k, frame* f, ps start);
  void dispatch(std::uint32_t n, std::uint32_t c, std::uint32_t k, frame* f);
  void core_done(std::uint32_t n, std::uint32_t c, std::uint32_t k, frame* released);
  ps dma(impl_node& nd, ps t, std::uint64_t bytes, bool to_host);

  // ---- actors (actors.cpp) ----
  std::vector<std::unique_ptr<actor>> actors;
  std::deque<actor*> runnable;
  std::binary_semaphore back{0};     // an actor hands the simulation thread back
  std::size_t alive = 0;
  bool running = false;              // run() is active
  bool cancelling = false;           // the cluster is going away: waits return at once, deadlines have passed
  std::uint64_t switches = 0;
  std::function<void()> between;     // cluster::set_between_events
  void resume(actor& a);
  void make_runnable(actor& a);
  void host_visible(std::uint32_t n, rt::ec_id ec);
  void actor_timeout(std::uint32_t a, std::uint64_t token);
  /// Waits (in virtual time) until node n's EC ec has a visible event or `deadline` passes.
  /// False when the caller cannot wait: a thread that is not an actor while run() runs, the
  /// cluster is being destroyed, or nothing is left that could end a wait without deadline.
  bool wait_visible(std::uint32_t n, rt::ec_id ec, ps deadline);
  std::map<std::string, meeting> meetings;  // cluster::meet, by key
  /// Ends the waits of meeting `it` with `why`, in the order they came, and forgets it.
  void end_meeting(std::map<std::string, meeting>::iterator it, cluster::meet_result why);

  // ---- host traffic (cluster::send_host_traffic) ----
  std::unordered_map<std::uint32_t, host_traffic> traffic;
  std::uint32_t next_traffic = 1;
  void traffic_arrived(std::uint32_t n, frame* f);

  // ---- callbacks run as events (ev::call) ----
  std::unordered_map<std::uint64_t, std::function<void()>> calls;
  std::uint64_t next_call = 0;

  // ---- samples ----
  std::vector<sample> samples;
  std::uint64_t dropped_samples = 0;
  void take_sample();
};

/// A node: its runtime, NIC model state, ports and host interface.
class impl_node {
public:
  cluster::impl* sim = nullptr;
  std::uint32_t index = 0;
  std::uint32_t rank = 0;
  bool is_switch = false;
  std::string name;
  emu::nic_model model;
  double cycle_ps = 1000;  // ps per HPU cycle
  std::unique_ptr<rt::invocation_observer> observer;
  std::unique_ptr<rt::transmitter> tx;
  std::unique_ptr<rt::runtime> rt;
  std::unique_ptr<vnic> control;
  emu::group_registry groups;
  std::vector<cluster_state> clusters;
  std::uint64_t pb_used = 0;
  std::array<std::map<ps, ps>, 2> dma_busy;  // the DMA engine's reserved intervals, [start, end), by start: to the host, from it
  std::unordered_map<std::uint64_t, message_times> messages;
  std::unordered_map<rt::ec_id, std::uint64_t> visible;  // events the host may read, per EC
  std::vector<actor*> waiters;
  std::uint32_t waiting_now = 0, busy_now = 0;
  node_stats st;

  explicit impl_node(std::string nm) : name(nm), groups(std::move(nm)) {}
};

} // namespace spin::sim
