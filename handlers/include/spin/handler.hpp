// spinnic handler API: the one header a handler author includes.
//
// Freestanding: it uses no libstdc++ and no libc, only compiler builtins, so the same source
// compiles for the native target (x86-64 shared object) and, later, the eBPF target.
//
// Model (sPIN, Hoefler et al., SC17, section 3; PsPIN, ISCA 2021): a message is a sequence of
// packets that match one execution context (EC). For each message the NIC runs
//   - the header handler once, before any payload handler of the message,
//   - one payload handler per packet, concurrently on any HPU, in no guaranteed order,
//   - the completion handler once, after the end-of-message packet was seen, every packet of
//     the message arrived and every payload handler of the message returned.
// Any of the three may be absent.
//
// Two targets, one source. Native handlers (x86-64 shared objects) reach the runtime only
// through the function table carried in their context (`spin::ctx::api`), never through
// symbols the dynamic linker resolves: a compiled native handler has no undefined symbols.
// eBPF cannot call through pointers, so when clang compiles for BPF (`__bpf__`) the same
// `ctx` methods call extern "C" functions `spin_bpf_*` that the runtime binds by name as
// rte_bpf external symbols (docs/handler-guide.md, "The eBPF target").
#pragma once

// Handler sources are freestanding and include no <cstddef>; offsetof comes from the compiler.
#ifndef offsetof
#define offsetof(type, member) __builtin_offsetof(type, member)
#endif

#if defined(__bpf__)
#define SPIN_BPF 1
#else
#define SPIN_BPF 0
#endif

