// An emulated sPIN NIC on DPDK ports, run to completion: each HPU of the NIC is a lane that one
// thread (an lcore) polls; the lane runs the handlers of the packets it takes before it takes
// more (docs/emulator.md, "Data path").
//
// Threads. Lane 0 owns the ports' queues: it receives bursts, hands them to the runtime (which
// runs the frames of its own messages at once and steers the others to their HPU's inbox),
// advances host messages and sends transmit bursts. Lane k > 0 runs what is steered to it and
// hands the frames its handlers send to lane 0 through one SPSC ring per port. One thread may
// poll every lane in turn (poll(), run()), or one thread per lane (poll_lane()); each lane is
// polled by one thread at a time. No lock is taken per packet: a lane's mutex is taken once
// per round. The nic_control operations may come from any thread; they run while every lane
// stands aside between two rounds (docs/emulator.md, "Control path").
#pragma once

#include <spin/emu/nic_control.hpp>
#include <spin/emu/port.hpp>
#include <spin/rt/runtime.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace spin::emu {

class pcap_writer;
class doorbell;

// A NIC's counters are the host's statistics types (spin/host/stats.hpp): they cross the control
// socket as they are.
using host::nic_drop;
using host::nic_drop_count;
using host::nic_drop_name;
using host::nic_port_stats;
using host::nic_stats;

/// How a NIC is built.
struct nic_config {
  std::string name = "nic0";
  std::uint32_t rank = 0;                 ///< address of this NIC (wire::rank_endpoint)
  std::vector<std::uint16_t> ports;       ///< DPDK port ids, at least one; the NIC opens them
  port_options port;                      ///< applied to every port
  /// Egress port (index into `ports`) for each destination rank; -1: no route. Empty: every
  /// destination goes out of port 0. Packets to the NIC's own rank never leave: they go back to
  /// its runtime (loopback), from handlers and from the host alike.
  std::vector<std::int32_t> routes;
  /// The runtime's configuration; rank, tx, release and the HPU thread hooks are set by the NIC.
  rt::runtime_config runtime;
  std::uint32_t burst = 32;               ///< RX/TX burst size (packets), 1..512
  std::uint32_t tx_ring_packets = 1024;   ///< frames waiting to be sent, per port and lane (and per lane's loopback); a power of two
  /// Payload bytes per packet of host messages; 0: the largest that fits a frame of
  /// port.max_frame_bytes with the collective extension.
  std::uint32_t payload_bytes = 1024;
  std::chrono::milliseconds control_timeout{5000};  ///< wait for the lanes to stand aside
  /// Longest sleep of an idle lane 0 in run() and run_lane(0) before it looks at its ports
  /// again (ports cannot wake it; everything else that gives a lane work rings its doorbell).
  std::chrono::microseconds idle_sleep_max{100};
  /// Empty rounds an idle lane spends in `pause` before it yields its core (idle_backoff). 0
  /// suits threads that share cores; a lane on a core of its own may pause (DPDK's lcores
  /// spin), though spin-bench handlers' lanes, each on a core of its own, measured the same at
  /// 0 as at 64 (docs/benchmarks.md, sixth session).
  std::uint32_t idle_pause_rounds = 0;
  /// Doorbell of each lane's poller (index = lane), rung when work arrives for the lane (frames
  /// steered to it, host messages and other lanes' sends for lane 0). Empty or null entries:
  /// the lane's own, which run() and run_lane() sleep on. A cluster passes the doorbells of the
  /// lcores that poll the lanes. Must outlive the NIC.
  std::vector<doorbell*> lane_doorbells;
  /// Capture every frame received, injected, or queued for sending on the NIC's ports to this
  /// pcap file (nanosecond timestamps, one wall-clock reading per poll round). Empty: off.
  std::string capture_path;
};

/// An emulated NIC.
class nic final : public nic_control {
public:
  /// Opens the ports and creates the runtime. Errors: those of port::open and runtime::create,
  /// invalid_argument (no port, burst or ring size out of range, payload size that does not fit
  /// a frame), no_memory (rings or pools).
  static result<std::unique_ptr<nic>> create(const nic_config& cfg);
  /// Stops the runtime, frees every mbuf the NIC holds and closes its ports. The thread that
  /// drove poll() must have stopped.
  ~nic() override;

