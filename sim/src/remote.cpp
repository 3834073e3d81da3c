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
#include <limits>
#include <set>
#include <string>

namespace spin::sim {

namespace {
constexpr int no_slot = -1;
} // namespace

namespace {
thread_local int current_slot = no_slot;  // the slot whose actor runs on this thread
thread_local const remote_hosts::state* current_state = nullptr;
} // namespace

struct remote_hosts::state {
  cluster& c;
  std::vector<std::uint32_t> hosts;  // node index per slot

  /// A point-to-point message's envelope on its way or waiting for a receive.
  struct envelope {
    std::uint32_t source = 0;  // node
    std::uint64_t bits = 0, bytes = 0;
    int sender = no_slot;
    std::uint64_t sender_generation = 0;
    std::uint64_t sync = 0;    // the sender's id of a synchronous send; 0: none
  };
  struct posted_recv {
    std::uint64_t id = 0;
    std::uint32_t source = host::protocol::any_source;
    std::uint64_t bits = 0, ignore = 0;
    bool accepts(const envelope& e) const noexcept {
      return (source == host::protocol::any_source || source == e.source) && ((bits ^ e.bits) & ~ignore) == 0;
    }
  };

  /// One host node's actor of the current round.
  struct slot {
    pid_t pid = 0;                       // the bound process; 0: none yet
    bool served = false;                 // a process was bound in this round
    bool alive = false;                  // its actor runs in this round
    std::deque<std::function<void()>> mailbox;
    std::set<std::uint64_t> sessions;    // open attached connections of the bound process
    // point-to-point envelopes for this node (p2p_*)
    std::vector<posted_recv> posted;     // in post order
    std::deque<envelope> unexpected;     // arrived, not matched: in arrival order
    std::set<std::uint64_t> pending;     // ids posted or sent synchronously, not complete
    std::map<std::uint64_t, host::protocol::p2p_match> complete;  // complete, not yet reported
    std::string parked;                  // the meeting its p2p wait or probe waits in; empty: none
    std::uint64_t parks = 0;
    std::uint64_t matches = 0;           // receives matched so far (p2p_match::order)
    std::uint64_t generation = 0;        // changes when a round starts or its program leaves
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
  /// Forgets a slot's point-to-point state: its program left, or a round starts.
  static void clear_p2p(slot& sl) {
    sl.posted.clear();
    sl.unexpected.clear();
    sl.pending.clear();
    sl.complete.clear();
    sl.parked.clear();
    sl.matches = 0;
    ++sl.generation;
  }

