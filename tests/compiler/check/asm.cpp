// Uses inline assembly: the same handler source must compile for every target.
#include <spin/handler.hpp>

using namespace spin;

asm(".globl spin_marker"); // expected-error {{inline assembly is not allowed in a handler: the same source must compile for every target; use the spin API or compiler builtins}}

u64 byte_swap(u64 v) {
  __asm__("bswap %0" : "+r"(v)); // expected-error {{inline assembly is not allowed in a handler}}
  return v;
}

SPIN_PAYLOAD_HANDLER(asm_payload) {
  const u64* v = ctx->payload<u64>(0);
  if (v == nullptr) return ret::drop;
  asm volatile("pause"); // expected-error {{inline assembly is not allowed in a handler}}
  ctx->post_event(byte_swap(*v));
  return ret::success;
}
