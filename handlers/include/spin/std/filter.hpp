// Handler memory layout of the record filter (handlers/std/filter.cpp), shared by the handler
// and the host code that configures it and reads its counters. Freestanding.
#pragma once

#include <spin/handler.hpp>

namespace spin::stdh {

/// filter: a message carries 16-byte records; records with key_lo <= key <= key_hi are appended
/// to the host window (as an array of records, in arrival order), up to capacity_records.
struct filter_record {
  u64 key;
  u64 value;
};
struct filter_state {
  u64 key_lo;
  u64 key_hi;
  u64 capacity_records;  ///< records the host window holds
  u64 cursor;            ///< records claimed so far (may exceed capacity: overflow)
  u64 kept;              ///< records written to the host
  u64 dropped;           ///< records outside the key range
  u64 overflow;          ///< matching records that found the host window full
  u64 rejected;          ///< packets whose length is not a multiple of 16
};

} // namespace spin::stdh
