// spinc checker rules: one walk over the translation unit reports what a NIC cannot run
// (design brief section 6), then the call graph of the file's functions gives the recursion
// findings and the callee lists the build step sizes stacks with.
//
// Scope: the rules apply to code outside system headers and outside spin/handler.hpp (the
// handler API is trusted). Template patterns get the syntactic rules; their instantiations get
// all rules, and a finding at the same place is reported once.
#include "check_detail.hpp"

#include <clang/AST/ASTContext.h>
#include <clang/AST/ASTLambda.h>
#include <clang/AST/Mangle.h>
#include <clang/AST/RecursiveASTVisitor.h>
#include <clang/Basic/Builtins.h>
#include <clang/Basic/SourceManager.h>
#include <llvm/ADT/DenseMap.h>
#include <llvm/ADT/DenseSet.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/raw_ostream.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace spin::cc::detail {
namespace {

using namespace clang;

__extension__ typedef __int128 i128;  // trip counts of loops over the whole u64 range


/// Custom diagnostics, created once per run in the translation unit's DiagnosticsEngine so that
/// clang -verify sees them like clang's own.
struct diag_ids {
  explicit diag_ids(DiagnosticsEngine& d)
      : throw_expr(d.getCustomDiagID(DiagnosticsEngine::Error,
            "'throw' is not allowed in a handler: the NIC has no exception support; return a "
            "spin::ret or spin::errc code instead")),
        try_stmt(d.getCustomDiagID(DiagnosticsEngine::Error,
            "'try' is not allowed in a handler: the NIC has no exception support; check the "
            "spin::errc results of calls instead")),
        typeid_expr(d.getCustomDiagID(DiagnosticsEngine::Error,
            "'typeid' is not allowed in a handler: the NIC has no RTTI; keep an explicit kind "
            "field and switch on it")),
        dynamic_cast_expr(d.getCustomDiagID(DiagnosticsEngine::Error,
            "'dynamic_cast' is not allowed in a handler: the NIC has no RTTI; keep an explicit "
            "kind field and use static_cast")),
        heap_expr(d.getCustomDiagID(DiagnosticsEngine::Error,
            "'%0' is not allowed in a handler: the NIC has no heap; keep state in handler memory "
            "(ctx->mem<T>(off)) or in the message scratchpad (ctx->scratchpad<T>(off))")),
        heap_call(d.getCustomDiagID(DiagnosticsEngine::Error,
            "call to %0 is not allowed in a handler: the NIC has no heap; keep state in handler "
            "memory (ctx->mem<T>(off)) or in the message scratchpad (ctx->scratchpad<T>(off))")),
        virtual_method(d.getCustomDiagID(DiagnosticsEngine::Error,
            "virtual function %0 is not allowed in a handler: the NIC has no virtual dispatch; "
            "use a template, or switch on an explicit kind field")),
        virtual_base(d.getCustomDiagID(DiagnosticsEngine::Error,
            "virtual base class %0 is not allowed in a handler: the NIC has no virtual dispatch; "
            "use a non-virtual base")),
        virtual_call(d.getCustomDiagID(DiagnosticsEngine::Error,
            "virtual call to %0 is not allowed in a handler: the NIC has no virtual dispatch; "
            "call a non-virtual function, or switch on an explicit kind field")),
        indirect_call(d.getCustomDiagID(DiagnosticsEngine::Error,
            "call through a %select{function|member function}0 pointer is not allowed in a "
            "handler: the NIC makes direct calls only; call the function by name, pass a lambda "
            "to a template, or switch on a kind")),
        recursion(d.getCustomDiagID(DiagnosticsEngine::Error,
            "recursion is not allowed in a handler: this call to %0 is part of a call cycle; a "
            "handler runs on a small fixed stack, so rewrite it as a loop (with an explicit, "
            "bounded stack in the scratchpad if needed)")),
        cycle_note(d.getCustomDiagID(DiagnosticsEngine::Note, "call cycle: %0")),
        cycle_edge_note(d.getCustomDiagID(DiagnosticsEngine::Note, "%0 calls %1 here")),
        goto_stmt(d.getCustomDiagID(DiagnosticsEngine::Error,
            "%select{'goto'|computed 'goto'}0 is not allowed in a handler: use structured control "
            "flow (break, continue, return, a switch or a flag)")),
        inline_asm(d.getCustomDiagID(DiagnosticsEngine::Error,
            "inline assembly is not allowed in a handler: the same source must compile for every "
            "target; use the spin API or compiler builtins")),
        vla(d.getCustomDiagID(DiagnosticsEngine::Error,
            "variable-length array %0 is not allowed in a handler: the stack size must be known "
            "at compile time; use a constant-size array (T a[N] with constexpr N) and guard the "
            "accesses with if (i < n), or use the scratchpad")),
        alloca_call(d.getCustomDiagID(DiagnosticsEngine::Error,
            "call to %0 is not allowed in a handler: the stack size must be known at compile "
            "time; use a constant-size array (T a[N] with constexpr N) or the scratchpad")),
        mutable_var(d.getCustomDiagID(DiagnosticsEngine::Error,
            "mutable %select{namespace-scope variable|static local variable|static data member}0 "
            "%1 is not allowed in a handler: handlers run concurrently on several cores and keep "
            "no state of their own; keep state in handler memory (ctx->mem<T>(off)), or make it "
            "const or constexpr")),
        thread_local_var(d.getCustomDiagID(DiagnosticsEngine::Error,
            "thread-local variable %0 is not allowed in a handler: the NIC has no thread-local "
            "storage; keep per-message state in the scratchpad (ctx->scratchpad<T>(off)) and "
            "per-EC state in handler memory (ctx->mem<T>(off))")),
        dynamic_init(d.getCustomDiagID(DiagnosticsEngine::Error,
            "variable %0 needs dynamic initialization or destruction, which no NIC target runs: "
            "give it a constant initializer (constexpr) and a trivial destructor")),
        extern_call(d.getCustomDiagID(DiagnosticsEngine::Error,
            "call to %0, which is neither defined in this file nor part of the spin API: a "
            "handler cannot call other code (no libc); define the function in this file, or use "
            "the spin API or a compiler builtin")),
        extern_var(d.getCustomDiagID(DiagnosticsEngine::Error,
            "use of %0, which is not defined in this file: a handler has no other data; keep "
            "state in handler memory (ctx->mem<T>(off)) or define a constexpr value here")),
        declared_here(d.getCustomDiagID(DiagnosticsEngine::Note, "%0 declared here")),
        lib_builtin(d.getCustomDiagID(DiagnosticsEngine::Error,
            "%0 may become a call to the library function '%1', which a handler cannot make: "
            "write the operation out (a loop, integer arithmetic)")),
        bad_section(d.getCustomDiagID(DiagnosticsEngine::Error,
            "unknown handler kind '%0' in section '%1': declare handlers with "
            "SPIN_HEADER_HANDLER, SPIN_PAYLOAD_HANDLER or SPIN_COMPLETION_HANDLER")),
        div_rem(d.getCustomDiagID(DiagnosticsEngine::Error,
            "'%0' by a divisor that is not a non-zero constant: x86-64 traps on a zero divisor "
            "and eBPF does not; use spin::%1(a, b), which gives one result on every target")),
        float_decl(d.getCustomDiagID(DiagnosticsEngine::Error,
            "%select{variable %1 of|parameter %1 of|field %1 of|function %1 returning}0 "
            "floating-point type %2 is not allowed on the eBPF target: eBPF has no floating point; use integers or fixed "
            "point, or the native target")),
        float_op(d.getCustomDiagID(DiagnosticsEngine::Error,
            "floating-point %select{literal|arithmetic|comparison|conversion|operation}0 is not "
            "allowed on the eBPF target: eBPF has no floating point; use integers or fixed "
            "point, or the native target")),
        loop_bound(d.getCustomDiagID(DiagnosticsEngine::Error,
            "loop bound must be a compile-time constant on the eBPF target (%select{'while' "
            "loop|'do' loop|'for' loop|range-based 'for' loop}0): the validator rejects backward "
            "jumps, so every loop is fully unrolled; write for (u32 i = 0; i < N; ++i) with "
            "constexpr N and guard the body with if (i < n)")),
        loop_modified(d.getCustomDiagID(DiagnosticsEngine::Error,
            "loop variable %0 is changed in the loop body: on the eBPF target every loop is "
            "fully unrolled and needs a compile-time constant trip count; change it only in the "
            "loop header (for (u32 i = 0; i < N; ++i))")),
        loop_trips(d.getCustomDiagID(DiagnosticsEngine::Error,
            "loop runs %0 times, more than the eBPF unroll limit of %1: every loop is fully "
            "unrolled on the eBPF target; process fewer elements per packet, or use the native "
            "target")),
        mem_builtin(d.getCustomDiagID(DiagnosticsEngine::Error,
            "%0 with a size that is not a compile-time constant is not allowed on the eBPF "
            "target: it becomes a call to '%1', which eBPF cannot make; copy a constant size, or "
            "use a constant-bound loop guarded with if (i < n)")) {}

