// Loops whose trip count is not a compile-time constant: DPDK's eBPF validator rejects every
// backward jump, so each loop must be fully unrolled (checked with --target ebpf, unroll limit
// 4096).
#include <spin/handler.hpp>

using namespace spin;

constexpr u32 max_elements = 64;

struct u32_span {
  u32* first;
  u32* last;
  u32* begin() const { return first; }
  u32* end() const { return last; }
};

SPIN_PAYLOAD_HANDLER(ebpf_loop_payload) {
  const u64 n = ctx->packet.size() / sizeof(u32);
  u32* v = ctx->payload<u32>(0, max_elements);
  u64* acc = ctx->mem<u64>(0, max_elements);
  if (v == nullptr || acc == nullptr) return ret::drop;

  for (u64 i = 0; i < n; ++i) acc[i] += v[i]; // expected-error {{loop bound must be a compile-time constant on the eBPF target ('for' loop): the validator rejects backward jumps, so every loop is fully unrolled; write for (u32 i = 0; i < N; ++i) with constexpr N and guard the body with if (i < n)}}

  u64 i = 0;
  while (i < n) { // expected-error {{loop bound must be a compile-time constant on the eBPF target ('while' loop)}}
    acc[i] += 1;
    ++i;
  }
  do { // expected-error {{loop bound must be a compile-time constant on the eBPF target ('do' loop)}}
    --i;
  } while (i > 0);

  for (u32& x : u32_span{v, v + n}) x = 0; // expected-error {{loop bound must be a compile-time constant on the eBPF target (range-based 'for' loop)}}

  for (u32 k = 0; k < max_elements; ++k) { // expected-error {{loop variable 'k' is changed in the loop body: on the eBPF target every loop is fully unrolled and needs a compile-time constant trip count; change it only in the loop header (for (u32 i = 0; i < N; ++i))}}
    if (v[k] == 0) k += 1;
  }

  for (u32 k = 0; k < 100000; ++k) acc[k % max_elements] += 1; // expected-error {{loop runs 100000 times, more than the eBPF unroll limit of 4096: every loop is fully unrolled on the eBPF target; process fewer elements per packet, or use the native target}}

  for (u8 k = 0; k < 300; ++k) acc[k % max_elements] += 1; // expected-error {{loop bound must be a compile-time constant on the eBPF target ('for' loop)}} expected-warning {{always true}}

  for (;;) { // expected-error {{loop bound must be a compile-time constant on the eBPF target ('for' loop)}}
    if (acc[0] > n) break;
    acc[0] += 1;
  }
  return ret::success;
}
