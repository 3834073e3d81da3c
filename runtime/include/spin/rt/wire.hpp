// Wire format v1: Ethernet / IPv4 / UDP (one configurable port) / spin header.
// The normative description is docs/wire-format.md; this header is its only implementation.
#pragma once

#include <spin/handler.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace spin::rt::wire {

inline constexpr std::uint8_t version = 1;
inline constexpr std::uint16_t default_udp_port = 17771;
inline constexpr std::size_t eth_len = 14;
inline constexpr std::size_t ipv4_min_len = 20;
inline constexpr std::size_t udp_len = 8;
/// Spin header without extension (bytes). Chosen so that the payload starts 8-byte aligned
/// relative to the frame (14+20+8+46 = 88; the extension adds 16): handlers can read typed
/// payload in place when the frame buffer is 8-byte aligned, as mbufs are.
inline constexpr std::size_t spin_base_len = 46;
inline constexpr std::size_t spin_coll_len = 16;  ///< collective extension (bytes)
inline constexpr std::size_t spin_auth_len = 8;   ///< authentication tag (bytes)
/// Bytes before the payload of a data packet without IP options or extension: 88.
inline constexpr std::size_t min_overhead = eth_len + ipv4_min_len + udp_len + spin_base_len;
static_assert(min_overhead % 8 == 0 && spin_coll_len % 8 == 0 && spin_auth_len % 8 == 0);
/// Bytes before the payload of the largest spin header this runtime sends (collective extension
/// and authentication tag): a port's frames must hold this much more than the payload.
inline constexpr std::size_t max_overhead = min_overhead + spin_coll_len + spin_auth_len;

/// Packet types (byte 1 of the spin header).
enum class packet_type : std::uint8_t { data = 1, ack = 2, nack = 3, result = 4, control = 5 };

/// Flags (bytes 2-3 of the spin header). The first four are the handler API's message flags
/// (spin::message_flags, what `message_desc::flags` and `send_desc::flags` carry), bit for bit:
/// the runtime passes them between wire and handlers by masking (message_flags_of, wire_flags_of).
enum flag : std::uint16_t {
  flag_start = msg_start,            ///< first packet of the message (seq 0)
  flag_end = msg_end,                ///< last packet of the message
  flag_retransmit = msg_retransmit,  ///< retransmission of an earlier packet
  flag_coll = msg_coll,              ///< the 16-byte collective extension follows the base header
  flag_auth = 1u << 4,               ///< the 8-byte authentication tag follows the header and its extension
};
inline constexpr std::uint16_t known_flags = flag_start | flag_end | flag_retransmit | flag_coll | flag_auth;
/// The position flags of packet `seq` of a message of `count` packets: flag_start on the first,
/// flag_end on the last (both on a one-packet message).
constexpr std::uint16_t position_flags(std::uint64_t seq, std::uint64_t count) {
  return static_cast<std::uint16_t>((seq == 0 ? flag_start : 0) | (seq + 1 == count ? flag_end : 0));
}
/// The wire flags that are message flags of the handler API.
inline constexpr std::uint16_t message_flag_mask = flag_start | flag_end | flag_retransmit | flag_coll;
/// A header's flags as a handler sees them (message_desc::flags).
constexpr std::uint32_t message_flags_of(std::uint16_t wire_flags) { return wire_flags & message_flag_mask; }
/// A handler's message flags (send_desc::flags) as wire flags; bits that are not message flags
/// are dropped.
constexpr std::uint16_t wire_flags_of(std::uint32_t msg_flags) { return static_cast<std::uint16_t>(msg_flags & message_flag_mask); }

/// Collective extension (present when `flag_coll` is set).
struct coll_ext {
  std::uint8_t op = 0;        ///< reduction operation id
  std::uint8_t dtype = 0;     ///< datatype id
  std::uint16_t slot = 0;     ///< aggregator slot index (bit 15: shadow copy)
  std::uint32_t elem_count = 0; ///< elements in this packet
  std::uint32_t epoch = 0;    ///< collective epoch / round
  std::uint32_t aux = 0;       ///< protocol-specific (docs/collectives.md)
  bool operator==(const coll_ext&) const = default;
};

/// The spin header in host byte order.
struct header {
  std::uint8_t version = wire::version;
  packet_type type = packet_type::data;
  std::uint16_t flags = 0;
  std::uint32_t source_rank = 0;
  std::uint64_t match_bits = 0;
  std::uint64_t message_id = 0;
  std::uint32_t seq = 0;            ///< packet index in the message
  std::uint32_t payload_len = 0;    ///< payload bytes in this packet (16 bits on the wire)
  std::uint64_t message_len = 0;    ///< payload bytes of the whole message
  std::uint64_t offset = 0;         ///< byte offset of this payload in the message
  coll_ext coll{};                  ///< valid when flags & flag_coll
  std::uint64_t auth_tag = 0;       ///< valid when flags & flag_auth (auth_tag())
  bool operator==(const header&) const = default;
};

/// The key of authenticated frames (an EC's frame key, rt::ec_config::frame_key): SipHash-2-4's
/// 128-bit key, bytes 0..7 and 8..15 little-endian. All zero: none.
struct auth_key {
  std::uint64_t k0 = 0, k1 = 0;
  bool none() const { return k0 == 0 && k1 == 0; }
  static auth_key from_bytes(const std::array<std::uint8_t, 16>& b);
};