  unsigned throw_expr, try_stmt, typeid_expr, dynamic_cast_expr, heap_expr, heap_call;
  unsigned virtual_method, virtual_base, virtual_call, indirect_call;
  unsigned recursion, cycle_note, cycle_edge_note, goto_stmt, inline_asm, vla, alloca_call;
  unsigned mutable_var, thread_local_var, dynamic_init, extern_call, extern_var, declared_here;
  unsigned lib_builtin, bad_section, div_rem;
  unsigned float_decl, float_op, loop_bound, loop_modified, loop_trips, mem_builtin;
};

// %select indices of the diagnostics above.
enum class mutable_kind { global = 0, static_local = 1, static_member = 2 };
enum class float_decl_kind { variable = 0, parameter = 1, field = 2, function = 3 };
enum class float_op_kind { literal = 0, arithmetic = 1, comparison = 2, conversion = 3, operation = 4 };
enum class loop_kind { while_loop = 0, do_loop = 1, for_loop = 2, range_for = 3 };


bool is_heap_function(std::string_view name) {
  static const std::set<std::string_view> names = {
      "malloc", "calloc", "realloc", "reallocarray", "free", "aligned_alloc", "posix_memalign",
      "memalign", "valloc", "pvalloc", "strdup", "strndup", "operator_new", "operator_delete"};
  return names.count(name) != 0;
}

bool is_alloca_function(std::string_view name) {
  return name == "alloca" || name == "_alloca" || name.substr(0, 7) == "alloca_";
}

// Builtins clang marks as library functions ('F') that lower to instructions, not calls.
bool is_inline_lib_builtin(std::string_view base) {
  static const std::set<std::string_view> names = {
      "memcpy", "memset", "memmove", "abs", "labs", "llabs", "fabs", "fabsf", "fabsl", "fabsf16",
      "fabsf128", "copysign", "copysignf", "copysignl", "copysignf16", "copysignf128", "isnan",
      "isinf", "isfinite", "isnormal", "isinf_sign", "fpclassify", "signbit", "signbitf",
      "signbitl", "isgreater", "isgreaterequal", "isless", "islessequal", "islessgreater",
      "isunordered", "ffs", "ffsl", "ffsll", "cimag", "cimagf", "cimagl", "creal", "crealf",
      "creall", "conj", "conjf", "conjl", "nan", "nanf", "nanl", "nanf16", "nanf128", "nans",
      "nansf", "nansl", "nansf16", "nansf128"};
  return names.count(base) != 0;
}

std::string_view strip_builtin_prefix(std::string_view name) {
  constexpr std::string_view prefix = "__builtin_";
  return name.substr(0, prefix.size()) == prefix ? name.substr(prefix.size()) : name;
}

// A declaration's type, or the element type it points/refers to, is floating point.
bool has_float(QualType t) {
  if (t.isNull() || t->isDependentType()) return false;
  t = t.getCanonicalType().getNonReferenceType();
  for (;;) {
    if (const auto* a = t->getAsArrayTypeUnsafe()) {
      t = a->getElementType().getCanonicalType();
    } else if (t->isPointerType()) {
      t = t->getPointeeType().getCanonicalType();
    } else {
      break;
    }
  }
  if (const auto* v = t->getAs<VectorType>()) t = v->getElementType();
  return t->isFloatingType();
}

bool is_float_scalar(QualType t) { return !t.isNull() && !t->isDependentType() && t->isFloatingType(); }

// The floating-point operation an expression performs, if any. Plain reads of a variable are
// no operation: the variable's declaration is what gets reported.
std::optional<float_op_kind> float_operation(const Expr* e) {
  if (isa<FloatingLiteral>(e)) return float_op_kind::literal;
  if (const auto* b = dyn_cast<BinaryOperator>(e)) {
    if (!is_float_scalar(b->getLHS()->getType()) && !is_float_scalar(b->getRHS()->getType()) &&
        !is_float_scalar(b->getType()))
      return std::nullopt;
    if (b->isComparisonOp()) return float_op_kind::comparison;
    if (b->isAdditiveOp() || b->isMultiplicativeOp() || b->isCompoundAssignmentOp())
      return float_op_kind::arithmetic;
    if (b->getOpcode() == BO_Comma) return std::nullopt;
    return float_op_kind::operation;
  }
  if (const auto* u = dyn_cast<UnaryOperator>(e)) {
    if (u->getOpcode() == UO_AddrOf || u->getOpcode() == UO_Deref) return std::nullopt;
    return is_float_scalar(u->getSubExpr()->getType()) ? std::optional(float_op_kind::arithmetic) : std::nullopt;
  }
  if (const auto* c = dyn_cast<ExplicitCastExpr>(e)) {
    // An explicit conversion often wraps an implicit one (part of the explicit cast): report
    // the cast as written.
    const QualType from = c->getSubExprAsWritten()->getType();
    if (is_float_scalar(c->getType()) != is_float_scalar(from) ||
        (is_float_scalar(from) && c->getType() != from))
      return float_op_kind::conversion;
  }
  if (const auto* c = dyn_cast<CastExpr>(e)) {
    switch (c->getCastKind()) {
    case CK_LValueToRValue:
    case CK_NoOp:
    case CK_ArrayToPointerDecay:
    case CK_FunctionToPointerDecay:
    case CK_BitCast:
    case CK_LValueBitCast:
    case CK_LValueToRValueBitCast:
    case CK_ToVoid:
      return std::nullopt;
    default:
      break;
    }
    if (is_float_scalar(c->getType()) || is_float_scalar(c->getSubExpr()->getType())) return float_op_kind::conversion;
  }
  return std::nullopt;
}

const VarDecl* referenced_var(const Expr* e) {
  if (e == nullptr) return nullptr;
  const auto* d = dyn_cast<DeclRefExpr>(e->IgnoreParenImpCasts());
  return d != nullptr ? dyn_cast<VarDecl>(d->getDecl()) : nullptr;
}

// Counts the references to `v` below `s` and how many of them only read its value.
void count_uses(const Stmt* s, const VarDecl* v, unsigned& refs, unsigned& reads) {
  if (s == nullptr) return;
  if (const auto* c = dyn_cast<ImplicitCastExpr>(s); c != nullptr && c->getCastKind() == CK_LValueToRValue) {
    if (const auto* d = dyn_cast<DeclRefExpr>(c->getSubExpr()->IgnoreParens()); d != nullptr && d->getDecl() == v)
      ++reads;
  }
  if (const auto* d = dyn_cast<DeclRefExpr>(s); d != nullptr && d->getDecl() == v) ++refs;
  for (const Stmt* child : s->children()) count_uses(child, v, refs, reads);
}

std::optional<i128> constant_value(const Expr* e, const ASTContext& ctx) {
  if (e == nullptr || e->isValueDependent() || e->containsErrors()) return std::nullopt;
  Expr::EvalResult r;
  if (!e->EvaluateAsInt(r, ctx) || !r.Val.isInt()) return std::nullopt;
  const llvm::APSInt& v = r.Val.getInt();
  if (v.getBitWidth() > 64) return std::nullopt;
  return v.isSigned() ? static_cast<i128>(v.getSExtValue()) : static_cast<i128>(v.getZExtValue());
}

/// Why a `for` loop has no compile-time trip count, or its trip count.
struct for_analysis {
  enum class verdict { bounded, not_constant, modified, too_many } what = verdict::not_constant;
  const VarDecl* var = nullptr;
  i128 trips = 0;
};

for_analysis analyze_for(const ForStmt* f, const ASTContext& ctx, std::uint32_t limit) {
  for_analysis a;
  // Condition known false at compile time: the body never runs.
  if (const Expr* c = f->getCond(); c != nullptr && !c->isValueDependent()) {
    bool value = true;
    if (c->EvaluateAsBooleanCondition(value, ctx) && !value) {
      a.what = for_analysis::verdict::bounded;
      return a;
    }
  }
  // init: `T i = C1` or `i = C1`
  const VarDecl* var = nullptr;
  std::optional<i128> start;
  if (const auto* ds = dyn_cast_or_null<DeclStmt>(f->getInit()); ds != nullptr && ds->isSingleDecl()) {
    var = dyn_cast<VarDecl>(ds->getSingleDecl());
    if (var != nullptr) start = constant_value(var->getInit(), ctx);
  } else if (const auto* as = dyn_cast_or_null<BinaryOperator>(f->getInit()); as != nullptr && as->getOpcode() == BO_Assign) {
    var = referenced_var(as->getLHS());
    start = constant_value(as->getRHS(), ctx);
  }
  if (var == nullptr || !start || !var->getType()->isIntegerType() || !var->hasLocalStorage()) return a;
  a.var = var;
  // cond: `i op C2` or `C2 op i`
  const auto* cond = dyn_cast_or_null<BinaryOperator>(f->getCond() != nullptr ? f->getCond()->IgnoreParenImpCasts() : nullptr);
  if (cond == nullptr) return a;
  BinaryOperatorKind op = cond->getOpcode();
  std::optional<i128> bound;
  if (referenced_var(cond->getLHS()) == var) {
    bound = constant_value(cond->getRHS(), ctx);
  } else if (referenced_var(cond->getRHS()) == var) {
    bound = constant_value(cond->getLHS(), ctx);
    op = op == BO_LT ? BO_GT : op == BO_GT ? BO_LT : op == BO_LE ? BO_GE : op == BO_GE ? BO_LE : op;
  }
  if (!bound || (op != BO_LT && op != BO_LE && op != BO_GT && op != BO_GE && op != BO_NE)) return a;
  // inc: ++i, i++, --i, i--, i += C, i -= C
  i128 step = 0;
  const Expr* inc = f->getInc() != nullptr ? f->getInc()->IgnoreParenImpCasts() : nullptr;
  if (const auto* u = dyn_cast_or_null<UnaryOperator>(inc); u != nullptr && referenced_var(u->getSubExpr()) == var) {
    if (u->isIncrementOp()) step = 1;
    if (u->isDecrementOp()) step = -1;
  } else if (const auto* ca = dyn_cast_or_null<CompoundAssignOperator>(inc); ca != nullptr && referenced_var(ca->getLHS()) == var) {
    const std::optional<i128> by = constant_value(ca->getRHS(), ctx);
    if (by && ca->getOpcode() == BO_AddAssign) step = *by;
    if (by && ca->getOpcode() == BO_SubAssign) step = -*by;
  }
  if (step == 0) return a;
  // body: the loop variable is only read
  unsigned refs = 0;
  unsigned reads = 0;
  count_uses(f->getBody(), var, refs, reads);
  if (refs != reads) {
    a.what = for_analysis::verdict::modified;
    return a;
  }
  // trip count, and no wrap-around of the loop variable's type on the way
  const i128 s = *start;
  const i128 b = *bound;
  i128 trips = 0;
  switch (op) {
  case BO_LT:
    if (s < b) {
      if (step < 0) return a;
      trips = (b - s + step - 1) / step;
    }
    break;
  case BO_LE:
    if (s <= b) {
      if (step < 0) return a;
      trips = (b - s) / step + 1;
    }
    break;
  case BO_GT:
    if (s > b) {
      if (step > 0) return a;
      trips = (s - b - step - 1) / -step;
    }
    break;
  case BO_GE:
    if (s >= b) {
      if (step > 0) return a;
      trips = (s - b) / -step + 1;
    }
    break;
  default:  // BO_NE
    if ((b - s) % step != 0 || (b - s) / step < 0) return a;
    trips = (b - s) / step;
    break;
  }
  const unsigned width = ctx.getIntWidth(var->getType());
  if (width > 64) return a;
  const bool is_signed = var->getType()->isSignedIntegerOrEnumerationType();
  const i128 tmin = is_signed ? -(static_cast<i128>(1) << (width - 1)) : 0;
  const i128 tmax = is_signed ? (static_cast<i128>(1) << (width - 1)) - 1 : (static_cast<i128>(1) << width) - 1;
  const i128 after = s + trips * step;  // the value that ends the loop
  if (trips > 0 && (after < tmin || after > tmax)) return a;
  a.trips = trips;
  a.what = trips > limit ? for_analysis::verdict::too_many : for_analysis::verdict::bounded;
  return a;
}

/// The call graph of the functions defined in the translation unit.
struct call_graph {
  struct node {
    const FunctionDecl* fn = nullptr;  // the definition
    std::vector<std::pair<std::size_t, SourceLocation>> calls;  // callee, first call site
  };
  std::vector<node> nodes;
  llvm::DenseMap<const FunctionDecl*, std::size_t> index;  // canonical declaration -> node

