// emu_forward: packets per second that spin-emu's NIC takes from a net_null port with the empty
// handler set (an EC with no handlers and a host window: default deposit), beside DPDK's own
// io-forwarding rate on the same kind of vdevs, measured in the same run and process.
//
// Baseline. Debian's dpdk package has no dpdk-testpmd, so the baseline is testpmd's io mode
// rebuilt here against the same DPDK, EAL and pool settings: rte_eth_rx_burst(32) on net_null A,
// rte_eth_tx_burst on net_null B, unsent mbufs freed; one stream on one lcore. Both ports are
// opened with spin::emu::port::open and the same port_options as the NIC, so pools, descriptor
// counts and mbuf sizes are identical. An informational "fwd+copy" row does the same and also
// copies each payload into a host buffer on that lcore: the work a default deposit does.
//
// Facts that shape the set-up (also printed with the results):
// - net_null (copy=0) hands out mbufs of `size` bytes from the port's pool without writing
//   them. The emulator must see valid spin frames, so the NIC's port pool is pre-filled: every
//   mbuf is allocated, given a valid frame (wire::encode; one single-packet message, start|end,
//   with a distinct message id) and freed. The pool has no per-lcore cache (pool_cache = 0): its
//   ring hands mbufs out in FIFO order, so an id comes back only after the whole pool (8191
//   messages) has cycled, far beyond the EC's retired_history (1024); with a cache the same few
//   mbufs would cycle LIFO and their ids be dropped as duplicates, measuring the wrong path.
//   The baseline uses the same pool settings (no cache) so the ratio is fair.
// - A spin frame cannot be 64 bytes (no payload: 88). The "64" row uses 88-byte frames and
//   says so (frame_bytes 88); its baseline runs at 88 too, and an extra baseline at 64 is shown.
// - An 88-byte frame has no payload: the runtime releases it on the scheduler thread (no HPU
//   task). Larger frames become one deposit task each on the HPU (memcpy of frame - 88 bytes).
// - Threads: the emulator uses 1 lcore (the scheduler thread calling nic::poll, pinned by EAL
//   to --poll-cpu) plus 1 HPU thread (--hpu-cpu); the baseline uses 1 lcore. A second emulator
//   variant pins the HPU to the poll CPU (one core for everything): the poll loop never yields,
//   so the HPU runs only when the OS preempts it; shown to make the one-core cost visible.
// - The rate counted is frames taken from the RX port per second (the NIC's rx_packets; the
//   baseline's rx_burst count). After the runs the runtime is drained and checked: EC
//   packets_in == frames received (less the at most one burst the NIC holds for the runtime),
//   messages completed == packets_in, no drop or reject of any kind, deposited bytes == packets
//   x payload.
// - net_null does no I/O: the baseline is a pure mbuf alloc/free loop (with cache-less pools a
//   ring dequeue per burst and a ring enqueue per packet), independent of frame size. The
//   emulator parses headers and copies payloads, so its rate falls with frame size while the
//   baseline's does not; Gbit/s of the baseline is frame bytes x 8 x rate, not bytes touched.
//
// Exit status: 0 when every check passed; 1 when a check failed (lost, dropped or rejected
// packets, mbufs not returned); 2 on bad arguments or set-up errors. Missing the aim (emulator
// at least 0.8 of the io-forwarding rate) does not change the exit status.
#include <spin/emu/eal.hpp>
#include <spin/emu/nic.hpp>
#include <spin/emu/port.hpp>
#include <spin/rt/runtime.hpp>
#include <spin/rt/wire.hpp>

#include <rte_dev.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_version.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#ifndef SPIN_BUILD_TYPE
#define SPIN_BUILD_TYPE "unknown"
#endif
#ifndef SPIN_BUILD_OPTIMIZATION
#define SPIN_BUILD_OPTIMIZATION "unknown"
#endif
#ifndef SPIN_BUILD_SANITIZE
#define SPIN_BUILD_SANITIZE "none"
#endif

namespace {

using namespace spin;
using clock_type = std::chrono::steady_clock;

constexpr double aim_ratio = 0.8;
constexpr std::uint32_t burst = 32;  // testpmd's default burst; the NIC's burst too
constexpr std::uint64_t bench_match_bits = 0xf0d0ull;
constexpr std::uint32_t source_rank = 1;
constexpr std::uint32_t nic_rank = 0;
constexpr std::size_t host_window_bytes = 64 << 10;

struct options {
  std::vector<std::uint32_t> sizes{64, 1024, 4096};
  double seconds = 1.0;
  std::uint32_t repeats = 3;
  double warmup_seconds = 0.3;
  std::string csv_path, json_path;
  int poll_cpu = 0;
  int hpu_cpu = 1;
  bool same_cpu = true;
  bool copy_baseline = true;
  std::uint32_t pool_mbufs = 8191;
  std::vector<std::string> only;  // run only these variants (profiling); empty: all
};

// ---- small helpers ---------------------------------------------------------------------------

// CPU time of the calling thread: the share of the core the loop really had. On a loaded
// machine wall-clock rates mostly measure the OS scheduler; packets per CPU-second do not.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// CPU time of the whole process: minus the poll thread's, that of the HPU thread (the other
// threads, EAL's interrupt thread and the runtime's watchdog, sleep almost all the time).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

std::array<double, 3> load_average() {
  std::array<double, 3> l{-1, -1, -1};
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) != 3) l = {-1, -1, -1};
    std::fclose(f);
  }
  return l;
}

