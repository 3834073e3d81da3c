// Integer corner cases of the handler API's arithmetic rule (spin/handler.hpp, "integer
// arithmetic with one meaning on every target"). Each payload packet carries operand pairs
// (a, b) as u64; the handler writes one result row per pair into handler memory, which the test
// compares between native, eBPF-JIT and eBPF-interpreted runs and against the rule.
#include <spin/handler.hpp>

#include "corner_layout.hpp"

using namespace spin;

SPIN_MEMORY(corner_rows * corner_row_bytes, 0);

SPIN_PAYLOAD_HANDLER(corner_payload) {
  for (u32 p = 0; p < corner_pairs_per_packet; ++p) {
    const u64* ab = ctx->payload<u64>(p * 16, 2);
    if (ab == nullptr) return ret::success;
    const u64 row_index = ctx->msg.packet_index * corner_pairs_per_packet + p;
    u64* row = ctx->mem<u64>(row_index * corner_row_bytes, corner_row_bytes / 8);
    if (row == nullptr) return ret::drop;
    const u64 a = ab[0], b = ab[1];
    const u32 a32 = static_cast<u32>(a), b32 = static_cast<u32>(b);
    const i64 sa = static_cast<i64>(a), sb = static_cast<i64>(b);
    const i32 sa32 = static_cast<i32>(a32), sb32 = static_cast<i32>(b32);
    row[0] = spin::div(a, b);
    row[1] = spin::rem(a, b);
    row[2] = spin::div(a32, b32);
    row[3] = spin::rem(a32, b32);
    row[4] = static_cast<u64>(spin::div(sa, sb));
    row[5] = static_cast<u64>(spin::rem(sa, sb));
    row[6] = static_cast<u64>(static_cast<i64>(spin::div(sa32, sb32)));
    row[7] = static_cast<u64>(static_cast<i64>(spin::rem(sa32, sb32)));
    row[8] = spin::shl(a, b);
    row[9] = spin::shr(a, b);
    row[10] = static_cast<u64>(spin::sar(sa, b));
    row[11] = spin::shl(a32, b);
    row[12] = spin::shr(a32, b);
    row[13] = static_cast<u64>(static_cast<i64>(spin::sar(sa32, b)));
    // 32-bit arithmetic wraps and widening gives zero upper bits.
    row[14] = static_cast<u64>(a32 + b32);
    row[15] = static_cast<u64>(a32 * b32);
    row[16] = static_cast<u64>(a32 - b32);
    row[17] = static_cast<u64>(static_cast<i64>(sa32));  // sign extension
    row[18] = a * b;
    row[19] = a - b;
    row[20] = spin::lt(a, b);
    row[21] = spin::lt(sa, sb);
  }
  return ret::success;
}