  std::size_t node_of(const FunctionDecl* fn) {
    const FunctionDecl* key = fn->getCanonicalDecl();
    auto [it, inserted] = index.try_emplace(key, nodes.size());
    if (inserted) nodes.emplace_back();
    return it->second;
  }
  void add_edge(std::size_t from, std::size_t to, SourceLocation where) {
    auto& calls = nodes[from].calls;
    if (std::none_of(calls.begin(), calls.end(), [to](const auto& c) { return c.first == to; }))
      calls.emplace_back(to, where);
  }
};

class rule_visitor : public RecursiveASTVisitor<rule_visitor> {
  using base = RecursiveASTVisitor<rule_visitor>;

public:
  rule_visitor(ASTContext& ctx, const check_options& opts, check_report& report)
      : _ctx(ctx), _sm(ctx.getSourceManager()), _diags(ctx.getDiagnostics()), _id(_diags), _opts(opts),
        _report(report) {}

  bool shouldVisitTemplateInstantiations() const { return true; }
  bool shouldVisitImplicitCode() const { return true; }

  void run() {
    TraverseDecl(_ctx.getTranslationUnitDecl());
    report_recursion();
    fill_callees();
  }

  // ---- traversal state ------------------------------------------------------------------------
  bool TraverseDecl(Decl* d) {
    auto* fn = dyn_cast_or_null<FunctionDecl>(d);
    if (fn == nullptr) return base::TraverseDecl(d);
    const auto saved = _state;
    const bool dependent = fn->isDependentContext();
    const auto* method = dyn_cast<CXXMethodDecl>(fn);
    if (dependent) ++_state.dependent;
    if (fn->isImplicit() && (method == nullptr || !isLambdaCallOperator(method))) ++_state.implicit;
    _state.fn = in_graph(fn) && fn->doesThisDeclarationHaveABody() ? std::optional(_graph.node_of(fn)) : std::nullopt;
    if (_state.fn) _graph.nodes[*_state.fn].fn = fn;
    _state.float_depth = 0;
    const bool r = base::TraverseDecl(d);
    _state = saved;
    return r;
  }

