// spin::coll: collective operations whose data path runs in NIC handlers (Edge-INC) or switch
// handlers (Core-INC) of the emulated network (docs/collectives.md).
//
// A communicator is one rank's handle on a group of hosts. Every member creates its own, with
// the same group id and member list, on its own NIC: one of this process (emu::nic_control,
// cluster mode) or one of another spin-emu process, reached through its control socket
// (communicator::connect). All members call
// the same collectives in the same order, each from its own thread (a rank is a host thread;
// a collective blocks until this rank's part is done). The NIC's collective engine
// (spin/coll/engine.hpp, installed as an EC by create) does the reduction and the forwarding;
// the host thread only starts each collective, sends repair timer ticks, and waits for the
// completion event.
//
// Threads: one thread at a time per communicator. Communicators of different ranks (or
// groups) are independent and may be used from different threads at once.
//
// Libraries: the rank side (communicator::connect, fabric::connect and everything a
// communicator does once created) is spin_coll_rank, which links no DPDK: a program, an MPI
// interposer or a Python extension whose ranks reach spin-emu processes links only it.
// communicator::create and fabric::create, which drive NICs of this process (cluster mode),
// are in spin_coll_local, with the emulator (meson: spin_collectives_dep has both).
#pragma once

#include <spin/coll/kernels.hpp>
#include <spin/coll/protocol.hpp>
#include <spin/coll/types.hpp>
#include <spin/rt/package.hpp>
#include <spin/result.hpp>

#include <array>
#include <chrono>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace spin::emu {
class cluster;
class nic_control;
struct topology;
} // namespace spin::emu

