// Object inspection for spinc: ELF facts via LLVM's Object library, eBPF programs via libbpf.
#include <spin/cc/object.hpp>

#include <bpf/libbpf.h>
#include <llvm/BinaryFormat/ELF.h>
#include <llvm/Object/ELFObjectFile.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBufferRef.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

namespace spin::cc {
namespace {

using elf_file = llvm::object::ELF64LEObjectFile;

template <class T> std::string take_message(llvm::Expected<T>& e) { return llvm::toString(e.takeError()); }

llvm::StringRef as_ref(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

std::uint32_t read_u32(llvm::StringRef s, std::size_t off) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(s[off + static_cast<std::size_t>(i)]);
  return v;
}

std::uint64_t read_u64(llvm::StringRef s, std::size_t off) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(s[off + static_cast<std::size_t>(i)]);
  return v;
}

// Opens `bytes` as a 64-bit little-endian ELF file of machine `machine`.
result<std::unique_ptr<elf_file>> open_elf(std::span<const std::byte> bytes, std::uint16_t machine, const char* what) {
  if (bytes.size() < 4 || std::memcmp(bytes.data(), "\x7f" "ELF", 4) != 0)
    return fail(errc::invalid_argument, std::string(what) + ": not an ELF file");
  auto obj = elf_file::create(llvm::MemoryBufferRef(as_ref(bytes), what));
  if (!obj)
    return fail(errc::invalid_argument, std::string(what) + ": not a 64-bit little-endian ELF file (" + take_message(obj) + ")");
  if (obj->getELFFile().getHeader().e_machine != machine)
    return fail(errc::invalid_argument, std::string(what) + ": ELF machine " + std::to_string(obj->getELFFile().getHeader().e_machine) +
                                            ", expected " + std::to_string(machine));
  return std::make_unique<elf_file>(std::move(*obj));
}

result<std::vector<std::string>> section_names(const elf_file& obj) {
  std::vector<std::string> names;
  for (const llvm::object::SectionRef& s : obj.sections()) {
    auto name = s.getName();
    if (!name) return fail(errc::invalid_argument, "malformed section name: " + take_message(name));
    names.push_back(name->str());
  }
  return names;
}

// Reads ".spin.meta" (a spin::memory_decl) when present.
result<memory_facts> read_memory(const elf_file& obj) {
  memory_facts m;
  for (const llvm::object::SectionRef& s : obj.sections()) {
    auto name = s.getName();
    if (!name || *name != ".spin.meta") continue;
    auto data = s.getContents();
    if (!data) return fail(errc::invalid_argument, ".spin.meta: " + take_message(data));
    if (data->size() != sizeof(memory_decl) || read_u64(*data, 0) != sizeof(memory_decl))
      return fail(errc::invalid_argument, ".spin.meta holds " + std::to_string(data->size()) +
                                              " bytes, expected one spin::memory_decl of " +
                                              std::to_string(sizeof(memory_decl)) + " (declare SPIN_MEMORY once per file)");
    m.declared = true;
    m.handler_mem_bytes = read_u64(*data, 8);
    m.scratchpad_bytes = read_u64(*data, 16);
  }
  return m;
}

result<elf_symbol> symbol_facts(const elf_file& obj, const llvm::object::ELFSymbolRef& sym) {
  elf_symbol out;
  auto name = sym.getName();
  if (!name) return fail(errc::invalid_argument, "malformed symbol name: " + take_message(name));
  out.name = name->str();
  auto value = sym.getValue();
  if (!value) return fail(errc::invalid_argument, "symbol '" + out.name + "': " + take_message(value));
  out.value = *value;
  out.size_bytes = sym.getSize();
  out.function = sym.getELFType() == llvm::ELF::STT_FUNC;
  out.global = sym.getBinding() == llvm::ELF::STB_GLOBAL || sym.getBinding() == llvm::ELF::STB_WEAK;
  out.default_visibility = (sym.getOther() & 0x3) == llvm::ELF::STV_DEFAULT;
  auto sec = sym.getSection();
  if (!sec) return fail(errc::invalid_argument, "symbol '" + out.name + "': " + take_message(sec));
  auto flags = sym.getFlags();
  if (!flags) return fail(errc::invalid_argument, "symbol '" + out.name + "': " + take_message(flags));
  out.defined = (*flags & llvm::object::BasicSymbolRef::SF_Undefined) == 0;
  if (*sec != obj.section_end()) {
    auto sname = (*sec)->getName();
    if (!sname) return fail(errc::invalid_argument, "symbol '" + out.name + "': " + take_message(sname));
    out.section = sname->str();
  }
  return out;
}

bool is_null_symbol(const llvm::object::SymbolRef& s) { return s.getRawDataRefImpl().d.b == 0; }

// ---- BTF line information ------------------------------------------------------------------

struct line_record {
  std::uint32_t insn_off_bytes;
  source_line where;
};

// Line records per section name, sorted by offset, from .BTF (strings) and .BTF.ext (records).
// Malformed or missing data gives an empty map: line numbers only improve messages.
std::map<std::string, std::vector<line_record>> read_line_info(const elf_file& obj) {
  std::map<std::string, std::vector<line_record>> out;
  std::optional<llvm::StringRef> btf, ext;
  for (const llvm::object::SectionRef& s : obj.sections()) {
    auto name = s.getName();
    if (!name) continue;
    if (*name == ".BTF" || *name == ".BTF.ext") {
      auto data = s.getContents();
      if (!data) continue;
      (*name == ".BTF" ? btf : ext) = *data;
    }
  }
  if (!btf || !ext || btf->size() < 24 || ext->size() < 24) return out;
  // .BTF header: magic u16, version u8, flags u8, hdr_len, type_off, type_len, str_off, str_len.
  if (static_cast<std::uint8_t>((*btf)[0]) != 0x9f || static_cast<std::uint8_t>((*btf)[1]) != 0xeb) return out;
  const std::uint64_t str_begin = std::uint64_t{read_u32(*btf, 4)} + read_u32(*btf, 16);
  const std::uint64_t str_len = read_u32(*btf, 20);
  if (str_begin + str_len > btf->size()) return out;
  const llvm::StringRef strings = btf->substr(str_begin, str_len);
  auto string_at = [&](std::uint32_t off) -> std::string {
    if (off >= strings.size()) return {};
    const llvm::StringRef rest = strings.substr(off);
    return rest.substr(0, rest.find('\0')).str();
  };
  // .BTF.ext header: magic, version, flags, hdr_len, func_info_off, func_info_len,
  // line_info_off, line_info_len (offsets after the header).
  const std::uint64_t hdr_len = read_u32(*ext, 4);
  const std::uint64_t li_begin = hdr_len + read_u32(*ext, 16);
  const std::uint64_t li_len = read_u32(*ext, 20);
  if (li_len < 4 || li_begin + li_len > ext->size()) return out;
  const llvm::StringRef li = ext->substr(li_begin, li_len);
  const std::uint32_t rec_size = read_u32(li, 0);
  if (rec_size < 16) return out;
  std::size_t pos = 4;
  while (pos + 8 <= li.size()) {
    const std::string sec = string_at(read_u32(li, pos));
    const std::uint64_t n = read_u32(li, pos + 4);
    pos += 8;
    if (pos + n * rec_size > li.size()) return out;
    std::vector<line_record>& recs = out[sec];
    for (std::uint64_t i = 0; i < n; ++i, pos += rec_size) {
      const std::uint32_t line_col = read_u32(li, pos + 12);
      recs.push_back({read_u32(li, pos), {string_at(read_u32(li, pos + 4)), line_col >> 10, line_col & 0x3ff}});
    }
    std::stable_sort(recs.begin(), recs.end(),
                     [](const line_record& a, const line_record& b) { return a.insn_off_bytes < b.insn_off_bytes; });
  }
  return out;
}

source_line line_of(const std::map<std::string, std::vector<line_record>>& lines, const std::string& section,
                    std::uint64_t off_bytes) {
  auto it = lines.find(section);
  if (it == lines.end()) return {};
  const line_record* best = nullptr;
  for (const line_record& r : it->second) {
    if (r.insn_off_bytes > off_bytes) break;
    if (r.where.line != 0) best = &r;
  }
  return best != nullptr ? best->where : source_line{};
}

// ---- libbpf --------------------------------------------------------------------------------

std::mutex libbpf_mutex;
std::string* libbpf_log = nullptr; // guarded by libbpf_mutex

int capture_libbpf(enum libbpf_print_level level, const char* format, va_list args) {
  if (level == LIBBPF_DEBUG || libbpf_log == nullptr) return 0;
  char buf[1024];
  const int n = std::vsnprintf(buf, sizeof buf, format, args);
  if (n > 0) libbpf_log->append(buf, std::min<std::size_t>(static_cast<std::size_t>(n), sizeof buf - 1));
  return 0;
}

struct program_entry {
  std::string name, section;
  std::uint32_t insn_count;
};

result<std::vector<program_entry>> libbpf_programs(std::span<const std::byte> elf) {
  std::lock_guard lock(libbpf_mutex);
  std::string log;
  libbpf_log = &log;
  const libbpf_print_fn_t previous = libbpf_set_print(capture_libbpf);
  bpf_object* bo = bpf_object__open_mem(elf.data(), elf.size(), nullptr);
  const int err = bo == nullptr ? errno : 0;
  std::vector<program_entry> programs;
  if (bo != nullptr) {
    bpf_program* p = nullptr;
    bpf_object__for_each_program(p, bo) {
      programs.push_back({bpf_program__name(p), bpf_program__section_name(p),
                          static_cast<std::uint32_t>(bpf_program__insn_cnt(p))});
    }
    bpf_object__close(bo);
  }
  libbpf_set_print(previous);
  libbpf_log = nullptr;
  if (bo == nullptr) {
    while (!log.empty() && log.back() == '\n') log.pop_back();
    return fail(errc::invalid_argument, "libbpf refuses the eBPF object (" + std::string(std::strerror(err)) + ")" +
                                            (log.empty() ? std::string() : ":\n" + log));
  }
  return programs;
}

// Back edges of a BPF program's control-flow graph: depth-first from instruction 0, an edge to
// an instruction on the search path closes a cycle (DPDK's bpf_validate.c does the same).
std::vector<std::pair<std::uint32_t, std::uint32_t>> back_edges(llvm::StringRef code) {
  const std::uint32_t n = static_cast<std::uint32_t>(code.size() / 8);
  auto successors = [&](std::uint32_t i, std::uint32_t out[2]) -> int {
    const auto opcode = static_cast<std::uint8_t>(code[std::size_t{i} * 8]);
    const std::uint8_t cls = opcode & 0x07, op = opcode & 0xf0;
    const std::uint32_t next = i + (opcode == 0x18 ? 2 : 1); // ld_imm64 takes two slots
    if (cls != 0x05 && cls != 0x06) {
      out[0] = next;
      return 1;
    }
    if (op == 0x90) return 0; // exit
    if (op == 0x80) {         // call
      out[0] = next;
      return 1;
    }
    const auto off = static_cast<std::int16_t>(static_cast<std::uint16_t>(
        static_cast<std::uint8_t>(code[std::size_t{i} * 8 + 2]) | (static_cast<std::uint8_t>(code[std::size_t{i} * 8 + 3]) << 8)));
    const std::int64_t target = std::int64_t{i} + 1 + off;
    int k = 0;
    if (op != 0x00) out[k++] = next; // conditional: falls through too
    if (target >= 0) out[k++] = static_cast<std::uint32_t>(target);
    return k;
  };
  std::vector<std::pair<std::uint32_t, std::uint32_t>> found;
  if (n == 0) return found;
  enum : std::uint8_t { white, grey, black };
  std::vector<std::uint8_t> colour(n, white);
  struct frame {
    std::uint32_t node;
    std::uint32_t succ[2];
    int count, next;
  };
  std::vector<frame> stack;
  auto push = [&](std::uint32_t node) {
    frame f{node, {0, 0}, 0, 0};
    f.count = successors(node, f.succ);
    colour[node] = grey;
    stack.push_back(f);
  };
  push(0);
  while (!stack.empty()) {
    frame& f = stack.back();
    if (f.next == f.count) {
      colour[f.node] = black;
      stack.pop_back();
      continue;
    }
    const std::uint32_t s = f.succ[f.next++];
    if (s >= n) continue; // out of the program: the validator refuses it for another reason
    if (colour[s] == grey) found.emplace_back(f.node, s);
    else if (colour[s] == white) push(s);
  }
  return found;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

} // namespace

result<native_object_facts> inspect_native_object(std::span<const std::byte> elf) {
  auto obj = open_elf(elf, llvm::ELF::EM_X86_64, "native object");
  if (!obj) return obj.err();
  const elf_file& o = **obj;
  if (o.getELFFile().getHeader().e_type != llvm::ELF::ET_DYN)
    return fail(errc::invalid_argument, "native object: not a shared object (ELF type " +
                                            std::to_string(o.getELFFile().getHeader().e_type) + ")");
  native_object_facts f;
  for (const llvm::object::ELFSymbolRef& s : o.getDynamicSymbolIterators()) {
    if (is_null_symbol(s)) continue;
    auto sym = symbol_facts(o, s);
    if (!sym) return fail(errc::invalid_argument, "native object: " + sym.err().message);
    if (!sym->defined) f.undefined.push_back(sym->name);
    else if (sym->global && sym->default_visibility) f.exported.push_back(*sym);
    f.dynamic_symbols.push_back(std::move(*sym));
  }
  auto names = section_names(o);
  if (!names) return fail(errc::invalid_argument, "native object: " + names.err().message);
  f.sections = std::move(*names);
  auto mem = read_memory(o);
  if (!mem) return fail(errc::invalid_argument, "native object: " + mem.err().message);
  f.memory = *mem;
  return f;
}

result<native_call_facts> inspect_native_relocatable(std::span<const std::byte> elf) {
  auto obj = open_elf(elf, llvm::ELF::EM_X86_64, "native relocatable object");
  if (!obj) return obj.err();
  const elf_file& o = **obj;
  if (o.getELFFile().getHeader().e_type != llvm::ELF::ET_REL)
    return fail(errc::invalid_argument, "native relocatable object: ELF type is not ET_REL");
  native_call_facts f;
  // Functions per section index, by offset.
  std::map<std::uint64_t, std::map<std::uint64_t, std::string>> functions_at; // section -> offset -> name
  std::map<std::uint64_t, std::vector<std::pair<std::uint64_t, std::uint64_t>>> ranges;
  for (const llvm::object::ELFSymbolRef& s : o.symbols()) {
    if (is_null_symbol(s)) continue;
    auto sym = symbol_facts(o, s);
    if (!sym) return fail(errc::invalid_argument, "native relocatable object: " + sym.err().message);
    if (sym->function && sym->defined) {
      auto sec = s.getSection();
      const std::uint64_t index = (*sec)->getIndex();
      functions_at[index][sym->value] = sym->name;
      f.section_of[sym->name] = sym->section;
      f.callees[sym->name];
    }
    f.symbols.push_back(std::move(*sym));
  }
  for (const auto& [index, fns] : functions_at) {
    if (fns.size() > 1) {
      for (const llvm::object::SectionRef& s : o.sections())
        if (s.getIndex() == index) f.shared_sections.push_back(s.getName() ? s.getName()->str() : "?");
    }
  }
  auto function_containing = [&](std::uint64_t section, std::uint64_t off) -> const std::string* {
    auto it = functions_at.find(section);
    if (it == functions_at.end()) return nullptr;
    auto fn = it->second.upper_bound(off);
    if (fn == it->second.begin()) return nullptr;
    --fn;
    return &fn->second;
  };
  std::map<std::string, std::set<std::string>> edges;
  for (const llvm::object::SectionRef& rs : o.sections()) {
    auto target = rs.getRelocatedSection();
    if (!target) return fail(errc::invalid_argument, "native relocatable object: " + take_message(target));
    if (*target == o.section_end() || !(*target)->isText()) continue;
    const std::uint64_t tindex = (*target)->getIndex();
    for (const llvm::object::RelocationRef& r : rs.relocations()) {
      const std::uint64_t type = r.getType();
      const bool pc_rel = type == llvm::ELF::R_X86_64_PLT32 || type == llvm::ELF::R_X86_64_PC32;
      const bool got = type == llvm::ELF::R_X86_64_GOTPCREL || type == llvm::ELF::R_X86_64_GOTPCRELX ||
                       type == llvm::ELF::R_X86_64_REX_GOTPCRELX;
      if (!pc_rel && !got) continue;
      const std::string* caller = function_containing(tindex, r.getOffset());
      if (caller == nullptr) continue;
      const llvm::object::symbol_iterator si = r.getSymbol();
      if (si == o.symbol_end()) continue;
      const llvm::object::ELFSymbolRef sym(*si);
      auto ssec = sym.getSection();
      if (!ssec) return fail(errc::invalid_argument, "native relocatable object: " + take_message(ssec));
      if (*ssec == o.section_end()) { // undefined: an external function such as memcpy
        auto name = sym.getName();
        if (name && !name->empty()) edges[*caller].insert(name->str());
        continue;
      }
      if (sym.getELFType() == llvm::ELF::STT_FUNC) {
        auto name = sym.getName();
        if (name) edges[*caller].insert(name->str());
      } else if (sym.getELFType() == llvm::ELF::STT_SECTION && pc_rel) {
        // A local function referenced through its section: target = section + addend + 4.
        auto addend = llvm::object::ELFRelocationRef(r).getAddend();
        if (!addend) return fail(errc::invalid_argument, "native relocatable object: " + take_message(addend));
        auto it = functions_at.find((*ssec)->getIndex());
        if (it == functions_at.end()) continue;
        auto fn = it->second.find(static_cast<std::uint64_t>(*addend + 4));
        if (fn != it->second.end()) edges[*caller].insert(fn->second);
      }
    }
  }
  for (auto& [fn, set] : edges) {
    set.erase(fn); // a function's references to itself (local labels) are not calls
    f.callees[fn].assign(set.begin(), set.end());
  }
  return f;
}

result<bpf_object_facts> inspect_bpf_object(std::span<const std::byte> elf) {
  auto obj = open_elf(elf, llvm::ELF::EM_BPF, "eBPF object");
  if (!obj) return obj.err();
  const elf_file& o = **obj;
  if (o.getELFFile().getHeader().e_type != llvm::ELF::ET_REL)
    return fail(errc::invalid_argument, "eBPF object: not a relocatable object");
  auto programs = libbpf_programs(elf);
  if (!programs) return programs.err();

  bpf_object_facts f;
  auto names = section_names(o);
  if (!names) return fail(errc::invalid_argument, "eBPF object: " + names.err().message);
  f.sections = std::move(*names);
  f.has_btf = std::find(f.sections.begin(), f.sections.end(), ".BTF") != f.sections.end();
  f.has_btf_ext = std::find(f.sections.begin(), f.sections.end(), ".BTF.ext") != f.sections.end();
  auto mem = read_memory(o);
  if (!mem) return fail(errc::invalid_argument, "eBPF object: " + mem.err().message);
  f.memory = *mem;
  const auto lines = read_line_info(o);

  for (const program_entry& p : *programs) {
    bpf_program_facts pf;
    pf.name = p.name;
    pf.section = p.section;
    pf.insn_count = p.insn_count;
    // The program's code: its function symbol's range in its section.
    std::optional<llvm::object::SectionRef> sec;
    std::uint64_t begin = 0, size = 0;
    for (const llvm::object::ELFSymbolRef& s : o.symbols()) {
      if (is_null_symbol(s) || s.getELFType() != llvm::ELF::STT_FUNC) continue;
      auto name = s.getName();
      auto ssec = s.getSection();
      auto value = s.getValue();
      if (!name || !ssec || !value || *name != p.name || *ssec == o.section_end()) {
        if (!name) llvm::consumeError(name.takeError());
        if (!ssec) llvm::consumeError(ssec.takeError());
        if (!value) llvm::consumeError(value.takeError());
        continue;
      }
      sec = **ssec;
      begin = *value;
      size = s.getSize();
      break;
    }
    if (!sec) return fail(errc::invalid_argument, "eBPF object: program '" + p.name + "' has no function symbol");
    auto code = sec->getContents();
    if (!code) return fail(errc::invalid_argument, "eBPF object: " + take_message(code));
    if (begin + size > code->size() || size % 8 != 0)
      return fail(errc::invalid_argument, "eBPF object: program '" + p.name + "' lies outside its section");
    pf.where = line_of(lines, p.section, begin);
    for (const auto& [insn, target] : back_edges(code->substr(begin, size)))
      pf.loops.push_back({insn, target, line_of(lines, p.section, begin + std::uint64_t{insn} * 8)});
    for (const llvm::object::SectionRef& rs : o.sections()) {
      auto target = rs.getRelocatedSection();
      if (!target) {
        llvm::consumeError(target.takeError());
        continue;
      }
      if (*target == o.section_end() || **target != *sec) continue;
      for (const llvm::object::RelocationRef& r : rs.relocations()) {
        const std::uint64_t off = r.getOffset();
        if (off < begin || off >= begin + size) continue;
        bpf_reference ref;
        ref.insn = static_cast<std::uint32_t>((off - begin) / 8);
        ref.call = static_cast<std::uint8_t>((*code)[off]) == 0x85;
        ref.where = line_of(lines, p.section, off);
        const llvm::object::symbol_iterator si = r.getSymbol();
        if (si != o.symbol_end()) {
          const llvm::object::ELFSymbolRef sym(*si);
          auto ssec = sym.getSection();
          if (!ssec) return fail(errc::invalid_argument, "eBPF object: " + take_message(ssec));
          ref.external = *ssec == o.section_end();
          auto name = sym.getName();
          if (!name) return fail(errc::invalid_argument, "eBPF object: " + take_message(name));
          ref.symbol = name->str();
          if (sym.getELFType() == llvm::ELF::STT_SECTION && !ref.external) {
            auto sname = (*ssec)->getName();
            if (sname) ref.symbol = sname->str();
          }
        }
        pf.references.push_back(std::move(ref));
      }
    }
    f.programs.push_back(std::move(pf));
  }
  return f;
}

result<std::vector<frame_usage>> parse_stack_usage(std::string_view su_text) {
  std::vector<frame_usage> out;
  std::size_t line_no = 0;
  while (!su_text.empty()) {
    const std::size_t nl = su_text.find('\n');
    std::string_view line = su_text.substr(0, nl);
    su_text = nl == std::string_view::npos ? std::string_view() : su_text.substr(nl + 1);
    ++line_no;
    if (line.empty()) continue;
    auto bad = [&] {
      return fail(errc::invalid_argument, "stack usage line " + std::to_string(line_no) + " is malformed: " + std::string(line));
    };
    const std::size_t t1 = line.find('\t');
    const std::size_t t2 = t1 == std::string_view::npos ? t1 : line.find('\t', t1 + 1);
    if (t2 == std::string_view::npos) return bad();
    const std::string_view where = line.substr(0, t1);
    const std::string_view bytes = line.substr(t1 + 1, t2 - t1 - 1);
    const std::string_view kind = line.substr(t2 + 1);
    // <file>:<line>:<function>, or <file>:<function> for a function without a source line (a
    // build from IR); the file may contain ':', symbol names do not.
    const std::size_t c2 = where.rfind(':');
    if (c2 == std::string_view::npos || c2 == 0) return bad();
    frame_usage fu;
    fu.function = std::string(where.substr(c2 + 1));
    if (fu.function.empty() || bytes.empty()) return bad();
    const std::size_t c1 = where.rfind(':', c2 - 1);
    const std::string_view line_text = c1 == std::string_view::npos ? std::string_view() : where.substr(c1 + 1, c2 - c1 - 1);
    const bool numeric = !line_text.empty() && line_text.find_first_not_of("0123456789") == std::string_view::npos;
    for (char c : numeric ? line_text : std::string_view()) {
      if (fu.line > (UINT32_MAX - 9) / 10) return bad();
      fu.line = fu.line * 10 + static_cast<std::uint32_t>(c - '0');
    }
    for (char c : bytes) {
      if (c < '0' || c > '9' || fu.bytes > (UINT64_MAX - 9) / 10) return bad();
      fu.bytes = fu.bytes * 10 + static_cast<std::uint64_t>(c - '0');
    }
    if (kind == "static") fu.dynamic = false;
    else if (kind.substr(0, 7) == "dynamic") fu.dynamic = true;
    else return bad();
    out.push_back(std::move(fu));
  }
  return out;
}

namespace {
struct stack_walk {
  const std::map<std::string, std::uint64_t>& frames;
  const std::map<std::string, std::vector<std::string>>& callees;
  std::uint64_t per_call;
  std::map<std::string, std::uint64_t> memo;
  std::vector<std::string> path;

