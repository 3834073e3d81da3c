// spinc: compiles a restricted-C++ handler file into a handler package (build.hpp), checks a
// file only, or shows what a package holds.
#include <spin/cc/build.hpp>
#include <spin/cc/check.hpp>
#include <spin/cc/object.hpp>
#include <spin/rt/package.hpp>

#include <CLI/CLI.hpp>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/Path.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

constexpr int exit_ok = 0;
constexpr int exit_rejected = 1;
constexpr int exit_usage = 2;

const char* const description =
    "spinc: compiles sPIN handlers written in restricted C++ into a handler package.\n"
    "\n"
    "It checks the file against the handler rules (no exceptions, RTTI, heap, virtual or indirect calls,\n"
    "recursion, goto, inline asm, VLAs, mutable globals, calls outside the file and the spin API; for\n"
    "eBPF also no floating point and only loops it can unroll), compiles it with clang-16 for the\n"
    "target, verifies the object (native: no undefined symbols, exactly the handlers exported; eBPF:\n"
    "libbpf sees exactly the handlers, calls only spin_bpf_* externs, no loops left), computes each\n"
    "handler's worst-case stack and writes one package file (docs/handler-package.md). For each\n"
    "handler it prints a line 'NAME KIND stack N bytes'. The same source and options give a\n"
    "byte-identical package, wherever it is built.\n"
    "\n"
    "  spinc [options] SOURCE -o PACKAGE     check, compile, verify and package SOURCE\n"
    "  spinc --check-only [options] SOURCE   only check SOURCE (--verify: in clang -verify mode)\n"
    "  spinc --inspect PACKAGE               show what PACKAGE holds";

const char* const footer =
    "Exit status:\n"
    "  0  the package was written (or the check passed, or the package was shown)\n"
    "  1  the source was rejected: checker findings, clang errors, an object that fails verification,\n"
    "     a handler over the stack limit (diagnostics on stderr, clang style: file:line:col); or\n"
    "     --inspect found the package corrupted\n"
    "  2  usage error or internal failure: bad option, missing input file, unwritable output,\n"
    "     clang-16 missing or killed\n"
    "\n"
    "Environment:\n"
    "  SPINC_CLANG  path of the clang++ to run (default: the clang++-16 found when spinc was built)\n"
    "  TMPDIR       where spinc keeps its temporary files while it works\n"
    "  SPINC_KEEP_TEMPS=1  keep the temporary files (clang's objects, IR, stack usage) and print\n"
    "               where they are\n"
    "\n"
    "Examples:\n"
    "  spinc reduce_handlers.cpp -o reduce.spkg\n"
    "  spinc --target ebpf -I include -D ELEMENTS=256 reduce_handlers.cpp -o reduce-bpf.spkg\n"
    "  spinc --check-only --target ebpf reduce_handlers.cpp\n"
    "  spinc --inspect reduce.spkg";

const char* kind_name(spin::handler_kind k) {
  switch (k) {
  case spin::handler_kind::header: return "header";
  case spin::handler_kind::payload: return "payload";
  case spin::handler_kind::completion: return "completion";
  }
  return "?";
}

// The directory `path` would be created in must exist and be writable.
bool output_writable(const std::string& path, std::string& why) {
  if (llvm::sys::fs::is_directory(path)) {
    why = path + " is a directory";
    return false;
  }
  llvm::StringRef dir = llvm::sys::path::parent_path(path);
  if (dir.empty()) dir = ".";
  if (!llvm::sys::fs::is_directory(dir)) {
    why = "directory " + dir.str() + " does not exist";
    return false;
  }
  if (std::error_code ec = llvm::sys::fs::access(dir, llvm::sys::fs::AccessMode::Write)) {
    why = "directory " + dir.str() + " is not writable: " + ec.message();
    return false;
  }
  if (llvm::sys::fs::exists(path)) {
    if (std::error_code ec = llvm::sys::fs::access(path, llvm::sys::fs::AccessMode::Write)) {
      why = path + " is not writable: " + ec.message();
      return false;
    }
  }
  return true;
}

