// Rewrites its packet in place and sends it back: the first word of every 64-byte block is
// inverted through a 64-byte window, then the first byte through a 4 KiB window (which on eBPF
// reaches past a short payload and so moves the packet to the bounce buffer). The echo and the
// received frame must show both changes on every target.
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(64, 0);

SPIN_PAYLOAD_HANDLER(rewrite_payload) {
  const u64 len = ctx->packet.size();
  for (u32 b = 0; b < 64; ++b) {
    if (u64{b} * 64 + 64 > len) break;
    u64* w = ctx->payload<u64>(u64{b} * 64, 8);
    if (w == nullptr) return ret::drop;
    w[0] = ~w[0];
  }
  u8* all = ctx->payload<u8>(0, len < bpf_window_bytes ? len : bpf_window_bytes);
  if (all == nullptr) return ret::drop;
  all[0] ^= 0x5a;
  return ctx->forward(ctx->msg.source_rank) == errc::ok ? ret::success : ret::drop;
}