bool ndebug_defined() {
#if defined(NDEBUG)
  return true;
#else
  return false;
#endif
}

bool sanitized_build() {
  if (std::strcmp(SPIN_BUILD_SANITIZE, "none") != 0 && std::strcmp(SPIN_BUILD_SANITIZE, "") != 0) return true;
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
  return true;
#endif
#endif
  return false;
}

// A net_null vdev created at run time (EAL initialises once per process, so sizes cannot come
// from the command line) and removed again.
class null_vdev {
public:
  static std::unique_ptr<null_vdev> create(std::uint32_t frame_bytes) {
    static unsigned seq = 0;
    std::unique_ptr<null_vdev> p(new null_vdev());
    null_vdev& v = *p;
    v._name = "net_null" + std::to_string(seq++);
    const std::string args = "size=" + std::to_string(frame_bytes) + ",copy=0";
    if (int rc = rte_eal_hotplug_add("vdev", v._name.c_str(), args.c_str()); rc != 0) {
      std::fprintf(stderr, "cannot create vdev %s,%s: %s\n", v._name.c_str(), args.c_str(), rte_strerror(-rc));
      return nullptr;
    }
    v._live = true;
    auto id = emu::find_port(v._name);
    if (!id) {
      std::fprintf(stderr, "%s\n", id.err().message.c_str());
      return nullptr;
    }
    v._port = *id;
    v._has_port = true;
    return p;
  }
  null_vdev(const null_vdev&) = delete;
  null_vdev& operator=(const null_vdev&) = delete;
  ~null_vdev() {
    if (!_live) return;
    if (_has_port) (void)rte_eth_dev_close(_port);
    (void)rte_eal_hotplug_remove("vdev", _name.c_str());
  }
  std::uint16_t port() const { return _port; }
  const std::string& name() const { return _name; }

private:
  null_vdev() = default;
  std::string _name;
  std::uint16_t _port = 0;
  bool _live = false, _has_port = false;
};

emu::port_options port_opts(std::uint32_t frame_bytes, const options& o) {
  emu::port_options p;
  p.pool_mbufs = o.pool_mbufs;
  p.pool_cache = 0;  // FIFO mbuf order: see the comment at the top
  // net_null cannot scatter: a frame must fit one mbuf. The NIC needs room for host-message
  // payload in its maximum frame (> 104 bytes), so small frames get the mbuf's size as maximum.
  p.mbuf_data_bytes = static_cast<std::uint16_t>(std::max<std::uint32_t>(2048, frame_bytes));
  p.max_frame_bytes = p.mbuf_data_bytes;
  return p;
}

// ---- baseline: testpmd io forwarding ----------------------------------------------------------

struct run_result {
  std::uint64_t packets = 0;
  double seconds = 0;      // wall clock
  double cpu_seconds = 0;  // CPU time of the loop's thread
  double hpu_busy_ns = 0;  // emulator: HPU time in deposits (hpu_stats::busy_ns)
  double other_cpu_seconds = 0;  // emulator: CPU time of the process's other threads (the HPU)
  double mpps() const { return seconds > 0 ? static_cast<double>(packets) / seconds / 1e6 : 0; }
  double mpps_cpu() const { return cpu_seconds > 0 ? static_cast<double>(packets) / cpu_seconds / 1e6 : 0; }
};

// rx A -> tx B, unsent freed (testpmd pkt_burst_io_forward without retry). With `copy_bytes`,
// each frame's bytes after the 88-byte headers are copied into `sink` first.
run_result forward_loop(std::uint16_t rx_port, std::uint16_t tx_port, double seconds, std::uint32_t copy_bytes,
                        std::byte* sink) {
  std::array<rte_mbuf*, burst> bufs{};
  run_result r;
  const double c0 = thread_cpu_seconds();
  const auto t0 = clock_type::now();
  const auto end = t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  auto now = t0;
  std::uint64_t n_rx = 0;
  do {
    for (int k = 0; k < 64; ++k) {
      const std::uint16_t n = rte_eth_rx_burst(rx_port, 0, bufs.data(), burst);
      if (n == 0) continue;
      n_rx += n;
      if (copy_bytes > 0)
        for (std::uint16_t i = 0; i < n; ++i)
          std::memcpy(sink, rte_pktmbuf_mtod_offset(bufs[i], const std::byte*, rt::wire::min_overhead), copy_bytes);
      const std::uint16_t sent = rte_eth_tx_burst(tx_port, 0, bufs.data(), n);
      if (sent < n) rte_pktmbuf_free_bulk(bufs.data() + sent, n - sent);
    }
    now = clock_type::now();
  } while (now < end);
  r.cpu_seconds = thread_cpu_seconds() - c0;
  r.packets = n_rx;
  r.seconds = std::chrono::duration<double>(now - t0).count();
  return r;
}

