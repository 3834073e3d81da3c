// spinc builder: checks a handler file, compiles it with clang-16 for a target, verifies the
// object and writes a handler package (design brief section 6, issue 3, docs/handler-package.md).
//
// The pipeline of `build_package`:
//   1. the checker (check.hpp) rejects constructs outside the handler subset and lists the
//      handlers;
//   2. clang-16 compiles the file with flags spinc forces (freestanding, no exceptions, RTTI or
//      stack protector, null checks kept, -O2, paths made relative with -ffile-prefix-map). Native: a PIC object
//      linked by lld into a shared object that exports only the handlers, with spinc's own
//      hidden memcpy/memmove/memset/memcmp for the calls clang emits for struct copies. eBPF:
//      LLVM IR, in which spinc marks every non-handler function always_inline (rte_bpf cannot
//      run BPF-to-BPF calls) and drops the member-function entries of struct debug info (clang
//      16's BTF writer crashes on them), then a BPF object with BTF (libbpf needs it for the
//      spin_bpf_* externs);
//   3. the object is verified: native: no undefined symbols, exactly the handlers exported,
//      each in its ".spin.<kind>.<name>" section; eBPF: libbpf lists exactly the handlers as
//      programs in their sections, every call goes to a spin_bpf_* extern, no other relocation,
//      no loop left (DPDK's validator rejects every cycle of jumps);
//   4. per handler the worst-case stack is computed from clang's -fstack-usage frames and the
//      object's call graph, and checked against the stack limit;
//   5. the package: manifest (target, march, compiler, source name and SHA-256, SPIN_MEMORY
//      sizes, handlers with kinds and stack bytes, stack limit) and the object. The same source
//      and options give byte-identical packages, whatever the working or temporary directory.
//
// Control path only; build_package runs subprocesses and may take seconds. Calls from several
// threads at once are not tested (the checker's and libbpf's global state).
#pragma once

#include <spin/cc/check.hpp>
#include <spin/rt/package.hpp>
#include <spin/result.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace spin::cc {

/// Default `--stack-limit` of native handlers: PsPIN's HPU stack (bytes).
inline constexpr std::uint32_t native_default_stack_limit_bytes = 1024;
/// Default `--stack-limit` of eBPF handlers: the BPF stack (bytes). clang itself refuses larger
/// BPF frames.
inline constexpr std::uint32_t ebpf_default_stack_limit_bytes = 512;

/// The stack limit `build_package` applies for `tgt` when the options give 0.
constexpr std::uint32_t default_stack_limit_bytes(target tgt) {
  return tgt == target::ebpf ? ebpf_default_stack_limit_bytes : native_default_stack_limit_bytes;
}

/// How much `build_package` tells `build_options::log`.
enum class verbosity {
  quiet,    ///< nothing
  commands, ///< each clang command line, shell-quoted, before it runs
};

/// Options of `build_package`.
struct build_options {
  target tgt = target::native;
  /// -march of the native object: "x86-64", "x86-64-v2", "x86-64-v3" or "x86-64-v4", the levels
  /// the loader can check a CPU against (docs/handler-package.md); not used for eBPF.
  std::string march = "x86-64-v2";
  /// Largest worst-case stack per handler (bytes); 0 = default_stack_limit_bytes(tgt).
  std::uint32_t stack_limit_bytes = 0;
  /// -I directories, searched after the handler API's directory. Relative paths are taken
  /// from the current directory and made absolute.
  std::vector<std::string> include_dirs;
  /// -D macros: "NAME" or "NAME=VALUE".
  std::vector<std::string> defines;
  /// Native only: also build the counted object (rt::package::counted_object): the handlers
  /// compiled without vectorisation, each function adding the instructions a modelled HPU
  /// executes to the exported counter rt::instruction_counter_symbol (docs/virtual-time.md,
  /// "Handler cost"). A runtime in virtual time runs it instead of the plain object. Each
  /// handler's stack is checked in both objects. eBPF: not_supported.
  bool count_instructions = false;
  verbosity verbose = verbosity::quiet;
  /// Receives the `verbose` output, one line per call; when empty it goes to stderr.
  std::function<void(const std::string&)> log;
};

/// The checker options `build_package` uses for `opts` (target, -I, -D), for a check alone
/// (`spinc --check-only`, `--verify`).
check_options make_check_options(const build_options& opts);

/// "spinc <project version> (clang <clang version>)", the manifest's compiler string.
std::string compiler_version();

/// Builds the handler package of the source file `source_path` (steps above).
///
/// The checker prints its diagnostics to stderr itself; every other problem is in the returned
/// error's message: clang-style diagnostics ("file:line:col: error: ...") for problems in the
/// user's code, otherwise a sentence naming the problem. Error codes:
///   - errc::invalid_argument: the source is rejected: checker errors (the message counts
///     them), no handler or two of one kind, clang's compile or link errors (clang's stderr
///     included), an object that fails verification (undefined symbol, call to memcpy or a
///     non-API function, BPF loop, data relocation), a handler over the stack limit;
///   - errc::not_found: the source file cannot be read, or clang-16 cannot be run (the
///     message names the path; SPINC_CLANG in the environment overrides clang's path);
///   - errc::not_supported: `march` is not one of the four x86-64 levels;
///   - errc::bad_state: an internal failure (temporary directory, clang killed by a signal,
///     output that spinc cannot parse).
/// Temporary files live in a fresh directory under $TMPDIR (default /tmp), removed before
/// returning.
result<rt::package> build_package(const std::string& source_path, const build_options& opts);

} // namespace spin::cc
