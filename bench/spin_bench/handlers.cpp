// spin-bench handlers. How the figures come about (docs/benchmarks.md has the full story):
//
// Packets. Every row feeds spin-emu's NIC from a net_null port (copy=0: the PMD hands out mbufs
// of its pool without writing them). The pool is pre-filled: every mbuf is given a valid spin
// frame (one single-packet message, start|end, the handler's payload pattern) and freed. The
// pool has no per-lcore cache, so its ring hands mbufs out in FIFO order and a frame's bytes come
// from memory, as a NIC's DMA would, not from a few cache-hot mbufs. An RX callback writes a
// fresh message id into every frame (stamp_ids, below). Every packet is a whole message: header,
// payload and completion handler all run once per packet, the worst case for per-message costs.
//
// Threads (run to completion). HPU 0 is EAL's main lcore on --poll-cpu: it receives every burst
// (net_null has one RX queue here) and runs its own messages' handlers; HPU i runs on an lcore
// of its own on CPU (poll + i) mod hardware threads and runs the messages steered to it.
//
// Baselines, per frame size, in the same process on the same kind of port:
// - io-fwd: testpmd's io forwarding (rx_burst on net_null A, tx_burst on net_null B, unsent
//   freed) on one lcore; Debian's DPDK has no dpdk-testpmd, so the loop is rebuilt here.
// - macswap: testpmd's macswap forwarding: io-fwd that swaps each frame's MAC addresses, so
//   the first cache line of every frame is read and written (a NIC that looks at headers
//   cannot do with less).
// - fwd+copy: io-fwd plus a memcpy of each payload into a host buffer (a default deposit's work).
// - memcpy and fadd: one core's bandwidth over the same bytes: the payloads of the same
//   pre-filled pool, in pool order, copied into one host buffer (memcpy) or added as float32
//   into one accumulator (fadd).
//
// Rates. Mpps counts frames taken from the RX port per wall-clock second; Gbit/s is Mpps x frame
// bytes x 8. hpu ns/pkt is HPU time inside handlers (or deposits) per packet, all HPUs summed
// (hpu_stats::busy_ns); hpu cyc/pkt is the same in cycles of the cycle counter; busy is the
// share of wall time each HPU spent in handlers (near 1: the handlers bound the rate; well below:
// the NIC's own per-packet work does). HPU 0's CPU time per packet goes to the CSV and JSON.
//
// Checks. After the runs the runtime is drained and every row checked exactly: the EC accepted
// every frame handed to it, every message completed, nothing was dropped or rejected anywhere,
// and the handler's own counters and results in handler memory equal what the packets imply
// (sums, bin counts, echoes, DMA bytes).
#include "handlers.hpp"

#include "../common.hpp"

#include <spin/emu/eal.hpp>
#include <spin/emu/lcore.hpp>
#include <spin/emu/nic.hpp>
#include <spin/emu/port.hpp>
#include <spin/rt/loader.hpp>
#include <spin/rt/package.hpp>
#include <spin/rt/runtime.hpp>
#include <spin/rt/wire.hpp>
#include <spin/std/bcast_forward.hpp>
#include <spin/std/filter.hpp>
#include <spin/std/fsum.hpp>
#include <spin/std/histogram.hpp>
#include <spin/std/isum.hpp>
#include <spin/std/strided_unpack.hpp>

#include <bpf/libbpf.h>
#include <rte_dev.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_version.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <atomic>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