  // Data recursion off (no queue parameter): the depth counters below must cover children.
  bool TraverseStmt(Stmt* s) {
    if (s == nullptr) return true;
    bool counted = false;
    if (const auto* e = dyn_cast<Expr>(s); e != nullptr && ebpf_rules_apply(e)) {
      if (_float_reported.count(e) != 0) {
        counted = true;
      } else if (_state.float_depth == 0) {
        const auto* b = dyn_cast<BinaryOperator>(e);
        const SourceLocation loc = b != nullptr ? b->getOperatorLoc() : e->getBeginLoc();
        if (const auto kind = float_operation(e); kind && is_user(loc)) {
          if (fresh(_id.float_op, loc)) report(loc, _id.float_op) << static_cast<int>(*kind);
          counted = true;
        }
      }
    }
    if (counted) ++_state.float_depth;
    const bool r = base::TraverseStmt(s);
    if (counted) --_state.float_depth;
    return r;
  }

  bool TraverseUnaryExprOrTypeTraitExpr(UnaryExprOrTypeTraitExpr* e) {
    return unevaluated([&] { return base::TraverseUnaryExprOrTypeTraitExpr(e); });
  }
  bool TraverseCXXNoexceptExpr(CXXNoexceptExpr* e) {
    return unevaluated([&] { return base::TraverseCXXNoexceptExpr(e); });
  }
  bool TraverseDecltypeTypeLoc(DecltypeTypeLoc tl) {
    return unevaluated([&] { return base::TraverseDecltypeTypeLoc(tl); });
  }
  bool TraverseStaticAssertDecl(StaticAssertDecl* d) {
    return unevaluated([&] { return base::TraverseStaticAssertDecl(d); });
  }
  bool TraverseRequiresExpr(RequiresExpr* e) {
    return unevaluated([&] { return base::TraverseRequiresExpr(e); });
  }
  bool TraverseConceptSpecializationExpr(ConceptSpecializationExpr* e) {
    return unevaluated([&] { return base::TraverseConceptSpecializationExpr(e); });
  }

  // ---- exceptions, RTTI, heap, control flow, asm ------------------------------------------------
  bool VisitCXXThrowExpr(CXXThrowExpr* e) { return simple(_id.throw_expr, e->getThrowLoc()); }
  bool VisitCXXTryStmt(CXXTryStmt* s) { return simple(_id.try_stmt, s->getTryLoc()); }
  bool VisitCXXTypeidExpr(CXXTypeidExpr* e) { return simple(_id.typeid_expr, e->getBeginLoc()); }
  bool VisitCXXDynamicCastExpr(CXXDynamicCastExpr* e) { return simple(_id.dynamic_cast_expr, e->getOperatorLoc()); }
  bool VisitAsmStmt(AsmStmt* s) { return simple(_id.inline_asm, s->getAsmLoc()); }
  bool VisitFileScopeAsmDecl(FileScopeAsmDecl* d) { return simple(_id.inline_asm, d->getAsmLoc()); }

  bool VisitGotoStmt(GotoStmt* s) {
    if (checked(s->getGotoLoc()) && fresh(_id.goto_stmt, s->getGotoLoc())) report(s->getGotoLoc(), _id.goto_stmt) << 0;
    return true;
  }
  bool VisitIndirectGotoStmt(IndirectGotoStmt* s) {
    if (checked(s->getGotoLoc()) && fresh(_id.goto_stmt, s->getGotoLoc())) report(s->getGotoLoc(), _id.goto_stmt) << 1;
    return true;
  }

