// A NIC's statistics as the host sees them: the typed snapshot an emulated NIC takes
// (emu::nic::stats), the control protocol carries ("stats") and spinctl and spin-emu print. JSON
// only at the edges: the control socket and `--json` / `--stats-json` files.
//
// Thread safety: plain values; every function is pure.
#pragma once

#include <spin/result.hpp>
#include <spin/rt/stats.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spin::host {

/// Why a NIC dropped a frame or a packet before or after its runtime (the runtime counts its
/// own reasons: rt::drop_reason). Every drop counts under exactly one reason.
enum class nic_drop : std::uint8_t {
  no_mbuf,        ///< no mbuf to receive into (DPDK's rx_nombuf), to linearise a chained frame, or to build a handler's packet (a host message waits instead)
  oversize,       ///< received frame longer than the port's largest frame (emu::port_options::max_frame_bytes)
  malformed,      ///< frame the wire parser rejected (the runtime's wire::reject counters say why)
  unknown_ec,     ///< spin packet that matched no installed EC
  rx_queue_full,  ///< the port's RX queue overflowed while the NIC was busy (DPDK's imissed)
  tx_queue_full,  ///< a handler's send found its transmit ring full (the handler gets no_space), or a transit frame found its egress stage full
  unroutable,     ///< frame for another rank with no route to it from this NIC
  mgmt_queue_full,  ///< management datagram (a spin `control` packet) for this NIC while its management queue held emu::nic::mgmt_queue_depth of them
  count_
};
inline constexpr std::size_t nic_drop_count = static_cast<std::size_t>(nic_drop::count_);
/// Static name of a reason ("no_mbuf", ...).
const char* nic_drop_name(nic_drop d);

/// Counters a port's driver keeps (DPDK's rte_eth_stats).
struct port_hw_stats {
  std::uint64_t ipackets = 0, ibytes = 0, opackets = 0, obytes = 0;
  std::uint64_t imissed = 0;    ///< frames the RX queue had no room for (full queue)
  std::uint64_t rx_nombuf = 0;  ///< RX mbuf allocation failures
  std::uint64_t ierrors = 0, oerrors = 0;
};

/// Counters of one port of a NIC.
struct nic_port_stats {
  std::string name;
  std::uint64_t rx_packets = 0, rx_bytes = 0;  ///< frames taken from the port (before any drop)
  std::uint64_t tx_packets = 0, tx_bytes = 0;  ///< frames the port accepted for sending
  std::uint64_t forwarded = 0;                 ///< transit frames sent on towards another rank
  port_hw_stats hw;                            ///< the driver's own counters
};

/// Snapshot of a NIC's counters.
struct nic_stats {
  std::string name;
  std::uint32_t rank = 0;
  std::vector<nic_port_stats> ports;
  std::array<std::uint64_t, nic_drop_count> drops{};
  std::uint64_t host_messages_sent = 0, host_packets_sent = 0, host_bytes_sent = 0;
  std::uint64_t loopback_packets = 0;  ///< packets to this NIC's own rank, handed back to its runtime
  /// Multicast copies (ctx::multicast) sent as a header mbuf chained to a shared clone of the
  /// payload, not as a copy of it.
  std::uint64_t multicast_shared = 0;
  /// ctx::forward frames sent as the received buffer itself, the headers rewritten in place.
  std::uint64_t forward_in_place = 0;
  /// ctx::forward frames sent as a header mbuf chained to a clone of the received payload (the
  /// buffer was shared, or its headroom too small). Forwards that went and are counted in
  /// neither were copied.
  std::uint64_t forward_chained = 0;
  /// Received shared packets (multicast copies, frames forwarded in place whose sender still
  /// held them) given their own contiguous copy before their handlers ran (the EC's handlers may
  /// write their packet: ec_limits::read_only_multicast is false).
  std::uint64_t unshared = 0;
  std::uint64_t mbufs_in_use = 0;  ///< mbufs of the NIC's pools not in their pool right now
  std::uint64_t capture_frames = 0;  ///< frames written to the capture file
  std::uint64_t capture_errors = 0;  ///< frames the capture could not write (disk full, > 16 segments)
  std::uint64_t mgmt_received = 0;   ///< management datagrams queued for the NIC's agent (wait_mgmt)
  std::uint64_t mgmt_sent = 0;       ///< management datagrams queued for sending (send_mgmt)
  rt::runtime_stats runtime;
  /// Sum of the drop counters.
  std::uint64_t total_drops() const;
};

/// One NIC of a spin-emu, as "stats" returns it: its index (the `node` of every request) and
/// its counters.
struct node_stats {
  std::uint32_t node = 0;
  nic_stats stats;
};

/// JSON object with every counter (zeros included), stable key names (docs/emulator.md,
/// "Statistics").
std::string to_json(const nic_stats& s);
/// JSON array of {node, name, rank, stats} objects (what `spinctl stats --json` prints).
std::string to_json(const std::vector<node_stats>& nodes);
/// Human-readable text: a title line, a table of the ports, a line per kind of non-zero
/// counter, then the runtime's tables (rt::to_text), indented. Zero counters are omitted.
std::string to_text(const nic_stats& s);
/// Reads what to_json(const nic_stats&) wrote. Errors: invalid_argument when `text` is not
/// JSON, or a key is missing or has the wrong type (the message names the key).
result<nic_stats> nic_stats_from_json(std::string_view text);

} // namespace spin::host