  /// One round of every lane in turn on the calling thread (poll_lane(0), poll_lane(1), ...).
  /// Returns the frames and packets moved. For a NIC that one thread drives; noexcept.
  std::uint32_t poll() noexcept;
  /// Calls poll() until `stop` becomes true; after a run of empty rounds it backs off (pause
  /// for idle_pause_rounds, yield, then sleeps of up to idle_sleep_max, cut short when work
  /// arrives).
  void run(const std::atomic<bool>& stop) noexcept;
  /// Calls poll_lane(lane) until `stop` becomes true, backing off like run(). One thread per
  /// lane (spin-emu starts them as EAL-registered lcores).
  void run_lane(std::uint32_t lane, const std::atomic<bool>& stop) noexcept;
  /// The NIC's lanes (= its runtime's HPUs, nic_config::runtime.hpus).
  std::uint32_t lanes() const noexcept;
  /// One round of lane `lane`: lane 0 takes RX bursts, advances host messages and sends; every
  /// lane runs what other lanes steered to it and what it sent to its own rank. Returns the
  /// frames and packets moved (0 for a lane out of range, or at once while a control operation
  /// waits). The thread polling that lane only; noexcept, no allocation.
  std::uint32_t poll_lane(std::uint32_t lane) noexcept;
  /// Feeds a frame (a replayed capture, a test) into the receive path as if port 0 had received
  /// it. Copies the bytes. Returns no_memory when no mbuf is free, invalid_argument when it is
  /// longer than the maximum frame. Any thread: it runs between the lanes' rounds.
  errc inject(std::span<const std::byte> frame) noexcept;
  /// True when no frame waits in an inbox, a transmit ring or stage, and no host message is
  /// pending. Any thread (between the lanes' rounds).
  bool idle() noexcept;
  /// Stops the runtime and frees every mbuf the NIC holds, keeping its ports and pools (a
  /// cluster stops every node before any pool goes away, since frames cross between nodes).
  /// Afterwards poll() does nothing and control operations fail. While no thread polls.
  void stop() noexcept;
  /// Ends every host message still in progress: its nic_control::send returns `aborted` at
  /// once (packets already staged are still sent if the NIC is polled). For shutting down after
  /// the poll loop has stopped. Any thread.
  void cancel_sends() noexcept;
  /// Polls until no handler runs, no host message is pending and every transmit ring and stage
  /// is empty, or `timeout` passes. Returns true when quiet. While no thread polls.
  bool quiesce(std::chrono::milliseconds timeout);

  nic_stats stats() const override;
  /// The mbuf pool of port `index` (a benchmark pre-fills it; tests check its counts), or null.
  rte_mempool* port_pool(std::uint32_t index) const noexcept;
  /// The runtime (while no thread polls).
  rt::runtime& runtime() noexcept;

  // nic_control
  std::uint32_t rank() const noexcept override;
  const std::string& name() const noexcept override;
  std::uint32_t max_payload_bytes() const noexcept override;
  result<rt::region_id> register_host_memory(std::span<std::byte> mem) override;
  result<void> unregister_host_memory(rt::region_id region) override;
  result<rt::ec_id> install(const rt::ec_config& cfg) override;
  result<void> uninstall(rt::ec_id ec) override;
  std::size_t poll_events(rt::ec_id ec, std::span<rt::host_event> out) noexcept override;
  std::size_t wait_events(rt::ec_id ec, std::span<rt::host_event> out, std::chrono::nanoseconds timeout) noexcept override;
  result<void> send(const host::message& m, std::chrono::milliseconds timeout) override;
  result<void> post(const host::message& m) override;
  /// Messages up to this size post() copies when it queues them (nic_control::post).
  static constexpr std::size_t inline_bytes = host::post_inline_bytes;
  /// Management datagrams the NIC holds for its agent; more are dropped (nic_drop::mgmt_queue_full).
  static constexpr std::size_t mgmt_queue_depth = 1024;
  result<void> send_mgmt(std::uint32_t dest, std::span<const std::byte> bytes) override;
  std::size_t wait_mgmt(std::span<mgmt_datagram> out, std::chrono::nanoseconds timeout) override;
  rt::runtime_stats runtime_stats() const override;
  group_registry& groups() noexcept override;

  struct impl;

private:
  explicit nic(std::unique_ptr<impl> p);
  std::unique_ptr<impl> _p;
};

} // namespace spin::emu
