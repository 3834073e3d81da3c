// spinc builder: checker -> clang-16 -> object verification -> stack sizes -> package.
#include <spin/cc/build.hpp>
#include <spin/cc/check.hpp>
#include <spin/cc/object.hpp>

#include "icount.hpp"
#include "ir_io.hpp"

#include <llvm/ADT/StringExtras.h>
#include <llvm/Analysis/LoopInfo.h>
#include <llvm/BinaryFormat/Dwarf.h>
#include <llvm/IR/DebugInfo.h>
#include <llvm/IR/DebugInfoMetadata.h>
#include <llvm/IR/Dominators.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>
#include <llvm/Support/SHA256.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Transforms/Utils/LoopUtils.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#ifndef SPINC_CLANG
#error "SPINC_CLANG (path of clang++-16) must be defined by the build"
#endif
#ifndef SPINC_CLANG_VERSION
#error "SPINC_CLANG_VERSION must be defined by the build"
#endif
#ifndef SPINC_VERSION
#error "SPINC_VERSION (the project version) must be defined by the build"
#endif

namespace spin::cc {
namespace {

// Clang emits calls to these even in freestanding code (struct copies, zero-initialisation of
// large objects). spinc links this file into every native object; the functions are hidden, so
// the package still exports only its handlers. -ffreestanding implies -fno-builtin, so clang does
// not turn these loops back into calls to themselves.
constexpr const char* support_source = R"(// spinc's runtime support for native handler objects.
using size_t = decltype(sizeof 0);
using uptr = __UINTPTR_TYPE__;
#define SPINC_SUPPORT extern "C" __attribute__((visibility("hidden")))
SPINC_SUPPORT void* memcpy(void* __restrict dst, const void* __restrict src, size_t n) {
  unsigned char* d = static_cast<unsigned char*>(dst);
  const unsigned char* s = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = s[i];
  return dst;
}
SPINC_SUPPORT void* memmove(void* dst, const void* src, size_t n) {
  unsigned char* d = static_cast<unsigned char*>(dst);
  const unsigned char* s = static_cast<const unsigned char*>(src);
  if (reinterpret_cast<uptr>(d) <= reinterpret_cast<uptr>(s)) {
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
  } else {
    for (size_t i = n; i > 0; --i) d[i - 1] = s[i - 1];
  }
  return dst;
}
SPINC_SUPPORT void* memset(void* dst, int c, size_t n) {
  unsigned char* d = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<unsigned char>(c);
  return dst;
}
SPINC_SUPPORT int memcmp(const void* a, const void* b, size_t n) {
  const unsigned char* x = static_cast<const unsigned char*>(a);
  const unsigned char* y = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < n; ++i)
    if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
  return 0;
}
)";

const std::set<std::string> support_functions = {"memcpy", "memmove", "memset", "memcmp"};

// A temporary directory removed with everything in it when the object goes away.
class temp_dir {
public:
  static result<temp_dir> create() {
    llvm::SmallString<256> base;
    llvm::sys::path::system_temp_directory(true, base);
    llvm::sys::path::append(base, "spinc");
    llvm::SmallString<256> path;
    if (std::error_code ec = llvm::sys::fs::createUniqueDirectory(base, path))
      return fail(errc::bad_state, "cannot create a temporary directory under " + std::string(base.str()) + ": " + ec.message());
    return temp_dir(path.str().str());
  }
  temp_dir(temp_dir&& o) noexcept : _path(std::move(o._path)) { o._path.clear(); }
  temp_dir& operator=(temp_dir&&) = delete;
  ~temp_dir() {
    if (_path.empty()) return;
    const char* keep = std::getenv("SPINC_KEEP_TEMPS");
    if (keep != nullptr && *keep != '\0' && std::string_view(keep) != "0")
      std::cerr << "spinc: kept the temporary files in " << _path << '\n';
    else
      llvm::sys::fs::remove_directories(_path);
  }
  const std::string& path() const { return _path; }
  std::string file(const std::string& name) const { return _path + "/" + name; }

private:
  explicit temp_dir(std::string p) : _path(std::move(p)) {}
  std::string _path;
};

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=/.,:@%") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void log_line(const build_options& opts, const std::string& line) {
  if (opts.log) opts.log(line);
  else std::cerr << line << '\n';
}

result<std::string> read_file(const std::string& path, errc code) {
  auto buf = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buf) return fail(code, "cannot read " + path + ": " + buf.getError().message());
  return (*buf)->getBuffer().str();
}

result<void> write_file(const std::string& path, std::string_view text) {
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec, llvm::sys::fs::OF_None);
  if (ec) return fail(errc::bad_state, "cannot write " + path + ": " + ec.message());
  os << text;
  os.close();
  if (os.has_error()) return fail(errc::bad_state, "cannot write " + path + ": " + os.error().message());
  return {};
}

