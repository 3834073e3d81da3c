// spin::sim: the NIC model (packet buffer, scheduler, HPUs, DMA engine), the runtime's observer
// and transmitter in virtual time, and the host interface (vnic).
#include "vnic.hpp"

#include <spin/host/message.hpp>
#include <spin/rt/wire.hpp>

#include <algorithm>
#include <cmath>

namespace spin::sim {
namespace {

std::uint64_t message_key(std::uint32_t source_rank, std::uint64_t message_id) {
  return (std::uint64_t{source_rank} << 48) ^ message_id;
}

ps to_ps(std::chrono::nanoseconds d) { return static_cast<ps>(d.count()) * 1000; }

// Times each invocation and action of a node's runtime on the HPU running it (the dispatch
// the simulation thread is in: cluster::impl::current).
class observer final : public rt::invocation_observer {
public:
  explicit observer(impl_node& nd) : _nd(nd) {}

  void begin(std::uint32_t, rt::ec_id ec, handler_kind kind, std::uint32_t source_rank, std::uint64_t message_id,
             std::uint32_t packet_count) noexcept override {
    dispatch_ctx* c = _nd.sim->current;
    if (c == nullptr) return;  // a control call drained an inbox: no HPU time to account
    c->cursor += static_cast<ps>(_nd.model.invocation_cycles * _nd.cycle_ps);
    c->in_invocation = true;
    c->ec = ec;
    c->kind = kind;
    c->msg_key = message_key(source_rank, message_id);
    c->packet_count = packet_count;
    c->last_instr = 0;
    if (packet_count == 1) return;
    auto it = _nd.messages.find(c->msg_key);
    if (it == _nd.messages.end()) return;
    // sPIN's order in modelled time: payload handlers after the header handler, the completion
    // handler after every payload handler.
    if (kind == handler_kind::payload) c->cursor = std::max(c->cursor, it->second.header_end);
    if (kind == handler_kind::completion) c->cursor = std::max(c->cursor, it->second.payload_end);
  }

  void action(const rt::action_info& a) noexcept override {
    dispatch_ctx* c = _nd.sim->current;
    if (c == nullptr) return;
    advance(*c, a.instructions);
    if (a.kind != rt::action_kind::deposit) c->cursor += static_cast<ps>(_nd.model.command_cycles * _nd.cycle_ps);
    switch (a.kind) {
    case rt::action_kind::send:
    case rt::action_kind::multicast:
    case rt::action_kind::forward:
      c->tx_time = c->cursor + to_ps(_nd.model.tx_latency);
      break;
    case rt::action_kind::dma_to_host:
    case rt::action_kind::dma_from_host: {
      const ps done = _nd.sim->dma(_nd, c->cursor, a.bytes, a.kind == rt::action_kind::dma_to_host);
      if (a.dma_id == 0) c->cursor = done;
      else c->dmas.emplace_back(a.dma_id, done);
      break;
    }
    case rt::action_kind::dma_wait:
      for (const auto& [id, done] : c->dmas)
        if (id == a.dma_id) c->cursor = std::max(c->cursor, done);
      break;
    case rt::action_kind::post_event:
      // An 8-byte write into the host's event queue; the handler goes on.
      _nd.sim->schedule(_nd.sim->dma(_nd, c->cursor, 8, true), ev::host_visible, _nd.index, c->ec);
      break;
    case rt::action_kind::deposit:
      // The NIC's DMA engine writes the payload; the packet's buffer is held until it is done.
      c->cursor = _nd.sim->dma(_nd, c->cursor, a.bytes, true);
      break;
    }
  }

