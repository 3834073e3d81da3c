// Handler packages: the one file spinc writes and the runtime loads (docs/handler-package.md).
//
// A package is a fixed little-endian header, a JSON manifest and the compiled object (an
// x86-64 ELF shared object or a BPF ELF relocatable object); a native package built with
// `spinc --count-instructions` carries a second object, the same handlers counting the
// instructions a modelled HPU executes (virtual time, docs/virtual-time.md). The header carries
// a CRC-32 of manifest and objects, so a truncated or corrupted file is rejected with a message
// naming the problem. Encoding is deterministic: the same package value gives the same bytes.
//
// Control path only; every function may be called from any thread.
#pragma once

#include <spin/handler.hpp>
#include <spin/result.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace spin::rt {

/// Version of the package container (header + manifest keys) of a package without a counted
/// object. A reader refuses versions other than this and package_counted_format_version.
inline constexpr std::uint32_t package_format_version = 1;
/// Version of a package with a counted object (its header has two more fields).
inline constexpr std::uint32_t package_counted_format_version = 2;
/// Bytes of the fixed package header (version 1).
inline constexpr std::uint32_t package_header_bytes = 64;
/// Bytes of the fixed package header (version 2: the counted object's offset and length follow).
inline constexpr std::uint32_t package_counted_header_bytes = 80;
/// The symbol of a counted object's instruction counter: a 64-bit unsigned integer to which
/// every function of the object adds the instructions it executes (exact at every spin API call
/// and at each handler's return; docs/virtual-time.md, "Handler cost").
inline constexpr const char* instruction_counter_symbol = "spin_instructions";
/// The first 8 bytes of every package.
inline constexpr char package_magic[8] = {'S', 'P', 'I', 'N', 'P', 'K', 'G', '\0'};

/// What the object in a package is compiled for.
enum class package_target : std::uint32_t {
  native_x86_64 = 1, ///< ELF shared object for x86-64, called directly by HPU threads
  ebpf = 2,          ///< BPF ELF object, run by DPDK's rte_bpf (JIT or interpreter)
};

/// How the eBPF handlers of a package execute (a choice of the loader, rt/loader.hpp; here so
/// that the host client can name it without linking the loader).
enum class bpf_exec {
  jit,         ///< rte_bpf's x86-64 JIT; load fails with not_supported when the JIT is unavailable
  interpreter, ///< rte_bpf_exec, DPDK's interpreter
};

/// "x86_64" or "ebpf" (the manifest's spelling).
std::string_view to_string(package_target t);

/// One handler of a package.
struct package_handler {
  std::string name;                        ///< symbol name (C linkage)
  handler_kind kind = handler_kind::payload;
  std::uint32_t stack_bytes = 0;           ///< worst-case stack use, callees included (bytes)
  bool operator==(const package_handler&) const = default;
};

/// The manifest: what the package holds and how it was built.
struct package_manifest {
  std::uint32_t abi_version = spin::abi_version; ///< `spin::abi_version` the handlers were built for
  package_target target = package_target::native_x86_64;
  std::string march;                      ///< -march of a native object ("" for eBPF)
  std::string compiler;                   ///< e.g. "spinc 0.1.0 (clang 16.0.6)"
  std::string source_name;                ///< file name of the source (no directory)
  std::string source_sha256;              ///< SHA-256 of the source bytes, 64 lowercase hex digits
  std::uint64_t handler_mem_bytes = 0;    ///< handler memory the source declares (SPIN_MEMORY)
  std::uint64_t scratchpad_bytes = 0;     ///< scratchpad per message the source declares
  std::uint32_t stack_limit_bytes = 0;    ///< limit the stack sizes were checked against
  std::vector<package_handler> handlers;  ///< at most one per kind, in kind order
  bool operator==(const package_manifest&) const = default;
};

/// A package in memory.
struct package {
  package_manifest manifest;
  std::vector<std::byte> object;
  /// Native packages only, optional: the same handlers built to count their instructions
  /// (`spinc --count-instructions`), which a runtime in virtual time runs instead of `object`
  /// (rt::runtime_config::observer). Empty: none.
  std::vector<std::byte> counted_object;
};

/// Encodes `p` (header, manifest JSON with sorted keys, object, counted object). Same input,
/// same bytes. Format version 1 without a counted object, 2 with one.
std::vector<std::byte> encode_package(const package& p);

/// Decodes and validates a package. Errors (errc::invalid_argument unless stated), each with a
/// message naming the problem: shorter than the header ("truncated"), wrong magic ("not a
/// spinnic package"), unsupported format version (errc::not_supported), offsets or sizes that
/// do not fit the bytes ("truncated"), CRC mismatch ("corrupted"), a manifest that is not
/// JSON or lacks a key or has a value of the wrong type or range (the key is named), duplicate
/// handler kinds or names, a counted object in an eBPF package.
result<package> decode_package(std::span<const std::byte> bytes);

/// Largest package file read_package_file accepts (bytes).
inline constexpr std::uint64_t max_package_bytes = 256ull << 20;

/// Reads and decodes the package file at `path`. Errors: as decode_package, not_found (the file
/// cannot be opened, with the OS reason), invalid_argument (not a regular file, such as a FIFO
/// or a device, which is never waited on; larger than max_package_bytes; a read error).
result<package> read_package_file(const std::string& path);

/// Writes `p` to `path` (replacing it). Errors: invalid_argument when the file cannot be
/// written, with the OS reason.
result<void> write_package_file(const std::string& path, const package& p);

/// The ELF section that holds a handler's code: ".spin.<kind>.<name>" (what the handler API's
/// SPIN_*_HANDLER macros produce).
std::string handler_section(const package_handler& h);

/// "header", "payload" or "completion".
std::string_view to_string(handler_kind k);

/// The manifest as JSON text (the same text the package stores), for `spinc --inspect`.
std::string manifest_json(const package_manifest& m);

/// The EC sizes a package's handlers get (loaded_package::bind applies it): a zero size becomes
/// what the manifest declares (SPIN_MEMORY); a non-zero one stays. Errors: invalid_argument
/// when a non-zero size is smaller than the declared one (the message names the EC, the region
/// and both sizes); the sizes are then unchanged.
result<void> raise_to_declared(const package_manifest& m, std::string_view ec_name, std::uint64_t& handler_mem_bytes,
                               std::uint64_t& scratchpad_bytes);

} // namespace spin::rt
