// Dispatches through function pointers and member function pointers: the NIC makes direct
// calls only. Calling a lambda directly is a direct call.
#include <spin/handler.hpp>

using namespace spin;

u64 add(u64 a, u64 b) { return a + b; }
u64 max(u64 a, u64 b) { return a > b ? a : b; }

constexpr u64 (*ops[])(u64, u64) = {add, max};

struct combiner {
  u64 state;
  u64 add(u64 v) { return state += v; }
};

u64 apply(u64 (*op)(u64, u64), u64 a, u64 b) {
  return op(a, b); // expected-error {{call through a function pointer is not allowed in a handler: the NIC makes direct calls only; call the function by name, pass a lambda to a template, or switch on a kind}}
}

SPIN_PAYLOAD_HANDLER(fnptr_payload) {
  u64* acc = ctx->mem<u64>(0);
  const u64* v = ctx->payload<u64>(0);
  if (acc == nullptr || v == nullptr) return ret::drop;
  const u64 op = ctx->msg.match_bits & 1;
  *acc = ops[op](*acc, *v); // expected-error {{call through a function pointer is not allowed in a handler}}
  *acc = apply(add, *acc, 1);
  combiner c{*acc};
  u64 (combiner::*method)(u64) = &combiner::add;
  *acc = (c.*method)(2); // expected-error {{call through a member function pointer is not allowed in a handler}}
  auto twice = [](u64 x) { return 2 * x; };
  *acc = twice(*acc);
  u64 (*as_pointer)(u64) = twice;
  *acc = as_pointer(*acc); // expected-error {{call through a function pointer is not allowed in a handler}}
  return ret::success;
}