  void end(std::uint64_t instructions, bool stopped) noexcept override {
    dispatch_ctx* c = _nd.sim->current;
    if (c == nullptr) return;
    advance(*c, instructions);
    c->in_invocation = false;
    ++c->invocations;
    c->instructions += instructions;
    if (stopped) _nd.sim->schedule(c->cursor + to_ps(_nd.model.pcie_latency), ev::host_visible, _nd.index, c->ec);
    if (c->packet_count == 1) return;
    switch (c->kind) {
    case handler_kind::header: _nd.messages[c->msg_key].header_end = c->cursor; break;
    case handler_kind::payload: {
      message_times& t = _nd.messages[c->msg_key];
      t.payload_end = std::max(t.payload_end, c->cursor);
      break;
    }
    case handler_kind::completion: _nd.messages.erase(c->msg_key); break;
    }
    // Messages that never complete (no completion handler) leave their times behind: forget
    // those that can no longer delay anything.
    if (_nd.messages.size() > 4096)
      std::erase_if(_nd.messages, [&](const auto& kv) {
        return kv.second.header_end <= _nd.sim->now && kv.second.payload_end <= _nd.sim->now;
      });
  }

private:
  void advance(dispatch_ctx& c, std::uint64_t instructions) {
    if (!c.in_invocation || instructions < c.last_instr) return;
    c.cursor += static_cast<ps>(std::llround(static_cast<double>(instructions - c.last_instr) * _nd.model.cpi * _nd.cycle_ps));
    c.last_instr = instructions;
  }
  impl_node& _nd;
};

// A node's transmit side: each frame leaves its egress port (or reaches the node's own NIC)
// when the command that made it says (dispatch_ctx::tx_time).
class transmitter final : public rt::transmitter {
public:
  explicit transmitter(impl_node& nd) : _nd(nd) {}
  errc send(std::uint32_t, std::uint32_t dest_rank, const rt::wire::header& h, std::span<const std::byte> payload) noexcept override {
    cluster::impl& sim = *_nd.sim;
    frame* f = sim.alloc_frame();
    f->len = static_cast<std::uint32_t>(rt::wire::encode(rt::wire::rank_endpoint(_nd.rank), rt::wire::rank_endpoint(dest_rank), h,
                                                          payload, std::span<std::byte>(f->data, sim.frame_capacity)));
    if (f->len == 0) {
      _nd.st.drops[static_cast<std::size_t>(drop::frame_too_large)] += 1;
      sim.free_frame(f);
      return errc::invalid_argument;
    }
    f->dest_rank = dest_rank;
    f->ready = sim.current != nullptr ? sim.current->tx_time : sim.now + to_ps(_nd.model.tx_latency);
    drop why{};
    if (!sim.route(_nd.index, f, why)) {
      _nd.st.drops[static_cast<std::size_t>(why)] += 1;
      sim.free_frame(f);
      return why == drop::queue_full ? errc::no_space : errc::not_found;
    }
    return errc::ok;
  }
  std::uint32_t max_payload_bytes() const noexcept override { return _nd.sim->opts.payload_bytes; }

private:
  impl_node& _nd;
};

void release_frame(void* user, std::uint64_t cookie) noexcept {
  auto& nd = *static_cast<impl_node*>(user);
  frame* f = reinterpret_cast<frame*>(cookie);
  if (nd.sim->current != nullptr) {
    nd.sim->current->released.push_back(f);  // its buffer frees when the HPU is done
    return;
  }
  nd.pb_used -= f->len;
  nd.sim->free_frame(f);
}

} // namespace

result<void> make_node_runtime(cluster::impl& sim, impl_node& nd) {
  nd.observer = std::make_unique<observer>(nd);
  nd.tx = std::make_unique<transmitter>(nd);
  rt::runtime_config rc;
  rc.rank = nd.rank;
  rc.hpus = nd.model.clusters;
  rc.nic_memory_bytes = nd.model.memory_bytes;
  rc.tx = nd.tx.get();
  rc.release = &release_frame;
  rc.release_user = &nd;
  rc.observer = nd.observer.get();
  auto r = rt::runtime::create(rc);
  if (!r) return fail(r.err().code, "node " + nd.name + ": " + r.err().message);
  nd.rt = std::move(r.value());
  nd.control = std::make_unique<vnic>(nd);
  (void)sim;
  return {};
}

// ---- the NIC model -------------------------------------------------------------------------

ps cluster::impl::dma(impl_node& nd, ps t, std::uint64_t bytes, bool to_host) {
  // Handlers reserve the engine at their own modelled times, which are not the order they run
  // in here: a transfer takes the first free interval at or after `t` (first come, first served
  // in virtual time), not the end of the last reservation. PCIe is full duplex: writes to the
  // host and reads from it each have their own direction (and intervals) at pcie_gbps.
  const ps xfer = static_cast<ps>(std::ceil(static_cast<double>(bytes) * 8000.0 / nd.model.pcie_gbps));
  auto& busy = nd.dma_busy[to_host ? 0 : 1];
  while (!busy.empty() && busy.begin()->second <= now) busy.erase(busy.begin());
  ps start = t;
  auto it = busy.upper_bound(start);
  if (it != busy.begin()) {
    auto prev = std::prev(it);
    if (prev->second > start) start = prev->second;
  }
  while (it != busy.end() && it->first < start + xfer) {
    start = std::max(start, it->second);
    ++it;
  }
  if (xfer > 0) busy.emplace(start, start + xfer);
  nd.st.dma_busy += picoseconds(xfer);
  nd.st.dma_bytes += bytes;
  // A write is posted: it lands one way later; a read is a request and a completion.
  return start + xfer + (to_host ? 1 : 2) * to_ps(nd.model.pcie_latency);
}

void cluster::impl::nic_ingress(std::uint32_t n, frame* f) {
  impl_node& nd = *nodes[n];
  f->arrived = now;
  nd.st.packets_in += 1;
  nd.st.bytes_in += f->len;
  if (nd.pb_used + f->len > nd.model.packet_buffer_bytes) {
    nd.st.drops[static_cast<std::size_t>(drop::packet_buffer_full)] += 1;
    free_frame(f);
    return;
  }
  nd.pb_used += f->len;
  nd.st.packet_buffer_max = std::max(nd.st.packet_buffer_max, nd.pb_used);
  f->cluster = nd.rt->hpu_of(std::span<const std::byte>(f->data, f->len)) % nd.model.clusters;
  cluster_state& cs = nd.clusters[f->cluster];
  const ps start = std::max(now + to_ps(nd.model.scheduler_latency), cs.copy_free);
  cs.copy_free = start + static_cast<ps>(std::ceil(static_cast<double>(f->len) * 8000.0 / nd.model.l1_copy_gbps));
  schedule(cs.copy_free, ev::nic_ready, n, 0, f);
}

void cluster::impl::nic_ready(std::uint32_t n, frame* f) {
  impl_node& nd = *nodes[n];
  nd.clusters[f->cluster].waiting.push_back(f);
  ++nd.waiting_now;
  nd.st.waiting_max = std::max(nd.st.waiting_max, nd.waiting_now);
  try_start(n, f->cluster);
  // The home cluster is full: a cluster with an idle HPU and nothing of its own waiting takes
  // the packet (the lowest such index, so the choice is deterministic).
  if (nd.clusters[f->cluster].waiting.empty()) return;
  for (std::uint32_t c = 0; c < nd.clusters.size(); ++c)
    if (c != f->cluster && nd.clusters[c].waiting.empty()) try_take(n, c);
}

void cluster::impl::try_start(std::uint32_t n, std::uint32_t c) {
  cluster_state& cs = nodes[n]->clusters[c];
  while (!cs.waiting.empty()) {
    const auto free = std::find(cs.busy.begin(), cs.busy.end(), false);
    if (free == cs.busy.end()) return;
    frame* f = cs.waiting.front();
    cs.waiting.pop_front();
    start_on(n, c, static_cast<std::uint32_t>(free - cs.busy.begin()), f, now);
  }
}

void cluster::impl::try_take(std::uint32_t n, std::uint32_t c) {
  impl_node& nd = *nodes[n];
  cluster_state& cs = nd.clusters[c];
  for (;;) {
    const auto free = std::find(cs.busy.begin(), cs.busy.end(), false);
    if (free == cs.busy.end()) return;
    // The longest queue of another cluster (the lowest index among equals) gives its oldest.
    std::uint32_t from = c;
    for (std::uint32_t o = 0; o < nd.clusters.size(); ++o)
      if (o != c && nd.clusters[o].waiting.size() > (from == c ? 0 : nd.clusters[from].waiting.size())) from = o;
    if (from == c) return;
    frame* f = nd.clusters[from].waiting.front();
    nd.clusters[from].waiting.pop_front();
    // The packet is copied again, into this cluster's L1, by this cluster's copy engine.
    const ps copied = std::max(now, cs.copy_free) + static_cast<ps>(std::ceil(static_cast<double>(f->len) * 8000.0 / nd.model.l1_copy_gbps));
    cs.copy_free = copied;
    nd.st.moved += 1;
    start_on(n, c, static_cast<std::uint32_t>(free - cs.busy.begin()), f, copied);
  }
}

void cluster::impl::start_on(std::uint32_t n, std::uint32_t c, std::uint32_t k, frame* f, ps start) {
  impl_node& nd = *nodes[n];
  --nd.waiting_now;
  nd.clusters[c].busy[k] = true;
  ++nd.busy_now;
  // A payload packet of a message whose header handler still runs waits for it on its HPU.
  rt::wire::parsed pr;
  rt::wire::reject why;
  if (!nd.messages.empty() && rt::wire::parse(std::span<const std::byte>(f->data, f->len), rt::wire::default_udp_port, pr, why) &&
      pr.hdr.seq != 0) {
    auto it = nd.messages.find(message_key(pr.hdr.source_rank, pr.hdr.message_id));
    if (it != nd.messages.end()) start = std::max(start, it->second.header_end);
  }
  if (start > now) schedule(start, ev::dispatch, n, (std::uint64_t{c} << 32) | k, f);
  else dispatch(n, c, k, f);
}

void cluster::impl::dispatch(std::uint32_t n, std::uint32_t c, std::uint32_t k, frame* f) {
  impl_node& nd = *nodes[n];
  dispatch_ctx ctx;
  ctx.node = n;
  ctx.cursor = now;
  const ps arrived = f->arrived;
  nd.st.wait.add(now - arrived);
  rt::packet pk;
  pk.frame = f->data;
  pk.frame_len = f->len;
  pk.cookie = reinterpret_cast<std::uint64_t>(f);
  pk.local = f->local;
  current = &ctx;
  // The runtime's lane is the message's home cluster (hpu_of: a lane owns its messages' state,
  // so the runtime takes the frame without steering), whichever cluster's HPU (c, k) runs it.
  (void)nd.rt->rx_burst(f->cluster, &pk, 1);
  current = nullptr;
  nd.st.handled += 1;
  nd.st.invocations += ctx.invocations;
  nd.st.instructions += ctx.instructions;
  nd.st.latency.add(ctx.cursor - arrived);
  nd.st.hpu_busy += picoseconds(ctx.cursor - now);
  // The frames the runtime released free their buffers when the HPU is done: a list through
  // frame::next, which core_done walks.
  frame* head = nullptr;
  for (auto it = ctx.released.rbegin(); it != ctx.released.rend(); ++it) {
    (*it)->next = head;
    head = *it;
  }
  schedule(ctx.cursor, ev::core_done, n, (std::uint64_t{c} << 32) | k, head);
}

void cluster::impl::core_done(std::uint32_t n, std::uint32_t c, std::uint32_t k, frame* released) {
  impl_node& nd = *nodes[n];
  while (released != nullptr) {
    frame* next = released->next;
    nd.pb_used -= released->len;
    free_frame(released);
    released = next;
  }
  nd.clusters[c].busy[k] = false;
  --nd.busy_now;
  try_start(n, c);
  try_take(n, c);
}

} // namespace spin::sim

