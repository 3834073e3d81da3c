// Loading handler packages: checks a package against this runtime and makes its handlers
// callable, as native code (dlopen of the x86-64 shared object) or as eBPF programs (DPDK's
// rte_bpf_elf_load relocates, validates and JIT-compiles each handler; the handler API reaches
// the runtime through rte_bpf external symbols; spinc has checked the object with libbpf). docs/handler-package.md
// describes the checks; docs/handler-guide.md the eBPF rules.
//
// Control path. load_package may be called from any thread; a loaded_package is immutable and
// may be shared. Its code stays loaded while any copy of it, or of an ec_config / handler_set
// bound from it, exists (installed ECs keep it alive).
#pragma once

#include <spin/rt/package.hpp>
#include <spin/result.hpp>
#include <spin/rt/runtime.hpp>

#include <memory>
#include <string>

namespace spin::rt {

/// Options of load_package.
struct load_options {
  bpf_exec bpf = bpf_exec::jit;  ///< ignored for native packages
};

namespace detail {
struct loaded_code;
}

/// A package whose handlers are ready to run.
class loaded_package {
public:
  const package_manifest& manifest() const;
  /// The bound handlers (null for kinds the package lacks) and the guard memory they need.
  const handler_set& handlers() const;
  /// Binds the handlers to an EC configuration: sets cfg.handlers and makes cfg's handler
  /// memory and scratchpad at least what the package declares (SPIN_MEMORY), raising a zero
  /// size to the declared one. Errors: invalid_argument when cfg asks for less (non-zero) memory
  /// than the package declares, naming the region and both sizes.
  result<void> bind(ec_config& cfg) const;

private:
  friend result<loaded_package> load_package(const package&, const load_options&);
  std::shared_ptr<const detail::loaded_code> _code;
};

/// Loads `p`. Errors, each with a message naming the problem:
///   not_supported: the handler ABI version differs from `spin::abi_version`; a native package
///     is for another machine (not x86-64, or a -march level whose instructions this CPU
///     lacks); the eBPF JIT is unavailable and `opts.bpf` asks for it.
///   invalid_argument: the object is not what the manifest says (not an ELF object of the
///     target's kind, a handler of the manifest is missing or has the wrong section, the object
///     has handlers the manifest does not list); a native object has load-time code, an ifunc,
///     an undefined symbol or an export that is not a handler, or dlopen refuses it; rte_bpf's
///     validator rejects a handler (its log is quoted: out-of-window access, loop, unknown
///     external symbol).
///   no_memory: the code cannot be mapped.
result<loaded_package> load_package(const package& p, const load_options& opts = {});

/// read_package_file + load_package; errors of both, prefixed with the path.
result<loaded_package> load_package_file(const std::string& path, const load_options& opts = {});

} // namespace spin::rt