namespace spin::coll {

/// Who does the work (docs/collectives.md, "Algorithms").
enum class algorithm : std::uint8_t {
  automatic = 0,  ///< switch_agg when the group holds switch slots (not for reduce-scatter), else edge_ring
  edge_ring = 1,  ///< Edge-INC: NIC handlers reduce and forward along a ring of the members
  switch_agg = 2, ///< Core-INC: a switch aggregates (allreduce) or replicates (allgather, broadcast); needs a fabric with slots
  host_ring = 3,  ///< the no-INC baseline: host threads reduce, NICs only move chunks (allreduce only)
};
/// "automatic", "edge_ring", "switch", "host_ring".
const char* name(algorithm a);

class fabric;
namespace detail {
class nic_handle;
}

/// A collective engine package in the two forms NICs take it (communicator internals): its
/// bytes, which a spin-emu process loads from a file, and decoded, which a NIC of this process
/// loads (and whose manifest gives the EC sizes).
struct engine_package {
  std::vector<std::byte> bytes;
  std::shared_ptr<const rt::package> package;
};

/// Options of a communicator. Every member must use the same packet_bytes and staging_bytes.
struct options {
  /// A collective that has not finished after this long returns errc::timeout (on every rank
  /// that has not finished: none hangs).
  std::chrono::milliseconds timeout{10000};
  /// Repair timer: a NIC that saw no progress for one interval re-sends what is missing
  /// (docs/collectives.md, "Repair timer"). The interval follows the round trips the
  /// communicator measures, as TCP's retransmission timeout does (RFC 6298: smoothed round
  /// trip + 4 x its variation, doubled after each repaired epoch), within [repair_min_interval,
  /// repair_max_interval]. repair_interval is where it starts, before the first round trip is
  /// known: SwitchML's default retransmission timeout.
  std::chrono::microseconds repair_interval{10000};
  /// The longest repair interval: the back-off's ceiling, and the limit of the measured
  /// interval. It must exceed the round trips of a loaded machine, or every epoch that lasts
  /// longer is repaired on lossless links (16 ranks on 2 cores measure 15 to 20 ms).
  std::chrono::microseconds repair_max_interval{1000000};
  /// The shortest repair interval. Each tick wakes the waiting rank, so below about 1 ms ticks
  /// cost the cores the NICs need on a small machine. All three equal: a fixed interval.
  /// create fails with invalid_argument unless 0 < repair_min_interval <= repair_interval <=
  /// repair_max_interval.
  std::chrono::microseconds repair_min_interval{1000};
  /// Off: lost packets are never repaired; a collective that loses one ends in a timeout.
  bool recovery = true;
  /// Packets each rank keeps in flight (1..256).
  std::uint32_t window_packets = 32;
  /// Payload bytes per packet, 16..4096, at most what the NIC's frames carry (create fails with
  /// invalid_argument otherwise). 0, the default: the largest power of two up to 4096 that the
  /// NIC carries (4096 in a cluster, RoCE's largest MTU; 1024 on 1518-byte memif frames).
  /// Larger packets make per-packet costs (a handler invocation, a frame) count less often: a
  /// 64 MiB switch allreduce takes about half the time with 4 KiB packets as with 1 KiB.
  std::uint32_t packet_bytes = 0;
  /// Host memory registered with the NIC for the whole communicator (bytes): staging buffers,
  /// and what alloc() hands out. Reserved, not touched, until used.
  std::size_t arena_bytes = std::size_t{256} << 20;
  /// Bytes of each of the two staging buffers through which buffers outside the arena pass.
  std::size_t staging_bytes = std::size_t{32} << 20;
  /// The cluster's switches as Core-INC resources: with a fabric, the group asks for
  /// aggregator slots on a switch next to every member (algorithm::switch_agg). Must outlive
  /// the communicator. Null: edge algorithms only.
  fabric* switches = nullptr;
  /// Aggregator slots the group asks for on its switch (1..32767). Every member must ask for
  /// the same number.
  std::uint32_t switch_slots = 64;
  /// How long the first member waits for a switch's slots to free up before the group runs
  /// without them (fabric_options, "first come, first served"). Members that join meanwhile
  /// wait for the first member's answer: every member gets the same one.
  std::chrono::milliseconds switch_wait{0};
  /// The job's secret (16 bytes; all zero: none), which the ranks agree on through their
  /// launcher (libspin-mpi: MPI_Bcast from rank 0, spin_torch: the c10d store, both unless
  /// SPIN_JOB_SECRET gives it). Every member must use the same. A switch group's joins carry a
  /// SipHash-2-4 proof of it (over the group's id, slots and members); the switch refuses a join
  /// whose proof differs from the group's first member's, so that another job cannot take a
  /// group's answer or slots by using its id. With `authenticate_frames`, every data frame of
  /// the group carries a SipHash-2-4 tag under a key derived from it, and NICs and switches drop
  /// frames without a tag that verifies (docs/collectives.md, "Authenticated frames").
  std::array<std::uint8_t, 16> job_secret{};
  /// With a job secret: tag and check every data frame (the default). false: frames carry no
  /// tag, which spares a SipHash pass over each payload per send and per receive, for a fabric
  /// that only this job's NICs and switches can reach; joins still prove the secret. Every
  /// member must choose the same: members that differ drop each other's frames, and their
  /// collectives end in a timeout. libspin-mpi: SPIN_MPI_FRAME_AUTH=0; spin_torch:
  /// SPIN_TORCH_FRAME_AUTH=0.
  bool authenticate_frames = true;
  /// Where the communicator says why it runs without the switch (one line per reason). Null:
  /// standard error.
  void (*log)(const std::string& line) = nullptr;
};

/// How a fabric shares its switches (docs/collectives.md, "Several jobs").
struct fabric_options {
  /// Aggregator slots of each switch, shared by every group that aggregates there. Each slot
  /// has two shadow copies of (members + 1) x slot_bytes bytes in the switch's NIC memory.
  std::uint32_t slots_per_switch = 256;
  /// Largest contribution per slot (bytes, a multiple of 8, at most 4096); a communicator's
  /// packet_bytes may not exceed it.
  std::uint32_t slot_bytes = 4096;
};

/// A switch of another spin-emu process (`spin-emu --mode switch`, or a switch node of a
/// cluster-mode process) as fabric::connect takes it.
struct remote_switch {
  std::string socket;       ///< its control socket
  std::uint32_t node = 0;   ///< the node index the control socket's "nodes" lists
  /// Ranks of the hosts and switches its ports are linked to (a fabric's own switches by
  /// their rank, as "nodes" reports it). Links are symmetric: listing one end is enough.
  std::vector<std::uint32_t> links;
};

/// A switch reached in-band (docs/collectives.md, "In-band joins"): this process's members join
/// through their own NIC, whose spin-emu's group agent asks the switch over the network; the
/// switch's spin-emu sets the group up itself. Works wherever the NIC reaches the switch's rank:
/// one host or several, with no control socket of the switch's.
struct inband_switch {
  std::string nic_socket;        ///< this process's NIC: its spin-emu's control socket
  std::uint32_t nic_node = 0;    ///< the node index that socket's "nodes" lists
  std::uint32_t switch_rank = 0; ///< the switch's rank (spin-emu --rank in switch mode: 65535 by default)
};

/// The switches of the emulated network as Core-INC resources, seen from this process
/// (docs/collectives.md, "Switch-resident groups"). The slot pools and the group registry are
/// the switches' own (spin/emu/groups.hpp, in the switch's spin-emu or this process's cluster):
/// fabrics in different processes that join one group share the switch's pool and get one
/// answer. Policy: a group asks once, when its first member creates its communicator, for
/// options::switch_slots slots on the switch closest to every member (and on each leaf below it,
/// in a two-level tree); it gets all of them or none (first come, first served, waiting up to
/// options::switch_wait); every member gets the first member's answer. A group holds its slots
/// until its last member's communicator is destroyed or its process's connection to the switch
/// closes. Every group's slots live in an EC of its own on the switch, installed by the fabric
/// of the group's first member, so no group can address another's data; that fabric keeps the
/// EC until its own members of the group are gone.
/// Thread-safe.
class fabric {
public:
  /// The switches of an in-process cluster. Errors: invalid_argument (options out of range),
  /// not_found (the cluster has no switch).
  static result<std::unique_ptr<fabric>> create(emu::cluster& c, const fabric_options& o = {});
  /// The switches of topology `t` whose nodes, in topology order, are `nodes` (a virtual-time
  /// cluster's, spin::sim::cluster::controls()). Errors: those of create(cluster), and
  /// invalid_argument when `nodes` does not have one NIC per node of `t`.
  static result<std::unique_ptr<fabric>> create(const emu::topology& t, const std::vector<emu::nic_control*>& nodes,
                                                const fabric_options& o = {});
  /// Switches of other spin-emu processes, each reached through its own control-socket
  /// connection, with the links between them and the hosts as given (the fabric cannot see
  /// the wiring of other processes). Errors: invalid_argument (options out of range, no
  /// switch, a switch without links, two switches with one rank), those of connecting
  /// (not_found: no socket or no such node; bad_state; timeout).
  static result<std::unique_ptr<fabric>> connect(const std::vector<remote_switch>& switches, const fabric_options& o = {});
  /// One switch reached in-band, linked to every member (a star). Its pool is its own (spin-emu
  /// sizes it): o.slots_per_switch and o.slot_bytes are not sent, and a group whose packets do
  /// not fit its slots is refused by the switch. Errors: invalid_argument (options out of range,
  /// the NIC is the switch), those of connecting to the NIC (not_found, bad_state, timeout);
  /// joins fail with not_supported when the NIC's spin-emu runs no group agent.
  static result<std::unique_ptr<fabric>> in_band(const inband_switch& s, const fabric_options& o = {});
  ~fabric();
  fabric(const fabric&) = delete;
  fabric& operator=(const fabric&) = delete;