std::string clang_path() {
  const char* env = std::getenv("SPINC_CLANG");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(SPINC_CLANG);
}

// Runs clang with `args` (without argv[0]) in the directory `cwd` (spinc's own when empty);
// stdout and stderr go to files in `tmp`. No shell is involved.
struct clang_run {
  int exit_code = 0;
  std::string stderr_text;
};

result<clang_run> run_clang(const std::vector<std::string>& args, const temp_dir& tmp, const build_options& opts,
                            const std::string& cwd = {}) {
  const std::string clang = clang_path();
  std::vector<std::string> argv_s{clang};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  if (opts.verbose == verbosity::commands) {
    std::string line;
    for (const std::string& a : argv_s) line += (line.empty() ? "" : " ") + shell_quote(a);
    log_line(opts, cwd.empty() ? line : "(cd " + shell_quote(cwd) + " && " + line + ")");
  }
  if (!llvm::sys::fs::can_execute(clang))
    return fail(errc::not_found, "cannot run clang: " + clang + " is not an executable file (install clang-16; "
                                 "the environment variable SPINC_CLANG overrides the path)");
  const std::string out = tmp.file("clang.stdout"), err = tmp.file("clang.stderr");
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  pid_t pid = 0;
  const int spawn_err = posix_spawn(&pid, clang.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (spawn_err != 0) return fail(errc::not_found, "cannot run clang (" + clang + "): " + std::strerror(spawn_err));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return fail(errc::bad_state, std::string("waiting for clang failed: ") + std::strerror(errno));
  }
  clang_run r;
  auto text = read_file(err, errc::bad_state);
  r.stderr_text = text ? *text : std::string();
  if (WIFSIGNALED(status))
    return fail(errc::bad_state, "clang (" + clang + ") was killed by signal " + std::to_string(WTERMSIG(status)) +
                                     (r.stderr_text.empty() ? std::string() : ":\n" + r.stderr_text));
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 255;
  return r;
}

// A clang failure on the user's code: the source is rejected, clang's own words explain why.
// The BPF backend repeats one error per basic block ("error: x.cpp:0:0: in function f ...", a
// blank line): keep the first of each and no blank lines.
std::string tidy_clang_output(const std::string& text) {
  std::string out;
  std::set<std::string> seen;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (line.rfind("error: ", 0) == 0 && !seen.insert(line).second) continue;
    out += line + "\n";
  }
  return out;
}