// ---- emulator --------------------------------------------------------------------------------

// A NIC on one net_null port with the empty-handler EC installed and its pool pre-filled.
struct emu_setup {
  std::unique_ptr<emu::nic> nic;
  std::vector<std::byte> host;
  std::uint32_t frame_bytes = 0;
  std::uint32_t payload_bytes = 0;
};

// Writes a valid single-packet message into every mbuf of `pool` (ids first_id, first_id+1, ...
// in the order the pool's ring will hand them out) and returns them all.
bool prefill_pool(rte_mempool* pool, std::uint32_t frame_bytes, std::uint64_t first_id) {
  const unsigned size = pool->size;
  if (rte_mempool_avail_count(pool) != size) {
    std::fprintf(stderr, "prefill: pool %s has %u of %u mbufs free\n", pool->name, rte_mempool_avail_count(pool), size);
    return false;
  }
  std::vector<rte_mbuf*> all;
  all.reserve(size);
  const std::uint32_t payload_bytes = frame_bytes - static_cast<std::uint32_t>(rt::wire::min_overhead);
  std::vector<std::byte> payload(payload_bytes);
  for (std::uint32_t i = 0; i < payload_bytes; ++i) payload[i] = static_cast<std::byte>(i * 13 + 5);
  const rt::wire::endpoint src = rt::wire::rank_endpoint(source_rank), dst = rt::wire::rank_endpoint(nic_rank);
  bool ok = true;
  for (unsigned k = 0; k < size; ++k) {
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    if (m == nullptr) {
      ok = false;
      break;
    }
    all.push_back(m);
    rt::wire::header h;
    h.source_rank = source_rank;
    h.match_bits = bench_match_bits;
    h.message_id = first_id + k;
    h.seq = 0;
    h.message_len = payload_bytes;
    h.offset = 0;
    h.flags = rt::wire::flag_start | rt::wire::flag_end;
    // net_null's RX resets data_off to the headroom and sets the length, so the frame goes there.
    const std::size_t n = rt::wire::encode(src, dst, h, payload,
                                           std::span<std::byte>(rte_pktmbuf_mtod(m, std::byte*), rte_pktmbuf_tailroom(m)));
    if (n != frame_bytes) {
      std::fprintf(stderr, "prefill: wire::encode wrote %zu bytes, expected %u\n", n, frame_bytes);
      ok = false;
      break;
    }
  }
  if (ok && all.size() != size) {
    std::fprintf(stderr, "prefill: got %zu of %u mbufs\n", all.size(), size);
    ok = false;
  }
  for (rte_mbuf* m : all) rte_pktmbuf_free(m);  // in allocation order: the ring hands them out the same way
  return ok;
}

std::optional<emu_setup> make_emu(std::uint16_t port, std::uint32_t frame_bytes, int hpu_cpu, const options& o,
                                  const std::string& name) {
  emu_setup s;
  s.frame_bytes = frame_bytes;
  s.payload_bytes = frame_bytes - static_cast<std::uint32_t>(rt::wire::min_overhead);
  emu::nic_config c;
  c.name = name;
  c.rank = nic_rank;
  c.ports = {port};
  c.port = port_opts(frame_bytes, o);
  c.burst = burst;
  c.payload_bytes = 0;  // host sends: whatever fits (unused here)
  c.runtime.hpus = 1;
  c.runtime.hpu_cpus = {hpu_cpu};
  c.runtime.nic_memory_bytes = 16 << 20;
  auto n = emu::nic::create(c);
  if (!n) {
    std::fprintf(stderr, "nic::create: %s\n", n.err().message.c_str());
    return std::nullopt;
  }
  s.nic = std::move(n.value());
  s.host.resize(host_window_bytes);
  auto region = s.nic->register_host_memory(s.host);
  if (!region) {
    std::fprintf(stderr, "register_host_memory: %s\n", region.err().message.c_str());
    return std::nullopt;
  }
  rt::ec_config ec;
  ec.name = "empty";
  ec.match = {bench_match_bits, 0};
  ec.handlers = rt::handler_set(nullptr, nullptr, nullptr);
  ec.window = rt::host_window{*region, 0, host_window_bytes};
  // Every queued deposit keeps its message open: room for a full HPU queue plus bursts.
  ec.limits.max_messages = 1024;
  ec.limits.retired_history = 1024;
  if (o.pool_mbufs <= ec.limits.retired_history + ec.limits.max_messages) {
    std::fprintf(stderr, "--pool-mbufs must exceed %u so that message ids do not repeat within the EC's memory\n",
                 ec.limits.retired_history + ec.limits.max_messages);
    return std::nullopt;
  }
  if (auto id = s.nic->install(ec); !id) {
    std::fprintf(stderr, "install: %s\n", id.err().message.c_str());
    return std::nullopt;
  }
  if (!prefill_pool(s.nic->port_pool(0), frame_bytes, 1)) return std::nullopt;
  return s;
}