  /// One switch's pool (as its registry reports it; zeros when the switch did not answer).
  struct switch_usage {
    std::string name;
    std::uint32_t rank = 0;
    std::uint32_t slots = 0;  ///< pool size
    std::uint32_t free = 0;
    std::uint32_t groups = 0;   ///< groups holding slots here (of every process)
    std::uint32_t waiting = 0;  ///< groups waiting for slots
  };
  std::vector<switch_usage> usage() const;

  /// A group's answer (communicator internals). granted == 0: no slots; `reason` says why.
  struct lease {
    std::uint32_t switch_rank = 0;  ///< the root: where contributions go (flat)
    std::uint32_t slots = 0;
    std::string reason;
    /// In a two-level tree: each member's leaf, where order-free reductions go first
    /// (docs/collectives.md, "Hierarchies"); empty otherwise.
    std::vector<std::uint32_t> leaf_rank;
  };
  /// Member `me` of `members` joins group `wire_id` (communicator internals). The group's first
  /// member installs its aggregation engine (package `pkg`, the reduction's) on the switch;
  /// every member gets the same lease (a group whose id another group holds on the switch gets a
  /// refusal that says so). With a secret and `authenticate_frames`, the switch's engines get the
  /// group's frame key (options::authenticate_frames). Errors: invalid_argument (slots differ from the first member's),
  /// not_supported (the proof of `job_secret` differs from the first member's), timeout (the first member, in another process, did not decide within
  /// 60 s after `wait`), those of reaching the switch (bad_state: its spin-emu went away).
  result<lease> join(std::uint32_t wire_id, const std::vector<std::uint32_t>& members, std::uint32_t me, std::uint32_t slots,
                     std::uint32_t packet_bytes, std::chrono::milliseconds wait, const engine_package& pkg,
                     const std::array<std::uint8_t, 16>& job_secret = {}, bool authenticate_frames = true);
  /// Member `me` leaves group `wire_id`; the group's last member anywhere frees its slots.
  void leave(std::uint32_t wire_id, std::uint32_t me);

