// The control protocol of spin-emu as C++ values: every request and reply, and the one place
// where their JSON is written and read. The client (spin/host/host.hpp) encodes requests and
// decodes replies with it; the server (spin/emu/control.hpp, whose header comment is the
// protocol's reference) decodes requests and encodes replies with it. Neither spells a key.
//
// Wire form (version 1): newline-delimited JSON, one object per line (the line is given and
// returned here without its newline). Requests {"id": <0..2^63-1>, "op": "<name>", ...fields};
// replies {"id": <same>, "ok": true, ...results} or {"id": <same or null>, "ok": false, "error":
// {"code": "<spin::errc name or 'permission'>", "message": "..."}}.
//
// Validation (decode_request): a line is checked completely before anything happens: not UTF-8
// JSON, not an object, an unknown op, an unknown or missing key, a value of the wrong type or
// out of range: invalid_argument with a message naming the field. Semantic checks that need the
// server's state (does node 3 exist, is the path a package) are the server's.
//
// Thread safety: every function is pure and may be called from any thread.
#pragma once

#include <spin/host/groups.hpp>
#include <spin/host/message.hpp>
#include <spin/host/stats.hpp>
#include <spin/rt/package.hpp>
#include <spin/result.hpp>
#include <spin/rt/runtime.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace spin::host::protocol {

/// The version "hello" reports; a client refuses any other.
inline constexpr int version = 1;
/// Longest EC name (bytes).
inline constexpr std::size_t max_name_bytes = 64;
/// Longest package path (bytes).
inline constexpr std::size_t max_path_bytes = 4096;
/// Longest send timeout (ms).
inline constexpr std::uint64_t max_send_timeout_ms = 600'000;
/// Most events one "wait" moves.
inline constexpr std::uint32_t max_wait_events = 256;
/// Largest registered region (bytes).
inline constexpr std::uint64_t max_region_bytes = std::uint64_t{1} << 46;

// ---- requests -------------------------------------------------------------------------------

/// "hello": the server's protocol version and node count.
struct hello {};
/// "nodes": the NICs the server controls.
struct nodes {};
/// "register": `bytes` bytes of the memory file passed with the request (1 descriptor).
struct register_memory {
  std::uint32_t node = 0;
  std::uint64_t bytes = 0;  ///< 1..2^46
};
/// "unregister".
struct unregister_memory {
  std::uint32_t node = 0;
  rt::region_id region = 0;
};
/// "install": an EC from the package file at `package` (an absolute path).
/// The EC is an rt::ec_config without handlers (the package gives them): name 1..max_name_bytes
/// bytes without control characters; handler_mem_bytes and scratchpad_bytes 0 (JSON: absent)
/// for what the package declares; every limit travels (absent fields decode as the defaults);
/// frame_key as JSON "frame_key", 32 hexadecimal digits, absent when all zero.
struct install : rt::ec_config {
  std::uint32_t node = 0;
  std::string package;  ///< 1..max_path_bytes bytes, no control characters
  rt::bpf_exec bpf = rt::bpf_exec::jit;
  bool persist = false;  ///< outlives the connection
};
/// "uninstall".
struct uninstall {
  std::uint32_t node = 0;
  rt::ec_id ec = 0;
};
/// "events": opens the EC's event ring (the reply passes its memory file).
struct open_events {
  std::uint32_t node = 0;
  rt::ec_id ec = 0;
  std::uint32_t capacity = 0;  ///< events, 1..2^24, rounded up to a power of two
};
/// "close_events".
struct close_events {
  std::uint32_t node = 0;
  rt::ec_id ec = 0;
};
/// "send": a message from the node's NIC. One of at most post_inline_bytes is posted
/// (nic_control::post: copied at once, sent when the transmit queue has room, timeout unused);
/// a larger one waits up to `timeout` for room (nic_control::send).
struct send {
  std::uint32_t node = 0;
  message msg;
  std::chrono::milliseconds timeout{0};  ///< 0..max_send_timeout_ms
};
/// "stats": every node's counters.
struct stats {};
/// "stop": the server stops after its reply.
struct stop {};
/// "group_pool": the node's slot pool (its group registry, spin/emu/groups.hpp); with `set`,
/// first resized (only while no group uses it).
struct pool {
  std::uint32_t node = 0;
  std::optional<slot_pool> set;
};
/// "group_join": member `me` of join.members asks to join join.group on the node (asking again
/// polls). The connection owns the join: closing it leaves.
struct join {
  std::uint32_t node = 0;
  group_join group;
  std::uint32_t me = 0;
};
/// "group_decide": the installer's decision.
struct decide {
  std::uint32_t node = 0;
  group_decision decision;
};
/// "group_leave".
struct leave {
  std::uint32_t node = 0;
  std::uint32_t group = 0;
  std::uint32_t me = 0;
  std::uint32_t via = group_join::own_registry;  ///< in-band: the switch's rank (group_join::via)
};