  bool VisitCXXNewExpr(CXXNewExpr* e) {
    const FunctionDecl* op = e->getOperatorNew();
    if (op == nullptr && _state.dependent != 0) return true;  // decided in the instantiation
    if (op != nullptr && op->isReservedGlobalPlacementOperator()) return true;  // placement new allocates nothing
    if (checked(e->getBeginLoc()) && fresh(_id.heap_expr, e->getBeginLoc()))
      report(e->getBeginLoc(), _id.heap_expr) << (e->isArray() ? "new[]" : "new");
    return true;
  }
  bool VisitCXXDeleteExpr(CXXDeleteExpr* e) {
    if (checked(e->getBeginLoc()) && fresh(_id.heap_expr, e->getBeginLoc()))
      report(e->getBeginLoc(), _id.heap_expr) << (e->isArrayForm() ? "delete[]" : "delete");
    return true;
  }

  // ---- declarations -------------------------------------------------------------------------------
  bool VisitFunctionDecl(FunctionDecl* fn) {
    if (!checked(fn->getLocation())) return true;
    collect_handler(fn);
    if (const auto* m = dyn_cast<CXXMethodDecl>(fn); m != nullptr && m->isVirtual() && !m->isImplicit() &&
                                                      m->isFirstDecl() && fresh(_id.virtual_method, m->getLocation()))
      report(m->getLocation(), _id.virtual_method) << m;
    if (ebpf_rules_apply(nullptr) && fn->isFirstDecl() && has_float(fn->getReturnType()) &&
        fresh(_id.float_decl, fn->getLocation()))
      report(fn->getLocation(), _id.float_decl) << static_cast<int>(float_decl_kind::function) << fn << fn->getReturnType();
    return true;
  }

  bool VisitCXXRecordDecl(CXXRecordDecl* rd) {
    if (!checked(rd->getLocation()) || !rd->isThisDeclarationADefinition()) return true;
    for (const CXXBaseSpecifier& b : rd->bases()) {
      if (b.isVirtual() && fresh(_id.virtual_base, b.getBeginLoc())) report(b.getBeginLoc(), _id.virtual_base) << b.getType();
    }
    return true;
  }

  bool VisitFieldDecl(FieldDecl* f) {
    if (!checked(f->getLocation()) || !ebpf_rules_apply(nullptr) || f->getParent()->isLambda()) return true;
    if (has_float(f->getType()) && fresh(_id.float_decl, f->getLocation()))
      report(f->getLocation(), _id.float_decl) << static_cast<int>(float_decl_kind::field) << f << f->getType();
    return true;
  }

  bool VisitVarDecl(VarDecl* v) {
    if (v->isImplicit() || !checked(v->getLocation())) {
      local_destructor(v);
      return true;
    }
    const SourceLocation loc = v->getLocation();
    if (ebpf_rules_apply(nullptr) && has_float(v->getType()) && float_decl_reported_here(v)) {
      const auto kind = isa<ParmVarDecl>(v) ? float_decl_kind::parameter : float_decl_kind::variable;
      if (fresh(_id.float_decl, loc)) report(loc, _id.float_decl) << static_cast<int>(kind) << v << v->getType();
      if (v->getInit() != nullptr) _float_reported.insert(v->getInit());
    }
    if (isa<ParmVarDecl>(v)) return true;
    if (_ctx.getAsVariableArrayType(v->getType()) != nullptr && fresh(_id.vla, loc)) report(loc, _id.vla) << v;
    if (v->getTSCSpec() != TSCS_unspecified) {
      if (fresh(_id.thread_local_var, loc)) report(loc, _id.thread_local_var) << v;
      return true;
    }
    if (!v->hasGlobalStorage()) {
      local_destructor(v);
      return true;
    }
    if (v->getType()->isDependentType()) return true;
    QualType t = v->getType();
    if (t->isReferenceType()) t = t->getPointeeType();
    // A const object of a class with mutable members can still be written.
    const CXXRecordDecl* rec = t->getBaseElementTypeUnsafe()->getAsCXXRecordDecl();
    const bool has_mutable_member = rec != nullptr && rec->hasDefinition() && rec->hasMutableFields();
    const bool is_mutable = has_mutable_member || (!v->isConstexpr() && !t.isConstant(_ctx));
    std::optional<mutable_kind> kind;
    if (v->isStaticDataMember()) {
      if (v->isFirstDecl()) kind = mutable_kind::static_member;
    } else if (v->isStaticLocal()) {
      kind = mutable_kind::static_local;
    } else if (v->isThisDeclarationADefinition() != VarDecl::DeclarationOnly) {
      kind = mutable_kind::global;
    }
    if (is_mutable && kind) {
      if (fresh(_id.mutable_var, loc)) report(loc, _id.mutable_var) << static_cast<int>(*kind) << v;
      return true;
    }
    // Constants: no code may run to build or destroy them.
    if (!is_mutable && _state.dependent == 0 && !v->getDeclContext()->isDependentContext() &&
        v->isThisDeclarationADefinition() != VarDecl::DeclarationOnly && v->hasInit() &&
        !v->getInit()->isValueDependent() && !v->getInit()->containsErrors()) {
      const bool dynamic = !v->hasConstantInitialization() || v->needsDestruction(_ctx) != QualType::DK_none;
      if (dynamic && fresh(_id.dynamic_init, loc)) report(loc, _id.dynamic_init) << v;
    }
    return true;
  }

  bool VisitDeclRefExpr(DeclRefExpr* e) {
    const auto* v = dyn_cast<VarDecl>(e->getDecl());
    if (v == nullptr || !v->hasGlobalStorage() || !evaluated(e) || !checked(e->getLocation())) return true;
    if (v->getDefinition() != nullptr || v->isUsableInConstantExpressions(_ctx) || !is_rule_free_decl(v)) return true;
    if (fresh(_id.extern_var, e->getLocation())) {
      report(e->getLocation(), _id.extern_var) << v;
      report(v->getLocation(), _id.declared_here) << v;
    }
    return true;
  }

  // ---- calls ------------------------------------------------------------------------------------
  bool VisitCallExpr(CallExpr* e) {
    if (!evaluated(e)) return true;
    const SourceLocation loc = e->getExprLoc();
    FunctionDecl* callee = e->getDirectCallee();
    if (callee == nullptr) {
      if (isa<CXXPseudoDestructorExpr>(e->getCallee()->IgnoreParens()) || !checked(loc)) return true;
      if (fresh(_id.indirect_call, loc)) report(loc, _id.indirect_call) << (isa<CXXMemberCallExpr>(e) ? 1 : 0);
      return true;
    }
    edge_to(callee, loc);
    if (!checked(loc)) return true;
    if (const auto* m = dyn_cast<CXXMethodDecl>(callee); m != nullptr && m->isVirtual() && is_virtual_dispatch(e, m)) {
      if (fresh(_id.virtual_call, loc)) report(loc, _id.virtual_call) << m;
      return true;
    }
    if (const unsigned id = callee->getBuiltinID(); id != 0 && !_ctx.BuiltinInfo.isPredefinedLibFunction(id)) {
      check_builtin(e, callee, id, loc);
      return true;
    }
    check_callee(callee, loc);
    return true;
  }

