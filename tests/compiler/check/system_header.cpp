// Rules apply in user headers, also in one marked with '#pragma GCC system_header'.
#include "system_header.h"

using namespace spin;

SPIN_PAYLOAD_HANDLER(system_header_payload) {
  hidden_state += 1;
  ctx->post_event(fib(ctx->packet.size()) + hidden_state);
  return ret::success;
}