/// The authentication tag of a frame with header `h` and payload `payload`
/// (docs/wire-format.md, "Authentication tag"): SipHash-2-4 under `k` of the spin header as on
/// the wire with `flag_auth` set and `message_id` zero, the collective extension (16 zero bytes
/// without `flag_coll`), two zero bytes, then the payload. `h.payload_len` is taken from
/// `payload`. Not covered: addresses, ports and message_id, so that every copy of a multicast
/// carries one tag. Thread-safe.
std::uint64_t auth_tag(const auth_key& k, const header& h, std::span<const std::byte> payload) noexcept;

/// Why a frame was rejected. Every rejected frame is counted under exactly one reason.
enum class reject : std::uint8_t {
  eth_truncated,    ///< shorter than an Ethernet header
  not_ipv4,         ///< EtherType is not IPv4
  ip_truncated,     ///< frame ends inside the IPv4 header, or IHL < 5
  ip_version,       ///< IP version field is not 4
  ip_length,        ///< IPv4 total length smaller than its header or larger than the frame
  ip_checksum,      ///< IPv4 header checksum is wrong
  ip_fragment,      ///< fragmented datagram (MF set or fragment offset non-zero)
  not_udp,          ///< IP protocol is not UDP
  udp_truncated,    ///< IP payload shorter than a UDP header
  udp_length,       ///< UDP length smaller than 8 or larger than the IP payload
  wrong_port,       ///< UDP destination port is not the spin port
  spin_truncated,   ///< UDP payload shorter than the spin header (with its extension)
  bad_version,      ///< spin version is not 1
  bad_type,         ///< unknown packet type
  bad_flags,        ///< unknown flag bits, or start flag on a packet with seq != 0
  length_mismatch,  ///< payload_len disagrees with the UDP length
  bad_offset,       ///< offset + payload_len exceeds message_len (or flag_end and they fall short)
  count_            ///< number of reasons
};
inline constexpr std::size_t reject_count = static_cast<std::size_t>(reject::count_);

/// Static name of a reason ("ip_checksum", ...).
const char* reject_name(reject r);

/// One piece of a frame that may be split over several buffers (mbuf segments).
struct segment {
  const std::byte* data;
  std::uint32_t len;
};

/// What parsing a frame found.
struct parsed {
  header hdr;
  std::uint32_t spin_offset = 0;     ///< byte offset of the spin header in the whole frame
  std::uint32_t payload_offset = 0;  ///< byte offset of the payload in the whole frame
  std::uint32_t frame_len = 0;       ///< bytes of the frame (sum of segments)
};

/// Counters of rejected frames, one per reason. Relaxed atomics: any thread may read them.
struct parser_stats {
  std::array<std::atomic<std::uint64_t>, reject_count> rejected{};
  std::atomic<std::uint64_t> accepted{0};
  std::uint64_t total_rejected() const;
};

/// Parses a frame split over `segs`. Never reads outside the segments. On success fills `out`
/// and returns true; otherwise stores the reason in `why` and returns false. `udp_port` is the
/// spin destination port. Thread-safe (no shared state).
bool parse(std::span<const segment> segs, std::uint16_t udp_port, parsed& out, reject& why) noexcept;

/// Contiguous-frame convenience form of `parse`.
inline bool parse(std::span<const std::byte> frame, std::uint16_t udp_port, parsed& out, reject& why) noexcept {
  const segment s{frame.data(), static_cast<std::uint32_t>(frame.size())};
  return parse(std::span<const segment>(&s, 1), udp_port, out, why);
}

/// Decodes the spin header at `spin` (spin_base_len bytes, plus spin_coll_len and spin_auth_len
/// when its flags say so) without validating it: for frames `parse` already accepted.
void decode_spin(const std::byte* spin, header& h) noexcept;

/// Addresses of one endpoint on the wire.
struct endpoint {
  std::array<std::uint8_t, 6> mac{};
  std::uint32_t ipv4 = 0;  ///< host byte order
  std::uint16_t udp_port = default_udp_port;
};

/// The default address of rank r in emulated networks: MAC 02:53:50:00:hi:lo, IPv4 10.83.hi.lo.
endpoint rank_endpoint(std::uint32_t rank, std::uint16_t udp_port = default_udp_port);

/// Bytes `encode` writes for a header `h` with `payload_len` payload bytes.
std::size_t encoded_len(const header& h, std::size_t payload_len);

/// Writes a complete frame (Ethernet, IPv4 with checksum, UDP without checksum, spin header,
/// its extension and tag as `h.flags` say, payload) into `out`; the tag written is
/// `h.auth_tag` as given (auth_tag() computes it). `h.payload_len` is set from `payload`. Returns the frame length, or 0
/// when `out` is too small or the frame would exceed 65535 bytes of IP datagram.
std::size_t encode(const endpoint& src, const endpoint& dst, header h, std::span<const std::byte> payload,
                   std::span<std::byte> out) noexcept;

/// Writes the headers of the frame `encode` would write for a payload of `payload_len` bytes
/// (lengths and checksum included), without the payload: for a frame whose payload lies in
/// another buffer (a header mbuf chained in front of a shared payload). Returns the header
/// bytes (encoded_len(h, payload_len) - payload_len), or 0 when `out` is too small or the
/// frame would exceed 65535 bytes of IP datagram.
std::size_t encode_headers(const endpoint& src, const endpoint& dst, header h, std::size_t payload_len,
                           std::span<std::byte> out) noexcept;

} // namespace spin::rt::wire
