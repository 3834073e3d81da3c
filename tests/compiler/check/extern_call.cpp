// Calls code outside the file: libc functions declared by hand and a function defined
// elsewhere. A handler can only call functions of its own file and the spin API.
#include <spin/handler.hpp>

using namespace spin;

using size_t = decltype(sizeof 0);
extern "C" void* memcpy(void* dst, const void* src, size_t n); // expected-note {{'memcpy' declared here}}
extern "C" int printf(const char* format, ...); // expected-note {{'printf' declared here}}
u32 lookup_route(u32 dest_rank); // expected-note 2 {{'lookup_route' declared here}}

struct route_cache {
  u32 hits;
  u32 find(u32 dest_rank) const; // expected-note {{'find' declared here}}
};

SPIN_PAYLOAD_HANDLER(extern_call_payload) {
  u8 header[16] = {};
  memcpy(header, ctx->packet.data, sizeof header); // expected-error {{call to 'memcpy', which is neither defined in this file nor part of the spin API: a handler cannot call other code (no libc); define the function in this file, or use the spin API or a compiler builtin}}
  printf("packet %u\n", ctx->msg.packet_index); // expected-error {{call to 'printf', which is neither defined in this file nor part of the spin API}}
  const u32 next = lookup_route(ctx->msg.source_rank); // expected-error {{call to 'lookup_route', which is neither defined in this file nor part of the spin API}}
  const route_cache* cache = ctx->mem<route_cache>(0);
  if (cache == nullptr) return ret::drop;
  const u32 cached = cache->find(next); // expected-error {{call to 'find', which is neither defined in this file nor part of the spin API}}
  return ctx->forward(cached != 0 ? cached : lookup_route(next)) == errc::ok ? ret::success : ret::drop; // expected-error {{call to 'lookup_route', which is neither defined in this file nor part of the spin API}}
}
