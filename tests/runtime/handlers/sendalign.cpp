// Calls into the runtime from a JIT-compiled handler whose stack frame leaves the stack 8 bytes
// off 16-byte alignment at each call (rte_bpf's JIT does not realign): the bridge must not
// fault. Sends with bad descriptors come back as errors, reported as events. eBPF only: it
// calls the bridge directly, as hostile code would.
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(4096, 64);

SPIN_PAYLOAD_HANDLER(sendalign_payload) {
  u64* m = ctx->mem<u64>(0, 8);
  if (m == nullptr) return ret::drop;
  u64 old = 0;
  ctx->post_event(spin_bpf_atomic(ctx, 0, 0, 1, &old));
  send_desc d{};
  d.size_bytes = sizeof d;
  d.dest_rank = 1;
  d.message_len_bytes = 64;
  d.len_bytes = 64;
  d.flags = msg_start | msg_end;
  d.data = ctx->api;
  ctx->post_event(spin_bpf_send(ctx, &d));
  d.data = reinterpret_cast<const u8*>(m) + 4096;
  ctx->post_event(spin_bpf_send(ctx, &d));
  d.data = m;
  d.size_bytes = 0xffffffff;
  ctx->post_event(spin_bpf_send(ctx, &d));
  d.size_bytes = 4;
  ctx->post_event(spin_bpf_send(ctx, &d));
  m[7] = 0x600d;
  return ret::success;
}
