// The sPIN execution engine: execution contexts, matching, message ordering, run-to-completion
// handler execution, NIC memory, DMA, actions and statistics (sPIN, Hoefler et al., SC17,
// section 3; PsPIN, Di Girolamo et al., ISCA 2021, section 3). docs/architecture.md describes
// the data flow.
//
// Run to completion. An HPU is an lcore that polls: the thread that hands HPU h a burst
// (rx_burst(h, ...)) parses, matches and orders those packets and runs their header, payload
// and completion handlers itself, on its own core, before rx_burst returns (DPDK's
// run-to-completion model, examples/l2fwd; PsPIN keeps a message in one cluster for the same
// reason). Every packet of a message belongs to one HPU, chosen by a hash of the message key
// (source rank, message id): hpu_of(). A packet handed to the wrong HPU is steered to its own
// through that HPU's inbox (a bounded MPMC queue), which poll(h) and rx_burst(h) empty. Each
// HPU owns its share of every EC's message table, so the ordering guarantees hold without
// locks; handler memory is shared by all HPUs (atomics and locks in the API).
//
// Threads. At most one thread at a time drives HPU h (rx_burst(h), poll(h)); different HPUs
// may be driven by different threads at once, or all by one thread in turn. The control calls
// (install, uninstall, register_host_memory, unregister_host_memory, release_message, drain)
// must not overlap any rx_burst or poll (as with DPDK's ethdev configuration). The budget's
// watchdog is one thread for every runtime of the process (the first runtime created starts it,
// the last destroyed stops it). stats() and poll_events() may be called from any thread.
// The transmitter and the release callback are called from the thread driving the HPU.
#pragma once

#include <spin/handler.hpp>
#include <spin/result.hpp>
#include <spin/rt/stats.hpp>
#include <spin/rt/tx.hpp>
#include <spin/rt/wire.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace spin::rt {

/// Identifies an installed EC (also `spin::message_desc::ec_id`).
using ec_id = std::uint32_t;
/// Identifies a registered host memory region.
using region_id = std::uint32_t;

/// Portals-style match rule: a packet matches when its match bits equal `bits` in every bit
/// that `ignore_mask` does not set. ECs are tried in installation order; the first match wins.
struct match_rule {
  std::uint64_t bits = 0;
  std::uint64_t ignore_mask = 0;
  bool matches(std::uint64_t mb) const { return ((mb ^ bits) & ~ignore_mask) == 0; }
};

/// How the runtime calls one handler: native code, or a program that an engine runs (the
/// eBPF engine of loader.hpp). Converts from a handler_fn; null when neither is set.
struct handler_ref {
  handler_fn native = nullptr;
  /// Runs `prog` with the invocation's context on the thread driving the HPU and returns the
  /// handler's return code. Used when `native` is null.
  std::int32_t (*engine)(const void* prog, spin::ctx* c) noexcept = nullptr;
  const void* prog = nullptr;

  handler_ref() = default;
  handler_ref(handler_fn f) : native(f) {}
  handler_ref(std::nullptr_t) {}
  explicit operator bool() const { return native != nullptr || engine != nullptr; }
  bool operator==(std::nullptr_t) const { return !*this; }
};

/// A package's counted object (`spinc --count-instructions`, rt::package::counted_object): the
/// same handlers, each adding the instructions a modelled HPU executes to `*counter`, which is
/// exact at every spin API call and when a handler returns (docs/virtual-time.md, "Handler
/// cost"). A runtime with an invocation_observer runs these instead of the plain handlers. All
/// null when the package has none (eBPF packages never have one).
struct counted_handlers {
  handler_fn header = nullptr;
  handler_fn payload = nullptr;
  handler_fn completion = nullptr;
  std::uint64_t* counter = nullptr;
};

/// The handlers of an EC; any of them may be null.
struct handler_set {
  handler_set() = default;
  handler_set(handler_ref h, handler_ref p, handler_ref c) : header(h), payload(p), completion(c) {}

  handler_ref header;
  handler_ref payload;
  handler_ref completion;
  /// Bytes of zeroed memory that install reserves after the EC's handler memory and after each
  /// scratchpad: an engine handler may address that far past a region's end (eBPF windows,
  /// `spin::bpf_window_bytes`). The runtime never hands that memory to another EC.
  std::uint64_t guard_bytes = 0;
  /// The counted twins of the handlers above (virtual time), or all null.
  counted_handlers counted;
  /// Keeps the handlers' code loaded while any copy of this set exists (a loaded package).
  std::shared_ptr<const void> owner;
};

