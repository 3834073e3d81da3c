// The data of spin-bench coll, shared by every implementation it compares (spin::coll, Gloo,
// Open MPI): the same float32 inputs on the same ranks, and the exact expected sum. Every input
// is a small integer, so every partial sum is exact in float32 whatever the order of
// combination, and the result can be compared bit for bit (nccl-tests' #wrong).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spin::bench {

/// Element i of rank r's input: an integer in [-4, 4].
inline float coll_input(std::uint32_t rank, std::uint64_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + std::uint64_t{rank} * 3) % 9) - 4);
}

/// Element i of the allreduce (sum) over ranks 0 .. n-1.
inline float coll_expected(std::uint32_t n, std::uint64_t i) {
  int s = 0;
  for (std::uint32_t r = 0; r < n; ++r) s += static_cast<int>((i * 7 + std::uint64_t{r} * 3) % 9) - 4;
  return static_cast<float>(s);
}

/// Fills `out` with rank r's input.
inline void coll_fill(std::uint32_t rank, float* out, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) out[i] = coll_input(rank, i);
}

/// Elements of `got` that differ from the expected sum over n ranks. The expected value repeats
/// with period 9 in i, so it is computed once per residue.
inline std::uint64_t coll_wrong(std::uint32_t n, const float* got, std::size_t count) {
  float want[9];
  for (std::uint64_t k = 0; k < 9; ++k) want[k] = coll_expected(n, k);
  std::uint64_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += got[i] != want[i % 9];
  return wrong;
}

/// nccl-tests' message sizes: from min_bytes, times factor, up to max_bytes; max_bytes is
/// included even when the factor steps over it. Every size is a multiple of 4 (float32).
inline std::vector<std::uint64_t> coll_sizes(std::uint64_t min_bytes, std::uint64_t max_bytes, std::uint64_t factor) {
  std::vector<std::uint64_t> v;
  for (std::uint64_t s = min_bytes; s <= max_bytes; s *= factor) {
    v.push_back(s / 4 * 4);
    if (factor < 2) break;
  }
  if (v.empty() || v.back() != max_bytes / 4 * 4) v.push_back(max_bytes / 4 * 4);
  return v;
}

/// Timed iterations for a message of `bytes`: enough for about `budget_bytes` of data, between
/// 1 and max_iters (nccl-tests' -n, scaled down for large messages on a slow emulator).
inline std::uint32_t coll_iters(std::uint64_t bytes, std::uint64_t budget_bytes, std::uint32_t max_iters) {
  const std::uint64_t n = bytes == 0 ? max_iters : budget_bytes / bytes;
  return static_cast<std::uint32_t>(n < 1 ? 1 : n > max_iters ? max_iters : n);
}

} // namespace spin::bench
