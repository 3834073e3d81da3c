// A message the host asks a NIC to send: the one description of a host send, used by the host
// client, the control protocol and the emulator's nic_control.
#pragma once

#include <spin/rt/runtime.hpp>

#include <cstddef>
#include <cstdint>

namespace spin::host {

/// `len_bytes` bytes of registered host region `region` from `offset_bytes`, cut into packets
/// of at most the port's payload size, to rank `dest_rank` with `match_bits` and `message_id`
/// (wire format v1, docs/wire-format.md).
struct message {
  std::uint32_t dest_rank = 0;
  std::uint64_t match_bits = 0;
  std::uint64_t message_id = 0;
  rt::region_id region = 0;
  std::uint64_t offset_bytes = 0;
  std::uint64_t len_bytes = 0;
};

/// Messages up to this size (bytes) a NIC copies when it queues them (nic_control::post: an
/// RDMA NIC's inline send), so their buffer may be reused at once.
inline constexpr std::size_t post_inline_bytes = 256;

/// A host program's own work on data, which a NIC in virtual time charges to the program's
/// clock (emu::nic_control::charge_host).
enum class work : std::uint8_t {
  copy,    ///< bytes copied (into or out of staging buffers)
  reduce,  ///< bytes of a vector reduced into another (a ring's fold)
};

/// The spin header of one packet of host message `m` as the NIC of rank `source_rank` sends
/// it: packet `seq`, `len` payload bytes at byte `offset` of the message; a `control` packet
/// carries a management datagram (emu::nic_control::send_mgmt). Every NIC model (spin-emu's,
/// spin::sim's) cuts host messages into packets with it.
inline rt::wire::header packet_header(const message& m, std::uint32_t source_rank, std::uint64_t seq, std::uint64_t offset,
                                      std::uint32_t len, bool control = false) {
  rt::wire::header h;
  h.type = control ? rt::wire::packet_type::control : rt::wire::packet_type::data;
  h.source_rank = source_rank;
  h.match_bits = m.match_bits;
  h.message_id = m.message_id;
  h.seq = seq;
  h.message_len = m.len_bytes;
  h.offset = offset;
  h.flags = static_cast<std::uint16_t>((seq == 0 ? rt::wire::flag_start : 0) | (offset + len == m.len_bytes ? rt::wire::flag_end : 0));
  return h;
}

} // namespace spin::host