run_result emu_loop(emu::nic& n, double seconds) {
  const emu::nic_stats s0 = n.stats();
  const double c0 = thread_cpu_seconds(), p0 = process_cpu_seconds();
  const auto t0 = clock_type::now();
  const auto end = t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  auto now = t0;
  do {
    for (int k = 0; k < 64; ++k) n.poll();
    now = clock_type::now();
  } while (now < end);
  run_result r;
  r.cpu_seconds = thread_cpu_seconds() - c0;
  r.other_cpu_seconds = process_cpu_seconds() - p0 - r.cpu_seconds;
  r.seconds = std::chrono::duration<double>(now - t0).count();
  const emu::nic_stats s1 = n.stats();
  r.packets = s1.ports.at(0).rx_packets - s0.ports.at(0).rx_packets;
  r.hpu_busy_ns = static_cast<double>(s1.runtime.hpus.at(0).busy_ns - s0.runtime.hpus.at(0).busy_ns);
  return r;
}

// Quiesces the NIC and checks that every frame received was accepted by the EC and deposited,
// with no drop anywhere. Prints what is wrong; returns false on any problem.
bool check_emu(emu_setup& s, const std::string& label, std::string& summary) {
  bool ok = true;
  auto bad = [&](const std::string& what) {
    std::fprintf(stderr, "FAIL %s: %s\n", label.c_str(), what.c_str());
    ok = false;
  };
  // nic::quiesce would never see the NIC idle: net_null always has frames to receive. Drain
  // the runtime instead (nobody polls now); the frames the NIC took from the port but could not
  // yet hand to the runtime (at most one burst) are then the only mbufs it still holds.
  if (!s.nic->runtime().drain(std::chrono::milliseconds(5000))) bad("runtime drain timed out");
  const emu::nic_stats st = s.nic->stats();
  const auto& port = st.ports.at(0);
  const rt::ec_stats& ec = st.runtime.ecs.at(0);
  const std::uint64_t pending = st.mbufs_in_use;
  const std::uint64_t rx = port.rx_packets - pending;  // frames handed to the runtime
  if (pending > burst) bad(std::to_string(pending) + " mbufs still held after drain (at most one burst may wait)");
  if (ec.packets_in != rx) bad("EC packets_in " + std::to_string(ec.packets_in) + " != frames handed to the runtime " + std::to_string(rx));
  if (st.runtime.frames_accepted != rx) bad("frames_accepted " + std::to_string(st.runtime.frames_accepted) + " != " + std::to_string(rx));
  if (ec.messages_completed != rx) bad("messages_completed " + std::to_string(ec.messages_completed) + " != " + std::to_string(rx));
  if (ec.deposit_bytes != rx * s.payload_bytes)
    bad("deposit_bytes " + std::to_string(ec.deposit_bytes) + " != " + std::to_string(rx * s.payload_bytes));
  std::uint64_t drops = 0;
  for (std::size_t r = 0; r < rt::drop_reason_count; ++r)
    if (ec.drops[r] != 0) {
      bad("EC dropped " + std::to_string(ec.drops[r]) + " as " + rt::drop_reason_name(static_cast<rt::drop_reason>(r)));
      drops += ec.drops[r];
    }
  for (std::size_t r = 0; r < emu::nic_drop_count; ++r)
    if (st.drops[r] != 0) {
      bad("NIC dropped " + std::to_string(st.drops[r]) + " as " + emu::nic_drop_name(static_cast<emu::nic_drop>(r)));
      drops += st.drops[r];
    }
  for (std::size_t r = 0; r < rt::wire::reject_count; ++r)
    if (st.runtime.frames_rejected[r] != 0) {
      bad("rejected " + std::to_string(st.runtime.frames_rejected[r]) + " as " + rt::wire::reject_name(static_cast<rt::wire::reject>(r)));
      drops += st.runtime.frames_rejected[r];
    }
  if (st.runtime.unknown_ec != 0) bad("frames matched no EC");
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: received %lu (+%lu waiting), packets_in %lu, completed %lu, drops %lu: %s", label.c_str(),
                static_cast<unsigned long>(rx), static_cast<unsigned long>(pending), static_cast<unsigned long>(ec.packets_in),
                static_cast<unsigned long>(ec.messages_completed), static_cast<unsigned long>(drops), ok ? "ok" : "FAILED");
  summary = buf;
  return ok;
}

// ---- one size --------------------------------------------------------------------------------