/// Part of a registered host region that an EC's DMA may address: bytes
/// [offset_bytes, offset_bytes + len_bytes) of region `region`.
struct host_window {
  region_id region = 0;
  std::uint64_t offset_bytes = 0;
  std::uint64_t len_bytes = 0;
};

/// Limits of one EC. All resources are reserved at install; the data path never allocates.
struct ec_limits {
  /// Messages that may be open at once over all HPUs (each holds a scratchpad). A packet that
  /// would open one more is dropped as no_message_slot.
  std::uint32_t max_messages = 64;
  /// Completed message keys remembered per HPU so that late duplicates are recognised (FIFO; a
  /// message's duplicates reach the HPU that ran it).
  std::uint32_t retired_history = 1024;
  /// Reorder window per message in packets (rounded up to a multiple of 64): a packet more
  /// than this far ahead of the lowest missing packet is dropped as out_of_window. Each message
  /// entry holds a bitmap of the next power of two of bits (window_packets 192: 256 bits).
  std::uint32_t window_packets = 1024;
  /// Payload packets per HPU that may wait for their message's header packet (each holds a
  /// frame).
  std::uint32_t max_parked_packets = 4096;
  /// Time budget of one handler invocation. An invocation that runs longer is stopped (see
  /// runtime_config::preempt), reported in the EC's statistics and as an error event, and its
  /// message is aborted (docs/architecture.md, "Handler budget").
  std::chrono::nanoseconds handler_budget{std::chrono::milliseconds(10)};
  /// Capacity of the EC's host event queue (events), rounded up to a power of two.
  std::uint32_t event_queue_depth = 4096;
  /// The EC's handlers never write to a packet that reached them as a multicast copy
  /// (`ctx::multicast` of any NIC, this one included) or as a forwarded frame still shared
  /// with its sender (`ctx::forward`): the runtime may then run them on the packet in place,
  /// its payload shared with the other holders (`packet::shared`). False (the default): every
  /// packet a handler sees is its own (a shared one is copied first, counted as `unshared` in
  /// the emulator's NIC statistics). A handler of an EC that sets it and writes such a packet
  /// changes what the other copies' handlers read: set it only for handlers that provably do
  /// not (spin::coll's engine: its multicast results are only read).
  bool read_only_multicast = false;
};

/// Upper bounds of ec_limits that install accepts (they keep every table size and budget
/// computation in range).
struct ec_limits_max {
  static constexpr std::uint32_t messages = 1u << 20;
  static constexpr std::uint32_t retired_history = 1u << 22;
  static constexpr std::uint32_t window_packets = 1u << 20;
  static constexpr std::uint32_t parked_packets = 1u << 24;
  static constexpr std::uint32_t event_queue_depth = 1u << 24;
  static constexpr std::chrono::nanoseconds handler_budget = std::chrono::hours(1);
};

/// What a message's scratchpad holds when the message opens.
enum class scratchpad_init : std::uint8_t {
  zeroed,     ///< all zero (and its guard bytes): the default
  /// Whatever an earlier message of the same EC left there (never another EC's bytes): for
  /// handlers that use the scratchpad as temporary space and write before they read. Saves
  /// clearing scratchpad_bytes per message (the collective engine's 8 KiB: ~300 ns a packet).
  undefined,
};

/// Everything that defines an execution context.
struct ec_config {
  std::string name;                       ///< for statistics and errors
  match_rule match;
  handler_set handlers;
  std::uint64_t handler_mem_bytes = 0;    ///< shared by all messages of the EC; zeroed at install
  std::uint64_t scratchpad_bytes = 0;     ///< per message
  scratchpad_init scratchpad = scratchpad_init::zeroed;  ///< its contents when a message opens
  std::optional<host_window> window;      ///< host memory the EC may DMA to/from
  ec_limits limits;
  /// Frame key (16 bytes; all zero, the default: none). With a key, every frame the EC's
  /// handlers send carries `wire::flag_auth` and the SipHash-2-4 tag of its header and payload
  /// under the key (docs/wire-format.md, "Authentication tag"), and a frame that matches the EC
  /// from a link (not packet::local) without a tag that verifies is dropped as
  /// drop_reason::unauthenticated before any handler sees it. The collectives derive one key per
  /// group from the job secret (docs/collectives.md, "Authenticated frames").
  std::array<std::uint8_t, 16> frame_key{};
};

/// DMA engine model: a DMA of n bytes completes latency + n*8/bandwidth after it was issued.
/// Zero latency and zero bandwidth (the default) mean an instant copy.
struct dma_model {
  std::chrono::nanoseconds latency{0};
  double bandwidth_gbps = 0;  ///< Gbit/s; 0 = unlimited
};

