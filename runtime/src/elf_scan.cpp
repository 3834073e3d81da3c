#include "elf_scan.hpp"

#include <elf.h>

#include <cstring>

namespace spin::rt::detail {

result<elf_info> scan_elf(std::span<const std::byte> o) {
  auto bad = [](const std::string& what) { return fail(errc::invalid_argument, "object: " + what); };
  if (o.size() < sizeof(Elf64_Ehdr) || std::memcmp(o.data(), ELFMAG, SELFMAG) != 0) return bad("not an ELF file");
  Elf64_Ehdr eh;
  std::memcpy(&eh, o.data(), sizeof eh);
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB) return bad("not a 64-bit little-endian ELF file");
  elf_info info;
  info.machine = eh.e_machine;
  info.type = eh.e_type;
  if (eh.e_shnum == 0) return info;
  if (eh.e_shentsize != sizeof(Elf64_Shdr)) return bad("unexpected section header size " + std::to_string(eh.e_shentsize));
  const std::uint64_t table_bytes = std::uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr);
  if (eh.e_shoff > o.size() || table_bytes > o.size() - eh.e_shoff) return bad("section headers lie outside the file (truncated?)");
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  std::memcpy(sh.data(), o.data() + eh.e_shoff, table_bytes);
  if (eh.e_shstrndx >= eh.e_shnum) return bad("section name table index out of range");
  const Elf64_Shdr& strtab = sh[eh.e_shstrndx];
  if (strtab.sh_offset > o.size() || strtab.sh_size > o.size() - strtab.sh_offset) return bad("section name table lies outside the file");
  const char* names = reinterpret_cast<const char*>(o.data() + strtab.sh_offset);
  for (const auto& s : sh) {
    if (s.sh_name >= strtab.sh_size) return bad("a section name lies outside the name table");
    const std::size_t max = strtab.sh_size - s.sh_name;
    const std::size_t len = strnlen(names + s.sh_name, max);
    if (len == max) return bad("a section name is not terminated");
    if (s.sh_type != SHT_NOBITS && (s.sh_offset > o.size() || s.sh_size > o.size() - s.sh_offset))
      return bad("section '" + std::string(names + s.sh_name, len) + "' lies outside the file (truncated?)");
    info.sections.push_back(elf_section{std::string(names + s.sh_name, len), s.sh_type, s.sh_flags, s.sh_size});
  }
  for (const auto& s : sh) {
    if (s.sh_type != SHT_DYNSYM) continue;
    if (s.sh_link >= sh.size()) return bad("dynamic symbol table names a string table that does not exist");
    const Elf64_Shdr& str = sh[s.sh_link];
    if (str.sh_offset > o.size() || str.sh_size > o.size() - str.sh_offset) return bad("dynamic string table lies outside the file");
    const char* strs = reinterpret_cast<const char*>(o.data() + str.sh_offset);
    const std::size_t n = s.sh_size / sizeof(Elf64_Sym);
    for (std::size_t i = 1; i < n; ++i) {
      Elf64_Sym sym;
      std::memcpy(&sym, o.data() + s.sh_offset + i * sizeof(Elf64_Sym), sizeof sym);
      if (sym.st_name >= str.sh_size) return bad("a dynamic symbol name lies outside its string table");
      const std::size_t max = str.sh_size - sym.st_name;
      const std::size_t len = strnlen(strs + sym.st_name, max);
      if (len == max) return bad("a dynamic symbol name is not terminated");
      info.dynsyms.push_back(elf_dynsym{std::string(strs + sym.st_name, len), static_cast<std::uint8_t>(ELF64_ST_TYPE(sym.st_info)),
                                        static_cast<std::uint8_t>(ELF64_ST_BIND(sym.st_info)),
                                        static_cast<std::uint8_t>(ELF64_ST_VISIBILITY(sym.st_other)), sym.st_shndx != SHN_UNDEF});
    }
  }
  return info;
}

} // namespace spin::rt::detail
