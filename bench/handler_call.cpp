// handler_call: nanoseconds per handler call for the same integer handlers built as native code,
// run by DPDK's rte_bpf JIT and by its interpreter, in one run, side by side.
//
// A call here is what an HPU does per packet once the runtime has picked the handler: build
// the context and call. For eBPF that includes the engine's work (context copy, packet copy
// into the bounce buffer, bridge calls for memory windows). Handlers come from packages spinc
// built at build time (bench/meson.build); the handlers make no runtime API calls, so the
// context carries no runtime. Each figure is the median of several timed rounds after a
// warm-up round.
//
// Exit status: 0 when every variant ran and all three produced the same handler memory; 1 when
// they disagree; 2 on bad arguments or a package that does not load.
#include <spin/rt/loader.hpp>

#include "common.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>


namespace {

struct variant {
  const char* name;
  spin::rt::loaded_package pkg;
};

const spin::rt::handler_ref* payload_of(const spin::rt::loaded_package& p) { return &p.handlers().payload; }

// Times `calls` calls of handler `h` on one packet; returns ns per call and leaves the handler
// memory in `mem`.
double time_calls(const spin::rt::handler_ref& h, std::vector<std::uint8_t>& packet, std::vector<std::uint8_t>& mem,
                  std::uint64_t mem_len, std::uint64_t calls, int rounds) {
  spin::ctx c{};
  c.size_bytes = sizeof(spin::ctx);
  c.abi_version = spin::abi_version;
  c.packet = spin::byte_view{packet.data(), packet.size()};
  c.handler_mem = spin::byte_view{mem.data(), mem_len};
  c.msg.packet_count = 1;
  c.msg.message_len_bytes = packet.size();
  c.kind = static_cast<spin::u32>(spin::handler_kind::payload);
  std::vector<double> ns;
  for (int r = 0; r <= rounds; ++r) {
    std::memset(mem.data(), 0, mem.size());
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint64_t i = 0; i < calls; ++i) {
      c.msg.packet_index = static_cast<spin::u32>(i & 1023);
      const std::int32_t ret = h.native != nullptr ? static_cast<std::int32_t>(h.native(&c)) : h.engine(h.prog, &c);
      if (ret != 0) return -1;
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (r > 0) ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(calls));
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"handler_call: ns per handler call, native vs eBPF-JIT vs eBPF-interpreter"};
  std::string dir, json_path;
  std::uint64_t calls = 2'000'000;
  int rounds = 5;
  std::vector<std::uint32_t> sizes{64, 1024};
  std::vector<std::string> handlers{"call_touch", "call_sum16", "call_mix64"};
  app.add_option("--dir", dir, "directory with <handler>.native.spkg and <handler>.ebpf.spkg (built from bench/handlers/)")->required();
  app.add_option("--handler", handlers, "handlers to time");
  app.add_option("--calls", calls, "calls per timed round")->check(CLI::Range(std::uint64_t{1000}, std::uint64_t{1} << 32));
  app.add_option("--rounds", rounds, "timed rounds (median reported)")->check(CLI::Range(1, 100));
  app.add_option("--payload", sizes, "payload sizes in bytes")->check(CLI::Range(64u, 65536u));
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is a ParseError with exit code 0
  }

  spin::bench::run_conditions cond = spin::bench::measure_conditions();
  cond.print("handler_call");
  std::printf("%llu calls x %d rounds, median\n", static_cast<unsigned long long>(calls), rounds);
  std::printf("%-12s %8s %11s %11s %14s %10s %12s\n", "handler", "payload", "native ns", "ebpf-jit ns", "ebpf-interp ns",
              "jit/native", "interp/jit");
  nlohmann::json out = nlohmann::json::array();
  bool agree = true;
  for (const std::string& hname : handlers) {
    std::vector<variant> vs;
    for (auto [name, target, exec] : {std::tuple{"native", "native", spin::rt::bpf_exec::jit},
                                      std::tuple{"ebpf-jit", "ebpf", spin::rt::bpf_exec::jit},
                                      std::tuple{"ebpf-interp", "ebpf", spin::rt::bpf_exec::interpreter}}) {
      spin::rt::load_options o;
      o.bpf = exec;
      auto lp = spin::rt::load_package_file(dir + "/" + hname + "." + target + ".spkg", o);
      if (!lp) {
        std::fprintf(stderr, "handler_call: %s\n", lp.err().message.c_str());
        return 2;
      }
      if (!lp->handlers().payload) {
        std::fprintf(stderr, "handler_call: %s has no payload handler\n", hname.c_str());
        return 2;
      }
      vs.push_back({name, std::move(lp.value())});
    }
    const std::uint64_t mem_len = vs[0].pkg.manifest().handler_mem_bytes;
    for (std::uint32_t size : sizes) {
      std::vector<std::uint8_t> packet(size);
      for (std::uint32_t i = 0; i < size; ++i) packet[i] = static_cast<std::uint8_t>(i * 7 + 3);
      double ns[3];
      std::vector<std::uint8_t> mems[3];
      for (std::size_t k = 0; k < 3; ++k) {
        // Handler memory with the guard eBPF windows may reach past its end (handler_set::guard_bytes).
        mems[k].assign(mem_len + spin::bpf_window_bytes, 0);
        ns[k] = time_calls(*payload_of(vs[k].pkg), packet, mems[k], mem_len, calls, rounds);
        if (ns[k] < 0) {
          std::fprintf(stderr, "handler_call: %s (%s) did not return success\n", hname.c_str(), vs[k].name);
          return 1;
        }
      }
      if (mems[0] != mems[1] || mems[0] != mems[2]) agree = false;
      std::printf("%-12s %6u B %11.2f %11.2f %14.2f %10.2f %12.2f\n", hname.c_str(), size, ns[0], ns[1], ns[2], ns[1] / ns[0],
                  ns[2] / ns[1]);
      out.push_back({{"handler", hname}, {"payload_bytes", size}, {"native_ns", ns[0]}, {"ebpf_jit_ns", ns[1]}, {"ebpf_interp_ns", ns[2]}});
    }
  }
  cond.load_after = spin::bench::load_average();
  std::printf("load average after: %.2f %.2f %.2f\n", cond.load_after[0], cond.load_after[1], cond.load_after[2]);
  if (!json_path.empty() && !spin::bench::write_text(json_path, nlohmann::json{{"conditions", cond.to_json()}, {"results", out}}.dump(2) + "\n"))
    return 2;
  if (!agree) {
    std::fprintf(stderr, "handler_call: native, JIT and interpreter left different handler memory\n");
    return 1;
  }
  return 0;
}
