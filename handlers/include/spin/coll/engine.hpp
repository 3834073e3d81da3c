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
//
// The engine is one class template, engine<Red>, declared here part by part; each part's
// definitions are in a file of its own under spin/coll/engine/:
//   epoch.hpp          epochs
//   edge_ring.hpp      the edge ring
//   host_ring.hpp      the host ring
//   switch_worker.hpp  switch aggregation, worker side
//   switch.hpp         switch aggregation, switch side
//   repair.hpp         repair
//   commands.hpp       commands
//   state.hpp          the state in handler memory (banks, slots) and the geometry
#pragma once

#include <spin/coll/protocol.hpp>
#include <spin/siphash.hpp>
#include <spin/coll/types.hpp>
#include <spin/handler.hpp>

#include <spin/coll/engine/state.hpp>

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

/// The engine over the reductions `Red` (standard_reductions or single_reduction<R>). Static
/// functions only: its state is the EC's handler memory (`state`).
template <class Red> struct engine {
  // ---- epochs (engine/epoch.hpp) ----------------------------------------------------------------
  static errc send(spin::ctx* ctx, state* s, u32 to, u32 kind, u32 epoch, u32 aux, u32 elems, const void* data,
                   u32 len, const params& p, u16 slot = 0);
  /// The descriptor of a one-packet engine message of `kind` (its message id and destination
  /// are the caller's).
  static send_desc engine_desc(const state* s, u32 kind, u32 epoch, u32 aux, u32 elems, const void* data, u32 len,
                               const params& p, u16 slot);
  /// Sends `d` (built by engine_desc, dest_rank set) as the next message of this EC and counts
  /// it under `kind`, or its failure under dr_send.
  static errc send_built(spin::ctx* ctx, state* s, send_desc& d, u32 kind);
  /// As send, to NIC rank `dest` (a switch) instead of a member.
  static errc send_to_rank(spin::ctx* ctx, state* s, u32 dest, u32 kind, u32 epoch, u32 aux, u32 elems, const void* data,
                           u32 len, const params& p, u16 slot = 0);
  /// As send_to_rank, to every NIC rank of `to[0..count)` at once: the NIC reads the payload
  /// once and, where it can, its copies share it instead of copying it per destination.
  static void send_all(spin::ctx* ctx, state* s, const u32* to, u32 count, u32 kind, u32 epoch, u32 aux, u32 elems,
                       const void* data, u32 len, const params& p, u16 slot);
  /// A control packet (k_hello_req, k_done, k_done_req, k_ack): aux is the packet index for
  /// k_ack, else the sender.
  static void send_ctl(spin::ctx* ctx, state* s, u32 to, u32 kind, u32 epoch, const params& p, u32 aux, u16 slot = 0);
  static void send_hello(spin::ctx* ctx, state* s, bank* b, u32 to);
  /// The bank of `epoch`, reset for it when it held an older epoch; null when `epoch` is older
  /// than what the bank holds (a stale packet).
  static bank* claim(spin::ctx* ctx, state* s, u32 epoch);
  /// The bank of `epoch` only if it already holds it.
  static bank* find(state* s, u32 epoch);
  static bool all_bits(const u64* words, u32 n);
  static void post_done_if_ready(spin::ctx* ctx, state* s, bank* b, const roles& r);
  /// Completion (docs/collectives.md, "Completion"): every result held and every originated
  /// packet delivered. Allreduce, allgather and broadcast then wait for the successor (which
  /// this rank serves repairs from its output); reduce-scatter waits for every rank, because
  /// every rank's input may still be folded into a repaired packet.
  static void check_complete(spin::ctx* ctx, state* s, bank* b, const roles& r);
  /// ph_started -> ph_running (exactly once): originate the first window.
  static void run(spin::ctx* ctx, state* s, bank* b);
  /// The op and dtype of the packet being handled, as send() takes them.
  static params h_params(spin::ctx* ctx);
  /// switch_agg allreduce sends its contributions before the verdict: the switch checks every
  /// contribution against its slot's first (size, op, type; a mismatch is dropped as malformed),
  /// and completion waits for the verdict, so a call whose members disagree still fails on every
  /// rank with the mismatch, never returns a result. It saves the hello round trip on the
  /// critical path of a small call. Its output (and an in-place input) may then hold partial
  /// results: docs/collectives.md, "Switch allreduce starts before the verdict". Not before
  /// this engine's first agreed verdict: a member whose engine was not yet set up (or not yet
  /// installed) drops the hellos that reach it, and the peers, complete without its verdict,
  /// could leave before answering its requests for them (a wall-clock 4-rank allreduce hung
  /// in about one run in three under MALLOC_PERTURB_). After one agreed verdict every
  /// member's engine is known to be set up.
  static bool starts_early(const state* s, const roles& r);
  /// When every hello is in: compare them; start (or, started early, let completion through)
  /// or fail.
  static void verdict(spin::ctx* ctx, state* s, bank* b);
  /// Pins the bank a data packet of `epoch` belongs to, running; false (counted) otherwise.
  static bool data_bank(spin::ctx* ctx, state* s, u32 epoch, pin& pn);

  // ---- reductions: Red::dispatch calls these with the reduction of (op, dtype) --------------------
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
    void* acc;
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
  // Compact reductions (is_compact: sparse windows) send an element or accumulator in fewer
  // bytes than its size; n is then 1 (a window fills its packet). The others send n x size.
  struct compact_fn {
    bool* c;
    template <class R> void operator()() const { *c = detail::is_compact<R>(); }
  };
  struct elem_len_fn {
    const void* el;
    u32 n;
    u32* len;
    template <class R> void operator()() const {
      if constexpr (detail::is_compact<R>()) *len = R::elem_length(*static_cast<const typename R::elem*>(el));  // <= sizeof(elem)
      else *len = n * static_cast<u32>(sizeof(typename R::elem));
    }
  };
  struct valid_fn {
    bool acc;
    const u8* data;
    u64 len;
    u32 n;
    bool* ok;
    template <class R> void operator()() const {
      if constexpr (detail::is_compact<R>())
        *ok = n == 1 && data != nullptr && (acc ? R::acc_valid(data, len) : R::elem_valid(data, len));
      else
        *ok = len == u64{n} * (acc ? sizeof(typename R::acc) : sizeof(typename R::elem));
    }
  };
  struct pack_fn {
    u8* out;
    const void* acc;
    u32* len;
    template <class R> void operator()() const {
      if constexpr (detail::is_compact<R>()) *len = R::pack_acc(out, *static_cast<const typename R::acc*>(acc));
    }
  };
  struct unpack_fn {
    void* acc;
    const u8* in;
    template <class R> void operator()() const {
      if constexpr (detail::is_compact<R>()) R::unpack_acc(*static_cast<typename R::acc*>(acc), in);
    }
  };
  static bool compact(const params& p) {
    bool c = false;
    Red::dispatch(p.op, p.dtype, compact_fn{&c});
    return c;
  }
  /// Bytes of the n elements at `el` as they travel.
  static u32 elem_len(const params& p, const void* el, u32 n) {
    u32 len = n * p.elem_bytes;
    Red::dispatch(p.op, p.dtype, elem_len_fn{el, n, &len});
    return len;
  }
  /// Whether the packet being handled carries n well-formed elements (`acc`: accumulators)
  /// of reduction (o, t) and nothing else; without a reduction (allgather, broadcast), n of
  /// `size` bytes each.
  static bool wire_ok(spin::ctx* ctx, u8 o, u8 t, bool acc, u32 n, u32 size) {
    bool ok = false;
    const u64 len = ctx->packet.size();
    if (!Red::dispatch(o, t, valid_fn{acc, ctx->payload<u8>(0, len), len, n, &ok})) ok = len == u64{n} * size;
    return ok;
  }
  /// Sends the n accumulators at `acc` to member `to`: packed into `spare` (a packet's worth of
  /// scratchpad) when the reduction is compact.
  static void send_acc(spin::ctx* ctx, state* s, u32 to, u32 kind, u32 epoch, u32 aux, u32 n, const u8* acc, u8* spare,
                       const params& p) {
    if (!compact(p)) {
      send(ctx, s, to, kind, epoch, aux, n, acc, n * p.acc_bytes, p);
      return;
    }
    u32 len = 0;
    Red::dispatch(p.op, p.dtype, pack_fn{spare, acc, &len});
    send(ctx, s, to, kind, epoch, aux, n, spare, len, p);
  }

  // ---- the edge ring (engine/edge_ring.hpp) -----------------------------------------------------
  /// Sends the first packet of packet `pkt` of this rank's chunk. A repeat (`again`) carries
  /// `ring_again`: ranks that hold it already pass it on to the end of its path, whose
  /// acknowledgement may be what was lost.
  static void originate(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 pkt, bool again = false);
  /// Originates up to `budget` packets of this rank's chunk that are not yet out.
  static void originate_next(spin::ctx* ctx, state* s, bank* b, const roles& r, u32 budget);
  /// Marks packet `pkt` of this rank's chunk delivered; the next one may go (self-clocking,
  /// as SwitchML's workers).
  static void delivered(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 pkt);
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
  static bool data_packet(spin::ctx* ctx, state* s, u32 from, bool acc, pin& pn, data_pkt& out);
  static u32 pred_rank(const state* s);
  static ret on_rs(spin::ctx* ctx, state* s);
  static ret on_ag(spin::ctx* ctx, state* s);
  static ret on_ack(spin::ctx* ctx, state* s);
  /// A successor asks for results: resend those it lacks and this rank holds, from the host
  /// copy, at most 4 windows of them.
  static ret on_nack(spin::ctx* ctx, state* s);

  // ---- the host ring (engine/host_ring.hpp) -----------------------------------------------------
  static u64* rcv_bits(bank* b, u32 phase);
  static u64* ack_bits(bank* b, u32 phase);
  static u32 xfer_bytes(const bank* b, u32 phase);
  /// Sends packet k of the current transfer (its chunk's k-th packet) to the successor.
  static void xfer_send(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 k, bool again);
  static void xfer_next_pkts(spin::ctx* ctx, state* s, bank* b, const roles& r, u32 budget);
  static ret on_xfer_cmd(spin::ctx* ctx, state* s, const cmd* c);
  /// A packet from the predecessor: land it, acknowledge it, and say when its chunk is whole.
  static ret on_xfer(spin::ctx* ctx, state* s);
  static ret on_xfer_ack(spin::ctx* ctx, state* s, bank* b, const roles& r);

  // ---- switch aggregation, worker side (engine/switch_worker.hpp) -------------------------------
  /// Sends this rank's contribution to packet j into slot j mod slots, shadow copy
  /// shadow_of(j).
  static void originate_up(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 j);
  /// Packets [0, min(total, slots)) of this rank, each as originate_up, in one invocation (the worker's
  /// start: one packet per slot at once). The reads from host memory are pipelined,
  /// burst_bufs in flight (non-blocking DMA into bank::burst), so that the burst costs the
  /// PCIe transfers, not a read's round trip per packet: 1024 slots took 1.4 ms of one HPU at
  /// PsPIN's 500 ns PCIe latency, the time of 4 MiB at 23 Gbit/s (issue 21).
  static void originate_up_burst(spin::ctx* ctx, state* s, bank* b, const roles& r);
  /// Sends packet j, whose elements are in `el`, up to its slot; `d` is where its descriptor
  /// is built (the burst's is in handler memory: that invocation's stack has no room).
  [[gnu::always_inline]] static inline void send_up(spin::ctx* ctx, state* s, bank* b, const roles& r, u64 j, u8* el, send_desc& d);
  /// The shadow copy of packet j's slot: alternating per round within a call, as SwitchML's,
  /// and starting each call on the copy the last completed call did not end on. A rank starts
  /// its contributions before the verdict (starts_early) while a slower rank may still need the
  /// previous call's last results from the switch; those stay in the other copy until this
  /// call's second round in that slot, which needs every rank's first-round contribution, so
  /// every rank has finished the previous call by then.
  static u32 shadow_of(const state* s, const roles& r, u64 j);
  /// After a completed call of `total` packets over `slots` slots: slot x was used
  /// total / slots + (x < total % slots) rounds; its next first round switches copy when that
  /// is odd. Every rank does this for the same agreed calls, so every rank's parity stays equal.
  static void advance_parity(state* s, u64 total, u32 slots);
  static ret on_down(spin::ctx* ctx, state* s);
  /// A block's packet the switch replicated: land it; the origin's own copy releases its next
  /// packet.
  static ret on_mdown(spin::ctx* ctx, state* s);

  // ---- switch aggregation, switch side (engine/switch.hpp) --------------------------------------
  static slot_hdr* slot_at(spin::ctx* ctx, const state* s, u32 slot, u32 shadow);
  static u64 slot_off(const state* s, u32 slot, u32 shadow);
  /// Contribution k (k < nranks) or, with k == nranks, the result of a slot copy.
  static u8* slot_data(spin::ctx* ctx, const state* s, u32 slot, u32 shadow, u32 k, u64 bytes);
  static bool key_newer(u32 e, u32 j, const slot_hdr* h);
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
  static ret on_up(spin::ctx* ctx, state* s, bool from_leaf);
  /// A leaf gets the root's result for a slot: keep it and multicast it to the local members.
  static ret on_down2(spin::ctx* ctx, state* s);
  /// A member's probe (its repair tick found its epoch stalled; see repair): for each of the
  /// contributions it names, whether this switch holds it in a slot that still waits for other
  /// members. The answer leaves after every result this switch sent the member before it, so
  /// on a path that keeps order what the member still lacks when the answer arrives was lost,
  /// or its contribution never arrived. Read-only: it changes no slot.
  static ret on_probe(spin::ctx* ctx, state* s);
  /// The switch's answer to this rank's probe: send again each contribution named there whose
  /// result is not here and that the switch does not hold waiting for other members. Only
  /// then was the epoch repaired (ev_done's repaired bit; the host's repair timer then takes
  /// no sample from it and backs off).
  static ret on_probe_ans(spin::ctx* ctx, state* s);
  /// Replicates a member's packet to every member, its origin included (whose copy is the
  /// sign that the switch has it). Stateless: the members repair among themselves.
  static ret on_mcast(spin::ctx* ctx, state* s);

  // ---- repair (engine/repair.hpp) ---------------------------------------------------------------
  static void repair(spin::ctx* ctx, state* s, bank* b);

  // ---- commands (engine/commands.hpp) -----------------------------------------------------------
  static bool valid_start(spin::ctx* ctx, state* s, const start_desc* d, u32& why);
  // The command's MAC under the host's key (protocol.hpp, cmd_key_off).
  struct cmd_key {
    u64 k0, k1;
  };
  static bool authentic(spin::ctx* ctx, const cmd* c);
  static ret on_cmd(spin::ctx* ctx, state* s);
  static ret on_hello(spin::ctx* ctx, state* s);
  static ret on_ctl(spin::ctx* ctx, state* s, u32 kind);

  // ---- the payload handler: every packet kind to its part ------------------------------------------
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

#include <spin/coll/engine/epoch.hpp>
#include <spin/coll/engine/edge_ring.hpp>
#include <spin/coll/engine/host_ring.hpp>
#include <spin/coll/engine/switch_worker.hpp>
#include <spin/coll/engine/switch.hpp>
#include <spin/coll/engine/repair.hpp>
#include <spin/coll/engine/commands.hpp>

/// Defines the collective engine's handler for the reductions `Reductions` (standard_reductions,
/// or single_reduction<R> for a user reduction R) and declares its memory. Once per file.
#define SPIN_COLL_ENGINE(Reductions)                                                                  \
  SPIN_MEMORY(::spin::coll::engine_state_bytes, ::spin::coll::proto::scratch_bytes);                 \
  SPIN_PAYLOAD_HANDLER(spin_coll_payload) { return ::spin::coll::engine_detail::engine<Reductions>::handle(ctx); }