  struct impl;

private:
  /// A fabric over `switches`, linked as `links` says (pairs of ranks; every linked rank that
  /// is not one of the switches is a host). Errors: those of the options, not_found (no
  /// switch), invalid_argument (two switches with one rank, a link from a rank to itself).
  static result<std::unique_ptr<fabric>> over(std::vector<std::unique_ptr<detail::nic_handle>> switches,
                                              const std::vector<std::pair<std::uint32_t, std::uint32_t>>& links,
                                              const fabric_options& o);
  explicit fabric(std::unique_ptr<impl> p);
  std::unique_ptr<impl> _p;
};

/// The members of a communicator.
struct group {
  /// Identifies the group on the wire (1..4095); the same on every member, different from
  /// every other group that shares a NIC.
  std::uint32_t id = 1;
  /// NIC rank (emulated address) of each member, in communicator rank order.
  std::vector<std::uint32_t> members;
  /// This rank's index in `members`.
  std::uint32_t me = 0;
};

/// A user reduction (docs/handler-guide.md, "Custom reductions"): a type R with `elem`, `acc`,
/// widen, combine and narrow, compiled twice: into a package by spinc, from a handler source
/// that says `SPIN_COLL_ENGINE(spin::coll::single_reduction<R>)`, and into the host program,
/// whose `kernels_of<R>()` one-rank groups use.
struct reduction {
  /// Names the reduction; every rank must use the same name (its hash is compared between
  /// ranks, like count and datatype).
  std::string name;
  rt::package package;  ///< spinc's output for the handler source
  kernels host;         ///< kernels_of<R>() of the same R
};

/// A reduction added to a communicator (add_reduction).
struct custom_op {
  std::uint32_t slot = 0;        ///< 1..15: which of the communicator's engines runs it
  std::uint32_t id = 0;          ///< hash of the name
  std::uint32_t elem_bytes = 0;
  std::uint32_t acc_bytes = 0;
};

/// Counters of one communicator (this rank).
struct comm_stats {
  std::uint64_t collectives = 0;       ///< calls that returned ok
  std::uint64_t epochs = 0;            ///< protocol epochs (a large collective takes several)
  std::uint64_t repair_ticks = 0;      ///< repair timer ticks sent to the NIC
  std::uint64_t repaired_epochs = 0;   ///< epochs in which a tick found the NIC stalled, so that it repaired
  std::uint64_t rtt_samples = 0;       ///< epochs whose time fed the repair timer (the others were repaired)
  std::chrono::microseconds srtt{0};   ///< smoothed round trip of those samples (0 before the first)
  std::chrono::microseconds repair_interval{0};  ///< the repair timer's current interval
  std::uint64_t staged_bytes = 0;      ///< bytes copied through the staging buffers
  std::uint64_t failures = 0;          ///< calls that returned an error
  std::uint64_t switch_collectives = 0;  ///< of `collectives`, those that ran through a switch (algorithm::switch_agg)
  std::uint32_t switch_slots = 0;      ///< aggregator slots the group holds on its switch (0: edge algorithms only)
};

/// One rank's communicator.
class communicator {
public:
  /// Installs the collective engine on `nic` (an EC matching the group id), registers the
  /// arena, and tells the engine the members. `nic` must outlive the communicator and be
  /// polled by its driving thread meanwhile. Errors: invalid_argument (empty group, more than
  /// 256 members, me out of range, two members with the same NIC rank, id out of 1..4095, options out of
  /// range), no_memory (arena), those of nic_control::install (exists: another EC already
  /// matches this group id on the NIC), timeout (the NIC did not confirm the set-up).
  static result<std::unique_ptr<communicator>> create(emu::nic_control& nic, const group& g, const options& o = {});
  /// The same on node `node` of another spin-emu process (`spin-emu --mode nic` has node 0;
  /// a cluster-mode process lists its nodes), driven through its control socket with a
  /// connection of the communicator's own. The arena is shared memory (memfd) mapped here and
  /// in spin-emu. Every engine EC and the arena go with the connection when the communicator
  /// is destroyed or this process exits. Errors: those of create, and of
  /// host::client::connect (not_found: no socket at the path; bad_state; timeout), not_found
  /// (no such node).
  static result<std::unique_ptr<communicator>> connect(const std::string& socket, std::uint32_t node, const group& g,
                                                       const options& o = {});
  /// Uninstalls the engine and unregisters the arena.
  ~communicator();
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  std::uint32_t rank() const noexcept;  ///< this rank's index
  std::uint32_t size() const noexcept;  ///< members
  /// Elements of datatype t (a standard one with a sum) in one epoch of allreduce: a call on
  /// more is cut into epochs of this many, each combined in its own chunks (docs/collectives.md,
  /// "Combination order"). It depends on options only (staging_bytes, packet_bytes) and the
  /// members; 1 at least; 0 for a datatype without a standard sum.
  std::uint64_t epoch_elements(dtype t) const noexcept;

