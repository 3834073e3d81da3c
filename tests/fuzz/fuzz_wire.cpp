// libFuzzer target for the wire parser. Input: one byte that chooses how to split the frame
// into up to 4 segments (bits 0-1: segments - 1; bits 2-7: segment length - 1), then the frame.
// Checks: parsing never crashes or reads outside a segment (each segment is its own heap block,
// so ASan sees overreads); the split frame gets the same verdict as the contiguous one; and an
// accepted frame re-encodes to a frame that parses back to the same header.
#include <spin/rt/wire.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

using namespace spin::rt;

namespace {

// A failed property is a crash to libFuzzer.
void require(bool ok) {
  if (!ok) __builtin_trap();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t segments = 1 + (data[0] & 3u);
  const std::size_t step = 1 + (data[0] >> 2);
  // libFuzzer's input buffer is exactly sized, so the contiguous frame ends where the input does.
  const auto* frame = reinterpret_cast<const std::byte*>(data + 1);
  const std::size_t len = size - 1;

  std::vector<std::unique_ptr<std::byte[]>> blocks;
  std::vector<wire::segment> segs;
  std::size_t from = 0;
  for (std::size_t k = 1; k <= segments; ++k) {
    const std::size_t to = k == segments ? len : std::min(len, k * step);
    blocks.emplace_back(new std::byte[to - from]);
    if (to > from) std::memcpy(blocks.back().get(), frame + from, to - from);
    segs.push_back({blocks.back().get(), static_cast<std::uint32_t>(to - from)});
    from = to;
  }

  wire::parsed split{}, whole{};
  wire::reject split_why{}, whole_why{};
  const bool split_ok = wire::parse(std::span<const wire::segment>(segs), wire::default_udp_port, split, split_why);
  const bool whole_ok = wire::parse(std::span<const std::byte>(frame, len), wire::default_udp_port, whole, whole_why);
  require(split_ok == whole_ok);
  if (!whole_ok) {
    require(split_why == whole_why && static_cast<std::size_t>(whole_why) < wire::reject_count);
    return 0;
  }
  require(split.hdr == whole.hdr && split.payload_offset == whole.payload_offset &&
          split.frame_len == whole.frame_len && whole.frame_len == len);
  require(whole.payload_offset <= len && whole.hdr.payload_len <= len - whole.payload_offset);

  const std::span<const std::byte> payload(frame + whole.payload_offset, whole.hdr.payload_len);
  std::vector<std::byte> again(wire::encoded_len(whole.hdr, payload.size()));
  const wire::endpoint src = wire::rank_endpoint(whole.hdr.source_rank);
  const wire::endpoint dst = wire::rank_endpoint(0);
  require(wire::encode(src, dst, whole.hdr, payload, again) == again.size());
  wire::parsed back{};
  wire::reject back_why{};
  require(wire::parse(std::span<const std::byte>(again), wire::default_udp_port, back, back_why));
  require(back.hdr == whole.hdr);
  require(std::memcmp(again.data() + back.payload_offset, payload.data(), payload.size()) == 0);
  return 0;
}