namespace spin {

using u8 = __UINT8_TYPE__;
using u16 = __UINT16_TYPE__;
using u32 = __UINT32_TYPE__;
using u64 = __UINT64_TYPE__;
using i32 = __INT32_TYPE__;
using i64 = __INT64_TYPE__;

/// ABI version of `spin::ctx` and `spin::api_table`. Bumped on any incompatible change; the
/// runtime refuses handlers built for another version.
inline constexpr u32 abi_version = 1;

/// Error codes shared by the handler API and the runtime. 0 is success; errors are negative so
/// that API calls can return "count or error" in one signed integer.
enum class errc : i32 {
  ok = 0,
  out_of_bounds = -1,    ///< an offset/length lies outside the memory the call may touch
  misaligned = -2,       ///< an atomic or typed access is not naturally aligned
  invalid_argument = -3, ///< a parameter is malformed (null pointer, zero size, bad flag)
  no_space = -4,         ///< a queue or pool is full (TX queue, event queue, message table)
  would_block = -5,      ///< a non-blocking operation has not completed yet
  timeout = -6,          ///< a bounded wait expired
  not_found = -7,        ///< an id (EC, region, DMA handle) does not exist
  exists = -8,           ///< the object is already installed / registered
  no_memory = -9,        ///< the NIC memory arena cannot hold the request
  aborted = -10,         ///< the handler exceeded its budget and was stopped
  not_supported = -11,   ///< the operation is not available (target, configuration)
  bad_state = -12,       ///< the call is not valid now (e.g. unlock of a lock not held)
  fault = -13,           ///< the handler faulted (invalid memory access, trap) and was stopped
};

/// Returns a static, human-readable name for `e` ("out_of_bounds", ...).
constexpr const char* errc_name(errc e) {
  switch (e) {
  case errc::ok: return "ok";
  case errc::out_of_bounds: return "out_of_bounds";
  case errc::misaligned: return "misaligned";
  case errc::invalid_argument: return "invalid_argument";
  case errc::no_space: return "no_space";
  case errc::would_block: return "would_block";
  case errc::timeout: return "timeout";
  case errc::not_found: return "not_found";
  case errc::exists: return "exists";
  case errc::no_memory: return "no_memory";
  case errc::aborted: return "aborted";
  case errc::not_supported: return "not_supported";
  case errc::bad_state: return "bad_state";
  case errc::fault: return "fault";
  }
  return "unknown";
}

/// What a handler tells the runtime when it returns. The runtime's exact reaction:
///
/// | code            | header handler                          | payload handler                    | completion handler |
/// |-----------------|-----------------------------------------|------------------------------------|--------------------|
/// | success         | run payload handlers, then completion   | packet done                        | message done       |
/// | drop            | discard the whole message: no payload or completion handler runs; its packets count as `handler_drop` | this packet counts as `handler_drop`; the message goes on | message done, counted as dropped message |
/// | proceed         | skip every payload handler; completion runs once the message is complete | skip payload handlers of packets not yet started; completion as usual | as success |
/// | *_pending       | as the base code, and the message's match entry stays pending (below) |
///
/// Pending: normally a message's entry is retired right after its completion handler; its
/// scratchpad is freed and its key is remembered in a bounded per-EC history so that late
/// duplicates are dropped as `duplicate`. When any handler of the message returns a *_pending
/// code, the entry is kept (scratchpad included) after completion until the host releases it
/// (`spin::rt::runtime::release_message`) or the EC is uninstalled; every late packet of it
/// counts as `duplicate`, however long ago it completed.
/// Any other value counts as `bad_return` and is treated as drop.
enum class ret : i32 {
  success = 0,
  drop = 1,
  proceed = 2,
  success_pending = 3,
  drop_pending = 4,
  proceed_pending = 5,
};

/// The three handler kinds.
enum class handler_kind : u32 { header = 0, payload = 1, completion = 2 };

/// Flags of `message_desc::flags`.
enum message_flags : u32 {
  msg_start = 1u << 0,  ///< this packet opens the message (packet_index == 0)
  msg_end = 1u << 1,    ///< this packet is the last one of the message
  msg_retransmit = 1u << 2, ///< the sender marked this packet as a retransmission
  msg_coll = 1u << 3,  ///< the packet carries the collective fields (`ctx::coll`, `send_desc::coll`)
};

/// The collective fields of a packet: the wire format's 16-byte collective extension
/// (docs/wire-format.md). A packet has them when its `message_desc::flags` has `msg_coll`;
/// otherwise they are zero. The runtime carries them without interpreting them; the collective
/// protocol gives them their meaning (docs/collectives.md).
struct coll_desc {
  u8 op;           ///< reduction operation id
  u8 dtype;        ///< datatype id
  u16 slot;        ///< aggregator slot index; bit 15 selects the shadow copy
  u32 elem_count;  ///< elements in this packet
  u32 epoch;       ///< collective sequence number
  u32 aux;         ///< protocol-specific (packet index, attempt)
};

/// Where a packet of a message comes from and where it belongs. All fields are host byte order.
struct message_desc {
  u32 ec_id;              ///< execution context the message matched
  u32 source_rank;        ///< rank of the sender
  u64 message_id;         ///< sender-chosen id, unique per (EC, source) while in flight
  u64 match_bits;         ///< the packet's match bits (wire header)
  u64 offset_bytes;       ///< byte offset of this packet's payload in the message
  u64 message_len_bytes;  ///< total payload bytes of the message
  u32 packet_index;       ///< 0-based index of this packet in the message
  u32 flags;              ///< `message_flags`
  u32 packet_count;       ///< packets in the message; 0 while the end packet is unseen
  u32 reserved;
};

/// Handle of a non-blocking DMA; test it with `ctx::dma_test`, wait with `ctx::dma_wait`.
struct dma_handle {
  u64 id;
};

/// Descriptor of a packet a handler sends (`ctx::send`, `ctx::put`). Begins with its size so
/// the struct can grow without breaking compiled handlers.
struct send_desc {
  u32 size_bytes;           ///< sizeof(send_desc) as the handler was compiled
  u32 dest_rank;            ///< destination rank; the port maps it to an address
  u64 match_bits;           ///< match bits of the outgoing packet
  u64 message_id;           ///< message id of the outgoing packet
  u64 offset_bytes;         ///< byte offset of this packet in the outgoing message (put target)
  u64 message_len_bytes;    ///< total length of the outgoing message
  const void* data;         ///< payload: must lie in the packet, handler memory or scratchpad
  u32 len_bytes;            ///< payload bytes (at most the port's MTU payload)
  u32 flags;                ///< `message_flags` of the outgoing packet
  u32 packet_index;         ///< packet index in the outgoing message
  u32 reserved;
  /// Collective fields of the outgoing packet, sent when `flags` has `msg_coll`. Appended in
  /// place of an ABI bump: a handler compiled before it existed sends a smaller `size_bytes`
  /// and the runtime does not read it.
  coll_desc coll;
};

struct ctx;

/// The runtime's function table. C ABI, begins with its size: a runtime built later may append
/// entries; a handler only calls entries that fit in `size_bytes`. Every call is bounds-checked
/// against the calling handler's own packet, EC handler memory, message scratchpad and host
/// window, and returns `errc` as i32 (0 or a negative error), or a count where stated.
struct api_table {
  u64 size_bytes;
  u32 abi_version;
  u32 reserved;
  /// Copies `len` bytes from local memory `src` to host window offset `host_off`. With `h`
  /// null the call blocks until the copy is done; otherwise it returns at once and fills `h`.
  i32 (*dma_to_host)(ctx* c, u64 host_off, const void* src, u64 len, dma_handle* h);
  /// Copies `len` bytes from host window offset `host_off` to local memory `dst`.
  i32 (*dma_from_host)(ctx* c, void* dst, u64 host_off, u64 len, dma_handle* h);
  /// 1 when the DMA `h` has completed, 0 while it is in flight, <0 on error.
  i32 (*dma_test)(ctx* c, dma_handle h);
  /// Waits until the DMA `h` has completed.
  i32 (*dma_wait)(ctx* c, dma_handle h);
  /// Sends one packet described by `d` through the NIC's TX queue.
  i32 (*send)(ctx* c, const send_desc* d);
  /// Writes an 8-byte event to the host's event queue of this EC.
  i32 (*post_event)(ctx* c, u64 value);
  /// Acquires the spin lock word at handler-memory offset `off` (8-byte aligned u64).
  i32 (*lock)(ctx* c, u64 off);
  /// Releases the spin lock at `off`; the caller must hold it.
  i32 (*unlock)(ctx* c, u64 off);
  /// Sends the packet `d` describes to each of `dests[0..count)` (copy i with message id
  /// d->message_id + i); returns the copies sent or a negative error. Appended after `unlock`:
  /// `ctx::multicast` checks `size_bytes` and falls back to one `send` per destination.
  i32 (*multicast)(ctx* c, const send_desc* d, const u32* dests, u32 count);
  /// Sends the calling handler's packet on to `dest_rank` as it is (`ctx::forward`), without
  /// copying its payload where the NIC can. Appended after `multicast`: `ctx::forward` checks
  /// `size_bytes` and falls back to `send`.
  i32 (*forward)(ctx* c, u32 dest_rank);
};

/// Most destinations one `ctx::multicast` takes.
inline constexpr u32 max_multicast = 256;

/// Memory a handler source declares with SPIN_MEMORY; spinc copies it into the package
/// manifest and the loader gives an EC at least this much.
struct memory_decl {
  u64 size_bytes;         ///< sizeof(memory_decl)
  u64 handler_mem_bytes;  ///< handler memory of the EC (bytes)
  u64 scratchpad_bytes;   ///< scratchpad per message (bytes)
};

/// Bytes an eBPF handler may address from one pointer that `ctx::mem`, `ctx::scratchpad` or
/// `ctx::payload` returns: the largest `count * sizeof(T)` one call may ask for. DPDK's
/// validator proves at load time that every access through the pointer stays inside this
/// window; the runtime backs every window with memory of the same EC (docs/handler-guide.md).
inline constexpr u64 bpf_window_bytes = 4096;

/// Memory regions of a handler invocation, as the eBPF bridge names them.
enum class region : u64 { packet = 0, handler_mem = 1, scratchpad = 2 };

/// Operation codes of the eBPF bridge's atomic call: op | width (4 or 8) << 8 | signed << 16.
enum class atomic_op : u64 { fetch_add = 1, exchange = 2, fetch_min = 3, fetch_max = 4, load = 5, store = 6 };

#if SPIN_BPF
// The eBPF bridge: extern functions the runtime binds by name (rte_bpf_xsym, at most 5 64-bit
// arguments). They live in ".ksyms", where libbpf (spinc's object check) expects extern
// functions. Handlers call the ctx methods below, never these directly. Pointer arguments that
// the runtime writes through (`h`, `old`, `expected`, `d`) must point to the BPF stack or a
// window; DPDK's validator checks that at load time.
extern "C" {
#define SPIN_BPF_EXTERN_ __attribute__((section(".ksyms")))
void* spin_bpf_ptr(ctx* c, u64 region, u64 off, u64 bytes, u64 align) SPIN_BPF_EXTERN_;  // 4096-byte window
void* spin_bpf_ptr_8(ctx* c, u64 region, u64 off, u64 bytes, u64 align) SPIN_BPF_EXTERN_;
void* spin_bpf_ptr_16(ctx* c, u64 region, u64 off, u64 bytes, u64 align) SPIN_BPF_EXTERN_;
void* spin_bpf_ptr_32(ctx* c, u64 region, u64 off, u64 bytes, u64 align) SPIN_BPF_EXTERN_;
void* spin_bpf_ptr_64(ctx* c, u64 region, u64 off, u64 bytes, u64 align) SPIN_BPF_EXTERN_;
void* spin_bpf_ptr_128(ctx* c, u64 region, u64 off, u64 bytes, u64 align) SPIN_BPF_EXTERN_;
void* spin_bpf_ptr_256(ctx* c, u64 region, u64 off, u64 bytes, u64 align) SPIN_BPF_EXTERN_;
void* spin_bpf_ptr_512(ctx* c, u64 region, u64 off, u64 bytes, u64 align) SPIN_BPF_EXTERN_;
void* spin_bpf_ptr_1024(ctx* c, u64 region, u64 off, u64 bytes, u64 align) SPIN_BPF_EXTERN_;
void* spin_bpf_ptr_2048(ctx* c, u64 region, u64 off, u64 bytes, u64 align) SPIN_BPF_EXTERN_;
i64 spin_bpf_dma_to_host(ctx* c, u64 host_off, u64 src, u64 len) SPIN_BPF_EXTERN_;
i64 spin_bpf_dma_to_host_nb(ctx* c, u64 host_off, u64 src, u64 len, dma_handle* h) SPIN_BPF_EXTERN_;
i64 spin_bpf_dma_from_host(ctx* c, u64 dst, u64 host_off, u64 len) SPIN_BPF_EXTERN_;
i64 spin_bpf_dma_from_host_nb(ctx* c, u64 dst, u64 host_off, u64 len, dma_handle* h) SPIN_BPF_EXTERN_;
i64 spin_bpf_dma_test(ctx* c, u64 handle) SPIN_BPF_EXTERN_;
i64 spin_bpf_dma_wait(ctx* c, u64 handle) SPIN_BPF_EXTERN_;
i64 spin_bpf_send(ctx* c, const send_desc* d) SPIN_BPF_EXTERN_;
i64 spin_bpf_multicast(ctx* c, const send_desc* d, const u32* dests, u64 count) SPIN_BPF_EXTERN_;
i64 spin_bpf_forward(ctx* c, u64 dest_rank) SPIN_BPF_EXTERN_;
i64 spin_bpf_post_event(ctx* c, u64 value) SPIN_BPF_EXTERN_;
i64 spin_bpf_lock(ctx* c, u64 off) SPIN_BPF_EXTERN_;
i64 spin_bpf_unlock(ctx* c, u64 off) SPIN_BPF_EXTERN_;
i64 spin_bpf_atomic(ctx* c, u64 op, u64 off, u64 value, u64* old) SPIN_BPF_EXTERN_;
i64 spin_bpf_cas(ctx* c, u64 width, u64 off, u64* expected, u64 desired) SPIN_BPF_EXTERN_;
#undef SPIN_BPF_EXTERN_
}
#endif

// ---- integer arithmetic with one meaning on every target ------------------------------------
// C++ leaves division by zero and shifts by the width or more undefined; x86-64 traps on the
// first, and DPDK's rte_bpf stops the program (returning 0) on a zero divisor. Handlers use
// these instead; native, eBPF-JIT and eBPF-interpreted code give the same results:
//   div(a, 0) == 0 and rem(a, 0) == a (the eBPF instruction set's rule);
//   signed: div(min, -1) == min and rem(min, -1) == 0 (two's complement wrap-around);
//   shl/shr shift by (s mod width), as x86-64 and BPF shift instructions do;
//   u32 arithmetic wraps modulo 2^32 and widening a u32 to u64 gives zero upper bits.
// spinc rejects `/` and `%` whose divisor is not a non-zero constant (docs/handler-guide.md).

// Branch-free on purpose: BPF has no conditional move, and every branch doubles the paths
// DPDK's validator explores.
namespace detail {
// Hides a value from the optimiser on eBPF, which would otherwise turn the arithmetic below
// back into comparisons (and BPF branches).
template <class T> constexpr T opaque(T v) {
#if SPIN_BPF
  if (!__builtin_is_constant_evaluated()) __asm__ volatile("" : "+r"(v));
#endif
  return v;
}
constexpr u64 nonzero(u64 b) { return opaque(b | (0 - b)) >> 63; }  // 1 when b != 0, else 0
constexpr u32 nonzero(u32 b) { return opaque(b | (0u - b)) >> 31; }
constexpr u64 sign_mask(i64 a) { return opaque(static_cast<u64>(a >> 63)); }  // all ones when a < 0
constexpr u32 sign_mask(i32 a) { return opaque(static_cast<u32>(a >> 31)); }
} // namespace detail

/// Unsigned quotient; 0 when b == 0.
constexpr u64 div(u64 a, u64 b) {
  const u64 nz = detail::nonzero(b);
  return (a / (b + (1 - nz))) * nz;
}
constexpr u32 div(u32 a, u32 b) {
  const u32 nz = detail::nonzero(b);
  return (a / (b + (1u - nz))) * nz;
}
/// Unsigned remainder; a when b == 0.
constexpr u64 rem(u64 a, u64 b) {
  const u64 nz = detail::nonzero(b);
  return (a % (b + (1 - nz))) + a * (1 - nz);
}
constexpr u32 rem(u32 a, u32 b) {
  const u32 nz = detail::nonzero(b);
  return (a % (b + (1u - nz))) + a * (1u - nz);
}
/// Signed quotient, truncated toward zero; 0 when b == 0; min / -1 == min.
constexpr i64 div(i64 a, i64 b) {
  const u64 ma = detail::sign_mask(a), mb = detail::sign_mask(b);
  const u64 q = div((static_cast<u64>(a) ^ ma) - ma, (static_cast<u64>(b) ^ mb) - mb);
  return static_cast<i64>((q ^ (ma ^ mb)) - (ma ^ mb));
}
constexpr i32 div(i32 a, i32 b) {
  const u32 ma = detail::sign_mask(a), mb = detail::sign_mask(b);
  const u32 q = div((static_cast<u32>(a) ^ ma) - ma, (static_cast<u32>(b) ^ mb) - mb);
  return static_cast<i32>((q ^ (ma ^ mb)) - (ma ^ mb));
}
/// Signed remainder with the sign of a; a when b == 0; min % -1 == 0.
constexpr i64 rem(i64 a, i64 b) {
  const u64 ma = detail::sign_mask(a), mb = detail::sign_mask(b);
  const u64 r = rem((static_cast<u64>(a) ^ ma) - ma, (static_cast<u64>(b) ^ mb) - mb);
  return static_cast<i64>((r ^ ma) - ma);
}
constexpr i32 rem(i32 a, i32 b) {
  const u32 ma = detail::sign_mask(a), mb = detail::sign_mask(b);
  const u32 r = rem((static_cast<u32>(a) ^ ma) - ma, (static_cast<u32>(b) ^ mb) - mb);
  return static_cast<i32>((r ^ ma) - ma);
}
/// Shifts by s mod the width of the operand.
constexpr u64 shl(u64 a, u64 s) { return a << (s & 63); }
constexpr u32 shl(u32 a, u64 s) { return a << (s & 31); }
constexpr u64 shr(u64 a, u64 s) { return a >> (s & 63); }
constexpr u32 shr(u32 a, u64 s) { return a >> (s & 31); }
/// Arithmetic (sign-propagating) right shift by s mod the width.
constexpr i64 sar(i64 a, u64 s) { return a >> (s & 63); }
constexpr i32 sar(i32 a, u64 s) { return a >> (s & 31); }
/// 1 when a < b, else 0, without a branch (Hacker's Delight, 2nd ed., section 2-12): an `if` on a
/// comparison is a BPF branch, and a loop over a packet's values with one per value multiplies
/// the paths DPDK's validator walks; `x += lt(a, b)` or a mask `0 - lt(a, b)` keeps one path.
constexpr u64 lt(u64 a, u64 b) { return detail::opaque((~a & b) | ((~a | b) & (a - b))) >> 63; }
constexpr u64 lt(i64 a, i64 b) {
  const u64 x = static_cast<u64>(a), y = static_cast<u64>(b), d = x - y;
  return detail::opaque(d ^ ((x ^ y) & (d ^ x))) >> 63;
}

namespace detail {
template <class T> struct is_atomic_int { static constexpr bool value = false; };
template <> struct is_atomic_int<u32> { static constexpr bool value = true; };
template <> struct is_atomic_int<u64> { static constexpr bool value = true; };
template <> struct is_atomic_int<i32> { static constexpr bool value = true; };
template <> struct is_atomic_int<i64> { static constexpr bool value = true; };

constexpr bool range_ok(u64 off, u64 len, u64 limit) { return off <= limit && len <= limit - off; }

template <class T> constexpr bool aligned(u64 off) { return off % alignof(T) == 0; }

template <class To, class From> To bit_cast(From f) { return __builtin_bit_cast(To, f); }
} // namespace detail

/// A bounds-checked view of bytes the handler may read and write (packet payload, handler
/// memory, scratchpad).
struct byte_view {
  u8* data;
  u64 len_bytes;

