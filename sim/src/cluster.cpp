// spin::sim: the event loop and the network (ports, links, switches' forwarding).
#include "impl.hpp"
#include "vnic.hpp"

#include <spin/rt/wire.hpp>

#include <algorithm>
#include <cmath>

namespace spin::sim {

// ---- events ------------------------------------------------------------------------------

void cluster::impl::schedule(ps t, ev k, std::uint32_t a, std::uint64_t b, frame* p) {
  if (k != ev::sample && k != ev::actor_timeout) {
    ++live_events;
    // Sampling stopped while nothing moved (every actor in a long wait): it resumes with the work.
    if (!sample_armed && opts.sample_interval.count() > 0) {
      const ps iv = opts.sample_interval.count();
      sample_armed = true;
      heap.push_back(event{(now / iv + 1) * iv, next_seq++, ev::sample, 0, 0, nullptr});
      std::push_heap(heap.begin(), heap.end(), event_later{});
    }
  }
  heap.push_back(event{std::max(t, now), next_seq++, k, a, b, p});
  std::push_heap(heap.begin(), heap.end(), event_later{});
}

void cluster::impl::drop_stale() {
  // A timeout of an actor that woke or ended meanwhile: gone without moving the clock.
  while (!heap.empty() && heap.front().kind == ev::actor_timeout) {
    const actor& w = *actors[heap.front().a];
    if (heap.front().b == w.token && !w.done && !w.runnable) return;
    std::pop_heap(heap.begin(), heap.end(), event_later{});
    heap.pop_back();
  }
}

bool cluster::impl::step() {
  drop_stale();
  if (heap.empty()) return false;
  std::pop_heap(heap.begin(), heap.end(), event_later{});
  const event e = heap.back();
  heap.pop_back();
  now = e.t;
  ++events_run;
  if (e.kind != ev::sample && e.kind != ev::actor_timeout) --live_events;
  run_event(e);
  return true;
}

void cluster::impl::run_event(const event& e) {
  switch (e.kind) {
  case ev::arrive: arrive(e.a, e.p); break;
  case ev::port_kick: port_kick(e.a); break;
  case ev::nic_ready: nic_ready(e.a, e.p); break;
  case ev::dispatch: dispatch(e.a, static_cast<std::uint32_t>(e.b >> 32), static_cast<std::uint32_t>(e.b), e.p); break;
  case ev::core_done: core_done(e.a, static_cast<std::uint32_t>(e.b >> 32), static_cast<std::uint32_t>(e.b), e.p); break;
  case ev::host_visible: host_visible(e.a, static_cast<rt::ec_id>(e.b)); break;
  case ev::actor_timeout: actor_timeout(e.a, e.b); break;
  case ev::call: {
    auto it = calls.find(e.b);
    auto fn = std::move(it->second);
    calls.erase(it);
    fn();
    break;
  }
  case ev::sample:
    take_sample();
    // Only while the network or a NIC has work: samples alone do not keep the simulation going.
    sample_armed = live_events > 0;
    if (sample_armed) schedule(now + opts.sample_interval.count(), ev::sample, 0);
    break;
  }
}

// ---- frames ------------------------------------------------------------------------------

frame* cluster::impl::alloc_frame() {
  if (free_frames.empty()) {
    buffers.push_back(std::make_unique<std::byte[]>(frame_capacity));
    frame& f = frame_store.emplace_back();
    f.data = buffers.back().get();
    free_frames.push_back(&f);
  }
  frame* f = free_frames.back();
  free_frames.pop_back();
  std::byte* d = f->data;
  *f = frame{};
  f->data = d;
  f->seq = frame_seq++;
  return f;
}

void cluster::impl::free_frame(frame* f) { free_frames.push_back(f); }

// ---- network -----------------------------------------------------------------------------

namespace {
bool queue_later(const frame* x, const frame* y) { return x->ready != y->ready ? x->ready > y->ready : x->seq > y->seq; }
} // namespace

std::optional<std::uint32_t> cluster::impl::next_port(std::uint32_t n, std::uint32_t dest) const {
  if (auto it = switch_routes.find(dest); it != switch_routes.end()) {
    const std::uint32_t p = it->second[n];
    if (p == emu::no_port) return std::nullopt;
    return p;
  }
  return routes.next_port(n, dest);
}

bool cluster::impl::route(std::uint32_t n, frame* f, drop& why, bool may_drop) {
  impl_node& nd = *nodes[n];
  if (f->dest_rank == nd.rank) {
    f->local = true;
    schedule(f->ready, ev::arrive, n, 0, f);
    return true;
  }
  const auto pn = next_port(n, f->dest_rank);
  if (!pn) {
    why = drop::unroutable;
    return false;
  }
  port& p = ports[port_of[n][*pn]];
  if (may_drop && p.queue.size() >= p.model.queue_packets && p.model.on_full == emu::overflow_policy::drop) {
    ++p.dropped_queue_full;
    why = drop::queue_full;
    return false;
  }
  // Depth over time: the area under the queue's depth.
  p.depth_area += static_cast<long double>(p.queue.size()) * static_cast<long double>(now - p.depth_since);
  p.depth_since = now;
  p.queue.push_back(f);
  std::push_heap(p.queue.begin(), p.queue.end(), queue_later);
  p.depth_max = std::max<std::uint32_t>(p.depth_max, static_cast<std::uint32_t>(p.queue.size()));
  // A frame eligible before the kick already scheduled (a handler's send may be stamped far
  // ahead of now) gets a kick of its own; a kick that finds nothing to do is harmless.
  const ps t = std::max({now, p.busy_until, f->ready});
  if (t < p.kick_at) {
    p.kick_at = t;
    schedule(t, ev::port_kick, static_cast<std::uint32_t>(&p - ports.data()));
  }
  return true;
}

void cluster::impl::port_kick(std::uint32_t pi) {
  port& p = ports[pi];
  if (now >= p.kick_at) p.kick_at = UINT64_MAX;
  if (p.queue.empty()) return;
  const ps start = std::max(now, p.busy_until);
  frame* f = p.queue.front();
  if (f->ready > start || start > now) {
    const ps t = std::max(f->ready, start);
    if (t < p.kick_at) {
      p.kick_at = t;
      schedule(t, ev::port_kick, pi);
    }
    return;
  }
  p.depth_area += static_cast<long double>(p.queue.size()) * static_cast<long double>(now - p.depth_since);
  p.depth_since = now;
  std::pop_heap(p.queue.begin(), p.queue.end(), queue_later);
  p.queue.pop_back();
  // LogGP: the wire is busy max(g, s*G); the last byte arrives s*G + L after the start. Three
  // draws per packet, as the wall-clock link makes them (emu::link_sim).
  const ps ser = static_cast<ps>(std::ceil(static_cast<double>(f->len) * p.ps_per_byte));
  p.busy_until = now + std::max(ser, p.gap);
  p.busy += std::max(ser, p.gap);
  const double u_loss = p.rng.next_unit(), u_dup = p.rng.next_unit(), u_reorder = p.rng.next_unit();
  // Host traffic is a reliable transport's: the link model neither loses nor duplicates it
  // (retransmissions are not modelled); it still draws, so spin's frames see the same draws.
  const bool reliable = f->traffic != 0;
  if (!reliable && u_loss < p.model.loss) {
    ++p.dropped_loss;
    nodes[p.node]->st.drops[static_cast<std::size_t>(drop::link_loss)] += 1;
    free_frame(f);
  } else {
    ++p.packets;
    p.bytes += f->len;
    ps at = now + ser + p.latency;
    if (u_reorder < p.model.reorder) at += p.reorder_delay;
    if (!reliable && u_dup < p.model.duplicate) {
      frame* d = alloc_frame();
      const std::uint64_t seq = d->seq;
      std::byte* data = d->data;
      *d = *f;
      d->data = data;
      d->seq = seq;
      std::copy(f->data, f->data + f->len, d->data);
      p.busy_until += ser;
      schedule(at + ser, ev::arrive, p.peer, 0, d);
    }
    schedule(at, ev::arrive, p.peer, 0, f);
  }
  if (!p.queue.empty()) {
    const ps t = std::max(p.busy_until, p.queue.front()->ready);
    if (t < p.kick_at) {
      p.kick_at = t;
      schedule(t, ev::port_kick, pi);
    }
  }
}

void cluster::impl::arrive(std::uint32_t n, frame* f) {
  impl_node& nd = *nodes[n];
  if (f->dest_rank != nd.rank && !f->local) {
    // Transit: a switch (or a host on a ring) sends it on after its forwarding latency.
    f->ready = now + (nd.is_switch ? static_cast<ps>(topo.switch_params.latency.count()) * 1000
                                   : static_cast<ps>(nd.model.tx_latency.count()) * 1000);
    drop why{};
    if (route(n, f, why)) {
      ++nd.st.forwarded;
    } else {
      nd.st.drops[static_cast<std::size_t>(why)] += 1;
      free_frame(f);
    }
    return;
  }
  if (f->traffic != 0) {
    traffic_arrived(n, f);
    return;
  }
  nic_ingress(n, f);
}

void cluster::impl::traffic_arrived(std::uint32_t n, frame* f) {
  impl_node& nd = *nodes[n];
  nd.st.packets_in += 1;
  nd.st.bytes_in += f->len;
  // Past the HPUs: the NIC writes the payload to host memory.
  const ps landed = dma(nd, now, f->len - static_cast<std::uint32_t>(rt::wire::max_overhead), true);
  auto it = traffic.find(f->traffic);
  free_frame(f);
  host_traffic& t = it->second;
  t.last = std::max(t.last, landed);
  if (--t.left > 0) return;
  const std::uint64_t key = next_call++;
  calls.emplace(key, std::move(t.arrived));
  schedule(t.last, ev::call, 0, key);
  traffic.erase(it);
}

result<void> cluster::send_host_traffic(std::uint32_t from, std::uint32_t to, std::uint64_t bytes, std::function<void()> arrived) {
  impl& s = *_p;
  if (from >= s.nodes.size() || to >= s.nodes.size() || s.nodes[from]->is_switch || s.nodes[to]->is_switch)
    return fail(errc::not_found, "host traffic: nodes " + std::to_string(from) + " and " + std::to_string(to) + " must both be hosts");
  impl_node& src = *s.nodes[from];
  const std::uint32_t dest = s.nodes[to]->rank;
  if (from != to && !s.next_port(from, dest))
    return fail(errc::not_found, "host traffic: no route from " + src.name + " to " + s.nodes[to]->name);
  const std::uint64_t payload = s.opts.payload_bytes;
  const std::uint64_t packets = std::max<std::uint64_t>(1, (bytes + payload - 1) / payload);
  if (packets >= (1ull << 32)) return fail(errc::invalid_argument, "host traffic: a message of more than 2^32 packets");
  const std::uint32_t key = s.next_traffic++;
  if (s.next_traffic == 0) s.next_traffic = 1;
  s.traffic.emplace(key, host_traffic{packets, 0, std::move(arrived)});
  // As a host message leaves (vnic::send): the doorbell over PCIe, each packet's payload read
  // from host memory by the DMA engine, then the transmit latency.
  const ps doorbell = s.now + static_cast<ps>(src.model.pcie_latency.count()) * 1000;
  std::uint64_t off = 0;
  for (std::uint64_t k = 0; k < packets; ++k) {
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(bytes - off, payload));
    frame* f = s.alloc_frame();
    f->len = n + static_cast<std::uint32_t>(rt::wire::max_overhead);
    f->dest_rank = dest;
    f->traffic = key;
    f->ready = s.dma(src, doorbell, n, false) + static_cast<ps>(src.model.tx_latency.count()) * 1000;
    drop why{};
    (void)s.route(from, f, why, false);  // routable (checked), and never dropped at a full queue
    src.st.host_packets += 1;
    off += n;
  }
  return {};
}

