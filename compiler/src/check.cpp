// spinc checker: runs clang (libTooling) on a handler file with spinc's forced arguments and
// hands the AST to the rules (check_rules.cpp).
#include "check_detail.hpp"

#include <clang/AST/ASTConsumer.h>
#include <clang/Basic/FileManager.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/FrontendAction.h>
#include <clang/Tooling/Tooling.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/VirtualFileSystem.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#ifndef SPINC_CLANG_RESOURCE_DIR
#error "SPINC_CLANG_RESOURCE_DIR (clang-16 -print-resource-dir) must be defined by the build"
#endif
#ifndef SPINC_HANDLERS_INCLUDE_DIR
#error "SPINC_HANDLERS_INCLUDE_DIR (handlers/include) must be defined by the build"
#endif

namespace spin::cc {

const std::string& handler_include_dir() {
  static const std::string dir = [] {
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) {
      const std::filesystem::path installed = exe.parent_path().parent_path() / "include";
      if (std::filesystem::exists(installed / "spin" / "handler.hpp", ec)) return installed.string();
    }
    return std::string(SPINC_HANDLERS_INCLUDE_DIR);
  }();
  return dir;
}

namespace {

// Handlers have no <typeinfo> (-nostdinc++); without a std::type_info clang rejects `typeid`
// with its own error, and spinc's diagnostic with a hint would never be shown.
constexpr const char* prelude_text = R"(#pragma clang system_header
namespace std {
class type_info {
public:
  const char* name() const noexcept { return _name; }
  bool operator==(const type_info& o) const noexcept { return this == &o; }
  bool before(const type_info& o) const noexcept { return this < &o; }
  decltype(sizeof 0) hash_code() const noexcept { return 0; }
private:
  const char* _name;
};
}
)";

class check_consumer : public clang::ASTConsumer {
public:
  check_consumer(const check_options& opts, check_report& report) : _opts(opts), _report(report) {}
  void HandleTranslationUnit(clang::ASTContext& ctx) override { detail::run_rules(ctx, _opts, _report); }

private:
  const check_options& _opts;
  check_report& _report;
};

class check_action : public clang::ASTFrontendAction {
public:
  check_action(const check_options& opts, check_report& report) : _opts(opts), _report(report) {}

  std::unique_ptr<clang::ASTConsumer> CreateASTConsumer(clang::CompilerInstance&, llvm::StringRef) override {
    return std::make_unique<check_consumer>(_opts, _report);
  }

  // Runs after the diagnostic client's EndSourceFile, where -verify compares the expectations.
  void EndSourceFileAction() override { _report.errors = getCompilerInstance().getDiagnosticClient().getNumErrors(); }

private:
  const check_options& _opts;
  check_report& _report;
};

std::vector<std::string> command_line(const std::string& path, const check_options& opts) {
  std::vector<std::string> args = {
      "clang++", "-fsyntax-only", "-x", "c++", "-std=c++20", "-ffreestanding", "-nostdinc++", "-nostdlibinc",
      // Parsed with exceptions and RTTI so that throw/try/typeid/dynamic_cast reach the rules
      // and get one diagnostic each, with a hint, instead of clang's "... disabled" errors.
      "-fexceptions", "-fcxx-exceptions", "-frtti",
      "-resource-dir", SPINC_CLANG_RESOURCE_DIR, "-I", handler_include_dir(),
      "-include", detail::prelude_path, "-ferror-limit=0",
      isatty(STDERR_FILENO) != 0 ? "-fcolor-diagnostics" : "-fno-color-diagnostics"};
  if (opts.tgt == target::ebpf) args.emplace_back("--target=bpf");
  if (opts.mode == diagnostics_mode::verify) {
    args.emplace_back("-Xclang");
    args.emplace_back("-verify");
  }
  args.insert(args.end(), opts.clang_args.begin(), opts.clang_args.end());
  args.push_back(path);
  return args;
}

} // namespace

const char* target_name(target t) { return t == target::ebpf ? "ebpf" : "native"; }

check_report check_file(const std::string& path, const check_options& opts) {
  check_report report;
  auto overlay = llvm::makeIntrusiveRefCnt<llvm::vfs::OverlayFileSystem>(llvm::vfs::getRealFileSystem());
  auto in_memory = llvm::makeIntrusiveRefCnt<llvm::vfs::InMemoryFileSystem>();
  overlay->pushOverlay(in_memory);
  in_memory->addFile(detail::prelude_path, 0, llvm::MemoryBuffer::getMemBuffer(prelude_text));
  // Reference-counted: the compiler instance holds a reference and drops it when done.
  auto files = llvm::makeIntrusiveRefCnt<clang::FileManager>(clang::FileSystemOptions(), overlay);

  clang::tooling::ToolInvocation invocation(command_line(path, opts),
                                            std::make_unique<check_action>(opts, report), files.get());
  const bool ran = invocation.run();
  report.ok = ran && report.errors == 0;
  if (!report.ok) report.errors = std::max(report.errors, 1u);
  return report;
}

} // namespace spin::cc
