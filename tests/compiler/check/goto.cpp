// Leaves nested loops with goto and dispatches with a computed goto: handlers use structured
// control flow.
#include <spin/handler.hpp>

using namespace spin;

SPIN_PAYLOAD_HANDLER(goto_payload) {
  const u8* bytes = ctx->payload<u8>(0, ctx->packet.size());
  if (bytes == nullptr) return ret::drop;
  u64 found = 0;
  void* next = &&unique;
  for (u64 i = 0; i < ctx->packet.size(); ++i) {
    for (u64 j = i + 1; j < ctx->packet.size(); ++j) {
      if (bytes[i] == bytes[j]) {
        found = i;
        goto done; // expected-error {{'goto' is not allowed in a handler: use structured control flow (break, continue, return, a switch or a flag)}}
      }
    }
  }
done:
  if (found != 0) next = &&dup;
  goto *next; // expected-error {{computed 'goto' is not allowed in a handler}}
dup:
  ctx->post_event(found);
unique:
  return ret::success;
}