  /// out = in_0 (+) in_1 (+) ... (+) in_{n-1}, element-wise, on every rank: `count` elements of
  /// type `t` at `in` and `out` (in == out: in place). For a block format (MX, BFP) an element
  /// is a block, so `count` counts blocks; the result is encode(float32 reduction) per block. Combination order and semantics:
  /// docs/collectives.md. Buffers from alloc() go to the NIC without a copy; others pass
  /// through the staging buffers. Errors: invalid_argument (null buffer with count > 0,
  /// buffers that overlap without being equal, an unknown op x dtype), not_supported (an
  /// algorithm not available), and, on every rank, invalid_argument when the ranks disagree
  /// on count, datatype, operation or algorithm (the message names the field and a rank),
  /// timeout when the collective did not finish within options::timeout, fault when a handler
  /// failed. After a timeout or a fault the communicator is broken: later calls return
  /// bad_state. After any error the contents of `out` (and of `in`, in place) are undefined:
  /// through the switch, results may land before the ranks' parameters are compared.
  result<void> allreduce(const void* in, void* out, std::uint64_t count, dtype t, op o,
                         algorithm a = algorithm::automatic);

  /// Typed form: in.size() elements.
  template <class T> result<void> allreduce(std::span<const T> in, std::span<T> out, op o,
                                            algorithm a = algorithm::automatic);

