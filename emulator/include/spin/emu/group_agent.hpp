// A NIC's group agent: in-band joins of switch-resident groups (docs/collectives.md, "In-band
// joins"). Every spin-emu runs one per NIC, on a thread of its own that sleeps on the NIC's
// management queue. It plays both parts:
// - member side: a rank asks its own NIC (control connection, a "via" field naming the switch's
//   rank) to join a group on a switch; the agent sends the join to the switch as a management
//   datagram (nic_control::send_mgmt), repeats it while the rank polls, keeps the NIC's joins
//   alive with keep-alives, and sends the leaves when the rank leaves or its connection closes;
// - switch side: it answers joins from member NICs out of this NIC's group registry (all or
//   nothing, one answer for every member: spin/emu/groups.hpp), sets a granted group up itself
//   (group_installer: the switch engine, installed by the switch, never by a member), renews each
//   member NIC's lease on its keep-alives, and releases the joins of a member NIC whose lease ran
//   out (its spin-emu crashed or its link went), removing groups nobody holds.
//
// Datagrams (the payload of a management datagram; every field big-endian; this is their one
// description, group_agent.cpp the one implementation):
//   header     u8 'G', u8 version (2), u8 op, u8 sealed (0 or 1), u32 group, u32 me
//   join (1)   + u32 slots, u32 packet_bytes, u32 term_ms, u64 proof, u64 nonce, u8 key[16],
//                u32 n, u32 members[n]
//   answer (2) + u8 state (join_state, or 255: an error), u8 -errc (error), u8 installer, u8 0,
//                u32 n, u32 lease[n], u16 len, reason[len] (len <= 1024)
//   leave (3), keepalive (4: + u32 term_ms), alive (5: + u8 known), give_up (6: + u16 len, reason)
//   sealed     + u64 tag: SipHash-2-4 under the management key of every byte before it
// A datagram that is short, has another magic or version, an unknown op or lengths that overrun
// it is counted (bad_datagrams) and ignored. A member's poll sends its join again only when the
// last one is unanswered for 10 ms.
//
// The management key (group_agent_options::mgmt_key; spin-emu reads SPIN_MGMT_KEY) is what the
// NICs and switches of one fabric share, as an InfiniBand fabric's management key: with it an
// agent seals every datagram it sends and takes only sealed datagrams whose tag verifies; without
// it, only unsealed ones. Any other datagram is counted (forged_datagrams) and ignored. A join's
// `key` is the group's frame key (host::group_join::frame_key) XOR a key stream: SipHash-2-4
// under the management key of "spin-key-wrap", `nonce` (8 random bytes) and the half's index.
// All zero with nonce 0: the group has no frame key. An agent without a management key refuses
// to send a join that has one (the key would cross the network in clear). Sealing does not stop
// replays: a copied keep-alive renews a lease until the copier stops.
#pragma once

#include <spin/emu/nic_control.hpp>
#include <spin/host/groups.hpp>
#include <spin/result.hpp>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace spin::emu {

/// How a switch sets up the groups it grants in-band (spin::coll provides it:
/// coll::switch_group_installer). Called on the agent's thread only.
class group_installer {
public:
  virtual ~group_installer() = default;
  /// Sets group `j` up on this switch for members linked to it directly, with slots of
  /// `slot_bytes` (the pool's); returns the lease words every member gets (spin::coll: this
  /// switch's rank). An error refuses the group for every member, with its message.
  virtual result<std::vector<std::uint32_t>> set_up(const host::group_join& j, std::uint32_t slot_bytes) = 0;
  /// Removes what set_up installed for `group` (it was refused later, or nobody holds it).
  virtual void tear_down(std::uint32_t group) = 0;
};

struct group_agent_options {
  /// The lease a member NIC asks the switch for (100 ms .. 1 h): a member NIC that sends no
  /// keep-alive for this long loses its joins. Keep-alives go every term / 4.
  std::chrono::milliseconds lease_term{3000};
  /// Largest wait on the management queue: how often the agent checks leases (1 .. 1000 ms).
  std::chrono::milliseconds tick{50};
  /// Member side: a join the switch has not answered at all for this long fails with timeout
  /// (its spin-emu is down, or it is not linked to this NIC), so that members do not wait for a
  /// decision nobody will make (10 ms .. 1 h).
  std::chrono::milliseconds answer_timeout{5000};
  /// The fabric's management key (16 bytes; all zero: none). Every agent of a fabric must have
  /// the same: an agent drops the datagrams of one with another (see above).
  std::array<std::uint8_t, 16> mgmt_key{};
};

