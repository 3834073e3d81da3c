// A handler in a section of unknown kind: the loader would not find it.
#include <spin/handler.hpp>

using namespace spin;

extern "C" __attribute__((section(".spin.trailer.trailer_handler"), used)) ret trailer_handler(ctx* c) { // expected-error {{unknown handler kind 'trailer' in section '.spin.trailer.trailer_handler': declare handlers with SPIN_HEADER_HANDLER, SPIN_PAYLOAD_HANDLER or SPIN_COMPLETION_HANDLER}}
  return c->packet.size() != 0 ? ret::success : ret::drop;
}

SPIN_HEADER_HANDLER(good_header) {
  return ctx->msg.message_len_bytes != 0 ? ret::success : ret::drop;
}