  /// Returns a pointer to `count` objects of type T at byte `off`, or null when they do not lie
  /// inside the view or are not aligned for T.
  template <class T> T* at(u64 off, u64 count = 1) const {
    static_assert(!SPIN_BPF || sizeof(T) == 0, "on the eBPF target use ctx->payload, ctx->mem or ctx->scratchpad");
    if (count > len_bytes / sizeof(T) || !detail::range_ok(off, count * sizeof(T), len_bytes) ||
        !detail::aligned<T>(reinterpret_cast<u64>(data) + off))
      return nullptr;
    return reinterpret_cast<T*>(data + off);
  }
  u64 size() const { return len_bytes; }
};

/// The handler context: everything a handler invocation sees. Built by the runtime for each
/// call; valid only during the call. Begins with its size (ABI rule of `api_table`).
struct ctx {
  u32 size_bytes;             ///< sizeof(ctx) as the runtime built it
  u32 abi_version;            ///< `spin::abi_version` of the runtime
  const api_table* api;       ///< the runtime's function table
  void* rt;                   ///< opaque runtime state of this invocation
  byte_view packet;           ///< payload of this packet (after the spin header); empty in completion
  message_desc msg;           ///< the message this invocation belongs to
  byte_view handler_mem;      ///< the EC's handler memory (shared by all messages of the EC)
  byte_view scratch;          ///< this message's scratchpad (zeroed when the message starts)
  u64 host_window_len_bytes;  ///< bytes of the host window that DMA may address
  u32 hpu;                    ///< index of the HPU running this invocation
  u32 kind;                   ///< `handler_kind` of this invocation
  coll_desc coll;             ///< collective fields of this packet (msg.flags has msg_coll), else zero

