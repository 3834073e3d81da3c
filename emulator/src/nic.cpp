// An emulated sPIN NIC (spin/emu/nic.hpp): set-up and teardown, the public face, the control
// path (what runs while the lanes stand aside) and statistics. The data path is in
// nic_datapath.cpp, host messages in nic_host.cpp.
#include "nic_impl.hpp"

namespace spin::emu {

namespace {
void release_mbuf(void*, std::uint64_t cookie) noexcept { mbuf_free(reinterpret_cast<rte_mbuf*>(cookie)); }
// A multicast copy for an EC whose handlers may write their packet: its own contiguous frame.
bool unshare_mbuf(void* user, rt::packet& p) noexcept {
  auto* n = static_cast<nic::impl*>(user);
  auto* m = reinterpret_cast<rte_mbuf*>(p.cookie);
  rte_mbuf* lin = n->linear_copy(m);
  if (lin == nullptr) return false;
  mbuf_free(m);
  p = rt::packet{rte_pktmbuf_mtod(lin, std::byte*), lin->pkt_len, reinterpret_cast<std::uint64_t>(lin)};
  n->unshared.fetch_add(1, std::memory_order_relaxed);
  return true;
}
}  // namespace

result<void> nic::impl::init() {
  const std::uint32_t nports = static_cast<std::uint32_t>(cfg.ports.size());
  if (nports == 0) return fail(errc::invalid_argument, "nic " + cfg.name + ": no port");
  if (cfg.burst == 0 || cfg.burst > 512) return fail(errc::invalid_argument, "nic " + cfg.name + ": burst must be 1..512");
  if (cfg.tx_ring_packets < 2 || cfg.tx_ring_packets > (1u << 20) || (cfg.tx_ring_packets & (cfg.tx_ring_packets - 1)) != 0)
    return fail(errc::invalid_argument, "nic " + cfg.name + ": tx_ring_packets must be a power of two in 2..2^20");
  if (cfg.runtime.hpus == 0 || cfg.runtime.hpus > 256) return fail(errc::invalid_argument, "nic " + cfg.name + ": hpus must be 1..256");
  for (auto r : cfg.routes)
    if (r >= static_cast<std::int32_t>(nports))
      return fail(errc::invalid_argument, "nic " + cfg.name + ": a route names port " + std::to_string(r) + " of " + std::to_string(nports));
  // Room for the largest spin header: its collective extension and its authentication tag.
  const std::uint32_t overhead = rt::wire::max_overhead;
  if (cfg.port.max_frame_bytes <= overhead)
    return fail(errc::invalid_argument, "nic " + cfg.name + ": maximum frame of " + std::to_string(cfg.port.max_frame_bytes) +
                                            " bytes leaves no room for payload");
  max_payload = std::min<std::uint32_t>(cfg.port.max_frame_bytes - overhead, 65535 - 20 - 8 - 70);
  host_payload = cfg.payload_bytes == 0 ? max_payload : cfg.payload_bytes;
  if (host_payload > max_payload)
    return fail(errc::invalid_argument, "nic " + cfg.name + ": payload of " + std::to_string(host_payload) +
                                            " bytes per packet does not fit frames of " + std::to_string(cfg.port.max_frame_bytes) +
                                            " bytes (at most " + std::to_string(max_payload) + ")");
  self = rt::wire::rank_endpoint(cfg.rank, cfg.runtime.udp_port);

  for (std::uint32_t i = 0; i < nports; ++i) {
    auto p = port::open(cfg.ports[i], cfg.port, cfg.name + ".p" + std::to_string(i));
    if (!p) return p.err();
    ports.emplace_back();
    ports.back().p = std::move(p.value());
    ports.back().stage.init(cfg.tx_ring_packets);
    ports.back().rx_pending.resize(cfg.burst);
  }
  tx_pool = ports[0].p->pool();
  tx_room = rte_pktmbuf_data_room_size(tx_pool) - RTE_PKTMBUF_HEADROOM;
  if (cfg.port.max_frame_bytes > cfg.port.mbuf_data_bytes) {
    static std::atomic<unsigned> seq{0};
    const std::string nm = "spin_lin" + std::to_string(seq.fetch_add(1));
    const std::uint32_t n = std::max<std::uint32_t>(cfg.port.pool_mbufs / 4, 256);
    lin_pool = rte_pktmbuf_pool_create(nm.c_str(), n, 0, 0, static_cast<std::uint16_t>(cfg.port.max_frame_bytes + RTE_PKTMBUF_HEADROOM),
                                       SOCKET_ID_ANY);
    if (lin_pool == nullptr)
      return fail(errc::no_memory, "nic " + cfg.name + ": cannot create the pool for chained frames: " + rte_strerror(rte_errno));
  }
  {
    // Sizes: an eighth of a port's pool in shared payloads, and a header and a clone for each
    // of them towards up to 8 ports at once; beyond that copies go whole.
    static std::atomic<unsigned> seq{0};
    const std::string tag = "spin_mc" + std::to_string(seq.fetch_add(1));
    const std::uint32_t payloads = std::max<std::uint32_t>(cfg.port.pool_mbufs / 8, 63);
    const std::uint32_t copies = payloads * std::min<std::uint32_t>(nports, 8);
    const auto cache = [](std::uint32_t n) { return n >= 1024 ? 32u : 0u; };
    mc_payload_pool = rte_pktmbuf_pool_create((tag + "p").c_str(), payloads, cache(payloads), 0,
                                              rte_pktmbuf_data_room_size(tx_pool), SOCKET_ID_ANY);
    mc_header_pool = rte_pktmbuf_pool_create((tag + "h").c_str(), copies, cache(copies), 0,
                                             static_cast<std::uint16_t>(RTE_PKTMBUF_HEADROOM + mc_header_room), SOCKET_ID_ANY);
    mc_clone_pool = rte_pktmbuf_pool_create((tag + "c").c_str(), copies, cache(copies), 0, 0, SOCKET_ID_ANY);
    if (mc_payload_pool == nullptr || mc_header_pool == nullptr || mc_clone_pool == nullptr)
      return fail(errc::no_memory, "nic " + cfg.name + ": cannot create the multicast pools (" + std::to_string(payloads) +
                                       " payloads, " + std::to_string(copies) + " headers and clones): " + rte_strerror(rte_errno));
  }
  const std::uint32_t hpus = cfg.runtime.hpus;
  for (std::uint32_t h = 0; h < hpus; ++h) {
    lane_state& l = lanes.emplace_back();
    l.index = h;
    if (h < cfg.lane_doorbells.size() && cfg.lane_doorbells[h] != nullptr) l.bell = cfg.lane_doorbells[h];
    l.loop.init(cfg.tx_ring_packets);
    l.buf.resize(cfg.port.max_frame_bytes);
    l.rx_buf.resize(4 * cfg.burst);
    if (h > 0)
      for (std::uint32_t p = 0; p < nports; ++p) l.to_port.push_back(std::make_unique<rt::spsc_ring<rte_mbuf*>>(cfg.tx_ring_packets));
  }
  mbuf_buf.resize(cfg.burst);
  host_frame.resize(cfg.port.max_frame_bytes);

  rt::runtime_config rc = cfg.runtime;
  rc.rank = cfg.rank;
  rc.tx = &transmitter;
  rc.release = release_mbuf;
  rc.unshare = unshare_mbuf;
  rc.release_user = this;
  rc.wake = [](void* user, std::uint32_t hpu) noexcept { static_cast<impl*>(user)->lanes[hpu].bell->ring(); };
  rc.wake_user = this;
  auto r = rt::runtime::create(rc);
  if (!r) return r.err();
  rt = std::move(r.value());
  return {};
}

nic::impl::~impl() {
  stop();
  ports.clear();
  for (rte_mempool* mp : {lin_pool, mc_payload_pool, mc_header_pool, mc_clone_pool})
    if (mp != nullptr) rte_mempool_free(mp);
}

void nic::impl::stop() noexcept {
  {
    std::lock_guard lk(mgmt_mu);
    mgmt_stop = true;
  }
  mgmt_cv.notify_all();
  {
    std::lock_guard lk(post_mu);
    stopped = true;
  }
  rt.reset();  // runs what waits in the HPUs' inboxes and returns every packet it holds
  if (capture) {
    if (auto r = capture->close(); !r) capture_errors.add(1);
  }
  take_posted();
  for (auto& j : jobs) finish_job(*j, fail(errc::aborted, "the NIC was stopped"));
  jobs.clear();
  for (auto& ps : ports) {
    for (std::uint32_t i = ps.rx_head; i < ps.rx_pending.size() && ps.rx_pending[i].frame != nullptr; ++i) {
      mbuf_free(reinterpret_cast<rte_mbuf*>(ps.rx_pending[i].cookie));
      ps.rx_pending[i] = {};
    }
    for (std::uint32_t i = 0; i < ps.stage.size(); ++i) mbuf_free(ps.stage[i]);
    ps.stage.clear();
  }
  for (auto& l : lanes) {
    for (std::uint32_t i = 0; i < l.loop.size(); ++i) mbuf_free(l.loop[i]);
    l.loop.clear();
    for (auto& r : l.to_port) {
      rte_mbuf* m = nullptr;
      while (r->try_pop(m)) mbuf_free(m);
    }
    l.to_port.clear();
  }
}

template <class F> auto nic::impl::with_lanes_aside(const char* what, F&& f) -> decltype(f()) {
  // Every lane's poller steps aside while ctl_waiting is non-zero, so the try_locks soon
  // succeed. (Plain mutexes and try_lock, not timed_mutex::try_lock_for: ThreadSanitizer does
  // not see the latter.)
  ctl_waiting.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::unique_lock<std::mutex>> held;
  held.reserve(lanes.size());
  const auto deadline = std::chrono::steady_clock::now() + cfg.control_timeout;
  bool got = true;
  for (auto& l : lanes) {
    std::unique_lock lk(l.mu, std::try_to_lock);
    while (!lk.owns_lock() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      lk.try_lock();
    }
    if (!lk.owns_lock()) {
      got = false;
      break;
    }
    held.push_back(std::move(lk));
  }
  ctl_waiting.fetch_sub(1, std::memory_order_relaxed);
  if (got && !rt) return fail(errc::bad_state, std::string(what) + " on " + cfg.name + ": the NIC is stopped");
  if (!got)
    return fail(errc::timeout, std::string(what) + " on " + cfg.name + ": the NIC's lcores did not take the request within " +
                                   std::to_string(cfg.control_timeout.count()) + " ms");
  return f();
}

std::uint64_t nic::impl::mbufs_in_use() const noexcept {
  std::uint64_t n = 0;
  for (const auto& ps : ports) n += rte_mempool_in_use_count(ps.p->pool());
  for (const rte_mempool* mp : {lin_pool, mc_payload_pool, mc_header_pool, mc_clone_pool})
    if (mp != nullptr) n += rte_mempool_in_use_count(mp);
  return n;
}

// ---- nic ----

nic::nic(std::unique_ptr<impl> p) : _p(std::move(p)) {}
nic::~nic() = default;

result<std::unique_ptr<nic>> nic::create(const nic_config& cfg) {
  auto p = std::make_unique<impl>();
  p->cfg = cfg;
  p->groups = std::make_unique<group_registry>(cfg.name);
  if (!cfg.capture_path.empty()) {
    auto w = pcap_writer::open(cfg.capture_path, cfg.port.max_frame_bytes);
    if (!w) return fail(w.err().code, "nic " + cfg.name + ": " + w.err().message);
    p->capture.emplace(std::move(w.value()));
  }
  if (auto r = p->init(); !r) return r.err();
  return std::unique_ptr<nic>(new nic(std::move(p)));
}

namespace {
// Every lane's lock, for the calls that may only run while no lcore polls.
std::vector<std::unique_lock<std::mutex>> lock_lanes(std::deque<nic::impl::lane_state>& lanes) {
  std::vector<std::unique_lock<std::mutex>> held;
  for (auto& l : lanes) held.emplace_back(l.mu);
  return held;
}
}  // namespace

void nic::stop() noexcept {
  auto held = lock_lanes(_p->lanes);
  _p->stop();
}

void nic::cancel_sends() noexcept {
  std::unique_lock lk(_p->lanes[0].mu);
  _p->take_posted();
  for (auto& j : _p->jobs) {
    if (!j->mgmt) _p->region_done(j->m.region);
    _p->finish_job(*j, fail(errc::aborted, "send: the NIC is shutting down; " + std::to_string(j->next_offset) + " of " +
                                               std::to_string(j->m.len_bytes) + " bytes were queued"));
  }
  _p->jobs.clear();
}

bool nic::idle() noexcept {
  auto held = lock_lanes(_p->lanes);
  if (!_p->rt) return true;
  return _p->idle();
}

std::uint32_t nic::lanes() const noexcept { return static_cast<std::uint32_t>(_p->lanes.size()); }

std::uint32_t nic::poll_lane(std::uint32_t lane) noexcept {
  if (lane >= _p->lanes.size()) return 0;
  if (_p->ctl_waiting.load(std::memory_order_relaxed) != 0) {
    std::this_thread::yield();
    return 0;
  }
  impl::lane_state& l = _p->lanes[lane];
  std::unique_lock lk(l.mu, std::try_to_lock);
  if (!lk || !_p->rt) return 0;
  return _p->poll_lane_locked(l);
}

std::uint32_t nic::poll() noexcept {
  std::uint32_t work = 0;
  for (std::uint32_t k = 0; k < _p->lanes.size(); ++k) work += poll_lane(k);
  return work;
}

void nic::run(const std::atomic<bool>& stop) noexcept {
  // Every lane is polled in each round, so lane 0's bell (rung by control calls, host sends and
  // other lanes' transmissions) is the one to sleep on.
  poll_loop(stop, *_p->lanes[0].bell, _p->cfg.idle_sleep_max, _p->cfg.idle_pause_rounds, [this] { return poll(); });
}

void nic::run_lane(std::uint32_t lane, const std::atomic<bool>& stop) noexcept {
  if (lane >= _p->lanes.size()) return;
  // Lane 0 must look at its ports, which cannot ring; other lanes are rung by whoever gives
  // them work (steered frames).
  const auto max_sleep = lane == 0 ? _p->cfg.idle_sleep_max : std::chrono::microseconds(100'000);
  poll_loop(stop, *_p->lanes[lane].bell, max_sleep, _p->cfg.idle_pause_rounds, [this, lane] { return poll_lane(lane); });
}

errc nic::inject(std::span<const std::byte> frame) noexcept {
  if (frame.size() > _p->cfg.port.max_frame_bytes) return errc::invalid_argument;
  rte_mempool* pool = _p->lin_pool != nullptr ? _p->lin_pool : _p->tx_pool;
  rte_mbuf* m = frame_to_mbufs(pool, frame.data(), static_cast<std::uint32_t>(frame.size()), false);
  if (m == nullptr) return errc::no_memory;
  rt::packet pk{rte_pktmbuf_mtod(m, std::byte*), m->pkt_len, reinterpret_cast<std::uint64_t>(m)};
  auto held = lock_lanes(_p->lanes);
  if (!_p->rt) {
    mbuf_free(m);
    return errc::bad_state;
  }
  auto& ps = _p->ports[0];
  if (_p->capture) _p->capture_mbuf(m);
  ps.rx_packets.add(1);
  ps.rx_bytes.add(pk.frame_len);
  // The frame belongs to lane 0's burst; while another HPU's inbox is full, every lane runs.
  while (_p->rt->rx_burst(0, &pk, 1) == 0)
    for (auto& l : _p->lanes) _p->poll_lane_locked(l);
  return errc::ok;
}

bool nic::quiesce(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto held = lock_lanes(_p->lanes);
  if (!_p->rt) return true;
  while (std::chrono::steady_clock::now() < deadline) {
    for (auto& l : _p->lanes) _p->poll_lane_locked(l);
    if (_p->idle()) return true;
    std::this_thread::yield();
  }
  return false;
}

rt::runtime& nic::runtime() noexcept { return *_p->rt; }
rte_mempool* nic::port_pool(std::uint32_t index) const noexcept {
  return index < _p->ports.size() ? _p->ports[index].p->pool() : nullptr;
}
std::uint32_t nic::rank() const noexcept { return _p->cfg.rank; }
const std::string& nic::name() const noexcept { return _p->cfg.name; }
std::uint32_t nic::max_payload_bytes() const noexcept { return _p->max_payload; }

result<rt::region_id> nic::register_host_memory(std::span<std::byte> mem) {
  return _p->with_lanes_aside("register_host_memory", [&]() -> result<rt::region_id> {
    auto r = _p->rt->register_host_memory(mem);
    if (!r) return r;
    std::lock_guard lk(_p->post_mu);
    if (_p->regions.size() <= r.value()) _p->regions.resize(r.value() + 1);
    _p->regions[r.value()] = {mem, 0};
    return r;
  });
}

result<void> nic::unregister_host_memory(rt::region_id region) {
  return _p->with_lanes_aside("unregister_host_memory", [&]() -> result<void> {
    std::lock_guard lk(_p->post_mu);
    if (region < _p->regions.size() && _p->regions[region].active_sends > 0)
      return fail(errc::bad_state, "unregister_host_memory: a message from host region " + std::to_string(region) + " is being sent");
    auto r = _p->rt->unregister_host_memory(region);
    if (r) _p->regions[region] = {};
    return r;
  });
}

result<rt::ec_id> nic::install(const rt::ec_config& cfg) {
  return _p->with_lanes_aside("install", [&]() { return _p->rt->install(cfg); });
}

result<void> nic::uninstall(rt::ec_id ec) {
  return _p->with_lanes_aside("uninstall", [&]() { return _p->rt->uninstall(ec); });
}

std::size_t nic::poll_events(rt::ec_id ec, std::span<rt::host_event> out) noexcept {
  return _p->rt ? _p->rt->poll_events(ec, out) : 0;
}

std::size_t nic::wait_events(rt::ec_id ec, std::span<rt::host_event> out, std::chrono::nanoseconds timeout) noexcept {
  return _p->rt ? _p->rt->wait_events(ec, out, timeout) : 0;
}

nic_stats nic::stats() const {
  nic_stats s;
  const impl& p = *_p;
  s.name = p.cfg.name;
  s.rank = p.cfg.rank;
  for (const auto& ps : p.ports) {
    nic_port_stats o;
    o.name = ps.p->name();
    o.rx_packets = ps.rx_packets.get();
    o.rx_bytes = ps.rx_bytes.get();
    o.tx_packets = ps.tx_packets.get();
    o.tx_bytes = ps.tx_bytes.get();
    o.forwarded = ps.forwarded.get();
    o.hw = ps.p->hw_stats();
    s.drops[static_cast<std::size_t>(nic_drop::no_mbuf)] += o.hw.rx_nombuf;
    s.drops[static_cast<std::size_t>(nic_drop::rx_queue_full)] += o.hw.imissed;
    s.ports.push_back(std::move(o));
  }
  for (std::size_t d = 0; d < nic_drop_count; ++d) s.drops[d] += p.drops[d].get();
  for (const auto& l : p.lanes) {
    s.drops[static_cast<std::size_t>(nic_drop::tx_queue_full)] += l.tx_full.get();
    s.drops[static_cast<std::size_t>(nic_drop::no_mbuf)] += l.no_mbuf.get();
    s.drops[static_cast<std::size_t>(nic_drop::unroutable)] += l.unroutable.get();
    s.loopback_packets += l.loopback.get();
    s.multicast_shared += l.shared_sends.get();
    s.forward_in_place += l.forward_in_place.get();
    s.forward_chained += l.forward_chained.get();
  }
  s.unshared = p.unshared.load(std::memory_order_relaxed);
  if (p.rt) s.runtime = p.rt->stats();
  std::uint64_t rejected = 0;
  for (auto v : s.runtime.frames_rejected) rejected += v;
  s.drops[static_cast<std::size_t>(nic_drop::malformed)] = rejected;
  s.drops[static_cast<std::size_t>(nic_drop::unknown_ec)] = s.runtime.unknown_ec;
  s.host_messages_sent = p.host_messages.get();
  s.host_packets_sent = p.host_packets.get();
  s.host_bytes_sent = p.host_bytes.get();
  s.mbufs_in_use = p.mbufs_in_use();
  s.capture_frames = p.capture_frames.get();
  s.capture_errors = p.capture_errors.get();
  s.mgmt_received = p.mgmt_received.get();
  s.mgmt_sent = p.mgmt_sent.get();
  return s;
}

rt::runtime_stats nic::runtime_stats() const { return _p->rt ? _p->rt->stats() : rt::runtime_stats{}; }
group_registry& nic::groups() noexcept { return *_p->groups; }

}  // namespace spin::emu
