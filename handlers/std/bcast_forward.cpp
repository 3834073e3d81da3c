// Broadcast forwarder: a pipelined chain broadcast (Khalilov et al., SC24, section 3). Each
// packet is DMAed to its place in host memory and sent on to the next rank as it arrives, so a
// large message crosses every link once and the chain is bandwidth-optimal. A packet is
// forwarded as the same message (same id): every rank of the chain handles only the root's
// messages in this EC, so ids cannot collide. spin::coll's broadcast adds reliability on top of
// the same pipeline (docs/collectives.md).
#include <spin/handler.hpp>

#include <spin/std/bcast_forward.hpp>

using namespace spin;
using spin::stdh::bcast_state;

SPIN_MEMORY(sizeof(bcast_state), 0);

SPIN_PAYLOAD_HANDLER(bcast_payload) {
  const bcast_state* s = ctx->mem<bcast_state>(0);
  // The payload's first byte is all the handler needs: the DMA checks the whole range itself, and
  // on eBPF a window holds at most 4 KiB while a packet may carry up to 9 KiB.
  const u64 len = ctx->packet.size();
  const u8* data = ctx->payload<u8>(0, len == 0 ? 0 : 1);
  if (s == nullptr || (data == nullptr && len > 0)) return ret::drop;
  if (ctx->dma_to_host(ctx->msg.offset_bytes, data, len) != errc::ok) {
    ctx->fetch_add<u64>(offsetof(bcast_state, dma_failed), 1);
    return ret::drop;
  }
  ctx->fetch_add<u64>(offsetof(bcast_state, packets), 1);
  if (s->has_next != 0 && ctx->forward(s->next_rank) != errc::ok) ctx->fetch_add<u64>(offsetof(bcast_state, forward_failed), 1);
  return ret::success;
}

SPIN_COMPLETION_HANDLER(bcast_completion) {
  ctx->fetch_add<u64>(offsetof(bcast_state, messages), 1);
  ctx->post_event(ctx->msg.message_id);
  return ret::success;
}
