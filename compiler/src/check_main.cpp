// spinc-check: runs the spinc checker on handler files (a test driver; spinc itself will call
// spin::cc::check_file before it compiles).
//
//   spinc-check [--target native|ebpf] [--verify] [-I dir]... [-D name[=value]]... file...
//
// Exit status: 0 when every file is accepted (with --verify: every diagnostic was expected),
// 1 when a file is rejected, CLI11's status for a bad command line.
#include <spin/cc/check.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"spinc-check: reports what a NIC cannot run in spin handler files, as clang diagnostics"};
  spin::cc::check_options opts;
  bool verify = false;
  bool list = false;
  std::vector<std::string> include_dirs;
  std::vector<std::string> defines;
  std::vector<std::string> files;
  const std::map<std::string, spin::cc::target> targets = {{"native", spin::cc::target::native},
                                                             {"ebpf", spin::cc::target::ebpf}};
  app.add_option("--target", opts.tgt, "target the handlers are checked for: native or ebpf")
      ->transform(CLI::CheckedTransformer(targets, CLI::ignore_case));
  app.add_flag("--verify", verify, "clang -verify: match the diagnostics with // expected-error {{...}} comments");
  app.add_option("-I", include_dirs, "add an include directory");
  app.add_option("-D", defines, "define a macro (name or name=value)");
  app.add_option("--max-unroll", opts.max_unroll, "eBPF target: largest loop trip count")->capture_default_str();
  app.add_flag("--list", list, "print the handlers and the call graph of each accepted file");
  app.add_option("files", files, "handler source files")->required()->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);

  opts.mode = verify ? spin::cc::diagnostics_mode::verify : spin::cc::diagnostics_mode::print;
  for (const auto& d : include_dirs) opts.clang_args.push_back("-I" + d);
  for (const auto& d : defines) opts.clang_args.push_back("-D" + d);

  int status = 0;
  for (const auto& f : files) {
    const spin::cc::check_report r = spin::cc::check_file(f, opts);
    if (!r.ok) {
      status = 1;
      continue;
    }
    if (!list) continue;
    for (const auto& h : r.handlers) {
      const char* kind = h.kind == spin::handler_kind::header    ? "header"
                         : h.kind == spin::handler_kind::payload ? "payload"
                                                                 : "completion";
      std::printf("handler %s %s %s:%u:%u\n", kind, h.name.c_str(), h.file.c_str(), h.line, h.col);
    }
    for (const auto& [fn, callees] : r.callees) {
      std::printf("calls %s:", fn.c_str());
      for (const auto& c : callees) std::printf(" %s", c.c_str());
      std::printf("\n");
    }
  }
  return status;
}
