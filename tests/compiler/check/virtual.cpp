// Dispatches on the operation through virtual functions: the NIC has no virtual dispatch.
#include <spin/handler.hpp>

using namespace spin;

struct reducer {
  virtual u64 combine(u64 a, u64 b) const = 0; // expected-error {{virtual function 'combine' is not allowed in a handler: the NIC has no virtual dispatch; use a template, or switch on an explicit kind field}}
};

struct sum_reducer : reducer {
  u64 combine(u64 a, u64 b) const override { return a + b; } // expected-error {{virtual function 'combine' is not allowed in a handler}}
};

struct max_reducer final : reducer {
  u64 combine(u64 a, u64 b) const override { return a > b ? a : b; } // expected-error {{virtual function 'combine' is not allowed in a handler}}
};

struct shared_state {
  u64 total;
};
struct counted_state : virtual shared_state { // expected-error {{virtual base class 'shared_state' is not allowed in a handler: the NIC has no virtual dispatch; use a non-virtual base}}
  u64 count;
};

SPIN_PAYLOAD_HANDLER(virtual_reduce) {
  const reducer* r = ctx->mem<reducer>(0);
  u64* acc = ctx->mem<u64>(64);
  const u64* v = ctx->payload<u64>(0);
  if (r == nullptr || acc == nullptr || v == nullptr) return ret::drop;
  *acc = r->combine(*acc, *v); // expected-error {{virtual call to 'combine' is not allowed in a handler: the NIC has no virtual dispatch; call a non-virtual function, or switch on an explicit kind field}}
  const max_reducer m;
  *acc = m.combine(*acc, 1);  // devirtualized: the dynamic type is known
  return ret::success;
}
