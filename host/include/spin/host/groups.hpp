// A switch's group registry as values: what a member asks of the switch that aggregates for its
// group, and what it answers (docs/collectives.md, "Switch-resident groups"). The registry itself
// lives in the switch's spin-emu (spin/emu/groups.hpp); the control protocol carries these values
// (spin/host/protocol.hpp), and an in-process port passes them directly.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace spin::host {

/// A switch's pool of aggregator slots. Each slot holds (inputs + 1) x slot_bytes bytes twice
/// in the switch's NIC memory (SwitchML's shadow copies), inside the EC of the group that holds
/// it, so no group can address another's slots.
struct slot_pool {
  std::uint32_t slots = 256;        ///< 1..32767
  std::uint32_t slot_bytes = 4096;  ///< largest contribution per slot (bytes): a multiple of 8 in 8..4096
  bool operator==(const slot_pool&) const = default;
};

/// A pool's state.
struct pool_usage {
  slot_pool pool;
  std::uint32_t free = 0;     ///< slots no group holds or is setting up
  std::uint32_t groups = 0;   ///< groups holding slots (granted or being set up)
  std::uint32_t waiting = 0;  ///< groups queued for slots (first come, first served)
};

/// A member's request to join group `group` on this switch.
struct group_join {
  std::uint32_t group = 0;                ///< the group's wire id
  std::vector<std::uint32_t> members;     ///< NIC ranks, in communicator order (1..65535 of them)
  std::uint32_t slots = 0;                ///< slots the group asks for (1..32767)
  /// Proof of the job's secret (spin::coll: SipHash-2-4 under the secret over the group's id,
  /// slots and members); 0: none. Every member of a group must bring the first member's.
  std::uint64_t proof = 0;
  /// Largest payload (bytes) of the group's packets; the switch refuses a group whose packets do
  /// not fit its slots. 0: not checked (a member that checks it itself).
  std::uint32_t packet_bytes = 0;
  /// In-band: the rank of the switch that aggregates, reached through the NIC this request goes
  /// to (its group agent sends the join on: spin/emu/group_agent.hpp). own_registry: the NIC
  /// this request goes to is the switch.
  std::uint32_t via = own_registry;
  static constexpr std::uint32_t own_registry = ~0u;
  /// The group's frame key (spin::coll: derived from the job secret and the group id), which the
  /// switch gives the group's engine (rt::ec_config::frame_key) so that it takes only frames its
  /// members tagged; all zero: none. Not part of the registry's comparison of members' requests
  /// (the proof already binds every member to one secret). In-band it travels wrapped under the
  /// management key (spin/emu/group_agent.hpp).
  std::array<std::uint8_t, 16> frame_key{};
};

/// Where a join stands.
enum class join_state : std::uint8_t {
  install,  ///< this member is the group's first: its slots are reserved; set the group up, then decide
  wait,     ///< ask again: the first member is setting the group up, or the group waits for free slots
  granted,  ///< the group holds its slots; `lease` is what the first member published
  refused,  ///< the group runs without this switch; `reason` says why
};
/// "install", "wait", "granted", "refused".
const char* name(join_state s) noexcept;

/// The registry's answer to a join. Every member of a group gets the same granted or refused
/// answer (the first member's decision).
struct group_answer {
  join_state state = join_state::wait;
  /// granted: the lease words the first member published (for spin::coll: the root switch's
  /// rank, then each member's leaf rank in a two-level tree).
  std::vector<std::uint32_t> lease;
  /// refused, or why a group waits (free slots and how many groups hold the rest).
  std::string reason;
  /// This member is the group's first (it sets the group up, or gives up waiting for slots).
  bool installer = false;
};

/// The first member's decision on a group it set up (after join answered install).
struct group_decision {
  std::uint32_t group = 0;
  bool granted = false;
  std::vector<std::uint32_t> lease;  ///< granted: at most 65536 words
  std::string reason;                ///< refused: why (at most 1024 bytes)
  /// In-band (group_join::via): the switch's rank; only refusals travel in-band.
  std::uint32_t via = group_join::own_registry;
};

} // namespace spin::host
