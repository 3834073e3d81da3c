#include <spin/rt/loader.hpp>

#include "bpf_engine.hpp"
#include "elf_scan.hpp"

#include <dlfcn.h>
#include <link.h>
#include <elf.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace spin::rt {

namespace detail {
struct loaded_code {
  package_manifest manifest;
  handler_set handlers;
};
} // namespace detail

namespace {

// A dlopen'ed native object; closed when the last handler_set that uses it goes away.
// The memory file stays open while the object is loaded: glibc recognises an object it has
// loaded by its path, and a closed descriptor's number (so its /proc/self/fd path) would be
// reused by the next load, which dlopen would then answer with the old object.
struct native_module {
  void* handle = nullptr;
  int fd = -1;
  ~native_module() {
    if (handle != nullptr) dlclose(handle);
    if (fd >= 0) ::close(fd);
  }
};

// Whether this CPU runs code built with `march` (the x86-64 micro-architecture levels).
result<void> cpu_runs(const std::string& march) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  auto need = [&](bool ok, const char* feature) -> result<void> {
    if (ok) return {};
    return fail(errc::not_supported, "native package built with -march=" + march + " needs " + feature +
                                         ", which this CPU lacks (rebuild it with spinc --march x86-64-v2 or lower)");
  };
  if (march.empty() || march == "x86-64") return {};
  if (march == "x86-64-v2" || march == "x86-64-v3" || march == "x86-64-v4") {
    if (auto r = need(__builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("ssse3"), "SSE4.2/POPCNT"); !r) return r;
  }
  if (march == "x86-64-v3" || march == "x86-64-v4") {
    if (auto r = need(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("fma"), "AVX2/BMI2/FMA"); !r) return r;
  }
  if (march == "x86-64-v4") {
    if (auto r = need(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"), "AVX-512"); !r) return r;
  }
  if (march == "x86-64-v2" || march == "x86-64-v3" || march == "x86-64-v4") return {};
  return fail(errc::not_supported, "native package has -march=" + march + ", which this runtime cannot check (spinc accepts x86-64, x86-64-v2, x86-64-v3, x86-64-v4)");
#else
  (void)march;
  return fail(errc::not_supported, "native packages hold x86-64 code; this machine is not x86-64");
#endif
}

// The object must be of the manifest's kind and hold exactly the manifest's handlers, each in
// its section `.spin.<kind>.<name>`; a counted object also exports its instruction counter.
result<void> check_object(const package& p, const std::vector<std::byte>& object, bool counted) {
  auto info = detail::scan_elf(object);
  if (!info) return info.err();
  const bool native = p.manifest.target == package_target::native_x86_64;
  const std::uint16_t want_machine = native ? EM_X86_64 : EM_BPF;
  const std::uint16_t want_type = native ? ET_DYN : ET_REL;
  if (info->machine != want_machine)
    return fail(errc::invalid_argument, std::string("object: ELF machine ") + std::to_string(info->machine) +
                                            (info->machine == EM_BPF ? " (BPF)" : info->machine == EM_X86_64 ? " (x86-64)" : "") +
                                            ", but the manifest says target " + std::string(to_string(p.manifest.target)));
  if (info->type != want_type)
    return fail(errc::invalid_argument, std::string("object: ELF type ") + std::to_string(info->type) + ", expected " +
                                            (native ? "a shared object (3)" : "a relocatable object (1)"));
  for (const auto& h : p.manifest.handlers) {
    const std::string want = handler_section(h);
    const bool found = std::any_of(info->sections.begin(), info->sections.end(),
                                   [&](const detail::elf_section& s) { return s.name == want && (s.flags & SHF_EXECINSTR) != 0; });
    if (!found) return fail(errc::invalid_argument, "object: handler '" + h.name + "' of the manifest is missing (no code section '" + want + "')");
  }
  if (native) {
    // What spinc guarantees, checked again: a package may come from anywhere. dlopen would run
    // load-time code and bind undefined symbols to the process (libc).
    for (const auto& s : info->sections)
      if (s.name == ".init_array" || s.name == ".fini_array" || s.name == ".preinit_array" || s.name == ".init" ||
          s.name == ".fini" || s.name == ".ctors" || s.name == ".dtors")
        return fail(errc::invalid_argument, "object: has load-time code (section '" + s.name + "'); handler objects may not");
    for (const auto& d : info->dynsyms) {
      if (d.type == STT_GNU_IFUNC) return fail(errc::invalid_argument, "object: symbol '" + d.name + "' is an indirect function (ifunc)");
      if (!d.defined && !d.name.empty())
        return fail(errc::invalid_argument, "object: undefined symbol '" + d.name + "' (handler objects are self-contained)");
      if (!d.defined || d.bind == STB_LOCAL || d.visibility != STV_DEFAULT || d.type == STT_SECTION || d.type == STT_FILE) continue;
      const bool handler = std::any_of(p.manifest.handlers.begin(), p.manifest.handlers.end(),
                                       [&](const package_handler& h) { return h.name == d.name; });
      if (!(handler && d.type == STT_FUNC) && !(d.name == "spin_memory_decl" && d.type == STT_OBJECT) &&
          !(counted && d.name == instruction_counter_symbol && d.type == STT_OBJECT))
        return fail(errc::invalid_argument, "object: exports '" + d.name + "', which is not a handler of the manifest");
    }
    if (counted && std::none_of(info->dynsyms.begin(), info->dynsyms.end(), [](const detail::elf_dynsym& d) {
          return d.defined && d.name == instruction_counter_symbol && d.type == STT_OBJECT;
        }))
      return fail(errc::invalid_argument, std::string("counted object: does not export its instruction counter '") +
                                              instruction_counter_symbol + "'");
  }
  for (const auto& s : info->sections) {
    if ((s.flags & SHF_EXECINSTR) == 0 || s.name.rfind(".spin.", 0) != 0) continue;
    const bool listed = std::any_of(p.manifest.handlers.begin(), p.manifest.handlers.end(),
                                    [&](const package_handler& h) { return handler_section(h) == s.name; });
    if (!listed) return fail(errc::invalid_argument, "object: handler section '" + s.name + "' is not listed in the manifest");
  }
  return {};
}

// Loads a native object of `p` (the plain one, or the counted one into out.counted).
result<void> load_native(const package& p, const std::vector<std::byte>& object, bool counted, handler_set& out,
                         std::shared_ptr<const void>& owner) {
  const int fd = memfd_create(counted ? "spin-counted-object" : "spin-native-object", MFD_CLOEXEC);
  if (fd < 0) return fail(errc::no_memory, std::string("native object: cannot create a memory file: ") + std::strerror(errno));
  std::size_t done = 0;
  while (done < object.size()) {
    const ssize_t n = ::write(fd, object.data() + done, object.size() - done);
    if (n <= 0) {
      ::close(fd);
      return fail(errc::no_memory, std::string("native object: cannot write the memory file: ") + std::strerror(errno));
    }
    done += static_cast<std::size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto module = std::make_shared<native_module>();
  module->fd = fd;
  module->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (module->handle == nullptr) {
    const char* why = dlerror();
    return fail(errc::invalid_argument, std::string("native object: dlopen refuses it: ") + (why != nullptr ? why : "unknown reason"));
  }
  // A symbol must come from this object, not from one loaded earlier or from the process.
  auto own = [&](const std::string& name) -> void* {
    void* sym = dlsym(module->handle, name.c_str());
    Dl_info info{};
    link_map* lm = nullptr;
    if (sym == nullptr || dladdr(sym, &info) == 0 || dlinfo(module->handle, RTLD_DI_LINKMAP, &lm) != 0 || lm == nullptr ||
        info.dli_fbase != reinterpret_cast<void*>(lm->l_addr))
      return nullptr;
    return sym;
  };
  const char* what = counted ? "counted object" : "native object";
  for (const auto& h : p.manifest.handlers) {
    void* sym = own(h.name);
    if (sym == nullptr) return fail(errc::invalid_argument, std::string(what) + ": handler '" + h.name + "' of the manifest is missing from it");
    const auto fn = reinterpret_cast<handler_fn>(sym);
    handler_fn& twin = h.kind == handler_kind::header    ? out.counted.header
                       : h.kind == handler_kind::payload ? out.counted.payload
                                                         : out.counted.completion;
    handler_ref& plain = h.kind == handler_kind::header ? out.header : h.kind == handler_kind::payload ? out.payload : out.completion;
    if (counted) twin = fn;
    else plain = fn;
  }
  if (counted) {
    out.counted.counter = static_cast<std::uint64_t*>(own(instruction_counter_symbol));
    if (out.counted.counter == nullptr)
      return fail(errc::invalid_argument, std::string("counted object: its instruction counter '") + instruction_counter_symbol + "' is missing");
  }
  owner = module;
  return {};
}

} // namespace

const package_manifest& loaded_package::manifest() const { return _code->manifest; }
const handler_set& loaded_package::handlers() const { return _code->handlers; }

result<void> loaded_package::bind(ec_config& cfg) const {
  if (auto r = raise_to_declared(_code->manifest, cfg.name, cfg.handler_mem_bytes, cfg.scratchpad_bytes); !r) return r;
  cfg.handlers = _code->handlers;
  return {};
}

result<loaded_package> load_package(const package& p, const load_options& opts) {
  const package_manifest& m = p.manifest;
  if (m.abi_version != spin::abi_version)
    return fail(errc::not_supported, "package '" + m.source_name + "' was built for handler ABI " + std::to_string(m.abi_version) +
                                         ", this runtime has ABI " + std::to_string(spin::abi_version) + " (rebuild it with this spinc)");
  if (m.handlers.empty()) return fail(errc::invalid_argument, "package '" + m.source_name + "' has no handlers");
  if (auto r = check_object(p, p.object, false); !r) return r.err();
  if (!p.counted_object.empty()) {
    if (m.target != package_target::native_x86_64)
      return fail(errc::invalid_argument, "package '" + m.source_name + "' has a counted object, which only native packages may have");
    if (auto r = check_object(p, p.counted_object, true); !r) return fail(r.err().code, "counted " + r.err().message);
  }
  auto code = std::make_shared<detail::loaded_code>();
  code->manifest = m;
  std::shared_ptr<const void> owner;
  if (m.target == package_target::native_x86_64) {
    if (auto r = cpu_runs(m.march); !r) return r.err();
    if (auto r = load_native(p, p.object, false, code->handlers, owner); !r) return r.err();
    if (!p.counted_object.empty()) {
      // Both objects stay loaded as long as the handler set: the owner holds the pair.
      std::shared_ptr<const void> counted_owner;
      if (auto r = load_native(p, p.counted_object, true, code->handlers, counted_owner); !r) return r.err();
      owner = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<const void>>>(owner, counted_owner);
    }
  } else {
    if (auto r = detail::load_bpf_handlers(p, opts.bpf, code->handlers, owner); !r) return r.err();
  }
  code->handlers.owner = owner;
  loaded_package lp;
  lp._code = std::move(code);
  return lp;
}

result<loaded_package> load_package_file(const std::string& path, const load_options& opts) {
  auto p = read_package_file(path);
  if (!p) return p.err();
  auto lp = load_package(*p, opts);
  if (!lp) return fail(lp.err().code, path + ": " + lp.err().message);
  return lp;
}

} // namespace spin::rt
