// expected-no-diagnostics
// Templates are fine: function templates, class templates, and templates that take the
// operation as a lambda (a direct call once instantiated).
#include <spin/handler.hpp>

using namespace spin;

template <class T> T clamp(T v, T lo, T hi) { return v < lo ? lo : v > hi ? hi : v; }

template <class T, u32 N> struct ring {
  T slots[N];
  u32 head;
  void push(T v) {
    slots[head % N] = v;
    head = head + 1;
  }
};

template <class T, class Op> T fold(const T* v, u64 n, T init, Op op) {
  for (u64 i = 0; i < n; ++i) init = op(init, v[i]);
  return init;
}

struct max_op {
  template <class T> T operator()(T a, T b) const { return a > b ? a : b; }
};

SPIN_PAYLOAD_HANDLER(template_payload) {
  const u64 n = ctx->packet.size() / sizeof(u32);
  const u32* v = ctx->payload<u32>(0, n);
  ring<u64, 16>* history = ctx->mem<ring<u64, 16>>(0);
  if (v == nullptr || history == nullptr) return ret::drop;
  const u32 sum = fold(v, n, 0u, [](u32 a, u32 b) { return a + b; });
  const u32 top = fold(v, n, 0u, max_op{});
  history->push(clamp<u64>(sum + top, 0, 1u << 20));
  return ret::success;
}
