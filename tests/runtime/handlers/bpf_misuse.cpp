// eBPF handlers that misbehave, for the loader and engine tests. Each is its own handler file
// set: the test builds this file for both targets and installs one handler at a time.
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(4096, 64);

// Uses a pointer without checking it: the range lies outside handler memory, so the pointer is
// null; native and eBPF handlers both fault and are stopped.
SPIN_PAYLOAD_HANDLER(null_use) {
  u64* p = ctx->mem<u64>(1u << 20);
  *p = 7;
  return ret::success;
}

// Scribbles over its context (eBPF sees a copy) and then asks for memory the real handler
// memory does not have: it must get null, whatever the copy says.
SPIN_HEADER_HANDLER(ctx_scribble) {
  ctx->handler_mem.len_bytes = ~0ull;
  ctx->handler_mem.data = nullptr;
  u64* p = ctx->mem<u64>(8192);
  if (p != nullptr) {
    *p = 1;
    return ret::success;
  }
  u64* ok = ctx->mem<u64>(0);
  if (ok == nullptr) return ret::drop;
  *ok = 42;
  return ret::drop;
}

// Completion handler that counts messages with an atomic and reports through an event.
SPIN_COMPLETION_HANDLER(count_done) {
  u64 before = 0;
  ctx->fetch_add<u64>(8, 1, &before);
  i32 low = 0;
  ctx->fetch_min<i32>(16, -static_cast<i32>(before) - 1);
  ctx->load<i32>(16, &low);
  u64 expected = 100;
  ctx->compare_exchange<u64>(24, &expected, before + 1000);
  ctx->post_event(static_cast<u64>(static_cast<i64>(low)));
  return ret::success;
}
