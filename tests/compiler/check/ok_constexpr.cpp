// expected-no-diagnostics
// constexpr and consteval functions and tables are fine; they may even loop and recurse when
// they only run at compile time.
#include <spin/handler.hpp>

using namespace spin;

constexpr u32 crc_entry(u32 byte) {
  u32 c = byte;
  for (u32 k = 0; k < 8; ++k) c = (c & 1) != 0 ? 0xedb88320u ^ (c >> 1) : c >> 1;
  return c;
}

struct crc_table {
  u32 entries[256];
};

constexpr crc_table make_crc_table() {
  crc_table t{};
  for (u32 i = 0; i < 256; ++i) t.entries[i] = crc_entry(i);
  return t;
}

constexpr crc_table table = make_crc_table();

consteval u64 power_of_two_at_least(u64 n, u64 p = 1) { return p >= n ? p : power_of_two_at_least(n, 2 * p); }

constexpr u64 slots = power_of_two_at_least(1000);
static_assert(slots == 1024);

constexpr u32 update(u32 crc, u8 byte) { return table.entries[(crc ^ byte) & 0xff] ^ (crc >> 8); }

SPIN_PAYLOAD_HANDLER(constexpr_payload) {
  const u64 n = ctx->packet.size();
  const u8* bytes = ctx->payload<u8>(0, n);
  if (bytes == nullptr) return ret::drop;
  u32 crc = ~0u;
  for (u64 i = 0; i < n; ++i) crc = update(crc, bytes[i]);
  ctx->post_event((~crc) % slots);
  return ret::success;
}
