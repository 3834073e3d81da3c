// host_hello: a first host program for spin-emu. It connects to a running spin-emu through its
// control socket (spin::host), installs the landing handler package (landing.cpp) on one
// emulated host, sends messages to it from another, checks every byte that lands in the
// receiver's memory and prints the receiver's counters (docs/emulator.md, "Quick start").
//
//   host_hello [--socket PATH] [--package PATH] [--from NODE] [--to NODE] [--bytes 5000]
//              [--messages 1] [--timeout-ms 5000]
//
// NODE is a node's name or index as `spinctl nodes` prints them. Exit status: 0 when every
// message arrived exactly; 1 on a wrong byte, a wrong or missing event, a failed send or an
// interrupt; 2 on bad arguments or when spin-emu cannot be reached or refuses the set-up.
#include <spin/host/host.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#ifndef HOST_HELLO_PACKAGE
#define HOST_HELLO_PACKAGE ""  // built without spinc: --package is required
#endif

namespace {

namespace host = spin::host;
using clock_type = std::chrono::steady_clock;

// Any value works, as long as the EC's match rule and the messages agree on it.
constexpr std::uint64_t hello_match_bits = 0x4e110;

struct options {
  std::string socket;
  std::string package = HOST_HELLO_PACKAGE;
  std::string from = "0";
  std::string to = "1";
  std::uint64_t bytes = 5000;
  std::uint32_t messages = 1;
  std::uint32_t timeout_ms = 5000;
};

std::atomic<bool> stop_flag{false};
extern "C" void on_signal(int) { stop_flag.store(true); }

std::string default_socket() {
  if (const char* s = std::getenv("SPIN_EMU_SOCKET"); s != nullptr && *s != '\0') return s;
  return "/run/spin-emu.sock";
}

// Exit status 2: the run could not start. Exit status 1: it ran and failed.
int cannot_run(const std::string& msg) {
  std::fprintf(stderr, "host_hello: %s\n", msg.c_str());
  return 2;
}
int failed(const std::string& msg) {
  std::fprintf(stderr, "host_hello: FAILED: %s\n", msg.c_str());
  return 1;
}
std::string describe(const spin::error& e) { return std::string(spin::errc_name(e.code)) + ": " + e.message; }

// A node given by name or index.
const host::node_info* find_node(const std::vector<host::node_info>& nodes, const std::string& key) {
  for (const auto& n : nodes)
    if (n.name == key || std::to_string(n.node) == key) return &n;
  return nullptr;
}

// Byte i of message k. Neighbouring messages differ, so a byte left over from the previous
// message is caught.
std::byte pattern(std::uint64_t k, std::uint64_t i) { return static_cast<std::byte>((i + 7 * k) % 251); }

// The receiver's counters that host_hello reports, from spin::host::client::stats.
struct counters {
  std::uint64_t rx_packets = 0, rx_bytes = 0, nic_drops = 0;                  // the NIC's ports
  std::uint64_t ec_packets = 0, ec_completed = 0, ec_deposit_bytes = 0, ec_events = 0, ec_drops = 0;  // the EC
};

spin::result<counters> read_counters(host::client& c, std::uint32_t node, spin::rt::ec_id ec) {
  auto nodes = c.stats();
  if (!nodes) return nodes.err();
  for (const auto& n : *nodes) {
    if (n.node != node) continue;
    counters k;
    for (const auto& p : n.stats.ports) {
      k.rx_packets += p.rx_packets;
      k.rx_bytes += p.rx_bytes;
    }
    k.nic_drops = n.stats.total_drops();
    for (const auto& e : n.stats.runtime.ecs) {
      if (e.ec_id != ec) continue;
      k.ec_packets = e.packets_in;
      k.ec_completed = e.messages_completed;
      k.ec_deposit_bytes = e.deposit_bytes;
      k.ec_events = e.events_posted;
      k.ec_drops = e.total_drops();
    }
    return k;
  }
  return spin::fail(spin::errc::not_found, "stats: no node " + std::to_string(node));
}

} // namespace

