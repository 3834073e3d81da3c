// spinc object inspection: facts about the objects clang produced for a handler file, read
// with LLVM's Object library (and libbpf for eBPF objects), so that spinc can verify them before
// it packages them (design brief section 6). Each function here only reads; none of them
// decides whether an object is acceptable: `build_package` (build.hpp) does.
//
// Control path only. Every function may be called from any thread, except that
// `inspect_bpf_object` swaps libbpf's process-wide print callback while it runs (it serialises
// its own calls; do not change libbpf's print callback from another thread meanwhile).
#pragma once

#include <spin/handler.hpp>
#include <spin/rt/package.hpp>
#include <spin/result.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace spin::cc {

/// What a handler file declares with SPIN_MEMORY, read from its ".spin.meta" section (a
/// `spin::memory_decl`: three little-endian u64: size_bytes, handler_mem_bytes,
/// scratchpad_bytes).
struct memory_facts {
  bool declared = false;              ///< the object has a ".spin.meta" section
  std::uint64_t handler_mem_bytes = 0; ///< 0 when not declared
  std::uint64_t scratchpad_bytes = 0;  ///< 0 when not declared
};

/// One ELF symbol.
struct elf_symbol {
  std::string name;
  std::string section;            ///< name of the section that defines it; "" when undefined
  std::uint64_t value = 0;        ///< st_value (address in a shared object, offset in a relocatable one)
  std::uint64_t size_bytes = 0;   ///< st_size
  bool function = false;          ///< STT_FUNC
  bool global = false;            ///< STB_GLOBAL or STB_WEAK
  bool defined = false;           ///< st_shndx != SHN_UNDEF
  bool default_visibility = false; ///< STV_DEFAULT
};

/// Facts about a linked native handler object (x86-64 ELF shared object).
struct native_object_facts {
  std::vector<elf_symbol> dynamic_symbols; ///< the dynamic symbol table without its null entry
  std::vector<std::string> undefined;      ///< names of the undefined dynamic symbols
  std::vector<elf_symbol> exported;        ///< defined, global, default-visibility dynamic symbols
  std::vector<std::string> sections;       ///< section names in file order
  memory_facts memory;
};

/// Reads the facts of a native handler object. Errors (errc::invalid_argument, the message
/// names the problem): not an ELF file, not 64-bit little-endian x86-64, not a shared object
/// (ET_DYN), a ".spin.meta" section that is not a 24-byte `memory_decl`.
result<native_object_facts> inspect_native_object(std::span<const std::byte> elf);

/// Direct calls among the functions of a relocatable x86-64 object (`clang -c`), read from its
/// relocations. Complete only when the object was compiled with -ffunction-sections: a call to a
/// function of the same section may be resolved by the assembler and leave no relocation, so
/// `shared_sections` lists the sections holding more than one function.
struct native_call_facts {
  /// Each defined function (symbol name) -> the functions it calls or jumps to (symbol names,
  /// undefined ones included, e.g. "memcpy"), each once, sorted.
  std::map<std::string, std::vector<std::string>> callees;
  std::map<std::string, std::string> section_of; ///< defined function -> its section
  std::vector<std::string> shared_sections;      ///< executable sections with several functions
  std::vector<elf_symbol> symbols;                ///< the symbol table without its null entry
};

/// Reads the call graph of a relocatable x86-64 object. Errors (errc::invalid_argument): not a
/// relocatable x86-64 ELF object, malformed relocations.
result<native_call_facts> inspect_native_relocatable(std::span<const std::byte> elf);

/// Where an eBPF instruction comes from, from the object's BTF line information (.BTF.ext).
struct source_line {
  std::string file;      ///< as clang recorded it (after -ffile-prefix-map); "" when unknown
  std::uint32_t line = 0; ///< 1-based; 0 when unknown
  std::uint32_t col = 0;  ///< 1-based; 0 when unknown
};

