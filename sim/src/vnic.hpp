// A simulated node as host programs see it (emu::nic_control in virtual time), and the set-up
// of its runtime (nic.cpp).
#pragma once

#include "impl.hpp"

#include <span>
#include <unordered_map>

namespace spin::sim {

/// Builds node `nd`'s runtime (in virtual time: its observer and transmitter are the
/// simulation's) and its host interface. Errors: those of runtime::create.
result<void> make_node_runtime(cluster::impl& sim, impl_node& nd);

class vnic final : public emu::nic_control {
public:
  explicit vnic(impl_node& nd) : _nd(nd) {}
  std::uint32_t rank() const noexcept override { return _nd.rank; }
  const std::string& name() const noexcept override { return _nd.name; }
  std::uint32_t max_payload_bytes() const noexcept override { return _nd.sim->opts.payload_bytes; }
  /// Virtual time; while the cluster is destroyed with actors left, the end of time (every
  /// deadline has passed, so they end).
  std::chrono::steady_clock::time_point now() const noexcept override {
    if (_nd.sim->cancelling) return std::chrono::steady_clock::time_point::max();
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(_nd.sim->now / 1000));
  }
  /// A wait in virtual time: the simulation runs meanwhile.
  void sleep_for(std::chrono::nanoseconds d) override;
  bool virtual_time() const noexcept override { return true; }
  /// The host model's time for the work (nic_model::host_copy_gbps, host_reduce_gbps).
  void charge_host(host::work op, std::uint64_t bytes) override;
  result<rt::region_id> register_host_memory(std::span<std::byte> mem) override;
  result<void> unregister_host_memory(rt::region_id region) override;
  result<rt::ec_id> install(const rt::ec_config& cfg) override { return _nd.rt->install(cfg); }
  result<void> uninstall(rt::ec_id ec) override;
  std::size_t poll_events(rt::ec_id ec, std::span<rt::host_event> out) noexcept override;
  std::size_t wait_events(rt::ec_id ec, std::span<rt::host_event> out, std::chrono::nanoseconds timeout) noexcept override;
  /// Virtual time: the message's frames are built now (the host buffer may be reused at once)
  /// and leave as the NIC model says; never waits, so `timeout` is not used.
  result<void> send(const host::message& m, std::chrono::milliseconds timeout) override;
  result<void> post(const host::message& m) override { return send(m, std::chrono::milliseconds(0)); }
  rt::runtime_stats runtime_stats() const override { return _nd.rt->stats(); }
  host::nic_stats stats() const override;
  emu::group_registry& groups() noexcept override { return _nd.groups; }

private:
  impl_node& _nd;
  std::unordered_map<rt::region_id, std::span<std::byte>> _regions;
};

} // namespace spin::sim
