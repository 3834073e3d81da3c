// The collective engine: the handler that runs a communicator's collectives on a NIC
// (docs/collectives.md). It is a template over the reductions it knows, so a user's reduction
// becomes a package of its own with the whole engine inside (docs/handler-guide.md, "Custom
// reductions"):
//
//   struct complex_prod { using elem = ...; using acc = ...; widen, combine, narrow };
//   SPIN_COLL_ENGINE(spin::coll::single_reduction<complex_prod>)
//
// One payload handler serves every packet kind of spin/coll/protocol.hpp. Native target only
// (float reductions; the engine's state is larger than an eBPF window).
//
// Paths (docs/collectives.md, "Edge ring"): a reduce-scatter packet of chunk c starts at c's
// originator c+1 and is folded at every rank up to c's owner c; a result packet of chunk c
// starts at c's owner and is passed on up to the owner's predecessor. Allreduce does both;
// reduce-scatter ends at the owner, which acknowledges to the originator; allgather and
// broadcast start with results, and the last rank of the path acknowledges to the owner.
//
// Concurrency: payload handlers of different packets run at once on several HPUs. Bank state
// changes (claim, start, verdict) take the bank's lock; data packets read the start descriptor
// only after seeing the bank running (acquire), and mark results in bitmaps with atomic
// read-modify-writes, which is what makes duplicates harmless: a result counts once, the first
// time its bit is set.
#pragma once

#include <spin/coll/protocol.hpp>
#include <spin/siphash.hpp>
#include <spin/coll/types.hpp>
#include <spin/handler.hpp>

