// Rewrites its packet in place and sends it back: the first word of every 64-byte block is
// inverted through a 64-byte window, the first 64 bytes go to the host by DMA, then the first
// byte is changed through a 4 KiB window (which on eBPF
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
  // A DMA from a window inside the payload (on eBPF: a pointer into the received frame).
  const u8* head = ctx->payload<u8>(0, 64);
  if (head == nullptr || ctx->dma_to_host(0, head, 64) != errc::ok) return ret::drop;
  u64* first = ctx->payload<u64>(0);
  u8* all = ctx->payload<u8>(0, len < bpf_window_bytes ? len : bpf_window_bytes);
  if (first == nullptr || all == nullptr) return ret::drop;
  all[0] ^= 0x5a;
  // Both pointers see the same packet: the change through one shows through the other.
  if ((*first & 0xff) != all[0]) return ret::drop;
  all[9] ^= 0x33;
  if (((*first >> 8) & 0xff) != all[1]) return ret::drop;
  return ctx->forward(ctx->msg.source_rank) == errc::ok ? ret::success : ret::drop;
}
