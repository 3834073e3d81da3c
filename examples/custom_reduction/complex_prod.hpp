// A user reduction: the element-wise product of complex numbers with float32 parts. The same
// type is compiled into the NIC package (complex_prod.cpp, by spinc) and into the host program
// (main.cpp), which gives spin::coll its host kernels (docs/handler-guide.md, "Custom
// reductions").
//
// Complex multiplication in floating point is commutative but not associative, so the result
// depends on the order of the factors; spin::coll combines them in its fixed order
// (docs/collectives.md, "Combination order"), which makes the result the same on every rank and
// in every run.
#pragma once

#include <spin/handler.hpp>

struct complex_f32 {
  float re;
  float im;
};

struct complex_prod {
  using elem = complex_f32;  // what host buffers hold
  using acc = complex_f32;   // what travels while the product is formed (no wider type here)
  static acc widen(elem x) { return x; }
  // a: the product of the ranks before, b: the next factor.
  static acc combine(acc a, acc b) { return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re}; }
  static elem narrow(acc a) { return a; }
};
