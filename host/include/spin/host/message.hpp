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

} // namespace spin::host
