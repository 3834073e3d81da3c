// Not the handler API: a user header whose path merely ends in spin/handler.hpp.
#pragma once
#include <spin/handler.hpp>  // the real API, found through -I

inline spin::u64 spoofed_state; // expected-error {{mutable namespace-scope variable 'spoofed_state' is not allowed in a handler}}
