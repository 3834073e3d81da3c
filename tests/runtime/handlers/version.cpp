// Two packages built from this file with -D SPIN_TEST_VERSION=1 and =2 have the same handler
// name and different code: loading both must run each one's own code.
#include <spin/handler.hpp>

using namespace spin;

SPIN_PAYLOAD_HANDLER(version_payload) {
  ctx->post_event(SPIN_TEST_VERSION);
  return ret::success;
}
