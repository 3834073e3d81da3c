// Test handlers that send the packet they run on (echo, multicast) start from this descriptor.
#pragma once

#include <spin/handler.hpp>

namespace spin::test {

/// A send descriptor for the packet the handler runs on, as it arrived: its match bits, message
/// id, offset and message length, its payload, its start/end flags and packet index. The
/// destination is rank 0 until the caller sets `dest_rank`.
inline send_desc this_packet(const ctx* c) {
  send_desc d{};
  d.size_bytes = sizeof d;
  d.match_bits = c->msg.match_bits;
  d.message_id = c->msg.message_id;
  d.offset_bytes = c->msg.offset_bytes;
  d.message_len_bytes = c->msg.message_len_bytes;
  d.data = c->packet.data;
  d.len_bytes = static_cast<u32>(c->packet.size());
  d.flags = c->msg.flags & (msg_start | msg_end);
  d.packet_index = c->msg.packet_index;
  return d;
}

} // namespace spin::test
