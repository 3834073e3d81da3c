// Multicasts its packet to the three ranks at handler memory [0..12) (u32) as messages
// 1000 + 16 * m .. + 2 (m: its own message id) and stores the copies sent at [16]. Built for
// both targets: the eBPF bridge's multicast must send what the native call sends.
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(64, 0);

SPIN_PAYLOAD_HANDLER(mcast_payload) {
  const u64 len = ctx->packet.size();
  const u32* dests = ctx->mem<u32>(0, 4);
  const u8* data = ctx->payload<u8>(0, len < bpf_window_bytes ? len : bpf_window_bytes);
  u64* out = ctx->mem<u64>(16);
  if (dests == nullptr || data == nullptr || out == nullptr || len > bpf_window_bytes) return ret::drop;
  send_desc d{};
  d.size_bytes = sizeof d;
  d.match_bits = ctx->msg.match_bits;
  d.message_id = 1000 + 16 * ctx->msg.message_id;
  d.message_len_bytes = len;
  d.data = data;
  d.len_bytes = static_cast<u32>(len);
  d.flags = msg_start | msg_end;
  const i32 sent = ctx->multicast(d, dests, 3);
  *out = static_cast<u64>(static_cast<i64>(sent));
  return sent == 3 ? ret::success : ret::drop;
}
