// Guards the accumulation with try/catch: handlers have no exceptions.
#include <spin/handler.hpp>

using namespace spin;

SPIN_PAYLOAD_HANDLER(try_accumulate) {
  try { // expected-error {{'try' is not allowed in a handler: the NIC has no exception support; check the spin::errc results of calls instead}}
    u64* total = ctx->mem<u64>(0);
    if (total == nullptr) return ret::drop;
    *total += ctx->packet.size();
  } catch (...) {
    return ret::drop;
  }
  return ret::success;
}
