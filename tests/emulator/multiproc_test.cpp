// One spin-emu process per host, joined by memif (suite dpdk) or by af_packet/af_xdp on veth
// pairs through a Linux bridge inside network namespaces this test creates (suite netns, root).
// Each host drives its emulator through the control socket (spin::host): a ping-pong with the
// standard pingpong handler (native and eBPF), and a multi-packet message deposited into host
// memory, checked byte for byte, with packet counters and mbuf accounting from the final stats.
#include <spin/host/host.hpp>

#include "emu_process.hpp"
#include "netns_lab.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace spin;
using namespace spin::test;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using steady = std::chrono::steady_clock;

std::string pkg(const std::string& name) { return std::string(SPIN_TEST_PKG_DIR) + "/" + name + ".spkg"; }

/// The statistics of the (only) NIC behind a client.
json nic_stats(host::client& c) {
  auto st = c.stats();
  REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.err().message));
  json s = json::parse(host::to_json(*st));
  REQUIRE(s.is_array());
  REQUIRE(s.size() == 1);
  return s[0].at("stats");
}

const json& find_ec(const json& nic, const std::string& name) {
  for (const auto& e : nic.at("runtime").at("ecs"))
    if (e.at("name") == name) return e;
  FAIL("no EC " << name << " in " << nic.dump());
  std::abort();  // not reached: FAIL throws
}

std::uint64_t u64(const json& j) { return j.get<std::uint64_t>(); }

std::byte pattern(std::size_t i, unsigned salt) { return static_cast<std::byte>((i * 131 + salt * 29 + (i >> 10)) & 0xff); }
void fill(std::span<std::byte> b, unsigned salt) {
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = pattern(i, salt);
}
/// Index of the first byte of `b` that differs from the pattern, or b.size().
std::size_t first_mismatch(std::span<const std::byte> b, unsigned salt) {
  for (std::size_t i = 0; i < b.size(); ++i)
    if (b[i] != pattern(i, salt)) return i;
  return b.size();
}
bool all_zero(std::span<const std::byte> b) {
  return std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0}; });
}

std::uint64_t packets_of(std::uint64_t len, std::uint64_t payload) { return len == 0 ? 1 : (len + payload - 1) / payload; }

constexpr std::uint64_t payload_bytes = 1024;

/// One host of a scenario: its emulator, a client on it and its shared memory.
struct host_node {
  std::unique_ptr<emu_process> proc;
  std::uint32_t rank = 0;
  std::optional<host::client> client;
  std::optional<host::memory> mem;
  std::uint64_t mbufs_at_start = 0;
};

/// What the scenarios checked, to compare with the final statistics files.
struct expected_traffic {
  std::uint64_t tx_packets = 0;  ///< frames this NIC sent (host messages and handler sends)
  std::uint64_t rx_packets = 0;  ///< frames it received
};

