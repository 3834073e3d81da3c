// Divides by values known only at run time: x86-64 traps on a zero divisor and eBPF returns
// 0, so handlers use spin::div and spin::rem, which give one result on every target (see the
// integer helpers in spin/handler.hpp). Division by a non-zero constant is fine.
#include <spin/handler.hpp>

using namespace spin;

SPIN_COMPLETION_HANDLER(div_rem_completion) {
  const u64* cfg = ctx->mem<u64>(0, 2);
  if (cfg == nullptr) return ret::drop;
  const u64 ranks = cfg[0];
  const u64 bytes = ctx->msg.message_len_bytes;
  u64 share = bytes / ranks; // expected-error {{'/' by a divisor that is not a non-zero constant: x86-64 traps on a zero divisor and eBPF does not; use spin::div(a, b), which gives one result on every target}}
  const u64 left = bytes % ranks; // expected-error {{'%' by a divisor that is not a non-zero constant: x86-64 traps on a zero divisor and eBPF does not; use spin::rem(a, b), which gives one result on every target}}
  share /= cfg[1]; // expected-error {{'/=' by a divisor that is not a non-zero constant}}
  share %= ranks; // expected-error {{'%=' by a divisor that is not a non-zero constant}}
  const u64 words = bytes / 0; // expected-error {{'/' by a divisor that is not a non-zero constant}} expected-warning {{division by zero is undefined}}
  const u64 even = div(bytes, ranks) + rem(bytes, ranks) + bytes / sizeof(u64) + bytes % 8;
  ctx->post_event(share + left + words + even);
  return ret::success;
}
