// Handler memory layout of the broadcast forwarder (handlers/std/bcast_forward.cpp), shared by
// the handler and the host code that configures it and reads its counters. Freestanding.
#pragma once

#include <spin/handler.hpp>

namespace spin::stdh {

/// bcast_forward: each packet lands at its message offset in the host window and goes on, as it
/// arrives, to `next_rank` (unless has_next is 0: the end of the chain); the completion handler
/// posts the message id. A pipelined chain broadcast (Khalilov et al., SC24, section 3).
struct bcast_state {
  u32 next_rank;
  u32 has_next;
  u64 packets;         ///< packets landed
  u64 forward_failed;  ///< packets the TX queue refused (not forwarded; counted)
  u64 dma_failed;      ///< packets outside the host window (dropped; counted)
  u64 messages;        ///< messages completed
};

} // namespace spin::stdh
