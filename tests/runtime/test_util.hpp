// Helpers for runtime tests: frames built with the wire encoder, and a packet pool that checks
// every frame handed to the runtime is released exactly once.
#pragma once

#include <spin/rt/loader.hpp>
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

/// Builds packet `seq` of a message like `message_packets` does, and only that one.
rt::packet message_packet(packet_pool& pool, std::uint64_t match_bits, std::uint32_t source, std::uint64_t msg,
                          std::uint64_t len, std::uint32_t pkt_bytes, std::uint32_t seq);

/// Feeds packets to HPU 0 of the runtime in bursts (the runtime steers each to the HPU that owns
/// its message), while one thread per other HPU drives that HPU, as lcores do; retries on
/// back-pressure, then stops the threads and drains. Returns false when the packets could not
/// be fed within 60 s.
bool feed(rt::runtime& r, std::span<const rt::packet> pkts, std::uint32_t burst = 32);

/// Atomically sets the u64 at byte `off` of EC `ec`'s handler memory to 1 while handlers may
/// be reading it.
void raise_flag(rt::runtime& r, rt::ec_id ec, std::uint64_t off);

/// A runtime whose packets come from `pool`; on destruction checks that every packet handed to
/// the runtime was released exactly once.
struct fixture {
  packet_pool pool;
  std::unique_ptr<rt::runtime> rt;
  explicit fixture(std::uint32_t hpus = 2, rt::transmitter* tx = nullptr);
  explicit fixture(rt::runtime_config cfg);
  ~fixture();
  /// Installs `c`; fails the test when install fails.
  rt::ec_id install(const rt::ec_config& c);
  /// Binds the package's handlers to `c` (rt::loaded_package::bind), then installs it; fails
  /// the test when either fails.
  rt::ec_id install(const rt::loaded_package& lp, rt::ec_config c);
  /// Reads the u64 at byte `off` of EC `ec`'s handler memory.
  std::uint64_t word(rt::ec_id ec, std::uint64_t off);
  /// The statistics of EC `ec`.
  rt::ec_stats ec_stats(rt::ec_id ec);
  /// Counter of drop reason `r` of EC `ec`.
  std::uint64_t drops(rt::ec_id ec, rt::drop_reason r) { return ec_stats(ec).drops[static_cast<std::size_t>(r)]; }
};

} // namespace spin::test
