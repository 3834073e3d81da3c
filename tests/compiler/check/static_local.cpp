// Counts packets in static locals: handlers run concurrently on several cores and keep their
// state in handler memory. Static constants are fine.
#include <spin/handler.hpp>

using namespace spin;

u32 next_sequence() {
  static u32 sequence = 0; // expected-error {{mutable static local variable 'sequence' is not allowed in a handler: handlers run concurrently on several cores and keep no state of their own; keep state in handler memory (ctx->mem<T>(off)), or make it const or constexpr}}
  return ++sequence;
}

SPIN_PAYLOAD_HANDLER(static_local_payload) {
  static u64 packets = 0; // expected-error {{mutable static local variable 'packets' is not allowed in a handler}}
  static const u8 shifts[] = {0, 8, 16, 24};
  static constexpr u32 mask = 0xff;
  ++packets;
  ctx->post_event((next_sequence() & mask) << shifts[packets % 4]);
  return ret::success;
}
