// Several findings in one file: every one is reported in the same run, each once.
#include <spin/handler.hpp>

using namespace spin;

u64 messages_done; // expected-error {{mutable namespace-scope variable 'messages_done' is not allowed in a handler}}
u32 checksum_elsewhere(const u8* data, u64 len); // expected-note {{'checksum_elsewhere' declared here}}

u64 fib(u64 n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); } // expected-error {{recursion is not allowed in a handler: this call to 'fib' is part of a call cycle}} expected-note {{call cycle: fib -> fib}}

template <class T> T* make() {
  return new T{}; // expected-error {{'new' is not allowed in a handler}}
}

SPIN_PAYLOAD_HANDLER(multi_payload) {
  const u8* data = ctx->payload<u8>(0, ctx->packet.size());
  if (data == nullptr) throw 1; // expected-error {{'throw' is not allowed in a handler}}
  u64* a = make<u64>();
  u32* b = make<u32>();
  if (checksum_elsewhere(data, ctx->packet.size()) != 0) goto bad; // expected-error {{call to 'checksum_elsewhere', which is neither defined in this file nor part of the spin API}} expected-error {{'goto' is not allowed in a handler}}
  *a = fib(10) + *b;
  ++messages_done;
  return ret::success;
bad:
  return ret::drop;
}
