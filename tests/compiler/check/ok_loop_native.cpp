// expected-no-diagnostics
// On the native target loops need no compile-time bound: while, do-while, range-for and for
// loops over run-time sizes are all fine.
#include <spin/handler.hpp>

using namespace spin;

SPIN_PAYLOAD_HANDLER(native_loop_payload) {
  const u64 n = ctx->packet.size();
  const u8* bytes = ctx->payload<u8>(0, n);
  if (bytes == nullptr) return ret::drop;
  u64 zeros = 0;
  for (u64 i = 0; i < n; ++i) zeros += bytes[i] == 0;
  u64 i = 0;
  while (i < n && bytes[i] != 0xff) ++i;
  do {
    zeros += 1;
  } while (zeros < 3);
  u8 window[4] = {};
  for (u8& w : window) w = bytes[0];
  for (;;) {
    if (++i >= n) break;
  }
  ctx->post_event(zeros + i + window[3]);
  return ret::success;
}
