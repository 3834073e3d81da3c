// Finds the kind of a request with dynamic_cast: handlers have no RTTI (nor virtual functions,
// which dynamic_cast needs).
#include <spin/handler.hpp>

using namespace spin;

struct request {
  virtual ~request() = default; // expected-error {{virtual function '~request' is not allowed in a handler}}
};
struct add_request : request {
  u64 operand;
};

SPIN_PAYLOAD_HANDLER(dynamic_cast_payload) {
  request* r = ctx->payload<request>(0);
  if (auto* add = dynamic_cast<add_request*>(r)) // expected-error {{'dynamic_cast' is not allowed in a handler: the NIC has no RTTI; keep an explicit kind field and use static_cast}}
    ctx->fetch_add<u64>(0, add->operand);
  return ret::success;
}