namespace spin::bench {

namespace {

using clock_type = std::chrono::steady_clock;

// Empty handler set, 1 HPU: Mpps / io-fwd Mpps and Mpps / macswap Mpps (the run-to-completion
// issue's aim; the first round's was 0.8 x io-fwd).
constexpr double aim_empty_vs_fwd = 0.5;
constexpr double aim_empty_vs_macswap = 0.6;
constexpr double aim_fsum_vs_memcpy = 0.5;   // fsum at 4 KiB: payload bytes/s per HPU / memcpy bytes/s
constexpr std::uint32_t aim_fsum_payload = 4096;
constexpr std::uint32_t burst = 32;          // testpmd's default burst; the NIC's burst too
constexpr std::uint64_t bench_match_bits = 0xbe7cull;
constexpr std::uint32_t source_rank = 1;
constexpr std::uint32_t nic_rank = 0;
constexpr std::size_t host_window_bytes = 64 << 10;
constexpr std::uint32_t tx_ring_packets = 1024;  // per HPU and port (nic_config)
constexpr std::uint32_t header_bytes = static_cast<std::uint32_t>(rt::wire::min_overhead);

// ---- ports -----------------------------------------------------------------------------------

// A net_null vdev created at run time (EAL initialises once per process, so sizes cannot come
// from the command line) and removed again.
class null_vdev {
public:
  static std::unique_ptr<null_vdev> create(std::uint32_t frame_bytes, bool receives = true) {
    static unsigned seq = 0;
    std::unique_ptr<null_vdev> v(new null_vdev());
    v->_name = "net_null_bench" + std::to_string(seq++);
    const std::string args = "size=" + std::to_string(frame_bytes) + ",copy=0" + (receives ? "" : ",no-rx=1");
    if (int rc = rte_eal_hotplug_add("vdev", v->_name.c_str(), args.c_str()); rc != 0) {
      std::fprintf(stderr, "cannot create vdev %s,%s: %s\n", v->_name.c_str(), args.c_str(), rte_strerror(-rc));
      return nullptr;
    }
    v->_live = true;
    auto id = emu::find_port(v->_name);
    if (!id) {
      std::fprintf(stderr, "%s\n", id.err().message.c_str());
      return nullptr;
    }
    v->_port = *id;
    v->_has_port = true;
    return v;
  }
  null_vdev(const null_vdev&) = delete;
  null_vdev& operator=(const null_vdev&) = delete;
  ~null_vdev() {
    if (!_live) return;
    if (_has_port) (void)rte_eth_dev_close(_port);
    (void)rte_eal_hotplug_remove("vdev", _name.c_str());
  }
  std::uint16_t port() const { return _port; }

private:
  null_vdev() = default;
  std::string _name;
  std::uint16_t _port = 0;
  bool _live = false, _has_port = false;
};

emu::port_options port_opts(std::uint32_t frame_bytes, const handlers_options& o) {
  emu::port_options p;
  p.pool_mbufs = o.pool_mbufs;
  p.pool_cache = 0;  // FIFO mbuf order: see the top of the file
  // net_null cannot scatter: a frame must fit one mbuf.
  // The NIC's own sends reserve room for the largest spin header (rt::wire::max_overhead: the
  // collective extension and the authentication tag): the largest frame must exceed the received
  // ones by that much, or a handler could not send a received payload on.
  p.mbuf_data_bytes = static_cast<std::uint16_t>(
      std::max<std::uint32_t>(2048, frame_bytes - rt::wire::min_overhead + rt::wire::max_overhead));
  p.max_frame_bytes = p.mbuf_data_bytes;
  return p;
}

// Fresh message ids. A pre-filled pool hands out the same frames again after one cycle; an HPU
// that the OS keeps off its core for longer than a cycle would then see a message id that is
// still open (a duplicate). An RX callback (rte_eth_add_rx_callback) therefore writes a new
// message id into every received frame, on HPU 0's lcore, before anyone parses it: one 8-byte
// store into the header's cache line per packet. The baselines do without it (io-fwd touches no
// frame byte), so the store counts against the NIC.
//
// A handler that forwards its packet (pingpong, bcast_forward) sends the received mbuf itself,
// its headers rewritten in place for the destination, and net_null's TX frees it into the
// pool the RX port takes frames from. For those rows the callback also writes the frame's
// headers back (header_bytes, the message id included), as a real NIC's DMA writes the whole
// received frame; the two cache lines it writes count against the NIC too.
constexpr std::size_t message_id_offset = rt::wire::eth_len + rt::wire::ipv4_min_len + rt::wire::udp_len + 16;
struct id_stamp {
  std::uint64_t next = 1;
  bool restore = false;
  std::array<std::byte, header_bytes> header{};
};
std::uint16_t stamp_ids(std::uint16_t, std::uint16_t, rte_mbuf** pkts, std::uint16_t n, std::uint16_t, void* user) {
  auto* s = static_cast<id_stamp*>(user);
  // Start every line's fetch before the first store, as the NIC's RX loop does for its reads.
  for (std::uint16_t i = 0; i < n; ++i) {
    __builtin_prefetch(rte_pktmbuf_mtod_offset(pkts[i], void*, message_id_offset), 1);
    if (s->restore) __builtin_prefetch(rte_pktmbuf_mtod(pkts[i], void*), 1);
  }
  for (std::uint16_t i = 0; i < n; ++i) {
    if (s->restore) std::memcpy(rte_pktmbuf_mtod(pkts[i], std::byte*), s->header.data(), header_bytes);
    const std::uint64_t be = __builtin_bswap64(s->next++);
    std::memcpy(rte_pktmbuf_mtod_offset(pkts[i], std::byte*, message_id_offset), &be, sizeof be);
  }
  return n;
}
// Adds stamp_ids to queue 0 of `port` for its lifetime.
class stamper {
public:
  // `headers`: the header_bytes every frame of the port starts with, to write back into each
  // (rows whose handler forwards its packet in place); empty: ids only.
  bool add(std::uint16_t port, std::span<const std::byte> headers = {}) {
    _port = port;
    if (!headers.empty()) {
      if (headers.size() != header_bytes) return false;
      std::memcpy(_ids.header.data(), headers.data(), header_bytes);
      _ids.restore = true;
    }
    _cb = rte_eth_add_rx_callback(port, 0, stamp_ids, &_ids);
    if (_cb == nullptr) std::fprintf(stderr, "rte_eth_add_rx_callback on port %u: %s\n", port, rte_strerror(rte_errno));
    return _cb != nullptr;
  }
  stamper() = default;
  stamper(const stamper&) = delete;
  stamper& operator=(const stamper&) = delete;
  // Only once nobody polls the port any more (rte_eth_remove_rx_callback's rule), and before
  // the port closes.
  void remove() {
    if (_cb != nullptr) (void)rte_eth_remove_rx_callback(_port, 0, _cb);
    _cb = nullptr;
  }
  ~stamper() { remove(); }

private:
  id_stamp _ids;
  std::uint16_t _port = 0;
  const rte_eth_rxtx_callback* _cb = nullptr;
};

using fill_fn = std::function<void(std::span<std::byte> payload)>;

// The payload of rows whose handler does not read it, and of the baselines.
void default_fill(std::span<std::byte> p) {
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::byte>(i * 13 + 5);
}

// The spin header of the bench's single-packet message `id` with `payload_len` bytes.
rt::wire::header bench_header(std::uint64_t id, std::size_t payload_len) {
  rt::wire::header h;
  h.source_rank = source_rank;
  h.match_bits = bench_match_bits;
  h.message_id = id;
  h.seq = 0;
  h.message_len = static_cast<std::uint32_t>(payload_len);
  h.offset = 0;
  h.flags = rt::wire::flag_start | rt::wire::flag_end;
  return h;
}

// Writes a valid single-packet message (payload from `fill`) into every mbuf of `pool`, ids
// first_id, first_id + 1, ... in the order the pool's ring hands them out, and frees them all.
// `payloads`, when given, receives each mbuf's payload address (pool order).
bool prefill_pool(rte_mempool* pool, std::uint32_t frame_bytes, const fill_fn& fill, std::vector<const std::byte*>* payloads) {
  const unsigned size = pool->size;
  if (rte_mempool_avail_count(pool) != size) {
    std::fprintf(stderr, "prefill: pool %s has %u of %u mbufs free\n", pool->name, rte_mempool_avail_count(pool), size);
    return false;
  }
  std::vector<rte_mbuf*> all;
  all.reserve(size);
  std::vector<std::byte> payload(frame_bytes - header_bytes);
  fill(payload);
  const rt::wire::endpoint src = rt::wire::rank_endpoint(source_rank), dst = rt::wire::rank_endpoint(nic_rank);
  bool ok = true;
  for (unsigned k = 0; k < size && ok; ++k) {
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    if (m == nullptr) {
      std::fprintf(stderr, "prefill: got %u of %u mbufs\n", k, size);
      ok = false;
      break;
    }
    all.push_back(m);
    const rt::wire::header h = bench_header(1 + k, payload.size());
    // net_null's RX resets data_off to the headroom and sets the length, so the frame goes there.
    const std::size_t n =
        rt::wire::encode(src, dst, h, payload, std::span<std::byte>(rte_pktmbuf_mtod(m, std::byte*), rte_pktmbuf_tailroom(m)));
    if (n != frame_bytes) {
      std::fprintf(stderr, "prefill: wire::encode wrote %zu bytes, expected %u\n", n, frame_bytes);
      ok = false;
    }
    if (payloads != nullptr) payloads->push_back(rte_pktmbuf_mtod_offset(m, const std::byte*, header_bytes));
  }
  for (rte_mbuf* m : all) rte_pktmbuf_free(m);  // in allocation order: the ring hands them out the same way
  return ok;
}

// ---- baselines -------------------------------------------------------------------------------

struct loop_result {
  std::uint64_t packets = 0;
  double seconds = 0;      // wall clock
  double cpu_seconds = 0;  // CPU time of the loop's thread
};

clock_type::time_point deadline(clock_type::time_point t0, double seconds) {
  return t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
}

// Swaps destination and source MAC address, as testpmd's macswap mode does.
void swap_macs(rte_mbuf* m) noexcept {
  auto* f = rte_pktmbuf_mtod(m, std::uint8_t*);
  std::uint8_t t[6];
  std::memcpy(t, f, 6);
  std::memcpy(f, f + 6, 6);
  std::memcpy(f + 6, t, 6);
}

enum class fwd_mode { io, macswap, copy };

// testpmd-style forwarding on this lcore: rx_port -> tx_port, unsent freed; io (no frame byte
// touched), macswap, or copy (each payload, copy_bytes long, copied into sink first).
loop_result forward_loop(std::uint16_t rx_port, std::uint16_t tx_port, double seconds, fwd_mode mode, std::uint32_t copy_bytes,
                         std::byte* sink) {
  std::array<rte_mbuf*, burst> bufs{};
  loop_result r;
  const double c0 = thread_cpu_seconds();
  const auto t0 = clock_type::now(), end = deadline(t0, seconds);
  auto now = t0;
  do {
    for (int k = 0; k < 64; ++k) {
      const std::uint16_t n = rte_eth_rx_burst(rx_port, 0, bufs.data(), burst);
      if (n == 0) continue;
      r.packets += n;
      if (mode == fwd_mode::copy)
        for (std::uint16_t i = 0; i < n; ++i) {
          std::memcpy(sink, rte_pktmbuf_mtod_offset(bufs[i], const std::byte*, header_bytes), copy_bytes);
          // Every copy must happen: nothing reads the sink in between, so without this the
          // compiler drops the copies (it did: "fwd+copy" then ran as fast as io-fwd).
          asm volatile("" : : "r"(sink) : "memory");
        }
      if (mode == fwd_mode::macswap) {
        for (std::uint16_t i = 0; i < n; ++i) rte_prefetch0(rte_pktmbuf_mtod(bufs[i], const void*));
        for (std::uint16_t i = 0; i < n; ++i) swap_macs(bufs[i]);
      }
      const std::uint16_t sent = rte_eth_tx_burst(tx_port, 0, bufs.data(), n);
      if (sent < n) rte_pktmbuf_free_bulk(bufs.data() + sent, n - sent);
    }
    now = clock_type::now();
  } while (now < end);
  r.cpu_seconds = thread_cpu_seconds() - c0;
  r.seconds = std::chrono::duration<double>(now - t0).count();
  return r;
}

// Keeps the memory loops' results alive without a store per element.
volatile float memory_loop_sink = 0;

// One core's memcpy over `payloads` (each `bytes` long), in order, into one buffer; packets are
// payloads copied.
loop_result memcpy_loop(const std::vector<const std::byte*>& payloads, std::uint32_t bytes, double seconds) {
  std::vector<std::byte> dst(std::max<std::uint32_t>(bytes, 64));
  loop_result r;
  const double c0 = thread_cpu_seconds();
  const auto t0 = clock_type::now(), end = deadline(t0, seconds);
  auto now = t0;
  do {
    for (const std::byte* p : payloads) {
      std::memcpy(dst.data(), p, bytes);
      asm volatile("" : : "r"(dst.data()) : "memory");  // every copy happens (see forward_loop)
    }
    r.packets += payloads.size();
    now = clock_type::now();
  } while (now < end);
  r.cpu_seconds = thread_cpu_seconds() - c0;
  r.seconds = std::chrono::duration<double>(now - t0).count();
  memory_loop_sink = static_cast<float>(dst[0]);
  return r;
}

// One core's float32 add loop: acc[j] += payload[j] over every payload in order.
loop_result fadd_loop(const std::vector<const std::byte*>& payloads, std::uint32_t bytes, double seconds) {
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> acc(std::max<std::size_t>(n, 1), 0.0f);
  loop_result r;
  const double c0 = thread_cpu_seconds();
  const auto t0 = clock_type::now(), end = deadline(t0, seconds);
  auto now = t0;
  do {
    for (const std::byte* p : payloads) {
      const float* v = reinterpret_cast<const float*>(p);
      float* a = acc.data();
      for (std::size_t j = 0; j < n; ++j) a[j] += v[j];
    }
    r.packets += payloads.size();
    asm volatile("" : : "r"(acc.data()) : "memory");
    now = clock_type::now();
  } while (now < end);
  r.cpu_seconds = thread_cpu_seconds() - c0;
  r.seconds = std::chrono::duration<double>(now - t0).count();
  memory_loop_sink = acc[0];
  return r;
}

// ---- the handlers --------------------------------------------------------------------------

struct check_input {
  std::uint64_t rx = 0;  // frames handed to the runtime
  std::uint32_t payload = 0;
  const rt::ec_stats* ec = nullptr;
  std::span<const std::byte> mem;        // handler memory
  std::span<const std::byte> pattern;    // every frame's payload
};
using bad_fn = std::function<void(const std::string&)>;

// What the benchmark needs to know of one handler package.
struct handler_spec {
  std::string name;
  std::string package;  // package base name; "" for the empty handler set
  std::vector<std::string> targets;
  std::string what;
  // Why the handler cannot take this payload ("" when it can).
  std::function<std::string(std::uint32_t payload)> refuses = [](std::uint32_t) { return std::string(); };
  fill_fn fill = default_fill;
  // Writes the handler memory's configuration before traffic.
  std::function<void(std::span<std::byte> mem, std::uint32_t payload)> setup = [](std::span<std::byte>, std::uint32_t) {};
  // Exact checks of the handler's own results after the runs.
  std::function<void(const check_input&, const bad_fn&)> check = [](const check_input&, const bad_fn&) {};
  bool sends = false;     // one send per packet
  bool deposits = false;  // no payload handler: default deposit
};

template <class T> T read_mem(std::span<const std::byte> mem, std::size_t off = 0) {
  T v{};
  std::memcpy(&v, mem.data() + off, sizeof v);
  return v;
}
template <class T> void write_mem(std::span<std::byte> mem, const T& v, std::size_t off = 0) { std::memcpy(mem.data() + off, &v, sizeof v); }

std::string u64s(std::uint64_t v) { return std::to_string(v); }

void expect_eq(const bad_fn& bad, const char* what, std::uint64_t got, std::uint64_t want) {
  if (got != want) bad(std::string(what) + " " + u64s(got) + " != " + u64s(want));
}

// The checks of a streaming sum (isum, fsum): every packet added once, every message completed,
// none refused, and every element of the sum equals packets x the element every frame carries.
template <class Acc, class Elem, class State> void check_stream_sum(const check_input& in, const bad_fn& bad, const std::string& name) {
  expect_eq(bad, (name + " packets").c_str(), read_mem<std::uint64_t>(in.mem, offsetof(State, packets)), in.rx);
  expect_eq(bad, (name + " messages").c_str(), read_mem<std::uint64_t>(in.mem, offsetof(State, messages)), in.rx);
  expect_eq(bad, (name + " rejected").c_str(), read_mem<std::uint64_t>(in.mem, offsetof(State, rejected)), 0);
  for (std::size_t i = 0; i < in.payload / sizeof(Elem); ++i) {
    const Acc got = read_mem<Acc>(in.mem, offsetof(State, acc) + sizeof(Acc) * i);
    const Acc want = static_cast<Acc>(read_mem<Elem>(in.pattern, sizeof(Elem) * i)) * static_cast<Acc>(in.rx);
    if (got != want) {
      bad(name + " acc[" + std::to_string(i) + "] " + std::to_string(got) + " != " + std::to_string(want));
      return;
    }
  }
}

// The runtime runs no payload handler for a packet without payload (its message has only a
// header and a completion).
constexpr const char* no_payload_handler = "a packet without payload runs no payload handler";

std::vector<handler_spec> all_handlers() {
  using namespace spin::stdh;
  std::vector<handler_spec> v;
  {
    handler_spec h;
    h.name = "empty";
    h.what = "the empty handler set: an EC without handlers, whose packets are deposited into host memory (a memcpy)";
    h.targets = {"none"};
    h.deposits = true;
    v.push_back(h);
  }
  {
    handler_spec h;
    h.name = "noop";
    h.package = "noop";
    h.targets = {"native", "ebpf"};
    h.what = "a payload handler that returns at once (bench/handlers/noop.cpp): the cost of calling a handler";
    h.refuses = [](std::uint32_t p) -> std::string { return p == 0 ? no_payload_handler : ""; };
    v.push_back(h);
  }
  {
    handler_spec h;
    h.name = "isum";
    h.package = "isum";
    h.targets = {"native", "ebpf"};
    h.what = "streaming int32 sum into int64 accumulators, a lock per 256 elements (handlers/std/isum.cpp)";
    h.refuses = [](std::uint32_t p) -> std::string {
      if (p == 0 || p % 4 != 0) return "payload is not a non-empty multiple of 4 bytes";
      if (p > isum_max_packet_elements * 4) return "isum takes at most 4096 payload bytes per packet";
      return "";
    };
    h.fill = [](std::span<std::byte> p) {
      for (std::size_t i = 0; i < p.size() / 4; ++i) {
        const std::int32_t x = static_cast<std::int32_t>(i * 37 % 2001) - 1000;
        std::memcpy(p.data() + 4 * i, &x, 4);
      }
    };
    h.setup = [](std::span<std::byte> mem, std::uint32_t payload) {
      write_mem<std::uint64_t>(mem, payload / 4, offsetof(isum_state, elements));
      write_mem<std::uint64_t>(mem, ~0ull, offsetof(isum_state, expected_messages));  // never DMA
    };
    h.check = [](const check_input& in, const bad_fn& bad) {
      check_stream_sum<std::int64_t, std::int32_t, isum_state>(in, bad, "isum");
    };
    v.push_back(h);
  }
  {
    handler_spec h;
    h.name = "fsum";
    h.package = "fsum";
    h.targets = {"native"};
    h.what = "streaming float32 sum, a lock per 512 elements (handlers/std/fsum.cpp; native only: eBPF has no floating point)";
    h.refuses = [](std::uint32_t p) -> std::string {
      if (p == 0 || p % 4 != 0) return "payload is not a non-empty multiple of 4 bytes";
      if (p > fsum_max_packet_elements * 4) return "fsum takes at most 9216 payload bytes per packet";
      return "";
    };
    // Small integers, so that every partial sum is exact in float32 (below 2^24).
    h.fill = [](std::span<std::byte> p) {
      for (std::size_t i = 0; i < p.size() / 4; ++i) {
        const float x = static_cast<float>(static_cast<int>(i % 5) - 2);
        std::memcpy(p.data() + 4 * i, &x, 4);
      }
    };
    h.setup = [](std::span<std::byte> mem, std::uint32_t payload) {
      write_mem<std::uint64_t>(mem, payload / 4, offsetof(fsum_state, elements));
      write_mem<std::uint64_t>(mem, 0, offsetof(fsum_state, expected_messages));  // never DMA
    };
    h.check = [](const check_input& in, const bad_fn& bad) {
      // Beyond float32's exact integers (2^24) there is no exact value to compare with.
      if (in.rx * 2 < (1ull << 24)) check_stream_sum<float, float, fsum_state>(in, bad, "fsum");
    };
    v.push_back(h);
  }
  {
    handler_spec h;
    h.name = "pingpong";
    h.package = "pingpong";
    h.targets = {"native", "ebpf"};
    h.what = "every packet sent straight back to its source (handlers/std/pingpong.cpp; PsPIN, ISCA 2021, section 6.1)";
    h.sends = true;
    h.refuses = [](std::uint32_t p) -> std::string { return p == 0 ? no_payload_handler : ""; };
    h.check = [](const check_input& in, const bad_fn& bad) {
      expect_eq(bad, "pingpong echoed", read_mem<std::uint64_t>(in.mem, 0), in.rx);
      expect_eq(bad, "pingpong refused", read_mem<std::uint64_t>(in.mem, 8), 0);
    };
    v.push_back(h);
  }
  {
    handler_spec h;
    h.name = "strided_unpack";
    h.package = "strided_unpack";
    h.targets = {"native"};
    h.what = "16-byte blocks scattered to a 32-byte stride in host memory (handlers/std/strided_unpack.cpp; sPIN, SC17, 5.2)";
    h.refuses = [](std::uint32_t p) -> std::string {
      if (p == 0 || p % 16 != 0) return "payload is not a non-empty multiple of 16 bytes (the block)";
      if (p / 16 * 32 > host_window_bytes) return "the unpacked vector exceeds the 64 KiB host window";
      return "";
    };
    h.setup = [](std::span<std::byte> mem, std::uint32_t payload) {
      write_mem<std::uint64_t>(mem, 16, offsetof(strided_state, block_bytes));
      write_mem<std::uint64_t>(mem, 32, offsetof(strided_state, stride_bytes));
      write_mem<std::uint64_t>(mem, payload / 16, offsetof(strided_state, blocks));
    };
    h.check = [](const check_input& in, const bad_fn& bad) {
      expect_eq(bad, "strided messages", read_mem<std::uint64_t>(in.mem, offsetof(strided_state, messages)), in.rx);
      expect_eq(bad, "strided rejected", read_mem<std::uint64_t>(in.mem, offsetof(strided_state, rejected)), 0);
      expect_eq(bad, "strided dma_failed", read_mem<std::uint64_t>(in.mem, offsetof(strided_state, dma_failed)), 0);
      expect_eq(bad, "EC dma_to_host_bytes", in.ec->dma_to_host_bytes, in.rx * in.payload);
    };
    v.push_back(h);
  }
  {
    handler_spec h;
    h.name = "histogram";
    h.package = "histogram";
    h.targets = {"native"};
    h.what = "int32 values counted into 256 bins with atomic adds (handlers/std/histogram.cpp)";
    h.refuses = [](std::uint32_t p) -> std::string { return p % 4 != 0 ? "payload is not a multiple of 4 bytes" : ""; };
    h.fill = [](std::span<std::byte> p) {
      for (std::size_t i = 0; i < p.size() / 4; ++i) {
        const std::int32_t x = static_cast<std::int32_t>(i * 37 % 4200) - 50;  // some under- and overflow
        std::memcpy(p.data() + 4 * i, &x, 4);
      }
    };
    h.setup = [](std::span<std::byte> mem, std::uint32_t) {
      write_mem<std::int64_t>(mem, 0, offsetof(histogram_state, lo));
      write_mem<std::uint64_t>(mem, 16, offsetof(histogram_state, bin_width));
      write_mem<std::uint64_t>(mem, histogram_max_bins, offsetof(histogram_state, bins));
      write_mem<std::uint64_t>(mem, 0, offsetof(histogram_state, expected_messages));  // never DMA
    };
    h.check = [](const check_input& in, const bad_fn& bad) {
      std::uint64_t under = 0, over = 0;
      std::vector<std::uint64_t> counts(histogram_max_bins, 0);
      for (std::size_t i = 0; i < in.payload / 4; ++i) {
        const std::int32_t x = read_mem<std::int32_t>(in.pattern, 4 * i);
        if (x < 0)
          ++under;
        else if (x / 16 >= static_cast<std::int32_t>(histogram_max_bins))
          ++over;
        else
          ++counts[static_cast<std::size_t>(x / 16)];
      }
      expect_eq(bad, "histogram rejected", read_mem<std::uint64_t>(in.mem, offsetof(histogram_state, rejected)), 0);
      expect_eq(bad, "histogram messages", read_mem<std::uint64_t>(in.mem, offsetof(histogram_state, messages)), in.rx);
      expect_eq(bad, "histogram underflow", read_mem<std::uint64_t>(in.mem, offsetof(histogram_state, underflow)), under * in.rx);
      expect_eq(bad, "histogram overflow", read_mem<std::uint64_t>(in.mem, offsetof(histogram_state, overflow)), over * in.rx);
      for (std::size_t b = 0; b < histogram_max_bins; ++b) {
        const std::uint64_t got = read_mem<std::uint64_t>(in.mem, offsetof(histogram_state, counts) + 8 * b);
        if (got != counts[b] * in.rx) {
          bad("histogram bin " + std::to_string(b) + " " + u64s(got) + " != " + u64s(counts[b] * in.rx));
          return;
        }
      }
    };
    v.push_back(h);
  }
  {
    handler_spec h;
    h.name = "filter";
    h.package = "filter";
    h.targets = {"native"};
    h.what = "16-byte records whose key lies outside [0, 999] are dropped on the NIC; here every record is (handlers/std/filter.cpp)";
    h.refuses = [](std::uint32_t p) -> std::string { return p % 16 != 0 ? "payload is not a multiple of 16 bytes (records)" : ""; };
    h.fill = [](std::span<std::byte> p) {
      for (std::size_t i = 0; i < p.size() / 16; ++i) {
        const filter_record r{1000 + i, i};
        std::memcpy(p.data() + 16 * i, &r, 16);
      }
    };
    h.setup = [](std::span<std::byte> mem, std::uint32_t) {
      write_mem<std::uint64_t>(mem, 0, offsetof(filter_state, key_lo));
      write_mem<std::uint64_t>(mem, 999, offsetof(filter_state, key_hi));
      write_mem<std::uint64_t>(mem, host_window_bytes / 16, offsetof(filter_state, capacity_records));
    };
    h.check = [](const check_input& in, const bad_fn& bad) {
      expect_eq(bad, "filter dropped", read_mem<std::uint64_t>(in.mem, offsetof(filter_state, dropped)), in.rx * (in.payload / 16));
      expect_eq(bad, "filter kept", read_mem<std::uint64_t>(in.mem, offsetof(filter_state, kept)), 0);
      expect_eq(bad, "filter rejected", read_mem<std::uint64_t>(in.mem, offsetof(filter_state, rejected)), 0);
    };
    v.push_back(h);
  }
  {
    handler_spec h;
    h.name = "bcast_forward";
    h.package = "bcast_forward";
    h.targets = {"native", "ebpf"};
    h.what = "every packet DMAed to host memory and sent on to the next rank (handlers/std/bcast_forward.cpp; SC24, section 3)";
    h.sends = true;
    h.refuses = [](std::uint32_t p) -> std::string { return p == 0 ? no_payload_handler : p > host_window_bytes ? "payload exceeds the host window" : ""; };
    h.setup = [](std::span<std::byte> mem, std::uint32_t) {
      write_mem<std::uint32_t>(mem, 2, offsetof(bcast_state, next_rank));
      write_mem<std::uint32_t>(mem, 1, offsetof(bcast_state, has_next));
    };
    h.check = [](const check_input& in, const bad_fn& bad) {
      expect_eq(bad, "bcast packets", read_mem<std::uint64_t>(in.mem, offsetof(bcast_state, packets)), in.rx);
      expect_eq(bad, "bcast forward_failed", read_mem<std::uint64_t>(in.mem, offsetof(bcast_state, forward_failed)), 0);
      expect_eq(bad, "bcast dma_failed", read_mem<std::uint64_t>(in.mem, offsetof(bcast_state, dma_failed)), 0);
      expect_eq(bad, "bcast messages", read_mem<std::uint64_t>(in.mem, offsetof(bcast_state, messages)), in.rx);
      expect_eq(bad, "EC dma_to_host_bytes", in.ec->dma_to_host_bytes, in.rx * in.payload);
    };
    v.push_back(h);
  }
  return v;
}

// ---- one row: a NIC running one handler ------------------------------------------------------

struct row {
  std::uint32_t size = 0, frame = 0, payload = 0;
  std::string handler, target;
  std::uint32_t hpus = 0;
  std::string cpus;
  std::vector<double> mpps, poll_ns, hpu_ns;  // per repeat
  std::uint32_t ended_at_deadline = 0;  // measurements that --min-packets prolonged up to their deadline
  double ratio_fwd = 0;       // Mpps / io-fwd Mpps
  double ratio_macswap = 0;   // Mpps / macswap Mpps
  double ratio_copy = 0;      // Mpps / fwd+copy Mpps (frames with payload)
  double hpu_gbs = 0;         // one HPU's own rate: payload bytes / HPU time per packet (GB/s)
  double ratio_memcpy = 0;    // hpu_gbs / one core's memcpy GB/s
  double ratio_fadd = 0;      // hpu_gbs / one core's fadd GB/s
  double e2e_gbs_per_hpu = 0; // the NIC's payload rate (Mpps x payload) / HPUs (GB/s)
  double e2e_ratio_memcpy = 0;
  std::string aim;            // "" or the aim this row is judged by
  bool aim_met = false;
  bool ok = true;
  std::vector<std::string> failures;
};

struct baseline {
  std::uint32_t size = 0, frame = 0, payload = 0;
  std::vector<double> fwd_mpps, macswap_mpps, copy_mpps, memcpy_gbs, fadd_gbs;
};

struct loaded {
  std::optional<rt::loaded_package> pkg;
  std::uint32_t bpf_insns = 0;  // eBPF: instructions of the payload handler (static)
};

std::string package_path(const handlers_options& o, const std::string& name, const std::string& target) {
  return o.package_dir + "/" + name + "." + target + ".spkg";
}

// Instructions of the payload handler (its program in section ".spin.payload.<name>") of an
// eBPF package's object, as libbpf reads the ELF; 0 when libbpf refuses the object or it has
// no payload handler (the row then names no count). libbpf's warnings are not printed.
std::uint32_t payload_insns(std::span<const std::byte> elf) {
  const libbpf_print_fn_t previous = libbpf_set_print(nullptr);
  bpf_object* obj = bpf_object__open_mem(elf.data(), elf.size(), nullptr);
  std::uint32_t n = 0;
  if (libbpf_get_error(obj) == 0) {
    bpf_program* p = nullptr;
    bpf_object__for_each_program(p, obj) {
      if (std::string_view(bpf_program__section_name(p)).starts_with(".spin.payload."))
        n = static_cast<std::uint32_t>(bpf_program__insn_cnt(p));
    }
    bpf_object__close(obj);
  }
  libbpf_set_print(previous);
  return n;
}

// Measures one (handler, target, size, HPU count) row.
bool run_row(const handlers_options& o, const handler_spec& h, const std::string& target, const loaded& lp, std::uint32_t size,
             std::uint32_t hpus, row& r) {
  const std::uint32_t frame = std::max(size, header_bytes), payload = frame - header_bytes;
  r.size = size;
  r.frame = frame;
  r.payload = payload;
  r.handler = h.name;
  r.target = target;
  r.hpus = hpus;
  const unsigned ncpu = std::max(1u, std::thread::hardware_concurrency());
  // Run to completion: HPU i is an lcore on CPU (poll-cpu + i) mod CPUs; HPU 0, this thread,
  // also owns the ports.
  std::vector<int> hpu_cpus;
  r.cpus = "hpu=";
  for (std::uint32_t i = 0; i < hpus; ++i) {
    hpu_cpus.push_back(static_cast<int>((static_cast<unsigned>(o.poll_cpu) + i) % ncpu));
    r.cpus += (i ? "," : "") + std::to_string(hpu_cpus.back());
  }

  // The NIC builds every frame it sends from its first port's pool. A handler that sends gets a
  // first port that only transmits (net_null no-rx=1), so that its sends never land in the
  // pre-filled pool of the receiving port; every destination leaves through it.
  auto vdev = null_vdev::create(frame);
  if (!vdev) return false;
  std::unique_ptr<null_vdev> tx_vdev;
  if (h.sends) {
    tx_vdev = null_vdev::create(frame, false);
    if (!tx_vdev) return false;
  }
  const std::uint32_t rx_index = h.sends ? 1 : 0;
  std::unique_ptr<emu::nic> nic;
  {
    emu::nic_config c;
    c.name = "bench." + h.name;
    c.rank = nic_rank;
    c.ports = {vdev->port()};
    if (tx_vdev) c.ports.insert(c.ports.begin(), tx_vdev->port());
    c.port = port_opts(frame, o);
    c.burst = burst;
    c.tx_ring_packets = tx_ring_packets;
    c.payload_bytes = 0;
    c.runtime.hpus = hpus;
    c.runtime.nic_memory_bytes = 16 << 20;
    auto n = emu::nic::create(c);
    if (!n) {
      std::fprintf(stderr, "nic::create: %s\n", n.err().message.c_str());
      return false;
    }
    nic = std::move(n.value());
  }
  std::vector<std::byte> host(host_window_bytes);
  auto region = nic->register_host_memory(host);
  if (!region) {
    std::fprintf(stderr, "register_host_memory: %s\n", region.err().message.c_str());
    return false;
  }
  rt::ec_config ec;
  ec.name = h.name;
  ec.match = {bench_match_bits, 0};
  ec.window = rt::host_window{*region, 0, host_window_bytes};
  // Every queued task keeps its message open: room for full HPU queues plus bursts.
  ec.limits.max_messages = 1024;
  ec.limits.retired_history = 1024;
  // The budget guards against runaway handlers, not a measurement. Its clock is the HPU thread's
  // CPU time, which in a virtual machine also holds time the hypervisor took the vCPU away:
  // seen here once in a few million invocations, a 10 ms stall inside a 1 us handler aborted its
  // message under the default 10 ms budget.
  ec.limits.handler_budget = std::chrono::seconds(1);
  if (o.pool_mbufs <= ec.limits.retired_history + ec.limits.max_messages) {
    std::fprintf(stderr, "--pool-mbufs must exceed %u so that message ids do not repeat within the EC's memory\n",
                 ec.limits.retired_history + ec.limits.max_messages);
    return false;
  }
  if (lp.pkg) {
    if (auto b = lp.pkg->bind(ec); !b) {
      std::fprintf(stderr, "bind %s: %s\n", h.name.c_str(), b.err().message.c_str());
      return false;
    }
  }
  auto id = nic->install(ec);
  if (!id) {
    std::fprintf(stderr, "install %s: %s\n", h.name.c_str(), id.err().message.c_str());
    return false;
  }
  // A row whose handler forwards in place gets its frames' headers written back (stamp_ids).
  std::array<std::byte, header_bytes> headers{};
  if (h.sends && rt::wire::encode_headers(rt::wire::rank_endpoint(source_rank), rt::wire::rank_endpoint(nic_rank),
                                          bench_header(1, payload), payload, headers) != header_bytes) {
    std::fprintf(stderr, "%s: cannot encode the frame headers\n", h.name.c_str());
    return false;
  }
  stamper ids;
  if (!ids.add(vdev->port(), h.sends ? std::span<const std::byte>(headers) : std::span<const std::byte>())) return false;
  std::span<std::byte> mem = nic->runtime().handler_memory(*id);
  h.setup(mem, payload);
  if (!prefill_pool(nic->port_pool(rx_index), frame, h.fill, nullptr)) return false;
  std::vector<std::byte> pattern(payload);
  h.fill(pattern);

  // HPUs 1.. poll on lcores of their own for the whole row; this thread is HPU 0.
  std::atomic<bool> lanes_stop{false};
  std::vector<std::thread> lanes;
  for (std::uint32_t k = 1; k < hpus; ++k) {
    auto t = emu::start_lcore([&nic, &lanes_stop, k] { nic->run_lane(k, lanes_stop); }, hpu_cpus[k]);
    if (!t) {
      std::fprintf(stderr, "%s\n", t.err().message.c_str());
      lanes_stop = true;
      for (auto& l : lanes) l.join();
      return false;
    }
    lanes.push_back(std::move(t.value()));
  }
  auto stop_lanes = [&] {
    lanes_stop = true;
    for (auto& l : lanes) l.join();
    lanes.clear();
  };
  auto measure = [&](double seconds) {
    const emu::nic_stats s0 = nic->stats();
    const double c0 = thread_cpu_seconds();
    const auto t0 = clock_type::now(), end = deadline(t0, seconds),
               last = deadline(t0, std::max(10.0, 100 * seconds));
    auto now = t0;
    auto received = [&] { return nic->stats().ports.at(rx_index).rx_packets - s0.ports.at(rx_index).rx_packets; };
    do {
      for (int k = 0; k < 64; ++k) nic->poll_lane(0);
      now = clock_type::now();
    } while (now < end || (o.min_packets > 0 && now < last && received() < o.min_packets));
    if (o.min_packets > 0 && received() < o.min_packets) ++r.ended_at_deadline;
    const double cpu = thread_cpu_seconds() - c0;
    const double wall = std::chrono::duration<double>(now - t0).count();
    const emu::nic_stats s1 = nic->stats();
    const std::uint64_t pk = s1.ports.at(rx_index).rx_packets - s0.ports.at(rx_index).rx_packets;
    std::uint64_t busy = 0;
    for (std::size_t i = 0; i < s1.runtime.hpus.size(); ++i) busy += s1.runtime.hpus[i].busy_ns - s0.runtime.hpus[i].busy_ns;
    if (pk == 0) return;
    r.mpps.push_back(static_cast<double>(pk) / wall / 1e6);
    r.poll_ns.push_back(cpu * 1e9 / static_cast<double>(pk));
    r.hpu_ns.push_back(static_cast<double>(busy) / static_cast<double>(pk));
  };
  measure(o.warmup_seconds);
  r.mpps.clear();
  r.poll_ns.clear();
  r.hpu_ns.clear();
  for (std::uint32_t k = 0; k < o.repeats; ++k) measure(o.seconds);

  // Checks. nic::quiesce would never see the NIC idle (net_null always has frames): drain the
  // runtime instead; the frames the NIC took from the port but has not yet handed to the runtime
  // (at most one burst) are then the only mbufs it holds, besides sends still in its TX rings.
  auto bad = [&](const std::string& what) {
    r.ok = false;
    r.failures.push_back(what);
  };
  if (r.mpps.empty()) bad("no packet was received");
  stop_lanes();
  nic->runtime().drain();
  const emu::nic_stats st = nic->stats();
  const rt::ec_stats& es = st.runtime.ecs.at(0);
  const std::uint64_t handed = st.runtime.frames_accepted;
  const std::uint64_t held = st.ports.at(rx_index).rx_packets - handed;
  if (held > burst) bad(u64s(held) + " received frames never reached the runtime (at most one burst may wait)");
  expect_eq(bad, "EC packets_in", es.packets_in, handed);
  expect_eq(bad, "messages completed", es.messages_completed, handed);
  if (h.deposits) expect_eq(bad, "deposit_bytes", es.deposit_bytes, handed * payload);
  if (lp.pkg && lp.pkg->handlers().payload && payload > 0)
    expect_eq(bad, "payload handler invocations", es.kinds[static_cast<std::size_t>(handler_kind::payload)].invocations, handed);
  if (h.sends) {
    expect_eq(bad, "sends", es.sends, handed);
    expect_eq(bad, "send_failed", es.send_failed, 0);
    // Sends HPU 0 has not yet moved from the other HPUs' TX rings to the port are not sent
    // yet; nic_drop counters (checked below) would show any the port refused.
    const std::uint64_t sent = st.ports.at(0).tx_packets, ring_room = std::uint64_t{hpus} * tx_ring_packets + burst;
    if (sent > handed || handed - sent > ring_room)
      bad("frames sent " + u64s(sent) + " for " + u64s(handed) + " sends (at most " + u64s(ring_room) + " may wait in TX rings)");
  }
  for (std::size_t k = 0; k < rt::drop_reason_count; ++k)
    if (es.drops[k] != 0) bad("EC dropped " + u64s(es.drops[k]) + " as " + rt::drop_reason_name(static_cast<rt::drop_reason>(k)));
  for (std::size_t k = 0; k < emu::nic_drop_count; ++k)
    if (st.drops[k] != 0) bad("NIC dropped " + u64s(st.drops[k]) + " as " + emu::nic_drop_name(static_cast<emu::nic_drop>(k)));
  for (std::size_t k = 0; k < rt::wire::reject_count; ++k)
    if (st.runtime.frames_rejected[k] != 0)
      bad("rejected " + u64s(st.runtime.frames_rejected[k]) + " as " + rt::wire::reject_name(static_cast<rt::wire::reject>(k)));
  if (st.runtime.unknown_ec != 0) bad(u64s(st.runtime.unknown_ec) + " frames matched no EC");
  if (es.messages_dropped != 0) bad(u64s(es.messages_dropped) + " messages dropped by the header handler");
  for (const auto& k : es.kinds) {
    if (k.faults != 0) bad(u64s(k.faults) + " handler faults");
    if (k.over_budget != 0) bad(u64s(k.over_budget) + " invocations over budget");
  }
  check_input in;
  in.rx = handed;
  in.payload = payload;
  in.ec = &es;
  in.mem = mem;
  in.pattern = pattern;
  h.check(in, bad);
  ids.remove();
  nic.reset();  // closes its port before the vdev goes
  return true;
}

// ---- report ----------------------------------------------------------------------------------

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Share of the wall time each HPU spent in handlers: near 1, the handlers are the bound; well
// below, the NIC's own per-packet work (or the OS taking an HPU's core) is.
double busy_share(const row& r) { return r.hpus > 0 ? median(r.hpu_ns) * median(r.mpps) / 1e3 / r.hpus : 0; }

struct model_row {
  std::string handler, target;
  std::uint32_t frame = 0, payload = 0;
  double cycles = 0;           // HPU cycles per packet measured (1 HPU)
  double hpu_mpps = 0;         // model_hpus * ghz / cycles
  double line_mpps = 0;        // line rate in packets
  std::string bound;           // "HPUs" or "line"
  double gbps = 0;             // predicted, frame bytes
};

// ---- the steps of run_handlers ---------------------------------------------------------------

// What the options ask for, checked: the handlers, the HPU counts and the frame sizes.
struct plan {
  std::vector<handler_spec> specs;
  std::vector<std::uint32_t> hpu_counts;
  std::vector<std::uint32_t> sizes;  // one per frame size: 64 and 88 both run as an 88-byte frame
};

// The plan, or nullopt after printing why the options are refused.
std::optional<plan> make_plan(const handlers_options& o) {
  plan p;
  p.specs = all_handlers();
  if (!o.handlers.empty()) {
    for (const auto& n : o.handlers)
      if (std::none_of(p.specs.begin(), p.specs.end(), [&](const handler_spec& h) { return h.name == n; })) {
        std::string names;
        for (const auto& h : p.specs) names += (names.empty() ? "" : ", ") + h.name;
        std::fprintf(stderr, "spin-bench handlers: unknown handler '%s' (known: %s)\n", n.c_str(), names.c_str());
        return std::nullopt;
      }
    std::erase_if(p.specs, [&](const handler_spec& h) { return std::find(o.handlers.begin(), o.handlers.end(), h.name) == o.handlers.end(); });
  }
  for (const auto& t : o.targets)
    if (t != "native" && t != "ebpf") {
      std::fprintf(stderr, "spin-bench handlers: unknown target '%s' (native or ebpf)\n", t.c_str());
      return std::nullopt;
    }
  const unsigned ncpu = std::max(1u, std::thread::hardware_concurrency());
  p.hpu_counts = o.hpus;
  if (p.hpu_counts.empty())
    for (std::uint32_t h = 1; h <= ncpu; ++h) p.hpu_counts.push_back(h);
  std::sort(p.hpu_counts.begin(), p.hpu_counts.end());
  p.hpu_counts.erase(std::unique(p.hpu_counts.begin(), p.hpu_counts.end()), p.hpu_counts.end());
  if (p.hpu_counts.front() < 1 || p.hpu_counts.back() > ncpu) {
    // More HPU threads than CPUs starve each other inside the cacheless mempool's ring.
    std::fprintf(stderr, "spin-bench handlers: HPU counts must lie in 1 .. %u (the hardware threads)\n", ncpu);
    return std::nullopt;
  }
  for (std::uint32_t size : o.sizes)
    if (std::none_of(p.sizes.begin(), p.sizes.end(), [&](std::uint32_t x) { return std::max(x, header_bytes) == std::max(size, header_bytes); }))
      p.sizes.push_back(size);
  if (o.poll_cpu < 0 || static_cast<unsigned>(o.poll_cpu) >= ncpu) {
    std::fprintf(stderr, "spin-bench handlers: --poll-cpu %d is not one of the %u CPUs\n", o.poll_cpu, ncpu);
    return std::nullopt;
  }
  return p;
}

// Loads the package of every (handler, target) the plan runs into `out` ("name.target"); false
// after printing why one could not be read or loaded.
bool load_packages(const handlers_options& o, const plan& p, std::map<std::string, loaded>& out) {
  for (const auto& h : p.specs) {
    if (h.package.empty()) continue;
    for (const auto& t : h.targets) {
      if (std::find(o.targets.begin(), o.targets.end(), t) == o.targets.end()) continue;
      loaded l;
      rt::load_options lo;
      lo.bpf = rt::bpf_exec::jit;
      const std::string path = package_path(o, h.package, t);
      auto pk = rt::read_package_file(path);
      if (!pk) {
        std::fprintf(stderr, "spin-bench handlers: %s\n(--packages names the directory of the handler packages; ninja builds them in build/packages)\n",
                     pk.err().message.c_str());
        return false;
      }
      if (t == "ebpf") l.bpf_insns = payload_insns(pk->object);
      auto lp = rt::load_package(*pk, lo);
      if (!lp) {
        std::fprintf(stderr, "spin-bench handlers: %s: %s\n", path.c_str(), lp.err().message.c_str());
        return false;
      }
      l.pkg = std::move(lp.value());
      out[h.name + "." + t] = std::move(l);
    }
  }
  return true;
}

// Everything measured, in the order it ran.
struct results {
  std::vector<baseline> bases;  // one per frame size
  std::vector<row> rows;
  std::vector<std::pair<std::string, std::string>> skipped;  // what, why
  bool all_ok = true;
};

// The baselines at one frame size (none measured with --no-baselines); nullopt after a set-up
// error. A fwd+copy run that did not leave the payload in its sink clears `all_ok`.
std::optional<baseline> measure_baselines(const handlers_options& o, std::uint32_t size, bool& all_ok) {
  const std::uint32_t frame = std::max(size, header_bytes), payload = frame - header_bytes;
  baseline b;
  b.size = size;
  b.frame = frame;
  b.payload = payload;
  auto fa = null_vdev::create(frame), fb = null_vdev::create(frame);
  if (!fa || !fb) return std::nullopt;
  const emu::port_options popts = port_opts(frame, o);
  auto pa = emu::port::open(fa->port(), popts, "fwd.a"), pb = emu::port::open(fb->port(), popts, "fwd.b");
  if (!pa || !pb) {
    std::fprintf(stderr, "port::open: %s\n", (!pa ? pa.err() : pb.err()).message.c_str());
    return std::nullopt;
  }
  std::vector<const std::byte*> payloads;
  if (!prefill_pool((*pa)->pool(), frame, default_fill, &payloads)) return std::nullopt;
  std::vector<std::byte> sink(std::max<std::uint32_t>(payload, 64)), pattern(payload);
  default_fill(pattern);
  if (o.baselines) (void)forward_loop((*pa)->id(), (*pb)->id(), o.warmup_seconds, fwd_mode::io, 0, nullptr);
  for (std::uint32_t k = 0; k < (o.baselines ? o.repeats : 0); ++k) {
    const loop_result f = forward_loop((*pa)->id(), (*pb)->id(), o.seconds, fwd_mode::io, 0, nullptr);
    b.fwd_mpps.push_back(static_cast<double>(f.packets) / f.seconds / 1e6);
    const loop_result s = forward_loop((*pa)->id(), (*pb)->id(), o.seconds, fwd_mode::macswap, 0, nullptr);
    b.macswap_mpps.push_back(static_cast<double>(s.packets) / s.seconds / 1e6);
    if (payload > 0) {
      std::fill(sink.begin(), sink.end(), std::byte{0});
      const loop_result c = forward_loop((*pa)->id(), (*pb)->id(), o.seconds, fwd_mode::copy, payload, sink.data());
      if (c.packets == 0 || std::memcmp(sink.data(), pattern.data(), payload) != 0) {
        std::printf("FAIL: the fwd+copy baseline at frame %u did not leave the payload in its sink\n", frame);
        all_ok = false;
      }
      b.copy_mpps.push_back(static_cast<double>(c.packets) / c.seconds / 1e6);
      const loop_result m = memcpy_loop(payloads, payload, o.seconds);
      b.memcpy_gbs.push_back(static_cast<double>(m.packets) * payload / m.seconds / 1e9);
      const loop_result a = fadd_loop(payloads, payload / 4 * 4, o.seconds);
      b.fadd_gbs.push_back(static_cast<double>(a.packets) * (payload / 4 * 4) / a.seconds / 1e9);
    }
  }
  pa.value().reset();
  pb.value().reset();
  return b;
}

// A measured row's ratios against its frame size's baselines, and the aim it is judged by.
void judge(const handlers_options& o, const handler_spec& h, const baseline& b, row& r) {
  const double fwd = median(b.fwd_mpps), swp = median(b.macswap_mpps), cpy = median(b.copy_mpps), mcp = median(b.memcpy_gbs),
               fad = median(b.fadd_gbs);
  const double m = median(r.mpps);
  r.ratio_fwd = fwd > 0 ? m / fwd : 0;
  r.ratio_macswap = swp > 0 ? m / swp : 0;
  r.ratio_copy = cpy > 0 ? m / cpy : 0;
  const double hns = median(r.hpu_ns);
  r.hpu_gbs = hns > 0 ? r.payload / hns : 0;
  r.ratio_memcpy = mcp > 0 ? r.hpu_gbs / mcp : 0;
  r.ratio_fadd = fad > 0 ? r.hpu_gbs / fad : 0;
  r.e2e_gbs_per_hpu = m * 1e6 * r.payload / r.hpus / 1e9;
  r.e2e_ratio_memcpy = mcp > 0 ? r.e2e_gbs_per_hpu / mcp : 0;
  if (o.baselines && h.name == "empty" && r.hpus == 1) {
    r.aim = "Mpps >= " + fmt("%.1f", aim_empty_vs_fwd) + " x io-fwd and >= " + fmt("%.1f", aim_empty_vs_macswap) + " x macswap";
    r.aim_met = r.ratio_fwd >= aim_empty_vs_fwd && r.ratio_macswap >= aim_empty_vs_macswap;
  }
  if (o.baselines && h.name == "fsum" && r.payload == aim_fsum_payload) {
    r.aim = "one HPU's payload GB/s >= " + fmt("%.1f", aim_fsum_vs_memcpy) + " x memcpy";
    r.aim_met = r.ratio_memcpy >= aim_fsum_vs_memcpy;
  }
}

// Every frame size: its baselines, then each (handler, target, HPU count) row; false after a
// set-up error (the status is then 2).
bool measure_all(const handlers_options& o, const plan& p, const std::map<std::string, loaded>& packages, results& res) {
  for (std::uint32_t size : p.sizes) {
    const std::uint32_t frame = std::max(size, header_bytes), payload = frame - header_bytes;
    std::fprintf(stderr, "size %u: frame %u bytes, payload %u bytes\n", size, frame, payload);
    auto b = measure_baselines(o, size, res.all_ok);
    if (!b) return false;
    res.bases.push_back(*b);
    for (const auto& h : p.specs)
      for (const auto& t : h.targets) {
        if (t != "none" && std::find(o.targets.begin(), o.targets.end(), t) == o.targets.end()) continue;
        const std::string label = h.name + (t == "none" ? "" : "/" + t);
        if (std::string why = h.refuses(payload); !why.empty()) {
          res.skipped.emplace_back(label + " at frame " + std::to_string(frame), why);
          continue;
        }
        const loaded none;
        const loaded& lp = t == "none" ? none : packages.at(h.name + "." + t);
        for (std::uint32_t hp : p.hpu_counts) {
          std::fprintf(stderr, "  %s, %u HPU%s\n", label.c_str(), hp, hp > 1 ? "s" : "");
          row r;
          if (!run_row(o, h, t, lp, size, hp, r)) return false;
          judge(o, h, *b, r);
          res.all_ok &= r.ok;
          res.rows.push_back(std::move(r));
        }
      }
  }
  return true;
}

// The baselines' and the handlers' tables, what was not run and why.
void print_tables(const handlers_options& o, const plan& p, const results& res, const run_conditions& cond) {
  std::printf("\nbaselines (one lcore on CPU %d)\n", o.poll_cpu);
  std::printf("%5s %5s %7s  %8s %8s %9s %9s %9s\n", "frame", "size", "payload", "io-fwd", "macswap", "fwd+copy", "memcpy", "fadd");
  std::printf("%5s %5s %7s  %8s %8s %9s %9s %9s\n", "B", "B", "B", "Mpps", "Mpps", "Mpps", "GB/s", "GB/s");
  for (const auto& b : res.bases)
    std::printf("%5u %5u %7u  %8.2f %8.2f %9s %9s %9s\n", b.frame, b.size, b.payload, median(b.fwd_mpps), median(b.macswap_mpps),
                b.copy_mpps.empty() ? "-" : fmt("%.2f", median(b.copy_mpps)).c_str(),
                b.memcpy_gbs.empty() ? "-" : fmt("%.2f", median(b.memcpy_gbs)).c_str(),
                b.fadd_gbs.empty() ? "-" : fmt("%.2f", median(b.fadd_gbs)).c_str());

  std::printf("\nhandlers (spin-emu NIC on net_null; every packet a one-packet message)\n");
  std::printf("%-15s %-6s %5s %7s %4s %7s %7s %8s %8s %8s %7s %8s %7s %7s  %s\n", "handler", "target", "frame", "payload", "hpus", "Mpps",
              "Gbit/s", "ns/pkt", "hpu ns", "hpu cyc", "busy", "x io-fwd", "hpuGB/s", "x mcpy", "check");
  for (const auto& r : res.rows) {
    const double m = median(r.mpps);
    std::string check = r.ok ? "ok" : "FAILED";
    if (!r.aim.empty()) check += r.aim_met ? ", aim met" : ", aim MISSED";
    std::printf("%-15s %-6s %5u %7u %4u %7.3f %7.2f %8.1f %8.1f %8.0f %6.0f%% %8s %7.2f %7s  %s\n", r.handler.c_str(), r.target.c_str(),
                r.frame, r.payload, r.hpus, m, m * r.frame * 8 / 1e3, m > 0 ? 1e3 / m : 0, median(r.hpu_ns),
                median(r.hpu_ns) * cond.tsc_ghz, 100 * busy_share(r), r.ratio_fwd > 0 ? fmt("%.3f", r.ratio_fwd).c_str() : "-", r.hpu_gbs,
                r.payload > 0 && r.ratio_memcpy > 0 ? fmt("%.3f", r.ratio_memcpy).c_str() : "-", check.c_str());
    for (const auto& f : r.failures) std::printf("    FAIL: %s\n", f.c_str());
    if (r.ended_at_deadline > 0)
      std::printf("    %u of its measurements ended at their deadline before --min-packets %llu packets arrived\n",
                  r.ended_at_deadline, static_cast<unsigned long long>(o.min_packets));
  }
  if (!res.skipped.empty()) {
    std::printf("\nnot run (the handler cannot take the payload):\n");
    for (const auto& [what, why] : res.skipped) std::printf("  %s: %s\n", what.c_str(), why.c_str());
  }
  for (const auto& t : o.targets)
    if (t == "ebpf") {
      std::string native_only;
      for (const auto& h : p.specs)
        if (!h.package.empty() && std::find(h.targets.begin(), h.targets.end(), "ebpf") == h.targets.end())
          native_only += (native_only.empty() ? "" : ", ") + h.name;
      if (!native_only.empty())
        std::printf("\nnative only (use floating point or loops whose trip count is not a compile-time constant, which eBPF "
                    "cannot run): %s\n",
                    native_only.c_str());
    }
}

// Each row with an aim: met or missed, and the ratios it is judged by.
void print_aims(const handlers_options& o, const results& res) {
  std::printf("\naims:%s\n", o.baselines ? "" : " not judged (--no-baselines)");
  for (const auto& r : res.rows) {
    if (r.aim.empty()) continue;
    std::printf("  %-6s %s frame %u, %u HPU%s: %s: %s (%.3f)", r.handler.c_str(), r.target.c_str(), r.frame, r.hpus, r.hpus > 1 ? "s" : "",
                r.aim.c_str(), r.aim_met ? "met" : "MISSED", r.handler == "empty" ? r.ratio_fwd : r.ratio_memcpy);
    if (r.handler == "empty") {
      std::printf("; %.3f x macswap (reads and writes each frame's first line)", r.ratio_macswap);
      if (r.ratio_copy > 0) std::printf("; %.3f x fwd+copy (copies each payload, as the empty set's deposit does)", r.ratio_copy);
    }
    if (r.handler == "fsum")
      std::printf("; the NIC delivered %.3f x memcpy per HPU, its HPU%s busy %.0f%% of the time", r.e2e_ratio_memcpy,
                  r.hpus > 1 ? "s" : "", 100 * busy_share(r));
    std::printf("\n");
  }
}

// The NIC model's prediction for every 1-HPU row, printed and returned.
std::vector<model_row> nic_model(const handlers_options& o, const results& res, double tsc_ghz) {
  std::vector<model_row> model;
  for (const auto& r : res.rows) {
    if (r.hpus != 1 || median(r.hpu_ns) <= 0) continue;
    model_row m;
    m.handler = r.handler;
    m.target = r.target;
    m.frame = r.frame;
    m.payload = r.payload;
    m.cycles = median(r.hpu_ns) * tsc_ghz;
    m.hpu_mpps = o.model_hpus * o.model_ghz * 1e3 / m.cycles;
    // On the wire a frame also takes 24 bytes: preamble and start delimiter (8), FCS (4), gap (12).
    m.line_mpps = o.model_line_gbps * 1e3 / (8.0 * (r.frame + 24));
    m.bound = m.hpu_mpps < m.line_mpps ? "HPUs" : "line";
    m.gbps = std::min(m.hpu_mpps, m.line_mpps) * r.frame * 8 / 1e3;
    model.push_back(m);
  }
  std::printf("\nNIC model: %u HPUs at %.2f GHz, line rate %.0f Gbit/s. An HPU is assumed to need the cycles one HPU of this\n"
              "machine measured per packet (hpu cyc, 1 HPU); rate = min(HPUs x GHz / cycles, line / ((frame + 24) x 8)).\n",
              o.model_hpus, o.model_ghz, o.model_line_gbps);
  std::printf("%-15s %-6s %5s %7s %9s %10s %10s %6s %9s\n", "handler", "target", "frame", "payload", "cyc/pkt", "HPU Mpps", "line Mpps",
              "bound", "Gbit/s");
  for (const auto& m : model)
    std::printf("%-15s %-6s %5u %7u %9.0f %10.2f %10.2f %6s %9.1f\n", m.handler.c_str(), m.target.c_str(), m.frame, m.payload, m.cycles,
                m.hpu_mpps, m.line_mpps, m.bound.c_str(), m.gbps);
  return model;
}

// Ping-pong beside PsPIN (ISCA 2021: 29 instructions, ~38 ns per packet, 443 Gbit/s with 32
// HPUs, 1 KiB packets): printed, and returned as the JSON report's "measured" rows.
nlohmann::json pingpong_vs_pspin(const results& res, const std::map<std::string, loaded>& packages, double tsc_ghz) {
  nlohmann::json out = nlohmann::json::array();
  std::printf("\nping-pong beside PsPIN (ISCA 2021: handler of 29 instructions, ~38 ns per 1 KiB packet on a 1 GHz HPU,\n"
              "443 Gbit/s with 32 HPUs):\n");
  bool any = false;
  for (const auto& r : res.rows) {
    if (r.handler != "pingpong" || r.hpus != 1 || r.payload != 1024) continue;
    any = true;
    const double ns = median(r.hpu_ns), cyc = ns * tsc_ghz;
    const double pred = 32 * 1.0 * 1e3 / cyc;  // Mpps at PsPIN's 32 HPUs of 1 GHz, whatever --model-* say
    const std::uint32_t insns = r.target == "ebpf" && packages.count("pingpong.ebpf") ? packages.at("pingpong.ebpf").bpf_insns : 0;
    std::printf("  %-6s: %.1f ns = %.0f cycles per packet on one HPU%s; 32 HPUs at 1 GHz with these cycles: %.1f Gbit/s of 1 KiB "
                "payload\n",
                r.target.c_str(), ns, cyc, insns ? (", handler " + std::to_string(insns) + " eBPF instructions").c_str() : "",
                pred * 1024 * 8 / 1e3);
    out.push_back({{"target", r.target}, {"hpu_ns_per_packet", ns}, {"cycles_per_packet", cyc}, {"ebpf_instructions", insns},
                   {"predicted_gbps_32hpus_1ghz", pred * 1024 * 8 / 1e3}});
  }
  if (!any) std::printf("  (not measured: it needs the pingpong handler at a 1112-byte frame, 1 KiB payload, with 1 HPU)\n");
  else
    std::printf("  The difference: a PsPIN HPU runs the handler on a packet already in its L1 and sends it with a DMA\n"
                "  command; here an HPU's packet time also holds the send (zero copy: the received mbuf's headers rewritten\n"
                "  in place, a reference taken, the port's stage), the atomic counter and the timing of every invocation\n"
                "  (docs/benchmarks.md).\n");
  return out;
}

// <base>.csv: one line per row, with its frame size's baselines.
std::string csv_report(const results& res, double tsc_ghz) {
  std::ostringstream csv;
  csv << "handler,target,frame_bytes,size_requested,payload_bytes,hpus,cpus,mpps,gbps,ns_per_packet,hpu_ns_per_packet,"
         "hpu_cycles_per_packet,hpu_busy_share,poll_cpu_ns_per_packet,ratio_vs_io_fwd,ratio_vs_macswap,ratio_vs_fwd_copy,hpu_payload_gbs,ratio_vs_memcpy,ratio_vs_fadd,"
         "nic_payload_gbs_per_hpu,nic_ratio_vs_memcpy,"
         "io_fwd_mpps,macswap_mpps,fwd_copy_mpps,memcpy_gbs,fadd_gbs,aim,aim_met,check,mpps_runs\n";
  for (const auto& r : res.rows) {
    const baseline& b = *std::find_if(res.bases.begin(), res.bases.end(), [&](const baseline& x) { return x.frame == r.frame; });
    const double m = median(r.mpps);
    csv << r.handler << ',' << r.target << ',' << r.frame << ',' << r.size << ',' << r.payload << ',' << r.hpus << ',' << csv_field(r.cpus)
        << ',' << m << ',' << m * r.frame * 8 / 1e3 << ',' << (m > 0 ? 1e3 / m : 0) << ',' << median(r.hpu_ns) << ','
        << median(r.hpu_ns) * tsc_ghz << ',' << busy_share(r) << ',' << median(r.poll_ns) << ',' << r.ratio_fwd << ',' << r.ratio_macswap << ',' << r.ratio_copy << ',' << r.hpu_gbs << ','
        << r.ratio_memcpy << ',' << r.ratio_fadd << ',' << r.e2e_gbs_per_hpu << ',' << r.e2e_ratio_memcpy << ',' << median(b.fwd_mpps) << ',' << median(b.macswap_mpps) << ',' << median(b.copy_mpps) << ',' << median(b.memcpy_gbs) << ','
        << median(b.fadd_gbs) << ',' << csv_field(r.aim) << ',' << (r.aim.empty() ? "" : r.aim_met ? "yes" : "no") << ','
        << (r.ok ? "ok" : "failed") << ',' << join(r.mpps, ";") << '\n';
  }
  return csv.str();
}

// <base>.json: the conditions, options, baselines, rows, model and ping-pong comparison.
nlohmann::json json_report(const handlers_options& o, const plan& p, const results& res, const std::vector<model_row>& model,
                           const nlohmann::json& pingpong_vs, const run_conditions& cond) {
  nlohmann::json jrows = nlohmann::json::array();
  for (const auto& r : res.rows) {
    const double m = median(r.mpps);
    nlohmann::json j = {{"handler", r.handler},
                        {"target", r.target},
                        {"frame_bytes", r.frame},
                        {"size_requested", r.size},
                        {"payload_bytes", r.payload},
                        {"hpus", r.hpus},
                        {"cpus", r.cpus},
                        {"mpps", m},
                        {"gbps", m * r.frame * 8 / 1e3},
                        {"ns_per_packet", m > 0 ? 1e3 / m : 0},
                        {"hpu_ns_per_packet", median(r.hpu_ns)},
                        {"hpu_cycles_per_packet", median(r.hpu_ns) * cond.tsc_ghz},
                        {"poll_cpu_ns_per_packet", median(r.poll_ns)},
                        {"hpu_busy_share", busy_share(r)},
                        {"ratio_vs_io_fwd", r.ratio_fwd},
                        {"ratio_vs_macswap", r.ratio_macswap},
                        {"ratio_vs_fwd_copy", r.ratio_copy},
                        {"hpu_payload_gbs", r.hpu_gbs},
                        {"nic_payload_gbs_per_hpu", r.e2e_gbs_per_hpu},
                        {"nic_ratio_vs_memcpy", r.e2e_ratio_memcpy},
                        {"ratio_vs_memcpy", r.ratio_memcpy},
                        {"ratio_vs_fadd", r.ratio_fadd},
                        {"mpps_runs", r.mpps},
                        {"check_passed", r.ok},
                        {"ended_at_deadline", r.ended_at_deadline},
                        {"failures", r.failures}};
    if (!r.aim.empty()) j["aim"] = {{"what", r.aim}, {"met", r.aim_met}};
    jrows.push_back(j);
  }
  nlohmann::json jb = nlohmann::json::array();
  for (const auto& b : res.bases)
    jb.push_back({{"frame_bytes", b.frame},
                  {"size_requested", b.size},
                  {"payload_bytes", b.payload},
                  {"io_fwd_mpps", median(b.fwd_mpps)},
                  {"macswap_mpps", median(b.macswap_mpps)},
                  {"fwd_copy_mpps", median(b.copy_mpps)},
                  {"memcpy_gbs", median(b.memcpy_gbs)},
                  {"fadd_gbs", median(b.fadd_gbs)},
                  {"io_fwd_mpps_runs", b.fwd_mpps}});
  nlohmann::json jm = nlohmann::json::array();
  for (const auto& m : model)
    jm.push_back({{"handler", m.handler}, {"target", m.target}, {"frame_bytes", m.frame}, {"payload_bytes", m.payload},
                  {"cycles_per_packet", m.cycles}, {"hpu_bound_mpps", m.hpu_mpps}, {"line_mpps", m.line_mpps}, {"bound", m.bound},
                  {"gbps", m.gbps}});
  nlohmann::json js = nlohmann::json::array();
  for (const auto& [what, why] : res.skipped) js.push_back({{"what", what}, {"why", why}});
  return {{"benchmark", "spin-bench handlers"},
          {"conditions", cond.to_json()},
          {"dpdk", rte_version()},
          {"config",
           {{"seconds", o.seconds}, {"repeats", o.repeats}, {"warmup_seconds", o.warmup_seconds}, {"burst", burst}, {"pool_mbufs", o.pool_mbufs},
            {"poll_cpu", o.poll_cpu}, {"sizes", p.sizes}, {"hpus", p.hpu_counts}}},
          {"baselines", jb},
          {"results", jrows},
          {"skipped", js},
          {"nic_model", {{"hpus", o.model_hpus}, {"ghz", o.model_ghz}, {"line_gbps", o.model_line_gbps}, {"rows", jm}}},
          {"pingpong_vs_pspin", {{"pspin", {{"instructions", 29}, {"ns_per_packet", 38}, {"gbps_32hpus", 443}}}, {"measured", pingpong_vs}}},
          {"checks_passed", res.all_ok}};
}

// <base>.dat, .gp and .png: one data block per handler/target at 1 HPU, plus io-fwd: frame
// bytes against Gbit/s and Mpps.
void write_plot(const std::string& base, const results& res, const run_conditions& cond) {
  std::ostringstream dat;
  std::vector<std::string> titles;
  dat << "# io-fwd\n";
  for (const auto& b : res.bases) dat << b.frame << ' ' << median(b.fwd_mpps) * b.frame * 8 / 1e3 << ' ' << median(b.fwd_mpps) << '\n';
  titles.push_back("io-fwd (baseline)");
  std::vector<std::string> seen;
  for (const auto& r : res.rows) {
    const std::string key = r.handler + (r.target == "none" ? "" : "/" + r.target);
    if (r.hpus != 1 || std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    dat << "\n\n# " << key << '\n';
    for (const auto& x : res.rows)
      if (x.hpus == 1 && x.handler == r.handler && x.target == r.target)
        dat << x.frame << ' ' << median(x.mpps) * x.frame * 8 / 1e3 << ' ' << median(x.mpps) << '\n';
    titles.push_back(key);
  }
  if (!write_text(base + ".dat", dat.str())) return;
  std::ostringstream gp, xtics;
  for (std::size_t i = 0; i < res.bases.size(); ++i) xtics << (i ? ", " : "") << res.bases[i].frame;
  gp << "set terminal pngcairo size 1200,1000 noenhanced\nset output '" << base << ".png'\n"
     << "set multiplot layout 2,1 title 'spin-bench handlers: spin-emu NIC with 1 HPU on net_null, beside io forwarding ("
     << cond.cpu_model << ")'\n"
     << "set xlabel 'frame bytes'\nset logscale x 2\nset xtics (" << xtics.str() << ")\nset logscale y\nset format y '%g'\n"
     << "set grid\nset key outside right\nset ylabel 'Gbit/s (frame bytes)'\nplot ";
  for (std::size_t i = 0; i < titles.size(); ++i)
    gp << (i ? ", " : "") << "'" << base << ".dat' index " << i << " using 1:2 with linespoints title '" << titles[i] << "'";
  gp << "\nset ylabel 'Mpps'\nplot ";
  for (std::size_t i = 0; i < titles.size(); ++i)
    gp << (i ? ", " : "") << "'" << base << ".dat' index " << i << " using 1:3 with linespoints title '" << titles[i] << "'";
  gp << "\nunset multiplot\n";
  if (std::string why = run_gnuplot(base + ".gp", gp.str()); !why.empty())
    std::printf("no plot: %s\n", why.c_str());
  else
    std::printf("wrote %s.png\n", base.c_str());
}

} // namespace

int run_handlers(const handlers_options& o) {
  const std::optional<plan> p = make_plan(o);
  if (!p) return 2;
  std::map<std::string, loaded> packages;  // "name.target"
  if (!load_packages(o, *p, packages)) return 2;
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) {
    std::fprintf(stderr, "spin-bench handlers: cannot create %s: %s\n", o.out_dir.c_str(), ec.message().c_str());
    return 2;
  }

