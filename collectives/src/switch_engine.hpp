// A group's aggregation engine on one switch: installed, set up and removed through the
// switch's NIC handle (docs/collectives.md, "Switch aggregation"). The fabric uses it for the groups
// its communicators set up, and a switch's group agent for the groups it grants in-band
// (switch_agent.hpp).
#pragma once

#include <spin/coll/coll.hpp>
#include <spin/coll/protocol.hpp>

#include "nic_handle.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace spin::coll::detail {

/// One engine EC of a group on one switch.
struct switch_engine {
  rt::ec_id ec = 0;
  bool ec_ok = false;
  std::unique_ptr<nic_memory> mem;  ///< the EC's host window: the set-up descriptor
};

/// Installs `pkg`'s engine for group `wire_id` on switch `nic` (slots of `slot_bytes`), sends it
/// its set-up (`setup`; `members`: the NIC ranks it aggregates for; `leaves`: a root's leaf
/// switches; `frame_key`: the group's, all zero for none) and waits up to 10 s for the engine to confirm. On error the caller removes what
/// was done (remove_switch_engine). Errors: those of the NIC handle's alloc, install and send;
/// invalid_argument (the engine refused its set-up), fault (the engine failed), timeout (no
/// confirmation).
result<void> install_switch_engine(nic_handle& nic, switch_engine& e, std::uint32_t wire_id, std::uint32_t slots,
                                   std::uint32_t slot_bytes, const proto::switch_setup& setup,
                                   const std::vector<std::uint32_t>& members, const std::vector<std::uint32_t>& leaves,
                                   const engine_package& pkg, const std::array<std::uint8_t, 16>& frame_key);
/// Uninstalls the engine and frees its window (nothing when it was never installed).
void remove_switch_engine(nic_handle& nic, switch_engine& e);

} // namespace spin::coll::detail