namespace spin::coll {

/// The reductions of the standard package: every op x dtype of types.hpp.
struct standard_reductions {
  /// Calls f.template operator()<R>() for the reduction of (o, t); false when unknown.
  template <class F> static bool dispatch(u8 o, u8 t, F&& f) {
    return with_standard(static_cast<op>(o), static_cast<dtype>(t), static_cast<F&&>(f));
  }
};

/// A package with one user reduction R, reached as op::custom / dtype::custom.
template <class R> struct single_reduction {
  template <class F> static bool dispatch(u8 o, u8 t, F&& f) {
    if (o != static_cast<u8>(op::custom) || t != static_cast<u8>(dtype::custom)) return false;
    f.template operator()<R>();
    return true;
  }
};

namespace engine_detail {
using namespace spin::coll::proto;

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

template <class Red> struct engine {
  // ---- sending ---------------------------------------------------------------------------------
  static errc send(spin::ctx* ctx, state* s, u32 to, u32 kind, u32 epoch, u32 aux, u32 elems, const void* data,
                   u32 len, const params& p, u16 slot = 0) {
    return send_to_rank(ctx, s, s->members[to], kind, epoch, aux, elems, data, len, p, slot);
  }
  /// The descriptor of a one-packet engine message of `kind` (its message id and destination
  /// are the caller's).
  static send_desc engine_desc(const state* s, u32 kind, u32 epoch, u32 aux, u32 elems, const void* data, u32 len,
                               const params& p, u16 slot) {
    send_desc d{};
    d.size_bytes = sizeof(send_desc);
    d.match_bits = match_bits(s->comm_id, kind);
    d.offset_bytes = 0;
    d.message_len_bytes = len;
    d.data = data;
    d.len_bytes = len;
    d.flags = msg_start | msg_end | msg_coll;
    d.coll = coll_desc{p.op, p.dtype, slot, elems, epoch, aux};
    return d;
  }
  /// As send, to NIC rank `dest` (a switch) instead of a member.
  static errc send_to_rank(spin::ctx* ctx, state* s, u32 dest, u32 kind, u32 epoch, u32 aux, u32 elems, const void* data,
                           u32 len, const params& p, u16 slot = 0) {
    send_desc d = engine_desc(s, kind, epoch, aux, elems, data, len, p, slot);
    d.dest_rank = dest;
    d.message_id = add(&s->send_seq, 1);
    const errc e = ctx->send(d);
    if (e != errc::ok) drop(s, dr_send);
    else add(&s->sent[kind % kind_count], 1);
    return e;
  }
  /// As send_to_rank, to every NIC rank of `to[0..count)` at once: the NIC reads the payload
  /// once and, where it can, its copies share it instead of copying it per destination.
  static void send_all(spin::ctx* ctx, state* s, const u32* to, u32 count, u32 kind, u32 epoch, u32 aux, u32 elems,
                       const void* data, u32 len, const params& p, u16 slot) {
    send_desc d = engine_desc(s, kind, epoch, aux, elems, data, len, p, slot);
    d.message_id = add(&s->send_seq, count);  // one id per copy: message_id .. + count - 1
    const i32 sent = ctx->multicast(d, to, count);
    if (sent > 0) add(&s->sent[kind % kind_count], static_cast<u64>(sent));
    for (u32 i = sent > 0 ? static_cast<u32>(sent) : 0; i < count; ++i) drop(s, dr_send);
  }
  /// A control packet (k_hello_req, k_done, k_done_req, k_ack): aux is the packet index for
  /// k_ack, else the sender.
  static void send_ctl(spin::ctx* ctx, state* s, u32 to, u32 kind, u32 epoch, const params& p, u32 aux, u16 slot = 0) {
    ctl* c = ctx->scratchpad<ctl>(max_packet_bytes - sizeof(ctl));
    if (c == nullptr) return;
    c->sender = s->me;
    c->reserved = 0;
    send(ctx, s, to, kind, epoch, aux, 0, c, sizeof(ctl), p, slot);
  }
  static void send_hello(spin::ctx* ctx, state* s, bank* b, u32 to) {
    hello* h = ctx->scratchpad<hello>(0);
    if (h == nullptr) return;
    h->sender = s->me;
    h->reserved = 0;
    h->p = b->d.p;
    send(ctx, s, to, k_hello, b->epoch, s->me, 0, h, sizeof(hello), b->d.p);
  }

  // ---- banks -------------------------------------------------------------------------------------
  /// The bank of `epoch`, reset for it when it held an older epoch; null when `epoch` is older
  /// than what the bank holds (a stale packet).
  static bank* claim(spin::ctx* ctx, state* s, u32 epoch) {
    bank* b = &s->banks[epoch & 1];
    if (load_acq(&b->epoch) == epoch && load_acq(&b->phase) != ph_idle) return b;
    const u64 lk = offset_of_lock(s, b);
    if (ctx->lock(lk) != errc::ok) return nullptr;
    bank* r = b;
    if (b->epoch != epoch) {
      if (epoch_newer(epoch, b->epoch) || b->phase == ph_idle) {
        // Close the bank to handlers of the old epoch, wait for those inside, then clear
        // everything after the lock and active words.
        store_rel(&b->phase, ph_idle);
        while (load_acq(&b->active) != 0) {
        }
        u8* first = reinterpret_cast<u8*>(&b->epoch);
        const u64 n = sizeof(bank) - 2 * sizeof(u64);
        for (u64 i = 0; i < n; ++i) first[i] = 0;
        __atomic_store_n(&b->epoch, epoch, __ATOMIC_RELEASE);
      } else {
        r = nullptr;
      }
    }
    ctx->unlock(lk);
    return r;
  }
  /// The bank of `epoch` only if it already holds it.
  static bank* find(state* s, u32 epoch) {
    bank* b = &s->banks[epoch & 1];
    return load_acq(&b->epoch) == epoch ? b : nullptr;
  }

  // ---- reductions --------------------------------------------------------------------------------
  struct fold_fn {
    void* acc;
    const void* elem;
    u32 n;
    template <class R> void operator()() const { fold_n<R>(acc, elem, n); }
  };
  struct widen_fn {
    void* acc;
    const void* elem;
    u32 n;
    template <class R> void operator()() const { widen_n<R>(acc, elem, n); }
  };
  struct narrow_fn {
    void* elem;
    const void* acc;
    u32 n;
    template <class R> void operator()() const { narrow_n<R>(elem, acc, n); }
  };
  struct widen_fold_fn {
    void* acc;
    const void* first;
    const void* second;
    u32 n;
    template <class R> void operator()() const { widen_fold_n<R>(acc, first, second, n); }
  };
  struct fold_narrow_fn {
    void* elem;
    const void* acc;
    const void* last;
    u32 n;
    template <class R> void operator()() const { fold_narrow_n<R>(elem, acc, last, n); }
  };
  struct size_fn {
    u32* elem;
    u32* acc;
    template <class R> void operator()() const {
      *elem = sizeof(typename R::elem);
      *acc = sizeof(typename R::acc);
    }
  };

  // ---- the ring ----------------------------------------------------------------------------------
  /// Sends the first packet of packet `pkt` of this rank's chunk. A repeat (`again`) carries
  /// `ring_again`: ranks that hold it already pass it on to the end of its path, whose
  /// acknowledgement may be what was lost.
  static void originate(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 pkt, bool again = false) {
    const u64 c = r.my_chunk();
    const u64 lo = r.g.packet_lo(c, pkt);
    const u32 n = static_cast<u32>(r.g.packet_len(c, pkt));
    const params& p = b->d.p;
    u8* el = ctx->scratchpad<u8>(0, max_packet_bytes);
    u8* acc = ctx->scratchpad<u8>(max_packet_bytes, max_packet_bytes);
    if (el == nullptr || acc == nullptr) return;
    if (ctx->dma_from_host(el, addr(b->d.in, r.g, c, lo, p.elem_bytes), u64{n} * p.elem_bytes) != errc::ok) {
      drop(s, dr_dma);
      return;
    }
    if (r.reduces()) {
      Red::dispatch(p.op, p.dtype, widen_fn{acc, el, n});
      send(ctx, s, r.succ_of(s->me), k_rs, b->epoch, static_cast<u32>(pkt), n, acc, n * p.acc_bytes, p);
      return;
    }
    // Allgather and broadcast: the origin holds its own block too.
    if (ctx->dma_to_host(addr(b->d.out, r.g, c, lo, p.elem_bytes), el, u64{n} * p.elem_bytes) != errc::ok) {
      drop(s, dr_dma);
      return;
    }
    if (set_bit(b->held, pkt)) {
      add(&b->results, 1);
      add(&b->progress, 1);
    }
    if (r.multicast())
      send_to_rank(ctx, s, b->d.switch_rank, k_mcast, b->epoch, static_cast<u32>(pkt), n, el, n * p.elem_bytes, p);
    else
      send(ctx, s, r.succ_of(s->me), k_ag, b->epoch, static_cast<u32>(pkt), n, el, n * p.elem_bytes, p,
           again ? ring_again : 0);
  }

  /// Originates up to `budget` packets of this rank's chunk that are not yet out.
  static void originate_next(spin::ctx* ctx, state* s, bank* b, const roles& r, u32 budget) {
    const u64 npk = r.my_chunk_packets();
    if (npk == 0) return;
    const u64 first = r.g.first_packet(r.my_chunk());
    for (u32 i = 0; i < budget; ++i) {
      const u64 k = add(&b->next_orig, 1);
      if (k >= npk) return;
      originate(ctx, s, b, r, first + k);
    }
  }

  static bool all_bits(const u64* words, u32 n) {
    for (u32 w = 0; w < max_ranks / 64; ++w) {
      const u64 lo = u64{w} * 64;
      if (lo >= n) break;
      const u64 want = n - lo >= 64 ? ~0ull : (1ull << (n - lo)) - 1;
      if ((load_acq(&words[w]) & want) != want) return false;
    }
    return true;
  }

  static void post_done_if_ready(spin::ctx* ctx, state* s, bank* b, const roles& r) {
    if (load_sc(&b->complete) == 0) return;
    // switch_agg: the switch serves repairs from its slots, never from this rank's memory; the
    // data went up before the verdict (see cmd_start), so the verdict must be in.
    const bool ready = r.via_switch && !r.multicast() ? load_sc(&b->agreed) != 0
                       : r.kind == coll_kind::reduce_scatter ? all_bits(b->done_bits, s->nranks)
                                                             : load_acq(&b->succ_complete) != 0;
    if (!ready || swap(&b->done_posted, 1) != 0) return;
    if (r.via_switch && !r.multicast()) advance_parity(s, r.g.total, r.slots);  // before the host may start the next call
    // The packets this rank originated: the host divides the epoch's time by its windows of
    // them for a round-trip sample (docs/collectives.md, "Repair timer").
    const u64 mine = r.via_switch && !r.multicast() ? r.g.total : r.my_chunk_packets();
    u64 sent = load_acq(&b->next_orig);
    if (sent > mine) sent = mine;
    ctx->post_event(event(ev_done, b->epoch, done_detail(load_acq(&b->repaired) != 0, sent)));
  }
  /// Completion (docs/collectives.md, "Completion"): every result held and every originated
  /// packet delivered. Allreduce, allgather and broadcast then wait for the successor (which
  /// this rank serves repairs from its output); reduce-scatter waits for every rank, because
  /// every rank's input may still be folded into a repaired packet.
  static void check_complete(spin::ctx* ctx, state* s, bank* b, const roles& r) {
    if (load_acq(&b->results) < r.results_needed() || load_acq(&b->acks) < r.my_chunk_packets()) return;
    if (swap_sc(&b->complete, 1) != 0) return;
    add(&b->progress, 1);
    if (r.via_switch && !r.multicast()) {
      // nothing to tell: see post_done_if_ready
    } else if (r.kind == coll_kind::reduce_scatter) {
      set_bit(b->done_bits, s->me);
      for (u32 i = 0; i < s->nranks; ++i)
        if (i != s->me) send_ctl(ctx, s, i, k_done, b->epoch, b->d.p, s->me);
    } else {
      send_ctl(ctx, s, r.pred_of(s->me), k_done, b->epoch, b->d.p, s->me);
    }
    post_done_if_ready(ctx, s, b, r);
  }

  /// ph_started -> ph_running (exactly once): originate the first window.
  static void run(spin::ctx* ctx, state* s, bank* b) {
    const u64 lk = offset_of_lock(s, b);
    if (ctx->lock(lk) != errc::ok) return;
    const bool go = b->phase == ph_started;
    if (go) store_rel(&b->phase, ph_running);
    ctx->unlock(lk);
    if (!go) return;
    add(&b->progress, 1);
    const roles r = roles::of(b, s->me);
    if (r.via_host) {
      ctx->post_event(event(ev_go, b->epoch, 0));  // the host drives every step
      return;
    }
    if (r.via_switch && !r.multicast()) {
      // One packet per slot: the first `slots` packets go at once (SwitchML's worker start).
      for (u64 j = 0; j < r.g.total && j < r.slots; ++j) originate_up(ctx, s, b, r, j);
    } else {
      originate_next(ctx, s, b, r, b->d.window);
    }
    check_complete(ctx, s, b, r);
  }

  // ---- host_ring: the NIC as plain reliable transport (docs/collectives.md, "Host ring") ------
  static u64* rcv_bits(bank* b, u32 phase) { return phase == xfer_rs ? b->rs_held : b->held; }
  static u64* ack_bits(bank* b, u32 phase) { return phase == xfer_rs ? b->rs_acked : b->acked; }
  static u32 xfer_bytes(const bank* b, u32 phase) { return phase == xfer_rs ? b->d.p.acc_bytes : b->d.p.elem_bytes; }

  /// Sends packet k of the current transfer (its chunk's k-th packet) to the successor.
  static void xfer_send(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 k, bool again) {
    const u64 c = b->xfer_chunk, g = r.g.first_packet(c) + k;
    const u32 n = static_cast<u32>(r.g.packet_len(c, g)), eb = xfer_bytes(b, b->xfer_phase);
    u8* buf = ctx->scratchpad<u8>(0, max_packet_bytes);
    if (buf == nullptr) return;
    if (ctx->dma_from_host(buf, b->xfer_off + k * b->d.p.pkt_elems * eb, u64{n} * eb) != errc::ok) {
      drop(s, dr_dma);
      return;
    }
    send(ctx, s, r.succ_of(s->me), k_xfer, b->epoch, static_cast<u32>(g), n, buf, n * eb, b->d.p,
         static_cast<u16>((b->xfer_phase << 1) | (again ? ring_again : 0)));
  }
  static void xfer_next_pkts(spin::ctx* ctx, state* s, bank* b, const roles& r, u32 budget) {
    const u64 npk = r.g.chunk_packets(b->xfer_chunk);
    for (u32 i = 0; i < budget; ++i) {
      const u64 k = add(&b->xfer_next, 1);
      if (k >= npk) return;
      xfer_send(ctx, s, b, r, k, false);
    }
  }

  static ret on_xfer_cmd(spin::ctx* ctx, state* s, const cmd* c) {
    bank* b = find(s, c->epoch);
    pin pn;
    if (b == nullptr || !pn.enter(b, c->epoch, ph_running)) return drop(s, dr_stale), ret::drop;
    const roles r = roles::of(b, s->me);
    if (!r.via_host || c->phase > xfer_ag || c->chunk >= r.n) return drop(s, dr_malformed), ret::drop;
    const u64 bytes = r.g.chunk_len(c->chunk) * xfer_bytes(b, c->phase);
    if (c->desc_off > ctx->host_window_len_bytes || bytes > ctx->host_window_len_bytes - c->desc_off)
      return drop(s, dr_malformed), ret::drop;
    // The host starts a transfer only after the previous one was acknowledged whole.
    b->xfer_phase = c->phase;
    b->xfer_chunk = c->chunk;
    b->xfer_off = c->desc_off;
    __atomic_store_n(&b->xfer_acks, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&b->xfer_next, 0, __ATOMIC_RELEASE);
    add(&b->progress, 1);
    if (r.g.chunk_packets(c->chunk) == 0) {
      ctx->post_event(event(ev_sent, b->epoch, (c->phase << 16) | c->chunk));
      return ret::success;
    }
    xfer_next_pkts(ctx, s, b, r, b->d.window);
    return ret::success;
  }

  /// A packet from the predecessor: land it, acknowledge it, and say when its chunk is whole.
  static ret on_xfer(spin::ctx* ctx, state* s) {
    if (ctx->msg.source_rank != s->members[s->me == 0 ? s->nranks - 1 : s->me - 1])
      return drop(s, dr_stranger), ret::drop;
    pin pn;
    if (!data_bank(ctx, s, ctx->coll.epoch, pn)) return ret::drop;
    bank* b = pn.b;
    const roles r = roles::of(b, s->me);
    const u32 phase = ctx->coll.slot >> 1;
    const u64 g = ctx->coll.aux;
    if (!r.via_host || phase > xfer_ag || g >= r.g.total) return drop(s, dr_malformed), ret::drop;
    const u64 c = r.g.chunk_of(g);
    const u32 n = static_cast<u32>(r.g.packet_len(c, g)), eb = xfer_bytes(b, phase);
    if (ctx->coll.elem_count != n || ctx->packet.size() != u64{n} * eb) return drop(s, dr_malformed), ret::drop;
    const u8* data = ctx->payload<u8>(0, u64{n} * eb);
    if (data == nullptr) return drop(s, dr_malformed), ret::drop;
    u64* bits = rcv_bits(b, phase);
    if (!test_bit(bits, g)) {
      const u64 lo = r.g.packet_lo(c, g);
      const u64 at = phase == xfer_rs ? b->d.recv_off + lo * eb : addr(b->d.out, r.g, c, lo, eb);
      if (ctx->dma_to_host(at, data, u64{n} * eb) != errc::ok) return drop(s, dr_dma), ret::drop;
      if (set_bit(bits, g)) {
        add(&b->progress, 1);
        const u32 got = __atomic_add_fetch(&b->rcv_count[phase][c], 1, __ATOMIC_ACQ_REL);
        if (got == r.g.chunk_packets(c)) ctx->post_event(event(ev_recv, b->epoch, (phase << 16) | static_cast<u32>(c)));
      }
    } else {
      drop(s, dr_duplicate);  // acknowledged again below: the first acknowledgement may be lost
    }
    send_ctl(ctx, s, r.pred_of(s->me), k_ack, b->epoch, b->d.p, static_cast<u32>(g), static_cast<u16>(phase << 1));
    return ret::success;
  }

  static ret on_xfer_ack(spin::ctx* ctx, state* s, bank* b, const roles& r) {
    const u32 phase = ctx->coll.slot >> 1;
    const u64 g = ctx->coll.aux;
    if (phase != b->xfer_phase || g >= r.g.total || r.g.chunk_of(g) != b->xfer_chunk) return drop(s, dr_stale), ret::drop;
    if (!set_bit(ack_bits(b, phase), g)) return drop(s, dr_duplicate), ret::drop;
    add(&b->progress, 1);
    const u64 acks = add(&b->xfer_acks, 1) + 1;
    xfer_next_pkts(ctx, s, b, r, 1);
    if (acks == r.g.chunk_packets(b->xfer_chunk)) ctx->post_event(event(ev_sent, b->epoch, (phase << 16) | b->xfer_chunk));
    return ret::success;
  }

  // ---- switch aggregation, worker side (docs/collectives.md, "Switch aggregation") -------------
  /// Sends this rank's contribution to packet j into slot j mod slots, shadow copy
  /// shadow_of(j).
  static void originate_up(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 j) {
    const u64 c = r.g.chunk_of(j);
    const u64 lo = r.g.packet_lo(c, j);
    const u32 n = static_cast<u32>(r.g.packet_len(c, j));
    const params& p = b->d.p;
    u8* el = ctx->scratchpad<u8>(0, max_packet_bytes);
    if (el == nullptr) return;
    if (ctx->dma_from_host(el, addr(b->d.in, r.g, c, lo, p.elem_bytes), u64{n} * p.elem_bytes) != errc::ok) {
      drop(s, dr_dma);
      return;
    }
    const u32 slot = static_cast<u32>(spin::rem(j, u64{r.slots})), shadow = shadow_of(s, r, j);
    send_to_rank(ctx, s, b->d.switch_rank, k_up, b->epoch, switch_aux(c, j), n, el, n * p.elem_bytes, p,
                 switch_slot(slot, shadow));
    // The highest packet sent so far bounds what repair resends.
    u64 hi = load_acq(&b->next_orig);
    while (hi < j + 1 && !__atomic_compare_exchange_n(&b->next_orig, &hi, j + 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
  }

  /// The shadow copy of packet j's slot: alternating per round within a call, as SwitchML's,
  /// and starting each call on the copy the last completed call did not end on. A rank starts
  /// its contributions before the verdict (starts_early) while a slower rank may still need the
  /// previous call's last results from the switch; those stay in the other copy until this
  /// call's second round in that slot, which needs every rank's first-round contribution, so
  /// every rank has finished the previous call by then.
  static u32 shadow_of(const state* s, const roles& r, u64 j) {
    const u64 x = spin::rem(j, u64{r.slots});
    return static_cast<u32>((spin::div(j, u64{r.slots}) & 1) ^ (test_bit(s->slot_parity, x) ? 1u : 0u));
  }
  /// After a completed call of `total` packets over `slots` slots: slot x was used
  /// total / slots + (x < total % slots) rounds; its next first round switches copy when that
  /// is odd. Every rank does this for the same agreed calls, so every rank's parity stays equal.
  static void advance_parity(state* s, u64 total, u32 slots) {
    const u64 full = spin::div(total, u64{slots}), rest = spin::rem(total, u64{slots});
    auto flip = [s](u64 n) {  // bits [0, n)
      for (u64 w = 0; w * 64 < n; ++w) {
        const u64 left = n - w * 64;
        __atomic_fetch_xor(&s->slot_parity[w], left >= 64 ? ~0ull : (1ull << left) - 1, __ATOMIC_ACQ_REL);
      }
    };
    if (full & 1) flip(slots);
    flip(rest);
  }

  static ret on_down(spin::ctx* ctx, state* s) {
    pin pn;
    if (!data_bank(ctx, s, ctx->coll.epoch, pn)) return ret::drop;
    bank* b = pn.b;
    const params& p = b->d.p;
    const roles r = roles::of(b, s->me);
    if (!r.via_switch || ctx->msg.source_rank != b->d.switch_rank) return drop(s, dr_stranger), ret::drop;
    const u64 j = ctx->coll.aux & 0xffffu, c = ctx->coll.aux >> 16;
    if (j >= r.g.total || r.g.chunk_of(j) != c) return drop(s, dr_malformed), ret::drop;
    const u32 n = static_cast<u32>(r.g.packet_len(c, j));
    if (ctx->coll.elem_count != n || ctx->packet.size() != u64{n} * p.elem_bytes) return drop(s, dr_malformed), ret::drop;
    if (test_bit(b->held, j)) return drop(s, dr_duplicate), ret::drop;
    const u8* el = ctx->payload<u8>(0, u64{n} * p.elem_bytes);
    if (el == nullptr) return drop(s, dr_malformed), ret::drop;
    if (ctx->dma_to_host(addr(b->d.out, r.g, c, r.g.packet_lo(c, j), p.elem_bytes), el, u64{n} * p.elem_bytes) != errc::ok)
      return drop(s, dr_dma), ret::drop;
    if (!set_bit(b->held, j)) return drop(s, dr_duplicate), ret::drop;
    add(&b->results, 1);
    add(&b->progress, 1);
    // The slot's result came back: it may take the next packet (self-clocking).
    if (j + r.slots < r.g.total) originate_up(ctx, s, b, r, j + r.slots);
    check_complete(ctx, s, b, r);
    return ret::success;
  }

  /// A block's packet the switch replicated: land it; the origin's own copy releases its next
  /// packet.
  static ret on_mdown(spin::ctx* ctx, state* s) {
    pin pn;
    data_pkt d;
    bank* sb = find(s, ctx->coll.epoch);
    if (sb == nullptr) return drop(s, dr_stale), ret::drop;
    if (!data_packet(ctx, s, sb->d.switch_rank, false, pn, d)) return ret::drop;
    bank* b = d.b;
    const params& p = b->d.p;
    const roles& r = d.r;
    const u64 pkt = d.pkt, c = d.c;
    const u32 n = d.n;
    if (!r.multicast()) return drop(s, dr_stranger), ret::drop;
    if (r.owner(c) == s->me) {  // this rank's own packet came back
      delivered(ctx, s, b, r, pkt);
      check_complete(ctx, s, b, r);
      return ret::success;
    }
    if (test_bit(b->held, pkt)) return drop(s, dr_duplicate), ret::drop;
    const u8* el = ctx->payload<u8>(0, u64{n} * p.elem_bytes);
    if (el == nullptr) return drop(s, dr_malformed), ret::drop;
    if (ctx->dma_to_host(addr(b->d.out, r.g, c, r.g.packet_lo(c, pkt), p.elem_bytes), el, u64{n} * p.elem_bytes) != errc::ok)
      return drop(s, dr_dma), ret::drop;
    if (!set_bit(b->held, pkt)) return drop(s, dr_duplicate), ret::drop;
    add(&b->results, 1);
    add(&b->progress, 1);
    check_complete(ctx, s, b, r);
    return ret::success;
  }

  // ---- switch aggregation, switch side -------------------------------------------------------------
  static slot_hdr* slot_at(spin::ctx* ctx, const state* s, u32 slot, u32 shadow) {
    return ctx->mem<slot_hdr>(slots_offset() + (u64{slot} * 2 + shadow) * s->slot_stride);
  }
  static u64 slot_off(const state* s, u32 slot, u32 shadow) { return slots_offset() + (u64{slot} * 2 + shadow) * s->slot_stride; }
  /// Contribution k (k < nranks) or, with k == nranks, the result of a slot copy.
  static u8* slot_data(spin::ctx* ctx, const state* s, u32 slot, u32 shadow, u32 k, u64 bytes) {
    return ctx->mem<u8>(slot_off(s, slot, shadow) + sizeof(slot_hdr) + u64{k} * s->slot_bytes, bytes);
  }

  static bool key_newer(u32 e, u32 j, const slot_hdr* h) {
    return epoch_newer(e, h->epoch) || (e == h->epoch && j > h->pkt);
  }

  /// A contribution: keep it; when every rank's is in, combine them in the fixed order (the
  /// ring's: chunk c starts at rank c+1), keep the result and multicast it to every member.
  /// A contribution the slot already holds gets the result again when the slot is complete
  /// (the worker lost it), else nothing. SwitchML (NSDI 2021) algorithm 3, with the bitmap
  /// and shadow copies, and contributions kept instead of added so the order is fixed (all but
  /// the one that completes the slot, which is read from its packet).
  ///
  /// In a hierarchy (docs/collectives.md, "Hierarchies") the same slot logic runs twice: a leaf
  /// combines its local members' contributions and sends the partial up (k_up2) instead of
  /// multicasting; the root combines the leaves' partials and multicasts the result to the
  /// leaves (k_down2), which keep it and multicast it to their members. Only reductions whose
  /// result does not depend on the order take this path.
  static ret on_up(spin::ctx* ctx, state* s, bool from_leaf) {
    const u32 n_in = from_leaf ? s->nleaves : s->nranks;
    const u32* who = from_leaf ? s->leaves : s->members;
    u32 sender = n_in;
    for (u32 i = 0; i < n_in; ++i)
      if (who[i] == ctx->msg.source_rank) {
        sender = i;
        break;
      }
    if (sender == n_in) return drop(s, dr_stranger), ret::drop;
    const u32 j = ctx->coll.aux & 0xffffu, c = ctx->coll.aux >> 16, n = ctx->coll.elem_count;
    const u32 slot = ctx->coll.slot & 0x7fffu, shadow = static_cast<u32>(ctx->coll.slot >> 15);
    u32 eb = 0, ab = 0;
    if (!Red::dispatch(ctx->coll.op, ctx->coll.dtype, size_fn{&eb, &ab}) || slot >= s->slots || c >= max_ranks ||
        ctx->packet.size() != u64{n} * eb || u64{n} * eb > s->slot_bytes || u64{n} * ab > max_packet_bytes)
      return drop(s, dr_malformed), ret::drop;
    slot_hdr* h = slot_at(ctx, s, slot, shadow);
    const u8* in = ctx->payload<u8>(0, u64{n} * eb);
    u8* mine = slot_data(ctx, s, slot, shadow, sender, s->slot_bytes);
    u8* result = slot_data(ctx, s, slot, shadow, s->nranks, s->slot_bytes);
    if (h == nullptr || (in == nullptr && n > 0) || mine == nullptr || result == nullptr) return drop(s, dr_malformed), ret::drop;
    const u64 lk = slot_off(s, slot, shadow);
    if (ctx->lock(lk) != errc::ok) return ret::drop;
    const u32 epoch = ctx->coll.epoch;
    if (h->used == 0 || key_newer(epoch, j, h)) {
      // A new packet for this copy: every worker already holds the result of the packet it held
      // (it sent this one only after its previous result came back).
      h->used = 1;
      h->epoch = epoch;
      h->pkt = j;
      h->chunk = c;
      h->nelems = n;
      h->count = 0;
      h->complete = 0;
      h->final = 0;
      h->op = ctx->coll.op;
      h->dtype = ctx->coll.dtype;
      for (u32 w = 0; w < max_ranks / 64; ++w) h->bits[w] = 0;
    } else if (h->epoch != epoch || h->pkt != j) {
      ctx->unlock(lk);
      return drop(s, dr_stale), ret::drop;
    }
    if (h->nelems != n || h->chunk != c || h->op != ctx->coll.op || h->dtype != ctx->coll.dtype) {
      ctx->unlock(lk);
      return drop(s, dr_malformed), ret::drop;
    }
    const bool leaf = s->role == role_leaf;
    const u64 bit = 1ull << (sender & 63);
    if ((h->bits[sender >> 6] & bit) != 0) {
      const bool complete = h->complete != 0, final = h->final != 0;
      ctx->unlock(lk);
      // The sender lost the result: send it again. A leaf without the root's result yet sends
      // its partial up again instead (the root answers it the same way).
      if (complete && leaf && !final)
        send_to_rank(ctx, s, s->parent, k_up2, epoch, ctx->coll.aux, n, result, n * eb, h_params(ctx), ctx->coll.slot);
      else if (complete)
        send_to_rank(ctx, s, who[sender], from_leaf ? k_down2 : k_down, epoch, ctx->coll.aux, n, result, n * eb,
                     h_params(ctx), ctx->coll.slot);
      return drop(s, dr_duplicate), ret::drop;
    }
    h->bits[sender >> 6] |= bit;
    bool done = ++h->count == n_in;
    // The contribution that completes the slot is read from its packet; the others wait in
    // the slot.
    if (!done) for (u64 i = 0; i < u64{n} * eb; ++i) mine[i] = in[i];
    if (done) {
      u8* acc = ctx->scratchpad<u8>(max_packet_bytes, max_packet_bytes);
      if (acc == nullptr) {
        ctx->unlock(lk);
        return ret::drop;
      }
      // The fixed order of the flat case; a hierarchy's reductions do not depend on it. The
      // result is narrow(combine(...combine(widen(c0), widen(c1))..., widen(cn-1))) in that
      // order, the first two and the last steps fused with their neighbours (three passes over
      // the data for four contributions, not five).
      const u32 first = from_leaf || leaf ? 0 : (c + 1 >= n_in ? 0 : c + 1);
      // By value: a reference would put `in` in memory, where every byte the copy loops store
      // may alias it (the loops then reload it per byte instead of vectorising).
      auto contribution = [ctx, s, slot, shadow, first, n_in, sender, in](u32 k) -> const u8* {
        const u32 from = first + k >= n_in ? first + k - n_in : first + k;
        return from == sender ? in : slot_data(ctx, s, slot, shadow, from, s->slot_bytes);
      };
      if (n_in == 1) {
        Red::dispatch(h->op, h->dtype, widen_fn{acc, contribution(0), n});
        Red::dispatch(h->op, h->dtype, narrow_fn{result, acc, n});
      } else {
        const u32 last = n_in - 1;
        if (n_in == 2)
          Red::dispatch(h->op, h->dtype, widen_fn{acc, contribution(0), n});
        else
          Red::dispatch(h->op, h->dtype, widen_fold_fn{acc, contribution(0), contribution(1), n});
        for (u32 k = 2; k < last; ++k) Red::dispatch(h->op, h->dtype, fold_fn{acc, contribution(k), n});
        Red::dispatch(h->op, h->dtype, fold_narrow_fn{result, acc, contribution(last), n});
      }
      h->complete = 1;
    }
    ctx->unlock(lk);
    // Multicast (or, at a leaf, up to the root). The copy cannot be reused before every member
    // has this result (see above).
    if (done && leaf) {
      send_to_rank(ctx, s, s->parent, k_up2, epoch, ctx->coll.aux, n, result, n * eb, h_params(ctx), ctx->coll.slot);
    } else if (done) {
      send_all(ctx, s, who, n_in, from_leaf ? k_down2 : k_down, epoch, ctx->coll.aux, n, result, n * eb, h_params(ctx), ctx->coll.slot);
    }
    return ret::success;
  }

  /// A leaf gets the root's result for a slot: keep it and multicast it to the local members.
  static ret on_down2(spin::ctx* ctx, state* s) {
    if (ctx->msg.source_rank != s->parent) return drop(s, dr_stranger), ret::drop;
    const u32 j = ctx->coll.aux & 0xffffu, n = ctx->coll.elem_count;
    const u32 slot = ctx->coll.slot & 0x7fffu, shadow = static_cast<u32>(ctx->coll.slot >> 15);
    u32 eb = 0, ab = 0;
    if (!Red::dispatch(ctx->coll.op, ctx->coll.dtype, size_fn{&eb, &ab}) || slot >= s->slots ||
        ctx->packet.size() != u64{n} * eb || u64{n} * eb > s->slot_bytes)
      return drop(s, dr_malformed), ret::drop;
    slot_hdr* h = slot_at(ctx, s, slot, shadow);
    const u8* in = ctx->payload<u8>(0, u64{n} * eb);
    u8* result = slot_data(ctx, s, slot, shadow, s->nranks, s->slot_bytes);
    if (h == nullptr || (in == nullptr && n > 0) || result == nullptr) return drop(s, dr_malformed), ret::drop;
    const u64 lk = slot_off(s, slot, shadow);
    if (ctx->lock(lk) != errc::ok) return ret::drop;
    const bool fresh = h->used != 0 && h->complete != 0 && h->final == 0 && h->epoch == ctx->coll.epoch && h->pkt == j &&
                       h->nelems == n;
    if (fresh) {
      for (u64 i = 0; i < u64{n} * eb; ++i) result[i] = in[i];
      h->final = 1;
    }
    ctx->unlock(lk);
    if (!fresh) return drop(s, dr_duplicate), ret::drop;
    send_all(ctx, s, s->members, s->nranks, k_down, ctx->coll.epoch, ctx->coll.aux, n, result, n * eb, h_params(ctx), ctx->coll.slot);
    return ret::success;
  }

  /// A member's probe (its repair tick found its epoch stalled; see repair): for each of the
  /// contributions it names, whether this switch holds it in a slot that still waits for other
  /// members. The answer leaves after every result this switch sent the member before it, so
  /// on a path that keeps order what the member still lacks when the answer arrives was lost,
  /// or its contribution never arrived. Read-only: it changes no slot.
  static ret on_probe(spin::ctx* ctx, state* s) {
    const u32 n_in = s->nranks;
    u32 sender = n_in;
    for (u32 i = 0; i < n_in; ++i)
      if (s->members[i] == ctx->msg.source_rank) {
        sender = i;
        break;
      }
    if (sender == n_in) return drop(s, dr_stranger), ret::drop;
    const probe* q = ctx->payload<probe>(0);
    // At most probe_max_packets (a member's results may come back out of order, so its
    // outstanding packets can span more than `slots`): two slot locks per packet named.
    if (q == nullptr || ctx->packet.size() != sizeof(probe) || q->count == 0 || q->count > probe_max_packets || q->slots == 0 ||
        q->slots > s->slots || u64{q->first} + q->count > max_packets)
      return drop(s, dr_malformed), ret::drop;
    const u32 words = (q->count + 63) / 64;
    probe* a = ctx->scratchpad<probe>(0);
    u64* waiting = ctx->scratchpad<u64>(sizeof(probe), words);
    if (a == nullptr || waiting == nullptr) return ret::drop;
    *a = *q;
    for (u32 w = 0; w < words; ++w) waiting[w] = 0;
    const u32 epoch = ctx->coll.epoch;
    const u64 bit = 1ull << (sender & 63);
    for (u32 i = 0; i < q->count; ++i) {
      const u64 j = u64{q->first} + i;
      const u32 slot = static_cast<u32>(spin::rem(j, u64{q->slots}));
      for (u32 shadow = 0; shadow < 2; ++shadow) {
        const slot_hdr* h = slot_at(ctx, s, slot, shadow);
        const u64 lk = slot_off(s, slot, shadow);
        if (h == nullptr || ctx->lock(lk) != errc::ok) return ret::drop;
        const bool held = h->used != 0 && h->epoch == epoch && h->pkt == j && (h->bits[sender >> 6] & bit) != 0 && h->complete == 0;
        ctx->unlock(lk);
        if (held) waiting[i >> 6] |= 1ull << (i & 63);
      }
    }
    send_to_rank(ctx, s, s->members[sender], k_probe_ans, epoch, ctx->coll.aux, 0, a, static_cast<u32>(sizeof(probe) + u64{words} * 8),
                 h_params(ctx));
    return ret::success;
  }

  /// The switch's answer to this rank's probe: send again each contribution named there whose
  /// result is not here and that the switch does not hold waiting for other members. Only
  /// then was the epoch repaired (ev_done's repaired bit; the host's repair timer then takes
  /// no sample from it and backs off).
  static ret on_probe_ans(spin::ctx* ctx, state* s) {
    bank* b = find(s, ctx->coll.epoch);
    pin pn;
    if (b == nullptr || !pn.enter(b, ctx->coll.epoch, ph_running)) return drop(s, dr_stale), ret::drop;
    const roles r = roles::of(b, s->me);
    if (!r.via_switch || r.multicast() || ctx->msg.source_rank != b->d.switch_rank) return drop(s, dr_stranger), ret::drop;
    const probe* q = ctx->payload<probe>(0);
    if (q == nullptr || q->count == 0 || q->count > probe_max_packets || q->sender != s->me)
      return drop(s, dr_malformed), ret::drop;
    const u32 words = (q->count + 63) / 64;
    const u64* waiting = ctx->payload<u64>(sizeof(probe), words);
    if (waiting == nullptr || ctx->packet.size() != sizeof(probe) + u64{words} * 8) return drop(s, dr_malformed), ret::drop;
    u64 out = load_acq(&b->next_orig);
    if (out > r.g.total) out = r.g.total;
    u32 resent = 0;
    for (u32 i = 0; i < q->count; ++i) {
      const u64 j = u64{q->first} + i;
      if (j >= out) break;
      // Packet j went out when the result of j - slots came back; one that did not go out yet
      // must not: its slot copy may still hold a result that another member lacks.
      if (test_bit(b->held, j) || (j >= r.slots && !test_bit(b->held, j - r.slots))) continue;
      if (((waiting[i >> 6] >> (i & 63)) & 1) != 0) continue;
      originate_up(ctx, s, b, r, j);
      ++resent;
    }
    if (resent > 0) store_rel(&b->repaired, 1);
    return ret::success;
  }

  /// Replicates a member's packet to every member, its origin included (whose copy is the
  /// sign that the switch has it). Stateless: the members repair among themselves.
  static ret on_mcast(spin::ctx* ctx, state* s) {
    bool member = false;
    for (u32 i = 0; i < s->nranks; ++i) member = member || s->members[i] == ctx->msg.source_rank;
    if (!member) return drop(s, dr_stranger), ret::drop;
    const u8* data = ctx->payload<u8>(0, ctx->packet.size());
    if (data == nullptr && ctx->packet.size() > 0) return drop(s, dr_malformed), ret::drop;
    const u32 len = static_cast<u32>(ctx->packet.size());
    send_all(ctx, s, s->members, s->nranks, k_mdown, ctx->coll.epoch, ctx->coll.aux, ctx->coll.elem_count, data, len, h_params(ctx),
             ctx->coll.slot);
    return ret::success;
  }

  /// The op and dtype of the packet being handled, as send() takes them.
  static params h_params(spin::ctx* ctx) {
    params p{};
    p.op = ctx->coll.op;
    p.dtype = ctx->coll.dtype;
    return p;
  }

  /// switch_agg allreduce sends its contributions before the verdict: the switch checks every
  /// contribution against its slot's first (size, op, type; a mismatch is dropped as malformed),
  /// and completion waits for the verdict, so a call whose members disagree still fails on every
  /// rank with the mismatch, never returns a result. It saves the hello round trip on the
  /// critical path of a small call. Its output (and an in-place input) may then hold partial
  /// results: docs/collectives.md, "Switch allreduce starts before the verdict".
  static bool starts_early(const roles& r) { return r.via_switch && !r.multicast(); }

  /// When every hello is in: compare them; start (or, started early, let completion through)
  /// or fail.
  static void verdict(spin::ctx* ctx, state* s, bank* b) {
    const u32 ph = load_acq(&b->phase);
    if ((ph != ph_started && ph != ph_running) || !all_bits(b->hello_bits, s->nranks) || load_acq(&b->agreed) != 0) return;
    for (u32 i = 1; i < s->nranks; ++i) {
      const field f = first_difference(b->hellos[0], b->hellos[i]);
      if (f != field::none) {
        const u64 lk = offset_of_lock(s, b);
        if (ctx->lock(lk) != errc::ok) return;
        const bool first = b->phase == ph_started || b->phase == ph_running;
        if (first) store_rel(&b->phase, ph_failed);
        ctx->unlock(lk);
        if (first) ctx->post_event(event(ev_mismatch, b->epoch, (static_cast<u32>(f) << 16) | i));
        return;
      }
    }
    if (swap_sc(&b->agreed, 1) != 0) return;
    add(&b->progress, 1);
    if (ph == ph_started) run(ctx, s, b);
    // Started early, or run by another handler since `ph` was read: completion may have come
    // first and waited for this.
    pin pn;
    if (!pn.enter(b, b->epoch, ph_running)) return;
    post_done_if_ready(ctx, s, b, roles::of(b, s->me));
  }

  /// Pins the bank a data packet of `epoch` belongs to, running; false (counted) otherwise.
  static bool data_bank(spin::ctx* ctx, state* s, u32 epoch, pin& pn) {
    bank* b = find(s, epoch);
    if (b == nullptr) {
      drop(s, dr_stale);
      return false;
    }
    // A peer sends data only after it saw every hello agree, so data proves the verdict.
    if (load_acq(&b->phase) == ph_started) run(ctx, s, b);  // before the pin: run takes the lock
    if (!pn.enter(b, epoch, ph_running)) {
      drop(s, load_acq(&b->phase) == ph_idle ? dr_early : dr_stale);
      return false;
    }
    return true;
  }

  /// Marks packet `pkt` of this rank's chunk delivered; the next one may go (self-clocking,
  /// as SwitchML's workers).
  static void delivered(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 pkt) {
    if (!set_bit(b->acked, pkt)) return;
    add(&b->acks, 1);
    add(&b->progress, 1);
    originate_next(ctx, s, b, r, 1);
  }

  /// A data packet of a running epoch, checked: its bank (pinned by `pn`), the roles, its
  /// index, chunk and elements.
  struct data_pkt {
    bank* b;
    roles r;
    u64 pkt;
    u64 c;
    u32 n;
  };
  /// Checks a data packet whose `aux` is its index: it comes from NIC rank `from`, its epoch
  /// runs here, and its element count and length (`acc` ? accumulator : element bytes each)
  /// match the geometry. False (counted) otherwise.
  static bool data_packet(spin::ctx* ctx, state* s, u32 from, bool acc, pin& pn, data_pkt& out) {
    if (ctx->msg.source_rank != from) return drop(s, dr_stranger), false;
    if (!data_bank(ctx, s, ctx->coll.epoch, pn)) return false;
    out.b = pn.b;
    out.r = roles::of(out.b, s->me);
    out.pkt = ctx->coll.aux;
    if (out.pkt >= out.r.g.total) return drop(s, dr_malformed), false;
    out.c = out.r.g.chunk_of(out.pkt);
    out.n = static_cast<u32>(out.r.g.packet_len(out.c, out.pkt));
    const u64 bytes = acc ? out.b->d.p.acc_bytes : out.b->d.p.elem_bytes;
    if (ctx->coll.elem_count != out.n || ctx->packet.size() != u64{out.n} * bytes) return drop(s, dr_malformed), false;
    return true;
  }
  static u32 pred_rank(const state* s) { return s->members[s->me == 0 ? s->nranks - 1 : s->me - 1]; }

  static ret on_rs(spin::ctx* ctx, state* s) {
    pin pn;
    data_pkt d;
    if (!data_packet(ctx, s, pred_rank(s), true, pn, d)) return ret::drop;
    bank* b = d.b;
    const params& p = b->d.p;
    const roles& r = d.r;
    const u64 pkt = d.pkt, c = d.c;
    const u32 n = d.n;
    if (!r.reduces() || r.originator(c) == s->me) return drop(s, dr_malformed), ret::drop;
    const bool owner = r.owner(c) == s->me;
    // Once this rank's host heard it is done, its input may be reused: no fold through it can
    // matter any more (every owner already holds its results; docs/collectives.md, "Completion").
    if (!owner && load_acq(&b->done_posted) != 0) return drop(s, dr_stale), ret::drop;
    if (owner && test_bit(b->held, pkt)) {
      // The originator missed the acknowledgement (reduce-scatter); allreduce repairs the
      // result path with NACKs instead.
      if (r.kind == coll_kind::reduce_scatter) send_ctl(ctx, s, r.succ_of(s->me), k_ack, b->epoch, p, static_cast<u32>(pkt));
      return drop(s, dr_duplicate), ret::drop;
    }
    u8* acc = ctx->payload<u8>(0, u64{n} * p.acc_bytes);
    u8* el = ctx->scratchpad<u8>(0, max_packet_bytes);
    if (acc == nullptr || el == nullptr) return drop(s, dr_malformed), ret::drop;
    const u64 lo = r.g.packet_lo(c, pkt);
    if (ctx->dma_from_host(el, addr(b->d.in, r.g, c, lo, p.elem_bytes), u64{n} * p.elem_bytes) != errc::ok)
      return drop(s, dr_dma), ret::drop;
    Red::dispatch(p.op, p.dtype, fold_fn{acc, el, n});
    if (!owner) {
      send(ctx, s, r.succ_of(s->me), k_rs, b->epoch, static_cast<u32>(pkt), n, acc, n * p.acc_bytes, p);
      return ret::success;
    }
    // The owner: round once, keep the result, then pass it on (allreduce) or acknowledge it.
    Red::dispatch(p.op, p.dtype, narrow_fn{el, acc, n});
    if (ctx->dma_to_host(addr(b->d.out, r.g, c, lo, p.elem_bytes), el, u64{n} * p.elem_bytes) != errc::ok)
      return drop(s, dr_dma), ret::drop;
    if (!set_bit(b->held, pkt)) return drop(s, dr_duplicate), ret::drop;
    add(&b->results, 1);
    add(&b->progress, 1);
    if (r.kind == coll_kind::allreduce)
      send(ctx, s, r.succ_of(s->me), k_ag, b->epoch, static_cast<u32>(pkt), n, el, n * p.elem_bytes, p);
    else
      send_ctl(ctx, s, r.succ_of(s->me), k_ack, b->epoch, p, static_cast<u32>(pkt));
    check_complete(ctx, s, b, r);
    return ret::success;
  }

  static ret on_ag(spin::ctx* ctx, state* s) {
    pin pn;
    data_pkt d;
    if (!data_packet(ctx, s, pred_rank(s), false, pn, d)) return ret::drop;
    bank* b = d.b;
    const params& p = b->d.p;
    const roles& r = d.r;
    const u64 pkt = d.pkt, c = d.c;
    const u32 n = d.n;
    if (!r.gathers() || r.owner(c) == s->me) return drop(s, dr_malformed), ret::drop;
    const bool last = r.last(c) == s->me;
    const u8* el = ctx->payload<u8>(0, u64{n} * p.elem_bytes);
    if (el == nullptr) return drop(s, dr_malformed), ret::drop;
    if (test_bit(b->held, pkt)) {
      if (last && r.acks_results()) send_ctl(ctx, s, r.succ_of(s->me), k_ack, b->epoch, p, static_cast<u32>(pkt));
      else if (!last && (ctx->coll.slot & ring_again) != 0)
        send(ctx, s, r.succ_of(s->me), k_ag, b->epoch, static_cast<u32>(pkt), n, el, n * p.elem_bytes, p, ring_again);
      return drop(s, dr_duplicate), ret::drop;
    }
    const u64 lo = r.g.packet_lo(c, pkt);
    // Data first, then the bit: a NACK served from the host copy never reads a half-written result.
    if (ctx->dma_to_host(addr(b->d.out, r.g, c, lo, p.elem_bytes), el, u64{n} * p.elem_bytes) != errc::ok)
      return drop(s, dr_dma), ret::drop;
    if (!set_bit(b->held, pkt)) return drop(s, dr_duplicate), ret::drop;
    add(&b->results, 1);
    add(&b->progress, 1);
    if (r.multicast()) {
      // A repair from the predecessor (on_nack): the switch's copies did the spreading.
    } else if (!last) {
      // A new message id: ctx->forward would keep the sender's, which may collide with this
      // NIC's own ids at the next rank (its duplicate filter keys on source and id).
      send(ctx, s, r.succ_of(s->me), k_ag, b->epoch, static_cast<u32>(pkt), n, el, n * p.elem_bytes, p);
    } else if (r.acks_results()) {
      send_ctl(ctx, s, r.succ_of(s->me), k_ack, b->epoch, p, static_cast<u32>(pkt));
    }
    // Allreduce: the originator of chunk c is the first rank of its result path.
    if (r.kind == coll_kind::allreduce && r.originator(c) == s->me) delivered(ctx, s, b, r, pkt);
    check_complete(ctx, s, b, r);
    return ret::success;
  }

  static ret on_ack(spin::ctx* ctx, state* s) {
    pin pn;
    if (!data_bank(ctx, s, ctx->coll.epoch, pn)) return ret::drop;
    bank* b = pn.b;
    const roles r = roles::of(b, s->me);
    // host_ring transfers end at the successor; ring paths end at the predecessor.
    if (ctx->msg.source_rank != s->members[r.via_host ? r.succ_of(s->me) : r.pred_of(s->me)])
      return drop(s, dr_stranger), ret::drop;
    if (ctx->packet.size() != sizeof(ctl)) return drop(s, dr_malformed), ret::drop;
    if (r.via_host) return on_xfer_ack(ctx, s, b, r);
    const u64 pkt = ctx->coll.aux;
    if (r.kind == coll_kind::allreduce || pkt >= r.g.total || r.g.chunk_of(pkt) != r.my_chunk() ||
        ctx->packet.size() != sizeof(ctl))
      return drop(s, dr_malformed), ret::drop;
    delivered(ctx, s, b, r, pkt);
    check_complete(ctx, s, b, r);
    return ret::success;
  }

  /// A successor asks for results: resend those it lacks and this rank holds, from the host
  /// copy, at most 4 windows of them.
  static ret on_nack(spin::ctx* ctx, state* s) {
    if (ctx->msg.source_rank != s->members[s->me + 1 == s->nranks ? 0 : s->me + 1])
      return drop(s, dr_stranger), ret::drop;
    bank* b = find(s, ctx->coll.epoch);
    pin pn;
    if (b == nullptr || !pn.enter(b, ctx->coll.epoch, ph_running)) return drop(s, dr_stale), ret::drop;
    // A late NACK after this rank's host heard it is done: its output may be reused, and the
    // successor holds everything (that was the condition).
    if (load_acq(&b->done_posted) != 0) return drop(s, dr_stale), ret::drop;
    const nack_head* h = ctx->payload<nack_head>(0);
    if (h == nullptr || h->nwords > nack_max_words || ctx->packet.size() != sizeof(nack_head) + u64{h->nwords} * 8 ||
        u64{h->first_word} + h->nwords > max_packets / 64)
      return drop(s, dr_malformed), ret::drop;
    const u64* theirs = ctx->payload<u64>(sizeof(nack_head), h->nwords);
    const params& p = b->d.p;
    const roles r = roles::of(b, s->me);
    u8* el = ctx->scratchpad<u8>(0, max_packet_bytes);
    if ((theirs == nullptr && h->nwords > 0) || el == nullptr || !r.gathers()) return drop(s, dr_malformed), ret::drop;
    const u32 requester = r.succ_of(s->me);
    u32 budget = 4 * b->d.window;
    for (u32 w = 0; w < h->nwords && budget > 0; ++w) {
      const u64 word = h->first_word + w;
      u64 want = load_acq(&b->held[word]) & ~theirs[w];
      while (want != 0 && budget > 0) {
        const u32 bit = static_cast<u32>(__builtin_ctzll(want));
        want &= want - 1;
        const u64 pkt = word * 64 + bit;
        if (pkt >= r.g.total) break;
        const u64 c = r.g.chunk_of(pkt);
        if (r.owner(c) == requester) continue;  // its own chunk: repaired by origination
        const u32 n = static_cast<u32>(r.g.packet_len(c, pkt));
        const u64 lo = r.g.packet_lo(c, pkt);
        if (ctx->dma_from_host(el, addr(b->d.out, r.g, c, lo, p.elem_bytes), u64{n} * p.elem_bytes) != errc::ok)
          return drop(s, dr_dma), ret::drop;
        if (send(ctx, s, requester, k_ag, b->epoch, static_cast<u32>(pkt), n, el, n * p.elem_bytes, p) != errc::ok)
          return ret::success;  // transmit queue full: the next tick asks again
        --budget;
      }
    }
    return ret::success;
  }

  // ---- repair (a host timer tick) ------------------------------------------------------------------
  static void repair(spin::ctx* ctx, state* s, bank* b) {
    const u32 ph = load_acq(&b->phase);
    const params& p = b->d.p;
    if (ph == ph_started || (ph == ph_running && load_acq(&b->agreed) == 0)) {
      // Hellos still missing (a call started early, or one that data proved, still waits for
      // them to complete).
      for (u32 i = 0; i < s->nranks; ++i)
        if (i != s->me && !test_bit(b->hello_bits, i)) send_ctl(ctx, s, i, k_hello_req, b->epoch, p, s->me);
      if (ph == ph_started) return;
    }
    if (ph != ph_running) return;
    const roles r = roles::of(b, s->me);
    if (r.via_host) {
      // The transfer's packets not acknowledged, again: the successor acknowledges duplicates.
      const u64 npk = r.g.chunk_packets(b->xfer_chunk);
      u64 out = load_acq(&b->xfer_next);
      if (out > npk) out = npk;
      const u64 first = r.g.first_packet(b->xfer_chunk);
      u32 budget = b->d.window;
      for (u64 k = 0; k < out && budget > 0; ++k) {
        if (test_bit(ack_bits(b, b->xfer_phase), first + k)) continue;
        xfer_send(ctx, s, b, r, k, true);
        --budget;
      }
      return;
    }
    if (r.via_switch && !r.multicast()) {
      // Contributions sent whose result has not come back. A stalled tick does not send them
      // again at once: it asks the switch which of them it holds (k_probe). On a machine with
      // more threads than cores most stalls are a descheduled lcore, not a loss (at 16 ranks
      // on 2 cores, 4 of every 16 epochs stalled for an interval; resending each rank's whole
      // window cost 15 to 20 % of the call). The probe travels behind the contributions and
      // its answer behind the results, so the answer says what is really missing, and
      // on_probe_ans sends only that (TCP's SACK, after a timeout). A lost probe or answer
      // costs one more tick.
      u64 out = load_acq(&b->next_orig);
      if (out > r.g.total) out = r.g.total;
      u64 first = out;
      for (u64 j = 0; j < out; ++j)
        if (!test_bit(b->held, j)) {
          first = j;
          break;
        }
      if (first == out) return;  // every result sent for is here: nothing to repair
      probe* q = ctx->scratchpad<probe>(max_packet_bytes - sizeof(probe));
      if (q == nullptr) return;
      // Results come back in any order, so [first, out) may span more than `slots` packets; a
      // probe names at most probe_max_packets of them (the rest at a later tick).
      const u64 count = out - first < probe_max_packets ? out - first : probe_max_packets;
      q->sender = s->me;
      q->first = static_cast<u32>(first);
      q->count = static_cast<u32>(count);
      q->slots = r.slots;
      send_to_rank(ctx, s, b->d.switch_rank, k_probe, b->epoch, s->me, 0, q, sizeof(probe), p);
      return;
    }
    // Packets of this rank's chunk not known delivered: originate them again.
    const u64 npk = r.my_chunk_packets();
    if (npk > 0) {
      const u64 first = r.g.first_packet(r.my_chunk());
      u64 out = load_acq(&b->next_orig);
      if (out > npk) out = npk;
      u32 budget = b->d.window;
      for (u64 k = 0; k < out && budget > 0; ++k) {
        if (test_bit(b->acked, first + k)) continue;
        originate(ctx, s, b, r, first + k, true);
        --budget;
      }
    }
    if (load_acq(&b->results) < r.results_needed() && r.gathers()) {
      // Ask the predecessor for every result missing here, a bitmap window per packet.
      nack_head* h = ctx->scratchpad<nack_head>(0);
      u64* words = ctx->scratchpad<u64>(sizeof(nack_head), nack_max_words);
      if (h == nullptr || words == nullptr) return;
      const u64 nwords_total = (r.g.total + 63) / 64;
      u32 packets = 0;
      for (u64 w0 = 0; w0 < nwords_total && packets < 4; w0 += nack_max_words) {
        const u32 nw = static_cast<u32>(nwords_total - w0 < nack_max_words ? nwords_total - w0 : nack_max_words);
        bool missing = false;
        for (u32 i = 0; i < nw; ++i) {
          u64 v = load_acq(&b->held[w0 + i]);
          const u64 lo = (w0 + i) * 64;
          if (r.g.total - lo < 64) v |= ~((1ull << (r.g.total - lo)) - 1);  // bits past the end count as held
          words[i] = v;
          missing = missing || v != ~0ull;
        }
        if (!missing) continue;
        h->sender = s->me;
        h->first_word = static_cast<u32>(w0);
        h->nwords = nw;
        h->reserved = 0;
        send(ctx, s, r.pred_of(s->me), k_nack, b->epoch, s->me, 0, h, static_cast<u32>(sizeof(nack_head) + nw * 8ull), p);
        ++packets;
      }
    }
    if (load_acq(&b->complete) != 0) {
      if (r.kind == coll_kind::reduce_scatter) {
        for (u32 i = 0; i < s->nranks; ++i)
          if (i != s->me && !test_bit(b->done_bits, i)) send_ctl(ctx, s, i, k_done_req, b->epoch, p, s->me);
      } else if (load_acq(&b->succ_complete) == 0) {
        send_ctl(ctx, s, r.succ_of(s->me), k_done_req, b->epoch, p, s->me);
      }
    }
  }

  // ---- commands from this NIC's host -------------------------------------------------------------
  static bool valid_start(spin::ctx* ctx, state* s, const start_desc* d, u32& why) {
    u32 eb = 0, ab = 0;
    const bool known = Red::dispatch(d->p.op, d->p.dtype, size_fn{&eb, &ab});
    const coll_kind k = static_cast<coll_kind>(d->p.kind);
    const bool kind_ok = k == coll_kind::allreduce || k == coll_kind::reduce_scatter || k == coll_kind::allgather ||
                         k == coll_kind::broadcast;
    const bool reduces = k == coll_kind::allreduce || k == coll_kind::reduce_scatter;
    const bool via_switch = d->p.algo == static_cast<u8>(algo::switch_agg);
    why = se_params;
    if (via_switch && (k == coll_kind::reduce_scatter || d->p.slots == 0 || d->p.slots > max_switch_slots)) return false;
    const bool via_host = d->p.algo == static_cast<u8>(algo::host_ring);
    if (via_host && k != coll_kind::allreduce) return false;
    if (!via_switch && !via_host && d->p.algo != static_cast<u8>(algo::edge_ring)) return false;
    if (!kind_ok || (reduces && (!known || eb != d->p.elem_bytes || ab != d->p.acc_bytes)) || d->p.elem_bytes == 0 ||
        d->p.nranks != s->nranks || d->p.pkt_elems == 0 || d->p.root >= d->p.nranks ||
        u64{d->p.pkt_elems} * (d->p.elem_bytes > d->p.acc_bytes ? d->p.elem_bytes : d->p.acc_bytes) > max_packet_bytes ||
        d->window == 0 || d->window > max_window || d->p.count > d->p.total_count || d->p.count > (1ull << 40))
      return false;
    const u32 chunks = k == coll_kind::broadcast ? 1 : d->p.nranks;
    const ring_geom g = ring_geom::make(d->p.count, chunks, d->p.pkt_elems);
    if (g.total > max_packets) return false;
    why = se_window;
    const buffer_desc recv{d->recv_off, 0, 0, 0};
    return buffer_fits(d->in, g, chunks, d->p.elem_bytes, ctx->host_window_len_bytes) &&
           buffer_fits(d->out, g, chunks, d->p.elem_bytes, ctx->host_window_len_bytes) &&
           (!via_host || buffer_fits(recv, g, chunks, d->p.acc_bytes, ctx->host_window_len_bytes));
  }

  // The command's MAC under the host's key (protocol.hpp, cmd_key_off).
  struct cmd_key {
    u64 k0, k1;
  };
  static bool authentic(spin::ctx* ctx, const cmd* c) {
    // DMA lands in the invocation's own memory: the command's scratchpad, used after this.
    cmd_key* key = ctx->scratchpad<cmd_key>(0);
    if (key == nullptr || ctx->dma_from_host(key, cmd_key_off, sizeof(cmd_key)) != errc::ok) return false;
    const u64 k0 = key->k0, k1 = key->k1;
    if ((k0 | k1) == 0) return false;
    return siphash24(k0, k1, reinterpret_cast<const u8*>(c), cmd_mac_bytes) == c->mac;
  }

  static ret on_cmd(spin::ctx* ctx, state* s) {
    const cmd* c = ctx->payload<cmd>(0);
    if (c == nullptr || ctx->packet.size() != sizeof(cmd)) return drop(s, dr_malformed), ret::drop;
    if (!authentic(ctx, c)) return drop(s, dr_forged), ret::drop;
    if (c->type == cmd_setup) {
      // Once only: afterwards commands must come from this rank's own address.
      if (load_acq(&s->nranks) != 0) return drop(s, dr_stranger), ret::drop;
      u32 ok = c->nranks >= 1 && c->nranks <= max_ranks && c->me < c->nranks ? 1 : 0;
      if (ok && ctx->dma_from_host(s->members, c->desc_off, u64{c->nranks} * sizeof(u32)) != errc::ok) ok = 0;
      if (ok) {
        s->me = c->me;
        s->comm_id = comm_of(ctx->msg.match_bits);
        __atomic_store_n(&s->nranks, c->nranks, __ATOMIC_RELEASE);
      }
      ctx->post_event(event(ev_setup, 0, ok ? 0 : 1));
      return ret::success;
    }
    if (c->type == cmd_switch_setup) {
      if (load_acq(&s->nranks) != 0) return drop(s, dr_stranger), ret::drop;
      switch_setup* w = ctx->scratchpad<switch_setup>(0);
      u32 ok = w != nullptr && ctx->dma_from_host(w, c->desc_off, sizeof(switch_setup)) == errc::ok ? 1 : 0;
      ok = ok && w->nranks >= 1 && w->nranks <= max_ranks && w->slots >= 1 && w->slots <= max_switch_slots &&
           w->slot_bytes >= 8 && w->slot_bytes <= max_packet_bytes && w->slot_bytes % 8 == 0 &&
           (w->role == switch_root || w->role == switch_leaf) && w->nleaves <= max_leaves &&
           (w->role == switch_root || w->nleaves == 0);
      // Contributions come from members or from leaves: room for the larger count.
      const u32 inputs = ok && w->nleaves > w->nranks ? w->nleaves : (ok ? w->nranks : 0);
      const u64 stride = ok ? slot_stride_bytes(inputs, w->slot_bytes) : 0;
      ok = ok && slots_offset() + u64{w->slots} * 2 * stride <= ctx->handler_mem.len_bytes &&
           ctx->dma_from_host(s->members, c->desc_off + sizeof(switch_setup), u64{w->nranks} * sizeof(u32)) == errc::ok &&
           (w->nleaves == 0 || ctx->dma_from_host(s->leaves, c->desc_off + sizeof(switch_setup) + u64{w->nranks} * sizeof(u32),
                                                  u64{w->nleaves} * sizeof(u32)) == errc::ok);
      if (ok) {
        s->role = w->role == switch_leaf ? role_leaf : role_switch;
        s->parent = w->parent;
        s->nleaves = w->nleaves;
        s->me = 0;
        s->comm_id = comm_of(ctx->msg.match_bits);
        s->slots = w->slots;
        s->slot_bytes = w->slot_bytes;
        s->slot_stride = stride;
        __atomic_store_n(&s->nranks, w->nranks, __ATOMIC_RELEASE);
      }
      ctx->post_event(event(ev_setup, 0, ok ? 0 : 1));
      return ret::success;
    }
    if (load_acq(&s->nranks) == 0) return drop(s, dr_stranger), ret::drop;
    if (s->role != role_member) {
      // A switch's control plane only reads its counters.
      if (c->type != cmd_stats) return drop(s, dr_malformed), ret::drop;
    } else if (ctx->msg.source_rank != s->members[s->me]) {
      return drop(s, dr_stranger), ret::drop;
    }
    if (c->type == cmd_repair) {
      bank* b = find(s, c->epoch);
      pin pn;
      if (b == nullptr || !pn.enter(b, c->epoch, 0) || b->d.recovery == 0) return ret::success;
      const u64 now = load_acq(&b->progress);
      if (now != b->progress_seen) {
        b->progress_seen = now;  // something moved since the last tick: wait
        return ret::success;
      }
      // No event: the host learns it from ev_done (an event per repair would wake the waiting
      // rank for nothing; with hundreds of ranks on two cores those wake-ups alone stall the NICs).
      // Through a switch the probe's answer sets it, and only when a contribution was missing
      // (hello requests the same tick may send do not count: they cost one small packet each,
      // and a lost hello is rare).
      const roles r = roles::of(b, s->me);
      if (!(load_acq(&b->phase) == ph_running && r.via_switch && !r.multicast())) store_rel(&b->repaired, 1);
      repair(ctx, s, b);
      return ret::success;
    }
    if (c->type == cmd_xfer) return on_xfer_cmd(ctx, s, c);
    if (c->type == cmd_stats) {
      engine_counters* k = ctx->scratchpad<engine_counters>(0);
      if (k == nullptr) return ret::drop;
      for (u32 i = 0; i < 8; ++i) k->drops[i] = i < dr_count ? load_acq(&s->drops[i]) : 0;
      for (u32 i = 0; i < kind_count; ++i) k->sent[i] = load_acq(&s->sent[i]);
      if (ctx->dma_to_host(c->desc_off, k, sizeof(engine_counters)) != errc::ok) return drop(s, dr_dma), ret::drop;
      ctx->post_event(event(ev_stats, 0, 0));
      return ret::success;
    }
    if (c->type != cmd_start) return drop(s, dr_malformed), ret::drop;
    bank* b = claim(ctx, s, c->epoch);
    if (b == nullptr) return drop(s, dr_stale), ret::drop;
    start_desc* d = ctx->scratchpad<start_desc>(0);
    if (d == nullptr || ctx->dma_from_host(d, c->desc_off, sizeof(start_desc)) != errc::ok) {
      ctx->post_event(event(ev_error, c->epoch, se_desc));
      return ret::success;
    }
    u32 why = 0;
    if (!valid_start(ctx, s, d, why)) {
      ctx->post_event(event(ev_error, c->epoch, why));
      return ret::success;
    }
    const u64 lk = offset_of_lock(s, b);
    if (ctx->lock(lk) != errc::ok) return ret::drop;
    const bool fresh = b->phase == ph_idle;
    if (fresh) {
      b->d = *d;
      b->hellos[s->me] = d->p;
      set_bit(b->hello_bits, s->me);
      store_rel(&b->phase, ph_started);
    }
    ctx->unlock(lk);
    if (!fresh) return drop(s, dr_stale), ret::drop;
    add(&b->progress, 1);
    for (u32 i = 0; i < s->nranks; ++i)
      if (i != s->me) send_hello(ctx, s, b, i);
    if (starts_early(roles::of(b, s->me))) run(ctx, s, b);
    verdict(ctx, s, b);
    return ret::success;
  }

  static ret on_hello(spin::ctx* ctx, state* s) {
    const hello* h = ctx->payload<hello>(0);
    const u32 n = load_acq(&s->nranks);
    if (h == nullptr || ctx->packet.size() != sizeof(hello) || n == 0 || h->sender >= n || h->sender == s->me)
      return drop(s, dr_malformed), ret::drop;
    if (ctx->msg.source_rank != s->members[h->sender]) return drop(s, dr_stranger), ret::drop;
    bank* b = claim(ctx, s, ctx->coll.epoch);
    if (b == nullptr) return drop(s, dr_stale), ret::drop;
    b->hellos[h->sender] = h->p;  // before the bit: verdict reads hellos after seeing it
    if (set_bit(b->hello_bits, h->sender)) add(&b->progress, 1);
    verdict(ctx, s, b);
    return ret::success;
  }

  static ret on_ctl(spin::ctx* ctx, state* s, u32 kind) {
    const ctl* c = ctx->payload<ctl>(0);
    const u32 n = load_acq(&s->nranks);
    if (c == nullptr || ctx->packet.size() != sizeof(ctl) || n == 0 || c->sender >= n)
      return drop(s, dr_malformed), ret::drop;
    if (ctx->msg.source_rank != s->members[c->sender]) return drop(s, dr_stranger), ret::drop;
    bank* b = find(s, ctx->coll.epoch);
    pin pn;
    if (b == nullptr || !pn.enter(b, ctx->coll.epoch, 0)) return drop(s, dr_stale), ret::drop;
    const roles r = roles::of(b, s->me);
    if (kind == k_hello_req) {
      send_hello(ctx, s, b, c->sender);
    } else if (kind == k_done) {
      if (r.kind == coll_kind::reduce_scatter) {
        if (set_bit(b->done_bits, c->sender)) add(&b->progress, 1);
      } else {
        if (c->sender != r.succ_of(s->me)) return drop(s, dr_stranger), ret::drop;
        if (swap(&b->succ_complete, 1) == 0) add(&b->progress, 1);
      }
      post_done_if_ready(ctx, s, b, r);
    } else {  // k_done_req
      if (load_acq(&b->complete) != 0) send_ctl(ctx, s, c->sender, k_done, b->epoch, b->d.p, s->me);
    }
    return ret::success;
  }

  static ret handle(spin::ctx* ctx) {
    state* s = ctx->mem<state>(0);
    if (s == nullptr) return ret::drop;
    const u32 kind = kind_of(ctx->msg.match_bits);
    if (kind == k_cmd) return on_cmd(ctx, s);  // a host message: no collective fields
    if ((ctx->msg.flags & msg_coll) == 0) return drop(s, dr_malformed), ret::drop;
    if (load_acq(&s->nranks) == 0) return drop(s, dr_early), ret::drop;
    if (s->role == role_switch) {
      if (kind == k_up) return on_up(ctx, s, false);
      if (kind == k_probe) return on_probe(ctx, s);
      if (kind == k_up2 && s->nleaves > 0) return on_up(ctx, s, true);
      if (kind == k_mcast) return on_mcast(ctx, s);
      return drop(s, dr_malformed), ret::drop;
    }
    if (s->role == role_leaf) {
      if (kind == k_up) return on_up(ctx, s, false);
      if (kind == k_probe) return on_probe(ctx, s);
      if (kind == k_down2) return on_down2(ctx, s);
      return drop(s, dr_malformed), ret::drop;
    }
    switch (kind) {
    case k_down: return on_down(ctx, s);
    case k_probe_ans: return on_probe_ans(ctx, s);
    case k_mdown: return on_mdown(ctx, s);
    case k_xfer: return on_xfer(ctx, s);
    case k_hello: return on_hello(ctx, s);
    case k_rs: return on_rs(ctx, s);
    case k_ag: return on_ag(ctx, s);
    case k_ack: return on_ack(ctx, s);
    case k_nack: return on_nack(ctx, s);
    case k_hello_req:
    case k_done:
    case k_done_req: return on_ctl(ctx, s, kind);
    default: return drop(s, dr_malformed), ret::drop;
    }
  }
};
} // namespace engine_detail

/// Handler memory of an engine EC (bytes).
inline constexpr u64 engine_state_bytes = sizeof(engine_detail::state);

} // namespace spin::coll

/// Defines the collective engine's handler for the reductions `Reductions` (standard_reductions,
/// or single_reduction<R> for a user reduction R) and declares its memory. Once per file.
#define SPIN_COLL_ENGINE(Reductions)                                                                  \
  SPIN_MEMORY(::spin::coll::engine_state_bytes, ::spin::coll::proto::scratch_bytes);                 \
  SPIN_PAYLOAD_HANDLER(spin_coll_payload) { return ::spin::coll::engine_detail::engine<Reductions>::handle(ctx); }
