// Helpers for runtime tests: frames built with the wire encoder, and a packet pool that checks
// every frame handed to the runtime is released exactly once.
#pragma once

#include <spin/rt/runtime.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <random>
#include <vector>

namespace spin::test {

/// Owns frames given to a runtime and counts their releases.
class packet_pool {
public:
  /// Encodes a data packet; returns the packet to pass to rx_burst.
  rt::packet add(const rt::wire::header& h, std::span<const std::byte> payload, std::uint32_t dest_rank = 0);
  /// Adds raw bytes as a frame (for malformed input).
  rt::packet add_raw(std::vector<std::byte> bytes);

  /// runtime_config::release for this pool.
  static void release(void* user, std::uint64_t cookie) noexcept;
  void attach(rt::runtime_config& cfg) {
    cfg.release = &packet_pool::release;
    cfg.release_user = this;
  }

  std::size_t size() const { return _slots.size(); }
  /// Number of frames released exactly once / more than once / never.
  std::size_t released_once() const;
  std::size_t released_twice() const;
  std::size_t unreleased() const;

private:
  struct slot {
    std::vector<std::byte> bytes;
    std::atomic<int> releases{0};
  };
  std::vector<std::unique_ptr<slot>> _slots;
};

/// A data packet header for message `msg` from `source`, packet `seq` of `count` packets of
/// `pkt_bytes` each (the last may be shorter), message length `len`.
rt::wire::header data_header(std::uint64_t match_bits, std::uint32_t source, std::uint64_t msg, std::uint32_t seq,
                             std::uint32_t count, std::uint64_t len, std::uint32_t pkt_bytes);

/// Byte pattern used as payload: byte i of message m from source s.
std::byte pattern(std::uint32_t s, std::uint64_t m, std::uint64_t i);

/// Builds every packet of a message (payload from `pattern`).
std::vector<rt::packet> message_packets(packet_pool& pool, std::uint64_t match_bits, std::uint32_t source,
                                        std::uint64_t msg, std::uint64_t len, std::uint32_t pkt_bytes);

/// Feeds packets to the runtime, retrying on back-pressure, then drains. Returns false when
/// the runtime did not go idle within the timeout.
bool feed(rt::runtime& r, std::span<const rt::packet> pkts, std::uint32_t burst = 32);

} // namespace spin::test
