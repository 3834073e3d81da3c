// The link model of spin-emu's emulated network: one direction of a cable with a rate, a
// latency and random loss, duplication and reordering. `link_sim` is the pure model (no DPDK,
// unit-testable); `link` moves mbufs between two rte_rings according to it.
#pragma once

#include <spin/result.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

struct rte_mbuf;
struct rte_ring;
struct rte_mempool;

namespace spin::emu {

/// What a link does when it already holds `link_model::queue_packets` packets and another one
/// arrives on its input ring.
enum class overflow_policy : std::uint8_t {
  drop,          ///< tail drop: the packet is freed and counted as `dropped_queue_full`
  backpressure,  ///< the packet stays in the input ring until the link has room (no drop)
};

/// Parameters of one link direction. Probabilities are per packet and independent.
struct link_model {
  /// Line rate in Gbit/s (10^9 bit/s); 0 = unlimited (no serialisation delay). Used with a
  /// resolution of 1 kbit/s; the smallest non-zero rate is 1e-6 Gbit/s.
  double rate_gbps = 0;
  /// Propagation delay added to every packet, at most 1 s (LogGP's L).
  std::chrono::nanoseconds latency{0};
  /// Shortest time between the starts of two packets on the link, whatever their sizes (LogGP's
  /// g; the per-byte gap G is 8 / rate_gbps ns), in [0, 1e9] ns. 0 (the default): none.
  double gap_ns = 0;
  double loss = 0;       ///< probability that a packet is lost, in [0, 1)
  double duplicate = 0;  ///< probability that a delivered packet arrives twice, in [0, 1)
  double reorder = 0;    ///< probability that a packet is held back by `reorder_delay`, in [0, 1)
  /// Extra delay of a reordered packet, at most 1 s. 0 = latency + 4 serialisation times of a
  /// 1500-byte frame, at least 10 us (see `effective_reorder_delay`).
  std::chrono::nanoseconds reorder_delay{0};
  /// Seed of the link's random decisions: the same seed and the same packets (lengths and
  /// arrival times) give the same fates.
  std::uint64_t seed = 1;
  /// Packets the link may hold in flight (waiting for serialisation, on the wire, or waiting
  /// for room in the output ring), 1 .. 2^20.
  std::uint32_t queue_packets = 4096;
  /// What happens to a packet that arrives while the link holds `queue_packets` packets.
  overflow_policy on_full = overflow_policy::drop;

  bool operator==(const link_model&) const = default;
};

/// Largest accepted `link_model::latency` and `reorder_delay`.
inline constexpr std::chrono::nanoseconds max_link_delay = std::chrono::seconds(1);
/// Largest accepted `link_model::queue_packets`.
inline constexpr std::uint32_t max_link_queue_packets = 1u << 20;
/// Largest accepted `link_model::rate_gbps` (10 Tbit/s).
inline constexpr double max_link_rate_gbps = 10000.0;

/// Checks every field of `m`. Errors (invalid_argument, the message names the field as the
/// topology file spells it and the bad value): rate_gbps NaN, negative, non-zero below 1e-6 or
/// above 10000; loss/duplicate/reorder NaN, negative or >= 1; latency_ns or reorder_delay_ns
/// negative or above 1 s; queue_packets 0 or above 2^20.
result<void> validate(const link_model& m);

/// Name of `p` as the topology file spells it ("drop", "backpressure").
const char* overflow_policy_name(overflow_policy p) noexcept;

/// The reorder delay `m` applies: `m.reorder_delay` when non-zero, else latency + 4
/// serialisation times of a 1500-byte frame, at least 10 us.
std::chrono::nanoseconds effective_reorder_delay(const link_model& m) noexcept;

namespace detail {
/// The first invalid field of `m` as {key as the topology file spells it, message}; nullopt
/// when `m` is valid. validate() and the topology parser share it.
struct bad_field {
  const char* key;
  std::string message;
};
std::optional<bad_field> first_bad_field(const link_model& m);
}  // namespace detail

/// xoshiro256** (Blackman and Vigna), seeded through splitmix64. Implemented here rather than
/// taken from <random> so that a seed gives the same numbers with every standard library.
class prng {
public:
  /// Seeds the four state words from splitmix64(seed) (any seed, 0 included, is valid).
  explicit prng(std::uint64_t seed) noexcept;
  /// The next 64-bit value.
  std::uint64_t next() noexcept;
  /// The next value as a double uniformly distributed in [0, 1) (53 random bits).
  double next_unit() noexcept;

private:
  std::uint64_t _s[4];
};

/// What the link does with one packet (the result of `link_sim::on_packet`).
struct fate {
  bool drop = false;       ///< lost on the wire; the other fields are then meaningless
  bool duplicate = false;  ///< a second copy arrives at `duplicate_deliver_ns`
  std::uint64_t deliver_ns = 0;  ///< when the packet reaches the receiver (caller's clock)
  bool reordered = false;  ///< deliver_ns includes the reorder delay
  /// When the duplicate arrives: one serialisation time after `deliver_ns`.
  std::uint64_t duplicate_deliver_ns = 0;
  bool operator==(const fate&) const = default;
};

/// One link direction as a pure model: no DPDK, no clock of its own, no allocation. Times are
/// ns on the caller's clock. Not thread-safe: one thread drives an instance.
///
/// Packet k (counting every on_packet call) draws exactly three random numbers (loss,
/// duplicate, reorder), so its fate depends only on the seed, k and the lengths and times
/// passed so far. A lost packet still occupies the wire for its serialisation time (it is lost
/// after being sent); a duplicate occupies it for one more.
class link_sim {
public:
  /// `m` must be valid (validate(m)); an invalid model gives unspecified (but memory-safe)
  /// delays.
  explicit link_sim(const link_model& m) noexcept;

