// expected-no-diagnostics
// Calling a lambda directly is a direct call, with or without captures; so is passing it to a
// template. Only calling it through a function pointer is not.
#include <spin/handler.hpp>

using namespace spin;

template <class F> u64 times(u64 n, F f) {
  u64 acc = 0;
  for (u64 i = 0; i < n; ++i) acc += f(i);
  return acc;
}

SPIN_PAYLOAD_HANDLER(lambda_payload) {
  const u64 n = ctx->packet.size();
  auto square = [](u64 x) { return x * x; };
  const u64 base = ctx->msg.offset_bytes;
  auto offset = [base](u64 x) { return base + x; };
  auto twice = [](auto f, u64 x) { return f(f(x)); };
  const u64 v = square(n) + offset(n) + twice(square, 3) + times(4, [&](u64 i) { return i + base; });
  ctx->post_event(v);
  return ret::success;
}
