// One DPDK Ethernet port as the emulator uses it: one RX and one TX queue, an mbuf pool, and the
// checks that keep frames intact (scatter for frames larger than an mbuf).
#pragma once

#include <spin/host/stats.hpp>
#include <spin/result.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

struct rte_mempool;
struct rte_ring;

namespace spin::emu {

/// How a port is set up.
struct port_options {
  std::uint16_t rx_desc = 1024;          ///< RX descriptors (the PMD may round)
  std::uint16_t tx_desc = 1024;          ///< TX descriptors
  std::uint32_t pool_mbufs = 8191;       ///< mbufs in the port's pool (RX and frames it sends)
  /// Per-lcore cache of the pool (mbufs; 0: none, mbufs then come back in FIFO order). Default:
  /// 256 when the pool has at least 1024 mbufs, else none.
  std::optional<std::uint32_t> pool_cache;
  std::uint16_t mbuf_data_bytes = 2048;  ///< data room of one mbuf, headroom excluded
  /// Largest frame (bytes, without FCS) the port accepts; longer frames are dropped and counted
  /// as oversize. When it exceeds mbuf_data_bytes the port must scatter frames over chained
  /// mbufs (RX scatter offload); a port that cannot fails to open instead of truncating.
  std::uint32_t max_frame_bytes = 9216;
  bool promiscuous = true;
};

/// Port counters kept by DPDK (rte_eth_stats), as the host's statistics carry them.
using host::port_hw_stats;

/// Looks up a probed DPDK port by device name ("net_ring0", "0000:3b:00.0"). Errors: not_found.
result<std::uint16_t> find_port(const std::string& device_name);

/// Creates an ethdev on a pair of rte_rings (DPDK's net_ring, rte_eth_from_rings): frames sent
/// on the port are enqueued to `tx`, frames received are dequeued from `rx`. The cluster
/// connects nodes this way. Errors: no_memory (DPDK could not create the device).
result<std::uint16_t> port_from_rings(const std::string& name, rte_ring* rx, rte_ring* tx);

/// An opened, started port. Owned by the thread that polls it; the queues are not thread-safe.
class port {
public:
  /// Configures and starts DPDK port `port_id` with one RX and one TX queue and a pool of its
  /// own. Errors: not_found (no such port), invalid_argument (max_frame_bytes above what the
  /// device takes, or frames larger than an mbuf on a device without RX scatter: the message
  /// names the sizes and the way out), no_memory (pool), io_error-like failures of DPDK calls as
  /// invalid_argument with DPDK's reason.
  static result<std::unique_ptr<port>> open(std::uint16_t port_id, const port_options& opts, const std::string& name);
  /// Stops the port and frees its pool: every mbuf of the pool must be back (the owner drains
  /// rings and queues first). Ports from port_from_rings are closed by their creator.
  ~port();
  port(const port&) = delete;
  port& operator=(const port&) = delete;

  std::uint16_t id() const noexcept { return _id; }
  const std::string& name() const noexcept { return _name; }
  const port_options& options() const noexcept { return _opts; }
  rte_mempool* pool() const noexcept { return _pool; }
  /// True when the device sends chained mbufs (TX multi-segment offload).
  bool tx_multi_seg() const noexcept { return _tx_multi_seg; }
  /// DPDK's counters of the port.
  port_hw_stats hw_stats() const noexcept;

private:
  port() = default;
  std::uint16_t _id = 0;
  std::string _name;
  port_options _opts;
  rte_mempool* _pool = nullptr;
  bool _tx_multi_seg = false;
  bool _started = false;
};

} // namespace spin::emu