  /// Decides the fate of a packet of `len_bytes` handed to the link at `now_ns`. Start =
  /// max(now_ns, busy_until); departure = start + serialisation time (ceil(len_bytes * 8 /
  /// rate) ns, 0 at unlimited rate); the wire is busy until start + max(serialisation time,
  /// gap_ns rounded up); arrival = departure + latency (+ reorder delay when reordered).
  fate on_packet(std::uint32_t len_bytes, std::uint64_t now_ns) noexcept;

  /// Serialisation time of `len_bytes` in ns, rounded up (0 at unlimited rate).
  std::uint64_t serialisation_ns(std::uint32_t len_bytes) const noexcept;
  /// When the wire becomes free (ns, caller's clock).
  std::uint64_t busy_until_ns() const noexcept { return _busy_until_ns; }
  /// Packets decided so far.
  std::uint64_t packets() const noexcept { return _packets; }
  /// The model this simulation runs.
  const link_model& model() const noexcept { return _model; }

private:
  link_model _model;
  std::uint64_t _rate_kbps = 0;  // 0 = unlimited
  std::uint64_t _latency_ns = 0;
  std::uint64_t _reorder_delay_ns = 0;
  std::uint64_t _busy_until_ns = 0;
  std::uint64_t _packets = 0;
  prng _rng;
};

/// A snapshot of a link's counters. With `duplicated` counting every duplicate the model asked
/// for, packets_in + duplicated = delivered + dropped_loss + dropped_queue_full + dup_no_mbuf
/// + held at every snapshot taken while the link is idle.
struct link_stats {
  std::uint64_t packets_in = 0;    ///< packets taken from the input ring
  std::uint64_t bytes_in = 0;      ///< their frame bytes (rte_pktmbuf_pkt_len)
  std::uint64_t packets_delivered = 0;  ///< packets put on the output ring (duplicates included)
  std::uint64_t bytes_delivered = 0;
  std::uint64_t dropped_loss = 0;        ///< lost by the model (`link_model::loss`)
  std::uint64_t dropped_queue_full = 0;  ///< the link held queue_packets (originals or duplicates)
  std::uint64_t duplicated = 0;    ///< duplicates the model decided (made or not)
  std::uint64_t dup_no_mbuf = 0;   ///< duplicates not made: the copy pool had no mbuf
  std::uint64_t reordered = 0;     ///< packets delayed by the reorder delay
  std::uint64_t output_stalls = 0; ///< polls where a due packet found the output ring full
  std::uint64_t held = 0;          ///< gauge: packets the link holds now
};

/// The snapshot as a JSON object with the field names above.
std::string to_json(const link_stats& s);

/// One link direction of the emulated network: takes mbufs from `in` (the sender port's TX
/// ring), holds each until the model says it arrives, then puts it on `out` (the receiver
/// port's RX ring).
///
/// Thread rules: exactly one thread calls poll() (the rings are used single-consumer on `in`
/// and single-producer on `out`, so no other thread may dequeue from `in` or enqueue to `out`);
/// stats() and to_json() may be called from any thread at any time. Data path: poll() does not
/// allocate, lock or make syscalls.
///
/// Ownership: mbufs taken from `in` belong to the link until they are on `out` or freed. The
/// rings and the pool are borrowed and must outlive the link; the destructor frees every mbuf
/// the link holds (not those still in `in` or already in `out`).
///
/// Name it `emu::link` (or `spin::emu::link`): after `using namespace spin::emu`, a bare `link`
/// is ambiguous with POSIX link(2) from <unistd.h>.
class link {
public:
  /// Packets per ring operation.
  static constexpr std::uint32_t burst = 32;
  /// Bursts of input and of output one poll() handles at most.
  static constexpr std::uint32_t max_bursts_per_poll = 4;

