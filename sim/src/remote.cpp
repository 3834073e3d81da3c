// Host programs of other processes as actors (spin/sim/remote.hpp): each host node's actor runs
// the requests of the process bound to it; requests of everyone else run where the simulation
// stands still.
#include <spin/sim/remote.hpp>

#include <spin/emu/topology.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace spin::sim {

namespace {
constexpr int no_slot = -1;
} // namespace

struct remote_hosts::state {
  cluster& c;
  std::vector<std::uint32_t> hosts;  // node index per slot

  /// One host node's actor of the current round.
  struct slot {
    pid_t pid = 0;                       // the bound process; 0: none yet
    bool served = false;                 // a process was bound in this round
    bool alive = false;                  // its actor runs in this round
    std::deque<std::function<void()>> mailbox;
    std::set<std::uint64_t> sessions;    // open attached connections of the bound process
  };
  /// An attached connection.
  struct session {
    pid_t pid = 0;
    int slot = no_slot;  // its process's slot once bound
  };

  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<slot> slots;
  std::deque<std::function<void()>> general;  // requests that run where the simulation stands still
  std::atomic<bool> has_general{false};       // !general.empty(), read without the lock between events
  std::map<std::uint64_t, session> sessions;
  std::map<pid_t, int> bound;                 // process -> slot, this round
  /// A barrier that waits: its member slots, and the reply of each member that came.
  struct meeting {
    std::vector<int> slots;
    std::vector<const std::function<void()>*> replies;  // on the waiting members' stacks
  };
  std::map<std::string, meeting> meetings;
  bool stopping = false;
  bool first_round = true;
  remote_stats st;

  state(cluster& cl, std::vector<std::uint32_t> h) : c(cl), hosts(std::move(h)), slots(hosts.size()) {}

  /// Runs the general jobs while the caller stands in for the simulation. `lk` is held on entry
  /// and on return.
  void drain_general(std::unique_lock<std::mutex>& lk) {
    while (!general.empty()) {
      auto job = std::move(general.front());
      general.pop_front();
      has_general.store(!general.empty(), std::memory_order_relaxed);
      ++st.other_requests;
      lk.unlock();
      job();
      lk.lock();
    }
  }

  void serve(int me);
};

namespace {
thread_local int current_slot = no_slot;  // the slot whose actor runs on this thread
thread_local const remote_hosts::state* current_state = nullptr;
} // namespace

// One host node's actor: it holds the simulation while it waits for its process (to bind, and
// then for each next request) and gives it up only inside a request that waits.
void remote_hosts::state::serve(int me) {
  current_slot = me;
  current_state = this;
  std::unique_lock lk(mu);
  slot& s = slots[static_cast<std::size_t>(me)];
  for (;;) {
    drain_general(lk);
    if (!s.mailbox.empty()) {
      auto job = std::move(s.mailbox.front());
      s.mailbox.pop_front();
      ++st.actor_requests;
      lk.unlock();
      job();
      lk.lock();
      continue;
    }
    if (s.served && s.sessions.empty()) break;  // its process closed every attached connection
    if (stopping) break;
    cv.wait(lk);
  }
  // Barriers that wait for this program can no longer meet.
  for (auto it = meetings.begin(); it != meetings.end();) {
    if (std::find(it->second.slots.begin(), it->second.slots.end(), me) != it->second.slots.end()) {
      c.cancel_meeting(it->first);
      it = meetings.erase(it);
    } else {
      ++it;
    }
  }
  if (s.pid != 0) bound.erase(s.pid);
  s.pid = 0;
  s.alive = false;
  s.mailbox.clear();
  current_slot = no_slot;
  current_state = nullptr;
}

remote_hosts::remote_hosts(cluster& c, std::vector<std::uint32_t> hosts) : _s(std::make_unique<state>(c, std::move(hosts))) {
  c.set_between_events([s = _s.get()] {
    if (!s->has_general.load(std::memory_order_relaxed)) return;
    std::unique_lock lk(s->mu);
    s->drain_general(lk);
  });
}

remote_hosts::~remote_hosts() {
  stop();
  _s->c.set_between_events(nullptr);
}

result<std::unique_ptr<remote_hosts>> remote_hosts::create(cluster& c, std::vector<std::uint32_t> hosts) {
  if (hosts.empty()) return fail(errc::invalid_argument, "virtual time: no host node to serve");
  const auto& t = c.topo();
  std::set<std::uint32_t> seen;
  for (std::uint32_t h : hosts) {
    if (h >= t.nodes.size())
      return fail(errc::invalid_argument, "virtual time: node " + std::to_string(h) + " does not exist (" +
                                              std::to_string(t.nodes.size()) + " nodes)");
    if (t.nodes[h].kind != emu::node_kind::host)
      return fail(errc::invalid_argument, "virtual time: node " + std::to_string(h) + " (" + t.nodes[h].name + ") is not a host");
    if (!seen.insert(h).second) return fail(errc::invalid_argument, "virtual time: node " + std::to_string(h) + " is named twice");
  }
  return std::unique_ptr<remote_hosts>(new remote_hosts(c, std::move(hosts)));
}

