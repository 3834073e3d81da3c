// The control surface of one emulated NIC: what the control socket, the host library and an
// embedding application may ask of it. emu::nic implements it; the control server and the
// cluster only see this interface.
#pragma once

#include <spin/emu/groups.hpp>
#include <spin/host/message.hpp>
#include <spin/host/stats.hpp>
#include <spin/result.hpp>
#include <spin/rt/runtime.hpp>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace spin::emu {

/// A management datagram: the payload of a one-packet spin `control` packet (docs/wire-format.md).
/// A NIC hands these to its management agent (its control-plane CPU: the group agent,
/// spin/emu/group_agent.hpp), never to its handlers; InfiniBand's management datagrams play the
/// same part. Delivery is best effort: the agents' protocol repeats what must arrive.
struct mgmt_datagram {
  std::uint32_t source_rank = 0;  ///< the sender's rank (as its spin header says)
  std::vector<std::byte> bytes;   ///< the payload
};


/// One NIC's control operations. Every member is thread-safe: the implementation runs the
/// operation on the calling thread, serialised with the NIC's poll loop between two rounds
/// (control path; may allocate and block). Errors are those of the runtime call named, plus
/// `timeout` when the poll loop did not let the request in within its control timeout (a stuck
/// NIC), and `bad_state` once the NIC is stopped.
class nic_control {
public:
  virtual ~nic_control() = default;

  /// This NIC's rank (its address in the emulated network, wire::rank_endpoint).
  virtual std::uint32_t rank() const noexcept = 0;
  /// Name from the topology or command line ("host0", ...).
  virtual const std::string& name() const noexcept = 0;
  /// The NIC's clock, which a host program's timeouts on this NIC must use (spin::coll's do):
  /// steady_clock for a NIC in wall-clock time (the default); a NIC in virtual time
  /// (spin::sim) gives its simulated time as steady_clock's epoch plus the virtual ns, and its
  /// wait_events timeouts are virtual too. Any thread.
  virtual std::chrono::steady_clock::time_point now() const noexcept { return std::chrono::steady_clock::now(); }
  /// Waits `d` on the NIC's clock: a real sleep by default; in virtual time a simulated wait, in
  /// which the simulation goes on. The threads allowed to wait on the NIC (wait_events).
  virtual void sleep_for(std::chrono::nanoseconds d) { std::this_thread::sleep_for(d); }
  /// Tells a NIC in virtual time that the calling host program did `bytes` of `op` (a staging
  /// copy, a fold of received data): the program's virtual clock moves by the time the host
  /// model gives (emu::nic_model::host_copy_gbps, host_reduce_gbps). Wall-clock NICs ignore it
  /// (the work took its real time). The threads allowed to wait on the NIC.
  virtual void charge_host(host::work op, std::uint64_t bytes) {
    (void)op;
    (void)bytes;
  }
  /// True for a NIC in virtual time (spin::sim). Its host programs run one at a time and hand
  /// over only in wait_events and sleep_for: a host program there must not block on anything
  /// else that another host program releases (a mutex held across a wait would stop the
  /// simulation), so code shared with such programs takes its locks with try_lock and
  /// sleep_for (spin::coll's fabric does).
  virtual bool virtual_time() const noexcept { return false; }
  /// Largest payload (bytes) of one packet a handler on this NIC can send (rt::transmitter).
  virtual std::uint32_t max_payload_bytes() const noexcept = 0;

  /// runtime::register_host_memory. The memory stays mapped by the caller until
  /// unregister_host_memory succeeded or the NIC is destroyed.
  virtual result<rt::region_id> register_host_memory(std::span<std::byte> mem) = 0;
  /// Forgets a region. Errors: not_found (unknown region), bad_state (an installed EC's window
  /// lies in it, or a send from it is in progress).
  virtual result<void> unregister_host_memory(rt::region_id region) = 0;
  /// runtime::install.
  virtual result<rt::ec_id> install(const rt::ec_config& cfg) = 0;
  /// runtime::uninstall.
  virtual result<void> uninstall(rt::ec_id ec) = 0;
  /// runtime::poll_events (any thread; does not go through the scheduler thread).
  virtual std::size_t poll_events(rt::ec_id ec, std::span<rt::host_event> out) noexcept = 0;
  /// runtime::wait_events: as poll_events, waiting up to `timeout` for the first event (a few
  /// rounds of polling that yield the core, then a futex the NIC wakes when it posts one). Any
  /// thread.
  virtual std::size_t wait_events(rt::ec_id ec, std::span<rt::host_event> out, std::chrono::nanoseconds timeout) noexcept = 0;
  /// Sends a message. Returns once every packet was copied into the NIC's transmit queue (the
  /// host buffer may then be reused). Errors: those of `post`, aborted (the NIC stopped or
  /// cancelled its sends meanwhile), invalid_argument (a packet could not be encoded as a
  /// frame), timeout (the transmit queue stayed full for `timeout`; packets already queued are
  /// sent, the rest are not).
  virtual result<void> send(const host::message& m, std::chrono::milliseconds timeout) = 0;
  /// Queues a message for sending and returns at once, without waiting for its packets (a
  /// real NIC's doorbell: the descriptor is posted, the NIC reads the host buffer later). A
  /// message of at most host::post_inline_bytes (256) bytes is copied when posted (an RDMA NIC's inline send), so its
  /// buffer may be reused at once; of a larger one the caller must leave the bytes alone until
  /// it knows, from the receiver's answer, that they were read. A queued message waits for room
  /// in the transmit queue as long as it takes; it is dropped only when the NIC stops or
  /// cancels its sends. The queue has a lock of its own, which lane 0 takes once per round to
  /// empty it: posting never waits for the lanes' locks. Errors (found up front): not_found
  /// (unknown region, no route), out_of_bounds (range outside the region), invalid_argument
  /// (length above 2^32 packets, frames that do not fit the port), bad_state (the NIC was
  /// stopped). The default sends and waits (`send` with a one-second timeout, whose errors it
  /// returns).
  virtual result<void> post(const host::message& m) { return send(m, std::chrono::milliseconds(1000)); }
  /// Queues `bytes` as one management datagram to rank `dest` and returns (it leaves with the
  /// host messages, in order). Errors: invalid_argument (empty, above max_payload_bytes(),
  /// `dest` is this NIC, a frame that does not fit the port), not_found (no route),
  /// bad_state (the NIC was stopped), not_supported (a NIC without management datagrams: the
  /// default).
  virtual result<void> send_mgmt(std::uint32_t dest, std::span<const std::byte> bytes) {
    (void)dest;
    (void)bytes;
    return fail(errc::not_supported, "send_mgmt: this NIC has no management datagrams");
  }
  /// Takes up to out.size() management datagrams that reached this NIC, oldest first, waiting up
  /// to `timeout` for the first (0: none arrived; the NIC holds nic::mgmt_queue_depth and drops
  /// more with reason mgmt_queue_full). Any thread; meant for one consumer (the NIC's agent).
  virtual std::size_t wait_mgmt(std::span<mgmt_datagram> out, std::chrono::nanoseconds timeout) {
    (void)out;
    (void)timeout;
    return 0;
  }
  /// Snapshot of the runtime's counters.
  virtual rt::runtime_stats runtime_stats() const = 0;
  /// Every counter of the NIC: ports, drops by reason, the runtime's.
  virtual host::nic_stats stats() const = 0;
  /// The NIC's group registry: its pool of aggregator slots when it acts as a switch
  /// (spin/emu/groups.hpp; thread-safe on its own, not serialised with the poll loop).
  virtual group_registry& groups() noexcept = 0;
};

} // namespace spin::emu
