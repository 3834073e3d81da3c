// A user header that calls itself a system header is user code all the same.
#pragma GCC system_header
#include <spin/handler.hpp>

inline spin::u64 hidden_state; // expected-error {{mutable namespace-scope variable 'hidden_state' is not allowed in a handler}}
inline spin::u64 fib(spin::u64 n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); } // expected-error {{recursion is not allowed in a handler}} expected-note {{call cycle: fib -> fib}}
