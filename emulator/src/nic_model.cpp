#include <spin/emu/nic_model.hpp>

#include "nic_model_keys.hpp"

#include <cmath>
#include <cstdio>

namespace spin::emu {
namespace detail {

namespace {
std::string num(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
} // namespace

// One row per key of [nic] / [switch_nic]; the parser, the writer and the checks read it.
const std::vector<model_key>& nic_model_keys() {
  static const std::vector<model_key> keys = {
      {"clusters", model_key::u32, 1, 64, &nic_model::clusters},
      {"hpus_per_cluster", model_key::u32, 1, 64, &nic_model::hpus_per_cluster},
      {"hpu_ghz", model_key::f64, 0.001, 100, &nic_model::hpu_ghz},
      {"cpi", model_key::f64, 0.01, 100, &nic_model::cpi},
      {"invocation_cycles", model_key::u32, 0, 1e6, &nic_model::invocation_cycles},
      {"command_cycles", model_key::u32, 0, 1e6, &nic_model::command_cycles},
      {"scheduler_latency_ns", model_key::ns, 0, 1e9, &nic_model::scheduler_latency},
      {"l1_copy_gbps", model_key::f64, 0.001, 1e6, &nic_model::l1_copy_gbps},
      {"packet_buffer_bytes", model_key::u64, 1024, 1099511627776.0, &nic_model::packet_buffer_bytes},
      {"tx_latency_ns", model_key::ns, 0, 1e9, &nic_model::tx_latency},
      {"pcie_latency_ns", model_key::ns, 0, 1e9, &nic_model::pcie_latency},
      {"pcie_gbps", model_key::f64, 0.001, 1e6, &nic_model::pcie_gbps},
      {"memory_bytes", model_key::u64, 4096, 1099511627776.0, &nic_model::memory_bytes},
      {"host_copy_gbps", model_key::f64, 0.001, 1e6, &nic_model::host_copy_gbps},
      {"host_reduce_gbps", model_key::f64, 0.001, 1e6, &nic_model::host_reduce_gbps},
  };
  return keys;
}

double model_key::get(const nic_model& m) const {
  return std::visit(
      [&](auto p) -> double {
        using F = std::remove_cvref_t<decltype(m.*p)>;
        if constexpr (std::is_same_v<F, std::chrono::nanoseconds>) return static_cast<double>((m.*p).count());
        else return static_cast<double>(m.*p);
      },
      field);
}

void model_key::set(nic_model& m, double v) const {
  std::visit(
      [&](auto p) {
        using F = std::remove_cvref_t<decltype(m.*p)>;
        if constexpr (std::is_same_v<F, std::chrono::nanoseconds>) m.*p = std::chrono::nanoseconds(static_cast<std::int64_t>(v));
        else m.*p = static_cast<F>(v);
      },
      field);
}

std::optional<std::string> model_key::check(double v) const {
  // Floating-point keys exclude their lower bound (a rate or a clock of 0 means nothing).
  const bool ok = type == f64 ? (std::isfinite(v) && v > min && v <= max) : (v >= min && v <= max && v == std::floor(v));
  if (ok) return std::nullopt;
  const std::string lo = type == f64 ? "(" + num(min) : "[" + num(min);
  return std::string(key) + " must be " + (type == f64 ? "a number" : "an integer") + " in " + lo + ", " + num(max) + "], got " + num(v);
}

std::optional<bad_model_field> first_bad_field(const nic_model& m) {
  for (const model_key& k : nic_model_keys())
    if (auto why = k.check(k.get(m))) return bad_model_field{k.key, *why};
  return std::nullopt;
}

std::optional<bad_model_field> first_bad_field(const switch_model& s) {
  if (s.latency.count() < 0 || s.latency > std::chrono::seconds(1))
    return bad_model_field{"latency_ns", "latency_ns must be an integer in [0, 1000000000], got " + std::to_string(s.latency.count())};
  return std::nullopt;
}

} // namespace detail

result<void> validate(const nic_model& m, const std::string& table) {
  if (auto f = detail::first_bad_field(m)) return fail(errc::invalid_argument, table + ": " + f->message);
  return {};
}

result<void> validate(const switch_model& s, const std::string& table) {
  if (auto f = detail::first_bad_field(s)) return fail(errc::invalid_argument, table + ": " + f->message);
  return {};
}

} // namespace spin::emu