/// Ping-pong: `pong` answers with the pingpong package (native at match bits 0x10, eBPF at
/// 0x11 when that package exists); `ping` lands the echo in its memory by default deposit and
/// learns by the landing handler's event that the whole message is back. Several messages of
/// different sizes per target; the echoed bytes must equal what was sent, exactly.
void ping_pong(host_node& ping, host_node& pong, expected_traffic& ping_t, expected_traffic& pong_t, std::chrono::milliseconds first_wait) {
  struct variant {
    std::string package;
    std::uint64_t bits;
  };
  std::vector<variant> variants = {{"pingpong.native", 0x10}};
  if (fs::exists(pkg("pingpong.ebpf"))) variants.push_back({"pingpong.ebpf", 0x11});
  const std::uint64_t sizes[] = {1, 1024, 1025, 5000, 20000};
  const std::uint64_t max_len = 20000;
  // ping's memory: [0, max_len) what it sends, [64 KiB, 64 KiB + max_len) per variant where echoes land.
  auto out = ping.mem->bytes().subspan(0, max_len);
  bool first = true;
  for (std::size_t v = 0; v < variants.size(); ++v) {
    CAPTURE(variants[v].package);
    host::install_options po;
    po.package = pkg(variants[v].package);
    po.name = "pong" + std::to_string(v);
    po.match.bits = variants[v].bits;
    auto pe = pong.client->install(0, po);
    REQUIRE_MESSAGE(pe.ok(), (pe.ok() ? std::string() : pe.err().message));

    const std::uint64_t land_off = (64 << 10) * (v + 1);
    host::install_options lo;
    lo.package = pkg("landing.native");
    lo.name = "land" + std::to_string(v);
    lo.match.bits = variants[v].bits;
    lo.window = rt::host_window{ping.mem->region(), land_off, max_len};
    auto le = ping.client->install(0, lo);
    REQUIRE_MESSAGE(le.ok(), (le.ok() ? std::string() : le.err().message));
    auto q = ping.client->open_events(*le, 64);
    REQUIRE_MESSAGE(q.ok(), (q.ok() ? std::string() : q.err().message));
    auto land = ping.mem->bytes().subspan(land_off, max_len);

    std::uint64_t packets = 0, bytes = 0;
    std::uint64_t id = 100 * (v + 1);
    for (std::uint64_t len : sizes) {
      CAPTURE(len);
      ++id;
      const unsigned salt = static_cast<unsigned>(id);
      fill(out.subspan(0, len), salt);
      std::fill(land.begin(), land.end(), std::byte{0});
      host::message m;
      m.dest_rank = pong.rank;
      m.match_bits = variants[v].bits;
      m.message_id = id;
      m.region = ping.mem->region();
      m.len_bytes = len;
      auto s = ping.client->send(0, m, 20s);
      REQUIRE_MESSAGE(s.ok(), (s.ok() ? std::string() : s.err().message));
      // The first message also waits for the link (memif connects asynchronously; frames wait
      // in the NIC's transmit stage until then).
      auto e = q->wait(first ? first_wait : 20s);
      first = false;
      REQUIRE_MESSAGE(e.ok(), "no echo of message " << id << ": " << (e.ok() ? std::string() : e.err().message) << "\nping stats: " << nic_stats(*ping.client).dump()
                                                    << "\npong stats: " << nic_stats(*pong.client).dump());
      CHECK(e->type == rt::host_event::kind::handler);
      CHECK(e->message_id == id);
      CHECK(e->source_rank == pong.rank);
      CHECK(e->value == len);
      const std::size_t bad = first_mismatch(land.subspan(0, len), salt);
      CHECK_MESSAGE(bad == len, "echoed byte " << bad << " of " << len << " differs");
      CHECK(all_zero(land.subspan(len)));
      packets += packets_of(len, payload_bytes);
      bytes += len;
    }
    CHECK(q->wait(50ms).err().code == errc::timeout);
    CHECK(q->dropped() == 0);

    // Round trips in the statistics: every packet went there and back once.
    const json ps = nic_stats(*pong.client), gs = nic_stats(*ping.client);
    const json& pec = find_ec(ps, po.name);
    CHECK(u64(pec.at("packets_in")) == packets);
    CHECK(u64(pec.at("sends")) == packets);
    CHECK(u64(pec.at("send_failed")) == 0);
    CHECK(u64(pec.at("messages_completed")) == std::size(sizes));
    const json& lec = find_ec(gs, lo.name);
    CHECK(u64(lec.at("packets_in")) == packets);
    CHECK(u64(lec.at("deposit_bytes")) == bytes);
    CHECK(u64(lec.at("messages_completed")) == std::size(sizes));
    CHECK(u64(lec.at("events_posted")) == std::size(sizes));
    ping_t.tx_packets += packets;
    ping_t.rx_packets += packets;
    pong_t.tx_packets += packets;
    pong_t.rx_packets += packets;
  }
}

