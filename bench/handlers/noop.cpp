// Handler of spin-bench handlers: a payload handler that returns at once, built for both
// targets. Its rate is what calling a handler costs the NIC, beside the empty handler set (no
// handler: the packet is deposited into host memory).
#include <spin/handler.hpp>

using namespace spin;

SPIN_PAYLOAD_HANDLER(noop_payload) { return ret::success; }