  /// The slot of the host program whose request runs on this thread, or an error. `lk` held.
  result<int> bound_slot(std::uint64_t session, const char* op) const {
    auto it = sessions.find(session);
    if (current_state != this || it == sessions.end() || it->second.slot == no_slot || it->second.slot != current_slot)
      return fail(errc::bad_state, std::string(op) + ": this connection's process is not bound to a host node (attach first)");
    return it->second.slot;
  }
  /// The slot of host node `n`, or an error naming `op`.
  result<int> slot_of(std::uint32_t n, const char* op) const {
    const auto at = std::find(hosts.begin(), hosts.end(), n);
    if (at == hosts.end())
      return fail(errc::invalid_argument, std::string(op) + ": node " + std::to_string(n) +
                                              " has no host program in virtual time (a switch, a host beyond --actors, or no such node)");
    return static_cast<int>(at - hosts.begin());
  }
  /// Wakes the slot's program if it waits in p2p_wait or p2p_probe (it looks again). `mu` held.
  void wake(slot& sl) {
    if (sl.parked.empty()) return;
    const std::string key = std::move(sl.parked);
    sl.parked.clear();
    c.release_meeting(key);
  }
  /// Receive `id` of slot `dst` matched `e`: complete it, and acknowledge a synchronous send.
  /// On an actor's thread or in an event; `mu` held.
  void matched(int dst, std::uint64_t id, const envelope& e) {
    slot& sl = slots[static_cast<std::size_t>(dst)];
    sl.pending.erase(id);
    sl.complete[id] = host::protocol::p2p_match{id, e.source, e.bits, e.bytes, sl.matches++};
    ++st.p2p_matched;
    wake(sl);
    if (e.sync == 0) return;
    // Word of the match goes back to the sender as a packet of its own.
    (void)c.send_host_traffic(hosts[static_cast<std::size_t>(dst)], e.source, 0, [this, e] {
      std::lock_guard lk(mu);
      slot& snd = slots[static_cast<std::size_t>(e.sender)];
      if (snd.generation != e.sender_generation || !snd.pending.contains(e.sync)) return;  // it left
      snd.pending.erase(e.sync);
      snd.complete[e.sync] = host::protocol::p2p_match{e.sync, e.source, e.bits, e.bytes};
      wake(snd);
    });
  }
  /// Envelopes from one slot to another, delivered in the order they were sent.
  struct pair_order {
    std::uint64_t sent = 0, delivered = 0;
    std::map<std::uint64_t, envelope> held;  // arrived before an earlier one, by send number
  };
  std::map<std::pair<int, int>, pair_order> pairs;  // (sender, destination) slots; cleared each round
  /// Envelope `e` has arrived at slot `dst`: the earliest posted receive that accepts it takes
  /// it, else it waits with the unexpected ones. `mu` held.
  void deliver(int dst, const envelope& e) {
    slot& sl = slots[static_cast<std::size_t>(dst)];
    for (auto it = sl.posted.begin(); it != sl.posted.end(); ++it)
      if (it->accepts(e)) {
        const std::uint64_t id = it->id;
        sl.posted.erase(it);
        matched(dst, id, e);
        return;
      }
    sl.unexpected.push_back(e);
    wake(sl);  // a probe may wait for it
  }
  /// Waits in virtual time, on the actor's thread, until `ready()` or `deadline`; `lk` held on
  /// entry and return. False: spin-emu is stopping.
  bool park(int me, std::unique_lock<std::mutex>& lk, picoseconds deadline, const std::function<bool()>& ready) {
    slot& sl = slots[static_cast<std::size_t>(me)];
    while (!ready()) {
      const picoseconds now = c.now();
      if (now >= deadline) return true;
      const std::string key = "p2p/" + std::to_string(me) + "/" + std::to_string(++sl.parks);
      sl.parked = key;
      const auto left = std::chrono::ceil<std::chrono::nanoseconds>(deadline - now);
      lk.unlock();
      const auto how = c.meet(key, std::numeric_limits<std::uint32_t>::max(), left);
      lk.lock();
      if (sl.parked == key) sl.parked.clear();
      if (how == cluster::meet_result::cancelled) return false;
    }
    return true;
  }
};


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
  clear_p2p(s);
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
      state::clear_p2p(sl);
    }
    s.pairs.clear();
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

// ---- point-to-point envelopes ----------------------------------------------------------------

namespace proto = host::protocol;

result<void> remote_hosts::p2p_send(std::uint64_t session, const proto::p2p_send& q) {
  state& s = *_s;
  std::lock_guard lk(s.mu);
  auto me = s.bound_slot(session, "p2p_send");
  if (!me) return me.err();
  auto dst = s.slot_of(q.dest, "p2p_send");
  if (!dst) return dst.err();
  state::slot& from = s.slots[static_cast<std::size_t>(*me)];
  state::slot& to = s.slots[static_cast<std::size_t>(*dst)];
  if (to.served && (!to.alive || to.sessions.empty()))
    return fail(errc::bad_state, "p2p_send: the host program of node " + std::to_string(q.dest) + " (" +
                                     s.c.topo().nodes[q.dest].name + ") has left this round");
  if (q.id != 0 && (from.pending.contains(q.id) || from.complete.contains(q.id)))
    return fail(errc::exists, "p2p_send: id " + std::to_string(q.id) + " is pending already");
  const std::uint32_t src_node = s.hosts[static_cast<std::size_t>(*me)];
  state::envelope e{src_node, q.match_bits, q.bytes, *me, from.generation, q.id};
  const int d = *dst;
  const std::uint64_t gen = to.generation;
  // The message's bytes cross the network as packets (the envelope arrives with the last).
  // The bytes cross the network as packets; the envelope arrives with the last of them, but
  // never before an earlier message of the same sender to the same node (MPI's
  // non-overtaking: a small message's packets may pass a large one's on the way).
  state::pair_order& order = s.pairs[{*me, d}];
  const std::uint64_t seq = order.sent;
  auto sent = s.c.send_host_traffic(src_node, q.dest, q.bytes, [&s, me = *me, d, gen, seq, e] {
    std::lock_guard g(s.mu);
    if (s.slots[static_cast<std::size_t>(d)].generation != gen) {  // its program left (or the round ended) meanwhile
      ++s.st.p2p_dropped;
      return;
    }
    state::pair_order& o = s.pairs[{me, d}];
    o.held.emplace(seq, e);
    while (!o.held.empty() && o.held.begin()->first == o.delivered) {
      s.deliver(d, o.held.begin()->second);
      o.held.erase(o.held.begin());
      ++o.delivered;
    }
  });
  if (!sent) return sent.err();
  ++order.sent;
  if (q.id != 0) from.pending.insert(q.id);
  ++s.st.p2p_messages;
  return {};
}

result<void> remote_hosts::p2p_recv(std::uint64_t session, const proto::p2p_recv& q) {
  state& s = *_s;
  std::lock_guard lk(s.mu);
  auto me = s.bound_slot(session, "p2p_recv");
  if (!me) return me.err();
  if (q.source != proto::any_source)
    if (auto src = s.slot_of(q.source, "p2p_recv"); !src) return src.err();
  state::slot& sl = s.slots[static_cast<std::size_t>(*me)];
  if (sl.pending.contains(q.id) || sl.complete.contains(q.id))
    return fail(errc::exists, "p2p_recv: id " + std::to_string(q.id) + " is pending already");
  const state::posted_recv r{q.id, q.source, q.match_bits, q.ignore_bits};
  sl.pending.insert(q.id);
  for (auto it = sl.unexpected.begin(); it != sl.unexpected.end(); ++it)
    if (r.accepts(*it)) {
      const state::envelope e = *it;
      sl.unexpected.erase(it);
      s.matched(*me, q.id, e);
      return {};
    }
  sl.posted.push_back(r);
  return {};
}

result<std::vector<proto::p2p_match>> remote_hosts::p2p_wait(std::uint64_t session, const proto::p2p_wait& q) {
  state& s = *_s;
  std::unique_lock lk(s.mu);
  auto me = s.bound_slot(session, "p2p_wait");
  if (!me) return me.err();
  state::slot& sl = s.slots[static_cast<std::size_t>(*me)];
  for (std::uint64_t id : q.ids)
    if (!sl.pending.contains(id) && !sl.complete.contains(id))
      return fail(errc::not_found, "p2p_wait: id " + std::to_string(id) + " is not a pending receive or synchronous send");
  auto complete = [&] {
    std::uint32_t n = 0;
    for (std::uint64_t id : q.ids) n += sl.complete.contains(id) ? 1 : 0;
    return n;
  };
  if (q.timeout.count() > 0) {
    const auto wait = std::min<std::chrono::nanoseconds>(q.timeout, max_wait);
    const picoseconds deadline = s.c.now() + std::chrono::duration_cast<picoseconds>(wait);
    if (!s.park(*me, lk, deadline, [&] { return complete() >= q.need; }))
      return fail(errc::bad_state, "p2p_wait: spin-emu is stopping");
    if (complete() < q.need)
      return fail(errc::timeout, "p2p_wait: " + std::to_string(q.need - complete()) + " of the operations waited for are not complete after " +
                                     std::to_string(wait.count()) + " ns of virtual time (no message came that matches)");
  }
  std::vector<proto::p2p_match> out;
  for (std::uint64_t id : q.ids)
    if (auto it = sl.complete.find(id); it != sl.complete.end()) {
      out.push_back(it->second);
      sl.complete.erase(it);
    }
  return out;
}

result<std::vector<proto::p2p_match>> remote_hosts::p2p_probe(std::uint64_t session, const proto::p2p_probe& q) {
  state& s = *_s;
  std::unique_lock lk(s.mu);
  auto me = s.bound_slot(session, "p2p_probe");
  if (!me) return me.err();
  if (q.source != proto::any_source)
    if (auto src = s.slot_of(q.source, "p2p_probe"); !src) return src.err();
  state::slot& sl = s.slots[static_cast<std::size_t>(*me)];
  const state::posted_recv r{0, q.source, q.match_bits, q.ignore_bits};
  auto first = [&] { return std::find_if(sl.unexpected.begin(), sl.unexpected.end(), [&](const auto& e) { return r.accepts(e); }); };
  if (q.timeout.count() > 0) {
    const auto wait = std::min<std::chrono::nanoseconds>(q.timeout, max_wait);
    const picoseconds deadline = s.c.now() + std::chrono::duration_cast<picoseconds>(wait);
    if (!s.park(*me, lk, deadline, [&] { return first() != sl.unexpected.end(); }))
      return fail(errc::bad_state, "p2p_probe: spin-emu is stopping");
  }
  std::vector<proto::p2p_match> out;
  if (auto it = first(); it != sl.unexpected.end()) out.push_back(proto::p2p_match{0, it->source, it->bits, it->bytes});
  return out;
}

} // namespace spin::sim