void remote_hosts::spawn_round() {
  state& s = *_s;
  {
    std::lock_guard lk(s.mu);
    if (!s.first_round) ++s.st.rounds;
    s.first_round = false;
    s.bound.clear();
    for (auto& sl : s.slots) {
      sl.pid = 0;
      sl.served = false;
      sl.alive = true;
      sl.mailbox.clear();
      sl.sessions.clear();
    }
    // Sessions bound in the last round belong to processes that left; unbound ones stay.
    std::erase_if(s.sessions, [](const auto& e) { return e.second.slot != no_slot; });
  }
  for (std::size_t i = 0; i < s.slots.size(); ++i)
    s.c.spawn("host program of " + s.c.topo().nodes[s.hosts[i]].name, [&s, i] { s.serve(static_cast<int>(i)); });
}

void remote_hosts::stop() {
  std::lock_guard lk(_s->mu);
  _s->stopping = true;
  _s->general.clear();
  _s->has_general.store(false, std::memory_order_relaxed);
  _s->cv.notify_all();
}

std::vector<std::uint32_t> remote_hosts::unbound() const {
  std::lock_guard lk(_s->mu);
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < _s->slots.size(); ++i)
    if (!_s->slots[i].served) out.push_back(_s->hosts[i]);
  return out;
}

remote_stats remote_hosts::stats() const {
  std::lock_guard lk(_s->mu);
  return _s->st;
}

bool remote_hosts::submit(std::uint64_t session, std::function<void()> job) {
  state& s = *_s;
  std::lock_guard lk(s.mu);
  if (s.stopping) return false;
  auto it = s.sessions.find(session);
  if (it != s.sessions.end() && it->second.slot != no_slot) {
    state::slot& sl = s.slots[static_cast<std::size_t>(it->second.slot)];
    if (!sl.alive) return false;  // its actor ended (stopped): nothing would run it
    sl.mailbox.push_back(std::move(job));
  } else {
    s.general.push_back(std::move(job));
    s.has_general.store(true, std::memory_order_relaxed);
  }
  s.cv.notify_all();
  return true;
}

void remote_hosts::closed(std::uint64_t session, std::function<void()> release) {
  state& s = *_s;
  std::lock_guard lk(s.mu);
  auto it = s.sessions.find(session);
  const int slot = it == s.sessions.end() ? no_slot : it->second.slot;
  if (it != s.sessions.end()) s.sessions.erase(it);
  if (s.stopping) return;  // control_server::stop releases everything
  if (slot != no_slot && s.slots[static_cast<std::size_t>(slot)].alive) {
    // The process's last word on this connection, in its order: the release, then the actor
    // may end when no attached connection is left.
    state::slot& sl = s.slots[static_cast<std::size_t>(slot)];
    sl.mailbox.push_back([&s, slot, session, release = std::move(release)] {
      release();
      std::lock_guard g(s.mu);
      s.slots[static_cast<std::size_t>(slot)].sessions.erase(session);
    });
  } else {
    s.general.push_back(std::move(release));
    s.has_general.store(true, std::memory_order_relaxed);
  }
  s.cv.notify_all();
}

result<void> remote_hosts::attach(std::uint64_t session, pid_t pid, std::uint32_t node) {
  state& s = *_s;
  std::lock_guard lk(s.mu);
  if (s.stopping) return fail(errc::bad_state, "attach: spin-emu is stopping");
  if (s.sessions.contains(session)) return fail(errc::exists, "attach: this connection is attached already");
  // A process bound already: every further connection of it joins its actor.
  if (auto b = s.bound.find(pid); b != s.bound.end()) {
    s.sessions[session] = state::session{pid, b->second};
    s.slots[static_cast<std::size_t>(b->second)].sessions.insert(session);
    return {};
  }
  const auto at = std::find(s.hosts.begin(), s.hosts.end(), node);
  if (at == s.hosts.end()) {
    // Not a host node with an actor (a switch, or a host beyond the served ones): the
    // connection's requests run where the simulation stands still until its process binds.
    s.sessions[session] = state::session{pid, no_slot};
    return {};
  }
  const int slot = static_cast<int>(at - s.hosts.begin());
  state::slot& sl = s.slots[static_cast<std::size_t>(slot)];
  const std::string name = s.c.topo().nodes[node].name;
  if (sl.pid != 0)
    return fail(errc::exists, "attach: node " + std::to_string(node) + " (" + name + ") is driven by process " +
                                  std::to_string(sl.pid) + " in virtual time; one process per host node");
  if (sl.served || !sl.alive)
    return fail(errc::exists, "attach: node " + std::to_string(node) + " (" + name +
                                  ")'s host program of this round has ended; a new one can attach when every host program "
                                  "of the round has ended");
  sl.pid = pid;
  sl.served = true;
  s.bound[pid] = slot;
  ++s.st.processes;
  s.sessions[session] = state::session{pid, slot};
  sl.sessions.insert(session);
  // Its connections that attached before (to a switch) join the actor too.
  for (auto& [id, e] : s.sessions)
    if (e.pid == pid && e.slot == no_slot) {
      e.slot = slot;
      sl.sessions.insert(id);
    }
  s.cv.notify_all();
  return {};
}