  // ---- typed access -----------------------------------------------------------------------
  /// `count` objects of T at byte `off` of the EC's handler memory, or null when out of bounds
  /// or misaligned.
  /// On the eBPF target `count * sizeof(T)` may be at most `bpf_window_bytes`.
  template <class T> T* mem(u64 off, u64 count = 1) const {
#if SPIN_BPF
    return bpf_at<T>(region::handler_mem, off, count);
#else
    return handler_mem.at<T>(off, count);
#endif
  }
  /// `count` objects of T at byte `off` of the message scratchpad, or null.
  template <class T> T* scratchpad(u64 off, u64 count = 1) const {
#if SPIN_BPF
    return bpf_at<T>(region::scratchpad, off, count);
#else
    return scratch.at<T>(off, count);
#endif
  }
  /// `count` objects of T at byte `off` of the packet payload, or null.
  template <class T> T* payload(u64 off, u64 count = 1) const {
#if SPIN_BPF
    return bpf_at<T>(region::packet, off, count);
#else
    return packet.at<T>(off, count);
#endif
  }

  // ---- DMA ----------------------------------------------------------------------------------
  /// Blocking DMA of `len` bytes from local `src` to host window offset `host_off`.
  /// Errors: out_of_bounds (src range outside packet/handler memory/scratchpad, or host range
  /// outside the window), invalid_argument (null src with len > 0).
  errc dma_to_host(u64 host_off, const void* src, u64 len) {
#if SPIN_BPF
    return static_cast<errc>(spin_bpf_dma_to_host(this, host_off, reinterpret_cast<u64>(src), len));
#else
    return static_cast<errc>(api->dma_to_host(this, host_off, src, len, nullptr));
#endif
  }
  /// Blocking DMA of `len` bytes from host window offset `host_off` to local `dst`.
  errc dma_from_host(void* dst, u64 host_off, u64 len) {
#if SPIN_BPF
    return static_cast<errc>(spin_bpf_dma_from_host(this, reinterpret_cast<u64>(dst), host_off, len));
#else
    return static_cast<errc>(api->dma_from_host(this, dst, host_off, len, nullptr));
#endif
  }
  /// Non-blocking DMA to host; `h` identifies it. Errors as `dma_to_host`, and no_space when the
  /// HPU has too many DMAs in flight.
  errc dma_to_host_nb(u64 host_off, const void* src, u64 len, dma_handle& h) {
#if SPIN_BPF
    return static_cast<errc>(spin_bpf_dma_to_host_nb(this, host_off, reinterpret_cast<u64>(src), len, &h));
#else
    return static_cast<errc>(api->dma_to_host(this, host_off, src, len, &h));
#endif
  }
  /// Non-blocking DMA from host.
  errc dma_from_host_nb(void* dst, u64 host_off, u64 len, dma_handle& h) {
#if SPIN_BPF
    return static_cast<errc>(spin_bpf_dma_from_host_nb(this, reinterpret_cast<u64>(dst), host_off, len, &h));
#else
    return static_cast<errc>(api->dma_from_host(this, dst, host_off, len, &h));
#endif
  }
  /// 1 when `h` completed (the handle is then consumed), 0 while in flight; negative errc
  /// (not_found) for an unknown or consumed handle.
  i32 dma_test(dma_handle h) {
#if SPIN_BPF
    return static_cast<i32>(spin_bpf_dma_test(this, h.id));
#else
    return api->dma_test(this, h);
#endif
  }
  /// Waits for `h` and consumes it; not_found for an unknown or consumed handle.
  errc dma_wait(dma_handle h) {
#if SPIN_BPF
    return static_cast<errc>(spin_bpf_dma_wait(this, h.id));
#else
    return static_cast<errc>(api->dma_wait(this, h));
#endif
  }