  /// Creates a link. `dup_pool` supplies the deep copies of duplicated packets (handlers
  /// modify frames in place, so a duplicate may not share data with its original); it may be
  /// null when `m.duplicate` is 0. Allocates the holding heap (queue_packets entries) here.
  /// Control path. Errors: invalid_argument (null `in` or `out`, `in` == `out`, null `dup_pool`
  /// with duplicate > 0, or an invalid model: the message is validate()'s), no_memory (the
  /// heap cannot be allocated).
  static result<std::unique_ptr<link>> create(rte_ring* in, rte_ring* out, rte_mempool* dup_pool,
                                              const link_model& m);

  /// Frees every mbuf the link holds.
  ~link();
  link(const link&) = delete;
  link& operator=(const link&) = delete;

  /// Moves packets: delivers held packets due at `now_ns` (in (deliver_ns, arrival order)
  /// order) to `out`, takes new packets from `in` and decides their fates, and delivers again
  /// (packets with no delay leave in the same call). Handles at most max_bursts_per_poll bursts
  /// of each. Packets due while `out` is full stay held, in order, and go on a later poll.
  /// `now_ns` is the caller's monotonic clock (now_ns() or a fake one) and must not go
  /// backwards. Returns the packets taken plus the packets delivered (0: nothing to do now).
  std::uint32_t poll(std::uint64_t now_ns) noexcept;

  /// Delivery time of the earliest held packet (ns), or nullopt when the link holds none: a
  /// poller may sleep until then when the input ring is empty. Poll thread only.
  std::optional<std::uint64_t> next_due_ns() const noexcept;

  /// A snapshot of the counters (relaxed loads; any thread).
  link_stats stats() const noexcept;
  /// stats() as JSON (any thread).
  std::string to_json() const;
  /// The model the link runs.
  const link_model& model() const noexcept { return _sim.model(); }

  /// CLOCK_MONOTONIC in ns (vDSO, no syscall): the clock the cluster passes to poll().
  static std::uint64_t now_ns() noexcept;

private:
  struct entry {
    std::uint64_t deliver_ns;
    std::uint64_t seq;
    rte_mbuf* m;
  };
  struct counters {
    std::atomic<std::uint64_t> packets_in{0}, bytes_in{0}, packets_delivered{0},
        bytes_delivered{0}, dropped_loss{0}, dropped_queue_full{0}, duplicated{0}, dup_no_mbuf{0},
        reordered{0}, output_stalls{0}, held{0};
  };

  link(rte_ring* in, rte_ring* out, rte_mempool* pool, const link_model& m,
       std::unique_ptr<entry[]> heap);
  static bool before(const entry& x, const entry& y) noexcept;
  void push(const entry& e) noexcept;
  entry pop() noexcept;
  std::uint32_t deliver(std::uint64_t now_ns, std::uint32_t& bursts_left) noexcept;
  std::uint32_t ingest(std::uint64_t now_ns) noexcept;

  rte_ring* _in;
  rte_ring* _out;
  rte_mempool* _pool;
  link_sim _sim;
  std::unique_ptr<entry[]> _heap;
  std::uint32_t _cap;
  std::uint32_t _size = 0;
  std::uint64_t _seq = 0;
  counters _c;
};

}  // namespace spin::emu
