// How spin::coll reaches one NIC or switch: in this process (emu::nic_control, cluster mode;
// local.cpp, in spin_coll_local) or in another spin-emu process (spin::host::client over its
// control socket; nic_handle.cpp, in spin_coll_rank). The communicator and the fabric see only this
// interface.
#pragma once

#include <spin/coll/coll.hpp>
#include <spin/host/groups.hpp>
#include <spin/host/message.hpp>
#include <spin/result.hpp>
#include <spin/rt/runtime.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <optional>
#include <span>
#include <string>

namespace spin::coll::detail {

/// Host memory the NIC can DMA to and from: mapped here, registered with the NIC as `region`.
/// Unregistered and unmapped when destroyed; destroy it before its NIC handle, and after every EC
/// whose window lies in it was uninstalled.
class nic_memory {
public:
  virtual ~nic_memory() = default;
  std::span<std::byte> bytes;
  rt::region_id region = 0;
};

/// One NIC (or switch) as the collectives drive it. Not thread-safe: one thread at a time per
/// NIC handle (the communicator's thread, or the fabric under its lock).
class nic_handle {
public:
  virtual ~nic_handle() = default;
  virtual std::uint32_t rank() const noexcept = 0;
  virtual const std::string& name() const noexcept = 0;
  /// The NIC's clock, which every deadline and repair tick of a collective on it uses:
  /// steady_clock, or a virtual-time NIC's simulated time (spin::sim; emu::nic_control::now).
  virtual std::chrono::steady_clock::time_point now() const noexcept { return std::chrono::steady_clock::now(); }
  /// Waits `d` on the NIC's clock (emu::nic_control::sleep_for).
  virtual void sleep_for(std::chrono::nanoseconds d) { std::this_thread::sleep_for(d); }
  /// The host's own work, for a NIC in virtual time (emu::nic_control::charge_host).
  virtual void charge_host(host::work op, std::uint64_t bytes) {
    (void)op;
    (void)bytes;
  }
  /// A NIC in virtual time (emu::nic_control::virtual_time): lock with lock_on_clock.
  virtual bool virtual_time() const noexcept { return false; }
  /// Largest payload of one packet the NIC's handlers can send (bytes).
  virtual std::uint32_t max_payload_bytes() const noexcept = 0;
  /// The same for two ports of one NIC in this process: communicators use it to refuse a
  /// second communicator of one group on one NIC.
  virtual const std::string& key() const noexcept = 0;
  /// `bytes` of zeroed memory registered with the NIC. Errors: no_memory, those of
  /// registering.
  virtual result<std::unique_ptr<nic_memory>> alloc(std::size_t bytes) = 0;
  /// Installs an EC described by `s` (rt::ec_config; its handlers come from `pkg`, its memory
  /// sizes are raised to what the package declares). Errors: those of binding the package and of the NIC's install
  /// (exists: another EC matches the same packets).
  virtual result<rt::ec_id> install(const engine_package& pkg, const rt::ec_config& s) = 0;
  virtual result<void> uninstall(rt::ec_id ec) = 0;
  /// Host events of `ec`, without waiting.
  virtual std::size_t poll_events(rt::ec_id ec, std::span<rt::host_event> out) = 0;
  /// Host events of `ec`, sleeping up to `timeout` for the first (woken by the NIC, not by
  /// polling, where the NIC handle allows it).
  virtual std::size_t wait_events(rt::ec_id ec, std::span<rt::host_event> out, std::chrono::nanoseconds timeout) = 0;
  /// Sends a message from the NIC (waits up to 1 s for room in its transmit queue).
  virtual result<void> send(const host::message& m) = 0;
  /// Queues a message of at most host::post_inline_bytes without waiting for it
  /// (emu::nic_control::post: copied when queued). The default sends it.
  virtual result<void> post(const host::message& m) { return send(m); }

  // The NIC's group registry (spin/emu/groups.hpp), with this NIC handle as the owner of its joins:
  // destroying the NIC handle (or closing its connection) leaves them. With j.via / d.via / `via`,
  // the NIC's group agent asks that switch in-band (spin/emu/group_agent.hpp).
  virtual result<host::pool_usage> group_pool(const std::optional<host::slot_pool>& set) = 0;
  virtual result<host::group_answer> join_group(const host::group_join& j, std::uint32_t me) = 0;
  virtual result<void> decide_group(const host::group_decision& d) = 0;
  virtual result<void> leave_group(std::uint32_t group, std::uint32_t me, std::uint32_t via) = 0;
  result<void> leave_group(std::uint32_t group, std::uint32_t me) { return leave_group(group, me, host::group_join::own_registry); }
};

/// Takes `l`'s mutex: blocking, or, on a NIC in virtual time, by try_lock and sleep_for on its
/// clock, so that the host program holding it can run (emu::nic_control::virtual_time).
inline void lock_on_clock(std::unique_lock<std::mutex>& l, nic_handle& nic) {
  if (!nic.virtual_time()) return l.lock();
  while (!l.try_lock()) nic.sleep_for(std::chrono::microseconds(50));
}

/// A switch reached in-band through `nic`, a member's own NIC (its group agent sends the group
/// operations on to `switch_rank`). Only group operations: a switch sets its in-band groups up
/// itself, so everything else fails with not_supported.
std::unique_ptr<nic_handle> via_nic(std::unique_ptr<nic_handle> nic, std::uint32_t switch_rank);

/// A NIC of this process. `nic` must outlive the handle. (spin_coll_local: local.cpp)
std::unique_ptr<nic_handle> local_nic(emu::nic_control& nic);

/// spin::coll's standard engine package (the bytes spin-emu trusts), decoded once per process.
/// Errors: those of decoding it.
result<engine_package> standard_package();
/// Node `node` of the spin-emu process whose control socket is `socket`. Errors: those of
/// host::client::connect and nodes(), not_found (no such node).
result<std::unique_ptr<nic_handle>> remote_nic(const std::string& socket, std::uint32_t node);

} // namespace spin::coll::detail