  // ---- sending ------------------------------------------------------------------------------
  /// Sends a packet. Errors: out_of_bounds (data outside local memory or longer than the MTU
  /// payload), no_space (TX queue full; the packet is not sent and counted), invalid_argument.
  errc send(const send_desc& d) {
#if SPIN_BPF
    return static_cast<errc>(spin_bpf_send(this, &d));
#else
    return static_cast<errc>(api->send(this, &d));
#endif
  }
  /// Sends the packet `d` describes to every rank of `dests[0..count)`: copy i goes to
  /// dests[i] with message id `d.message_id + i` (every other field as `d`). The payload is
  /// read once; where the NIC can, the copies share it (the emulator chains a header mbuf per
  /// destination in front of one clone of the payload mbuf: DPDK's indirect mbufs) instead of
  /// copying it per destination. `dests` must lie in local memory like `d.data`.
  /// Returns the number of copies sent (0..count; a copy that cannot go, for a full TX queue,
  /// no route or no buffer, is skipped and counted as a failed send), or a negative errc for
  /// the call as a whole: invalid_argument (count 0 or above `max_multicast`, a malformed `d`),
  /// out_of_bounds (data or dests outside local memory, a payload above the MTU),
  /// not_supported (the NIC has no transmitter).
  i32 multicast(const send_desc& d, const u32* dests, u32 count) {
#if SPIN_BPF
    return static_cast<i32>(spin_bpf_multicast(this, &d, dests, count));
#else
    if (api->size_bytes >= __builtin_offsetof(api_table, multicast) + sizeof(api->multicast))
      return api->multicast(this, &d, dests, count);
    if (count == 0 || count > max_multicast) return static_cast<i32>(errc::invalid_argument);
    i32 sent = 0;
    for (u32 i = 0; i < count; ++i) {  // a runtime from before multicast: one send each
      send_desc one = d;
      one.dest_rank = dests[i];
      one.message_id = d.message_id + i;
      const i32 r = api->send(this, &one);
      if (r == 0) ++sent;
      // An error of the descriptor itself comes with the first copy: the call fails as a whole.
      else if (sent == 0 && i == 0 && r != static_cast<i32>(errc::no_space) && r != static_cast<i32>(errc::not_found)) return r;
    }
    return sent;
#endif
  }
  /// Put from device: sends `len` bytes at local `src` to `dest_rank`, to land at byte
  /// `remote_off` of message `message_id` (matched there by `match_bits`).
  errc put(u32 dest_rank, u64 match_bits, u64 message_id, u64 remote_off, const void* src, u32 len,
           u32 flags = msg_start | msg_end) {
    send_desc d{};
    d.size_bytes = sizeof(send_desc);
    d.dest_rank = dest_rank;
    d.match_bits = match_bits;
    d.message_id = message_id;
    d.offset_bytes = remote_off;
    d.message_len_bytes = remote_off + len;
    d.data = src;
    d.len_bytes = len;
    d.flags = flags;
    return send(d);
  }
  /// Forwards this packet unchanged (same match bits, message id, offset, index, flags and
  /// collective fields; this NIC's rank as source) to `dest_rank`. Called from a completion
  /// handler, which has no packet, it sends an empty packet with those fields.
  ///
  /// Zero copy: the NIC sends the received buffer itself. The emulator rewrites the frame's
  /// headers in place in front of the payload when it holds the only reference to the buffer,
  /// and otherwise (a second forward of the same packet, a multicast copy's shared payload)
  /// chains a header mbuf in front of a clone of the payload (DPDK's indirect mbufs); it copies
  /// only where neither is possible (an egress port that sends no chains, a payload under 256
  /// bytes that cannot go in place, no mbuf for the header). On eBPF, changes the program made
  /// to its packet before the call go with it.
  ///
  /// The packet after forward: this handler, and the packet's payload handler after its header
  /// handler, may still read the payload until they return. It stays as it was: the buffer is
  /// shared with the outgoing frame, and a NIC that receives a shared buffer gives handlers that
  /// may write it a private copy (rt::packet::shared). A native handler must not write the
  /// payload after forward: the write races with the readers of the outgoing frame. On eBPF,
  /// changes after a forward stay in the program's copy (they reach neither the frame nor the
  /// packet's later handlers), and forwarding the changed packet again gives bad_state.
  ///
  /// Errors as `send`: no_space (TX queue full or no buffer; the packet is not sent and
  /// counted), not_found (no route to `dest_rank`), out_of_bounds (payload above the MTU),
  /// invalid_argument (the received fields do not make a valid packet), not_supported (no TX
  /// port); on eBPF also bad_state (the packet was changed after it was forwarded).
  ///
  /// Compatibility: native code built against an older runtime's table falls back to a copying
  /// `send`; an eBPF package that calls forward needs a runtime that binds `spin_bpf_forward`
  /// (an older one rejects the program at load).
  errc forward(u32 dest_rank) {
#if SPIN_BPF
    return static_cast<errc>(spin_bpf_forward(this, dest_rank));
#else
    if (api->size_bytes >= __builtin_offsetof(api_table, forward) + sizeof(api->forward))
      return static_cast<errc>(api->forward(this, dest_rank));
    return send(forward_desc(dest_rank));  // a runtime from before forward: a send, which copies
#endif
  }
  /// The packet `forward` sends, as a send descriptor: this packet's fields (`msg`, `coll`; the
  /// start, end and collective flags) and payload, to `dest_rank`.
  send_desc forward_desc(u32 dest_rank) const {
    send_desc d{};
    d.size_bytes = sizeof(send_desc);
    d.dest_rank = dest_rank;
    d.match_bits = msg.match_bits;
    d.message_id = msg.message_id;
    d.offset_bytes = msg.offset_bytes;
    d.message_len_bytes = msg.message_len_bytes;
    d.data = packet.data;
    d.len_bytes = static_cast<u32>(packet.len_bytes);
    d.flags = msg.flags & (msg_start | msg_end | msg_coll);
    d.packet_index = msg.packet_index;
    d.coll = coll;
    return d;
  }

