// Handler memory layout of the streaming float32 sum (handlers/std/fsum.cpp), shared by the
// handler and the host code that configures it and reads its results. Freestanding.
#pragma once

#include <spin/handler.hpp>

namespace spin::stdh {

/// fsum: a streaming float32 sum (the reduction of SwitchML and SHARP, done by the NIC). Every
/// packet of every message adds its float32 elements into `acc` at the element index its message
/// offset gives; after `expected_messages` messages the sum is DMAed to host offset 0 (as
/// `elements` float32 values) and an event carries the message count. float32 addition is not
/// associative: the result depends on the order in which packets of different messages add into
/// an element (exact when every partial sum is an integer below 2^24). Native target only: eBPF
/// has no floating point.
inline constexpr u64 fsum_max_elements = 16384;        ///< longest vector (64 KiB)
inline constexpr u64 fsum_max_packet_elements = 2304;  ///< longest packet payload (9216 bytes)
inline constexpr u64 fsum_elements_per_lock = 512;
inline constexpr u64 fsum_locks = fsum_max_elements / fsum_elements_per_lock;
struct fsum_state {
  u64 elements;           ///< vector length every message must carry (1 .. fsum_max_elements)
  u64 expected_messages;  ///< contributions to wait for; 0: never DMA
  u64 messages;           ///< completed contributions
  u64 packets;            ///< payload packets added
  u64 rejected;           ///< messages refused (wrong length) and packets refused (bad size)
  u64 locks[fsum_locks];  ///< one spin lock per block of fsum_elements_per_lock elements
  float acc[fsum_max_elements];  ///< the sum
};

} // namespace spin::stdh
