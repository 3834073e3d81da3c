// landing: the smallest useful sPIN handler package. spinc compiles it to landing.native.spkg;
// host_hello (main.cpp) installs it on the receiving NIC.
//
// sPIN runs up to three handlers per message that matches an execution context (EC):
//   - a header handler, once, before anything else of the message (accept or drop it),
//   - a payload handler per packet, on any HPU, in any order (process the bytes on the NIC),
//   - a completion handler, once, after every packet arrived and every payload handler returned.
// Any of them may be absent. This file has no header and no payload handler: with no payload
// handler the NIC writes each packet's payload at its message offset into the EC's host window
// ("default deposit"), so the message lands in host memory unchanged. The completion handler
// then tells the host that all of it is there.
#include <spin/handler.hpp>

using namespace spin;

// The event's 8 bytes are the message length; the host also sees the sender's rank and the
// message id, and compares the length with what it sent.
SPIN_COMPLETION_HANDLER(landing_completion) {
  ctx->post_event(ctx->msg.message_len_bytes);  // a full event queue is counted as events_lost
  return ret::success;
}
