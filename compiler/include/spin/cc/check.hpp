// spinc checker: rejects, before compiling, what a NIC cannot run (design brief section 6).
//
// The checker parses a handler file with clang (libTooling, LLVM 16) and reports every
// construct outside the handler subset of C++ as a clang diagnostic (file:line:col, the
// construct, and how to write it instead), all findings of a file in one run. It also hands
// the later stages (object build, stack sizing) the handlers of the file and its call graph.
#pragma once

#include <spin/handler.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace spin::cc {

/// Code a handler file is checked for. `ebpf` adds the rules of the eBPF target (no floating
/// point, every loop fully unrollable) and parses the file as clang -target bpf does, so that
/// the handler API's eBPF branch (`__bpf__`) is the one checked.
enum class target { native, ebpf };

/// Returns "native" or "ebpf".
const char* target_name(target t);

/// What happens to the diagnostics of a check.
enum class diagnostics_mode {
  print,   ///< printed to stderr as clang prints them (colors only when stderr is a terminal)
  verify,  ///< clang -verify: matched against `// expected-error {{...}}` comments of the file;
           ///< only mismatches are printed
};

/// Options of `check_file`.
struct check_options {
  target tgt = target::native;
  /// Extra clang arguments (-I, -D, -W...). They come after spinc's forced arguments
  /// (-std=c++20 -ffreestanding -nostdinc++ -nostdlibinc, the clang resource directory and the
  /// handler API's include directory), so an -std here overrides the default.
  std::vector<std::string> clang_args;
  /// eBPF target: largest trip count of a loop (each loop is fully unrolled).
  std::uint32_t max_unroll = 4096;
  diagnostics_mode mode = diagnostics_mode::print;
};

/// A handler of the checked file: a function in section ".spin.<kind>.<name>", as the
/// SPIN_HEADER_HANDLER / SPIN_PAYLOAD_HANDLER / SPIN_COMPLETION_HANDLER macros declare it.
struct handler_info {
  std::string name;     ///< symbol name (C linkage, so also the function's name)
  handler_kind kind = handler_kind::header;
  std::string section;  ///< ".spin.<kind>.<name>"
  std::string file;     ///< file of the definition, as clang names it
  unsigned line = 0;    ///< 1-based line of the handler's name
  unsigned col = 0;     ///< 1-based column of the handler's name
};

/// Result of checking one file.
struct check_report {
  /// True when the file is accepted: clang parsed it and no rule was broken. In
  /// diagnostics_mode::verify: every diagnostic was expected and every expectation was met.
  bool ok = false;
  /// Errors reported: clang's own and the checker's (diagnostics_mode::print), or the failed
  /// expectations (diagnostics_mode::verify). At least 1 when `ok` is false.
  unsigned errors = 0;
  /// Handlers in definition order.
  std::vector<handler_info> handlers;
  /// Call graph of the functions defined in the file (including the handler API's inline
  /// functions): mangled (linkage) name of each defined function -> mangled names of the
  /// defined functions it calls directly, each once, sorted. Handlers have C linkage, so their
  /// key is their plain name. Implicit destructor calls of locals and temporaries are edges too.
  std::map<std::string, std::vector<std::string>> callees;
};

/// Checks the handler source file `path` for `opts.tgt`. Prints the diagnostics to stderr (or
/// verifies them, `opts.mode`). A file that cannot be read or parsed is reported by clang and
/// gives ok == false. Each call runs its own clang instance and shares no state with other
/// calls; concurrent calls from several threads are not tested.
check_report check_file(const std::string& path, const check_options& opts);

/// The directory spinc puts first on every handler's include path (it holds spin/handler.hpp):
/// for an installed spinc, `<prefix>/include` beside its `<prefix>/bin` (found through
/// /proc/self/exe); else the source tree's handler headers this spinc was built with. Any
/// thread; computed once.
const std::string& handler_include_dir();

} // namespace spin::cc
