// The keys of the topology file's [nic] and [switch_nic] tables, one row each (nic_model.cpp):
// the parser, the writer and validate() read the same table.
#pragma once

#include <spin/emu/nic_model.hpp>

#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace spin::emu::detail {

struct model_key {
  enum kind { u32, u64, f64, ns };
  const char* key;  ///< as the topology file spells it
  kind type;
  double min, max;  ///< accepted range (f64: (min, max], others [min, max])
  std::variant<std::uint32_t nic_model::*, std::uint64_t nic_model::*, double nic_model::*, std::chrono::nanoseconds nic_model::*> field;

  double get(const nic_model& m) const;
  void set(nic_model& m, double v) const;
  /// Why `v` is not acceptable for this key, or nullopt.
  std::optional<std::string> check(double v) const;
};

const std::vector<model_key>& nic_model_keys();

} // namespace spin::emu::detail