result<cluster::transfer> cluster::transfer_time(std::uint32_t from, std::uint32_t to, std::uint64_t bytes) const {
  const impl& s = *_p;
  if (from >= s.nodes.size() || to >= s.nodes.size())
    return fail(errc::not_found, "transfer_time: no node " + std::to_string(std::max(from, to)));
  if (from == to) return transfer{picoseconds(0), picoseconds(0), 1};
  const std::uint64_t payload = s.opts.payload_bytes;
  const std::uint64_t packets = std::max<std::uint64_t>(1, (bytes + payload - 1) / payload);
  const std::uint64_t wire = std::min<std::uint64_t>(bytes, payload) + rt::wire::max_overhead;
  const std::uint32_t dest = s.nodes[to]->rank;
  ps first = 0, bottleneck = 0;
  std::uint32_t n = from;
  for (std::size_t hops = 0; n != to; ++hops) {
    const auto pn = s.next_port(n, dest);
    if (!pn || hops > s.nodes.size())
      return fail(errc::not_found, "transfer_time: no route from " + s.nodes[from]->name + " to " + s.nodes[to]->name);
    const port& p = s.ports[s.port_of[n][*pn]];
    if (n != from) {
      const impl_node& via = *s.nodes[n];
      first += static_cast<ps>(via.is_switch ? s.topo.switch_params.latency.count() : via.model.tx_latency.count()) * 1000;
    }
    const ps ser = static_cast<ps>(std::ceil(static_cast<double>(wire) * p.ps_per_byte));
    first += ser + p.latency;
    bottleneck = std::max({bottleneck, ser, p.gap});
    n = p.peer;
  }
  return transfer{picoseconds(first), picoseconds(bottleneck), packets};
}

