// Reports a short packet by throwing: handlers have no exceptions.
#include <spin/handler.hpp>

using namespace spin;

struct short_packet {
  u64 len_bytes;
};

SPIN_PAYLOAD_HANDLER(throw_on_short_packet) {
  if (ctx->packet.size() < 8) throw short_packet{ctx->packet.size()}; // expected-error {{'throw' is not allowed in a handler: the NIC has no exception support; return a spin::ret or spin::errc code instead}}
  return ret::success;
}
