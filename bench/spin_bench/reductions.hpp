// spin-bench reductions: what the element-wise kernels of spin::coll's standard sum reductions
// (spin/coll/types.hpp) cost on this core, per value, for every datatype, beside float32's in
// the same run. The collectives' NICs and switches run these kernels on every packet; for the
// block formats (MX, BFP) they decode and encode blocks, which sets those datatypes' times in
// spin-bench coll.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spin::bench {

struct reductions_options {
  std::uint64_t values = std::uint64_t{1} << 22;  ///< values per buffer (4 Mi: larger than the caches)
  std::uint32_t repeats = 5;                      ///< timed passes per kernel (the median is reported)
  std::vector<std::string> dtypes;                ///< coll::name of each; empty: every sum datatype
};

/// Prints one row per datatype: widen, fold and narrow in ns per value, and each against
/// float32's. Checks that narrow(widen(x)) gives x back for every element (each input is an
/// encoded value, so it must). Exit status: 0, 1 when a check failed, 2 on bad options.
int run_reductions(const reductions_options& o);

} // namespace spin::bench