// ---- samples -----------------------------------------------------------------------------

void cluster::impl::take_sample() {
  if (samples.size() >= opts.max_samples) {
    ++dropped_samples;
    return;
  }
  sample s;
  s.at = picoseconds(now);
  for (const port& p : ports) s.port_depth.push_back(static_cast<std::uint32_t>(p.queue.size()));
  for (const auto& nd : nodes) {
    s.packet_buffer.push_back(nd->pb_used);
    s.waiting.push_back(nd->waiting_now);
    s.busy_hpus.push_back(nd->busy_now);
  }
  samples.push_back(std::move(s));
}

// ---- the cluster ---------------------------------------------------------------------------

cluster::cluster(std::unique_ptr<impl> p) : _p(std::move(p)) {}

cluster::~cluster() {
  // Actors still waiting (run() failed or was never called) end here: every wait returns at once
  // and every deadline has passed, so each runs to its end; one that never started skips its
  // body. One at a time, as always.
  _p->cancelling = true;
  for (auto& a : _p->actors) {
    if (!a->done) {
      if (!a->started) a->body = nullptr;
      a->runnable = false;
      _p->resume(*a);
    }
    if (a->th.joinable()) a->th.join();
  }
  // Runtimes first (they release their frames through the nodes), then the rest.
  for (auto& nd : _p->nodes) nd->rt.reset();
}

