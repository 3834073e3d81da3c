// expected-no-diagnostics
// The spin API (atomics, locks, DMA, sending, events) is part of the handler API and fine to
// call, including the float atomics on the native target.
#include <spin/handler.hpp>

using namespace spin;

SPIN_PAYLOAD_HANDLER(atomics_payload) {
  u64 old = 0;
  if (ctx->fetch_add<u64>(0, 1, &old) != errc::ok) return ret::drop;
  ctx->fetch_min<i64>(8, -5);
  ctx->fetch_max<u32>(16, 7);
  ctx->exchange<u32>(20, 1);
  u64 expected = old + 1;
  ctx->compare_exchange<u64>(0, &expected, old + 2);
  u32 loaded = 0;
  ctx->load<u32>(16, &loaded);
  ctx->store<u32>(16, loaded + 1);
  ctx->float_add<float>(24, 0.5f);
  ctx->float_max<double>(32, 1.0);
  if (ctx->lock(64) == errc::ok) {
    ctx->unlock(64);
  }
  dma_handle h{};
  if (ctx->dma_to_host_nb(0, ctx->packet.data, ctx->packet.size(), h) == errc::ok) ctx->dma_wait(h);
  ctx->put(1, 0x5eed, 7, 0, ctx->packet.data, static_cast<u32>(ctx->packet.size()));
  ctx->forward(2);
  ctx->post_event(div(old, u64{3}) + rem(old, u64{0}) + shl(old, 65));
  return ret::success;
}
