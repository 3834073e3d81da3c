// Compiler builtins that lower to instructions are fine; the ones that become calls to libc or
// libm functions are not (a handler cannot make such calls).
#include <spin/handler.hpp>

using namespace spin;

SPIN_PAYLOAD_HANDLER(builtin_payload) {
  const char* text = ctx->payload<char>(0, ctx->packet.size());
  if (text == nullptr) return ret::drop;
  u64 n = __builtin_strlen(text); // expected-error {{'__builtin_strlen' may become a call to the library function 'strlen', which a handler cannot make: write the operation out (a loop, integer arithmetic)}}
  if (__builtin_memcmp(text, "spin", 4) == 0) n += 1; // expected-error {{'__builtin_memcmp' may become a call to the library function 'memcmp'}}
  __builtin_printf("%s\n", text); // expected-error {{'__builtin_printf' may become a call to the library function 'printf'}}
  if (n == 0) __builtin_abort(); // expected-error {{'__builtin_abort' may become a call to the library function 'abort'}}
  const double root = __builtin_sqrt(static_cast<double>(n)); // expected-error {{'__builtin_sqrt' may become a call to the library function 'sqrt'}}
  u64 bits = static_cast<u64>(__builtin_popcountll(n)) + static_cast<u64>(__builtin_ctzll(n | 1)) + static_cast<u64>(root);
  if (__builtin_expect(bits == 0, 0)) __builtin_trap();
  u8* scratch = ctx->scratchpad<u8>(0, 64);
  if (scratch != nullptr) {
    __builtin_memcpy(scratch, text, n < 64 ? n : 64);
    __builtin_memset(scratch, 0, 8);
  }
  u64 total = 0;
  __atomic_fetch_add(&total, bits, __ATOMIC_RELAXED);
  __sync_fetch_and_add(&total, 1);
  ctx->post_event(total + __builtin_bswap64(n));
  return ret::success;
}