result<std::unique_ptr<cluster>> cluster::create(const emu::topology& t, const options& o) {
  if (auto r = emu::validate(t); !r) return r.err();
  if (o.payload_bytes < 64 || o.payload_bytes > 9000)
    return fail(errc::invalid_argument, "sim::options: payload_bytes must be in [64, 9000], got " + std::to_string(o.payload_bytes));
  auto p = std::make_unique<impl>();
  p->topo = t;
  p->opts = o;
  p->routes = emu::routes(t);
  p->frame_capacity = o.payload_bytes + static_cast<std::uint32_t>(rt::wire::max_overhead);
  std::uint32_t switches = 0;
  for (std::uint32_t i = 0; i < t.nodes.size(); ++i) {
    const emu::node& tn = t.nodes[i];
    auto nd = std::make_unique<impl_node>(tn.name);
    nd->sim = p.get();
    nd->index = i;
    nd->is_switch = tn.kind == emu::node_kind::switch_;
    nd->rank = nd->is_switch ? emu::max_rank - switches++ : tn.rank;
    nd->model = nd->is_switch ? t.switch_nic : t.nic;
    nd->cycle_ps = 1000.0 / nd->model.hpu_ghz;
    nd->clusters.resize(nd->model.clusters);
    for (auto& c : nd->clusters) c.busy.assign(nd->model.hpus_per_cluster, false);
    nd->st.name = tn.name;
    nd->st.rank = nd->rank;
    nd->st.is_switch = nd->is_switch;
    nd->st.hpus = nd->model.clusters * nd->model.hpus_per_cluster;
    p->nodes.push_back(std::move(nd));
  }
  for (std::uint32_t i = 0; i < t.nodes.size(); ++i)
    if (t.nodes[i].kind == emu::node_kind::host)
      for (std::uint32_t j = t.host_count(); j < t.nodes.size(); ++j)
        if (t.nodes[i].rank == p->nodes[j]->rank)
          return fail(errc::invalid_argument, "host " + t.nodes[i].name + " has rank " + std::to_string(t.nodes[i].rank) +
                                                  ", which switch " + t.nodes[j].name + " takes (switches count down from 65535)");
  p->port_of.resize(t.nodes.size());
  for (std::uint32_t i = 0; i < t.nodes.size(); ++i) p->port_of[i].resize(t.nodes[i].ports.size());
  for (std::uint32_t l = 0; l < t.links.size(); ++l) {
    const emu::link_spec& s = t.links[l];
    for (int dir = 0; dir < 2; ++dir) {
      port q;
      q.node = dir == 0 ? s.a : s.b;
      q.index = dir == 0 ? s.a_port : s.b_port;
      q.peer = dir == 0 ? s.b : s.a;
      q.model = s.model;
      // Each direction its own stream of draws: the link's seed, and the reverse direction's
      // seed + 2^32 (the wall-clock cluster derives them alike: one per direction).
      q.rng = emu::prng(s.model.seed + (dir == 0 ? 0 : (1ull << 32)));
      q.ps_per_byte = s.model.rate_gbps > 0 ? 8000.0 / s.model.rate_gbps : 0.0;
      q.gap = static_cast<ps>(std::ceil(s.model.gap_ns * 1000.0));
      q.latency = static_cast<ps>(s.model.latency.count()) * 1000;
      q.reorder_delay = static_cast<ps>(emu::effective_reorder_delay(s.model).count()) * 1000;
      p->port_of[q.node][q.index] = static_cast<std::uint32_t>(p->ports.size());
      p->ports.push_back(std::move(q));
    }
  }
  for (std::uint32_t i = 0; i < t.nodes.size(); ++i)
    if (p->nodes[i]->is_switch) p->switch_routes[p->nodes[i]->rank] = emu::ports_towards(t, i);
  for (auto& nd : p->nodes)
    if (auto r = make_node_runtime(*p, *nd); !r) return r.err();
  if (o.sample_interval.count() > 0) {
    p->sample_armed = true;
    p->schedule(0, ev::sample, 0);
  }
  return std::unique_ptr<cluster>(new cluster(std::move(p)));
}

