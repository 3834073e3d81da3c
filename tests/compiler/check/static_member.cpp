// Keeps a counter in a static data member: handlers keep their state in handler memory.
// Constant static members are fine.
#include <spin/handler.hpp>

using namespace spin;

struct flow_table {
  static u32 flows; // expected-error {{mutable static data member 'flows' is not allowed in a handler: handlers run concurrently on several cores and keep no state of their own; keep state in handler memory (ctx->mem<T>(off)), or make it const or constexpr}}
  static inline u64 lookups = 0; // expected-error {{mutable static data member 'lookups' is not allowed in a handler}}
  static constexpr u32 capacity = 1024;
  static const u32 buckets = 64;
};

u32 flow_table::flows = 0;

SPIN_HEADER_HANDLER(static_member_header) {
  ++flow_table::lookups;
  if (flow_table::flows >= flow_table::capacity) return ret::drop;
  ++flow_table::flows;
  ctx->post_event(ctx->msg.message_id % flow_table::buckets);
  return ret::success;
}