  // ---- host events --------------------------------------------------------------------------
  /// Writes an 8-byte event for the host. Errors: no_space (event queue full; counted).
  errc post_event(u64 value) {
#if SPIN_BPF
    return static_cast<errc>(spin_bpf_post_event(this, value));
#else
    return static_cast<errc>(api->post_event(this, value));
#endif
  }

  // ---- locks --------------------------------------------------------------------------------
  /// Spin lock on the u64 word at handler-memory offset `off`. Errors: out_of_bounds,
  /// misaligned, bad_state (already held by this invocation), no_space (8 locks held already).
  /// A handler stopped for exceeding its budget releases the locks it holds; time spent waiting
  /// for a lock is not charged to the budget, up to 10 budgets.
  errc lock(u64 off) {
#if SPIN_BPF
    return static_cast<errc>(spin_bpf_lock(this, off));
#else
    return static_cast<errc>(api->lock(this, off));
#endif
  }
  /// Errors: out_of_bounds, misaligned, bad_state (the lock is not held by this invocation).
  errc unlock(u64 off) {
#if SPIN_BPF
    return static_cast<errc>(spin_bpf_unlock(this, off));
#else
    return static_cast<errc>(api->unlock(this, off));
#endif
  }

  // ---- atomics on handler memory --------------------------------------------------------------
  // T is u32, u64, i32 or i64. Each returns out_of_bounds or misaligned without touching memory
  // when the word at `off` is not inside handler memory or not naturally aligned; `old`
  // (optional) receives the previous value. Sequentially consistent.
  template <class T> errc fetch_add(u64 off, T v, T* old = nullptr) {
#if SPIN_BPF
    return bpf_atomic<T>(atomic_op::fetch_add, off, v, old);
#else
    return rmw<T>(off, old, [v](T* p) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); });
#endif
  }
  template <class T> errc exchange(u64 off, T v, T* old = nullptr) {
#if SPIN_BPF
    return bpf_atomic<T>(atomic_op::exchange, off, v, old);
#else
    return rmw<T>(off, old, [v](T* p) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); });
