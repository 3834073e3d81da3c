// Instruction counting of native handler objects (icount.cpp; spinc --count-instructions).
#pragma once

#include <spin/result.hpp>
#include <spin/rt/package.hpp>

#include <string>

namespace spin::cc {

/// The counter every function of a counted object adds to (spin::rt::instruction_counter_symbol).
inline constexpr const char* instruction_counter_symbol = rt::instruction_counter_symbol;

/// Reads clang's optimised IR from `in`, adds the instruction counting of icount.cpp to every
/// defined function and the counter itself, and writes the IR to `out`. Errors: bad_state (a
/// file that cannot be read, parsed or written; IR the instrumentation broke), invalid_argument
/// (the source defines the counter's name).
result<void> instrument_ir(const std::string& in, const std::string& out);

} // namespace spin::cc
