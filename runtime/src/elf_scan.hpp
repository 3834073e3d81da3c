// A bounds-checked reader of ELF64 section headers (internal): enough for the loader to check
// that a package's object is what its manifest says before handing it to dlopen or rte_bpf.
#pragma once

#include <spin/result.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace spin::rt::detail {

struct elf_section {
  std::string name;
  std::uint32_t type = 0;
  std::uint64_t flags = 0;
  std::uint64_t size_bytes = 0;
};

struct elf_dynsym {
  std::string name;
  std::uint8_t type = 0;     ///< STT_*
  std::uint8_t bind = 0;     ///< STB_*
  std::uint8_t visibility = 0;  ///< STV_*
  bool defined = false;      ///< st_shndx != SHN_UNDEF
};

struct elf_info {
  std::uint16_t machine = 0;  ///< e_machine (EM_X86_64 = 62, EM_BPF = 247)
  std::uint16_t type = 0;     ///< e_type (ET_REL = 1, ET_DYN = 3)
  std::vector<elf_section> sections;
  std::vector<elf_dynsym> dynsyms;  ///< the dynamic symbol table without its null entry
};

/// Reads the ELF header and section headers of `o`. Errors (invalid_argument): not ELF, not
/// 64-bit little-endian, a header, name table or dynamic symbol table that lies outside the
/// bytes.
result<elf_info> scan_elf(std::span<const std::byte> o);

} // namespace spin::rt::detail