/// A multi-packet message from `src` to `dst`, deposited into `dst`'s memory: every byte is
/// checked, the bytes around the window stay untouched, and the counters match.
void transfer(host_node& src, host_node& dst, std::uint64_t len, expected_traffic& src_t, expected_traffic& dst_t) {
  const std::uint64_t bits = 0x20;
  const std::uint64_t guard = 4096;
  REQUIRE(src.mem->bytes().size() >= len);
  REQUIRE(dst.mem->bytes().size() >= len + 2 * guard);
  host::install_options lo;
  lo.package = pkg("landing.native");
  lo.name = "bulk";
  lo.match.bits = bits;
  lo.window = rt::host_window{dst.mem->region(), guard, len};
  auto le = dst.client->install(0, lo);
  REQUIRE_MESSAGE(le.ok(), (le.ok() ? std::string() : le.err().message));
  auto q = dst.client->open_events(*le, 64);
  REQUIRE_MESSAGE(q.ok(), (q.ok() ? std::string() : q.err().message));

  const json before_src = nic_stats(*src.client);
  const unsigned salt = 77;
  fill(src.mem->bytes().subspan(0, len), salt);
  auto d = dst.mem->bytes();
  std::fill(d.begin(), d.end(), std::byte{0});
  host::message m;
  m.dest_rank = dst.rank;
  m.match_bits = bits;
  m.message_id = 9000;
  m.region = src.mem->region();
  m.len_bytes = len;
  auto s = src.client->send(0, m, 60s);
  REQUIRE_MESSAGE(s.ok(), (s.ok() ? std::string() : s.err().message));
  auto e = q->wait(60s);
  REQUIRE_MESSAGE(e.ok(), "the " << len << "-byte message did not complete: " << (e.ok() ? std::string() : e.err().message) << "\nsender: "
                                 << nic_stats(*src.client).dump() << "\nreceiver: " << nic_stats(*dst.client).dump());
  CHECK(e->message_id == 9000);
  CHECK(e->source_rank == src.rank);
  CHECK(e->value == len);
  const std::size_t bad = first_mismatch(d.subspan(guard, len), salt);
  CHECK_MESSAGE(bad == len, "byte " << bad << " of " << len << " differs");
  CHECK(all_zero(d.subspan(0, guard)));
  CHECK(all_zero(d.subspan(guard + len)));

  const std::uint64_t packets = packets_of(len, payload_bytes);
  const json ss = nic_stats(*src.client), ds = nic_stats(*dst.client);
  CHECK(u64(ss.at("host_messages_sent")) - u64(before_src.at("host_messages_sent")) == 1);
  CHECK(u64(ss.at("host_packets_sent")) - u64(before_src.at("host_packets_sent")) == packets);
  CHECK(u64(ss.at("host_bytes_sent")) - u64(before_src.at("host_bytes_sent")) == len);
  const json& ec = find_ec(ds, "bulk");
  CHECK(u64(ec.at("packets_in")) == packets);
  CHECK(u64(ec.at("deposit_bytes")) == len);
  CHECK(u64(ec.at("messages_completed")) == 1);
  CHECK(u64(ec.at("messages_dropped")) == 0);
  src_t.tx_packets += packets;
  dst_t.rx_packets += packets;
}

/// When a PMD gives transmitted mbufs back to their pool.
enum class tx_release {
  /// In the TX call (memif and af_packet copy the frame and free the mbuf).
  at_send,
  /// Later: af_xdp transmits the mbuf's own buffer (it is the UMEM frame) and frees it only
  /// when a later TX call reaps the completion ring, and only once that ring is half full. The
  /// last frames a port sent are still out when the final statistics are read (before the port
  /// closes), so up to tx_packets mbufs may stay in use beyond the baseline.
  reaped_later,
};

