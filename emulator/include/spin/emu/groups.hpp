// A switch's group registry: its pool of aggregator slots and the groups that hold or wait for
// some (docs/collectives.md, "Switch-resident groups"). It lives with the switch (every emulated
// NIC has one; a switch-mode spin-emu's is the one that matters), so that groups whose members
// run in different processes share one pool and one answer. Members reach it through their
// spin-emu control connection (the "group_*" operations of spin/host/protocol.hpp) or, in this
// process, through nic_control::groups().
//
// Policy (SHARP's aggregation manager and SwitchML's slot pool, one switch at a time):
// - all or nothing: a group gets every slot it asks for or none;
// - first come, first served: groups queue for slots in the order their first member asked;
//   only the group at the head of the queue is granted;
// - one answer: the first member to ask (the installer) is told to set the group up; every
//   other member waits until it decides, then gets that decision;
// - owners: every join is held by an owner (a control connection, or an in-process port); the
//   group's slots go back to the pool when its last member left or its owner went away, and
//   when its installer goes away before deciding, the group is refused;
// - leases: an owner whose going nobody would see (a member NIC on another host, reached only
//   through the network) holds a lease with keep-alive: when it is not renewed within its term,
//   the owner is released as if it went away, so a crashed member does not hold slots forever.
#pragma once

#include <spin/host/groups.hpp>
#include <spin/result.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace spin::emu {

/// One switch's registry. Thread-safe (one mutex; no call blocks).
class group_registry {
public:
  /// `name` names the switch in reasons ("s0 has 3 free slots of 256 ...").
  explicit group_registry(std::string name, host::slot_pool pool = {});

  /// An owner id for a holder in this process (control sessions use small numbers; these do
  /// not collide with them).
  static std::uint64_t local_owner() noexcept;

  /// The pool's state; with `set`, first sets its size. Errors: invalid_argument (`set` out of
  /// range: host::slot_pool), bad_state (`set` differs from the pool's size while groups hold
  /// or wait for slots; the message gives both sizes).
  result<host::pool_usage> pool(const std::optional<host::slot_pool>& set = std::nullopt);

  /// Member `me` of `j.members` asks to join (idempotent: asking again is how a member polls).
  /// The first member to ask becomes the installer. Errors: invalid_argument (no members, more
  /// than 65535, `me` not an index of them, slots 0; slots that differ from those of the group's
  /// first member), not_supported (a proof of the job secret that differs from the first
  /// member's: another job uses the id, or the members do not share one secret). A group is its id and its members: a group whose id another group (other
  /// members) holds here is refused, the same for each of its members, while it has any (the
  /// id is the switch engine's match bits, so two groups cannot share it on one switch).
  result<host::group_answer> join(std::uint64_t owner, const host::group_join& j, std::uint32_t me);
  /// The installer's decision (after join answered install; `granted` only then, a refusal also
  /// while the group still waits for slots). Errors: not_found (no such group), bad_state (not
  /// the installer, already decided, granted before the slots were reserved), invalid_argument
  /// (lease above 65536 words, reason above 1024 bytes).
  result<void> decide(std::uint64_t owner, const host::group_decision& d);
  /// Member `me` of `group` leaves; the last member's leave frees the group's slots. Unknown
  /// groups and members are ignored.
  void leave(std::uint64_t owner, std::uint32_t group, std::uint32_t me);
  /// Everything `owner` held: its members leave; the groups it was setting up are refused.
  void release(std::uint64_t owner);
  /// True while group `group` holds slots here (being set up, or granted).
  bool holds(std::uint32_t group) const;

  using clock = std::chrono::steady_clock;
  /// Gives `owner` a lease of `term` from `now` (replacing one it had): unless renewed within
  /// `term`, expire() releases it. Owners without a lease (a control connection, an in-process
  /// port: their going is seen at once) never expire. A `term` of 0 ends the lease (the owner
  /// stays). Errors: invalid_argument (`term` negative or above one hour).
  result<void> lease(std::uint64_t owner, std::chrono::nanoseconds term, clock::time_point now = clock::now());
  /// Renews `owner`'s lease for another term (a keep-alive; a join of a leased owner renews it
  /// too). False when the owner holds no lease: it never had one, or it expired, in which case
  /// everything it held was released.
  bool renew(std::uint64_t owner, clock::time_point now = clock::now());
  /// Releases (as release() does) every owner whose lease ran out before `now`; returns them,
  /// in ascending order.
  std::vector<std::uint64_t> expire(clock::time_point now = clock::now());

private:
  enum class stage : std::uint8_t { queued, installing, decided };
  struct entry {
    std::vector<std::uint32_t> members;
    std::uint32_t slots = 0;
    std::uint64_t proof = 0;
    stage st = stage::queued;
    bool holds = false;  // its slots are taken from the pool
    std::pair<std::uint64_t, std::uint32_t> installer;
    std::set<std::pair<std::uint64_t, std::uint32_t>> refs;  // (owner, member index)
    host::group_answer answer;  // once decided
  };
  host::group_answer waiting_answer(const entry& e) const;
  void refuse(std::uint32_t group, entry& e, std::string reason);
  void erase_if_empty(std::map<std::uint32_t, entry>::iterator it);
  void release_locked(std::uint64_t owner);
  struct lease_state {
    std::chrono::nanoseconds term{};
    clock::time_point until{};
  };

  std::string _name;
  mutable std::mutex _m;
  host::slot_pool _pool;
  std::uint32_t _free;
  std::map<std::uint32_t, entry> _groups;
  std::deque<std::uint32_t> _queue;  // queued groups, oldest first
  // Groups whose id another group (other members) holds here: refused while they have members.
  std::map<std::pair<std::uint32_t, std::vector<std::uint32_t>>, std::set<std::pair<std::uint64_t, std::uint32_t>>> _clashes;
  std::map<std::uint64_t, lease_state> _leases;  // leased owners
};

} // namespace spin::emu
