// The switch's group registry (spin/emu/groups.hpp).
#include <spin/emu/groups.hpp>

#include <algorithm>
#include <atomic>

namespace spin::emu {

namespace {
constexpr std::uint32_t max_slots = 32767;
constexpr std::size_t max_members = 65535;
constexpr std::size_t max_lease_words = 65536;
constexpr std::size_t max_reason_bytes = 1024;

error check_pool(const host::slot_pool& p) {
  if (p.slots < 1 || p.slots > max_slots) return fail(errc::invalid_argument, "slot pool: slots out of 1..32767");
  if (p.slot_bytes < 8 || p.slot_bytes > 4096 || p.slot_bytes % 8 != 0)
    return fail(errc::invalid_argument, "slot pool: slot_bytes must be a multiple of 8 in 8..4096");
  return error{};
}
} // namespace

group_registry::group_registry(std::string name, host::slot_pool pool) : _name(std::move(name)), _pool(pool), _free(pool.slots) {}

std::uint64_t group_registry::local_owner() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return (std::uint64_t{1} << 63) | next.fetch_add(1, std::memory_order_relaxed);
}

result<host::pool_usage> group_registry::pool(const std::optional<host::slot_pool>& set) {
  std::lock_guard l(_m);
  if (set && !(*set == _pool)) {
    if (auto e = check_pool(*set); e.code != errc::ok) return e;
    if (!_groups.empty())
      return fail(errc::bad_state, _name + "'s slot pool is " + std::to_string(_pool.slots) + " slots of " +
                                       std::to_string(_pool.slot_bytes) + " bytes and " + std::to_string(_groups.size()) +
                                       " groups use it; it cannot become " + std::to_string(set->slots) + " slots of " +
                                       std::to_string(set->slot_bytes) + " bytes until they are gone");
    _pool = *set;
    _free = _pool.slots;
  }
  host::pool_usage u;
  u.pool = _pool;
  u.free = _free;
  for (const auto& [id, e] : _groups) u.groups += e.holds ? 1 : 0;
  u.waiting = static_cast<std::uint32_t>(_queue.size());
  return u;
}

host::group_answer group_registry::waiting_answer(const entry& e) const {
  host::group_answer a;
  a.state = host::join_state::wait;
  if (e.st == stage::installing) {
    a.reason = "the group's first member is setting it up on " + _name;
    return a;
  }
  std::uint32_t holders = 0;
  for (const auto& [id, g] : _groups) holders += g.holds ? 1 : 0;
  a.reason = _name + " has " + std::to_string(_free) + " free slots of " + std::to_string(_pool.slots) + " (" +
             std::to_string(holders) + " groups hold the rest); the group asks for " + std::to_string(e.slots);
  if (!_queue.empty() && &_groups.at(_queue.front()) != &e)
    a.reason += ", and groups that asked earlier wait before it";
  return a;
}

result<host::group_answer> group_registry::join(std::uint64_t owner, const host::group_join& j, std::uint32_t me) {
  if (j.members.empty() || j.members.size() > max_members)
    return fail(errc::invalid_argument, "group " + std::to_string(j.group) + ": 1..65535 members");
  if (me >= j.members.size())
    return fail(errc::invalid_argument, "group " + std::to_string(j.group) + ": member index " + std::to_string(me) + " of " +
                                            std::to_string(j.members.size()) + " members");
  if (j.slots < 1 || j.slots > max_slots) return fail(errc::invalid_argument, "group " + std::to_string(j.group) + ": slots out of 1..32767");
  std::lock_guard l(_m);
  if (auto ls = _leases.find(owner); ls != _leases.end()) ls->second.until = clock::now() + ls->second.term;
  if (auto c = _clashes.find({j.group, j.members}); c != _clashes.end()) {  // refused before: still
    c->second.insert({owner, me});
    host::group_answer a;
    a.state = host::join_state::refused;
    a.reason = "group id " + std::to_string(j.group) + " is held on " + _name +
               " by another group (other members); groups that share a switch need different ids";
    return a;
  }
  auto it = _groups.find(j.group);
  if (it == _groups.end()) {
    entry e;
    e.members = j.members;
    e.slots = j.slots;
    e.proof = j.proof;
    e.installer = {owner, me};
    if (j.slots > _pool.slots) {
      // Decided at once, the same for every member.
      e.st = stage::decided;
      e.answer.state = host::join_state::refused;
      e.answer.reason = "the group asks for " + std::to_string(j.slots) + " slots; " + _name + " has " + std::to_string(_pool.slots);
    } else {
      _queue.push_back(j.group);
    }
    it = _groups.emplace(j.group, std::move(e)).first;
  } else if (it->second.members != j.members) {
    _clashes[{j.group, j.members}].insert({owner, me});
    host::group_answer a;
    a.state = host::join_state::refused;
    a.reason = "group id " + std::to_string(j.group) + " is held on " + _name +
               " by another group (other members); groups that share a switch need different ids";
    return a;
  } else if (it->second.proof != j.proof) {
    return fail(errc::not_supported, "group " + std::to_string(j.group) + " on " + _name +
                                         ": this member's proof of the job secret differs from the first member's (another job "
                                         "uses this group id, or the members do not share one secret)");
  } else if (it->second.slots != j.slots) {
    return fail(errc::invalid_argument, "group " + std::to_string(j.group) + " on " + _name +
                                            ": this member's slots differ from the first member's");
  }
  entry& e = it->second;
  e.refs.insert({owner, me});
  const bool first = e.installer == std::pair{owner, me};
  if (e.st == stage::decided) {
    host::group_answer a = e.answer;
    a.installer = first;
    return a;
  }
  if (e.st == stage::queued && first && _queue.front() == j.group && _free >= e.slots) {
    _queue.pop_front();
    _free -= e.slots;
    e.holds = true;
    e.st = stage::installing;
    host::group_answer a;
    a.state = host::join_state::install;
    a.installer = true;
    return a;
  }
  host::group_answer a = waiting_answer(e);
  a.installer = first;
  return a;
}