/// Stops every emulator through its control socket and checks the exit status and the final
/// statistics file: port counters as expected, no drops, every mbuf back in its pool. The
/// count is compared with the one before any traffic, because a PMD may keep RX buffers posted
/// for the whole run (af_xdp fills its fill ring with 2048 mbufs at start; memif and af_packet
/// allocate at receive time and start from 0).
void stop_and_check(std::vector<host_node>& nodes, const std::vector<expected_traffic>& want, tx_release release) {
  for (auto& n : nodes) {
    auto r = n.client->stop_emulator();
    CHECK_MESSAGE(r.ok(), n.proc->name() << ": stop: " << (r.ok() ? "" : (r.ok() ? std::string() : r.err().message)));
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    auto& n = nodes[i];
    CAPTURE(n.proc->name());
    n.client.reset();
    auto st = n.proc->wait_exit(30s);
    REQUIRE_MESSAGE(st.has_value(), n.proc->name() << " did not exit within 30 s of stop\n" << n.proc->diag());
    CHECK_MESSAGE((WIFEXITED(*st) && WEXITSTATUS(*st) == 0), n.proc->status_text() << "\n" << n.proc->diag());
    const std::string text = read_file(n.proc->stats_file);
    REQUIRE_MESSAGE(!text.empty(), "no statistics file\n" << n.proc->diag());
    const json s = json::parse(text);
    INFO("final statistics: " << text);
    REQUIRE(s.at("ports").size() == 1);
    const json& p = s.at("ports")[0];
    CHECK(u64(p.at("tx_packets")) == want[i].tx_packets);
    CHECK(u64(p.at("rx_packets")) == want[i].rx_packets);
    for (const auto& [reason, count] : s.at("drops").items()) CHECK_MESSAGE(u64(count) == 0, "drop reason " << reason);
    CHECK(u64(s.at("runtime").at("unknown_ec")) == 0);
    for (const auto& [reason, count] : s.at("runtime").at("frames_rejected").items())
      CHECK_MESSAGE(u64(count) == 0, "frames rejected: " << reason);
    CHECK(u64(s.at("runtime").at("frames_accepted")) == want[i].rx_packets);
    CHECK(u64(p.at("hw").at("oerrors")) == 0);
    CHECK(u64(p.at("hw").at("imissed")) == 0);
    const std::uint64_t in_use = u64(s.at("mbufs_in_use"));
    if (release == tx_release::at_send) {
      CHECK(in_use == n.mbufs_at_start);
    } else {
      CHECK(in_use >= n.mbufs_at_start);
      CHECK(in_use - n.mbufs_at_start <= want[i].tx_packets);  // received mbufs all came back
    }
  }
}

/// Connects to every node, allocates `mem_bytes` of shared memory on it and notes its mbufs in
/// use before any traffic.
void connect_all(std::vector<host_node>& nodes, std::size_t mem_bytes) {
  for (auto& n : nodes) {
    n.client.emplace(n.proc->connect());
    auto list = n.client->nodes();
    REQUIRE_MESSAGE(list.ok(), (list.ok() ? std::string() : list.err().message));
    REQUIRE(list->size() == 1);
    CHECK((*list)[0].rank == n.rank);
    auto m = n.client->alloc_memory(0, mem_bytes);
    REQUIRE_MESSAGE(m.ok(), (m.ok() ? std::string() : m.err().message));
    n.mem.emplace(std::move(m.value()));
  }
  for (auto& n : nodes) n.mbufs_at_start = u64(nic_stats(*n.client).at("mbufs_in_use"));
}

// ---- network namespaces (netns_lab.hpp) ----

/// Three hosts in namespaces, one spin-emu each on its eth0 through `pmd` ("af_packet" or
/// "af_xdp"): host 1 ping-pongs with host 0 and sends 1 MiB + 1000 bytes to host 2.
void netns_case(const std::string& pmd) {
  netns_lab lab(3);
  temp_dir dir;
  std::vector<host_node> nodes(3);
  for (std::uint32_t i = 0; i < 3; ++i) {
    nodes[i].rank = i;
    nodes[i].proc = std::make_unique<emu_process>("h" + std::to_string(i), dir.path);
    // af_packet: a 4096-frame kernel ring (default 512) so a receiver that the scheduler
    // leaves off the CPU for a while does not lose frames of the 1025-packet message.
    const std::string vdev = pmd == "af_packet" ? "net_af_packet0,iface=eth0,qpairs=1,blocksz=4096,framesz=2048,framecnt=4096"
                                                : "net_af_xdp0,iface=eth0,start_queue=0,queue_count=1";
    nodes[i].proc->start({"ip", "netns", "exec", lab.hosts[i]}, eal_args(lab.prefix + "-h" + std::to_string(i), vdev),
                         {"--port", "net_" + pmd + "0", "--rank", std::to_string(i), "--hpus", "1", "--max-frame", "1514",
                          "--mbuf-bytes", "2048", "--payload-bytes", std::to_string(payload_bytes)});
  }
  connect_all(nodes, 4 << 20);
  std::vector<expected_traffic> t(3);
  ping_pong(nodes[1], nodes[0], t[1], t[0], 30s);
  transfer(nodes[1], nodes[2], (1 << 20) + 1000, t[1], t[2]);
  stop_and_check(nodes, t, pmd == "af_xdp" ? tx_release::reaped_later : tx_release::at_send);
}

}  // namespace