  /// Sparse allreduce (docs/collectives.md, "Sparse allreduce"): every rank gives a vector of
  /// `length` values of type t (f32, bf16 or f16) as `index.size()` pairs, strictly ascending
  /// indices below `length` and their values at `values`; every value not given is +0. The
  /// result is the sum of the ranks' vectors, value by value in float32 in the fixed order of
  /// an allreduce of its windows (docs/collectives.md, "Combination order": window w of chunk c
  /// is added from rank c+1 around to rank c), rounded to t once: the same bits on every rank,
  /// in every run, with either algorithm, whatever form each window took. The vector travels
  /// in windows of sparse::window_values values, each as pairs or dense, whichever takes fewer
  /// bytes, and where values are rare in spans of up to 64 windows per packet, cut alike by
  /// every rank from their agreed counts (spin/coll/sparse.hpp); NIC handlers (edge_ring) or
  /// the switch (switch_agg) add them.
  /// With t an OCP MX type (mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4_e2m1, mxint8)
  /// values and results are float32 and the windows carry MX codes: each rank's values are
  /// encoded in blocks of 32 of its window (scales from its own values), decoded exactly where
  /// they are added, and the float32 sum is encoded once and handed back decoded (exact in
  /// float32): the result equals decoding the dense MX encoding of the float32 sum of the
  /// decoded inputs, bit for bit. This form writes the dense result: `length` values at
  /// `dense_out`. It takes options::packet_bytes of 4096 (a dense window's float32
  /// partial sums fill a packet), and arena memory for the windows (about the dense vector's
  /// bytes; buffers pass through the staging buffers when the arena cannot hold them).
  /// Errors, on every rank (the ranks first agree on their arguments in a small allreduce):
  /// invalid_argument when any rank's indices are not strictly ascending or not below
  /// `length`, when the ranks give different lengths, datatypes or algorithms, when t is not
  /// f32, bf16, f16 or an MX type, when `length` exceeds 2^32, or when a buffer is null with pairs or a
  /// result to give (the message names the lowest rank at fault and why); not_supported for
  /// host_ring; fault when a result element is not the form the plan gave it (only a faulty
  /// or hostile peer can send one: nothing is written then); those of allreduce.
  result<void> allreduce_sparse(std::span<const std::uint32_t> index, const void* values, std::uint64_t length, dtype t,
                                void* dense_out, algorithm a = algorithm::automatic);
  /// The same, with the result as pairs: every index whose result is not +0 (by its bits: -0
  /// and NaN count), ascending, in `index_out`, and their values (of t) in `values_out`.
  result<void> allreduce_sparse(std::span<const std::uint32_t> index, const void* values, std::uint64_t length, dtype t,
                                std::vector<std::uint32_t>& index_out, std::vector<std::byte>& values_out,
                                algorithm a = algorithm::automatic);
  /// Typed forms (T: float, bf16_bits, f16_bits).
  template <class T>
  result<void> allreduce_sparse(std::span<const std::uint32_t> index, std::span<const T> values, std::uint64_t length,
                                std::span<T> dense_out, algorithm a = algorithm::automatic);
  /// A rank whose index and values differ in count, or whose dense_out does not hold
  /// `length` values, joins the agreement as a rank at fault: invalid_argument on every rank.
  template <class T>
  result<void> allreduce_sparse(std::span<const std::uint32_t> index, std::span<const T> values, std::uint64_t length,
                                std::vector<std::uint32_t>& index_out, std::vector<T>& values_out,
                                algorithm a = algorithm::automatic);

  /// Allreduce with a reduction from add_reduction (elements of r.elem_bytes).
  result<void> allreduce(const void* in, void* out, std::uint64_t count, const custom_op& r,
                         algorithm a = algorithm::automatic);

  /// Reduce-scatter: `in` holds size() blocks of `block_count` elements; block k of the
  /// reduction lands in `out` (block_count elements) of rank k. In place (NCCL's rule): `out`
  /// is this rank's block of `in`. Errors as allreduce.
  result<void> reduce_scatter(const void* in, void* out, std::uint64_t block_count, dtype t, op o,
                              algorithm a = algorithm::automatic);
  result<void> reduce_scatter(const void* in, void* out, std::uint64_t block_count, const custom_op& r,
                              algorithm a = algorithm::automatic);

  /// Allgather: `in` holds `block_count` elements of type t; `out` (size() blocks) receives
  /// rank k's block at block k on every rank. In place (NCCL's rule): `in` is this rank's block
  /// of `out`. No reduction: every datatype works.
  result<void> allgather(const void* in, void* out, std::uint64_t block_count, dtype t,
                         algorithm a = algorithm::automatic);

  /// Broadcast: `count` elements at `in` of rank `root` arrive at `out` of every rank (the
  /// root's too; in == out is fine). `in` is read only at the root and may be null elsewhere.
  /// The pipeline forwards each packet as it arrives (Khalilov et al., SC24, section 3).
  result<void> broadcast(const void* in, void* out, std::uint64_t count, dtype t, std::uint32_t root,
                         algorithm a = algorithm::automatic);

  /// Installs the engine of a user reduction on this rank's NIC. Every rank must add the same
  /// reductions in the same order. The package is loaded where the NIC runs (this process, or
  /// the spin-emu process of communicator::connect). Errors: invalid_argument (elem/acc sizes
  /// are zero or above 4096, the package is not a collective engine), those of loading the
  /// package there (invalid_argument: an object the loader refuses; not_supported: another
  /// handler ABI or machine), no_space (15 reductions already), and those of create's
  /// installation and set-up.
  result<custom_op> add_reduction(const reduction& r);

