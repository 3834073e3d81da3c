// An eBPF handler that reads past the window a pointer comes with: DPDK's validator must
// reject it at load time (native builds of it are not made).
#include <spin/handler.hpp>

using namespace spin;

SPIN_PAYLOAD_HANDLER(past_window) {
  const u8* p = ctx->payload<u8>(0, 8);
  if (p == nullptr) return ret::drop;
  return p[bpf_window_bytes + 8] ? ret::success : ret::drop;
}