/// A relocated instruction of an eBPF program.
struct bpf_reference {
  std::uint32_t insn = 0; ///< index of the instruction in its program (8-byte slots)
  std::string symbol;     ///< the relocation's symbol (for a section symbol: the section name)
  bool call = false;      ///< the instruction is a call (BPF_JMP | BPF_CALL)
  bool external = false;  ///< the symbol is undefined in the object (an extern, e.g. spin_bpf_*)
  source_line where;
};

/// A loop of an eBPF program: a back edge of its control-flow graph, found as DPDK's rte_bpf
/// validator finds it (depth-first from the first instruction; an edge to an instruction still
/// on the search path closes a cycle). The validator rejects a program with any. A jump to an
/// earlier instruction that closes no cycle (clang often places a shared exit block early) is
/// not a loop.
struct bpf_loop {
  std::uint32_t insn = 0;   ///< index of the jump that closes the cycle
  std::uint32_t target = 0; ///< index of the instruction it jumps to (the loop's head)
  source_line where;        ///< line of the jump
};

/// One program (handler) of an eBPF object.
struct bpf_program_facts {
  std::string name;                 ///< program name as libbpf reports it (the function name)
  std::string section;              ///< its ELF section
  std::uint32_t insn_count = 0;     ///< 8-byte instruction slots (ld_imm64 counts 2)
  std::vector<bpf_reference> references; ///< relocated instructions (calls and data loads)
  std::vector<bpf_loop> loops;           ///< in the order the search finds them
  source_line where;                ///< line of the first instruction, when known
};

/// Facts about an eBPF handler object (BPF ELF relocatable object).
struct bpf_object_facts {
  bool has_btf = false;     ///< a ".BTF" section is present
  bool has_btf_ext = false; ///< a ".BTF.ext" section (function and line information) is present
  std::vector<bpf_program_facts> programs; ///< in libbpf's order
  std::vector<std::string> sections;       ///< section names in file order
  memory_facts memory;
};

/// Opens an eBPF object with libbpf (`bpf_object__open_mem`) and reads its programs, their
/// relocations and loops, with source lines from .BTF.ext. libbpf's messages are
/// captured, not printed. Errors (errc::invalid_argument): not a little-endian BPF ELF object,
/// libbpf refuses it (its warnings are in the message), a malformed ".spin.meta".
result<bpf_object_facts> inspect_bpf_object(std::span<const std::byte> elf);

/// One line of a clang `-fstack-usage` file (`<file>:<line>:<function>\t<bytes>\t<kind>`).
struct frame_usage {
  std::string function;    ///< symbol name as clang prints it (mangled for C++ linkage)
  std::uint32_t line = 0;  ///< line of the definition
  std::uint64_t bytes = 0; ///< fixed frame size, without the return address
  bool dynamic = false;    ///< "dynamic": the frame grows at run time (alloca, VLA)
};

/// Parses the text of a `.su` file. Errors (errc::invalid_argument): a line that does not have
/// the shape above (its number is named).
result<std::vector<frame_usage>> parse_stack_usage(std::string_view su_text);

/// Worst-case stack bytes of `root`: per_call_bytes + its frame + the largest worst case of
/// its callees, recursively. per_call_bytes is what a call adds besides the frame (the return
/// address: 8 on x86-64, 0 on BPF). Functions without a frame entry count 0 bytes (inlined
/// everywhere, or nothing to store). Errors (errc::invalid_argument): a cycle in the call graph
/// through `root` (its functions are named).
result<std::uint64_t> worst_case_stack(const std::string& root, const std::map<std::string, std::uint64_t>& frames,
                                       const std::map<std::string, std::vector<std::string>>& callees,
                                       std::uint64_t per_call_bytes);

/// A human-readable summary of a package's object for `spinc --inspect`: ELF kind and size,
/// exported handlers and sections (native) or programs, instruction counts and calls (eBPF).
/// Errors: as inspect_native_object / inspect_bpf_object.
result<std::string> describe_object(rt::package_target target, std::span<const std::byte> object);

} // namespace spin::cc
