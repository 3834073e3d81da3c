// The collective engine's state in handler memory: the banks of the two live epochs, aggregator
// slot headers, pins and the roles and geometry of a collective. Part of spin/coll/engine.hpp.
#pragma once

#include <spin/coll/protocol.hpp>
#include <spin/coll/types.hpp>
#include <spin/handler.hpp>

namespace spin::coll {

namespace engine_detail {
using namespace spin::coll::proto;

/// Reads from host memory one invocation keeps in flight when a worker starts its switch
/// contributions (engine::originate_up_burst): at PsPIN's 500 ns PCIe latency and 512 Gbit/s,
/// 8 reads of 4 KiB cover a read's round trip (1.06 us) with transfers.
inline constexpr u32 burst_bufs = 8;

enum phase : u32 { ph_idle = 0, ph_started = 1, ph_running = 2, ph_failed = 3 };

/// The state of one epoch. Two banks alternate (epoch & 1): when epoch k+1 starts anywhere,
/// every rank has finished k-1 (docs/collectives.md, "Epochs").
struct bank {
  u64 lock;
  u64 active;          // handlers inside the bank (pin); a reset waits for them to leave
  u32 epoch;
  u32 phase;           // phase; written under the lock, read with acquire
  start_desc d;        // this rank's start descriptor (valid from ph_started)
  u64 hello_bits[max_ranks / 64];
  params hellos[max_ranks];
  u64 done_bits[max_ranks / 64];  // reduce-scatter: ranks that said k_done
  u64 next_orig;       // packets of this rank's chunk originated so far
  u64 results;         // distinct results held
  u64 acks;            // distinct packets of this rank's chunk known delivered
  u32 complete;        // 1 once every result is held and every originated packet delivered
  u32 succ_complete;   // 1 once the successor said k_done
  u32 done_posted;
  u32 agreed;          // 1 once every hello is in and agrees (verdict)
  u32 repaired;        // 1 once a repair tick found the epoch stalled (ev_done tells the host)
  u32 pad_repaired;
  u64 progress;        // bumped by anything new; repair acts only when it stalls
  u64 progress_seen;   // progress at the previous repair tick
  u64 held[max_packets / 64];   // results this rank holds
  u64 acked[max_packets / 64];  // packets this rank originated that reached the end of their path
  // host_ring: the transfer in progress and what arrived.
  u32 xfer_phase;
  u32 xfer_chunk;
  u64 xfer_off;
  u64 xfer_next;       // packets of the transfer sent so far
  u64 xfer_acks;       // packets of the transfer acknowledged
  u32 rcv_count[2][max_ranks];  // packets received, by phase and chunk
  u64 rs_held[max_packets / 64];   // reduce-scatter packets received (allgather ones: held)
  u64 rs_acked[max_packets / 64];  // reduce-scatter packets acknowledged (allgather ones: acked)
  // Switch aggregation: the start's reads from host memory in flight (originate_up_burst).
  // Last: claim clears the bank before them.
  u8 burst[burst_bufs][max_packet_bytes];
  dma_handle burst_dma[burst_bufs];  // their DMAs (in handler memory: the stack has no room)
  send_desc burst_desc;              // and the descriptor of the packet it sends
  u32 burst_ok;                      // bit i: burst[i]'s read was issued
  u32 pad_burst;
};

enum role : u32 { role_member = 0, role_switch = 1, role_leaf = 2 };

struct state {
  u64 setup_lock;
  u32 me;
  u32 nranks;          // 0 until cmd_setup / cmd_switch_setup
  u32 comm_id;
  u32 role;            // role_member, role_switch or role_leaf
  u32 slots;           // switch: aggregator slots (each with two shadow copies)
  u32 slot_bytes;      // switch: largest contribution
  u64 slot_stride;     // switch: bytes of one slot copy (header, n contributions, result)
  u64 send_seq;        // message ids of packets this NIC sends
  u32 agreed_once;     // 1 once a verdict agreed here: every member's engine was set up (starts_early)
  u32 pad_agreed;
  u64 drops[dr_count];
  u64 sent[kind_count];  // packets sent, by kind
  u32 members[max_ranks];  // NIC rank of each member (a leaf: its local members)
  u32 parent;              // a leaf: NIC rank of its root
  u32 nleaves;             // a root of a hierarchy: leaves below it
  u32 leaves[max_leaves];  // their NIC ranks
  // switch_agg allreduce: bit x is the shadow copy of slot x that the next epoch's first round
  // uses, the copy the last completed epoch did not use last (see shadow_of).
  u64 slot_parity[(max_switch_slots + 1) / 64];
  bank banks[2];
};

/// One shadow copy of an aggregator slot on a switch; its contributions (one per rank, element
/// format) and its result follow it in handler memory.
struct slot_hdr {
  u64 lock;
  u32 used;        // 1 once a packet claimed it
  u32 epoch;       // the packet it holds: (epoch, pkt)
  u32 pkt;
  u32 chunk;
  u32 nelems;
  u32 count;       // contributions held
  u32 complete;    // every contribution is in (a leaf: its partial went up)
  u32 final;       // a leaf: the root's result is in (it replaced the partial)
  u32 pad2;
  u8 op;
  u8 dtype;
  u16 pad;
  u64 bits[max_ranks / 64];  // ranks (or leaves) whose contribution it holds
};
/// Handler memory of a switch engine before its slots (the member state, unused there).
inline constexpr u64 slots_offset() { return (sizeof(state) + 63) & ~u64{63}; }
/// Bytes of one slot copy for `nranks` ranks and contributions of `slot_bytes`.
constexpr u64 slot_stride_bytes(u32 nranks, u32 slot_bytes) {
  return (sizeof(slot_hdr) + (u64{nranks} + 1) * slot_bytes + 63) & ~u64{63};
}

inline u64 load_acq(const u64* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline u32 load_acq(const u32* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void store_rel(u32* p, u32 v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline u64 add(u64* p, u64 v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
inline u32 swap(u32* p, u32 v) { return __atomic_exchange_n(p, v, __ATOMIC_ACQ_REL); }
/// Sequentially consistent exchange and load, for two flags that two threads each set and then
/// read the other's (a completion that waits for a verdict: one of the two sees both set).
inline u32 swap_sc(u32* p, u32 v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline u32 load_sc(const u32* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
/// Sets bit i; true when this call set it.
inline bool set_bit(u64* words, u64 i) {
  const u64 m = 1ull << (i & 63);
  return (__atomic_fetch_or(&words[i >> 6], m, __ATOMIC_ACQ_REL) & m) == 0;
}
inline bool test_bit(const u64* words, u64 i) { return (load_acq(&words[i >> 6]) & (1ull << (i & 63))) != 0; }

inline void drop(state* s, drop_reason r) { add(&s->drops[r], 1); }
inline bool epoch_newer(u32 a, u32 b) { return static_cast<i32>(a - b) > 0; }

inline u64 offset_of_lock(const state* s, const bank* b) {
  return static_cast<u64>(reinterpret_cast<const u8*>(&b->lock) - reinterpret_cast<const u8*>(s));
}

/// Keeps a bank from being reset to a newer epoch while a handler uses it.
struct pin {
  bank* b = nullptr;
  pin() = default;
  pin(const pin&) = delete;
  pin& operator=(const pin&) = delete;
  ~pin() {
    if (b != nullptr) __atomic_fetch_sub(&b->active, 1, __ATOMIC_ACQ_REL);
  }
  /// Enters bank `bk` if it holds `epoch` in phase `ph` (or any phase but idle when ph is 0).
  bool enter(bank* bk, u32 epoch, u32 ph) {
    __atomic_fetch_add(&bk->active, 1, __ATOMIC_ACQ_REL);
    const u32 now = __atomic_load_n(&bk->phase, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&bk->epoch, __ATOMIC_ACQUIRE) != epoch || now == 0 || (ph != 0 && now != ph)) {
      __atomic_fetch_sub(&bk->active, 1, __ATOMIC_ACQ_REL);
      return false;
    }
    b = bk;
    return true;
  }
};

/// What one collective looks like from one rank: its kind, chunks and roles.
struct roles {
  coll_kind kind;
  u32 n;           // ranks
  u32 me;
  u32 root;
  bool via_switch;  // switch_agg: every rank sends every packet up to the switch
  bool via_host;    // host_ring: the NIC only moves chunks the host asks it to
  u32 slots;
  ring_geom g;

  static roles of(const bank* b, u32 me) {
    roles r;
    r.kind = static_cast<coll_kind>(b->d.p.kind);
    r.n = b->d.p.nranks;
    r.me = me;
    r.root = b->d.p.root;
    r.via_switch = b->d.p.algo == static_cast<u8>(algo::switch_agg);
    r.via_host = b->d.p.algo == static_cast<u8>(algo::host_ring);
    r.slots = b->d.p.slots;
    r.g = ring_geom::make(b->d.p.count, r.kind == coll_kind::broadcast ? 1 : r.n, b->d.p.pkt_elems);
    return r;
  }
  u32 succ_of(u32 x) const { return x + 1 == n ? 0 : x + 1; }
  u32 pred_of(u32 x) const { return x == 0 ? n - 1 : x - 1; }
  bool reduces() const { return kind == coll_kind::allreduce || kind == coll_kind::reduce_scatter; }
  bool gathers() const { return kind != coll_kind::reduce_scatter; }
  /// Allgather and broadcast end their result path with an acknowledgement.
  bool acks_results() const { return kind == coll_kind::allgather || kind == coll_kind::broadcast; }
  u32 owner(u64 c) const { return kind == coll_kind::broadcast ? root : static_cast<u32>(c); }
  /// The rank that sends chunk c's first packets.
  u32 originator(u64 c) const { return reduces() ? succ_of(owner(c)) : owner(c); }
  /// Last rank of chunk c's result path.
  u32 last(u64 c) const { return pred_of(owner(c)); }
  /// The chunk this rank originates, or ~0 when none.
  u64 my_chunk() const {
    if (kind == coll_kind::broadcast) return me == root ? 0 : ~0ull;
    return reduces() ? pred_of(me) : me;
  }
  /// Packets this rank originates whose delivery it must see acknowledged (the switch's
  /// results are the acknowledgement of a switch_agg packet: none).
  u64 my_chunk_packets() const {
    return (via_switch && !multicast()) || my_chunk() == ~0ull ? 0 : g.chunk_packets(my_chunk());
  }
  /// Allgather and broadcast through a switch: blocks go up once and come down replicated
  /// (Khalilov et al., SC24).
  bool multicast() const { return via_switch && kind != coll_kind::allreduce; }
  /// Results this rank must hold.
  u64 results_needed() const { return kind == coll_kind::reduce_scatter ? g.chunk_packets(me) : g.total; }
};

inline u64 addr(const buffer_desc& b, const ring_geom& g, u64 c, u64 e, u32 eb) {
  return b.blocked != 0 ? b.off + c * b.stride + (e - g.chunk_lo(c)) * eb : b.off + e * eb;
}

/// True when every element of every chunk lies in the host window.
inline bool buffer_fits(const buffer_desc& b, const ring_geom& g, u32 chunks, u32 eb, u64 window) {
  if (b.blocked == 0) return b.off <= window && g.count <= spin::div(window - b.off, u64{eb});
  const u64 longest = g.chunk_len(0);  // the first chunk is never shorter than the others
  if (b.stride != 0 && chunks > 1 && b.stride > spin::div(window, u64{chunks})) return false;
  const u64 last_base = b.off + (chunks - 1) * b.stride;
  return b.off <= window && last_base <= window && longest * eb <= window - last_base;
}
} // namespace engine_detail
} // namespace spin::coll