#endif
  }
  template <class T> errc fetch_min(u64 off, T v, T* old = nullptr) {
#if SPIN_BPF
    return bpf_atomic<T>(atomic_op::fetch_min, off, v, old);
#else
    return rmw<T>(off, old, [v](T* p) {
      T cur = __atomic_load_n(p, __ATOMIC_SEQ_CST);
      while (v < cur && !__atomic_compare_exchange_n(p, &cur, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
      }
      return cur;
    });
#endif
  }
  template <class T> errc fetch_max(u64 off, T v, T* old = nullptr) {
#if SPIN_BPF
    return bpf_atomic<T>(atomic_op::fetch_max, off, v, old);
#else
    return rmw<T>(off, old, [v](T* p) {
      T cur = __atomic_load_n(p, __ATOMIC_SEQ_CST);
      while (v > cur && !__atomic_compare_exchange_n(p, &cur, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
      }
      return cur;
    });
#endif
  }
  /// Compare-and-swap: when the word equals `*expected` it becomes `desired` and ok is returned;
  /// otherwise `*expected` receives the current value and bad_state is returned.
  template <class T> errc compare_exchange(u64 off, T* expected, T desired) {
    static_assert(detail::is_atomic_int<T>::value, "atomics take u32, u64, i32 or i64");
#if SPIN_BPF
    if (expected == nullptr) return errc::invalid_argument;
    u64 exp = static_cast<u64>(*expected);
    const errc e = static_cast<errc>(spin_bpf_cas(this, sizeof(T), off, &exp, static_cast<u64>(desired)));
    if (e == errc::bad_state) *expected = static_cast<T>(exp);
    return e;
#else
    T* p = mem<T>(off);
    if (p == nullptr || expected == nullptr) return locate_error<T>(off);
    return __atomic_compare_exchange_n(p, expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)
               ? errc::ok
               : errc::bad_state;
#endif
  }
  /// Atomic load.
  template <class T> errc load(u64 off, T* out) {
    static_assert(detail::is_atomic_int<T>::value, "atomics take u32, u64, i32 or i64");
#if SPIN_BPF
    if (out == nullptr) return errc::invalid_argument;
    return bpf_atomic<T>(atomic_op::load, off, T{}, out);
#else
    T* p = mem<T>(off);
    if (p == nullptr || out == nullptr) return locate_error<T>(off);
    *out = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    return errc::ok;
#endif
  }
  /// Atomic store.
  template <class T> errc store(u64 off, T v) {
    static_assert(detail::is_atomic_int<T>::value, "atomics take u32, u64, i32 or i64");
#if SPIN_BPF
    return bpf_atomic<T>(atomic_op::store, off, v, nullptr);
#else
    T* p = mem<T>(off);
    if (p == nullptr) return locate_error<T>(off);
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
    return errc::ok;
#endif
  }

  /// Float atomics via a CAS loop on the bit pattern (F is float or double). min/max follow
  /// IEEE minNum/maxNum: a NaN operand loses against a number.
  /// Not available on the eBPF target, which has no floating point.
  template <class F> errc float_add(u64 off, F v, F* old = nullptr) {
    return float_rmw<F>(off, old, [v](F cur) { return cur + v; });
  }
  template <class F> errc float_min(u64 off, F v, F* old = nullptr) {
    return float_rmw<F>(off, old, [v](F cur) { return (v < cur || cur != cur) ? v : cur; });
  }
  template <class F> errc float_max(u64 off, F v, F* old = nullptr) {
    return float_rmw<F>(off, old, [v](F cur) { return (v > cur || cur != cur) ? v : cur; });
  }

private:
  template <class T> errc locate_error(u64 off) const {
    if (!detail::range_ok(off, sizeof(T), handler_mem.len_bytes)) return errc::out_of_bounds;
    if (!detail::aligned<T>(reinterpret_cast<u64>(handler_mem.data) + off)) return errc::misaligned;
    return errc::invalid_argument;
  }
  template <class T, class Op> errc rmw(u64 off, T* old, Op op) {
    static_assert(detail::is_atomic_int<T>::value, "atomics take u32, u64, i32 or i64");
    T* p = mem<T>(off);
    if (p == nullptr) return locate_error<T>(off);
    T prev = op(p);
    if (old != nullptr) *old = prev;
    return errc::ok;
  }
  template <class F, class Op> errc float_rmw(u64 off, F* old, Op op) {
    static_assert(!SPIN_BPF || sizeof(F) == 0, "the eBPF target has no floating point");
    static_assert(sizeof(F) == 4 || sizeof(F) == 8, "float atomics take float or double");
    using W = typename select_word<sizeof(F)>::type;
    W* p = mem<W>(off);
    if (p == nullptr) return locate_error<W>(off);
    W cur = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    for (;;) {
      F next = op(detail::bit_cast<F>(cur));
      if (__atomic_compare_exchange_n(p, &cur, detail::bit_cast<W>(next), false, __ATOMIC_SEQ_CST,
                                      __ATOMIC_SEQ_CST))
        break;
    }
    if (old != nullptr) *old = detail::bit_cast<F>(cur);
    return errc::ok;
  }
  template <unsigned N> struct select_word;
#if SPIN_BPF
  // The bridge returns a pointer DPDK's validator knows to be bpf_window_bytes long, or null
  // for a range outside the region. The validator cannot track "maybe null", so a handler
  // that dereferences null without checking faults on the unmapped zero page, and the
  // runtime stops it (errc::fault) instead of crashing.
  //
  // The window is the smallest power of two (8 bytes to 4 KiB) that holds the request when its
  // size is a compile-time constant (it folds away), else 4 KiB (docs/architecture.md, "Native
  // and eBPF handlers").
  template <class T> T* bpf_at(region r, u64 off, u64 count) const {
    static_assert(sizeof(T) <= bpf_window_bytes, "type larger than the eBPF window");
    if (count > bpf_window_bytes / sizeof(T)) return nullptr;
    ctx* self = const_cast<ctx*>(this);
    const u64 rr = static_cast<u64>(r), bytes = count * sizeof(T), al = alignof(T);
    void* p;
    if (__builtin_constant_p(bytes) && bytes <= 8) p = spin_bpf_ptr_8(self, rr, off, bytes, al);
    else if (__builtin_constant_p(bytes) && bytes <= 16) p = spin_bpf_ptr_16(self, rr, off, bytes, al);
    else if (__builtin_constant_p(bytes) && bytes <= 32) p = spin_bpf_ptr_32(self, rr, off, bytes, al);
    else if (__builtin_constant_p(bytes) && bytes <= 64) p = spin_bpf_ptr_64(self, rr, off, bytes, al);
    else if (__builtin_constant_p(bytes) && bytes <= 128) p = spin_bpf_ptr_128(self, rr, off, bytes, al);
    else if (__builtin_constant_p(bytes) && bytes <= 256) p = spin_bpf_ptr_256(self, rr, off, bytes, al);
    else if (__builtin_constant_p(bytes) && bytes <= 512) p = spin_bpf_ptr_512(self, rr, off, bytes, al);
    else if (__builtin_constant_p(bytes) && bytes <= 1024) p = spin_bpf_ptr_1024(self, rr, off, bytes, al);
    else if (__builtin_constant_p(bytes) && bytes <= 2048) p = spin_bpf_ptr_2048(self, rr, off, bytes, al);
    else p = spin_bpf_ptr(self, rr, off, bytes, al);
    return static_cast<T*>(p);
  }
  template <class T> errc bpf_atomic(atomic_op op, u64 off, T v, T* old) {
    static_assert(detail::is_atomic_int<T>::value, "atomics take u32, u64, i32 or i64");
    constexpr u64 is_signed = static_cast<T>(-1) < T{} ? 1 : 0;
    const u64 code = static_cast<u64>(op) | (sizeof(T) << 8) | (is_signed << 16);
    u64 prev = 0;
    // Signed values travel sign-extended so that min/max compare them as signed.
    const u64 arg = is_signed ? static_cast<u64>(static_cast<i64>(v)) : static_cast<u64>(v);
    const errc e = static_cast<errc>(spin_bpf_atomic(this, code, off, arg, &prev));
    if (e == errc::ok && old != nullptr) *old = static_cast<T>(prev);
    return e;
  }
#endif
};

template <> struct ctx::select_word<4> { using type = u32; };
template <> struct ctx::select_word<8> { using type = u64; };

/// Signature of every handler: C linkage, takes the context, returns `spin::ret`.
using handler_fn = ret (*)(ctx* c);

} // namespace spin