void group_registry::refuse(std::uint32_t group, entry& e, std::string reason) {
  if (e.holds) _free += e.slots;
  e.holds = false;
  if (e.st == stage::queued) std::erase(_queue, group);
  e.st = stage::decided;
  e.answer = {};
  e.answer.state = host::join_state::refused;
  e.answer.reason = std::move(reason);
}

result<void> group_registry::decide(std::uint64_t owner, const host::group_decision& d) {
  if (d.lease.size() > max_lease_words) return fail(errc::invalid_argument, "group decision: more than 65536 lease words");
  if (d.reason.size() > max_reason_bytes) return fail(errc::invalid_argument, "group decision: a reason above 1024 bytes");
  std::lock_guard l(_m);
  auto it = _groups.find(d.group);
  if (it == _groups.end()) return fail(errc::not_found, "group " + std::to_string(d.group) + " is not known on " + _name);
  entry& e = it->second;
  if (e.installer.first != owner || !e.refs.contains(e.installer))
    return fail(errc::bad_state, "group " + std::to_string(d.group) + " on " + _name + ": only its first member decides");
  if (e.st == stage::decided) return fail(errc::bad_state, "group " + std::to_string(d.group) + " on " + _name + " is already decided");
  if (d.granted) {
    if (e.st != stage::installing)
      return fail(errc::bad_state, "group " + std::to_string(d.group) + " on " + _name + " holds no slots yet");
    e.st = stage::decided;
    e.answer = {};
    e.answer.state = host::join_state::granted;
    e.answer.lease = d.lease;
    return {};
  }
  refuse(d.group, e, d.reason.empty() ? "refused by its first member" : d.reason);
  return {};
}

void group_registry::erase_if_empty(std::map<std::uint32_t, entry>::iterator it) {
  entry& e = it->second;
  if (!e.refs.empty()) return;
  if (e.holds) _free += e.slots;
  if (e.st == stage::queued) std::erase(_queue, it->first);
  _groups.erase(it);
}

void group_registry::leave(std::uint64_t owner, std::uint32_t group, std::uint32_t me) {
  std::lock_guard l(_m);
  for (auto c = _clashes.lower_bound({group, {}}); c != _clashes.end() && c->first.first == group;) {
    c->second.erase({owner, me});
    c = c->second.empty() ? _clashes.erase(c) : std::next(c);
  }
  auto it = _groups.find(group);
  if (it == _groups.end()) return;
  entry& e = it->second;
  e.refs.erase({owner, me});
  if (e.st != stage::decided && e.installer == std::pair{owner, me})
    refuse(group, e, "the group's first member left before it finished setting the group up");
  erase_if_empty(it);
}

void group_registry::release(std::uint64_t owner) {
  std::lock_guard l(_m);
  release_locked(owner);
}

void group_registry::release_locked(std::uint64_t owner) {
  _leases.erase(owner);
  for (auto c = _clashes.begin(); c != _clashes.end();) {
    std::erase_if(c->second, [&](const auto& r) { return r.first == owner; });
    c = c->second.empty() ? _clashes.erase(c) : std::next(c);
  }
  for (auto it = _groups.begin(); it != _groups.end();) {
    auto next = std::next(it);
    entry& e = it->second;
    std::erase_if(e.refs, [&](const auto& r) { return r.first == owner; });
    if (e.st != stage::decided && e.installer.first == owner)
      refuse(it->first, e, "the group's first member went away before it finished setting the group up");
    erase_if_empty(it);
    it = next;
  }
}

bool group_registry::holds(std::uint32_t group) const {
  std::lock_guard l(_m);
  auto it = _groups.find(group);
  return it != _groups.end() && it->second.holds;
}

result<void> group_registry::lease(std::uint64_t owner, std::chrono::nanoseconds term, clock::time_point now) {
  if (term < std::chrono::nanoseconds::zero() || term > std::chrono::hours(1))
    return fail(errc::invalid_argument, "a lease's term must be in 0 ns..1 h");
  std::lock_guard l(_m);
  if (term == std::chrono::nanoseconds::zero()) {
    _leases.erase(owner);
    return {};
  }
  _leases[owner] = lease_state{term, now + term};
  return {};
}

bool group_registry::renew(std::uint64_t owner, clock::time_point now) {
  std::lock_guard l(_m);
  auto it = _leases.find(owner);
  if (it == _leases.end()) return false;
  it->second.until = now + it->second.term;
  return true;
}

std::vector<std::uint64_t> group_registry::expire(clock::time_point now) {
  std::lock_guard l(_m);
  std::vector<std::uint64_t> gone;
  for (const auto& [owner, ls] : _leases)
    if (ls.until < now) gone.push_back(owner);
  for (std::uint64_t owner : gone) release_locked(owner);
  return gone;
}

} // namespace spin::emu