  result<std::uint64_t> visit(const std::string& fn) {
    if (auto it = memo.find(fn); it != memo.end()) return it->second;
    if (std::find(path.begin(), path.end(), fn) != path.end()) {
      std::string cycle;
      for (auto it = std::find(path.begin(), path.end(), fn); it != path.end(); ++it) cycle += *it + " -> ";
      return fail(errc::invalid_argument, "the call graph has a cycle, so the stack is unbounded: " + cycle + fn);
    }
    path.push_back(fn);
    std::uint64_t deepest = 0;
    if (auto it = callees.find(fn); it != callees.end()) {
      for (const std::string& c : it->second) {
        auto s = visit(c);
        if (!s) return s;
        deepest = std::max(deepest, *s);
      }
    }
    path.pop_back();
    const auto fr = frames.find(fn);
    const std::uint64_t total = per_call + (fr == frames.end() ? 0 : fr->second) + deepest;
    memo[fn] = total;
    return total;
  }
};
} // namespace

result<std::uint64_t> worst_case_stack(const std::string& root, const std::map<std::string, std::uint64_t>& frames,
                                       const std::map<std::string, std::vector<std::string>>& callees,
                                       std::uint64_t per_call_bytes) {
  stack_walk w{frames, callees, per_call_bytes, {}, {}};
  return w.visit(root);
}

result<std::string> describe_object(rt::package_target target, std::span<const std::byte> object) {
  std::ostringstream os;
  if (target == rt::package_target::native_x86_64) {
    auto f = inspect_native_object(object);
    if (!f) return f.err();
    os << "object: x86-64 ELF shared object, " << object.size() << " bytes\n";
    for (const elf_symbol& s : f->exported)
      os << "  exports " << (s.function ? "function " : "data ") << s.name << " (" << s.size_bytes << " bytes, section "
         << s.section << ")\n";
    os << "  undefined symbols: " << (f->undefined.empty() ? "none" : join(f->undefined, ", ")) << "\n";
    std::vector<std::string> spin_sections;
    for (const std::string& s : f->sections)
      if (s.rfind(".spin.", 0) == 0) spin_sections.push_back(s);
    os << "  spin sections: " << join(spin_sections, ", ") << "\n";
  } else {
    auto f = inspect_bpf_object(object);
    if (!f) return f.err();
    os << "object: BPF ELF relocatable object, " << object.size() << " bytes, BTF " << (f->has_btf ? "yes" : "no")
       << ", BTF.ext " << (f->has_btf_ext ? "yes" : "no") << "\n";
    for (const bpf_program_facts& p : f->programs) {
      std::set<std::string> calls;
      for (const bpf_reference& r : p.references)
        if (r.call) calls.insert(r.symbol);
      os << "  program " << p.name << " (section " << p.section << "): " << p.insn_count << " instructions, "
         << p.loops.size() << " loops, calls "
         << (calls.empty() ? std::string("nothing") : join(std::vector<std::string>(calls.begin(), calls.end()), ", "))
         << "\n";
    }
  }
  return os.str();
}

} // namespace spin::cc