  bool VisitCXXConstructExpr(CXXConstructExpr* e) {
    if (!evaluated(e)) return true;
    CXXConstructorDecl* ctor = e->getConstructor();
    edge_to(ctor, e->getLocation());
    if (checked(e->getLocation()) && !ctor->isTrivial()) check_callee(ctor, e->getLocation());
    return true;
  }

  bool VisitCXXBindTemporaryExpr(CXXBindTemporaryExpr* e) {
    if (!evaluated(e)) return true;
    if (const CXXDestructorDecl* d = e->getTemporary()->getDestructor()) destructor_call(d, e->getExprLoc());
    return true;
  }

  // ---- integer division ---------------------------------------------------------------------------
  bool VisitBinaryOperator(BinaryOperator* b) {
    const BinaryOperatorKind op = b->getOpcode();
    if (op != BO_Div && op != BO_Rem && op != BO_DivAssign && op != BO_RemAssign) return true;
    if (!evaluated(b) || !checked(b->getOperatorLoc())) return true;
    const auto* ca = dyn_cast<CompoundAssignOperator>(b);
    const QualType t = ca != nullptr ? ca->getComputationResultType() : b->getType();
    if (!t->isIntegerType()) return true;
    if (const auto v = b->getRHS()->getIntegerConstantExpr(_ctx); v && *v != 0) return true;
    if (fresh(_id.div_rem, b->getOperatorLoc()))
      report(b->getOperatorLoc(), _id.div_rem) << b->getOpcodeStr() << (op == BO_Div || op == BO_DivAssign ? "div" : "rem");
    return true;
  }

  // ---- eBPF loops ---------------------------------------------------------------------------------
  bool VisitWhileStmt(WhileStmt* s) {
    if (ebpf_rules_apply(nullptr) && checked(s->getWhileLoc()) && !known_false(s->getCond()))
      loop_error(s->getWhileLoc(), loop_kind::while_loop);
    return true;
  }
  bool VisitDoStmt(DoStmt* s) {
    if (ebpf_rules_apply(nullptr) && checked(s->getDoLoc()) && !known_false(s->getCond()))
      loop_error(s->getDoLoc(), loop_kind::do_loop);
    return true;
  }
  bool VisitCXXForRangeStmt(CXXForRangeStmt* s) {
    if (!ebpf_rules_apply(nullptr) || !checked(s->getForLoc())) return true;
    const Expr* range = s->getRangeInit();
    const ConstantArrayType* array =
        range != nullptr ? _ctx.getAsConstantArrayType(range->getType().getNonReferenceType()) : nullptr;
    if (array == nullptr) {
      loop_error(s->getForLoc(), loop_kind::range_for);
    } else if (array->getSize().ugt(_opts.max_unroll) && fresh(_id.loop_trips, s->getForLoc())) {
      report(s->getForLoc(), _id.loop_trips) << std::to_string(array->getSize().getZExtValue()) << _opts.max_unroll;
    }
    return true;
  }
  bool VisitForStmt(ForStmt* s) {
    if (!ebpf_rules_apply(nullptr) || !checked(s->getForLoc())) return true;
    const for_analysis a = analyze_for(s, _ctx, _opts.max_unroll);
    const SourceLocation loc = s->getForLoc();
    switch (a.what) {
    case for_analysis::verdict::bounded: break;
    case for_analysis::verdict::not_constant: loop_error(loc, loop_kind::for_loop); break;
    case for_analysis::verdict::modified:
      if (fresh(_id.loop_modified, loc)) report(loc, _id.loop_modified) << a.var;
      break;
    case for_analysis::verdict::too_many:
      if (fresh(_id.loop_trips, loc))
        report(loc, _id.loop_trips) << std::to_string(static_cast<std::uint64_t>(a.trips)) << _opts.max_unroll;
      break;
    }
    return true;
  }

private:
  struct state {
    std::optional<std::size_t> fn;  // call graph node of the function whose body is walked
    unsigned dependent = 0;         // inside a template pattern
    unsigned implicit = 0;          // inside compiler-generated code
    unsigned unevaluated = 0;       // sizeof, decltype, noexcept, static_assert, requires
    unsigned float_depth = 0;       // inside a reported floating-point expression
  };

  DiagnosticBuilder report(SourceLocation loc, unsigned id) { return _diags.Report(loc, id); }

  // First report of this diagnostic at this place (templates are walked once per instantiation).
  bool fresh(unsigned id, SourceLocation loc) {
    return _seen.insert({id, loc.getRawEncoding()}).second;
  }

  bool simple(unsigned id, SourceLocation loc) {
    if (checked(loc) && fresh(id, loc)) report(loc, id);
    return true;
  }

  template <class F> bool unevaluated(F&& traverse) {
    ++_state.unevaluated;
    const bool r = traverse();
    --_state.unevaluated;
    return r;
  }

  // The rules apply here: user code, not compiler-generated.
  bool checked(SourceLocation loc) { return _state.implicit == 0 && is_user(loc); }

  // Code that runs: not in a template pattern or an unevaluated operand.
  bool evaluated(const Expr* e) const {
    return _state.dependent == 0 && _state.unevaluated == 0 && !e->isInstantiationDependent() && !e->containsErrors();
  }

  bool ebpf_rules_apply(const Expr* e) const {
    if (_opts.tgt != target::ebpf || _state.implicit != 0) return false;
    return e != nullptr ? evaluated(e) : _state.dependent == 0 && _state.unevaluated == 0;
  }

  // Where a file comes from, by its real path: a file that merely ends in spin/handler.hpp, or
  // marks itself a system header, is user code like any other.
  enum class origin : std::uint8_t { user, api, builtin };
  static std::string real(llvm::StringRef path) {
    llvm::SmallString<256> out;
    if (llvm::sys::fs::real_path(path, out)) return path.str();
    return std::string(out.str());
  }
  origin origin_of(SourceLocation loc) {
    if (loc.isInvalid()) return origin::builtin;
    loc = _sm.getExpansionLoc(loc);
    const FileID file = _sm.getFileID(loc);
    if (auto it = _origins.find(file); it != _origins.end()) return it->second;
    static const std::string api_path = real(handler_include_dir() + "/spin/handler.hpp");
    static const std::string resource_dir = real(SPINC_CLANG_RESOURCE_DIR) + "/";
    origin o = origin::builtin;  // no file: the command line, a built-in buffer
    if (const OptionalFileEntryRef entry = _sm.getFileEntryRefForID(file)) {
      const std::string path = real(entry->getName());
      if (entry->getName() == prelude_path || path.rfind(resource_dir, 0) == 0)
        o = origin::builtin;
      else if (path == api_path)
        o = origin::api;
      else
        o = origin::user;
    }
    _origins.try_emplace(file, o);
    return o;
  }

