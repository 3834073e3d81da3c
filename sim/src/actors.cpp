// spin::sim: host programs as actors. Each runs on a thread of its own, but the simulation
// hands over to one actor at a time and takes back control when it waits (a semaphore each
// way), so what the actors do is ordered by virtual time alone, whatever the OS schedules.
#include "impl.hpp"
#include "vnic.hpp"

#include <algorithm>

namespace spin::sim {
namespace {
thread_local actor* self = nullptr;
thread_local cluster::impl* self_sim = nullptr;
} // namespace

void cluster::spawn(std::string name, std::function<void()> body) {
  impl& s = *_p;
  auto a = std::make_unique<actor>();
  a->name = std::move(name);
  a->body = std::move(body);
  actor* ap = a.get();
  s.actors.push_back(std::move(a));
  ++s.alive;
  ap->th = std::thread([&s, ap] {
    ap->go.acquire();
    self = ap;
    self_sim = &s;
    if (ap->body) {
      try {
        ap->body();
      } catch (const std::exception& e) {
        ap->failure = std::string("threw: ") + e.what();
      } catch (...) {
        ap->failure = "threw an exception";
      }
    }
    self = nullptr;
    self_sim = nullptr;
    ap->done = true;
    --s.alive;
    s.back.release();
  });
  s.make_runnable(*ap);
}

void cluster::impl::make_runnable(actor& a) {
  if (a.runnable || a.done) return;
  a.runnable = true;
  runnable.push_back(&a);
}

void cluster::impl::resume(actor& a) {
  ++switches;
  a.runnable = false;
  a.started = true;
  a.go.release();
  back.acquire();
}

void cluster::impl::host_visible(std::uint32_t n, rt::ec_id ec) {
  impl_node& nd = *nodes[n];
  ++nd.visible[ec];
  for (std::size_t i = 0; i < nd.waiters.size();) {
    actor* w = nd.waiters[i];
    if (w->wait_ec != ec) {
      ++i;
      continue;
    }
    nd.waiters.erase(nd.waiters.begin() + static_cast<std::ptrdiff_t>(i));
    ++w->token;  // its timeout no longer applies
    make_runnable(*w);
  }
}

void cluster::impl::actor_timeout(std::uint32_t ai, std::uint64_t token) {
  actor& w = *actors[ai];
  if (token != w.token || w.done || w.runnable) return;
  if (w.meeting != nullptr) {
    auto it = meetings.find(*w.meeting);
    auto& ws = it->second.waiting;
    ws.erase(std::remove(ws.begin(), ws.end(), &w), ws.end());
    w.meeting = nullptr;
    w.met = cluster::meet_result::timed_out;
    if (ws.empty()) meetings.erase(it);
  } else {
    auto& ws = nodes[static_cast<std::size_t>(w.wait_node)]->waiters;
    ws.erase(std::remove(ws.begin(), ws.end(), &w), ws.end());
  }
  ++w.token;
  make_runnable(w);
}

void cluster::impl::end_meeting(std::map<std::string, meeting>::iterator it, cluster::meet_result why) {
  for (actor* w : it->second.waiting) {
    w->meeting = nullptr;
    w->met = why;
    ++w->token;  // its timeout no longer applies
    make_runnable(*w);
  }
  meetings.erase(it);
}

cluster::meet_result cluster::meet(const std::string& key, std::uint32_t count, std::chrono::nanoseconds timeout) {
  impl& s = *_p;
  if (self == nullptr || self_sim != &s || s.cancelling) return meet_result::cancelled;
  auto [it, fresh] = s.meetings.try_emplace(key);
  if (fresh) it->second.count = std::max<std::uint32_t>(1, count);
  if (it->second.waiting.size() + 1 >= it->second.count) {
    s.end_meeting(it, meet_result::met);
    return meet_result::met;
  }
  actor& me = *self;
  me.meeting = &it->first;  // std::map keys stay put
  me.met = meet_result::cancelled;
  me.wait_node = -1;
  ++me.token;
  it->second.waiting.push_back(&me);
  const auto t = static_cast<std::uint64_t>(std::max<std::int64_t>(0, timeout.count()));
  const ps deadline = t > (UINT64_MAX - s.now) / 1000 ? UINT64_MAX : s.now + t * 1000;
  const auto idx = static_cast<std::uint32_t>(
      std::find_if(s.actors.begin(), s.actors.end(), [&](const auto& a) { return a.get() == &me; }) - s.actors.begin());
  if (deadline != UINT64_MAX) s.schedule(deadline, ev::actor_timeout, idx, me.token);
  s.back.release();  // the simulation goes on
  me.go.acquire();   // until the meeting, its deadline or a cancel resumes this actor
  if (s.cancelling) {
    if (me.meeting != nullptr) {  // the cluster is going away with this actor still waiting
      auto m = s.meetings.find(*me.meeting);
      auto& ws = m->second.waiting;
      ws.erase(std::remove(ws.begin(), ws.end(), &me), ws.end());
      me.meeting = nullptr;
      if (ws.empty()) s.meetings.erase(m);
    }
    return meet_result::cancelled;
  }
  return me.met;
}

void cluster::cancel_meeting(const std::string& key) {
  impl& s = *_p;
  if (auto it = s.meetings.find(key); it != s.meetings.end()) s.end_meeting(it, meet_result::cancelled);
}

void cluster::release_meeting(const std::string& key) {
  impl& s = *_p;
  if (auto it = s.meetings.find(key); it != s.meetings.end()) s.end_meeting(it, meet_result::met);
}

bool cluster::impl::wait_visible(std::uint32_t n, rt::ec_id ec, ps deadline) {
  impl_node& nd = *nodes[n];
  auto visible = [&] {
    auto it = nd.visible.find(ec);
    return it != nd.visible.end() && it->second > 0;
  };
  if (cancelling) return false;
  if (self == nullptr || self_sim != this) {
    // A thread that is not an actor, while run() does not run: it drives the simulation itself,
    // running events until an event is visible or the deadline; with nothing left to run, time
    // jumps to the deadline (not to the end of time: an endless wait on an idle cluster returns).
    if (running) return false;  // another thread runs the simulation: this one may not wait (nic_control doc)
    while (!visible() && now < deadline) {
      drop_stale();
      if (heap.empty() || heap.front().t > deadline) {
        if (deadline == UINT64_MAX) return false;
        now = std::max(now, deadline);
        break;
      }
      step();
    }
    return true;
  }
  if (visible()) return true;
  actor& me = *self;
  me.wait_node = n;
  me.wait_ec = ec;
  me.deadline = deadline;
  ++me.token;
  nd.waiters.push_back(&me);
  const auto idx = static_cast<std::uint32_t>(
      std::find_if(actors.begin(), actors.end(), [&](const auto& a) { return a.get() == &me; }) - actors.begin());
  if (deadline != UINT64_MAX) schedule(deadline, ev::actor_timeout, idx, me.token);
  back.release();  // the simulation goes on
  me.go.acquire();  // until it resumes this actor
  return !cancelling;
}

result<void> cluster::run(picoseconds limit) {
  impl& s = *_p;
  s.running = true;
  auto finish = [&](result<void> r) {
    s.running = false;
    for (auto& a : s.actors)
      if (a->done && a->th.joinable()) a->th.join();
    for (auto& a : s.actors)
      if (a->done && !a->failure.empty() && r.ok()) r = fail(errc::fault, "actor " + a->name + " " + a->failure);
    return r;
  };
  for (;;) {
    if (s.between) s.between();
    if (!s.runnable.empty()) {
      actor* a = s.runnable.front();
      s.runnable.pop_front();
      s.resume(*a);
      continue;
    }
    s.drop_stale();
    if (s.heap.empty()) {
      if (s.alive == 0) break;
      std::string names;
      for (auto& a : s.actors)
        if (!a->done) names += (names.empty() ? "" : ", ") + a->name;
      return finish(fail(errc::bad_state, "virtual time: actors " + names + " wait without a deadline and no event is left"));
    }
    if (s.heap.front().t > limit.count())
      return finish(fail(errc::timeout, "virtual time: the limit of " + std::to_string(limit.count()) + " ps was reached"));
    s.step();
  }
  return finish({});
}

void cluster::set_between_events(std::function<void()> hook) { _p->between = std::move(hook); }

} // namespace spin::sim