  std::vector<std::string> eal = emu::default_eal_args("spin_bench_" + std::to_string(::getpid()));
  eal.push_back("-l");
  eal.push_back(std::to_string(o.poll_cpu));
  if (auto e = emu::eal_init(eal); !e) {
    std::fprintf(stderr, "spin-bench handlers: %s\n", e.err().message.c_str());
    return 2;
  }
  run_conditions cond = measure_conditions();
  cond.print("spin-bench handlers");
  std::printf("%s; net_null ports, burst %u, pools of %u mbufs without cache; %.2f s per measurement, %u repeats (median), "
              "%.2f s warm-up\n",
              rte_version(), burst, o.pool_mbufs, o.seconds, o.repeats, o.warmup_seconds);
  std::fflush(stdout);

  results res;
  if (!measure_all(o, *p, packages, res)) return 2;
  cond.load_after = load_average();

  print_tables(o, *p, res, cond);
  if (res.rows.empty()) {
    std::fprintf(stderr, "spin-bench handlers: no row ran: the handler, target and size combinations asked for were all skipped\n");
    return 2;
  }
  print_aims(o, res);
  const std::vector<model_row> model = nic_model(o, res, cond.tsc_ghz);
  const nlohmann::json pingpong_vs = pingpong_vs_pspin(res, packages, cond.tsc_ghz);
  std::printf("\nload average after: %.2f %.2f %.2f\n", cond.load_after[0], cond.load_after[1], cond.load_after[2]);

  const std::string base = o.out_dir + "/handlers";
  const bool files_ok = write_text(base + ".csv", csv_report(res, cond.tsc_ghz)) &&
                        write_text(base + ".json", json_report(o, *p, res, model, pingpong_vs, cond).dump(2) + "\n");
  if (o.plots && files_ok) write_plot(base, res, cond);
  if (files_ok) std::printf("wrote %s.csv and %s.json\n", base.c_str(), base.c_str());
  std::printf("result: %s\n", res.all_ok ? "all checks passed" : "CHECKS FAILED (exit status 1)");
  std::fflush(stdout);
  packages.clear();
  rte_eal_cleanup();
  if (!files_ok) return 2;
  return res.all_ok ? 0 : 1;
}

} // namespace spin::bench
