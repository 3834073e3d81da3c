// What test handlers that send the packet they run on (echo, multicast) share.
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

/// Ping-pong: sends the packet back to its sender as message id + 1000, with match bits +
/// `match_delta` (1: the answer goes to the next EC). success, or drop when the send fails.
inline ret echo(ctx* c, u64 match_delta = 0) {
  send_desc d = this_packet(c);
  d.dest_rank = c->msg.source_rank;
  d.match_bits += match_delta;
  d.message_id += 1000;
  return c->send(d) == errc::ok ? ret::success : ret::drop;
}

} // namespace spin::test
