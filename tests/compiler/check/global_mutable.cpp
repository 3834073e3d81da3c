// Keeps state in mutable globals: handlers run concurrently on several cores and keep their
// state in handler memory. Constants are fine, if no code has to run to build them.
#include <spin/handler.hpp>

using namespace spin;

u64 packets_seen; // expected-error {{mutable namespace-scope variable 'packets_seen' is not allowed in a handler: handlers run concurrently on several cores and keep no state of their own; keep state in handler memory (ctx->mem<T>(off)), or make it const or constexpr}}
static u32 last_rank = 0; // expected-error {{mutable namespace-scope variable 'last_rank' is not allowed in a handler}}
namespace {
u64 bytes_seen[4]; // expected-error {{mutable namespace-scope variable 'bytes_seen' is not allowed in a handler}}
}
const char* mode_name = "sum"; // expected-error {{mutable namespace-scope variable 'mode_name' is not allowed in a handler}}
constinit u32 generation = 1; // expected-error {{mutable namespace-scope variable 'generation' is not allowed in a handler}}
extern u64 host_counter; // expected-note {{'host_counter' declared here}}

u32 seed() { return 42; }
const u32 initial_seed = seed(); // expected-error {{variable 'initial_seed' needs dynamic initialization or destruction, which no NIC target runs: give it a constant initializer (constexpr) and a trivial destructor}}

// Fine: constants with constant initializers.
constexpr u32 ranks = 8;
const u64 window_bytes = 4096;
const char* const reduce_name = "sum";
constexpr u16 weights[] = {1, 2, 4, 8};

SPIN_PAYLOAD_HANDLER(global_payload) {
  packets_seen += 1;
  last_rank = ctx->msg.source_rank;
  bytes_seen[ctx->msg.source_rank % 4] += ctx->packet.size() + host_counter; // expected-error {{use of 'host_counter', which is not defined in this file: a handler has no other data}}
  ctx->post_event(ranks + window_bytes + weights[generation % 4] + initial_seed + reduce_name[0] + mode_name[0]);
  return ret::success;
}
