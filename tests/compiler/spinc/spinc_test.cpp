// spinc: the handler compiler driver, end to end (the spinc executable) and its object and
// stack-size functions on their own (object.hpp).
#include <spin/cc/object.hpp>
#include <spin/rt/loader.hpp>
#include <spin/rt/package.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using spin::handler_kind;

const std::string spinc = SPINC_TEST_EXE;
const std::string inputs = SPINC_TEST_INPUTS;
const std::string clangxx = SPINC_TEST_CLANG;
const std::string handlers_include = SPINC_TEST_HANDLERS_INCLUDE;
const std::string objdump = SPINC_TEST_OBJDUMP;

// A fresh directory, removed with its contents at the end of the test.
struct scratch_dir {
  fs::path path;
  scratch_dir() {
    std::string tmpl = (fs::temp_directory_path() / "spinc-test-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::byte> read_bytes(const std::string& path) {
  const std::string s = read_text(path);
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

struct proc {
  int exit_code = -1;
  std::string out, err;
};

// Runs argv[0] with argv in `cwd` (inherited when empty) with extra environment entries
// ("NAME=VALUE", replacing inherited ones).
proc run(const std::vector<std::string>& args, const std::string& cwd = {}, const std::vector<std::string>& env = {}) {
  scratch_dir io;
  const std::string out = io / "stdout", err = io / "stderr";
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& x) {
      return entry.substr(0, entry.find('=') + 1) == x.substr(0, x.find('=') + 1);
    });
    if (!replaced) envs.push_back(entry);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<std::string> argv_s = args;
  std::vector<char*> argv, envp;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE_MESSAGE(rc == 0, "cannot start " << args[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) REQUIRE(errno == EINTR);
  proc p;
  p.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  p.out = read_text(out);
  p.err = read_text(err);
  return p;
}

proc spinc_run(std::vector<std::string> args, const std::string& cwd = {}, const std::vector<std::string>& env = {}) {
  args.insert(args.begin(), spinc);
  return run(args, cwd, env);
}

const char* kind_name(handler_kind k) {
  return k == handler_kind::header ? "header" : k == handler_kind::payload ? "payload" : "completion";
}

std::string input(const char* name) { return inputs + "/" + name; }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

spin::rt::package read_package(const std::string& path) {
  auto p = spin::rt::read_package_file(path);
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? std::string() : p.err().message));
  return std::move(p).value();
}

} // namespace

