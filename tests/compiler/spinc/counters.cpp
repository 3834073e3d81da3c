// spinc test input: integer handlers of all three kinds, SPIN_MEMORY, a helper function and a
// small struct copy. Compiles to both targets.
#include <spin/handler.hpp>

using namespace spin;

struct counters {
  u64 messages;
  u64 packets;
  u64 checksum;
  u64 last_len_bytes;
};

SPIN_MEMORY(sizeof(counters), 64);

namespace {
u64 mix(u64 acc, u64 v) { return (acc ^ v) * 0x100000001b3ull; }
} // namespace

SPIN_HEADER_HANDLER(count_header) {
  ctx->fetch_add<u64>(offsetof(counters, messages), 1);
  return ret::success;
}

SPIN_PAYLOAD_HANDLER(count_payload) {
  const u64* words = ctx->payload<u64>(0, 4);
  if (words == nullptr) return ret::drop;
  u64 h = 0;
  for (u32 i = 0; i < 4; ++i) h = mix(h, words[i]);
  ctx->fetch_add<u64>(offsetof(counters, packets), 1);
  ctx->fetch_add<u64>(offsetof(counters, checksum), h);
  return ret::success;
}

SPIN_COMPLETION_HANDLER(count_completion) {
  counters* c = ctx->mem<counters>(0);
  if (c == nullptr) return ret::drop;
  c->last_len_bytes = ctx->msg.message_len_bytes;
  const counters snapshot = *c;
  ctx->post_event(snapshot.packets + snapshot.messages);
  return ret::success;
}