struct row {
  std::uint32_t size_requested = 0;
  std::uint32_t frame_bytes = 0;
  std::string variant;
  std::string what;
  std::uint32_t lcores = 1, hpu_threads = 0;
  std::string cpus;
  std::vector<double> mpps;      // one per repeat, wall clock
  std::vector<double> mpps_cpu;  // one per repeat, per CPU-second of the loop's thread
  std::vector<double> hpu_ns;    // emulator: HPU busy ns per packet, one per repeat
  std::vector<double> hpu_share; // emulator: HPU thread CPU time / wall time, one per repeat
  double ratio = 0;          // median / io-fwd median at the same frame size (0: not applicable)
  double ratio_cpu = 0;      // the same for packets per CPU-second
  bool is_aim = false;       // the row the 0.8 aim applies to
};

row make_row(std::uint32_t size, std::uint32_t frame, std::string variant, std::string what, std::uint32_t hpu_threads,
             std::string cpus, bool is_aim = false) {
  row r;
  r.size_requested = size;
  r.frame_bytes = frame;
  r.variant = std::move(variant);
  r.what = std::move(what);
  r.hpu_threads = hpu_threads;
  r.cpus = std::move(cpus);
  r.is_aim = is_aim;
  return r;
}

bool run_size(std::uint32_t size, const options& o, std::vector<row>& rows, std::vector<std::string>& checks, bool& checks_ok) {
  const std::uint32_t frame = std::max<std::uint32_t>(size, static_cast<std::uint32_t>(rt::wire::min_overhead));
  std::fprintf(stderr, "size %u: frame %u bytes\n", size, frame);

  // Vdevs: an io-fwd pair, an extra pair at 64 bytes for the 64 row, and one port per NIC.
  auto fa = null_vdev::create(frame), fb = null_vdev::create(frame);
  if (!fa || !fb) return false;
  std::unique_ptr<null_vdev> sa, sb;
  if (size < frame) {
    sa = null_vdev::create(size);
    sb = null_vdev::create(size);
    if (!sa || !sb) return false;
  }
  auto ea = null_vdev::create(frame);
  if (!ea) return false;
  std::unique_ptr<null_vdev> ec1;
  if (o.same_cpu) {
    ec1 = null_vdev::create(frame);
    if (!ec1) return false;
  }

  const emu::port_options popts = port_opts(frame, o);
  auto pa = emu::port::open(fa->port(), popts, "fwd.a"), pb = emu::port::open(fb->port(), popts, "fwd.b");
  if (!pa || !pb) {
    std::fprintf(stderr, "port::open: %s\n", (!pa ? pa.err() : pb.err()).message.c_str());
    return false;
  }
  std::unique_ptr<emu::port> psa, psb;
  if (sa) {
    const emu::port_options so = port_opts(size, o);
    auto a = emu::port::open(sa->port(), so, "fwd64.a"), b = emu::port::open(sb->port(), so, "fwd64.b");
    if (!a || !b) {
      std::fprintf(stderr, "port::open: %s\n", (!a ? a.err() : b.err()).message.c_str());
      return false;
    }
    psa = std::move(a.value());
    psb = std::move(b.value());
  }
  auto emu_split = make_emu(ea->port(), frame, o.hpu_cpu, o, "emu.split");
  if (!emu_split) return false;
  std::optional<emu_setup> emu_same;
  if (o.same_cpu) {
    emu_same = make_emu(ec1->port(), frame, o.poll_cpu, o, "emu.same");
    if (!emu_same) return false;
  }
  std::vector<std::byte> sink(host_window_bytes);
  const std::uint32_t payload = frame - static_cast<std::uint32_t>(rt::wire::min_overhead);

  const std::string pc = "poll=" + std::to_string(o.poll_cpu);
  struct variant {
    row r;
    std::function<run_result(double)> run;
  };
  std::vector<variant> vs;
  vs.push_back({make_row(size, frame, "io-fwd", "baseline: rx_burst A -> tx_burst B, unsent freed (testpmd io mode)", 0, pc),
                [&](double s) { return forward_loop((*pa)->id(), (*pb)->id(), s, 0, nullptr); }});
  if (psa)
    vs.push_back({make_row(size, size, "io-fwd@" + std::to_string(size), "baseline at the requested size (no spin frame fits)", 0, pc),
                  [&](double s) { return forward_loop(psa->id(), psb->id(), s, 0, nullptr); }});
  if (o.copy_baseline && payload > 0)
    vs.push_back({make_row(size, frame, "fwd+copy", "io-fwd plus memcpy of each payload into a host buffer on the same lcore", 0, pc),
                  [&](double s) { return forward_loop((*pa)->id(), (*pb)->id(), s, payload, sink.data()); }});
  vs.push_back({make_row(size, frame, "emu", "spin-emu NIC, empty handler set (default deposit), HPU on its own CPU", 1,
                         pc + " hpu=" + std::to_string(o.hpu_cpu), true),
                [&](double s) { return emu_loop(*emu_split->nic, s); }});
  if (emu_same)
    vs.push_back({make_row(size, frame, "emu-1cpu", "as emu, HPU pinned to the poll CPU (one core for everything)", 1,
                           pc + " hpu=" + std::to_string(o.poll_cpu)),
                  [&](double s) { return emu_loop(*emu_same->nic, s); }});

  if (!o.only.empty())
    std::erase_if(vs, [&](const variant& v) { return std::find(o.only.begin(), o.only.end(), v.r.variant) == o.only.end(); });
  // Warm-up, then repeats interleaved across variants so that load changes hit all alike.
  for (auto& v : vs) (void)v.run(o.warmup_seconds);
  for (std::uint32_t rep = 0; rep < o.repeats; ++rep)
    for (auto& v : vs) {
      const run_result r = v.run(o.seconds);
      v.r.mpps.push_back(r.mpps());
      v.r.mpps_cpu.push_back(r.mpps_cpu());
      if (v.r.hpu_threads > 0) {
        v.r.hpu_ns.push_back(r.packets > 0 ? r.hpu_busy_ns / static_cast<double>(r.packets) : 0);
        v.r.hpu_share.push_back(r.seconds > 0 ? r.other_cpu_seconds / r.seconds : 0);
      }
    }
  auto ran = [&](const char* name) {
    return std::any_of(vs.begin(), vs.end(), [&](const variant& v) { return v.r.variant == name; });
  };

  std::string sum;
  if (ran("emu")) {
    checks_ok &= check_emu(*emu_split, "size " + std::to_string(size) + " emu", sum);
    checks.push_back(sum);
  }
  if (emu_same && ran("emu-1cpu")) {
    checks_ok &= check_emu(*emu_same, "size " + std::to_string(size) + " emu-1cpu", sum);
    checks.push_back(sum);
  }
  const bool have_base = !vs.empty() && vs.front().r.variant == "io-fwd";
  const double base = have_base ? median(vs.front().r.mpps) : 0, base_cpu = have_base ? median(vs.front().r.mpps_cpu) : 0;
  for (auto& v : vs) {
    if (v.r.frame_bytes == frame && v.r.variant != "io-fwd" && base > 0) {
      v.r.ratio = median(v.r.mpps) / base;
      v.r.ratio_cpu = base_cpu > 0 ? median(v.r.mpps_cpu) / base_cpu : 0;
    }
    rows.push_back(v.r);
  }
  // Ports go before their vdevs; NICs close their ports themselves.
  emu_same.reset();
  emu_split.reset();
  psa.reset();
  psb.reset();
  pa.value().reset();
  pb.value().reset();
  return true;
}