TEST_SUITE("compiler") {

TEST_CASE("an integer handler file compiles to a native package listing its handlers, kinds, memory and stack sizes") {
  scratch_dir dir;
  const proc p = spinc_run({input("counters.cpp"), "-o", dir / "counters.spkg"});
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  const spin::rt::package pkg = read_package(dir / "counters.spkg");
  const spin::rt::package_manifest& m = pkg.manifest;
  CHECK(m.target == spin::rt::package_target::native_x86_64);
  CHECK(m.abi_version == spin::abi_version);
  CHECK(m.march == "x86-64-v2");
  CHECK(m.compiler.rfind("spinc 0.1.0 (clang 16.", 0) == 0);
  CHECK(m.source_name == "counters.cpp");
  CHECK(m.handler_mem_bytes == 32);
  CHECK(m.scratchpad_bytes == 64);
  CHECK(m.stack_limit_bytes == 1024);
  REQUIRE(m.handlers.size() == 3);
  CHECK(m.handlers[0].name == "count_header");
  CHECK(m.handlers[0].kind == handler_kind::header);
  CHECK(m.handlers[1].name == "count_payload");
  CHECK(m.handlers[1].kind == handler_kind::payload);
  CHECK(m.handlers[2].name == "count_completion");
  CHECK(m.handlers[2].kind == handler_kind::completion);
  std::string lines;
  for (const auto& h : m.handlers) {
    CHECK(h.stack_bytes >= 8); // at least the return address
    CHECK(h.stack_bytes <= 1024);
    lines += h.name + " " + kind_name(h.kind) + " stack " + std::to_string(h.stack_bytes) + " bytes\n";
  }
  CHECK(p.out == lines);

  // The source hash is the SHA-256 of the file's bytes.
  const proc sum = run({"/usr/bin/sha256sum", input("counters.cpp")});
  REQUIRE(sum.exit_code == 0);
  CHECK(sum.out.substr(0, 64) == m.source_sha256);

  // The object: an x86-64 shared object without undefined symbols that exports exactly the
  // handlers, each in its section.
  auto facts = spin::cc::inspect_native_object(pkg.object);
  REQUIRE_MESSAGE(facts.ok(), (facts.ok() ? std::string() : facts.err().message));
  CHECK(facts->undefined.empty());
  std::set<std::string> exported;
  for (const auto& s : facts->exported) {
    CHECK(s.function);
    CHECK(s.section == ".spin." + std::string(s.name == "count_header" ? "header" : s.name == "count_payload" ? "payload" : "completion") + "." + s.name);
    exported.insert(s.name);
  }
  CHECK(exported == std::set<std::string>{"count_header", "count_payload", "count_completion"});
  CHECK(facts->memory.declared);
  CHECK(facts->memory.handler_mem_bytes == 32);

  const proc v3 = spinc_run({"--march", "x86-64-v3", input("counters.cpp"), "-o", dir / "v3.spkg"});
  REQUIRE(v3.exit_code == 0);
  CHECK(read_package(dir / "v3.spkg").manifest.march == "x86-64-v3");
}

TEST_CASE("the same file compiles to an eBPF package whose programs are exactly the handlers, calling only the spin API") {
  scratch_dir dir;
  const proc p = spinc_run({"--target", "ebpf", input("counters.cpp"), "-o", dir / "counters.spkg", "--emit-object", dir / "counters.o"});
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  const spin::rt::package pkg = read_package(dir / "counters.spkg");
  CHECK(pkg.manifest.target == spin::rt::package_target::ebpf);
  CHECK(pkg.manifest.march.empty());
  CHECK(pkg.manifest.stack_limit_bytes == 512);
  CHECK(pkg.manifest.handler_mem_bytes == 32);
  CHECK(pkg.manifest.scratchpad_bytes == 64);
  REQUIRE(pkg.manifest.handlers.size() == 3);
  for (const auto& h : pkg.manifest.handlers) CHECK(h.stack_bytes <= 512);
  CHECK(read_bytes(dir / "counters.o") == pkg.object);

  auto facts = spin::cc::inspect_bpf_object(pkg.object);
  REQUIRE_MESSAGE(facts.ok(), (facts.ok() ? std::string() : facts.err().message));
  CHECK(facts->has_btf);
  CHECK(facts->has_btf_ext);
  std::set<std::string> names;
  for (const auto& prog : facts->programs) {
    names.insert(prog.name);
    CHECK(prog.section.rfind(".spin.", 0) == 0);
    CHECK(prog.loops.empty());
    for (const auto& r : prog.references) {
      CHECK(r.call);
      CHECK(r.external);
      CHECK(r.symbol.rfind("spin_bpf_", 0) == 0);
    }
  }
  CHECK(names == std::set<std::string>{"count_header", "count_payload", "count_completion"});
}

TEST_CASE("the runtime loads what spinc writes: native through dlopen, eBPF through DPDK's validator and JIT") {
  scratch_dir dir;
  for (const char* tgt : {"native", "ebpf"}) {
    CAPTURE(tgt);
    for (const char* file : {"counters.cpp", "guarded_loop.cpp", "struct_copy.cpp"}) {
      CAPTURE(file);
      const proc p = spinc_run({"--target", tgt, input(file), "-o", dir / "p.spkg"});
      INFO(p.err);
      REQUIRE(p.exit_code == 0);
      for (auto exec : {spin::rt::bpf_exec::jit, spin::rt::bpf_exec::interpreter}) {
        auto loaded = spin::rt::load_package_file(dir / "p.spkg", {exec});
        CHECK_MESSAGE(loaded.ok(), (loaded.ok() ? std::string() : loaded.err().message));
      }
    }
  }
}

TEST_CASE("spinc --inspect prints the manifest and a summary of the object; a corrupted package is named") {
  scratch_dir dir;
  REQUIRE(spinc_run({input("counters.cpp"), "-o", dir / "n.spkg"}).exit_code == 0);
  REQUIRE(spinc_run({"--target", "ebpf", input("counters.cpp"), "-o", dir / "b.spkg"}).exit_code == 0);

  const proc n = spinc_run({"--inspect", dir / "n.spkg"});
  CHECK(n.exit_code == 0);
  CHECK(contains(n.out, "\"target\": \"x86_64\""));
  CHECK(contains(n.out, "\"name\": \"count_payload\""));
  CHECK(contains(n.out, "x86-64 ELF shared object"));
  CHECK(contains(n.out, "exports function count_header"));
  CHECK(contains(n.out, "undefined symbols: none"));

  const proc b = spinc_run({"--inspect", dir / "b.spkg"});
  CHECK(b.exit_code == 0);
  CHECK(contains(b.out, "\"target\": \"ebpf\""));
  CHECK(contains(b.out, "program count_payload (section .spin.payload.count_payload)"));
  CHECK(contains(b.out, "spin_bpf_"));

  // Flip one byte of the object: the CRC no longer matches.
  std::string bytes = read_text(dir / "n.spkg");
  bytes[bytes.size() - 100] = static_cast<char>(bytes[bytes.size() - 100] ^ 0x5a);
  std::ofstream(dir / "bad.spkg", std::ios::binary) << bytes;
  const proc bad = spinc_run({"--inspect", dir / "bad.spkg"});
  CHECK(bad.exit_code == 1);
  CHECK(contains(bad.err, "bad.spkg"));
  CHECK(!bad.err.empty());

  const proc missing = spinc_run({"--inspect", dir / "none.spkg"});
  CHECK(missing.exit_code == 2);
  CHECK(contains(missing.err, "none.spkg"));
}

TEST_CASE("rebuilding the same source from another directory, temporary directory and output directory gives a byte-identical package") {
  scratch_dir a, b, copy;
  // The second build also reads the source from another place.
  fs::copy_file(input("counters.cpp"), copy / "counters.cpp");
  for (const char* tgt : {"native", "ebpf"}) {
    CAPTURE(tgt);
    const proc first = spinc_run({"--target", tgt, input("counters.cpp"), "-o", a / "p.spkg"}, inputs);
    REQUIRE(first.exit_code == 0);
    const proc second = spinc_run({"--target", tgt, "counters.cpp", "-o", b / "p.spkg"}, copy.path.string(),
                                  {"TMPDIR=" + b.path.string()});
    INFO(second.err);
    REQUIRE(second.exit_code == 0);
    CHECK(read_text(a / "p.spkg") == read_text(b / "p.spkg"));
    const proc third = spinc_run({"--target", tgt, input("counters.cpp"), "-o", a / "p2.spkg"}, "/");
    REQUIRE(third.exit_code == 0);
    CHECK(read_text(a / "p.spkg") == read_text(a / "p2.spkg"));
  }
}

TEST_CASE("a handler over the stack limit is rejected at its location, and --stack-limit raises the limit") {
  scratch_dir dir;
  // Native: 200 u64 on the stack, over the default 1024 bytes.
  const proc over = spinc_run({input("big_stack.cpp"), "-o", dir / "p.spkg"});
  CHECK(over.exit_code == 1);
  CHECK(contains(over.err, "big_stack.cpp:11:22: error: handler 'deep_frame' needs "));
  CHECK(contains(over.err, "more than the limit of 1024 bytes"));
  CHECK(!fs::exists(dir / "p.spkg"));

  const proc raised = spinc_run({"--stack-limit", "4096", input("big_stack.cpp"), "-o", dir / "p.spkg"});
  INFO(raised.err);
  REQUIRE(raised.exit_code == 0);
  const spin::rt::package pkg = read_package(dir / "p.spkg");
  REQUIRE(pkg.manifest.handlers.size() == 1);
  CHECK(pkg.manifest.handlers[0].stack_bytes >= 1600);
  CHECK(pkg.manifest.stack_limit_bytes == 4096);

  // eBPF: 40 u64 fit the default 512 bytes, not a limit of 256.
  const proc fits = spinc_run({"--target", "ebpf", "-DSTACK_WORDS=40", input("big_stack.cpp"), "-o", dir / "b.spkg"});
  INFO(fits.err);
  CHECK(fits.exit_code == 0);
  CHECK(contains(fits.out, "deep_frame payload stack 320 bytes"));
  const proc tight = spinc_run({"--target", "ebpf", "-DSTACK_WORDS=40", "--stack-limit", "256", input("big_stack.cpp"), "-o", dir / "b.spkg"});
  CHECK(tight.exit_code == 1);
  CHECK(contains(tight.err, "big_stack.cpp:11:22: error: handler 'deep_frame' needs 320 bytes of stack"));
  // Over the BPF stack itself, clang refuses it; spinc passes its words on.
  const proc bpf_over = spinc_run({"--target", "ebpf", input("big_stack.cpp"), "-o", dir / "b.spkg"});
  CHECK(bpf_over.exit_code == 1);
  CHECK(contains(bpf_over.err, "BPF stack limit of 512 bytes"));
}

TEST_CASE("an eBPF loop clang does not unroll is rejected naming the handler and the loop's line") {
  scratch_dir dir;
  const proc p = spinc_run({"--target", "ebpf", input("long_loop.cpp"), "-o", dir / "p.spkg"});
  CHECK(p.exit_code == 1);
  CHECK(contains(p.err, "long_loop.cpp:14:"));
  CHECK(contains(p.err, "handler 'sum_words' has a loop clang did not unroll"));
  CHECK(!fs::exists(dir / "p.spkg"));
  // The same file is fine natively: loops are allowed there. It declares no memory.
  REQUIRE(spinc_run({input("long_loop.cpp"), "-o", dir / "n.spkg"}).exit_code == 0);
  const spin::rt::package pkg = read_package(dir / "n.spkg");
  CHECK(pkg.manifest.handler_mem_bytes == 0);
  CHECK(pkg.manifest.scratchpad_bytes == 0);
}

TEST_CASE("spinc unrolls an eBPF loop with a constant bound that clang's -O2 leaves rolled") {
  scratch_dir dir;
  // Plain clang -O2 keeps this loop (no BTF without -g, so only the instructions are looked at).
  const proc cc = run({clangxx, "-target", "bpf", "-mcpu=v2", "-O2", "-std=c++20", "-ffreestanding", "-nostdinc++",
                       "-nostdlibinc", "-fno-exceptions", "-fno-rtti", "-I" + handlers_include, "-c",
                       input("guarded_loop.cpp"), "-o", dir / "plain.o"});
  INFO(cc.err);
  REQUIRE(cc.exit_code == 0);
  const proc dis = run({objdump, "-d", dir / "plain.o"});
  REQUIRE(dis.exit_code == 0);
  CHECK(contains(dis.out, "goto -"));

  const proc p = spinc_run({"--target", "ebpf", input("guarded_loop.cpp"), "-o", dir / "p.spkg"});
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  auto facts = spin::cc::inspect_bpf_object(read_package(dir / "p.spkg").object);
  REQUIRE(facts.ok());
  REQUIRE(facts->programs.size() == 1);
  CHECK(facts->programs[0].loops.empty());
}

TEST_CASE("inspect_bpf_object finds the loop of a data-bounded loop and its source line") {
  scratch_dir dir;
  // No spin API here, so clang's BTF writer needs no help; the loop bound comes from memory.
  std::ofstream(dir / "walk.cpp") << "extern \"C\" __attribute__((section(\".spin.payload.walk\"), used))\n"
                                     "int walk(const unsigned char* p) {\n"
                                     "  int s = 0;\n"
                                     "  for (int i = 0; i < p[0]; ++i) s += p[i + 1];\n"
                                     "  return s;\n"
                                     "}\n";
  const proc cc = run({clangxx, "-target", "bpf", "-mcpu=v2", "-O2", "-g", "-ffreestanding", "-c", dir / "walk.cpp", "-o", dir / "walk.o"});
  INFO(cc.err);
  REQUIRE(cc.exit_code == 0);
  auto facts = spin::cc::inspect_bpf_object(read_bytes(dir / "walk.o"));
  REQUIRE_MESSAGE(facts.ok(), (facts.ok() ? std::string() : facts.err().message));
  REQUIRE(facts->programs.size() == 1);
  const auto& prog = facts->programs[0];
  CHECK(prog.name == "walk");
  CHECK(prog.section == ".spin.payload.walk");
  REQUIRE(prog.loops.size() == 1);
  CHECK(prog.loops[0].target <= prog.loops[0].insn);
  CHECK(prog.loops[0].where.line == 4);
  CHECK(prog.loops[0].where.file.find("walk.cpp") != std::string::npos);
  CHECK(!facts->memory.declared);

  // Garbage is not an object.
  const std::vector<std::byte> junk(64, std::byte{0x42});
  CHECK(!spin::cc::inspect_bpf_object(junk).ok());
  CHECK(!spin::cc::inspect_native_object(junk).ok());
}

TEST_CASE("a struct copy that clang turns into memcpy still links: the native object has no undefined symbols") {
  scratch_dir dir;
  // Plain clang with spinc's native flags calls memcpy and memset for these copies...
  const proc cc = run({clangxx, "-target", "x86_64-linux-gnu", "-std=c++20", "-O2", "-ffreestanding", "-nostdinc++",
                       "-nostdlibinc", "-fno-exceptions", "-fno-rtti", "-fno-stack-protector", "-fPIC", "-march=x86-64-v2",
                       "-mno-red-zone", "-ffunction-sections", "-I" + handlers_include, "-c", input("struct_copy.cpp"), "-o",
                       dir / "plain.o"});
  INFO(cc.err);
  REQUIRE(cc.exit_code == 0);
  auto calls = spin::cc::inspect_native_relocatable(read_bytes(dir / "plain.o"));
  REQUIRE_MESSAGE(calls.ok(), (calls.ok() ? std::string() : calls.err().message));
  const auto& copy_callees = calls->callees.at("copy_block");
  const auto& clear_callees = calls->callees.at("clear_block");
  CHECK(std::find(copy_callees.begin(), copy_callees.end(), "memcpy") != copy_callees.end());
  CHECK(std::find(clear_callees.begin(), clear_callees.end(), "memset") != clear_callees.end());

  // ...and spinc's package links its own hidden copies.
  const proc p = spinc_run({input("struct_copy.cpp"), "-o", dir / "p.spkg"});
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  const spin::rt::package pkg = read_package(dir / "p.spkg");
  auto facts = spin::cc::inspect_native_object(pkg.object);
  REQUIRE(facts.ok());
  CHECK(facts->undefined.empty());
  std::set<std::string> exported;
  for (const auto& s : facts->exported) exported.insert(s.name);
  CHECK(exported == std::set<std::string>{"copy_block", "clear_block"});
  // memcpy's frame and return address count in the caller's stack.
  for (const auto& h : pkg.manifest.handlers) CHECK(h.stack_bytes >= 16);
}

TEST_CASE("a copy BPF can only do with memcpy is rejected with clang's message and a hint") {
  scratch_dir dir;
  const proc p = spinc_run({"--target", "ebpf", input("huge_copy.cpp"), "-o", dir / "p.spkg"});
  CHECK(p.exit_code == 1);
  CHECK(contains(p.err, "huge_copy.cpp:"));
  CHECK(contains(p.err, "memcpy"));
  CHECK(contains(p.err, "hint"));
}

TEST_CASE("usage and environment errors exit with status 2 and a message") {
  scratch_dir dir;
  const proc missing = spinc_run({dir / "absent.cpp", "-o", dir / "p.spkg"});
  CHECK(missing.exit_code == 2);
  CHECK(contains(missing.err, "absent.cpp"));

  const proc no_dir = spinc_run({input("counters.cpp"), "-o", dir / "no/such/dir/p.spkg"});
  CHECK(no_dir.exit_code == 2);
  CHECK(contains(no_dir.err, "cannot write"));
  const proc is_dir = spinc_run({input("counters.cpp"), "-o", dir.path.string()});
  CHECK(is_dir.exit_code == 2);
  CHECK(contains(is_dir.err, "is a directory"));

  const proc bad_target = spinc_run({"--target", "arm", input("counters.cpp"), "-o", dir / "p.spkg"});
  CHECK(bad_target.exit_code == 2);
  CHECK(contains(bad_target.err, "--target"));

  const proc no_output = spinc_run({input("counters.cpp")});
  CHECK(no_output.exit_code == 2);
  CHECK(contains(no_output.err, "-o"));

  const proc bad_march = spinc_run({"--march", "znver3", input("counters.cpp"), "-o", dir / "p.spkg"});
  CHECK(bad_march.exit_code == 2);
  CHECK(contains(bad_march.err, "znver3"));

  const proc march_bpf = spinc_run({"--target", "ebpf", "--march", "x86-64-v3", input("counters.cpp"), "-o", dir / "p.spkg"});
  CHECK(march_bpf.exit_code == 2);

  const proc no_clang = spinc_run({input("counters.cpp"), "-o", dir / "p.spkg"}, {}, {"SPINC_CLANG=" + (dir / "no-clang")});
  CHECK(no_clang.exit_code == 2);
  CHECK(contains(no_clang.err, "cannot run clang"));
  CHECK(!fs::exists(dir / "p.spkg"));

  const proc help = spinc_run({"--help"});
  CHECK(help.exit_code == 0);
  for (const char* word : {"--target", "--march", "--stack-limit", "-I", "-D", "--check-only", "--verify", "--inspect",
                           "--emit-object", "-v", "Exit status", "Example"})
    CHECK_MESSAGE(contains(help.out, word), word);
}

TEST_CASE("--check-only runs the checker and compiles nothing") {
  scratch_dir dir;
  const proc p = spinc_run({"--check-only", "-v", input("counters.cpp")});
  CHECK(p.exit_code == 0);
  CHECK(p.out.empty());
  CHECK(!contains(p.err, "clang++")); // -v shows no clang command: nothing was compiled
  const proc v = spinc_run({"-v", input("counters.cpp"), "-o", dir / "p.spkg"});
  CHECK(v.exit_code == 0);
  CHECK(contains(v.err, "-ffreestanding"));
  CHECK(contains(v.err, "-fno-stack-protector"));
  CHECK(contains(v.err, "-fno-delete-null-pointer-checks"));
}

TEST_CASE("clang's stack usage lines parse into function, line and bytes; malformed lines are named") {
  auto frames = spin::cc::parse_stack_usage("/dir:with:colons/x.cpp:12:_ZN2ns5otherEm\t48\tstatic\n"
                                            "x.cpp:3:handler\t0\tstatic\n"
                                            "x.cpp:9:_ZL3vlam\t16\tdynamic\n");
  REQUIRE(frames.ok());
  REQUIRE(frames->size() == 3);
  CHECK((*frames)[0].function == "_ZN2ns5otherEm");
  CHECK((*frames)[0].line == 12);
  CHECK((*frames)[0].bytes == 48);
  CHECK(!(*frames)[0].dynamic);
  CHECK((*frames)[2].dynamic);
  auto bad = spin::cc::parse_stack_usage("x.cpp:1:f\t8\tstatic\nnonsense\n");
  REQUIRE(!bad.ok());
  CHECK(contains(bad.err().message, "line 2"));
}

TEST_CASE("the worst-case stack adds the deepest callee chain and the return addresses, and refuses a cycle") {
  const std::map<std::string, std::uint64_t> frames = {{"h", 32}, {"a", 16}, {"b", 100}, {"c", 8}};
  const std::map<std::string, std::vector<std::string>> calls = {{"h", {"a", "c"}}, {"a", {"b"}}, {"c", {}}};
  auto s = spin::cc::worst_case_stack("h", frames, calls, 8);
  REQUIRE(s.ok());
  CHECK(*s == (8 + 32) + (8 + 16) + (8 + 100)); // h -> a -> b is the deepest
  CHECK(spin::cc::worst_case_stack("c", frames, calls, 0).value() == 8);
  CHECK(spin::cc::worst_case_stack("unknown", frames, calls, 8).value() == 8);
  auto cyc = spin::cc::worst_case_stack("h", frames, {{"h", {"a"}}, {"a", {"h"}}}, 8);
  REQUIRE(!cyc.ok());
  CHECK(contains(cyc.err().message, "h -> a -> h"));
}

} // TEST_SUITE