/// A frame handed to the runtime. The runtime owns it from rx_burst until it calls
/// `runtime_config::release` with `cookie`, exactly once per accepted frame, from the thread
/// driving an HPU (or a control call). Handlers may modify the bytes in place, unless the
/// packet is `shared`.
struct packet {
  std::byte* frame = nullptr;
  std::uint32_t frame_len = 0;
  std::uint64_t cookie = 0;
  /// Non-null: the frame continues here (a second buffer, `tail_len` bytes), and the frame's
  /// payload should be exactly this tail: a header buffer chained in front of a payload (a
  /// multicast copy). A packet whose payload is not exactly the tail is made contiguous by
  /// `runtime_config::unshare` before its handlers run.
  std::byte* tail = nullptr;
  std::uint32_t tail_len = 0;
  /// The payload's bytes are shared with other holders: the tail of a multicast copy (DPDK's
  /// indirect mbufs), or a frame another NIC forwarded without copying (`ctx::forward`) while
  /// the handler that forwarded it may still read it. Only ECs whose handlers do not write such
  /// packets (ec_limits::read_only_multicast) see them in place; any other EC gets a private
  /// copy from `runtime_config::unshare`.
  bool shared = false;
  /// The frame never crossed a link: this NIC's own host or handlers sent it to this NIC's own
  /// rank (the emulator's loopback). Such frames need no authentication tag (ec_config::frame_key).
  /// The runtime reads it before `runtime_config::unshare` replaces the packet, so an unshare
  /// function need not keep it.
  bool local = false;
};

/// Replaces `p` by a private, contiguous copy of its frame (tail == null, shared == false) and
/// releases the original; returns false, leaving `p` as it was, when there is no buffer for the
/// copy (the runtime then drops the packet as no_private_copy). Called on the thread driving an
/// HPU; `user` is runtime_config::release_user.
using unshare_fn = bool (*)(void* user, packet& p) noexcept;

/// What a handler invocation does that takes time in a model of the NIC
/// (invocation_observer::action).
enum class action_kind : std::uint8_t {
  send,           ///< ctx::send; bytes: payload bytes
  multicast,      ///< ctx::multicast; bytes: payload bytes of one copy, copies: copies sent
  forward,        ///< ctx::forward; bytes: payload bytes
  dma_to_host,    ///< ctx::dma_to_host; blocking unless a handle was asked for (dma_id)
  dma_from_host,  ///< ctx::dma_from_host; as dma_to_host
  dma_wait,       ///< ctx::dma_wait on the non-blocking DMA dma_id
  post_event,     ///< ctx::post_event (an 8-byte write to the host's event queue)
  deposit,        ///< the runtime's default deposit of a payload into the host window (no handler)
};

/// One action of an invocation (invocation_observer::action).
struct action_info {
  action_kind kind = action_kind::send;
  /// Instructions the invocation executed before it (its counted handler's counter; 0 for a
  /// deposit, which no handler makes).
  std::uint64_t instructions = 0;
  std::uint64_t bytes = 0;
  std::uint32_t copies = 1;
  /// A non-blocking DMA's handle (dma_to_host / dma_from_host with a handle, dma_wait); 0: a
  /// blocking DMA.
  std::uint64_t dma_id = 0;
};

/// How a simulator times what a runtime does (virtual time: docs/virtual-time.md). With
/// runtime_config::observer set, the runtime runs each EC's counted handlers (install refuses an
/// EC whose package has none) and reports each invocation, and each action that takes time,
/// synchronously on the thread driving the HPU, in the order they happen. The actions' effects
/// (a send's frame reaching the transmitter, a DMA's bytes) take place right after the report.
class invocation_observer {
public:
  virtual ~invocation_observer() = default;
  /// A handler of `kind` of EC `ec` starts on HPU `hpu`, for message (source_rank, message_id)
  /// of `packet_count` packets (0 while unknown).
  virtual void begin(std::uint32_t hpu, ec_id ec, handler_kind kind, std::uint32_t source_rank, std::uint64_t message_id,
                     std::uint32_t packet_count) noexcept = 0;
  /// The running invocation (or, for a deposit, the runtime between invocations) does `a`.
  virtual void action(const action_info& a) noexcept = 0;
  /// The invocation that began last returned after `instructions`; `stopped`: it was stopped
  /// (budget, fault), and an error event went to the EC's queue.
  virtual void end(std::uint64_t instructions, bool stopped) noexcept = 0;
};

