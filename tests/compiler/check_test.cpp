// spin::cc::check_file as the build step sees it: handlers, call graph, error counts, targets.
// The diagnostics themselves are tested by the -verify inputs under check/.
#include <spin/cc/check.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

namespace {

const std::string source_root = SPIN_TEST_SOURCE_ROOT;
const std::string example = source_root + "/examples/stream_reduce/reduce_handlers.cpp";
std::string input(const std::string& name) { return source_root + "/tests/compiler/check/" + name; }

bool contains(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

} // namespace

TEST_SUITE("compiler") {
  TEST_CASE("the handlers of a file are listed in definition order with kind, section and location") {
    const spin::cc::check_report r = spin::cc::check_file(example, {});
    CHECK(r.ok);
    CHECK(r.errors == 0);
    REQUIRE(r.handlers.size() == 3);
    CHECK(r.handlers[0].name == "reduce_header");
    CHECK(r.handlers[0].kind == spin::handler_kind::header);
    CHECK(r.handlers[0].section == ".spin.header.reduce_header");
    CHECK(r.handlers[1].name == "reduce_payload");
    CHECK(r.handlers[1].kind == spin::handler_kind::payload);
    CHECK(r.handlers[2].name == "reduce_completion");
    CHECK(r.handlers[2].kind == spin::handler_kind::completion);
    CHECK(r.handlers[1].file == example);
    CHECK(r.handlers[1].line == 27);
    CHECK(r.handlers[1].col == 22);  // the handler's name inside SPIN_PAYLOAD_HANDLER(...)
  }

  TEST_CASE("the call graph lists each defined function's direct callees by mangled name") {
    const spin::cc::check_report r = spin::cc::check_file(example, {});
    REQUIRE(r.callees.count("reduce_payload") == 1);
    const auto& payload = r.callees.at("reduce_payload");
    CHECK(contains(payload, "_ZN4spin3ctx4lockEm"));
    CHECK(contains(payload, "_ZN4spin3ctx6unlockEm"));
    CHECK(std::is_sorted(payload.begin(), payload.end()));
    // API functions are nodes too: their frames count for the handler's stack.
    REQUIRE(r.callees.count("_ZN4spin3ctx3putEjmmmPKvjj") == 1);
    CHECK(r.callees.at("_ZN4spin3ctx3putEjmmmPKvjj") == std::vector<std::string>{"_ZN4spin3ctx4sendERKNS_9send_descE"});
    REQUIRE(r.callees.count("_Z18accumulator_offsetm") == 1);
    CHECK(r.callees.at("_Z18accumulator_offsetm") == std::vector<std::string>{"_Z10lock_countm"});
  }

  TEST_CASE("a recursive function is its own callee") {
    const spin::cc::check_report r = spin::cc::check_file(input("recursion_direct.cpp"), {});
    CHECK_FALSE(r.ok);
    REQUIRE(r.callees.count("_Z11total_bytesPKN4spin3ctxEj") == 1);
    CHECK(contains(r.callees.at("_Z11total_bytesPKN4spin3ctxEj"), "_Z11total_bytesPKN4spin3ctxEj"));
  }

  TEST_CASE("every finding of a file counts as one error, all reported in one run") {
    const spin::cc::check_report r = spin::cc::check_file(input("multi.cpp"), {});
    CHECK_FALSE(r.ok);
    CHECK(r.errors == 6);
    CHECK(r.handlers.size() == 1);  // a rejected file still lists its handlers
  }

  TEST_CASE("in verify mode a file whose diagnostics are all expected is accepted") {
    spin::cc::check_options o;
    o.mode = spin::cc::diagnostics_mode::verify;
    const spin::cc::check_report r = spin::cc::check_file(input("multi.cpp"), o);
    CHECK(r.ok);
    CHECK(r.errors == 0);
  }

  TEST_CASE("the eBPF target adds the loop and floating-point rules") {
    spin::cc::check_options o;
    CHECK(spin::cc::check_file(input("ok_loop_native.cpp"), o).ok);
    CHECK(spin::cc::check_file(input("ok_atomics.cpp"), o).ok);
    o.tgt = spin::cc::target::ebpf;
    const spin::cc::check_report loops = spin::cc::check_file(input("ok_loop_native.cpp"), o);
    CHECK_FALSE(loops.ok);
    CHECK(loops.errors >= 4);
    CHECK(spin::cc::check_file(input("ok_ebpf_loop.cpp"), o).ok);
    CHECK(std::string(spin::cc::target_name(o.tgt)) == "ebpf");
  }

  TEST_CASE("max_unroll bounds the trip count of eBPF loops") {
    spin::cc::check_options o;
    o.tgt = spin::cc::target::ebpf;
    o.max_unroll = 64;
    CHECK(spin::cc::check_file(input("ok_ebpf_loop.cpp"), o).ok);
    o.max_unroll = 63;
    const spin::cc::check_report r = spin::cc::check_file(input("ok_ebpf_loop.cpp"), o);
    CHECK_FALSE(r.ok);
    CHECK(r.errors == 2);  // the two 64-iteration loops
  }

  TEST_CASE("clang arguments reach the parse") {
    spin::cc::check_options o;
    CHECK(spin::cc::check_file(input("ok_template.cpp"), o).ok);
    o.clang_args = {"-Dclamp=("};
    CHECK_FALSE(spin::cc::check_file(input("ok_template.cpp"), o).ok);
    o.clang_args = {"-include", input("throw.cpp")};  // brings a second throw_on_short_packet
    CHECK_FALSE(spin::cc::check_file(input("throw.cpp"), o).ok);
  }

  TEST_CASE("a file that cannot be read is rejected with an error") {
    const spin::cc::check_report r = spin::cc::check_file(source_root + "/tests/compiler/check/no_such_file.cpp", {});
    CHECK_FALSE(r.ok);
    CHECK(r.errors >= 1);
    CHECK(r.handlers.empty());
  }
}