/// Counters of one agent (any thread).
struct group_agent_stats {
  std::uint64_t datagrams_in = 0, datagrams_out = 0;
  std::uint64_t bad_datagrams = 0;  ///< too short, a wrong magic or version, an unknown op, lengths that lie
  std::uint64_t forged_datagrams = 0;  ///< sealed when this agent has no management key, unsealed when it has one, or a tag that does not verify
  std::uint64_t send_errors = 0;    ///< send_mgmt refused (no route, queue stopped)
  std::uint64_t groups_set_up = 0, groups_removed = 0;  ///< switch side: by the installer
  std::uint64_t leases_expired = 0;  ///< switch side: member NICs released for silence
  std::uint64_t leases_lost = 0;     ///< member side: a switch no longer knew this NIC's lease
};

/// One NIC's agent. Starts its thread in the constructor and stops it in the destructor (which
/// first sends the leaves of every join it holds). Every member function is thread-safe.
class group_agent {
public:
  /// `installer` may be null: this NIC then refuses groups that ask it to aggregate.
  /// Errors: invalid_argument (options out of range).
  static result<std::unique_ptr<group_agent>> start(nic_control& nic, std::unique_ptr<group_installer> installer,
                                                    group_agent_options o = {});
  ~group_agent();
  group_agent(const group_agent&) = delete;
  group_agent& operator=(const group_agent&) = delete;

  // Member side. `owner` is the rank's control session; `sw` the switch's rank.
  /// Asks switch `sw` (again: this is how a member polls) and returns the latest answer: `wait`
  /// until the switch answered ("asked ... in-band; no answer yet"). Errors: invalid_argument
  /// (`sw` is this NIC; more members than one datagram holds: (max payload - 68) / 4; a frame
  /// key and no management key to wrap it; `me` not
  /// an index of the members; the switch refuses a NIC that joins as a member whose rank is not
  /// its own), exists (another owner on this NIC joined as this member), timeout (the switch
  /// sent no answer within options::answer_timeout of the first ask), the switch's own errors
  /// (its registry's, with their codes), those of send_mgmt.
  result<host::group_answer> join(std::uint64_t owner, std::uint32_t sw, const host::group_join& j, std::uint32_t me);
  /// The first member gives up waiting for slots: the switch refuses the group for everyone.
  /// Only refusals travel in-band (a switch sets its groups up itself). Errors: invalid_argument
  /// (a decision that grants), not_found (no such join of `owner`).
  result<void> give_up(std::uint64_t owner, std::uint32_t sw, const host::group_decision& d);
  /// Leaves (best effort: a lost leave ends with the lease).
  void leave(std::uint64_t owner, std::uint32_t sw, std::uint32_t group, std::uint32_t me);
  /// Everything `owner` joined leaves (its connection closed).
  void release(std::uint64_t owner);

  group_agent_stats stats() const;

private:
  group_agent(nic_control& nic, std::unique_ptr<group_installer> installer, group_agent_options o);
  struct held;  // a member-side join
  void run();
  void handle(const mgmt_datagram& d);
  void on_join(std::uint32_t from, std::uint32_t group, std::uint32_t me, const std::byte* p, std::size_t n);
  void on_answer(std::uint32_t from, std::uint32_t group, std::uint32_t me, const std::byte* p, std::size_t n);
  void answer(std::uint32_t to, std::uint32_t group, std::uint32_t me, const result<host::group_answer>& a);
  void send(std::uint32_t to, std::vector<std::byte> d);
  result<void> transmit(std::uint32_t to, std::vector<std::byte> d);
  void tick(std::chrono::steady_clock::time_point now);
  void sweep_groups();
  static std::uint64_t member_owner(std::uint32_t rank) noexcept;

  nic_control& _nic;
  std::unique_ptr<group_installer> _installer;
  group_agent_options _o;
  mutable std::mutex _m;
  // Member side: joins by (switch, group, me), with their owner, request and latest answer.
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, std::unique_ptr<held>> _held;
  std::chrono::steady_clock::time_point _next_keepalive{};
  // Switch side (agent thread only): groups this NIC set up.
  std::set<std::uint32_t> _installed;
  group_agent_stats _st;
  bool _stop = false;
  std::thread _th;
};

} // namespace spin::emu
