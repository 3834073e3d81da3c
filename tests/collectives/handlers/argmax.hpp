// Test reduction: maximum with its index (MPI_MAXLOC). Ties go to the lower index, which makes
// it commutative and associative: the result does not depend on any order.
#pragma once

#include <spin/handler.hpp>

struct value_index {
  float value;
  spin::u32 index;
};

struct argmax {
  using elem = value_index;
  using acc = value_index;
  static acc widen(elem x) { return x; }
  static acc combine(acc a, acc b) {
    if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
    return a;
  }
  static elem narrow(acc a) { return a; }
};