/// Called when the runtime is done with a packet (`user` is runtime_config::release_user).
using release_fn = void (*)(void* user, std::uint64_t cookie) noexcept;

/// Called after rx_burst on HPU `from` steered frames into the inbox of HPU `hpu` (once per
/// burst and HPU), on the thread driving `from`: the emulator wakes the lcore of `hpu` if it
/// sleeps. `user` is runtime_config::wake_user.
using wake_fn = void (*)(void* user, std::uint32_t hpu) noexcept;

/// How a runtime is built.
struct runtime_config {
  std::uint32_t rank = 0;                   ///< this NIC's rank: source rank of packets handlers send
  /// HPUs (1..256): each is driven by one thread at a time (an lcore) and owns a share of the
  /// messages (hpu_of()).
  std::uint32_t hpus = 1;
  std::uint64_t nic_memory_bytes = 64ull << 20;  ///< NIC memory arena (handler memory, scratchpads)
  std::uint32_t max_ecs = 1024;             ///< ECs installed at once (each communicator of spin::coll takes one)
  /// Packets steered to an HPU from another one that may wait in its inbox (rounded up to a
  /// power of two, 1..65536).
  std::uint32_t inbox_packets = 1024;
  std::uint16_t udp_port = wire::default_udp_port;
  std::uint32_t max_dma_in_flight = 64;     ///< non-blocking DMAs per invocation
  dma_model dma;
  transmitter* tx = nullptr;                ///< where handler sends go; null: sends fail (not_supported)
  release_fn release = nullptr;             ///< null: packets are not returned to anyone
  /// Makes a packet with a tail contiguous and private (see `packet`). Null: such packets are
  /// dropped as no_private_copy where they would need it.
  unshare_fn unshare = nullptr;
  void* release_user = nullptr;
  wake_fn wake = nullptr;                   ///< null: whoever drives an HPU polls its inbox anyway
  void* wake_user = nullptr;
  /// Stop an over-budget handler by a signal to the thread running it (native code cannot be stopped
  /// otherwise). Off: the handler is stopped at its next API call, or reported when it returns.
  /// Ignored (off) in ThreadSanitizer builds, whose runtime defers asynchronous signals.
  bool preempt = true;
  int preempt_signal = 0;                   ///< 0: SIGRTMIN + 4
  /// Stop a handler that faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL in handler code, a stack
  /// overflow included) instead of letting it kill the process: the invocation ends like an
  /// overrun, counted as a fault (handler_stats::faults), with an error event (errc::fault).
  /// The signal handlers are installed once per process and pass faults outside handler code
  /// on to the previous handler. Ignored (off) in ThreadSanitizer builds.
  bool catch_faults = true;
  /// Virtual time (docs/virtual-time.md): run every EC's counted handlers and report each
  /// invocation and action here. Null (the default): the plain handlers, no reports. Must
  /// outlive the runtime. A counted object's counter is one plain global per loaded package:
  /// with an observer, one thread must drive every HPU of every runtime that uses the package
  /// (spin::sim does), or the counts mix and race.
  invocation_observer* observer = nullptr;
};

/// An event the host reads from an EC's queue.
struct host_event {
  enum class kind : std::uint32_t { handler = 0, error = 1 };
  kind type = kind::handler;
  errc code = errc::ok;        ///< for errors: aborted (budget)
  std::uint32_t source_rank = 0;
  std::uint64_t message_id = 0;
  std::uint64_t value = 0;     ///< the handler's 8 bytes, or for errors the handler kind
};

/// Rate of the cycle counter the runtime times handlers with (the TSC on x86-64), in ticks per
/// ns (= GHz). Measured once per process, on the first call (a `runtime::create` makes it),
/// against steady_clock over ~20 ms with paired readings; later calls return the same value.
/// hpu_stats::busy_ns and handler_stats' times are ticks divided by this rate, so multiplying
/// them by it gives back the ticks (cycles at the counter's rate). Any thread.
double cycle_counter_ghz();

class runtime_impl;

/// A NIC's sPIN engine.
class runtime {
public:
  /// Builds a runtime and attaches it to the process's watchdog thread (starting the thread
  /// if this is the only runtime). Errors: invalid_argument (hpus out of
  /// 1..256, inbox_packets out of 1..65536, a DMA model outside [0, 1 s] latency, no NIC
  /// memory, max_ecs out of 1..65535), no_memory.
  static result<std::unique_ptr<runtime>> create(const runtime_config& cfg);
  /// Runs what waits in the inboxes (drain), detaches from the watchdog (the last runtime
  /// stops its thread) and returns every packet still
  /// held (parked) to `release`. No thread may drive an HPU any more.
  ~runtime();
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  /// Registers host memory that EC windows may refer to. The caller keeps it alive and does not
  /// move it until it is unregistered or the runtime is destroyed. Errors: invalid_argument
  /// (null or empty).
  result<region_id> register_host_memory(std::span<std::byte> mem);

