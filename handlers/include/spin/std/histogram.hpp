// Handler memory layout of the int32 histogram (handlers/std/histogram.cpp), shared by the
// handler and the host code that configures it and reads its result. Freestanding.
#pragma once

#include <spin/handler.hpp>

namespace spin::stdh {

/// histogram: int32 values counted in `bins` bins of `bin_width` starting at `lo`; below lo
/// counts as underflow, at or above lo + bins * bin_width as overflow. When `expected_messages`
/// messages have completed, the result (histogram_result) is DMAed to host offset 0 and an
/// event carries the message count.
inline constexpr u32 histogram_max_bins = 256;
struct histogram_state {
  i64 lo;
  u64 bin_width;          ///< > 0
  u64 bins;               ///< 1 .. histogram_max_bins
  u64 expected_messages;  ///< 0: never DMA
  u64 messages;
  u64 rejected;           ///< packets whose length is not a multiple of 4, or a bad layout
  u64 underflow;
  u64 overflow;
  u64 counts[histogram_max_bins];
};
/// What histogram writes to the host.
struct histogram_result {
  u64 underflow;
  u64 overflow;
  u64 counts[histogram_max_bins];
};

} // namespace spin::stdh
