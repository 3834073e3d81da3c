// spinc test input: a 4 KiB struct copy, which the BPF backend can only do with a memcpy call
// that BPF cannot make: clang fails and spinc shows its message with a hint.
#include <spin/handler.hpp>

using namespace spin;

struct page {
  u64 words[512];
};

SPIN_PAYLOAD_HANDLER(copy_page) {
  page* from = ctx->mem<page>(0);
  page* to = ctx->scratchpad<page>(0);
  if (from == nullptr || to == nullptr) return ret::drop;
  *to = *from;
  return ret::success;
}