/// Declares a handler of the given kind. The kind is recorded as the ELF section
/// ".spin.<kind>.<name>" (as libbpf's SEC() marks BPF programs), which is how spinc and the
/// loader find a package's handlers; the symbol itself has C linkage and the name given.
#define SPIN_HANDLER_(kind, name)                                                                  \
  extern "C" __attribute__((section(".spin." #kind "." #name), used)) ::spin::ret name([[maybe_unused]] ::spin::ctx* ctx)

/// Declares the handler memory (per EC) and scratchpad (per message) this file's handlers need,
/// in bytes: `SPIN_MEMORY(sizeof(my_state), 256);` at namespace scope, at most once per file.
/// spinc records both in the package manifest; the loader gives an EC at least that much.
#define SPIN_MEMORY(handler_mem_bytes, scratchpad_bytes)                                           \
  extern "C" __attribute__((section(".spin.meta"), used)) const ::spin::memory_decl spin_memory_decl = { \
      sizeof(::spin::memory_decl), (handler_mem_bytes), (scratchpad_bytes)}

/// Header handler: `SPIN_HEADER_HANDLER(my_hh) { ...; return spin::ret::success; }`
#define SPIN_HEADER_HANDLER(name) SPIN_HANDLER_(header, name)
/// Payload handler: runs once per packet of the message, concurrently with other packets.
#define SPIN_PAYLOAD_HANDLER(name) SPIN_HANDLER_(payload, name)
/// Completion handler: runs once per message after every payload handler returned.
#define SPIN_COMPLETION_HANDLER(name) SPIN_HANDLER_(completion, name)
