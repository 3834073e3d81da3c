// spin::coll's part in a switch's group agent (spin/emu/group_agent.hpp): how a switch sets up
// a group it grants in-band. Part of spin_coll_local (it drives a NIC of this process); spin-emu
// gives it to the agents of its nodes.
#pragma once

#include <spin/emu/group_agent.hpp>
#include <spin/emu/nic_control.hpp>

#include <memory>

namespace spin::coll {

/// The group installer of switch `nic`: sets a granted group up as the root of a flat group
/// (every member linked to `nic`) with spin::coll's standard engine, the package spin-emu
/// trusts, and answers the lease {nic.rank()}. Called on the agent's thread only; `nic` must
/// outlive it. Set-up errors (no memory, the engine refusing its set-up, no confirmation within
/// 10 s) refuse the group with their message.
std::unique_ptr<emu::group_installer> switch_group_installer(emu::nic_control& nic);

} // namespace spin::coll
