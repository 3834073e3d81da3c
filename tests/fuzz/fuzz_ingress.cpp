// libFuzzer target for the runtime's ingress path: frames go through rx_burst into a runtime
// with 2 HPUs and one EC whose handlers use handler memory, the scratchpad, DMA into a small
// host window and host events. Input: one options byte (bit 0: repair IP/UDP lengths and the
// IP checksum of each frame so mutations reach the spin layer; bits 1-3: burst size - 1), then
// up to 64 frames, each preceded by a 2-byte big-endian length (cut short by the input's end).
// Checks: nothing crashes, the runtime drains, and after the EC is uninstalled every frame was
// released exactly once.
#include <spin/handler.hpp>
#include <spin/rt/runtime.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

using namespace spin;

namespace {

constexpr std::size_t max_frames = 64;
constexpr std::uint64_t window_bytes = 1024;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

// Handler memory (u64 words): [0] header calls, [8] payload calls, [16] completions,
// [24] payload handlers that saw no header first.
SPIN_HEADER_HANDLER(fz_header) {
  ctx->fetch_add<u64>(0, 1);
  if (u64* s = ctx->scratchpad<u64>(0)) __atomic_store_n(s, 1, __ATOMIC_SEQ_CST);
  ctx->post_event(ctx->msg.message_id);
  return ret::success;
}

SPIN_PAYLOAD_HANDLER(fz_payload) {
  ctx->fetch_add<u64>(8, 1);
  u64* s = ctx->scratchpad<u64>(0, 2);
  if (s == nullptr || __atomic_load_n(&s[0], __ATOMIC_SEQ_CST) != 1) ctx->fetch_add<u64>(24, 1);
  if (s != nullptr && ctx->packet.size() >= 8) {
    u64 v;
    __builtin_memcpy(&v, ctx->packet.data, 8);
    __atomic_fetch_xor(&s[1], v, __ATOMIC_SEQ_CST);
  }
  // Checked by the handler: deposit at the packet's offset, wrapped into the window.
  const u64 len = ctx->packet.size() < ctx->host_window_len_bytes ? ctx->packet.size() : ctx->host_window_len_bytes;
  const u64 off = ctx->msg.offset_bytes % (ctx->host_window_len_bytes - len + 1);
  ctx->dma_to_host(off, ctx->packet.data, len);
  // Unchecked, at an offset the input chooses: the runtime must refuse what does not fit.
  if (ctx->packet.size() >= 2) ctx->dma_to_host(ctx->packet.data[0] * 8u, ctx->packet.data, ctx->packet.data[1]);
  return ctx->packet.size() > 0 && ctx->packet.data[0] == 0xdd ? ret::drop : ret::success;
}

SPIN_COMPLETION_HANDLER(fz_completion) {
  ctx->fetch_add<u64>(16, 1);
  if (u64* s = ctx->scratchpad<u64>(8)) ctx->dma_to_host(ctx->msg.message_id % (window_bytes - 8), s, 8);
  ctx->post_event(ctx->msg.message_len_bytes);
  return ret::success;
}

std::array<std::atomic<int>, max_frames> releases;

void on_release(void*, std::uint64_t cookie) noexcept {
  require(cookie < max_frames);
  releases[cookie].fetch_add(1, std::memory_order_relaxed);
}

struct world {
  std::vector<std::byte> host = std::vector<std::byte>(4096);
  std::unique_ptr<rt::runtime> engine;
  rt::ec_config ec;

  world() {
    rt::runtime_config cfg;
    cfg.hpus = 2;
    cfg.nic_memory_bytes = 4 << 20;
    cfg.release = &on_release;
    auto r = rt::runtime::create(cfg);
    require(r.ok());
    engine = std::move(r.value());
    auto region = engine->register_host_memory(host);
    require(region.ok());
    ec.name = "fuzz";
    ec.match = {0, ~std::uint64_t{1}};  // match bits with bit 0 clear
    ec.handlers = {fz_header, fz_payload, fz_completion};
    ec.handler_mem_bytes = 64;
    ec.scratchpad_bytes = 16;
    ec.window = rt::host_window{*region, 512, window_bytes};
    ec.limits.max_messages = 8;
    ec.limits.window_packets = 64;
    ec.limits.max_parked_packets = 16;
    ec.limits.handler_budget = std::chrono::seconds(1);
    ec.limits.event_queue_depth = 16;
  }
};

std::uint16_t be16(const std::byte* p) {
  return static_cast<std::uint16_t>(std::to_integer<unsigned>(p[0]) << 8 | std::to_integer<unsigned>(p[1]));
}
void put16(std::byte* p, std::size_t v) {
  p[0] = static_cast<std::byte>(v >> 8);
  p[1] = static_cast<std::byte>(v);
}

// Makes the IP total length, UDP length and IP checksum match the frame's actual length.
void repair(std::byte* f, std::size_t len) {
  if (len < 34 || len - 14 > 65535) return;
  const std::size_t ihl = (std::to_integer<std::size_t>(f[14]) & 0x0f) * 4;
  if (ihl < 20 || len < 14 + ihl) return;
  put16(f + 16, len - 14);
  if (len >= 14 + ihl + 6) put16(f + 14 + ihl + 4, len - 14 - ihl);
  put16(f + 24, 0);
  std::uint32_t sum = 0;
  for (std::size_t i = 0; i < ihl; i += 2) sum += be16(f + 14 + i);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  put16(f + 24, ~sum & 0xffff);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static world w;  // once per process: the fuzzer calls this function many times
  const bool fix = data[0] & 1;
  const std::uint32_t burst = 1 + ((data[0] >> 1) & 7);

  // Each frame in its own exactly-sized heap block, so ASan sees reads past a frame.
  std::vector<std::unique_ptr<std::byte[]>> frames;
  std::vector<rt::packet> pkts;
  for (std::size_t at = 1; at + 2 <= size && pkts.size() < max_frames;) {
    const std::size_t len = std::min<std::size_t>(std::size_t{data[at]} << 8 | data[at + 1], size - at - 2);
    at += 2;
    frames.emplace_back(new std::byte[len]);
    if (len > 0) std::memcpy(frames.back().get(), data + at, len);
    if (fix) repair(frames.back().get(), len);
    at += len;
    releases[pkts.size()].store(0, std::memory_order_relaxed);
    pkts.push_back({frames.back().get(), static_cast<std::uint32_t>(len), pkts.size()});
  }

  // A fresh EC per input: its parked packets and open messages do not leak into the next one.
  auto ec = w.engine->install(w.ec);
  require(ec.ok());
  // Bursts go to either HPU, as queues spread frames; the runtime steers each to its own HPU.
  const std::uint32_t first_hpu = (data[0] >> 4) & 1;
  for (std::size_t i = 0, k = 0; i < pkts.size(); ++k) {
    const auto n = static_cast<std::uint32_t>(std::min<std::size_t>(burst, pkts.size() - i));
    const auto hpu = static_cast<std::uint32_t>((first_hpu + k) % 2);
    const std::uint32_t got = w.engine->rx_burst(hpu, pkts.data() + i, n);
    if (got < n) w.engine->poll(1 - hpu);  // the other HPU's inbox is full
    i += got;
  }
  w.engine->drain();
  std::array<rt::host_event, 16> events;
  while (w.engine->poll_events(*ec, events) > 0) {
  }
  require(w.engine->uninstall(*ec).ok());
  for (std::size_t i = 0; i < pkts.size(); ++i) require(releases[i].load(std::memory_order_relaxed) == 1);
  return 0;
}
