// A handler package built out of tree: the installed spinc with the installed handler headers
// only. Counts packets and payload bytes in handler memory; builds for native and eBPF.
#include <spin/handler.hpp>

using namespace spin;

struct counter_state {
  u64 packets;
  u64 bytes;
};

SPIN_MEMORY(sizeof(counter_state), 0);

SPIN_PAYLOAD_HANDLER(count_payload) {
  ctx->fetch_add<u64>(offsetof(counter_state, packets), 1);
  ctx->fetch_add<u64>(offsetof(counter_state, bytes), ctx->packet.size());
  return ret::success;
}
