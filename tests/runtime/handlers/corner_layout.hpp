// Layout shared by corner.cpp and the test that checks it.
#pragma once

#include <spin/handler.hpp>

inline constexpr spin::u64 corner_pairs_per_packet = 8;
inline constexpr spin::u64 corner_results = 22;
inline constexpr spin::u64 corner_row_bytes = corner_results * 8;
inline constexpr spin::u64 corner_rows = 512;
