// Averages packet sizes in floating point: eBPF has no floating point (checked with
// --target ebpf). Integers or fixed point do the same job.
#include <spin/handler.hpp>

using namespace spin;

struct running_mean {
  double mean; // expected-error {{field 'mean' of floating-point type 'double' is not allowed on the eBPF target: eBPF has no floating point; use integers or fixed point, or the native target}}
  u64 count;
  u64 mean_q16;  // fixed point: mean * 2^16
};

float weight(u32 rank) { // expected-error {{function 'weight' returning floating-point type 'float' is not allowed on the eBPF target}}
  return rank == 0 ? 2.0f : 1.0f; // expected-error {{floating-point literal is not allowed on the eBPF target}} expected-error {{floating-point literal is not allowed on the eBPF target}}
}

u64 scaled(u64 v, double factor) { // expected-error {{parameter 'factor' of floating-point type 'double' is not allowed on the eBPF target}}
  return static_cast<u64>(v * factor); // expected-error {{floating-point conversion is not allowed on the eBPF target}}
}

SPIN_PAYLOAD_HANDLER(ebpf_float_payload) {
  running_mean* m = ctx->mem<running_mean>(0);
  if (m == nullptr) return ret::drop;
  const u64 len = ctx->packet.size();
  m->count += 1;
  const float w = weight(ctx->msg.source_rank); // expected-error {{variable 'w' of floating-point type 'const float' is not allowed on the eBPF target}}
  m->mean += (len * w - m->mean) / m->count; // expected-error {{floating-point arithmetic is not allowed on the eBPF target}}
  m->mean_q16 += ((len << 16) - m->mean_q16) / 2;
  const u64 half = len * 0.5; // expected-error {{floating-point conversion is not allowed on the eBPF target}}
  if (len > 1e3) return ret::drop; // expected-error {{floating-point comparison is not allowed on the eBPF target}}
  ctx->post_event(scaled(len, 2) + half); // expected-error {{floating-point conversion is not allowed on the eBPF target}}
  return ret::success;
}
