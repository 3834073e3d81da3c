// Histogram of int32 values: every packet's values are counted into shared bins in handler
// memory with atomic adds, so payload handlers of every message run at once; after the expected
// number of messages the bins go to the host in one DMA.
#include <spin/handler.hpp>

#include <spin/std/histogram.hpp>

using namespace spin;
using spin::stdh::histogram_result;
using spin::stdh::histogram_state;

SPIN_MEMORY(sizeof(histogram_state), 0);

SPIN_PAYLOAD_HANDLER(histogram_payload) {
  histogram_state* s = ctx->mem<histogram_state>(0);
  if (s == nullptr) return ret::drop;
  const u64 n = ctx->packet.size() / sizeof(i32);
  const i32* v = ctx->payload<i32>(0, n);
  if (s->bin_width == 0 || s->bins == 0 || s->bins > stdh::histogram_max_bins || ctx->packet.size() % sizeof(i32) != 0 ||
      (v == nullptr && n > 0)) {
    ctx->fetch_add<u64>(offsetof(histogram_state, rejected), 1);
    return ret::drop;
  }
  const i64 lo = s->lo;
  const u64 width = s->bin_width, bins = s->bins;
  u64 under = 0, over = 0;
  for (u64 i = 0; i < n; ++i) {
    const i64 x = v[i];
    if (x < lo) {
      ++under;
      continue;
    }
    const u64 bin = spin::div(static_cast<u64>(x - lo), width);
    if (bin >= bins) {
      ++over;
      continue;
    }
    __atomic_fetch_add(&s->counts[bin], 1, __ATOMIC_RELAXED);
  }
  if (under != 0) ctx->fetch_add<u64>(offsetof(histogram_state, underflow), under);
  if (over != 0) ctx->fetch_add<u64>(offsetof(histogram_state, overflow), over);
  return ret::success;
}

SPIN_COMPLETION_HANDLER(histogram_completion) {
  histogram_state* s = ctx->mem<histogram_state>(0);
  if (s == nullptr) return ret::drop;
  u64 done = 0;
  ctx->fetch_add<u64>(offsetof(histogram_state, messages), 1, &done);
  ++done;
  if (done != s->expected_messages) return ret::success;
  // Every payload handler of every expected message has returned: the counts are final.
  if (ctx->dma_to_host(offsetof(histogram_result, underflow), &s->underflow, 2 * sizeof(u64)) != errc::ok ||
      ctx->dma_to_host(offsetof(histogram_result, counts), s->counts, s->bins * sizeof(u64)) != errc::ok)
    return ret::drop;
  ctx->post_event(done);
  return ret::success;
}
