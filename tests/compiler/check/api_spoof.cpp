// Only the real handler API is trusted, not any file whose path ends in spin/handler.hpp.
#include "spoof/spin/handler.hpp"

using namespace spin;

SPIN_PAYLOAD_HANDLER(api_spoof_payload) {
  spoofed_state += 1;
  ctx->post_event(spoofed_state);
  return ret::success;
}