int main(int argc, char** argv) {
  // ---- arguments ----
  options o;
  o.socket = default_socket();
  CLI::App app{"host_hello: send messages between two hosts of a running spin-emu and check every byte"};
  app.add_option("--socket", o.socket, "spin-emu's control socket (default: $SPIN_EMU_SOCKET or /run/spin-emu.sock)");
  app.add_option("--package", o.package,
                 "handler package to install on the receiver (default: the landing.native.spkg of this build)");
  app.add_option("--from", o.from, "sending node: name or index as `spinctl nodes` prints them")->capture_default_str();
  app.add_option("--to", o.to, "receiving node: name or index")->capture_default_str();
  app.add_option("--bytes", o.bytes, "bytes per message")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{64} << 20))
      ->capture_default_str();
  app.add_option("--messages", o.messages, "messages to send, one after the other")
      ->check(CLI::Range(1u, 1'000'000u))
      ->capture_default_str();
  app.add_option("--timeout-ms", o.timeout_ms, "how long to wait for each message's event")
      ->check(CLI::Range(1u, 600'000u))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  if (o.package.empty()) return cannot_run("no --package given, and this build has no spinc to build landing.native.spkg");
  std::error_code ec_fs;
  if (!std::filesystem::is_regular_file(o.package, ec_fs))
    return cannot_run("handler package " + o.package +
                      " not found (build it: ninja -C build examples/host_hello/landing.native.spkg)");

  // ---- init: connect, find the nodes, share memory, install the EC, open its events ----
  auto c = host::client::connect(o.socket);
  if (!c)
    return cannot_run("cannot connect to spin-emu at " + o.socket + " (" + describe(c.err()) +
                      ").\n  Start it first, for example:\n"
                      "    build/collectives/spin-emu --topology star.toml --socket " + o.socket + " &\n"
                      "  or name the socket of a running one with --socket or SPIN_EMU_SOCKET (docs/emulator.md, Quick start).");
  auto nodes = c->nodes();
  if (!nodes) return cannot_run("nodes: " + describe(nodes.err()));
  const host::node_info* from = find_node(*nodes, o.from);
  const host::node_info* to = find_node(*nodes, o.to);
  if (from == nullptr || to == nullptr) {
    std::string known;
    for (const auto& n : *nodes) known += "\n  " + std::to_string(n.node) + " " + n.name + " rank " + std::to_string(n.rank);
    return cannot_run("no node '" + (from == nullptr ? o.from : o.to) + "'; spin-emu at " + o.socket + " has:" + known);
  }

  auto src = c->alloc_memory(from->node, o.bytes);
  auto dst = c->alloc_memory(to->node, o.bytes);
  if (!src || !dst) return cannot_run("shared memory: " + describe(!src ? src.err() : dst.err()));

  host::install_options io;
  io.package = o.package;
  io.name = "landing";
  io.match.bits = hello_match_bits;
  io.window = spin::rt::host_window{dst->region(), 0, o.bytes};  // where default deposit writes
  auto ec = c->install(to->node, io);
  if (!ec) return cannot_run("install " + o.package + " on " + to->name + ": " + describe(ec.err()));
  auto events = c->open_events(*ec, 64);
  if (!events) return cannot_run("events: " + describe(events.err()));
  auto before = read_counters(*c, to->node, ec->id);
  if (!before) return cannot_run(describe(before.err()));

  std::printf("host_hello: %s (rank %u) -> %s (rank %u), %u message(s) of %llu bytes, EC %u \"%s\" on %s\n",
              from->name.c_str(), from->rank, to->name.c_str(), to->rank, o.messages,
              static_cast<unsigned long long>(o.bytes), ec->id, io.name.c_str(), to->name.c_str());
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);

  // ---- loop: one message at a time, each checked byte for byte ----
  std::vector<std::chrono::nanoseconds> latencies;
  const auto t0 = clock_type::now();
  std::uint32_t done = 0;
  for (std::uint32_t k = 0; k < o.messages && !stop_flag.load(); ++k, ++done) {
    auto out = src->bytes();
    auto in = dst->bytes();
    for (std::uint64_t i = 0; i < o.bytes; ++i) out[i] = pattern(k, i);
    std::fill(in.begin(), in.end(), std::byte{0});

    host::message m;
    m.dest_rank = to->rank;
    m.match_bits = hello_match_bits;
    m.message_id = k + 1;
    m.region = src->region();
    m.len_bytes = o.bytes;
    const auto sent_at = clock_type::now();
    if (auto r = c->send(from->node, m); !r)
      return failed("send of message " + std::to_string(m.message_id) + ": " + describe(r.err()));
    auto e = events->wait(std::chrono::milliseconds(o.timeout_ms));
    if (!e)
      return failed("no event for message " + std::to_string(m.message_id) + " within " + std::to_string(o.timeout_ms) +
                    " ms (" + describe(e.err()) + "); a lost packet is never resent: check the links' loss and " +
                    "`spinctl stats` for drops");
    latencies.push_back(clock_type::now() - sent_at);

    // The completion handler's event: this message, from the sender, with its length.
    if (e->type != spin::rt::host_event::kind::handler || e->message_id != m.message_id ||
        e->source_rank != from->rank || e->value != o.bytes)
      return failed("unexpected event for message " + std::to_string(m.message_id) + ": kind " +
                    std::to_string(static_cast<unsigned>(e->type)) + ", message " + std::to_string(e->message_id) +
                    ", rank " + std::to_string(e->source_rank) + ", value " + std::to_string(e->value));
    std::uint64_t wrong = 0, first_wrong = 0;
    for (std::uint64_t i = 0; i < o.bytes; ++i)
      if (in[i] != pattern(k, i) && wrong++ == 0) first_wrong = i;
    if (wrong != 0)
      return failed("message " + std::to_string(m.message_id) + ": " + std::to_string(wrong) + " of " +
                    std::to_string(o.bytes) + " bytes wrong, the first at offset " + std::to_string(first_wrong) +
                    " (expected " + std::to_string(static_cast<unsigned>(pattern(k, first_wrong))) + ", got " +
                    std::to_string(static_cast<unsigned>(in[first_wrong])) + ")");
  }
  const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();

  // ---- stop (all messages, or a signal) and stats: the run, then the receiver's counters ----
  auto after = read_counters(*c, to->node, ec->id);
  if (!after) return failed(describe(after.err()));
  const double total = static_cast<double>(o.bytes) * done;
  std::printf("result: %s, %u message(s), %.0f bytes checked in %.3f ms (%.1f MB/s)\n",
              done == o.messages ? "exact" : "interrupted", done, total, secs * 1e3, total / secs / 1e6);
  if (!latencies.empty()) {
    const auto [lo, hi] = std::minmax_element(latencies.begin(), latencies.end());
    std::chrono::nanoseconds sum{0};
    for (auto l : latencies) sum += l;
    const auto us = [](std::chrono::nanoseconds d) { return static_cast<double>(d.count()) / 1e3; };
    std::printf("latency per message (send to event): min %.1f us, mean %.1f us, max %.1f us\n", us(*lo),
                us(sum / static_cast<long>(latencies.size())), us(*hi));
  }
  std::printf("%s counters during the run: rx %llu packets, %llu frame bytes, %llu NIC drops\n", to->name.c_str(),
              static_cast<unsigned long long>(after->rx_packets - before->rx_packets),
              static_cast<unsigned long long>(after->rx_bytes - before->rx_bytes),
              static_cast<unsigned long long>(after->nic_drops - before->nic_drops));
  std::printf("EC %u \"%s\": %llu packets, %llu messages completed, %llu bytes deposited, %llu events, %llu drops\n",
              ec->id, io.name.c_str(), static_cast<unsigned long long>(after->ec_packets),
              static_cast<unsigned long long>(after->ec_completed), static_cast<unsigned long long>(after->ec_deposit_bytes),
              static_cast<unsigned long long>(after->ec_events), static_cast<unsigned long long>(after->ec_drops));
  if (done != o.messages) return failed("interrupted after " + std::to_string(done) + " message(s)");
  return 0;  // closing the connection uninstalls the EC and frees both memories
}
