// Handler memory layout of the strided-vector unpack (handlers/std/strided_unpack.cpp), shared
// by the handler and the host code that configures it and reads its counters. Freestanding.
#pragma once

#include <spin/handler.hpp>

namespace spin::stdh {

/// strided_unpack: a message carries `blocks` blocks of `block_bytes` packed back to back; block
/// b lands at host window offset b * stride_bytes (an MPI vector datatype: count, blocklength,
/// stride; sPIN, SC17, section 5.2). The host sets the first three fields before traffic.
struct strided_state {
  u64 block_bytes;   ///< bytes per block, > 0
  u64 stride_bytes;  ///< distance between block starts in host memory, >= block_bytes
  u64 blocks;        ///< blocks per message
  u64 messages;      ///< messages unpacked completely
  u64 rejected;      ///< messages refused: length is not blocks * block_bytes, or a bad layout
  u64 dma_failed;    ///< pieces whose DMA failed (the window is smaller than the layout)
};

} // namespace spin::stdh