bool remote_hosts::may_wait(std::uint64_t session) const noexcept {
  if (current_state != _s.get() || current_slot == no_slot) return false;
  std::lock_guard lk(_s->mu);
  auto it = _s->sessions.find(session);
  return it != _s->sessions.end() && it->second.slot == current_slot;
}

result<void> remote_hosts::barrier(std::uint64_t session, std::vector<std::uint32_t> nodes, std::uint64_t seq,
                                   const std::function<void()>& reply) {
  state& s = *_s;
  std::string key;
  std::uint32_t count = 0;
  std::vector<const std::function<void()>*> to_reply;  // filled when this member is the last
  {
    std::lock_guard lk(s.mu);
    auto it = s.sessions.find(session);
    if (current_state != &s || it == s.sessions.end() || it->second.slot == no_slot || it->second.slot != current_slot)
      return fail(errc::bad_state, "barrier: this connection's process is not bound to a host node (attach first)");
    const int mine = it->second.slot;
    std::sort(nodes.begin(), nodes.end());
    if (auto d = std::adjacent_find(nodes.begin(), nodes.end()); d != nodes.end())
      return fail(errc::invalid_argument, "barrier: node " + std::to_string(*d) + " is named twice");
    std::vector<int> member_slots;
    for (std::uint32_t n : nodes) {
      const auto at = std::find(s.hosts.begin(), s.hosts.end(), n);
      if (at == s.hosts.end())
        return fail(errc::invalid_argument, "barrier: node " + std::to_string(n) + " has no host program in virtual time (a switch, "
                                                "a host beyond --actors, or no such node)");
      const int slot = static_cast<int>(at - s.hosts.begin());
      const state::slot& sl = s.slots[static_cast<std::size_t>(slot)];
      if (slot != mine && sl.served && (!sl.alive || sl.sessions.empty()))
        return fail(errc::bad_state, "barrier: the host program of node " + std::to_string(n) + " (" + s.c.topo().nodes[n].name +
                                         ") has left this round");
      member_slots.push_back(slot);
    }
    if (std::find(member_slots.begin(), member_slots.end(), mine) == member_slots.end())
      return fail(errc::invalid_argument, "barrier: the members do not include this program's own node " +
                                              std::to_string(s.hosts[static_cast<std::size_t>(mine)]));
    for (std::uint32_t n : nodes) key += std::to_string(n) + ",";
    key += "#" + std::to_string(seq);
    count = static_cast<std::uint32_t>(nodes.size());
    auto [m, fresh] = s.meetings.try_emplace(key);
    if (fresh) m->second.slots = std::move(member_slots);
    m->second.replies.push_back(&reply);
    if (m->second.replies.size() == count) {
      to_reply = std::move(m->second.replies);
      s.meetings.erase(m);
    }
  }
  if (!to_reply.empty()) {
    // The last member: the meeting releases the others (they run when this actor hands over),
    // and every member's process learns now, at this virtual time.
    const auto how = s.c.meet(key, count, max_wait);
    if (how != cluster::meet_result::met)
      return fail(errc::bad_state, "barrier " + std::to_string(seq) + ": spin-emu is stopping");
    for (const auto* r : to_reply) (*r)();
    return {};
  }
  // On the actor's thread, which holds the simulation: the meeting hands it over.
  const auto how = s.c.meet(key, count, max_wait);
  std::lock_guard lk(s.mu);
  if (how == cluster::meet_result::timed_out)
    if (auto m = s.meetings.find(key); m != s.meetings.end()) std::erase(m->second.replies, &reply);
  switch (how) {
  case cluster::meet_result::met: return {};
  case cluster::meet_result::timed_out:
    return fail(errc::timeout, "barrier " + std::to_string(seq) + ": not every member came within 100 days of virtual time");
  case cluster::meet_result::cancelled: break;
  }
  return fail(errc::bad_state, "barrier " + std::to_string(seq) + ": a member's host program left (or spin-emu is stopping)");
}

} // namespace spin::sim
