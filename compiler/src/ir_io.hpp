// Rewriting clang's IR in place between two files: the one way spinc's IR passes (icount.cpp's
// instruction counting, build.cpp's preparation for BPF) read, verify and write bitcode.
#pragma once

#include <spin/result.hpp>

#include <llvm/ADT/STLFunctionalExtras.h>
#include <llvm/IR/Module.h>

#include <string>

namespace spin::cc {

/// Reads the bitcode file `in`, calls `edit` on its module, verifies the result and writes it to
/// `out`. `what` names the pass in the error of a module it broke ("spinc broke the IR it
/// <what>: ..."). Errors: those of `edit`; bad_state (a file that cannot be read, parsed or
/// written; a module that does not verify after `edit`).
result<void> rewrite_bitcode(const std::string& in, const std::string& out, const char* what,
                             llvm::function_ref<result<void>(llvm::Module&)> edit);

} // namespace spin::cc