// Virtual time (a spin-emu whose NICs are spin::sim's: hello_reply::virtual_time). A host
// program in another process is an actor of the simulation: its connections attach, its waits
// are requests, and virtual time moves only while every attached program waits in one
// (docs/virtual-time.md, "Host programs in other processes"). A wall-clock spin-emu refuses
// these with not_supported.

/// "attach": this connection's process is a host program driving node `node` in virtual time.
/// Every connection of the process attaches (each names the node it drives); the first that
/// names a host node binds the process to that node's actor.
struct attach {
  std::uint32_t node = 0;
};
/// "wait": nic_control::wait_events on the node, in virtual time: up to `max_events` events of
/// EC `ec`, waiting up to `timeout` (virtual; the server cuts it to 100 days,
/// emu::request_scheduler::max_wait) for the first. The server moves them into the EC's
/// event ring (open_events) before it replies; the reply says how many.
struct wait {
  std::uint32_t node = 0;
  rt::ec_id ec = 0;
  std::uint32_t max_events = 1;  ///< 1..max_wait_events
  std::chrono::nanoseconds timeout{0};  ///< 0..2^63-1 (virtual)
};
/// "sleep": nic_control::sleep_for on the node, in virtual time.
struct sleep {
  std::uint32_t node = 0;
  std::chrono::nanoseconds duration{0};  ///< 0..2^63-1 (virtual)
};
/// "charge": nic_control::charge_host on the node: the host model's time for `bytes` of `op`.
struct charge {
  std::uint32_t node = 0;
  work op = work::copy;  ///< JSON "copy" or "reduce"
  std::uint64_t bytes = 0;
};

/// "barrier": waits in virtual time until the host programs of every node in `members` (the
/// caller's own node among them) have asked for barrier `seq` over the same members; all go on
/// at the virtual time the last one asked (emu::request_scheduler::barrier). For programs that
/// also synchronise outside spin (libspin-mpi: an MPI collective).
struct barrier {
  std::uint32_t node = 0;
  std::vector<std::uint32_t> members;  ///< 1..65535 node indexes
  std::uint64_t seq = 0;
};

// Point-to-point messages in virtual time (emu::request_scheduler::p2p_*): what a host program
// that moves data outside spin (libspin-mpi: MPI_Send and MPI_Recv) tells the simulation about
// each message, so a receive ends at the virtual time its message arrives. The bytes travel
// outside spin; these requests carry only envelopes: source node, 64 match bits, size. Matching
// follows MPI's rules (and Portals 4's posted and unexpected lists): an arriving message
// matches the earliest posted receive that accepts it, else it waits in arrival order for a
// receive; messages from one node to another arrive in the order they were sent.

/// Any source node in p2p_recv and p2p_probe.
inline constexpr std::uint32_t any_source = 0xFFFFFFFF;

/// "p2p_send": node `node`'s program sends a message of `bytes` bytes to host node `dest`.
/// With `id` 0 the send is complete at once (buffered); with a nonzero `id` (unique among the
/// program's pending ids) it completes, for p2p_wait, when a receive has matched it and word
/// of that has come back (a synchronous send).
struct p2p_send {
  std::uint32_t node = 0;
  std::uint32_t dest = 0;
  std::uint64_t match_bits = 0;
  std::uint64_t bytes = 0;  ///< 0..2^63-1
  std::uint64_t id = 0;
};
/// "p2p_recv": posts receive `id` (nonzero, unique among the program's pending ids) for a
/// message from `source` (a host node, or any_source) whose match bits equal `match_bits` in
/// every bit `ignore_bits` does not set. Returns at once; p2p_wait waits for it.
struct p2p_recv {
  std::uint32_t node = 0;
  std::uint64_t id = 0;
  std::uint32_t source = any_source;
  std::uint64_t match_bits = 0;
  std::uint64_t ignore_bits = 0;
};
/// "p2p_wait": waits in virtual time, up to `timeout`, until at least `need` of `ids` (posted
/// receives, synchronous sends) are complete; replies with every one of them complete by then
/// (each is reported once and then forgotten). `timeout` 0 tests without waiting.
struct p2p_wait {
  std::uint32_t node = 0;
  std::vector<std::uint64_t> ids;  ///< 1..65535
  std::uint32_t need = 1;          ///< 1..ids.size()
  std::chrono::nanoseconds timeout{0};
};
/// "p2p_probe": waits in virtual time, up to `timeout`, for a message that has arrived and that
/// no receive has matched yet, from `source` with `match_bits` under `ignore_bits`; replies with
/// the first in arrival order (id 0), or none. The message stays for a receive.
struct p2p_probe {
  std::uint32_t node = 0;
  std::uint32_t source = any_source;
  std::uint64_t match_bits = 0;
  std::uint64_t ignore_bits = 0;
  std::chrono::nanoseconds timeout{0};
};