std::string join(const std::vector<double>& v, const char* sep) {
  std::string s;
  char b[32];
  for (double x : v) {
    std::snprintf(b, sizeof b, "%.3f", x);
    s += (s.empty() ? "" : sep) + std::string(b);
  }
  return s;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"Packets per second of spin-emu's NIC with the empty handler set on net_null, beside DPDK io forwarding "
               "(testpmd's io mode) on the same vdevs in the same run."};
  app.add_option("--sizes", o.sizes, "frame sizes in bytes (64 is measured with the smallest spin frame, 88)")
      ->capture_default_str()
      ->check(CLI::Range(64u, 9000u));
  app.add_option("--seconds", o.seconds, "duration of one measurement")->capture_default_str()->check(CLI::Range(0.01, 600.0));
  app.add_option("--repeats", o.repeats, "measurements per variant (interleaved); the median is reported")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u));
  app.add_option("--warmup", o.warmup_seconds, "warm-up run per variant and size (seconds)")->capture_default_str()->check(CLI::Range(0.0, 60.0));
  app.add_option("--csv", o.csv_path, "also write the results as CSV to this file");
  app.add_option("--json", o.json_path, "also write the results as JSON to this file");
  app.add_option("--poll-cpu", o.poll_cpu, "CPU of the EAL main lcore: the poll thread and the baseline loop")->capture_default_str();
  app.add_option("--hpu-cpu", o.hpu_cpu, "CPU of the emulator's HPU thread")->capture_default_str();
  app.add_flag("!--no-same-cpu", o.same_cpu, "skip the variant with the HPU on the poll CPU");
  app.add_flag("!--no-copy-baseline", o.copy_baseline, "skip the io-fwd + payload copy row");
  app.add_option("--pool-mbufs", o.pool_mbufs, "mbufs per port pool (message ids repeat after this many frames)")
      ->capture_default_str()
      ->check(CLI::Range(2049u, 1u << 20));
  app.add_option("--only", o.only, "run only these variants (for profiling; ratios need io-fwd)")
      ->check(CLI::IsMember({"io-fwd", "io-fwd@64", "fwd+copy", "emu", "emu-1cpu"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  const auto load0 = load_average();
  std::vector<std::string> eal = emu::default_eal_args("emu_forward_" + std::to_string(::getpid()));
  eal.push_back("-l");
  eal.push_back(std::to_string(o.poll_cpu));
  if (auto r = emu::eal_init(eal); !r) {
    std::fprintf(stderr, "%s\n", r.err().message.c_str());
    return 2;
  }

  std::printf("emu_forward: %.2f s per measurement, %u repeats (median), %.2f s warm-up, burst %u, pool %u mbufs without "
              "cache, %u hardware threads\n",
              o.seconds, o.repeats, o.warmup_seconds, burst, o.pool_mbufs, std::thread::hardware_concurrency());
  std::printf("build: buildtype=%s optimization=%s NDEBUG=%s sanitize=%s; DPDK %s\n", SPIN_BUILD_TYPE, SPIN_BUILD_OPTIMIZATION,
              ndebug_defined() ? "defined" : "undefined", SPIN_BUILD_SANITIZE, rte_version());
  std::printf("load average before: %.2f %.2f %.2f\n", load0[0], load0[1], load0[2]);
  if (load0[0] >= 0.5)
    std::printf("warning: load average %.2f: other processes compete for the %u cores, numbers are noisy\n", load0[0],
                std::thread::hardware_concurrency());
  if (sanitized_build()) std::printf("warning: sanitizer build: numbers are not representative\n");
  if (std::strcmp(SPIN_BUILD_OPTIMIZATION, "0") == 0 || std::strcmp(SPIN_BUILD_OPTIMIZATION, "g") == 0)
    std::printf("warning: unoptimized build: numbers are not representative\n");
  std::fflush(stdout);

  std::vector<row> rows;
  std::vector<std::string> checks;
  bool checks_ok = true;
  for (std::uint32_t s : o.sizes)
    if (!run_size(s, o, rows, checks, checks_ok)) return 2;
  const auto load1 = load_average();

  std::printf("\n%-5s %-5s %-10s %-13s %7s %7s %6s %6s %8s %7s %6s %6s  %s\n", "size", "frame", "variant", "threads", "Mpps",
              "Gbit/s", "ratio", "aim", "Mpps/cpu", "ratio", "hpu ns", "hpu cpu", "runs (Mpps wall)");
  for (const auto& r : rows) {
    const double m = median(r.mpps), mc = median(r.mpps_cpu);
    const std::string threads = "1lc" + (r.hpu_threads ? "+1hpu@" + r.cpus.substr(r.cpus.find("hpu=") + 4) : std::string());
    char ratio[16] = "-", ratio_cpu[16] = "-", hpu[16] = "-", share[16] = "-";
    if (r.ratio > 0) std::snprintf(ratio, sizeof ratio, "%.3f", r.ratio);
    if (r.ratio_cpu > 0) std::snprintf(ratio_cpu, sizeof ratio_cpu, "%.3f", r.ratio_cpu);
    if (!r.hpu_ns.empty()) std::snprintf(hpu, sizeof hpu, "%.0f", median(r.hpu_ns));
    if (!r.hpu_share.empty()) std::snprintf(share, sizeof share, "%.0f%%", 100 * median(r.hpu_share));
    std::printf("%-5u %-5u %-10s %-13s %7.2f %7.2f %6s %6s %8.2f %7s %6s %6s  %s\n", r.size_requested, r.frame_bytes, r.variant.c_str(),
                threads.c_str(), m, m * r.frame_bytes * 8 / 1e3, ratio, r.is_aim ? (r.ratio >= aim_ratio ? "met" : "MISSED") : "",
                mc, ratio_cpu, hpu, share, join(r.mpps, " ").c_str());
  }
  std::printf("\nvariants:\n");
  {
    std::vector<std::string> seen;
    for (const auto& r : rows) {
      if (std::find(seen.begin(), seen.end(), r.variant) != seen.end()) continue;
      seen.push_back(r.variant);
      std::printf("  %-10s %s\n", r.variant.c_str(), r.what.c_str());
    }
  }
  std::printf("notes:\n"
              "  size 64 runs at frame 88: the smallest spin frame (Ethernet/IPv4/UDP/spin header, no payload); io-fwd\n"
              "  is measured at 88 for the ratio, io-fwd@64 at 64 for reference. 88-byte frames carry no payload, so the\n"
              "  runtime releases them on the poll thread and the HPU idles; larger frames are one deposit task each.\n"
              "  threads: the poll thread is the EAL main lcore on CPU %d; emu adds 1 HPU thread on CPU %d; emu-1cpu puts\n"
              "  the HPU on CPU %d too (the poll loop never yields, so the HPU runs only when the OS preempts it).\n"
              "  rate: frames taken from the RX port per second; Gbit/s = Mpps x frame bytes x 8. net_null (copy=0) writes\n"
              "  no data and io-fwd touches none, so its rate does not depend on frame size; the emulator parses each\n"
              "  header and copies each payload (frame - 88 bytes) into host memory.\n"
              "  pools: %u mbufs, no per-lcore cache (FIFO, so pre-filled message ids stay distinct), data room and\n"
              "  maximum frame max(2048, frame) bytes, the same for io-fwd and the emulator.\n"
              "  ratio: median / io-fwd median at the same frame size; aim: emu at least %.1f (wall-clock Mpps).\n"
              "  Mpps/cpu: packets per CPU-second of the poll (or forwarding) thread, and its ratio: robust against\n"
              "  other load on the machine, which takes the core away from both alike only on average.\n"
              "  hpu ns: HPU time in default deposits per packet (hpu_stats::busy_ns); near 1e3/Mpps means HPU-bound.\n"
              "  hpu cpu: CPU time the HPU thread got / wall time (process CPU minus the poll thread's); well below\n"
              "  100%% while the poll thread waits on a full HPU queue means the OS gave the HPU's CPU to others.\n",
              o.poll_cpu, o.hpu_cpu, o.poll_cpu, o.pool_mbufs, aim_ratio);
  std::printf("checks (after the runs, runtime drained: EC packets_in == frames handed to the runtime, no drops or rejects):\n");
  for (const auto& c : checks) std::printf("  %s\n", c.c_str());
  std::printf("load average after: %.2f %.2f %.2f\n", load1[0], load1[1], load1[2]);
  std::printf("result: %s\n", checks_ok ? "all checks passed" : "CHECKS FAILED (exit status 1)");

  if (!o.csv_path.empty()) {
    std::ofstream f(o.csv_path);
    f << "size_requested,frame_bytes,variant,lcores,hpu_threads,cpus,mpps_median,gbps_median,ratio_vs_io_fwd,aim_met,"
         "mpps_per_cpu_second,ratio_per_cpu_second,hpu_ns_per_packet,hpu_cpu_share,mpps_runs,load_before,load_after\n";
    for (const auto& r : rows) {
      const double m = median(r.mpps);
      f << r.size_requested << ',' << r.frame_bytes << ',' << r.variant << ',' << r.lcores << ',' << r.hpu_threads << ','
        << r.cpus << ',' << m << ',' << m * r.frame_bytes * 8 / 1e3 << ',' << r.ratio << ','
        << (r.is_aim ? (r.ratio >= aim_ratio ? "yes" : "no") : "") << ',' << median(r.mpps_cpu) << ',' << r.ratio_cpu << ','
        << (r.hpu_ns.empty() ? 0 : median(r.hpu_ns)) << ',' << (r.hpu_share.empty() ? 0 : median(r.hpu_share)) << ',' << join(r.mpps, ";") << ',' << load0[0] << ',' << load1[0] << '\n';
    }
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", o.csv_path.c_str());
      return 2;
    }
  }
  if (!o.json_path.empty()) {
    nlohmann::json jr = nlohmann::json::array();
    for (const auto& r : rows) {
      const double m = median(r.mpps);
      nlohmann::json j = {{"size_requested", r.size_requested},
                          {"frame_bytes", r.frame_bytes},
                          {"variant", r.variant},
                          {"what", r.what},
                          {"lcores", r.lcores},
                          {"hpu_threads", r.hpu_threads},
                          {"cpus", r.cpus},
                          {"mpps", m},
                          {"gbps", m * r.frame_bytes * 8 / 1e3},
                          {"mpps_runs", r.mpps},
                          {"mpps_per_cpu_second", median(r.mpps_cpu)},
                          {"mpps_per_cpu_second_runs", r.mpps_cpu}};
      if (r.ratio > 0) j["ratio_vs_io_fwd"] = r.ratio;
      if (r.ratio_cpu > 0) j["ratio_per_cpu_second_vs_io_fwd"] = r.ratio_cpu;
      if (!r.hpu_ns.empty()) j["hpu_busy_ns_per_packet"] = median(r.hpu_ns);
      if (!r.hpu_share.empty()) j["hpu_cpu_share"] = median(r.hpu_share);
      if (r.is_aim) j["aim_met"] = r.ratio >= aim_ratio;
      jr.push_back(j);
    }
    const nlohmann::json doc = {
        {"benchmark", "emu_forward"},
        {"build",
         {{"buildtype", SPIN_BUILD_TYPE}, {"optimization", SPIN_BUILD_OPTIMIZATION}, {"ndebug", ndebug_defined()}, {"sanitize", SPIN_BUILD_SANITIZE}}},
        {"dpdk", rte_version()},
        {"load_average_before", load0},
        {"load_average_after", load1},
        {"config",
         {{"seconds", o.seconds},
          {"repeats", o.repeats},
          {"warmup_seconds", o.warmup_seconds},
          {"burst", burst},
          {"pool_mbufs", o.pool_mbufs},
          {"pool_cache", 0},
          {"poll_cpu", o.poll_cpu},
          {"hpu_cpu", o.hpu_cpu},
          {"hardware_threads", std::thread::hardware_concurrency()}}},
        {"aim", {{"min_ratio", aim_ratio}, {"variant", "emu"}}},
        {"results", jr},
        {"checks", checks},
        {"checks_passed", checks_ok},
    };
    std::ofstream f(o.json_path);
    f << doc.dump(2) << '\n';
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", o.json_path.c_str());
      return 2;
    }
  }
  rte_eal_cleanup();
  return checks_ok ? 0 : 1;
}