emu::nic_control& cluster::node(std::uint32_t index) noexcept { return *_p->nodes[index]->control; }

emu::nic_control* cluster::host(std::uint32_t rank) noexcept {
  for (auto& nd : _p->nodes)
    if (!nd->is_switch && nd->rank == rank) return nd->control.get();
  return nullptr;
}

std::uint32_t cluster::node_count() const noexcept { return static_cast<std::uint32_t>(_p->nodes.size()); }

std::vector<emu::nic_control*> cluster::controls() {
  std::vector<emu::nic_control*> out;
  for (auto& nd : _p->nodes) out.push_back(nd->control.get());
  return out;
}

const emu::topology& cluster::topo() const noexcept { return _p->topo; }

picoseconds cluster::now() const noexcept { return picoseconds(_p->now); }

const std::vector<sample>& cluster::samples() const noexcept { return _p->samples; }

cluster_stats cluster::stats() const {
  cluster_stats s;
  s.now = picoseconds(_p->now);
  s.events = _p->events_run;
  s.actor_switches = _p->switches;
  for (const auto& nd : _p->nodes) s.nodes.push_back(nd->st);
  for (const port& q : _p->ports) {
    port_stats ps_;
    ps_.from = _p->nodes[q.node]->name;
    ps_.to = _p->nodes[q.peer]->name;
    ps_.packets = q.packets;
    ps_.bytes = q.bytes;
    ps_.dropped_queue_full = q.dropped_queue_full;
    ps_.dropped_loss = q.dropped_loss;
    ps_.depth_max = q.depth_max;
    const long double area = q.depth_area + static_cast<long double>(q.queue.size()) * static_cast<long double>(_p->now - q.depth_since);
    ps_.depth_mean = _p->now > 0 ? static_cast<double>(area / static_cast<long double>(_p->now)) : 0.0;
    ps_.busy = picoseconds(q.busy);
    s.ports.push_back(std::move(ps_));
  }
  return s;
}

} // namespace spin::sim