TEST_SUITE("emulator") {

TEST_CASE("spin-emu refuses the removed HPU-thread option, the other mode's options, CPUs that are not online and misplaced virtual-time options, with status 2") {
  auto run = [](const std::string& args, std::string& out) {
    FILE* p = ::popen((std::string(SPIN_EMU_BIN) + " " + args + " 2>&1").c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    out.clear();
    while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    const int st = ::pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  std::string out;
  CHECK(run("--plain-hpu-threads --port net_null0", out) == 2);
  CHECK(out.find("--plain-hpu-threads is gone") != std::string::npos);
  CHECK(run("--lcores 2 --port net_null0", out) == 2);
  CHECK(out.find("--lcores is for cluster mode") != std::string::npos);
  CHECK(run("--hpu-cpus 100000 --port net_null0", out) == 2);
  CHECK(out.find("--hpu-cpus: CPU 100000 is not online") != std::string::npos);
  // Virtual time is a cluster mode; its options need it, and it refuses wall-clock ones.
  CHECK(run("--virtual-time --port net_null0", out) == 2);
  CHECK(out.find("--virtual-time is for cluster mode") != std::string::npos);
  const std::string topo = std::string(SPIN_TEST_TOPOLOGY_DIR) + "/good.toml";
  CHECK(run("--topology " + topo + " --actors 2", out) == 2);
  CHECK(out.find("--actors is for --virtual-time") != std::string::npos);
  CHECK(run("--topology " + topo + " --virtual-time --lcores 2", out) == 2);
  CHECK(out.find("--lcores is for wall-clock time") != std::string::npos);
  CHECK(run("--topology " + topo + " --virtual-time --no-socket", out) == 2);
  CHECK(out.find("--virtual-time needs the control socket") != std::string::npos);
  CHECK(run("--topology " + topo + " --virtual-time --nic-memory-mib 8", out) == 2);
  CHECK(out.find("[nic] memory_bytes") != std::string::npos);
}

TEST_CASE("two spin-emu processes joined by memif ping-pong with handlers and deliver a 1 MiB message to host memory") {
  temp_dir dir;
  std::vector<host_node> nodes(2);
  const std::string memif_sock = dir.path + "/memif.sock";
  const std::string prefix = "spinmp-" + std::to_string(::getpid());
  // memif has no RX scatter and takes frames of at most 1518 bytes (DPDK 22.11); 1024-byte
  // payloads fit. 1514, not 1518: spin-emu derives the MTU as max frame - 14, and ethdev adds
  // 18 bytes of overhead back, so 1515..1518 fail rte_eth_dev_configure.
  const std::vector<std::string> app = {"--port", "net_memif0", "--hpus", "1", "--max-frame", "1514", "--mbuf-bytes", "2048",
                                        "--payload-bytes", std::to_string(payload_bytes)};
  for (std::uint32_t i = 0; i < 2; ++i) {
    nodes[i].rank = i;
    nodes[i].proc = std::make_unique<emu_process>("m" + std::to_string(i), dir.path);
    auto a = app;
    a.insert(a.end(), {"--rank", std::to_string(i)});
    const std::string role = i == 0 ? "server" : "client";
    nodes[i].proc->start({}, eal_args(prefix + "-m" + std::to_string(i), "net_memif0,role=" + role + ",socket=" + memif_sock + ",id=0"), a);
    // The server creates the memif socket; the client retries until it is there, but starting
    // it second keeps its log free of connection errors.
    if (i == 0) (void)nodes[0].proc->connect();
  }
  connect_all(nodes, 4 << 20);
  std::vector<expected_traffic> t(2);
  ping_pong(nodes[1], nodes[0], t[1], t[0], 60s);
  transfer(nodes[1], nodes[0], (1 << 20) + 1000, t[1], t[0]);
  stop_and_check(nodes, t, tx_release::at_send);
}

TEST_CASE("a spin-emu switch process forwards between two host processes on its memif ports by rank") {
  temp_dir dir;
  auto num = [](const json& j) { return j.get<std::uint64_t>(); };
  const std::string prefix = "spinmp-" + std::to_string(::getpid());
  const std::vector<std::string> common = {"--hpus", "1", "--max-frame", "1514", "--mbuf-bytes", "2048", "--payload-bytes",
                                           std::to_string(payload_bytes)};
  // The switch serves one memif socket per host.
  emu_process sw("sw", dir.path);
  std::vector<std::string> sw_eal = eal_args(prefix + "-sw", "net_memif0,role=server,socket=" + dir.path + "/a.sock,id=0");
  sw_eal.push_back("--vdev=net_memif1,role=server,socket=" + dir.path + "/b.sock,id=0");
  auto sw_app = common;
  sw_app.insert(sw_app.end(), {"--mode", "switch", "--port", "net_memif0", "--port", "net_memif1", "--route", "0=0", "--route", "1=1"});
  sw.start({}, sw_eal, sw_app);
  host::client sw_client = sw.connect();
  {
    auto list = sw_client.nodes();
    REQUIRE(list.ok());
    REQUIRE(list->size() == 1);
    CHECK((*list)[0].rank == 65535);  // switch mode's default address
  }
  const std::uint64_t sw_mbufs = num(nic_stats(sw_client).at("mbufs_in_use"));
  std::vector<host_node> nodes(2);
  for (std::uint32_t i = 0; i < 2; ++i) {
    nodes[i].rank = i;
    nodes[i].proc = std::make_unique<emu_process>("h" + std::to_string(i), dir.path);
    auto a = common;
    a.insert(a.end(), {"--port", "net_memif0", "--rank", std::to_string(i)});
    const std::string sock = dir.path + (i == 0 ? "/a.sock" : "/b.sock");
    nodes[i].proc->start({}, eal_args(prefix + "-h" + std::to_string(i), "net_memif0,role=client,socket=" + sock + ",id=0"), a);
  }
  connect_all(nodes, 4 << 20);
  std::vector<expected_traffic> t(2);
  ping_pong(nodes[1], nodes[0], t[1], t[0], 60s);
  transfer(nodes[1], nodes[0], (1 << 20) + 1000, t[1], t[0]);
  stop_and_check(nodes, t, tx_release::at_send);
  // The memif server goes last: closing its ports while clients are still connected can crash
  // DPDK 22.11's memif interrupt handler (seen under ASan: a SEGV in the switch's
  // eal-intr-thread when the switch stopped first).
  // Every frame either host sent crossed the switch once, and nothing else did.
  REQUIRE(sw_client.stop_emulator().ok());
  auto st = sw.wait_exit(30s);
  REQUIRE_MESSAGE(st.has_value(), sw.diag());
  CHECK_MESSAGE((WIFEXITED(*st) && WEXITSTATUS(*st) == 0), sw.status_text() << "\n" << sw.diag());
  const json s = json::parse(read_file(sw.stats_file));
  INFO("switch statistics: " << s.dump());
  REQUIRE(s.at("ports").size() == 2);
  std::uint64_t forwarded = 0, rx = 0, tx = 0;
  for (const auto& p : s.at("ports")) {
    forwarded += num(p.at("forwarded"));
    rx += num(p.at("rx_packets"));
    tx += num(p.at("tx_packets"));
  }
  CHECK(forwarded == t[0].tx_packets + t[1].tx_packets);
  CHECK(rx == forwarded);
  CHECK(tx == forwarded);
  CHECK(num(s.at("ports")[0].at("tx_packets")) == t[0].rx_packets);  // what reached h0 left on port 0
  for (const auto& [reason, count] : s.at("drops").items()) CHECK_MESSAGE(num(count) == 0, "drop reason " << reason);
  CHECK(num(s.at("mbufs_in_use")) == sw_mbufs);
}

TEST_CASE("three spin-emu processes in network namespaces on af_packet veths ping-pong and deliver a 1 MiB message to host memory") {
  netns_case("af_packet");
}

TEST_CASE("three spin-emu processes in network namespaces on af_xdp veths ping-pong and deliver a 1 MiB message to host memory") {
  netns_case("af_xdp");
}

}  // TEST_SUITE
