// Host-side access to a reduction's element-wise kernels (spin/coll/types.hpp) through function
// pointers, which handlers may not hold: spin::coll uses them for one-rank groups and the host
// baseline, tests for their references.
#pragma once

#include <spin/coll/types.hpp>

#include <cstdint>

namespace spin::coll {

/// The kernels of one reduction; n counts elements.
struct kernels {
  std::uint32_t elem_bytes = 0;  ///< bytes of one element in host buffers (and allgather packets)
  std::uint32_t acc_bytes = 0;   ///< bytes of one accumulator element (reduce-scatter packets)
  void (*widen)(void* acc, const void* elem, std::uint32_t n) = nullptr;
  void (*fold)(void* acc, const void* elem, std::uint32_t n) = nullptr;
  void (*combine)(void* acc, const void* later, std::uint32_t n) = nullptr;
  void (*narrow)(void* elem, const void* acc, std::uint32_t n) = nullptr;
};

/// The kernels of reduction R (a type with elem, acc, widen, combine, narrow).
template <class R> constexpr kernels kernels_of() {
  return kernels{sizeof(typename R::elem), sizeof(typename R::acc), &widen_n<R>, &fold_n<R>, &combine_n<R>,
                 &narrow_n<R>};
}

} // namespace spin::coll