  /// `bytes` of arena memory that collectives use in place (no staging copy), 64-byte aligned;
  /// empty when the arena is full. Freed by free() or with the communicator.
  std::span<std::byte> alloc(std::size_t bytes);
  void free(std::span<std::byte> buffer);

  comm_stats stats() const;
  /// The NIC's clock, which the communicator's deadlines use: steady_clock, or for a NIC in
  /// virtual time (spin::sim in this process, or spin-emu --virtual-time) the simulation's time
  /// as steady_clock's epoch plus the virtual ns (emu::nic_control::now). Time a collective in
  /// virtual time by reading it before and after the call. The communicator's thread.
  std::chrono::steady_clock::time_point now() const noexcept;
  /// The engine's counters on the NIC of the first engine (packets it ignored, by
  /// proto::drop_reason, and sent, by proto::kind),
  /// read through the NIC's host interface. Errors: those of a command to the engine
  /// (timeout: no answer within options::timeout).
  result<proto::engine_counters> engine_counters();

  struct impl;

private:
  // allreduce_sparse's agreement for a caller whose arguments a typed form refused (`why`):
  // every rank learns this rank is at fault; returns that error.
  result<void> sparse_refused(const char* why, std::uint64_t length, dtype t, algorithm a);
  static result<std::unique_ptr<communicator>> create_on(std::unique_ptr<detail::nic_handle> nic, const group& g, const options& o);
  explicit communicator(std::unique_ptr<impl> p);
  std::unique_ptr<impl> _p;
};

/// The dtype of a C++ element type.
template <class T> constexpr dtype dtype_of();
template <> constexpr dtype dtype_of<float>() { return dtype::f32; }
template <> constexpr dtype dtype_of<double>() { return dtype::f64; }
template <> constexpr dtype dtype_of<f16_bits>() { return dtype::f16; }
template <> constexpr dtype dtype_of<bf16_bits>() { return dtype::bf16; }
template <> constexpr dtype dtype_of<std::int32_t>() { return dtype::i32; }
template <> constexpr dtype dtype_of<std::int64_t>() { return dtype::i64; }
template <> constexpr dtype dtype_of<std::uint32_t>() { return dtype::u32; }
template <> constexpr dtype dtype_of<std::uint64_t>() { return dtype::u64; }

template <class T>
result<void> communicator::allreduce(std::span<const T> in, std::span<T> out, op o, algorithm a) {
  if (in.size() != out.size()) return fail(errc::invalid_argument, "allreduce: input and output sizes differ");
  return allreduce(in.data(), out.data(), in.size(), dtype_of<T>(), o, a);
}

template <class T>
result<void> communicator::allreduce_sparse(std::span<const std::uint32_t> index, std::span<const T> values,
                                            std::uint64_t length, std::span<T> dense_out, algorithm a) {
  if (index.size() != values.size()) return sparse_refused("its index and value counts differ", length, dtype_of<T>(), a);
  if (dense_out.size() != length) return sparse_refused("its output does not hold length values", length, dtype_of<T>(), a);
  return allreduce_sparse(index, values.data(), length, dtype_of<T>(), dense_out.data(), a);
}

template <class T>
result<void> communicator::allreduce_sparse(std::span<const std::uint32_t> index, std::span<const T> values,
                                            std::uint64_t length, std::vector<std::uint32_t>& index_out,
                                            std::vector<T>& values_out, algorithm a) {
  if (index.size() != values.size()) return sparse_refused("its index and value counts differ", length, dtype_of<T>(), a);
  std::vector<std::byte> raw;
  auto r = allreduce_sparse(index, values.data(), length, dtype_of<T>(), index_out, raw, a);
  if (!r.ok()) return r;
  values_out.resize(raw.size() / sizeof(T));
  if (!raw.empty()) std::memcpy(values_out.data(), raw.data(), raw.size());
  return r;
}

/// Bytes of one element of `t` (0 for custom). A block format's element is a whole block
/// (block_values(t) values: 33 bytes for mxfp8_e4m3, docs/collectives.md "Block formats").
std::uint32_t elem_bytes(dtype t);

} // namespace spin::coll
