// A const object whose class has a mutable member is writable state all the same.
#include <spin/handler.hpp>

using namespace spin;

struct counter {
  mutable u64 n;
};
const counter seen{0}; // expected-error {{mutable namespace-scope variable 'seen' is not allowed in a handler}}

SPIN_PAYLOAD_HANDLER(mutable_member_payload) {
  seen.n += 1;
  ctx->post_event(seen.n);
  return ret::success;
}