/// Any request.
using request = std::variant<hello, nodes, register_memory, unregister_memory, install, uninstall, open_events,
                             close_events, send, stats, stop, pool, join, decide, leave, attach, wait, sleep, charge,
                             barrier, p2p_send, p2p_recv, p2p_wait, p2p_probe>;

/// The request's "op" ("hello", "register", ...).
const char* op_name(const request& r) noexcept;
/// File descriptors the request carries (1 for register, else 0).
std::size_t fds_of(const request& r) noexcept;

/// The request line (no newline) with id `id` (at most 2^63-1).
std::string encode_request(std::uint64_t id, const request& r);

/// A decoded request line.
struct decoded_request {
  std::uint64_t id = 0;
  request req;
};
/// Decodes and validates a request line. On error, `id_out` holds the request's id when it had
/// a usable one (for the error reply). Errors: invalid_argument (see the header comment).
result<decoded_request> decode_request(std::string_view line, std::optional<std::uint64_t>& id_out);

// ---- replies --------------------------------------------------------------------------------

/// Reply of "hello".
struct hello_reply {
  int protocol = version;
  std::string server = "spin-emu";
  std::uint32_t nodes = 0;
  bool virtual_time = false;  ///< the NICs are in virtual time (JSON: absent from older servers, false)
};
/// One NIC of "nodes".
struct node_entry {
  std::uint32_t node = 0;
  std::string name;
  std::uint32_t rank = 0;
  std::uint32_t max_payload_bytes = 0;
};
/// Reply of "nodes".
struct nodes_reply {
  std::vector<node_entry> nodes;
};
/// Reply of "register".
struct register_reply {
  rt::region_id region = 0;
};
/// Reply of "install".
struct install_reply {
  rt::ec_id ec = 0;
};
/// Reply of "events" (the ring's memory file travels with it).
struct events_reply {
  std::uint32_t capacity = 0;
  std::uint64_t bytes = 0;  ///< size of the ring's memory file
};
/// Reply of "stats": every node's counters, as a JSON array of {node, name, rank, stats}
/// (host::to_json(const std::vector<node_stats>&)).
struct stats_reply {
  std::vector<node_stats> nodes;
};
/// Reply of an operation that returns nothing but success.
struct done {};
/// Reply of "group_pool".
struct pool_reply {
  pool_usage usage;
};
/// Reply of "group_join".
struct join_reply {
  group_answer answer;
};

/// Reply of "attach", "wait", "sleep", "charge", "barrier", "p2p_send" and "p2p_recv": the virtual time when the request ended.
struct clock_reply {
  std::chrono::nanoseconds now{0};  ///< virtual time since the simulation began
  std::uint32_t events = 0;         ///< "wait": events moved into the ring; else 0
};

/// One completed point-to-point operation (p2p_wait), or a probed message (p2p_probe, id 0).
struct p2p_match {
  std::uint64_t id = 0;
  std::uint32_t source = 0;       ///< the sending node (a synchronous send: its own node)
  std::uint64_t match_bits = 0;   ///< the message's
  std::uint64_t bytes = 0;        ///< the message's size as its sender gave it
  /// A receive: how many receives of this node had matched before it (match order, which is
  /// send order for messages of one source with equal match bits). Otherwise 0.
  std::uint64_t order = 0;
};
/// Reply of "p2p_wait" and "p2p_probe".
struct p2p_reply {
  std::chrono::nanoseconds now{0};  ///< virtual time since the simulation began
  std::vector<p2p_match> done;
};

/// Any successful reply.
using reply = std::variant<done, hello_reply, nodes_reply, register_reply, install_reply, events_reply, stats_reply,
                           pool_reply, join_reply, clock_reply, p2p_reply>;

/// The success reply line for request id `id`.
std::string encode_reply(std::uint64_t id, const reply& r);
/// The error reply line; `id` empty when the request had no usable id. `code` is an errc name
/// or "permission".
std::string encode_error(std::optional<std::uint64_t> id, std::string_view code, std::string_view message);
/// The error reply line for `e`.
std::string encode_error(std::optional<std::uint64_t> id, const error& e);

/// A decoded reply line of the request with id `expected_id`, whose success reply is of type R
/// (done, hello_reply, ...). Errors: the server's error (its errc; "permission" becomes
/// not_supported, an unknown code bad_state), bad_state (not a protocol object, a malformed
/// result); `other_id` is set when the line answers another request (the connection is then
/// out of step).
template <class R> result<R> decode_reply(std::string_view line, std::uint64_t expected_id, bool& other_id);

/// The errc with name `name` ("permission": not_supported; unknown: bad_state).
errc errc_from_name(std::string_view name) noexcept;

} // namespace spin::host::protocol
