// spinc test input: a handler whose frame holds STACK_WORDS u64 (1600 bytes by default, over
// the native limit of 1024; -DSTACK_WORDS=40 gives 320 bytes for the eBPF tests).
#include <spin/handler.hpp>

using namespace spin;

#ifndef STACK_WORDS
#define STACK_WORDS 200
#endif

SPIN_PAYLOAD_HANDLER(deep_frame) {
  u64 buf[STACK_WORDS];
  if (ctx->dma_from_host(buf, 0, sizeof buf) != errc::ok) return ret::drop;
  buf[0] += 1;
  ctx->dma_to_host(0, buf, sizeof buf);
  return ret::success;
}