  bool is_user(SourceLocation loc) { return origin_of(loc) == origin::user; }

  // Declared by the spin API header.
  bool is_api(const Decl* d) { return origin_of(d->getLocation()) == origin::api; }

  // A variable the rules may complain about (not the API's or a compiler header's).
  bool is_rule_free_decl(const Decl* d) { return is_user(d->getLocation()); }

  bool float_decl_reported_here(const VarDecl* v) const {
    if (const auto* p = dyn_cast<ParmVarDecl>(v)) {
      // Parameters once, at the first declaration of their function.
      const auto* fn = dyn_cast<FunctionDecl>(p->getDeclContext());
      return fn == nullptr || fn->isFirstDecl();
    }
    return true;
  }

  bool known_false(const Expr* cond) const {
    bool value = true;
    return cond != nullptr && !cond->isValueDependent() && cond->EvaluateAsBooleanCondition(value, _ctx) && !value;
  }

  void loop_error(SourceLocation loc, loop_kind kind) {
    if (fresh(_id.loop_bound, loc)) report(loc, _id.loop_bound) << static_cast<int>(kind);
  }

  bool is_virtual_dispatch(const CallExpr* e, const CXXMethodDecl* m) const {
    if (const auto* mc = dyn_cast<CXXMemberCallExpr>(e)) {
      if (const auto* me = dyn_cast<MemberExpr>(mc->getCallee()->IgnoreParens()); me != nullptr && me->hasQualifier())
        return false;  // S::f() is a direct call
      return m->getDevirtualizedMethod(mc->getImplicitObjectArgument(), false) == nullptr;
    }
    return isa<CXXOperatorCallExpr>(e) && !m->hasAttr<FinalAttr>() && !m->getParent()->hasAttr<FinalAttr>();
  }

  // Functions that get code of their own: defined, not a template pattern, not trivial, not in
  // a compiler header or the prelude.
  bool in_graph(const FunctionDecl* fn) {
    return fn->isDefined() && !fn->isDependentContext() && !fn->isConsteval() && !fn->isTrivial() &&
           origin_of(fn->getLocation()) != origin::builtin;
  }

  void edge_to(const FunctionDecl* callee, SourceLocation loc) {
    if (!_state.fn || callee == nullptr || !in_graph(callee)) return;
    _graph.add_edge(*_state.fn, _graph.node_of(callee), loc);
  }

  void destructor_call(const CXXDestructorDecl* d, SourceLocation loc) {
    edge_to(d, loc);
    if (checked(loc) && !d->isTrivial()) check_callee(d, loc);
  }

  void local_destructor(const VarDecl* v) {
    if (!v->hasLocalStorage() || isa<ParmVarDecl>(v) || _state.dependent != 0 || v->getType()->isDependentType()) return;
    const CXXRecordDecl* rd = v->getType()->getAsCXXRecordDecl();
    if (rd == nullptr || !rd->hasDefinition() || rd->hasTrivialDestructor()) return;
    if (const CXXDestructorDecl* d = rd->getDestructor()) destructor_call(d, v->getLocation());
  }

  // A direct call to a function that is not a compiler builtin.
  void check_callee(const FunctionDecl* callee, SourceLocation loc) {
    if (is_api(callee)) return;
    const IdentifierInfo* ident = callee->getIdentifier();
    const std::string_view name = ident != nullptr ? std::string_view(ident->getName()) : std::string_view();
    const OverloadedOperatorKind oo = callee->getOverloadedOperator();
    const bool heap_operator = oo == OO_New || oo == OO_Array_New || oo == OO_Delete || oo == OO_Array_Delete;
    if (callee->isDefined() && !heap_operator) return;
    // An instantiation clang failed to build has no body; clang reported that already.
    if (const FunctionDecl* pattern = callee->getTemplateInstantiationPattern(); pattern != nullptr && pattern->isDefined())
      return;
    if (heap_operator || is_heap_function(name)) {
      if (!(heap_operator && callee->isReservedGlobalPlacementOperator()) && fresh(_id.heap_call, loc))
        report(loc, _id.heap_call) << callee;
      return;
    }
    if (is_alloca_function(name)) {
      if (fresh(_id.alloca_call, loc)) report(loc, _id.alloca_call) << callee;
      return;
    }
    if (callee->isDefaulted() || callee->isDeleted()) return;
    if (fresh(_id.extern_call, loc)) {
      report(loc, _id.extern_call) << callee;
      if (callee->getLocation().isValid()) report(callee->getLocation(), _id.declared_here) << callee;
    }
  }

  void check_builtin(const CallExpr* e, const FunctionDecl* callee, unsigned id, SourceLocation loc) {
    const std::string_view base = strip_builtin_prefix(_ctx.BuiltinInfo.getName(id));
    if (is_alloca_function(base)) {
      if (fresh(_id.alloca_call, loc)) report(loc, _id.alloca_call) << callee;
      return;
    }
    if (is_heap_function(base)) {
      if (fresh(_id.heap_call, loc)) report(loc, _id.heap_call) << callee;
      return;
    }
    if (base == "memcpy" || base == "memset" || base == "memmove") {
      const bool constant_size = e->getNumArgs() == 3 && e->getArg(2)->getIntegerConstantExpr(_ctx).has_value();
      if (_opts.tgt == target::ebpf && !constant_size && fresh(_id.mem_builtin, loc))
        report(loc, _id.mem_builtin) << callee << std::string(base);
      return;
    }
    if (_ctx.BuiltinInfo.isLibFunction(id) && !is_inline_lib_builtin(base) && fresh(_id.lib_builtin, loc))
      report(loc, _id.lib_builtin) << callee << std::string(base);
  }

  void collect_handler(const FunctionDecl* fn) {
    const auto* section = fn->getAttr<SectionAttr>();
    if (section == nullptr) return;
    const std::string name = section->getName().str();
    constexpr std::string_view prefix = ".spin.";
    if (name.rfind(prefix, 0) != 0 || name == ".spin.meta") return;
    const std::string rest = name.substr(prefix.size());
    const std::string kind = rest.substr(0, rest.find('.'));
    std::optional<handler_kind> k;
    if (kind == "header") k = handler_kind::header;
    if (kind == "payload") k = handler_kind::payload;
    if (kind == "completion") k = handler_kind::completion;
    const SourceLocation loc = fn->getLocation();
    if (!k) {
      if (fresh(_id.bad_section, section->getLocation())) report(section->getLocation(), _id.bad_section) << kind << name;
      return;
    }
    if (!fn->isThisDeclarationADefinition()) return;
    const PresumedLoc p = _sm.getPresumedLoc(_sm.getFileLoc(loc));
    handler_info h;
    h.name = fn->getNameAsString();
    h.kind = *k;
    h.section = name;
    h.file = p.isValid() ? p.getFilename() : "";
    h.line = p.isValid() ? p.getLine() : 0;
    h.col = p.isValid() ? p.getColumn() : 0;
    _report.handlers.push_back(std::move(h));
  }

