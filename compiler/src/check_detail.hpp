// Internals of the spinc checker shared by check.cpp (clang invocation) and check_rules.cpp
// (the rules). Not installed.
#pragma once

#include <spin/cc/check.hpp>

namespace clang {
class ASTContext;
}

namespace spin::cc::detail {

/// Path of the prelude spinc force-includes (-include). It declares std::type_info so that
/// `typeid` parses and gets spinc's diagnostic instead of clang's "include <typeinfo>"; it is
/// a system header, so no rule applies to it.
inline constexpr const char* prelude_path = "/spinc-internal/spinc_prelude.hpp";

/// Applies every rule of `opts.tgt` to the parsed translation unit `ctx`, reporting findings
/// through ctx's DiagnosticsEngine (so that clang -verify sees them), and fills
/// `report.handlers` and `report.callees`.
void run_rules(clang::ASTContext& ctx, const check_options& opts, check_report& report);

} // namespace spin::cc::detail
