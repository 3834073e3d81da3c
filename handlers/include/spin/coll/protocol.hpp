// The collective protocol between hosts, NICs and switches (docs/collectives.md, "Protocol"):
// packet kinds, match bits, the commands a host gives its NIC, the parameters every rank must
// agree on, host events, and the ring geometry. Freestanding: shared by the handlers
// (spin/coll/engine.hpp) and the host library (spin::coll).
//
// Every protocol packet is a one-packet message (start and end flags, offset 0) that carries
// the wire format's collective extension (`spin::coll_desc`): op and dtype of the collective,
// `epoch` (the communicator's collective sequence number), `aux` (the packet's index in the
// collective, or the sender's index for control kinds) and `elem_count`. Message ids come from
// a per-NIC counter, so a retransmission is a new message: the runtime's duplicate filter
// drops only copies a link made.
#pragma once

#include <spin/coll/types.hpp>
#include <spin/handler.hpp>

namespace spin::coll::proto {

/// Top 16 bits of the match bits of every collective packet.
inline constexpr u64 match_tag = 0xC011ull << 48;
/// Match bits: tag | communicator id (16 bits) << 32 | kind << 24. A communicator's EC matches
/// tag and id and ignores the low 32 bits.
constexpr u64 match_bits(u32 comm_id, u32 kind) {
  return match_tag | (static_cast<u64>(comm_id & 0xffffu) << 32) | (static_cast<u64>(kind & 0xffu) << 24);
}
constexpr u64 match_ignore_mask = 0xffffffffull;
constexpr u32 kind_of(u64 match_bits) { return static_cast<u32>(match_bits >> 24) & 0xffu; }
constexpr u32 comm_of(u64 match_bits) { return static_cast<u32>(match_bits >> 32) & 0xffffu; }

/// Packet kinds (match bits 31..24).
enum kind : u32 {
  k_cmd = 1,        ///< host -> its own NIC: a command (payload: cmd)
  k_hello = 2,      ///< rank -> every rank: the parameters of a collective (payload: hello)
  k_hello_req = 3,  ///< "send me your hello again" (payload: ctl)
  k_rs = 4,         ///< ring reduce-scatter: a partial result in accumulator format
  k_ag = 5,         ///< ring allgather: a final result in element format
  k_nack = 6,       ///< "send me the results I lack" (payload: nack, the requester's bitmap)
  k_done = 7,       ///< "I hold every result" (to the predecessor; payload: ctl)
  k_done_req = 8,   ///< "do you hold every result?" (to the successor; payload: ctl)
  k_ack = 9,        ///< "packet aux arrived at the end of its path" (to its originator; payload: ctl)
  k_up = 10,        ///< worker -> switch: a contribution to an aggregator slot (element format)
  k_down = 11,      ///< switch -> worker: the result of a slot (element format)
  k_xfer = 12,      ///< host_ring: a packet of a chunk the host sends to its successor
  k_mcast = 13,     ///< allgather/broadcast through a switch: a block's packet, to replicate
  k_mdown = 14,     ///< the switch's copy of a k_mcast packet, to every member (its origin too)
  k_up2 = 15,       ///< leaf -> root: the combined contribution of a leaf's members (order-free reductions)
  k_down2 = 16,     ///< root -> every leaf: the result of a slot
  k_probe = 17,     ///< worker -> its switch: "which of my contributions do you hold?" (payload: probe)
  k_probe_ans = 18, ///< switch -> worker: the answer (payload: probe, then the `waiting` bitmap)
};
/// Kinds are below this (engine_counters::sent has one counter per kind).
inline constexpr u32 kind_count = 32;

/// `coll_desc::aux` of k_up and k_down: chunk << 16 | packet index (max_packets is 2^16).
constexpr u32 switch_aux(u64 chunk, u64 pkt) { return static_cast<u32>((chunk << 16) | pkt); }
/// `coll_desc::slot` of k_up and k_down: slot index | shadow copy << 15 (SwitchML's pool index
/// and version).
constexpr u16 switch_slot(u32 slot, u32 shadow) { return static_cast<u16>((slot & 0x7fffu) | ((shadow & 1u) << 15)); }
inline constexpr u32 max_switch_slots = 0x7fff;

/// `coll_desc::slot` of a ring packet: a repeat from its originator, passed on to the end of
/// its path even by ranks that hold it.
inline constexpr u16 ring_again = 1;

/// Collective kinds.
enum class coll_kind : u8 { allreduce = 1, reduce_scatter = 2, allgather = 3, broadcast = 4 };
/// Algorithms (docs/collectives.md).
enum class algo : u8 { edge_ring = 1, switch_agg = 2, host_ring = 3 };

/// Largest communicator (ranks). Bitmaps of ranks are 4 words.
inline constexpr u32 max_ranks = 256;
/// Largest collective one epoch carries (packets); the host library splits larger ones.
inline constexpr u32 max_packets = 65536;
/// Largest payload of a collective packet (bytes).
inline constexpr u32 max_packet_bytes = 4096;
/// Scratchpad each message needs: one element buffer and one accumulator buffer.
inline constexpr u32 scratch_bytes = 2 * max_packet_bytes;

/// What every rank of a collective must agree on. Compared byte for byte (the hello).
struct params {
  u8 kind;          ///< coll_kind
  u8 op;            ///< spin::coll::op
  u8 dtype;         ///< spin::coll::dtype
  u8 algo;          ///< algo
  u32 nranks;
  u64 count;        ///< elements of this epoch (allreduce: of each rank's vector)
  u64 total_count;  ///< elements of the whole collective (split into epochs)
  u32 elem_bytes;
  u32 acc_bytes;
  u32 pkt_elems;    ///< elements per packet
  u32 reduction_id; ///< which reduction package (a hash of its name); 0 for the standard ones
  u32 root;
  u32 slots;        ///< switch_agg: aggregator slots of the job (0 for the ring)
};
static_assert(sizeof(params) == 48);

/// Names of the params fields, in the order `first_difference` reports them.
enum class field : u8 { none = 0, kind, op, dtype, algo, nranks, total_count, count, elem_bytes, acc_bytes, pkt_elems, reduction_id, root, slots };

/// The first field in which a and b differ.
constexpr field first_difference(const params& a, const params& b) {
  if (a.kind != b.kind) return field::kind;
  if (a.op != b.op) return field::op;
  if (a.dtype != b.dtype) return field::dtype;
  if (a.algo != b.algo) return field::algo;
  if (a.nranks != b.nranks) return field::nranks;
  if (a.total_count != b.total_count) return field::total_count;
  if (a.count != b.count) return field::count;
  if (a.elem_bytes != b.elem_bytes) return field::elem_bytes;
  if (a.acc_bytes != b.acc_bytes) return field::acc_bytes;
  if (a.pkt_elems != b.pkt_elems) return field::pkt_elems;
  if (a.reduction_id != b.reduction_id) return field::reduction_id;
  if (a.root != b.root) return field::root;
  if (a.slots != b.slots) return field::slots;
  return field::none;
}

constexpr const char* field_name(field f) {
  switch (f) {
  case field::none: return "none";
  case field::kind: return "collective";
  case field::op: return "operation";
  case field::dtype: return "datatype";
  case field::algo: return "algorithm";
  case field::nranks: return "number of ranks";
  case field::total_count: return "count";
  case field::count: return "segment size (options::packet_bytes or staging_bytes)";
  case field::elem_bytes: return "element size";
  case field::acc_bytes: return "accumulator size";
  case field::pkt_elems: return "elements per packet";
  case field::reduction_id: return "reduction";
  case field::root: return "root";
  case field::slots: return "switch slots";
  }
  return "?";
}

/// Command types.
enum cmd_type : u32 {
  cmd_setup = 1,   ///< learn the members (DMA of `nranks` u32 NIC ranks from host offset `desc_off`)
  cmd_start = 2,   ///< start epoch `epoch` (DMA of a `start_desc` from host offset `desc_off`)
  cmd_repair = 3,  ///< a timer tick of epoch `epoch`: repair when nothing progressed since the last tick
  cmd_stats = 4,   ///< DMA the engine's counters (engine_counters) to host offset `desc_off`
  cmd_switch_setup = 5,  ///< become a switch aggregator: DMA a switch_setup from host offset `desc_off`
  cmd_xfer = 6,    ///< host_ring: send chunk `chunk` of phase `phase` from host offset `desc_off` to the successor
};

/// What a switch's engine learns at cmd_switch_setup (followed by `nranks` u32 NIC ranks).
struct switch_setup {
  u32 nranks;
  u32 slots;       ///< aggregator slots of the job (each with two shadow copies)
  u32 slot_bytes;  ///< largest contribution (packet payload bytes)
  u32 role;        ///< switch_root: aggregates for `nranks` members; switch_leaf: for its local members, under `parent`
  u32 parent;      ///< switch_leaf: NIC rank of the root above it
  u32 nleaves;     ///< switch_root of a hierarchy: leaves below it (their NIC ranks follow the members)
};
enum switch_role : u32 { switch_root = 1, switch_leaf = 2 };
inline constexpr u32 max_leaves = 64;

/// The payload of a k_cmd packet.
struct cmd {
  u32 type;      ///< cmd_type
  u32 epoch;
  u32 me;        ///< cmd_setup: this rank's index in the communicator
  u32 nranks;    ///< cmd_setup: members
  u64 desc_off;  ///< host window offset of the members table, the start_desc, or cmd_xfer's data
  u32 phase;     ///< cmd_xfer: xfer_rs or xfer_ag
  u32 chunk;     ///< cmd_xfer: the chunk
  u64 nonce;     ///< the host's command counter: no two commands of one key carry the same bytes
  u64 mac;       ///< SipHash-2-4 of the bytes before this field under the key at cmd_key_off
};

/// Host window offset of the 16-byte command key (SipHash-2-4, siphash.hpp). The host writes a
/// random key there before its first command; the engine reads it for every command and drops
/// (dr_forged) a command whose `mac` does not match, or any command while the key is all zero.
/// A frame from the network cannot write host memory, so a forged command (a stranger's, or one
/// with this NIC's own address as its source) cannot carry a valid MAC, cmd_setup included.
inline constexpr u64 cmd_key_off = 0;
/// Bytes of a command the MAC covers.
inline constexpr u64 cmd_mac_bytes = __builtin_offsetof(cmd, mac);

/// host_ring phases: reduce-scatter partials travel in accumulator format, allgather results
/// in element format. `coll_desc::slot` of k_xfer and k_ack is phase << 1 | ring_again.
enum xfer_phase : u32 { xfer_rs = 0, xfer_ag = 1 };

/// What a host tells its NIC about one collective (read by DMA at cmd_start).
/// Where the elements of a chunk live in a host buffer. Element e of chunk c (whose first
/// element is lo(c)) is at byte off + e * elem_bytes when `blocked` is 0, and at
/// off + c * stride + (e - lo(c)) * elem_bytes when it is 1 (a buffer of per-rank blocks, or
/// with stride 0 one block that holds only this rank's chunk).
struct buffer_desc {
  u64 off;
  u64 stride;
  u32 blocked;
  u32 reserved;
};

struct start_desc {
  params p;
  buffer_desc in;   ///< this rank's input
  buffer_desc out;  ///< the output
  u32 window;       ///< packets each originator keeps in flight (1..max_window)
  u32 recovery;     ///< 1: repair on timer ticks; 0: never (a lost packet ends in a timeout)
  u32 switch_rank;  ///< switch_agg: NIC rank of the aggregating switch
  u32 reserved;
  u64 recv_off;     ///< host_ring: where reduce-scatter partials land (accumulator format, by element)
};
inline constexpr u32 max_window = 256;

/// Payload of k_hello.
struct hello {
  u32 sender;  ///< index of the sender in the communicator
  u32 reserved;
  params p;
};

/// Payload of k_hello_req, k_done, k_done_req.
struct ctl {
  u32 sender;
  u32 reserved;
};

/// Payload of k_nack: words [first_word, first_word + nwords) of the requester's result bitmap.
struct nack_head {
  u32 sender;
  u32 first_word;
  u32 nwords;
  u32 reserved;
};
inline constexpr u32 nack_max_words = (1024 - sizeof(nack_head)) / 8;

/// Payload of k_probe, and the head of k_probe_ans: the worker's packets [first, first +
/// count), from the first whose result it lacks to the last it sent (some in between may be
/// back already), with the slots it spreads packets over (packet j uses slot j % slots). k_probe_ans follows it with ceil(count / 64) words: bit i
/// set when the switch holds contribution first + i and its slot still waits for other
/// members (the worker need not send it again).
struct probe {
  u32 sender;
  u32 first;
  u32 count;
  u32 slots;
};
/// Largest probe (packets): the answer's bitmap fills at most one packet.
inline constexpr u32 probe_max_packets = (max_packet_bytes - sizeof(probe)) * 8;

/// Host events (the 8-byte value a NIC posts): type << 56 | epoch << 24 | detail.
enum event_type : u32 {
  ev_setup = 1,     ///< cmd_setup done; detail 0, or 1 when the members table was invalid
  ev_done = 2,      ///< this rank holds every result of `epoch`, and so does its successor;
                    ///< detail: done_detail (whether a tick repaired, packets originated)
  ev_mismatch = 3,  ///< ranks disagree: detail = field << 16 | index of a rank that differs from rank 0
  ev_error = 4,     ///< the start descriptor was invalid (detail: reason)
  ev_stats = 5,     ///< cmd_stats done
  ev_go = 6,        ///< host_ring: every rank agreed; the host may start its transfers
  ev_recv = 7,      ///< host_ring: a chunk arrived whole (detail: phase << 16 | chunk)
  ev_sent = 8,      ///< host_ring: every packet of the current transfer was acknowledged (detail as ev_recv)
};
constexpr u64 event(u32 type, u32 epoch, u32 detail) {
  return (static_cast<u64>(type) << 56) | (static_cast<u64>(epoch) << 24) | (detail & 0xffffffu);
}
constexpr u32 event_type_of(u64 v) { return static_cast<u32>(v >> 56); }
constexpr u32 event_epoch_of(u64 v) { return static_cast<u32>(v >> 24); }
constexpr u32 event_detail_of(u64 v) { return static_cast<u32>(v & 0xffffffu); }

/// ev_done's detail: bit 23 set when a repair tick found the epoch stalled and repaired it; bits
/// 0..22 the packets this rank originated in the epoch (at most 2^23 - 1). The host's repair
/// timer takes a round-trip sample from an epoch without repair (time per window of those
/// packets) and backs off after one with (docs/collectives.md, "Repair timer").
constexpr u32 done_detail(bool repaired, u64 packets) {
  return (repaired ? 1u << 23 : 0u) | static_cast<u32>(packets < (1u << 23) ? packets : (1u << 23) - 1);
}
constexpr bool done_repaired(u32 detail) { return (detail >> 23) & 1u; }
constexpr u32 done_packets(u32 detail) { return detail & ((1u << 23) - 1); }

/// Reasons of ev_error.
enum start_error : u32 { se_desc = 1, se_params = 2, se_window = 3 };

/// Why the engine ignored a packet (counters in handler memory).
enum drop_reason : u32 {
  dr_stale = 0,      ///< epoch older than the current one, or a state that no longer needs it
  dr_malformed = 1,  ///< wrong length, index or field
  dr_stranger = 2,   ///< sender is not the member the protocol expects
  dr_early = 3,      ///< data before this rank's host started the epoch
  dr_duplicate = 4,  ///< a result this rank already holds
  dr_send = 5,       ///< a send failed (transmit queue full); repair resends
  dr_dma = 6,        ///< a DMA failed (descriptor outside the host window)
  dr_forged = 7,     ///< a command whose MAC does not match the host's key (cmd_key_off)
  dr_count = 8,
};

/// The engine's counters as cmd_stats writes them (communicator::engine_counters reads them).
struct engine_counters {
  u64 drops[dr_count];   ///< packets ignored, by drop_reason
  u64 sent[kind_count];  ///< packets sent, by kind
};

// ---- the ring (docs/collectives.md, "Edge ring") ------------------------------------------------
// The count is cut into chunks, chunk c holding elements [lo(c), lo(c+1)); the first
// count % chunks chunks have one element more. Allreduce and reduce-scatter have one chunk per
// rank: chunk c is reduced along the ring starting at rank c+1 (its originator) and ending at
// rank c (its owner), which rounds the result; allreduce then passes it on c -> c+1 -> ... ->
// c-1. Allgather has one chunk per rank, passed on from its owner; broadcast one chunk, the
// root's. Packets are numbered over the whole collective: chunk 0's first, then chunk 1's.
struct ring_geom {
  u64 count = 0;
  u32 n = 1;          ///< ranks
  u32 p = 1;          ///< elements per packet
  u64 base = 0;       ///< count / n
  u64 extra = 0;      ///< count % n
  u64 pa = 0;         ///< packets of a chunk with base + 1 elements
  u64 pb = 0;         ///< packets of a chunk with base elements
  u64 total = 0;      ///< packets of the collective