error clang_rejects(const char* step, const clang_run& r, const std::string& hint = {}) {
  std::string msg = tidy_clang_output(r.stderr_text);
  while (!msg.empty() && msg.back() == '\n') msg.pop_back();
  if (msg.empty()) msg = std::string("clang failed (exit status ") + std::to_string(r.exit_code) + ") while " + step;
  else msg = msg + "\nspinc: clang failed (exit status " + std::to_string(r.exit_code) + ") while " + step;
  if (!hint.empty()) msg += "\n" + hint;
  return fail(errc::invalid_argument, msg);
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

const char* kind_name(handler_kind k) {
  switch (k) {
  case handler_kind::header: return "header";
  case handler_kind::payload: return "payload";
  case handler_kind::completion: return "completion";
  }
  return "?";
}

std::string diag(const std::string& file, unsigned line, unsigned col, const std::string& level, const std::string& text) {
  std::string where = file;
  if (line != 0) where += ":" + std::to_string(line) + (col != 0 ? ":" + std::to_string(col) : std::string());
  return where + ": " + level + ": " + text;
}

std::string diag_at(const handler_info& h, const std::string& level, const std::string& text) {
  return diag(h.file, h.line, h.col, level, text);
}

// A source line of the BPF object, named as the user named the file when it is the source.
std::string diag_at(const source_line& where, const handler_info& h, const std::string& source_name,
                    const std::string& level, const std::string& text) {
  if (where.line == 0) return diag_at(h, level, text);
  // -ffile-prefix-map made the source "./<name>" (or "<name>").
  const bool is_source = where.file == source_name || where.file == "./" + source_name;
  return diag(is_source ? h.file : where.file, where.line, where.col, level, text);
}

// Flags both targets share (the source is compiled freestanding, as a NIC runs it).
std::vector<std::string> common_flags(const std::string& source_dir, const temp_dir& tmp, const build_options& opts) {
  std::vector<std::string> f = {
      "-std=c++20", "-O2", "-ffreestanding", "-nostdinc++", "-nostdlibinc", "-fno-exceptions", "-fno-rtti",
      "-fno-stack-protector",
      // A handler's null checks stay even after a dereference clang could use to drop them: a
      // null from ctx->mem and friends must not reach memory (docs/handler-guide.md).
      "-fno-delete-null-pointer-checks",
      // Nothing of the build's directories may reach the object: the same source gives the same
      // bytes wherever it is built.
      "-ffile-prefix-map=" + source_dir + "=.", "-ffile-prefix-map=" + tmp.path() + "=.",
      "-ffile-prefix-map=" + handler_include_dir() + "=spin-include", "-fdebug-compilation-dir=.",
      "-I" + handler_include_dir()};
  for (const std::string& d : opts.include_dirs) {
    llvm::SmallString<256> abs(d);
    llvm::sys::fs::make_absolute(abs);
    f.push_back("-I" + abs.str().str());
  }
  for (const std::string& d : opts.defines) f.push_back("-D" + d);
  return f;
}

// Frames of a -fstack-usage file: function -> bytes. Dynamic frames are an error.
result<std::map<std::string, std::uint64_t>> read_frames(const std::string& su_path) {
  auto text = read_file(su_path, errc::bad_state);
  if (!text) return fail(errc::bad_state, "clang wrote no stack usage file: " + text.err().message);
  auto frames = parse_stack_usage(*text);
  if (!frames) return fail(errc::bad_state, su_path + ": " + frames.err().message);
  std::map<std::string, std::uint64_t> out;
  for (const frame_usage& f : *frames) {
    if (f.dynamic)
      return fail(errc::invalid_argument, "function '" + f.function + "' (line " + std::to_string(f.line) +
                                              ") has a stack frame that grows at run time (alloca or a variable-length "
                                              "array); give every local a compile-time size");
    out[f.function] = std::max(out[f.function], f.bytes);
  }
  return out;
}

// ---- the checker's view ---------------------------------------------------------------------

struct checked {
  std::vector<handler_info> handlers; // one per kind, in kind order
  std::map<std::string, std::vector<std::string>> callees;
};

result<checked> run_checker(const std::string& source_path, const build_options& opts) {
  check_report rep = check_file(source_path, make_check_options(opts));
  if (!rep.ok) {
    const unsigned n = std::max(rep.errors, 1u);
    return fail(errc::invalid_argument, source_path + ": rejected by the checker (" + std::to_string(n) +
                                            (n == 1 ? " error" : " errors") + ")");
  }
  if (rep.handlers.empty())
    return fail(errc::invalid_argument,
                diag(source_path, 0, 0, "error",
                     "no handler in this file; declare one with SPIN_HEADER_HANDLER, SPIN_PAYLOAD_HANDLER or "
                     "SPIN_COMPLETION_HANDLER"));
  std::string errors;
  std::map<handler_kind, const handler_info*> by_kind;
  for (const handler_info& h : rep.handlers) {
    auto [it, fresh] = by_kind.emplace(h.kind, &h);
    if (!fresh) {
      errors += diag_at(h, "error", std::string("a package holds one ") + kind_name(h.kind) + " handler; '" + h.name +
                                        "' is the second one") + "\n";
      errors += diag_at(*it->second, "note", "the first " + std::string(kind_name(h.kind)) + " handler is '" +
                                                 it->second->name + "'") + "\n";
    }
  }
  if (!errors.empty()) {
    errors.pop_back();
    return fail(errc::invalid_argument, errors);
  }
  checked c;
  for (const auto& [kind, h] : by_kind) c.handlers.push_back(*h);
  c.callees = std::move(rep.callees);
  return c;
}

// ---- native ----------------------------------------------------------------------------------

struct compiled {
  std::string object;                            // bytes of the final object
  std::string counted_object;                    // --count-instructions: the counted object
  std::map<std::string, std::uint64_t> stack;    // handler -> worst-case bytes
  memory_facts memory;
};

result<compiled> build_native(const std::string& source, const std::string& source_dir, const checked& chk,
                              const temp_dir& tmp, const build_options& opts, bool counted) {
  // The compile command of `src` into `out`; `with` gives -I/-D (none for spinc's own file).
  // Counted (--count-instructions): the modelled HPU is a scalar core, so no vectorisation;
  // clang's optimised IR goes through instrument_ir and is compiled again.
  auto compile_args = [&](const build_options& with, const std::string& src, const std::string& out, bool ir_out) {
    std::vector<std::string> a = {"-target", "x86_64-linux-gnu"};
    if (src.ends_with(".bc")) a.push_back("-O2");
    else for (std::string& f : common_flags(source_dir, tmp, with)) a.push_back(std::move(f));
    // -mno-red-zone: a leaf function's locals in the red zone do not count in its frame size,
    // so -fstack-usage would understate them by up to 128 bytes. -ffunction-sections: every
    // call between functions leaves a relocation, which gives the call graph.
    for (const char* f : {"-fPIC", "-mno-red-zone", "-ffunction-sections"}) a.emplace_back(f);
    if (counted)
      for (const char* f : {"-fno-vectorize", "-fno-slp-vectorize"}) a.emplace_back(f);
    a.emplace_back(ir_out ? "-emit-llvm" : "-fstack-usage");
    a.push_back("-march=" + opts.march);
    for (const char* f : {"-c", "-o"}) a.emplace_back(f);
    a.push_back(out);
    a.push_back(src);
    return a;
  };
  const std::string tag = counted ? "counted-" : "";
  // One object from `src`: directly, or counted through the IR.
  auto compile = [&](const build_options& with, const std::string& src, const std::string& name) -> result<clang_run> {
    const std::string out = tmp.file(tag + name + ".o");
    if (!counted) return run_clang(compile_args(with, src, out, false), tmp, opts);
    const std::string ir = tmp.file(tag + name + ".bc"), inst = tmp.file(tag + name + ".inst.bc");
    auto r = run_clang(compile_args(with, src, ir, true), tmp, opts);
    if (!r || r->exit_code != 0) return r;
    if (auto i = instrument_ir(ir, inst); !i) return i.err();
    return run_clang(compile_args(with, inst, out, false), tmp, opts);
  };

  const std::string obj = tmp.file(tag + "handler.o"), support_obj = tmp.file(tag + "support.o");
  auto r = compile(opts, source, "handler");
  if (!r) return r.err();
  if (r->exit_code != 0) return clang_rejects("compiling the handler file", *r);

  const std::string support_src = tmp.file("spinc_support.cpp");
  if (auto w = write_file(support_src, support_source); !w) return w.err();
  r = compile(build_options{}, support_src, "support");
  if (!r) return r.err();
  if (r->exit_code != 0) return fail(errc::bad_state, "spinc's runtime support does not compile:\n" + r->stderr_text);

  // Call graph and frames of both objects.
  std::map<std::string, std::vector<std::string>> callees;
  std::map<std::string, std::string> section_of;
  std::set<std::string> defined, undefined_refs;
  for (const std::string& path : {obj, support_obj}) {
    auto bytes = read_file(path, errc::bad_state);
    if (!bytes) return bytes.err();
    auto calls = inspect_native_relocatable(as_bytes(*bytes));
    if (!calls) return fail(errc::bad_state, "clang's object: " + calls.err().message);
    for (auto& [fn, cs] : calls->callees) callees[fn] = cs;
    for (auto& [fn, sec] : calls->section_of) section_of[fn] = sec;
    for (const elf_symbol& s : calls->symbols) {
      if (s.defined) defined.insert(s.name);
      else if (!s.name.empty()) undefined_refs.insert(s.name);
    }
  }
  // Calls between functions of one section may leave no relocation: take the checker's edges
  // for those (sound, since the checker sees every direct call and there are no indirect ones).
  for (const auto& [fn, cs] : chk.callees) {
    auto sec = section_of.find(fn);
    if (sec == section_of.end()) continue;
    for (const std::string& c : cs) {
      auto csec = section_of.find(c);
      if (csec != section_of.end() && csec->second == sec->second && c != fn) {
        auto& v = callees[fn];
        if (std::find(v.begin(), v.end(), c) == v.end()) v.push_back(c);
      }
    }
  }
  // Calls clang generated to functions nobody defines (e.g. __udivti3 for 128-bit division).
  std::string errors;
  for (const std::string& u : undefined_refs) {
    if (defined.count(u) != 0 || u == "_GLOBAL_OFFSET_TABLE_") continue; // the linker defines the GOT
    std::vector<std::string> users;
    for (const auto& [fn, cs] : callees)
      if (std::find(cs.begin(), cs.end(), u) != cs.end()) users.push_back(fn);
    errors += diag(source, 0, 0, "error",
                   "the compiled code needs '" + u + "', which a handler object cannot link (no libc or compiler "
                   "runtime on the NIC)" + (users.empty() ? std::string() : "; used by " + llvm::join(users, ", ")) +
                   ". Avoid the construct clang implements with it (e.g. 128-bit division, floating-point "
                   "conversions of 128-bit integers)") + "\n";
  }
  if (!errors.empty()) {
    errors.pop_back();
    return fail(errc::invalid_argument, errors);
  }

  auto frames = read_frames(tmp.file(tag + "handler.su"));
  if (!frames) return frames.err();
  auto support_frames = read_frames(tmp.file(tag + "support.su"));
  if (!support_frames) return support_frames.err();
  frames->insert(support_frames->begin(), support_frames->end());

  // Link: export exactly the handlers.
  std::string script = "{\n  global:\n";
  for (const handler_info& h : chk.handlers) script += "    " + h.name + ";\n";
  if (counted) script += std::string("    ") + instruction_counter_symbol + ";\n";
  script += "  local: *;\n};\n";
  const std::string map = tmp.file(tag + "exports.map"), so = tmp.file(tag + "handler.so");
  if (auto w = write_file(map, script); !w) return w.err();
  const std::vector<std::string> link = {"-target", "x86_64-linux-gnu", "-shared", "-nostdlib", "-fuse-ld=lld",
                                         "-Wl,--no-undefined", "-Wl,--build-id=none", "-Wl,-z,noexecstack",
                                         "-Wl,--version-script=" + map, "-o", so, obj, support_obj};
  r = run_clang(link, tmp, opts);
  if (!r) return r.err();
  if (r->exit_code != 0) return clang_rejects("linking the handler object", *r);

  compiled out;
  auto bytes = read_file(so, errc::bad_state);
  if (!bytes) return bytes.err();
  out.object = std::move(*bytes);
  auto facts = inspect_native_object(as_bytes(out.object));
  if (!facts) return fail(errc::bad_state, "the linked object: " + facts.err().message);

  for (const std::string& u : facts->undefined)
    errors += diag(source, 0, 0, "error", "the handler object has the undefined symbol '" + u + "'") + "\n";
  // Code that would run when the runtime loads the object (constructors, destructors, static
  // initialisers) is not a handler and runs outside any budget or fault handling.
  for (const std::string& sec : facts->sections)
    if (sec == ".init_array" || sec == ".fini_array" || sec == ".preinit_array" || sec == ".init" || sec == ".fini" ||
        sec == ".ctors" || sec == ".dtors")
      errors += diag(source, 0, 0, "error", "the handler object has load-time code (section '" + sec +
                                                "': a constructor, destructor or dynamic initialiser); handlers may not run code when loaded") + "\n";
  std::map<std::string, const elf_symbol*> exported;
  for (const elf_symbol& s : facts->exported) exported[s.name] = &s;
  for (const handler_info& h : chk.handlers) {
    auto it = exported.find(h.name);
    if (it == exported.end() || !it->second->function)
      errors += diag_at(h, "error", "handler '" + h.name + "' is not exported as a function by the object") + "\n";
    else if (it->second->section != h.section)
      errors += diag_at(h, "error", "handler '" + h.name + "' lies in section '" + it->second->section +
                                        "', expected '" + h.section + "'") + "\n";
  }
  for (const auto& [name, sym] : exported) {
    const bool handler = std::any_of(chk.handlers.begin(), chk.handlers.end(),
                                     [&](const handler_info& h) { return h.name == name; });
    if (!handler && !(name == "spin_memory_decl" && !sym->function) && !(counted && name == instruction_counter_symbol && !sym->function))
      errors += diag(source, 0, 0, "error", "the handler object exports '" + name + "', which is not a handler") + "\n";
  }
  if (!errors.empty()) {
    errors.pop_back();
    return fail(errc::invalid_argument, errors);
  }
  out.memory = facts->memory;
  for (const handler_info& h : chk.handlers) {
    auto s = worst_case_stack(h.name, *frames, callees, 8);
    if (!s) return fail(errc::invalid_argument, diag_at(h, "error", "handler '" + h.name + "': " + s.err().message));
    out.stack[h.name] = *s;
  }
  return out;
}

// ---- eBPF ------------------------------------------------------------------------------------

// Prepares clang's unoptimised IR for the BPF backend:
//  - every function but the handlers becomes internal and always_inline: DPDK's rte_bpf cannot
//    run BPF-to-BPF calls, so the handlers must be self-contained (no recursion: the checker
//    refuses it, so inlining terminates);
//  - no stack protector attributes (BPF has none);
//  - every loop asks for full unrolling (as '#pragma unroll' would): DPDK's validator rejects
//    any loop (a cycle of jumps), and clang's own -O2 threshold leaves loops of a few dozen iterations
//    rolled. What still cannot be unrolled (no constant trip count, or over clang's pragma
//    limit) is found in the object afterwards;
//  - struct debug types keep only their data members: clang 16's BTF writer casts every element
//    of a struct to a data member and crashes on member functions (spin::ctx has many).
result<void> prepare_bpf_ir(const std::string& in, const std::string& out) {
  return rewrite_bitcode(in, out, "prepared for BPF", [](llvm::Module& m) -> result<void> {
    llvm::LLVMContext& ctx = m.getContext();
    for (llvm::Function& f : m) {
      f.removeFnAttr(llvm::Attribute::StackProtect);
      f.removeFnAttr(llvm::Attribute::StackProtectStrong);
      f.removeFnAttr(llvm::Attribute::StackProtectReq);
      if (f.isDeclaration()) continue;
      const llvm::DominatorTree dt(f);
      const llvm::LoopInfo loops(dt);
      for (llvm::Loop* l : loops.getLoopsInPreorder()) llvm::addStringMetadataToLoop(l, "llvm.loop.unroll.full");
      if (f.hasSection() && f.getSection().startswith(".spin.")) continue;
      f.removeFnAttr(llvm::Attribute::OptimizeNone);
      f.removeFnAttr(llvm::Attribute::NoInline);
      f.addFnAttr(llvm::Attribute::AlwaysInline);
      if (!f.hasLocalLinkage()) {
        f.setComdat(nullptr);
        f.setLinkage(llvm::GlobalValue::InternalLinkage);
        f.setVisibility(llvm::GlobalValue::DefaultVisibility);
      }
    }
    llvm::DebugInfoFinder finder;
    finder.processModule(m);
    for (llvm::DIType* t : finder.types()) {
      auto* ct = llvm::dyn_cast<llvm::DICompositeType>(t);
      if (ct == nullptr) continue;
      llvm::SmallVector<llvm::Metadata*> keep;
      bool dropped = false;
      for (llvm::DINode* e : ct->getElements()) {
        auto* d = llvm::dyn_cast_or_null<llvm::DIDerivedType>(e);
        const bool data_member = d != nullptr && !d->isStaticMember() &&
                                 (d->getTag() == llvm::dwarf::DW_TAG_member || d->getTag() == llvm::dwarf::DW_TAG_inheritance);
        if (data_member) keep.push_back(e);
        else dropped = true;
      }
      // Operand 4 of a DICompositeType is its element list (replaceElements only grows it).
      if (dropped) ct->replaceOperandWith(4, llvm::MDTuple::get(ctx, keep));
    }
    return {};
  });
}

result<compiled> build_ebpf(const std::string& source, const std::string& source_dir, const checked& chk,
                            const temp_dir& tmp, const build_options& opts) {
  const std::string ir = tmp.file("handler.bc"), prepared = tmp.file("prepared.bc"), obj = tmp.file("handler.o");
  std::vector<std::string> args = {"-target", "bpf", "-mcpu=v2"};
  for (std::string& f : common_flags(source_dir, tmp, opts)) args.push_back(std::move(f));
  // -g: BTF, which libbpf needs for the spin_bpf_* externs. The IR is optimised once, below.
  for (const char* a : {"-g", "-Xclang", "-disable-llvm-passes", "-emit-llvm", "-c", "-o"}) args.emplace_back(a);
  args.push_back(ir);
  args.push_back(source);
  auto r = run_clang(args, tmp, opts);
  if (!r) return r.err();
  if (r->exit_code != 0) return clang_rejects("compiling the handler file", *r);
  if (auto p = prepare_bpf_ir(ir, prepared); !p) return p.err();

  // In the source directory: the BPF backend copies the text of each source line into BTF and
  // finds the file by its debug-info name, which -ffile-prefix-map made relative ("./x.cpp").
  args = {"-target", "bpf", "-mcpu=v2", "-O2", "-fstack-usage", "-c", "-o", obj, prepared};
  r = run_clang(args, tmp, opts, source_dir);
  if (!r) return r.err();
  if (r->exit_code != 0) {
    std::string hint;
    if (r->stderr_text.find("built-in function 'mem") != std::string::npos)
      hint = "spinc: hint: BPF cannot call memcpy/memset; clang inlines a copy or clear of a constant size up to 128 "
             "stores (1 KiB at 8-byte alignment). Copy larger or variable-sized blocks in a loop with a "
             "compile-time bound, or in smaller pieces.";
    else if (r->stderr_text.find("Branch target out of insn range") != std::string::npos)
      hint = "spinc: hint: the handler is too large for BPF once its loops are unrolled (a jump spans more than "
             "32767 instructions); use smaller compile-time loop bounds.";
    else if (r->stderr_text.find("stack limit") != std::string::npos)
      hint = "spinc: hint: a BPF handler has 512 bytes of stack; keep large data in handler memory or the "
             "scratchpad (ctx->mem, ctx->scratchpad).";
    return clang_rejects("generating BPF code", *r, hint);
  }

  compiled out;
  auto bytes = read_file(obj, errc::bad_state);
  if (!bytes) return bytes.err();
  out.object = std::move(*bytes);
  auto facts = inspect_bpf_object(as_bytes(out.object));
  if (!facts) return fail(errc::invalid_argument, diag(source, 0, 0, "error", facts.err().message));
  if (!facts->has_btf || !facts->has_btf_ext)
    return fail(errc::bad_state, "clang produced no BTF (.BTF and .BTF.ext), which libbpf needs for the spin_bpf_* externs");

  const std::string source_name = llvm::sys::path::filename(source).str();
  std::string errors;
  std::map<std::string, const bpf_program_facts*> programs;
  for (const bpf_program_facts& p : facts->programs) programs[p.name] = &p;
  for (const handler_info& h : chk.handlers) {
    auto it = programs.find(h.name);
    if (it == programs.end()) {
      errors += diag_at(h, "error", "handler '" + h.name + "' is not a program of the eBPF object") + "\n";
      continue;
    }
    const bpf_program_facts& p = *it->second;
    if (p.section != h.section)
      errors += diag_at(h, "error", "handler '" + h.name + "' lies in section '" + p.section + "', expected '" +
                                        h.section + "'") + "\n";
    std::set<std::string> reported;
    for (const bpf_reference& ref : p.references) {
      if (ref.call && ref.external && llvm::StringRef(ref.symbol).startswith("spin_bpf_")) continue;
      if (!reported.insert(ref.symbol).second) continue;
      std::string text;
      if (ref.call && (ref.symbol == "memcpy" || ref.symbol == "memset" || ref.symbol == "memmove" || ref.symbol == "memcmp"))
        text = "handler '" + h.name + "' calls '" + ref.symbol + "', which BPF cannot call (clang turned a copy or "
               "clear into it); copy in a loop with a compile-time bound";
      else if (ref.call)
        text = "handler '" + h.name + "' calls '" + ref.symbol + "'; an eBPF handler may only call the spin API "
               "(spin_bpf_* externs), and DPDK's rte_bpf cannot run BPF-to-BPF calls";
      else
        text = "handler '" + h.name + "' reads data from '" + ref.symbol + "' (a constant table or string); DPDK's "
               "rte_bpf cannot load data sections: compute the value, or keep the table in handler memory";
      errors += diag_at(ref.where, h, source_name, "error", text) + "\n";
    }
    // One error per source line: an unrolled outer loop repeats an inner one many times.
    std::map<std::pair<std::string, std::uint32_t>, std::vector<const bpf_loop*>> loops_at;
    for (const bpf_loop& l : p.loops) loops_at[{l.where.file, l.where.line}].push_back(&l);
    for (const auto& [at, loops] : loops_at) {
      const bpf_loop& l = *loops.front();
      errors += diag_at(l.where, h, source_name, "error",
                        "handler '" + h.name + "' has a loop clang did not unroll (jump at instruction " +
                            std::to_string(l.insn) + " back to " + std::to_string(l.target) +
                            (loops.size() > 1 ? ", and " + std::to_string(loops.size() - 1) + " more copies" : "") +
                            "); DPDK's rte_bpf validator rejects every loop") + "\n";
    }
    if (!p.loops.empty())
      errors += diag_at(h, "note", "spinc has clang unroll every loop fully; a loop stays when its trip count is not "
                                   "a compile-time constant, it is too large to unroll (clang's limit: about 16K "
                                   "instructions) or '#pragma nounroll' forbids it: make the bound a smaller "
                                   "compile-time constant and guard the body with the run-time size") + "\n";
  }
  for (const bpf_program_facts& p : facts->programs) {
    const bool handler = std::any_of(chk.handlers.begin(), chk.handlers.end(),
                                     [&](const handler_info& h) { return h.name == p.name; });
    if (!handler)
      errors += diag(source, 0, 0, "error", "the eBPF object has the program '" + p.name + "' (section " + p.section +
                                                ") that is not a handler; do not put functions in sections") + "\n";
  }
  if (!errors.empty()) {
    errors.pop_back();
    return fail(errc::invalid_argument, errors);
  }
  out.memory = facts->memory;
  auto frames = read_frames(tmp.file("handler.su"));
  if (!frames) return frames.err();
  // Everything is inlined into the handlers, and the spin_bpf_* functions run on the host's
  // stack, not the BPF stack: a handler's stack is its frame.
  for (const handler_info& h : chk.handlers) {
    auto s = worst_case_stack(h.name, *frames, {}, 0);
    if (!s) return s.err();
    out.stack[h.name] = *s;
  }
  return out;
}

} // namespace