  // ---- recursion: strongly connected components of the call graph (Tarjan) ---------------------
  void report_recursion() {
    const std::size_t n = _graph.nodes.size();
    constexpr std::size_t unvisited = SIZE_MAX;
    std::vector<std::size_t> order(n, unvisited), low(n, 0), stack;
    std::vector<bool> on_stack(n, false);
    std::vector<std::vector<std::size_t>> components;
    std::size_t counter = 0;
    // Iterative DFS: (node, next edge to follow).
    for (std::size_t root = 0; root < n; ++root) {
      if (order[root] != unvisited) continue;
      std::vector<std::pair<std::size_t, std::size_t>> dfs{{root, 0}};
      order[root] = low[root] = counter++;
      stack.push_back(root);
      on_stack[root] = true;
      while (!dfs.empty()) {
        auto& [v, next] = dfs.back();
        const auto& calls = _graph.nodes[v].calls;
        if (next < calls.size()) {
          const std::size_t w = calls[next++].first;
          if (order[w] == unvisited) {
            order[w] = low[w] = counter++;
            stack.push_back(w);
            on_stack[w] = true;
            dfs.emplace_back(w, 0);
          } else if (on_stack[w]) {
            low[v] = std::min(low[v], order[w]);
          }
          continue;
        }
        if (low[v] == order[v]) {
          std::vector<std::size_t> component;
          std::size_t w = 0;
          do {
            w = stack.back();
            stack.pop_back();
            on_stack[w] = false;
            component.push_back(w);
          } while (w != v);
          components.push_back(std::move(component));
        }
        const std::size_t done = v;
        dfs.pop_back();
        if (!dfs.empty()) low[dfs.back().first] = std::min(low[dfs.back().first], low[done]);
      }
    }
    // Report in source order.
    std::vector<std::vector<std::size_t>> cycles;
    for (auto& c : components) {
      if (std::any_of(c.begin(), c.end(), [&](std::size_t i) { return _graph.nodes[i].fn == nullptr; })) continue;
      const auto& calls = _graph.nodes[c.front()].calls;
      const bool self_loop = std::any_of(calls.begin(), calls.end(), [&](const auto& e) { return e.first == c.front(); });
      if (c.size() < 2 && !self_loop) continue;
      std::sort(c.begin(), c.end(), [&](std::size_t a, std::size_t b) { return before(a, b); });
      if (is_user(_graph.nodes[c.front()].fn->getLocation())) cycles.push_back(c);
    }
    std::sort(cycles.begin(), cycles.end(), [&](const auto& a, const auto& b) { return before(a.front(), b.front()); });
    for (const auto& c : cycles) report_cycle(c);
  }

  bool before(std::size_t a, std::size_t b) const {
    const SourceLocation la = _graph.nodes[a].fn->getLocation();
    const SourceLocation lb = _graph.nodes[b].fn->getLocation();
    return la != lb ? _sm.isBeforeInTranslationUnit(la, lb) : a < b;
  }

  // One cycle of the component `c` (sorted, c.front() first in the file), found by a breadth-first
  // search from c.front(): the error at its first call, a note at each other call.
  void report_cycle(const std::vector<std::size_t>& c) {
    const std::size_t start = c.front();
    const std::set<std::size_t> members(c.begin(), c.end());
    std::map<std::size_t, std::size_t> parent;
    std::deque<std::size_t> queue{start};
    std::optional<std::size_t> last;
    parent[start] = start;
    while (!queue.empty() && !last) {
      const std::size_t v = queue.front();
      queue.pop_front();
      for (const auto& [w, loc] : _graph.nodes[v].calls) {
        if (w == start) {
          last = v;
          break;
        }
        if (members.count(w) != 0 && parent.try_emplace(w, v).second) queue.push_back(w);
      }
    }
    if (!last) return;
    std::vector<std::size_t> path{start};  // start -> ... -> *last, then back to start
    for (std::size_t v = *last; v != start; v = parent[v]) path.insert(path.begin() + 1, v);
    path.push_back(start);
    std::string text;
    llvm::raw_string_ostream os(text);
    for (std::size_t i = 0; i < path.size(); ++i) {
      const FunctionDecl* fn = _graph.nodes[path[i]].fn;
      os << (i == 0 ? "" : " -> ");
      // A lambda by its place ("operator()<(lambda at f.cpp:4:12)>"), not by its closure type.
      if (const auto* m = dyn_cast<CXXMethodDecl>(fn); m != nullptr && isLambdaCallOperator(m))
        fn->getNameForDiagnostic(os, _ctx.getPrintingPolicy(), false);
      else
        os << fn->getQualifiedNameAsString();
    }
    os.flush();
    const auto call_site = [&](std::size_t from, std::size_t to) {
      for (const auto& [w, loc] : _graph.nodes[from].calls)
        if (w == to) return loc;
      return SourceLocation();
    };
    const SourceLocation first = call_site(path[0], path[1]);
    report(first, _id.recursion) << _graph.nodes[path[1]].fn;
    report(first, _id.cycle_note) << text;
    for (std::size_t i = 1; i + 1 < path.size(); ++i)
      report(call_site(path[i], path[i + 1]), _id.cycle_edge_note) << _graph.nodes[path[i]].fn << _graph.nodes[path[i + 1]].fn;
  }

  void fill_callees() {
    ASTNameGenerator names(_ctx);
    std::vector<std::string> mangled(_graph.nodes.size());
    for (std::size_t i = 0; i < _graph.nodes.size(); ++i)
      if (_graph.nodes[i].fn != nullptr) mangled[i] = names.getName(_graph.nodes[i].fn);
    for (std::size_t i = 0; i < _graph.nodes.size(); ++i) {
      if (mangled[i].empty()) continue;
      std::vector<std::string>& out = _report.callees[mangled[i]];
      for (const auto& [w, loc] : _graph.nodes[i].calls)
        if (!mangled[w].empty()) out.push_back(mangled[w]);
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
    }
  }

  ASTContext& _ctx;
  SourceManager& _sm;
  DiagnosticsEngine& _diags;
  diag_ids _id;
  const check_options& _opts;
  check_report& _report;
  state _state;
  call_graph _graph;
  std::set<std::pair<unsigned, unsigned>> _seen;
  llvm::DenseSet<const Expr*> _float_reported;  // initializers of reported float variables
  llvm::DenseMap<FileID, origin> _origins;  // cache of origin_of
};

} // namespace

void run_rules(clang::ASTContext& ctx, const check_options& opts, check_report& report) {
  rule_visitor v(ctx, opts, report);
  v.run();
}

} // namespace spin::cc::detail