int inspect(const std::string& path) {
  auto pkg = spin::rt::read_package_file(path);
  if (!pkg) {
    const std::string& why = pkg.err().message;
    if (why.find(path) != std::string::npos) std::fprintf(stderr, "spinc: %s\n", why.c_str());
    else std::fprintf(stderr, "spinc: %s: %s\n", path.c_str(), why.c_str());
    return pkg.err().code == spin::errc::not_found ? exit_usage : exit_rejected;
  }
  std::printf("%s\n", spin::rt::manifest_json(pkg->manifest).c_str());
  auto summary = spin::cc::describe_object(pkg->manifest.target, pkg->object);
  if (!summary) {
    std::fprintf(stderr, "spinc: %s: the object does not match the manifest: %s\n", path.c_str(),
                 summary.err().message.c_str());
    return exit_rejected;
  }
  std::fputs(summary->c_str(), stdout);
  return exit_ok;
}

int run(int argc, char** argv) {
  CLI::App app{description, "spinc"};
  app.footer(footer);
  app.set_version_flag("--version", spin::cc::compiler_version() + "\nhandler headers: " + spin::cc::handler_include_dir(),
                       "print the version (spinc and clang) and the handler headers it compiles with, and exit");
  app.get_formatter()->column_width(30);

  std::string source, output, target_name = "native", march, inspect_path, object_path;
  std::uint32_t stack_limit = 0;
  std::vector<std::string> include_dirs, defines;
  bool check_only = false, verify = false, verbose = false, count_instructions = false;

  app.add_option("source", source, "the handler source file (C++20, restricted; includes <spin/handler.hpp>)");
  app.add_option("-o,--output", output, "write the handler package to FILE (replaced if it exists)")
      ->option_text("FILE");
  app.add_option("--target", target_name,
                 "native: x86-64 ELF shared object run directly on HPU threads (default);\n"
                 "ebpf: BPF object for DPDK's rte_bpf (integer code only, loops must unroll)")
      ->check(CLI::IsMember({"native", "ebpf"}))
      ->option_text("native|ebpf");
  app.add_option("--march", march,
                 "x86-64 microarchitecture level of the native object: x86-64, x86-64-v2 (default),\n"
                 "x86-64-v3 or x86-64-v4 (the levels the loader can check a CPU against); native only")
      ->check(CLI::IsMember({"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"}))
      ->option_text("LEVEL");
  app.add_option("--stack-limit", stack_limit,
                 "largest worst-case stack per handler in bytes, callees included\n"
                 "(default 1024 for native: a PsPIN HPU stack; 512 for ebpf: the BPF stack)")
      ->check(CLI::Range(std::uint32_t{1}, std::uint32_t{1} << 30))
      ->option_text("BYTES");
  app.add_option("-I", include_dirs, "add DIR to the include path (repeatable)")
      ->allow_extra_args(false)
      ->option_text("DIR");
  app.add_option("-D", defines, "define a macro, NAME or NAME=VALUE (repeatable)")
      ->allow_extra_args(false)
      ->option_text("NAME[=VALUE]");
  app.add_flag("--count-instructions", count_instructions,
               "also build the counted object: the handlers counting the instructions a modelled\n"
               "HPU executes, which spin-emu's virtual time charges (docs/virtual-time.md); native only");
  app.add_flag("--check-only", check_only, "run the checker only: report findings, compile nothing");
  app.add_flag("--verify", verify,
               "run the checker only, in clang -verify mode: the diagnostics must match the\n"
               "'// expected-error {{...}}' comments of the file (for tests)");
  app.add_option("--inspect", inspect_path,
                 "decode the package FILE and print its manifest (JSON) and a summary of its object;\n"
                 "a corrupted package is reported with the problem")
      ->option_text("FILE");
  app.add_option("--emit-object", object_path, "also write the bare compiled object to FILE")->option_text("FILE");
  app.add_flag("-v,--verbose", verbose, "print each clang command line before it runs (stderr)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return exit_usage;
  }

  if (!inspect_path.empty()) {
    if (!source.empty() || !output.empty() || check_only || verify || !object_path.empty()) {
      std::fprintf(stderr, "spinc: --inspect takes only the package file; run with --help for more information\n");
      return exit_usage;
    }
    return inspect(inspect_path);
  }
  if (source.empty()) {
    std::fprintf(stderr, "spinc: no source file given; run with --help for more information\n");
    return exit_usage;
  }
  spin::cc::build_options opts;
  opts.tgt = target_name == "ebpf" ? spin::cc::target::ebpf : spin::cc::target::native;
  if (!march.empty()) {
    if (opts.tgt == spin::cc::target::ebpf) {
      std::fprintf(stderr, "spinc: --march applies to the native target only\n");
      return exit_usage;
    }
    opts.march = march;
  }
  if (count_instructions && opts.tgt == spin::cc::target::ebpf) {
    std::fprintf(stderr, "spinc: --count-instructions applies to the native target only\n");
    return exit_usage;
  }
  opts.count_instructions = count_instructions;
  opts.stack_limit_bytes = stack_limit;
  opts.include_dirs = include_dirs;
  opts.defines = defines;
  opts.verbose = verbose ? spin::cc::verbosity::commands : spin::cc::verbosity::quiet;
  if (!llvm::sys::fs::exists(source)) {
    std::fprintf(stderr, "spinc: cannot read %s: no such file\n", source.c_str());
    return exit_usage;
  }

  if (check_only || verify) {
    if (!output.empty() || !object_path.empty()) {
      std::fprintf(stderr, "spinc: --check-only and --verify write no output; drop -o / --emit-object\n");
      return exit_usage;
    }
    spin::cc::check_options co = spin::cc::make_check_options(opts);
    if (verify) co.mode = spin::cc::diagnostics_mode::verify;
    const spin::cc::check_report rep = spin::cc::check_file(source, co);
    return rep.ok ? exit_ok : exit_rejected;
  }

  if (output.empty() && object_path.empty()) {
    std::fprintf(stderr, "spinc: no output: give -o FILE (or --emit-object FILE); run with --help for more information\n");
    return exit_usage;
  }
  for (const std::string* out : {&output, &object_path}) {
    std::string why;
    if (!out->empty() && !output_writable(*out, why)) {
      std::fprintf(stderr, "spinc: cannot write %s: %s\n", out->c_str(), why.c_str());
      return exit_usage;
    }
  }

  auto pkg = spin::cc::build_package(source, opts);
  if (!pkg) {
    const spin::error& e = pkg.err();
    if (e.code == spin::errc::invalid_argument) {
      std::fprintf(stderr, "%s\n", e.message.c_str());
      return exit_rejected;
    }
    std::fprintf(stderr, "spinc: error: %s\n", e.message.c_str());
    return exit_usage;
  }
  for (const spin::rt::package_handler& h : pkg->manifest.handlers)
    std::printf("%s %s stack %u bytes\n", h.name.c_str(), kind_name(h.kind), h.stack_bytes);
  if (!object_path.empty()) {
    std::ofstream os(object_path, std::ios::binary | std::ios::trunc);
    os.write(reinterpret_cast<const char*>(pkg->object.data()), static_cast<std::streamsize>(pkg->object.size()));
    os.close();
    if (!os) {
      std::fprintf(stderr, "spinc: cannot write %s\n", object_path.c_str());
      return exit_usage;
    }
  }
  if (!output.empty()) {
    auto w = spin::rt::write_package_file(output, *pkg);
    if (!w) {
      std::fprintf(stderr, "spinc: %s\n", w.err().message.c_str());
      return exit_usage;
    }
  }
  return exit_ok;
}

} // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spinc: internal error: %s\n", e.what());
    return exit_usage;
  }
}
