// A NIC's statistics as nlohmann JSON values, for the host library's own files: the control
// protocol (protocol.cpp) puts them into and takes them out of its replies without writing and
// parsing them as text in between. Not installed.
#pragma once

#include <spin/host/stats.hpp>

#include <nlohmann/json.hpp>

#include <vector>

namespace spin::host::detail {

/// What to_json(const nic_stats&) writes, as a value.
nlohmann::ordered_json nic_json(const nic_stats& s);
/// What to_json(const std::vector<node_stats>&) writes, as a value.
nlohmann::ordered_json nodes_json(const std::vector<node_stats>& nodes);
/// Reads a value nic_json wrote. Errors: as nic_stats_from_json.
result<nic_stats> nic_from(const nlohmann::json& j);

} // namespace spin::host::detail
