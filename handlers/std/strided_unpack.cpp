// Strided-vector unpack (sPIN, SC17, section 5.2: datatypes): the sender packs a vector of
// `blocks` blocks; the NIC scatters each packet's bytes straight to their places in host memory,
// so the host never copies. Payload handlers run in any order: each piece's place follows from
// its message offset alone.
#include <spin/handler.hpp>

#include <spin/std/strided_unpack.hpp>

using namespace spin;
using spin::stdh::strided_state;

SPIN_MEMORY(sizeof(strided_state), 0);

SPIN_HEADER_HANDLER(strided_header) {
  const strided_state* s = ctx->mem<strided_state>(0);
  if (s == nullptr) return ret::drop;
  const u64 block = s->block_bytes, stride = s->stride_bytes, blocks = s->blocks;
  // The layout must be sane and the message exactly one vector (no overflow in blocks * block).
  if (block == 0 || stride < block || blocks == 0 || blocks > spin::div(~0ull, block) ||
      ctx->msg.message_len_bytes != blocks * block) {
    ctx->fetch_add<u64>(offsetof(strided_state, rejected), 1);
    return ret::drop;
  }
  return ret::success;
}

SPIN_PAYLOAD_HANDLER(strided_payload) {
  const strided_state* s = ctx->mem<strided_state>(0);
  const u8* data = ctx->payload<u8>(0, ctx->packet.size());
  if (s == nullptr || (data == nullptr && ctx->packet.size() > 0)) return ret::drop;
  const u64 block = s->block_bytes, stride = s->stride_bytes;
  u64 off = ctx->msg.offset_bytes, pos = 0;
  const u64 len = ctx->packet.size();
  while (pos < len) {
    const u64 b = spin::div(off, block), within = spin::rem(off, block);
    const u64 room = block - within, take = room < len - pos ? room : len - pos;
    if (ctx->dma_to_host(b * stride + within, data + pos, take) != errc::ok) {
      ctx->fetch_add<u64>(offsetof(strided_state, dma_failed), 1);
      return ret::drop;
    }
    pos += take;
    off += take;
  }
  return ret::success;
}

SPIN_COMPLETION_HANDLER(strided_completion) {
  ctx->fetch_add<u64>(offsetof(strided_state, messages), 1);
  ctx->post_event(ctx->msg.message_id);
  return ret::success;
}