namespace spin::sim {

// ---- the host interface --------------------------------------------------------------------

result<rt::region_id> vnic::register_host_memory(std::span<std::byte> mem) {
  auto r = _nd.rt->register_host_memory(mem);
  if (r) _regions[r.value()] = mem;
  return r;
}

result<void> vnic::unregister_host_memory(rt::region_id region) {
  auto r = _nd.rt->unregister_host_memory(region);
  if (r) _regions.erase(region);
  return r;
}

result<void> vnic::uninstall(rt::ec_id ec) {
  auto r = _nd.rt->uninstall(ec);
  if (r) _nd.visible.erase(ec);
  return r;
}

std::size_t vnic::poll_events(rt::ec_id ec, std::span<rt::host_event> out) noexcept {
  // Only events whose write has reached host memory in virtual time (host_visible).
  auto it = _nd.visible.find(ec);
  if (it == _nd.visible.end() || it->second == 0) return 0;
  const std::size_t want = std::min<std::size_t>(out.size(), it->second);
  const std::size_t got = _nd.rt->poll_events(ec, out.first(want));
  // Fewer than announced: an event the queue could not hold (events_lost). Forget the rest, or
  // a waiter would find "visible" events forever and never let time pass.
  it->second = got < want ? 0 : it->second - got;
  return got;
}

namespace {
// now + d, saturated (a wait of nanoseconds::max() is a wait without deadline).
ps deadline_after(ps now, std::chrono::nanoseconds d) {
  const auto t = static_cast<std::uint64_t>(std::max<std::int64_t>(0, d.count()));
  return t > (UINT64_MAX - now) / 1000 ? UINT64_MAX : now + t * 1000;
}
} // namespace

std::size_t vnic::wait_events(rt::ec_id ec, std::span<rt::host_event> out, std::chrono::nanoseconds timeout) noexcept {
  if (const std::size_t n = poll_events(ec, out); n > 0 || timeout.count() <= 0) return n;
  cluster::impl& sim = *_nd.sim;
  const ps deadline = deadline_after(sim.now, timeout);
  // Another waiter of the same EC may take the event that woke this one: wait on until the
  // deadline, as a real wait would.
  for (;;) {
    const bool waited = sim.wait_visible(_nd.index, ec, deadline);
    if (const std::size_t n = poll_events(ec, out); n > 0) return n;
    if (!waited || sim.now >= deadline) return 0;
  }
}

void vnic::sleep_for(std::chrono::nanoseconds d) {
  if (d.count() <= 0) return;
  cluster::impl& sim = *_nd.sim;
  // An EC id no runtime hands out: only the deadline ends this wait.
  sim.wait_visible(_nd.index, static_cast<rt::ec_id>(-1), deadline_after(sim.now, d));
}

void vnic::charge_host(host::work op, std::uint64_t bytes) {
  const double gbps = op == host::work::copy ? _nd.model.host_copy_gbps : _nd.model.host_reduce_gbps;
  const auto ns = static_cast<std::int64_t>(std::ceil(static_cast<double>(bytes) * 8.0 / gbps));
  sleep_for(std::chrono::nanoseconds(ns));
}

result<void> vnic::send(const host::message& m, std::chrono::milliseconds) {
  cluster::impl& sim = *_nd.sim;
  auto reg = _regions.find(m.region);
  if (reg == _regions.end()) return fail(errc::not_found, "send: region " + std::to_string(m.region) + " is not registered");
  if (m.offset_bytes > reg->second.size() || m.len_bytes > reg->second.size() - m.offset_bytes)
    return fail(errc::out_of_bounds, "send: bytes [" + std::to_string(m.offset_bytes) + ", +" + std::to_string(m.len_bytes) +
                                         ") lie outside region " + std::to_string(m.region));
  const std::uint32_t payload = sim.opts.payload_bytes;
  if (m.len_bytes / payload >= (1ull << 32)) return fail(errc::invalid_argument, "send: message needs more than 2^32 packets");
  if (m.dest_rank != _nd.rank && !sim.next_port(_nd.index, m.dest_rank))
    return fail(errc::not_found, "send: no route from " + _nd.name + " to rank " + std::to_string(m.dest_rank));
  // The doorbell reaches the NIC over PCIe; a message of up to host::post_inline_bytes comes
  // with it, a larger one the DMA engine reads packet by packet.
  const ps doorbell = sim.now + to_ps(_nd.model.pcie_latency);
  const bool inline_data = m.len_bytes <= host::post_inline_bytes;
  const std::byte* data = reg->second.data() + m.offset_bytes;
  std::uint64_t off = 0, seq = 0;
  do {
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(m.len_bytes - off, payload));
    const rt::wire::header h = host::packet_header(m, _nd.rank, seq, off, n);
    frame* f = sim.alloc_frame();
    f->len = static_cast<std::uint32_t>(rt::wire::encode(rt::wire::rank_endpoint(_nd.rank), rt::wire::rank_endpoint(m.dest_rank), h,
                                                          std::span<const std::byte>(data + off, n),
                                                          std::span<std::byte>(f->data, sim.frame_capacity)));
    if (f->len == 0) {
      sim.free_frame(f);
      return fail(errc::invalid_argument, "send: packet " + std::to_string(seq) + " of the message cannot be encoded as a frame");
    }
    f->dest_rank = m.dest_rank;
    f->ready = (inline_data ? doorbell : sim.dma(_nd, doorbell, n, false)) + to_ps(_nd.model.tx_latency);
    drop why{};
    if (!sim.route(_nd.index, f, why, false)) {  // only unroutable, checked above
      _nd.st.drops[static_cast<std::size_t>(why)] += 1;
      sim.free_frame(f);
    }
    _nd.st.host_packets += 1;
    off += n;
    ++seq;
  } while (off < m.len_bytes);
  return {};
}

host::nic_stats vnic::stats() const {
  host::nic_stats s;
  s.name = _nd.name;
  s.rank = _nd.rank;
  const cluster::impl& sim = *_nd.sim;
  for (std::uint32_t pn = 0; pn < sim.port_of[_nd.index].size(); ++pn) {
    const port& out = sim.ports[sim.port_of[_nd.index][pn]];
    const port& in = sim.ports[sim.port_of[_nd.index][pn] ^ 1u];  // the same link's other direction
    host::nic_port_stats ps_;
    ps_.name = "to " + sim.nodes[out.peer]->name;
    ps_.tx_packets = out.packets;
    ps_.tx_bytes = out.bytes;
    ps_.rx_packets = in.packets;
    ps_.rx_bytes = in.bytes;
    s.ports.push_back(std::move(ps_));
  }
  s.host_packets_sent = _nd.st.host_packets;
  s.runtime = _nd.rt->stats();
  return s;
}

} // namespace spin::sim
