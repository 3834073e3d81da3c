// Handler memory layout of the streaming integer sum (handlers/std/isum.cpp), shared by the
// handler and the host code that configures it and reads its results. Freestanding.
#pragma once

#include <spin/handler.hpp>

namespace spin::stdh {

inline constexpr u64 isum_max_elements = 4096;         ///< longest vector (int32 elements)
inline constexpr u64 isum_max_packet_elements = 1024;  ///< longest packet payload (4 KiB)
inline constexpr u64 isum_elements_per_lock = 256;
inline constexpr u64 isum_locks = isum_max_elements / isum_elements_per_lock;

/// Handler memory of an isum EC. The host writes `elements` and `expected_messages` before
/// traffic starts; the handlers write the rest.
struct isum_state {
  u64 elements;                ///< vector length every message must carry
  u64 expected_messages;       ///< contributions to wait for
  u64 messages;                ///< completed contributions
  u64 packets;                 ///< payload packets added
  u64 rejected;                ///< messages refused by the header handler
  u64 locks[isum_locks];       ///< one spin lock per block of isum_elements_per_lock elements
  i64 acc[isum_max_elements];  ///< the sum
};

} // namespace spin::stdh
