#include <spin/rt/tx.hpp>

#include <cstring>

namespace spin::rt {

// Each record in a queue: [u32 frame_len][u32 dest_rank][frame bytes].
memory_transmitter::memory_transmitter(std::uint32_t hpus, std::size_t capacity_bytes, std::uint32_t source_rank,
                                       std::uint32_t mtu_payload_bytes)
    : _q(hpus), _source_rank(source_rank), _mtu_payload(mtu_payload_bytes) {
  for (auto& q : _q) q.buf.resize(capacity_bytes);
}

errc memory_transmitter::send(std::uint32_t hpu, std::uint32_t dest_rank, const wire::header& h,
                          std::span<const std::byte> payload) noexcept {
  if (hpu >= _q.size()) return errc::invalid_argument;
  queue& q = _q[hpu];
  const std::size_t len = wire::encoded_len(h, payload.size());
  if (q.used + 8 + len > q.buf.size()) return errc::no_space;
  const std::size_t n = wire::encode(wire::rank_endpoint(_source_rank), wire::rank_endpoint(dest_rank), h, payload,
                                     std::span<std::byte>(q.buf.data() + q.used + 8, len));
  if (n == 0) return errc::invalid_argument;
  const std::uint32_t hdr[2] = {static_cast<std::uint32_t>(n), dest_rank};
  std::memcpy(q.buf.data() + q.used, hdr, 8);
  q.used += 8 + n;
  return errc::ok;
}

std::vector<memory_transmitter::frame> memory_transmitter::take_frames() {
  std::vector<frame> out;
  for (std::uint32_t h = 0; h < _q.size(); ++h) {
    queue& q = _q[h];
    std::size_t pos = 0;
    while (pos + 8 <= q.used) {
      std::uint32_t hdr[2];
      std::memcpy(hdr, q.buf.data() + pos, 8);
      frame f{h, hdr[1], std::vector<std::byte>(q.buf.begin() + static_cast<std::ptrdiff_t>(pos + 8),
                                                 q.buf.begin() + static_cast<std::ptrdiff_t>(pos + 8 + hdr[0]))};
      out.push_back(std::move(f));
      pos += 8 + hdr[0];
    }
    q.used = 0;
  }
  return out;
}

} // namespace spin::rt