  static constexpr ring_geom make(u64 count, u32 n, u32 p) {
    ring_geom g;
    g.count = count;
    g.n = n;
    g.p = p;
    g.base = spin::div(count, static_cast<u64>(n));
    g.extra = count - g.base * n;
    g.pa = spin::div(g.base + 1 + p - 1, static_cast<u64>(p));
    g.pb = spin::div(g.base + p - 1, static_cast<u64>(p));
    g.total = g.extra * g.pa + (n - g.extra) * g.pb;
    return g;
  }
  constexpr u64 chunk_lo(u64 c) const { return c * base + (c < extra ? c : extra); }
  constexpr u64 chunk_len(u64 c) const { return base + (c < extra ? 1 : 0); }
  constexpr u64 chunk_packets(u64 c) const { return c < extra ? pa : pb; }
  constexpr u64 first_packet(u64 c) const { return c < extra ? c * pa : extra * pa + (c - extra) * pb; }
  /// Chunk of packet g (g < total).
  constexpr u64 chunk_of(u64 g) const {
    if (g < extra * pa) return spin::div(g, pa);
    return extra + spin::div(g - extra * pa, pb);
  }
  /// First element and element count of packet g of chunk c.
  constexpr u64 packet_lo(u64 c, u64 g) const { return chunk_lo(c) + (g - first_packet(c)) * p; }
  constexpr u64 packet_len(u64 c, u64 g) const {
    const u64 lo = (g - first_packet(c)) * p;
    const u64 len = chunk_len(c);
    return len - lo < p ? len - lo : p;
  }
};

} // namespace spin::coll::proto
