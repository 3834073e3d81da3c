// Handler-memory layout shared by the stream_reduce handlers and their host program.
#pragma once

#include <spin/handler.hpp>

/// Written by the host before traffic starts; counters updated by the handlers.
struct reduce_config {
  spin::u64 elements;       ///< int32 elements per contribution
  spin::u64 ranks;          ///< contributions to wait for
  spin::u64 contributions;  ///< completed contributions (handlers)
  spin::u64 rejected;       ///< contributions refused by the header handler (handlers)
  spin::u64 acc_offset;     ///< byte offset of the int64 accumulator (elements x 8 bytes)
};

/// One spin lock (u64) per block of elements guards that block of the accumulator: a payload
/// handler takes the lock once per block instead of one atomic per element.
inline constexpr spin::u64 elements_per_lock = 256;
inline constexpr spin::u64 locks_offset = 64;

/// Handler memory needed for `elements`: configuration, locks, accumulator.
constexpr spin::u64 lock_count(spin::u64 elements) { return (elements + elements_per_lock - 1) / elements_per_lock; }
constexpr spin::u64 accumulator_offset(spin::u64 elements) { return locks_offset + lock_count(elements) * 8; }
constexpr spin::u64 handler_memory_bytes(spin::u64 elements) { return accumulator_offset(elements) + elements * 8; }