check_options make_check_options(const build_options& opts) {
  check_options c;
  c.tgt = opts.tgt;
  for (const std::string& d : opts.include_dirs) c.clang_args.push_back("-I" + d);
  for (const std::string& d : opts.defines) c.clang_args.push_back("-D" + d);
  return c;
}

std::string compiler_version() {
  return std::string("spinc ") + SPINC_VERSION + " (clang " + SPINC_CLANG_VERSION + ")";
}

result<rt::package> build_package(const std::string& source_path, const build_options& opts) {
  // Read the source first: a missing file is the user's mistake, not a checker finding.
  llvm::SmallString<256> abs;
  if (std::error_code ec = llvm::sys::fs::real_path(source_path, abs))
    return fail(errc::not_found, "cannot read " + source_path + ": " + ec.message());
  if (llvm::sys::fs::is_directory(abs)) return fail(errc::not_found, "cannot read " + source_path + ": it is a directory");
  auto text = read_file(abs.str().str(), errc::not_found);
  if (!text) return text.err();

  if (opts.tgt == target::native && opts.march != "x86-64" && opts.march != "x86-64-v2" && opts.march != "x86-64-v3" &&
      opts.march != "x86-64-v4")
    return fail(errc::not_supported, "-march=" + opts.march + " is not an x86-64 level the loader can check; use "
                                     "x86-64, x86-64-v2, x86-64-v3 or x86-64-v4");

  auto chk = run_checker(source_path, opts);
  if (!chk) return chk.err();

  auto tmp = temp_dir::create();
  if (!tmp) return tmp.err();
  const std::string source = abs.str().str();
  const std::string source_dir = llvm::sys::path::parent_path(source).str();
  if (opts.count_instructions && opts.tgt == target::ebpf)
    return fail(errc::not_supported, "--count-instructions builds a counted native object; eBPF packages have none (build the "
                                     "handler for the native target to run it in virtual time)");
  auto built = opts.tgt == target::ebpf ? build_ebpf(source, source_dir, *chk, *tmp, opts)
                                        : build_native(source, source_dir, *chk, *tmp, opts, false);
  if (built && opts.count_instructions) {
    // The counted object's frames differ (no vectorisation, the counter): each handler's stack
    // is the larger of the two.
    auto counted = build_native(source, source_dir, *chk, *tmp, opts, true);
    if (!counted) built = counted.err();
    else {
      for (auto& [name, bytes] : built->stack) bytes = std::max(bytes, counted->stack.at(name));
      built->counted_object = std::move(counted->object);
    }
  }
  if (!built) {
    // Diagnostics name the source as the user did.
    // Diagnostics name the source as the user did (clang saw an absolute path, the BPF
    // backend the debug-info name "./<file>").
    error e = built.err();
    std::string& m = e.message;
    for (const std::string& from : {source, "./" + llvm::sys::path::filename(source).str()}) {
      if (from == source_path) continue;
      for (std::size_t pos = 0; (pos = m.find(from + ":", pos)) != std::string::npos;) {
        const bool starts = pos == 0 || m[pos - 1] == '\n' || m[pos - 1] == ' ';
        if (starts) m.replace(pos, from.size(), source_path);
        pos += starts ? source_path.size() : from.size();
      }
    }
    return e;
  }

  const std::uint32_t limit = opts.stack_limit_bytes != 0 ? opts.stack_limit_bytes : default_stack_limit_bytes(opts.tgt);
  std::string errors;
  rt::package pkg;
  for (const handler_info& h : chk->handlers) {
    const std::uint64_t bytes = built->stack.at(h.name);
    if (bytes > limit) {
      errors += diag_at(h, "error", "handler '" + h.name + "' needs " + std::to_string(bytes) +
                                        " bytes of stack (worst case, callees included), more than the limit of " +
                                        std::to_string(limit) + " bytes") + "\n";
      errors += diag_at(h, "note", "move large locals into handler memory or the scratchpad (ctx->mem, "
                                   "ctx->scratchpad), or raise the limit with --stack-limit") + "\n";
    }
    pkg.manifest.handlers.push_back({h.name, h.kind, static_cast<std::uint32_t>(std::min<std::uint64_t>(bytes, UINT32_MAX))});
  }
  if (!errors.empty()) {
    errors.pop_back();
    return fail(errc::invalid_argument, errors);
  }

  rt::package_manifest& m = pkg.manifest;
  m.abi_version = spin::abi_version;
  m.target = opts.tgt == target::ebpf ? rt::package_target::ebpf : rt::package_target::native_x86_64;
  m.march = opts.tgt == target::ebpf ? std::string() : opts.march;
  m.compiler = compiler_version();
  m.source_name = llvm::sys::path::filename(source).str();
  const auto digest = llvm::SHA256::hash(llvm::ArrayRef<std::uint8_t>(
      reinterpret_cast<const std::uint8_t*>(text->data()), text->size()));
  m.source_sha256 = llvm::toHex(digest, /*LowerCase=*/true);
  m.handler_mem_bytes = built->memory.handler_mem_bytes;
  m.scratchpad_bytes = built->memory.scratchpad_bytes;
  m.stack_limit_bytes = limit;
  pkg.object.resize(built->object.size());
  std::copy(built->object.begin(), built->object.end(), reinterpret_cast<char*>(pkg.object.data()));
  pkg.counted_object.resize(built->counted_object.size());
  std::copy(built->counted_object.begin(), built->counted_object.end(), reinterpret_cast<char*>(pkg.counted_object.data()));
  return pkg;
}

} // namespace spin::cc
