// Tags an event with the name of its type: handlers have no RTTI.
#include <spin/handler.hpp>

using namespace spin;

struct completion_event {
  u64 message_id;
};

SPIN_COMPLETION_HANDLER(typeid_completion) {
  const completion_event e{ctx->msg.message_id};
  const char* tag = typeid(e).name(); // expected-error {{'typeid' is not allowed in a handler: the NIC has no RTTI; keep an explicit kind field and switch on it}}
  ctx->post_event(e.message_id ^ static_cast<u64>(tag[0]));
  return ret::success;
}
