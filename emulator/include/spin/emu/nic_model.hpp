// The NIC and switch models of virtual time (docs/virtual-time.md): what a modelled sPIN NIC
// costs per packet, per handler instruction, per DMA, and what a switch adds per frame. The
// topology file's [nic], [switch_nic] and [switch_model] tables set them (topology.hpp);
// spin::sim runs them. Wall-clock spin-emu reads none of them.
//
// Defaults are PsPIN's configuration (Di Girolamo et al., "A RISC-V in-network accelerator for
// flexible high-performance low-power packet processing", ISCA 2021, sections 4 and 6): 4
// clusters of 8 RI5CY HPUs at 1 GHz, 1 MiB of L1 per cluster, a 4 MiB L2 packet buffer, 512-bit
// interconnects at 1 GHz (512 Gbit/s) between packet buffer, clusters and host interface. Where
// PsPIN gives no figure the default says what it assumes.
#pragma once

#include <spin/result.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace spin::emu {

/// One modelled sPIN NIC (a host's, or a switch's handler unit).
struct nic_model {
  /// Clusters of HPUs; a message's packets all go to its home cluster (runtime::hpu_of), as
  /// PsPIN's scheduler keeps a message in one cluster. 1..64.
  std::uint32_t clusters = 4;
  /// HPUs per cluster: a cluster runs this many packets' handlers at once. 1..64.
  std::uint32_t hpus_per_cluster = 8;
  /// HPU clock (GHz), (0.001, 100].
  double hpu_ghz = 1.0;
  /// Cycles per counted instruction (spinc --count-instructions counts an RV32 estimate of each
  /// handler's instructions). Calibrated so that the standard ping-pong handler takes PsPIN's
  /// 38 ns: it counts 38 instructions where PsPIN's has 29, so with invocation_cycles and
  /// command_cycles (6) a counted instruction costs (38 - 6) / 38 = 0.84 cycles
  /// (docs/virtual-time.md, "Calibration"). (0.01, 100].
  double cpi = 0.84;
  /// Cycles an HPU spends per handler invocation outside the handler's code: reading the
  /// handler's arguments and returning to the scheduler. 0..1e6.
  std::uint32_t invocation_cycles = 4;
  /// Cycles an HPU spends to issue one command (a send, a DMA, an event) to the NIC's command
  /// unit; the command then proceeds without the HPU. 0..1e6.
  std::uint32_t command_cycles = 2;
  /// From a packet's last byte at the NIC to the moment an HPU of its cluster may start: the
  /// inbound engine, the header-to-HPU scheduler and the cluster's scheduler, excluding the
  /// copy into L1 (l1_copy_gbps). PsPIN measures 26 ns for a 64-byte packet to its HPU, of which
  /// the copy takes 1 ns. 0..1 s.
  std::chrono::nanoseconds scheduler_latency{25};
  /// Bandwidth of the copy of a packet from the L2 packet buffer into its cluster's L1 (Gbit/s),
  /// one copy engine per cluster. (0.001, 1e6].
  double l1_copy_gbps = 512;
  /// L2 packet buffer: packets wait here from arrival until their handlers have returned. A
  /// packet that finds it full is dropped (counted: packet_buffer_full). 1 KiB..1 TiB.
  std::uint64_t packet_buffer_bytes = 4ull << 20;
  /// From a command to send to the frame's first byte at the port (the outbound engine reads
  /// the payload from L1 or L2). 0..1 s.
  std::chrono::nanoseconds tx_latency{10};
  /// One way over PCIe, for DMA to and from the host, events and the host's doorbells. PsPIN
  /// assumes none; this is a PCIe 4 round trip of about 1 us. 0..1 s.
  std::chrono::nanoseconds pcie_latency{500};
  /// DMA bandwidth of the host interface (Gbit/s) in each direction (PCIe is full duplex:
  /// writes to the host and reads from it do not share it); per direction one DMA engine, first
  /// come first served. PsPIN's host interface: 512. (0.001, 1e6].
  double pcie_gbps = 512;
  /// NIC memory for handler memory and scratchpads (bytes): PsPIN's L2 handler memory is 4 MiB;
  /// the default is larger because a collective engine's state for many ranks needs it.
  /// 4 KiB..1 TiB (reserved, touched only where used).
  std::uint64_t memory_bytes = 64ull << 20;
  /// The host behind the NIC: what one host thread copies (memcpy into and out of staging
  /// buffers) per second, Gbit/s. One core of the development machine: about 94 (11.7 GB/s).
  /// Host programs charge it through nic_control::charge_host. (0.001, 1e6].
  double host_copy_gbps = 94;
  /// The host's reduction rate (a ring's fold of received data into its own, in the
  /// collective's element type), Gbit/s of the reduced vector. One core here: about 120 (float32
  /// sums into a resident accumulator at 15 GB/s). (0.001, 1e6].
  double host_reduce_gbps = 120;

  bool operator==(const nic_model&) const = default;
};

/// Bytes of NIC memory a switch's handler unit has unless [switch_nic] says otherwise: 1 GiB (a
/// switch aggregating for many members keeps every member's contribution per slot: 256 members
/// x 64 slots x 2 shadow copies x 4 KiB take 128 MiB).
inline constexpr std::uint64_t switch_memory_bytes = 1ull << 30;

/// Bytes of packet buffer a switch's handler unit has unless [switch_nic] says otherwise: 64 MiB,
/// a data-centre switch's shared buffer (Tofino 2: 64 MB). With PsPIN's 4 MiB, 64 members
/// sending 32 packets of 4 KiB each (8 MiB) overflow it.
inline constexpr std::uint64_t switch_packet_buffer_bytes = 64ull << 20;

/// The switches' model when [switch_nic] gives none of its keys: the hosts' `nic`, with at least
/// switch_memory_bytes of memory and switch_packet_buffer_bytes of packet buffer.
inline nic_model switch_nic_of(const nic_model& nic) {
  nic_model m = nic;
  if (m.memory_bytes < switch_memory_bytes) m.memory_bytes = switch_memory_bytes;
  if (m.packet_buffer_bytes < switch_packet_buffer_bytes) m.packet_buffer_bytes = switch_packet_buffer_bytes;
  return m;
}

/// What a switch adds to a frame it forwards (its handler traffic runs on `topology::switch_nic`).
struct switch_model {
  /// From a frame's last byte at an input port to its first byte eligible at the output port
  /// (cut-through switches forward sooner; this model stores and forwards). 0..1 s.
  std::chrono::nanoseconds latency{300};
  bool operator==(const switch_model&) const = default;
};

/// Checks `m`; the error (invalid_argument) names the first bad key as the topology file spells
/// it ("hpu_ghz") and its value, prefixed with `table` ("[nic]").
result<void> validate(const nic_model& m, const std::string& table = "[nic]");
/// Checks `s` (as validate(nic_model)).
result<void> validate(const switch_model& s, const std::string& table = "[switch_model]");

namespace detail {
/// The first invalid field of `m` as {key as the topology file spells it, message}; nullopt
/// when `m` is valid. validate() and the topology parser share it.
struct bad_model_field {
  const char* key;
  std::string message;
};
std::optional<bad_model_field> first_bad_field(const nic_model& m);
std::optional<bad_model_field> first_bad_field(const switch_model& s);
} // namespace detail

} // namespace spin::emu
