// stream_reduce: R ranks send int32 vectors to one emulated NIC; sPIN handlers sum them in NIC
// memory while the packets stream in (in any order, on several HPUs) and DMA the sum to the
// host. The host checks the result against its own sum and prints the NIC's statistics.
//
//   stream_reduce [--ranks 8] [--elements 262144] [--hpus 2] [--packet-bytes 1024] [--seed 1]
//                 [--json stats.json]
#include "reduce_layout.hpp"

#include <spin/rt/runtime.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

extern "C" spin::ret reduce_header(spin::ctx*);
extern "C" spin::ret reduce_payload(spin::ctx*);
extern "C" spin::ret reduce_completion(spin::ctx*);

namespace {

namespace rt = spin::rt;

struct options {
  std::uint32_t ranks = 8;
  std::uint64_t elements = 1 << 18;
  std::uint32_t hpus = 2;
  std::uint32_t packet_bytes = 1024;
  std::uint64_t seed = 1;
  std::string json;
};

std::atomic<std::uint64_t> released{0};
void on_release(void*, std::uint64_t) noexcept { released.fetch_add(1, std::memory_order_relaxed); }

// Frames of every rank's contribution, interleaved in a random order as a switch would
// deliver them.
std::vector<std::vector<std::byte>> make_frames(const options& o, const std::vector<std::vector<std::int32_t>>& data) {
  std::vector<std::vector<std::byte>> frames;
  const std::uint64_t len = o.elements * sizeof(std::int32_t);
  const std::uint32_t count = static_cast<std::uint32_t>((len + o.packet_bytes - 1) / o.packet_bytes);
  for (std::uint32_t r = 0; r < o.ranks; ++r) {
    for (std::uint32_t k = 0; k < count; ++k) {
      rt::wire::header h;
      h.source_rank = r;
      h.match_bits = 0x5eed;
      h.message_id = 1;
      h.seq = k;
      h.offset = std::uint64_t{k} * o.packet_bytes;
      h.message_len = len;
      h.flags = rt::wire::position_flags(k, count);
      const std::size_t n = std::min<std::uint64_t>(o.packet_bytes, len - h.offset);
      const auto* payload = reinterpret_cast<const std::byte*>(data[r].data()) + h.offset;
      std::vector<std::byte> f(rt::wire::encoded_len(h, n));
      rt::wire::encode(rt::wire::rank_endpoint(r), rt::wire::rank_endpoint(0), h, std::span(payload, n), f);
      frames.push_back(std::move(f));
    }
  }
  std::mt19937_64 rng(o.seed);
  std::shuffle(frames.begin(), frames.end(), rng);
  return frames;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"stream_reduce: sum R int32 vectors in sPIN handlers on an emulated NIC"};
  app.add_option("--ranks", o.ranks, "contributing ranks")->check(CLI::Range(1u, 4096u));
  app.add_option("--elements", o.elements, "int32 elements per rank")->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 24));
  app.add_option("--hpus", o.hpus, "HPUs (each run by a thread of its own; this thread is HPU 0)")->check(CLI::Range(1u, 256u));
  app.add_option("--packet-bytes", o.packet_bytes, "payload bytes per packet (multiple of 4)")
      ->check(CLI::Range(4u, 8192u));
  app.add_option("--seed", o.seed, "seed of the data and of the arrival order");
  app.add_option("--json", o.json, "write the NIC statistics as JSON to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is a ParseError with exit code 0; bad arguments: 2
  }
  if (o.packet_bytes % 4 != 0) {
    std::fprintf(stderr, "stream_reduce: --packet-bytes must be a multiple of 4\n");
    return 2;
  }

  // Data of every rank and the expected sum.
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<std::int32_t>> data(o.ranks, std::vector<std::int32_t>(o.elements));
  std::vector<std::int64_t> expected(o.elements, 0);
  for (auto& v : data)
    for (std::uint64_t i = 0; i < o.elements; ++i) {
      v[i] = static_cast<std::int32_t>(rng());
      expected[i] += v[i];
    }
  const auto frames = make_frames(o, data);

  rt::runtime_config cfg;
  cfg.hpus = o.hpus;
  cfg.nic_memory_bytes = handler_memory_bytes(o.elements) + (1 << 20);
  cfg.release = on_release;
  auto nic = rt::runtime::create(cfg);
  if (!nic) {
    std::fprintf(stderr, "stream_reduce: %s\n", nic.err().message.c_str());
    return 1;
  }
  rt::runtime& r = **nic;
  std::vector<std::int64_t> result(o.elements, 0);
  auto region = r.register_host_memory(std::as_writable_bytes(std::span(result)));
  if (!region) {
    std::fprintf(stderr, "stream_reduce: %s\n", region.err().message.c_str());
    return 1;
  }
  rt::ec_config ec;
  ec.name = "stream_reduce";
  ec.match.bits = 0x5eed;
  ec.handlers = {reduce_header, reduce_payload, reduce_completion};
  ec.handler_mem_bytes = handler_memory_bytes(o.elements);
  ec.window = rt::host_window{*region, 0, o.elements * sizeof(std::int64_t)};
  ec.limits.max_messages = o.ranks;
  ec.limits.window_packets = static_cast<std::uint32_t>(frames.size() / o.ranks + 64);
  ec.limits.max_parked_packets = static_cast<std::uint32_t>(frames.size());
  auto id = r.install(ec);
  if (!id) {
    std::fprintf(stderr, "stream_reduce: %s\n", id.err().message.c_str());
    return 1;
  }
  const reduce_config rc{o.elements, o.ranks, 0, 0, accumulator_offset(o.elements)};
  std::memcpy(r.handler_memory(*id).data(), &rc, sizeof rc);

  std::printf("stream_reduce: %u ranks x %llu int32 (%llu KiB each) in %zu packets of up to %llu bytes, %u HPUs\n",
              o.ranks, static_cast<unsigned long long>(o.elements), static_cast<unsigned long long>(o.elements * 4 / 1024),
              frames.size(), static_cast<unsigned long long>(std::min<std::uint64_t>(o.packet_bytes, o.elements * 4)), o.hpus);

  std::vector<rt::packet> pkts(frames.size());
  for (std::size_t i = 0; i < frames.size(); ++i)
    pkts[i] = rt::packet{const_cast<std::byte*>(frames[i].data()), static_cast<std::uint32_t>(frames[i].size()), i};

  // Run to completion: this thread is HPU 0's lcore and receives every burst; the runtime runs
  // the packets of HPU 0's messages at once and steers the others to their HPU, whose lcore (a
  // thread of its own here) runs them.
  std::atomic<bool> stop{false};
  std::vector<std::thread> lcores;
  for (std::uint32_t k = 1; k < o.hpus; ++k)
    lcores.emplace_back([&r, &stop, k] {
      while (!stop.load(std::memory_order_relaxed))
        if (r.poll(k) == 0) std::this_thread::yield();
    });
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t fed = 0;
  while (fed < pkts.size()) {
    const auto n = static_cast<std::uint32_t>(std::min<std::size_t>(32, pkts.size() - fed));
    fed += r.rx_burst(0, pkts.data() + fed, n);
  }
  // Wait for the completion handler's event (bounded).
  rt::host_event ev[4];
  std::size_t got = 0;
  const auto deadline = t0 + std::chrono::seconds(60);
  while (got == 0 && std::chrono::steady_clock::now() < deadline) {
    r.poll(0);
    got = r.poll_events(*id, std::span(ev, 1));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop.store(true);
  for (auto& t : lcores) t.join();
  r.drain();
  if (got == 0) {
    std::fprintf(stderr, "stream_reduce: no result event within 60 s\n%s", rt::to_text(r.stats()).c_str());
    return 1;
  }
  if (ev[0].type == rt::host_event::kind::error) {
    std::fprintf(stderr, "stream_reduce: the NIC aborted message %llu from rank %u (%s: a handler exceeded its budget)\n%s",
                 static_cast<unsigned long long>(ev[0].message_id), ev[0].source_rank, spin::errc_name(ev[0].code),
                 rt::to_text(r.stats()).c_str());
    return 1;
  }
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < o.elements; ++i) wrong += result[i] != expected[i];
  const double bytes = static_cast<double>(o.ranks) * static_cast<double>(o.elements) * 4;
  std::printf("reduced %.1f MiB in %.3f ms: %.2f Mpps, %.2f Gbit/s of payload\n", bytes / (1 << 20), secs * 1e3,
              static_cast<double>(frames.size()) / secs / 1e6, bytes * 8 / secs / 1e9);
  std::printf("result: %s (%llu of %llu elements wrong), %llu of %zu frames returned by the NIC\n",
              wrong == 0 ? "exact" : "WRONG", static_cast<unsigned long long>(wrong),
              static_cast<unsigned long long>(o.elements), static_cast<unsigned long long>(released.load()),
              frames.size());
  const auto stats = r.stats();
  std::printf("\nNIC statistics\n%s", rt::to_text(stats).c_str());
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << rt::to_json(stats) << "\n";
    out.close();
    if (!out) {
      std::fprintf(stderr, "stream_reduce: cannot write %s\n", o.json.c_str());
      return 1;
    }
    std::printf("statistics written to %s\n", o.json.c_str());
  }
  return wrong == 0 && released.load() == frames.size() ? 0 : 1;
}
