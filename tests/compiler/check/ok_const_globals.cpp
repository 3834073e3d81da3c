// expected-no-diagnostics
// Constants at namespace scope, static constants and constant static members are fine, as is
// SPIN_MEMORY; none of them needs code to initialize it.
#include <spin/handler.hpp>

using namespace spin;

SPIN_MEMORY(4096, 256);

constexpr u32 max_ranks = 64;
const u64 window_bytes = 1u << 20;
const char* const names[] = {"sum", "max"};
constexpr u8 shifts[] = {0, 8, 16, 24};
inline constexpr u64 magic = 0x5eed;

struct limits {
  static constexpr u32 max_packets = 1024;
  static const u32 max_locks = 8;
  u32 value;
};
constexpr limits defaults{100};

enum class op : u8 { sum, max };

SPIN_HEADER_HANDLER(const_globals_header) {
  static constexpr u32 local_limit = 16;
  static const u64 local_table[] = {1, 2, 3};
  if (ctx->msg.source_rank >= max_ranks) return ret::drop;
  const op o = static_cast<op>(ctx->msg.match_bits & 1);
  const u64 v = window_bytes + shifts[1] + magic + limits::max_packets + limits::max_locks + defaults.value +
                local_limit + local_table[2] + static_cast<u64>(names[o == op::sum ? 0 : 1][0]);
  ctx->post_event(v);
  return ret::success;
}