  /// Forgets a registered region; the caller may unmap it afterwards. Region ids are never
  /// reused. Errors: not_found (never registered, or already unregistered), bad_state (the window
  /// of an installed EC, including one still draining after a timed-out uninstall, lies in it).
  result<void> unregister_host_memory(region_id region);

  /// Installs an EC: reserves its handler memory, scratchpads (max_messages x scratchpad_bytes)
  /// and tables. Errors: invalid_argument (window outside its region, a zero limit or one above
  /// ec_limits_max), not_found (unknown region), no_space (max_ecs reached), no_memory (the NIC
  /// arena or host memory cannot hold it; the message gives the sizes), not_supported (a runtime
  /// with an observer, and a handler without its counted twin: the message says to rebuild the
  /// package with spinc --count-instructions). A failed install takes no NIC memory.
  result<ec_id> install(const ec_config& cfg);

  /// Uninstalls an EC: its parked packets are dropped (ec_removed), its messages end without
  /// completion handler, its memory is freed; later packets that would have matched it match
  /// the next EC or none. No handler runs during a control call, so nothing waits. Errors:
  /// not_found.
  result<void> uninstall(ec_id ec);

  /// Releases a message kept by a *_pending return. Errors: not_found (no such held message).
  result<void> release_message(ec_id ec, std::uint32_t source_rank, std::uint64_t message_id);

  /// Runs up to `n` frames to completion on HPU `hpu` (0..hpus()-1), on the calling thread:
  /// first what waits in its inbox, then each frame is parsed, matched and either handled
  /// (header, payload and completion handlers as the message's state allows), parked until its
  /// header packet arrives, steered to the inbox of the HPU that owns its message (hpu_of), or
  /// dropped with a counted reason. The runtime owns each accepted frame from here (see
  /// `packet`). Returns how many frames were accepted, from the front of `pkts`; fewer than `n`
  /// only when a frame belongs to another HPU whose inbox is full (back-pressure: the caller
  /// keeps the rest and offers them again). Returns 0 for an HPU out of range. The thread
  /// driving `hpu` only; noexcept, no allocation, no syscall.
  std::uint32_t rx_burst(std::uint32_t hpu, const packet* pkts, std::uint32_t n) noexcept;

  /// Runs what other HPUs steered into the inbox of HPU `hpu` (up to one inbox's worth) and
  /// returns how many frames it took. The thread driving `hpu` only.
  std::uint32_t poll(std::uint32_t hpu) noexcept;

  /// True when HPU `hpu`'s inbox holds frames. Any thread (a possibly stale answer).
  bool has_work(std::uint32_t hpu) const noexcept;

  /// The HPU that owns the message of `frame` (a hash of its source rank and message id);
  /// 0 for a frame that does not parse. Any thread.
  std::uint32_t hpu_of(std::span<const std::byte> frame) const noexcept;

  /// Runs every inbox on the calling thread until all are empty (a control call: no thread may
  /// drive an HPU meanwhile). Messages waiting for missing packets stay open.
  void drain() noexcept;

  /// Reads up to out.size() events of EC `ec`. Any thread. Returns the count (0 for an unknown EC).
  std::size_t poll_events(ec_id ec, std::span<host_event> out) noexcept;

  /// As poll_events, but waits up to `timeout` for the first event: the caller polls the
  /// queue for a few rounds, yielding its core between them, then sleeps on a futex that the
  /// HPU posting the event wakes (posting costs a syscall only while someone sleeps). Returns 0
  /// after the timeout, at once for an unknown EC, and as soon as the EC is uninstalled
  /// meanwhile. Any thread (one waiter per EC at a time is the intended use).
  std::size_t wait_events(ec_id ec, std::span<host_event> out, std::chrono::nanoseconds timeout) noexcept;

  /// The EC's handler memory as the host sees it (for set-up before traffic and inspection
  /// after drain). Empty for an unknown EC.
  std::span<std::byte> handler_memory(ec_id ec);

  /// Snapshot of all counters. Any thread.
  runtime_stats stats() const;

  /// Number of HPUs.
  std::uint32_t hpus() const;

private:
  explicit runtime(std::unique_ptr<runtime_impl> impl);
  std::unique_ptr<runtime_impl> _impl;
};

} // namespace spin::rt
