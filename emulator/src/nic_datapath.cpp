// The emulated NIC's data path, run to completion on each lane (docs/emulator.md, "Data
// path"): receive bursts into the runtime, the loopback, transmit bursts, and what handlers
// send (send, multicast with shared payloads, forward in place).
#include "nic_impl.hpp"

namespace spin::emu {

errc nic::impl::hpu_send(std::uint32_t hpu, std::uint32_t dest, const rt::wire::header& h,
                         std::span<const std::byte> payload) noexcept {
  lane_state& l = lanes[hpu];
  const std::int32_t pi = route(dest);
  if (pi < 0) {
    l.unroutable.add(1);  // the lane's own counter: any lane's handlers send
    return errc::not_found;
  }
  const rt::wire::endpoint dst = rt::wire::rank_endpoint(dest, cfg.runtime.udp_port);
  // One copy of the payload (spin-bench handlers: pingpong 1 KiB, HPU cycles per packet down by
  // the second copy).
  bool bad = false;
  rte_mbuf* m = encode_frame(static_cast<std::uint32_t>(pi), dst, h, payload, l.buf, bad);
  if (m == nullptr) {
    if (bad) return errc::invalid_argument;
    l.no_mbuf.add(1);
    return errc::no_space;
  }
  return enqueue(hpu, static_cast<std::uint32_t>(pi), m);
}

errc nic::impl::enqueue(std::uint32_t hpu, std::uint32_t pi, rte_mbuf* m) noexcept {
  lane_state& l = lanes[hpu];
  if (pi == ports.size()) {
    if (l.loop.full()) {
      mbuf_free(m);
      l.tx_full.add(1);
      return errc::no_space;
    }
    l.loop.push_back(m);
    return errc::ok;
  }
  if (hpu != 0) {
    if (!l.to_port[pi]->try_push(m)) {
      mbuf_free(m);
      l.tx_full.add(1);
      return errc::no_space;
    }
    lanes[0].bell->ring();  // one load unless lane 0 sleeps
    return errc::ok;
  }
  // Lane 0 owns the port's queue: the frame goes into its stage, which is sent a burst at a
  // time (l2fwd's TX buffer) and at the end of every round.
  port_state& ps = ports[pi];
  if (ps.stage.full()) tx_flush(ps);
  if (!stage_push(pi, m)) {
    mbuf_free(m);
    l.tx_full.add(1);
    return errc::no_space;
  }
  if (ps.stage.size() >= cfg.burst) tx_flush(ps);
  return errc::ok;
}

// Multicast with one copy of the payload: the payload goes once into an mbuf, and each
// destination gets a frame of two segments, its own header mbuf (addresses, message id)
// chained in front of a clone of that mbuf (DPDK's indirect mbufs: a reference, no copy), all
// three from the multicast pools. Where a copy cannot share (one destination; the payload small
// enough that a header mbuf and a clone cost more than copying it, or larger than one mbuf; the
// multicast pools dry; an egress port that does not send chains), that copy is a whole frame
// from its egress port's pool.
std::uint32_t nic::impl::hpu_multicast(std::uint32_t hpu, std::span<const std::uint32_t> dests, const rt::wire::header& h,
                                       std::span<const std::byte> payload, errc& last_error) noexcept {
  lane_state& l = lanes[hpu];
  rte_mbuf* shared = nullptr;
  if (dests.size() > 1 && payload.size() >= share_min_bytes && payload.size() <= tx_room) {
    shared = mbuf_alloc(mc_payload_pool);
    // Without it the copies go whole (each may still find an mbuf of its port; one that does
    // not is counted there).
    if (shared != nullptr)
      std::memcpy(rte_pktmbuf_append(shared, static_cast<std::uint16_t>(payload.size())), payload.data(), payload.size());
  }
  std::uint32_t sent = 0;
  rt::wire::header one = h;
  for (std::size_t i = 0; i < dests.size(); ++i) {
    one.message_id = h.message_id + i;
    const std::int32_t pi = route(dests[i]);
    const bool chains = pi >= 0 && (static_cast<std::uint32_t>(pi) == ports.size() || ports[static_cast<std::uint32_t>(pi)].p->tx_multi_seg());
    if (shared == nullptr || !chains) {
      const errc e = hpu_send(hpu, dests[i], one, payload);
      if (e == errc::ok) ++sent;
      else last_error = e;
      continue;
    }
    bool bad = false;
    rte_mbuf* hdr = chain_to(shared, dests[i], one,
                             std::span<const std::byte>(rte_pktmbuf_mtod(shared, const std::byte*), shared->data_len), bad);
    if (hdr == nullptr && bad) {
      last_error = errc::invalid_argument;
      continue;
    }
    if (hdr == nullptr) {  // the multicast pools are dry: this copy goes whole
      const errc e = hpu_send(hpu, dests[i], one, payload);
      if (e == errc::ok) ++sent;
      else last_error = e;
      continue;
    }
    const errc e = enqueue(hpu, static_cast<std::uint32_t>(pi), hdr);
    if (e == errc::ok) {
      ++sent;
      l.shared_sends.add(1);
    } else {
      last_error = e;
    }
  }
  if (shared != nullptr) mbuf_free(shared);  // the clones still in flight keep it
  return sent;
}

rte_mbuf* nic::impl::chain_to(const rte_mbuf* seg, std::uint32_t dest, const rt::wire::header& h,
                               std::span<const std::byte> payload, bool& bad) noexcept {
  bad = false;
  rte_mbuf* hdr = mbuf_alloc(mc_header_pool);
  rte_mbuf* clone = hdr != nullptr ? mbuf_alloc(mc_clone_pool) : nullptr;
  if (clone == nullptr) {
    if (hdr != nullptr) mbuf_free(hdr);
    return nullptr;
  }
  // A reference to the buffer that holds `seg`'s data (its owner when `seg` is itself a clone),
  // narrowed to the payload.
  rte_pktmbuf_attach(clone, const_cast<rte_mbuf*>(seg));
  clone->data_off = static_cast<std::uint16_t>(payload.data() - static_cast<const std::byte*>(clone->buf_addr));
  clone->data_len = static_cast<std::uint16_t>(payload.size());
  clone->pkt_len = clone->data_len;
  const std::size_t hl =
      rt::wire::encode_headers(self, rt::wire::rank_endpoint(dest, cfg.runtime.udp_port), h, payload.size(),
                               std::span<std::byte>(rte_pktmbuf_mtod(hdr, std::byte*), rte_pktmbuf_tailroom(hdr)));
  if (hl == 0) {
    mbuf_free(clone);
    mbuf_free(hdr);
    bad = true;
    return nullptr;
  }
  (void)rte_pktmbuf_append(hdr, static_cast<std::uint16_t>(hl));
  hdr->next = clone;
  hdr->nb_segs = 2;
  hdr->pkt_len = hdr->data_len + clone->data_len;
  return hdr;
}

// Zero-copy forward of a received frame `m` (ctx::forward; `payload` lies in it). The usual
// case: this NIC holds the only reference to a one-buffer frame, and the new headers go in
// place right in front of the payload (a forward keeps the collective extension, so they are
// never longer than the received ones unless those had IP options); a reference is taken for
// the outgoing frame, and the runtime's own goes when the packet's handlers are done. When the
// buffer is shared (a second forward while the first frame is still queued, a multicast copy's
// payload) or its headroom too small, a header mbuf goes in front of a clone of the payload.
// A copy is the last resort: an egress port that sends no chains, a payload under
// share_min_bytes that cannot go in place, or dry multicast pools.
errc nic::impl::hpu_forward(std::uint32_t hpu, std::uint32_t dest, const rt::wire::header& h, rte_mbuf* m,
                            std::span<const std::byte> payload) noexcept {
  lane_state& l = lanes[hpu];
  const std::int32_t pi = route(dest);
  if (pi < 0) {
    l.unroutable.add(1);
    return errc::not_found;
  }
  const rte_mbuf* seg = m;
  while (seg != nullptr && !(payload.data() >= rte_pktmbuf_mtod(seg, const std::byte*) &&
                             payload.data() + payload.size() <= rte_pktmbuf_mtod(seg, const std::byte*) + seg->data_len))
    seg = seg->next;
  if (seg == nullptr) return hpu_send(hpu, dest, h, payload);  // a private copy the runtime made
  const std::size_t hl = rt::wire::encoded_len(h, payload.size()) - payload.size();
  auto* base = static_cast<std::byte*>(m->buf_addr);
  // Acquire: the holders that let go of the buffer before did so with a release (mbuf_free).
  if (m->nb_segs == 1 && RTE_MBUF_DIRECT(m) && __atomic_load_n(&m->refcnt, __ATOMIC_ACQUIRE) == 1 &&
      static_cast<std::size_t>(payload.data() - base) >= hl) {
    detail::tsan_acquire(m);
    std::byte* start = const_cast<std::byte*>(payload.data()) - hl;
    if (rt::wire::encode_headers(self, rt::wire::rank_endpoint(dest, cfg.runtime.udp_port), h, payload.size(),
                                 std::span<std::byte>(start, hl)) != hl)
      return errc::invalid_argument;
    rte_mbuf_refcnt_update(m, 1);
    m->data_off = static_cast<std::uint16_t>(start - base);
    m->data_len = static_cast<std::uint16_t>(hl + payload.size());
    m->pkt_len = m->data_len;
    const errc e = enqueue(hpu, static_cast<std::uint32_t>(pi), m);  // frees the new reference when it fails
    if (e == errc::ok) l.forward_in_place.add(1);
    return e;
  }
  const bool chains = static_cast<std::uint32_t>(pi) == ports.size() || ports[static_cast<std::uint32_t>(pi)].p->tx_multi_seg();
  if (!chains || payload.size() < share_min_bytes) return hpu_send(hpu, dest, h, payload);
  bool bad = false;
  rte_mbuf* hdr = chain_to(seg, dest, h, payload, bad);
  if (hdr == nullptr) return bad ? errc::invalid_argument : hpu_send(hpu, dest, h, payload);
  const errc e = enqueue(hpu, static_cast<std::uint32_t>(pi), hdr);
  if (e == errc::ok) l.forward_chained.add(1);
  return e;
}

bool nic::impl::to_packet(lane_state& l, rte_mbuf*& m, rt::packet& out) noexcept {
  if (m->nb_segs == 1) {
    out = rt::packet{rte_pktmbuf_mtod(m, std::byte*), m->pkt_len, reinterpret_cast<std::uint64_t>(m)};
    // A frame another NIC forwarded in place while its handler, which may still read the
    // payload, is running; or a clone: shared, so handlers that write get a private copy.
    out.shared = !RTE_MBUF_DIRECT(m) || __atomic_load_n(&m->refcnt, __ATOMIC_ACQUIRE) > 1;
    return true;
  }
  rte_mbuf* tail = m->next;
  if (m->nb_segs == 2 && RTE_MBUF_CLONED(tail) && m->data_len <= rt::wire::max_overhead) {
    out = rt::packet{rte_pktmbuf_mtod(m, std::byte*), m->data_len, reinterpret_cast<std::uint64_t>(m)};
    out.tail = rte_pktmbuf_mtod(tail, std::byte*);
    out.tail_len = tail->data_len;
    out.shared = true;
    return true;
  }
  // Handlers see one contiguous frame: copy the chain into one large mbuf. Without scatter
  // configured (a PMD that passes chains through, like net_ring) the frame still fits one
  // mbuf of the port's size.
  rte_mbuf* lin = linear_copy(m);
  mbuf_free(m);
  m = lin;
  if (lin == nullptr) {
    l.no_mbuf.add(1);  // the lane's own counter (counted as no_mbuf): any lane may get here
    return false;
  }
  out = rt::packet{rte_pktmbuf_mtod(lin, std::byte*), lin->pkt_len, reinterpret_cast<std::uint64_t>(lin)};
  return true;
}

bool nic::impl::stage_push(std::uint32_t port_index, rte_mbuf* m) noexcept {
  auto& st = ports[port_index].stage;
  if (st.full()) return false;
  st.push_back(m);
  if (capture) capture_mbuf(m);
  return true;
}

std::uint32_t nic::impl::rx(port_state& ps, std::uint32_t index) noexcept {
  std::uint32_t moved = 0;
  // Frames the runtime could not take last time (another HPU's inbox full) go first; no new burst
  // is taken until they are in: the port's RX queue then fills and DPDK counts imissed.
  std::uint32_t pending = 0;
  while (ps.rx_head + pending < ps.rx_pending.size() && ps.rx_pending[ps.rx_head + pending].frame != nullptr) ++pending;
  if (pending > 0) {
    const std::uint32_t k = rt->rx_burst(0, &ps.rx_pending[ps.rx_head], pending);
    for (std::uint32_t i = 0; i < k; ++i) ps.rx_pending[ps.rx_head + i] = {};
    ps.rx_head += k;
    if (k < pending) return k;
    ps.rx_head = 0;
    moved += k;
  }
  const std::uint16_t n = rte_eth_rx_burst(ps.p->id(), 0, mbuf_buf.data(), static_cast<std::uint16_t>(cfg.burst));
  if (n == 0) return moved;
  for (std::uint16_t i = 0; i < n; ++i) {
    sync_in(mbuf_buf[i]);
    // The headers (the MAC check and the parser read them): a spin header ends at byte 88 or
    // 104, in the frame's second cache line.
    rte_prefetch0(rte_pktmbuf_mtod(mbuf_buf[i], const void*));
    rte_prefetch0(rte_pktmbuf_mtod_offset(mbuf_buf[i], const char*, RTE_CACHE_LINE_SIZE));
  }
  std::uint32_t out = 0;
  const std::uint32_t max_frame = cfg.port.max_frame_bytes;
  for (std::uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = mbuf_buf[i];
    ps.rx_packets.add(1);
    ps.rx_bytes.add(m->pkt_len);
    if (capture) capture_mbuf(m);
    if (m->pkt_len > max_frame) {
      count_drop(nic_drop::oversize);
      mbuf_free(m);
      continue;
    }
    rt::packet pk;
    if (!to_packet(lanes[0], m, pk)) continue;
    auto* frame = rte_pktmbuf_mtod(m, std::byte*);
    std::uint32_t dest = 0;
    if (m->pkt_len >= 14 && mac_rank(frame, dest) && dest != cfg.rank) {
      // Transit frame (a multi-port NIC on the path between two other ranks). A multicast copy
      // (a header mbuf and a clone) leaves whole by a port that cannot send chains.
      const std::int32_t pi = route(dest);
      if (m->nb_segs > 1 && pi >= 0 && static_cast<std::uint32_t>(pi) < ports.size() &&
          !ports[static_cast<std::uint32_t>(pi)].p->tx_multi_seg()) {
        rte_mbuf* lin = linear_copy(m);
        mbuf_free(m);
        m = lin;
        if (lin == nullptr) {
          count_drop(nic_drop::no_mbuf);
          continue;
        }
      }
      if (pi < 0 || static_cast<std::uint32_t>(pi) == index || !stage_push(static_cast<std::uint32_t>(pi), m)) {
        count_drop(pi < 0 || static_cast<std::uint32_t>(pi) == index ? nic_drop::unroutable : nic_drop::tx_queue_full);
        mbuf_free(m);
      } else {
        ps.forwarded.add(1);
      }
      continue;
    }
    if (take_mgmt(m)) {
      mbuf_free(m);
      continue;
    }
    lanes[0].rx_buf[out++] = pk;
  }
  const std::uint32_t k = out == 0 ? 0 : rt->rx_burst(0, lanes[0].rx_buf.data(), out);
  if (k < out) {
    for (std::uint32_t i = k; i < out; ++i) ps.rx_pending[i - k] = lanes[0].rx_buf[i];
    ps.rx_head = 0;
  }
  return moved + n;
}

bool nic::impl::take_mgmt(const rte_mbuf* m) noexcept {
  namespace w = rt::wire;
  if (m->nb_segs != 1 || m->data_len < w::min_overhead) return false;
  const auto* f = rte_pktmbuf_mtod(m, const std::uint8_t*);
  // The cheap test first (every data frame takes it): IPv4, UDP, the spin port, type control.
  if (f[12] != 0x08 || f[13] != 0x00 || f[23] != 17) return false;
  const std::uint32_t spin = w::eth_len + 4u * (f[14] & 0x0fu) + w::udp_len;
  if (spin + 2 > m->data_len) return false;
  if (((std::uint32_t{f[spin - 6]} << 8) | f[spin - 5]) != cfg.runtime.udp_port) return false;
  if (f[spin + 1] != static_cast<std::uint8_t>(w::packet_type::control)) return false;
  w::parsed ps;
  w::reject why{};
  if (!w::parse(std::span<const std::byte>(reinterpret_cast<const std::byte*>(f), m->data_len), cfg.runtime.udp_port, ps, why))
    return false;
  const w::header& h = ps.hdr;
  if ((h.flags & (w::flag_start | w::flag_end)) != (w::flag_start | w::flag_end) || h.payload_len == 0) return false;
  mgmt_datagram d;
  d.source_rank = h.source_rank;
  d.bytes.assign(reinterpret_cast<const std::byte*>(f) + ps.payload_offset, reinterpret_cast<const std::byte*>(f) + ps.payload_offset + h.payload_len);
  {
    std::lock_guard lk(mgmt_mu);
    if (mgmt_in.size() >= nic::mgmt_queue_depth) {
      count_drop(nic_drop::mgmt_queue_full);
      return true;
    }
    mgmt_in.push_back(std::move(d));
  }
  mgmt_received.add(1);
  mgmt_cv.notify_one();
  return true;
}

std::uint32_t nic::impl::tx_flush(port_state& ps) noexcept {
  auto& st = ps.stage;
  if (st.empty()) return 0;
  const auto n = static_cast<std::uint16_t>(std::min<std::uint32_t>(st.size(), UINT16_MAX));
  // Bytes are summed before the burst: a frame the port took may at once be received and freed
  // by another lcore (cluster mode) and its mbuf reused, so it must not be read after. The
  // frames the port did not take are still ours.
  std::uint64_t bytes = 0;
  for (std::uint16_t i = 0; i < n; ++i) {
    bytes += st[i]->pkt_len;
    sync_out(st[i]);
  }
  const std::uint16_t sent = rte_eth_tx_burst(ps.p->id(), 0, st.data(), n);
  for (std::uint16_t i = sent; i < n; ++i) bytes -= st[i]->pkt_len;
  ps.tx_bytes.add(bytes);
  ps.tx_packets.add(sent);
  // The unsent rest waits for the next round (the port's queue is full); nothing is dropped here.
  st.drop_front(sent);
  return sent;
}

std::uint32_t nic::impl::tx_drain(port_state& ps, std::uint32_t index) noexcept {
  auto& st = ps.stage;
  for (std::size_t h = 1; h < lanes.size() && st.room() >= cfg.burst; ++h) {
    auto& r = *lanes[h].to_port[index];
    const std::uint32_t old = st.size();
    if (st.dequeue_from(r, cfg.burst) == 0) continue;
    for (std::uint32_t i = old; i < st.size(); ++i) sync_in(st[i]);
    if (capture)
      for (std::uint32_t i = old; i < st.size(); ++i) capture_mbuf(st[i]);
  }
  return tx_flush(ps);
}

std::uint32_t nic::impl::loop_drain(lane_state& l) noexcept {
  if (l.loop.empty()) return 0;
  const std::uint32_t n = std::min<std::uint32_t>(l.loop.size(), static_cast<std::uint32_t>(l.rx_buf.size()));
  std::uint32_t got = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    rte_mbuf* m = l.loop[i];
    if (to_packet(l, m, l.rx_buf[got])) l.rx_buf[got++].local = true;  // never crossed a link
  }
  // A frame that failed to_packet is freed and counted; the runtime takes the others.
  std::uint32_t k = rt->rx_burst(l.index, l.rx_buf.data(), got);
  // The runtime may keep some back (another HPU's inbox is full): they stay at the front of the
  // loop, as the frames (perhaps linearised copies) the runtime was given.
  const std::uint32_t kept = got - k;
  rte_mbuf** a = l.loop.data();
  for (std::uint32_t i = 0; i < kept; ++i) a[n - kept + i] = reinterpret_cast<rte_mbuf*>(l.rx_buf[k + i].cookie);
  l.loop.drop_front(n - kept);
  l.loopback.add(k);
  return k + (n - got);
}

std::uint32_t nic::impl::poll_lane_locked(lane_state& l) noexcept {
  std::uint32_t work = 0;
  if (l.index != 0) {
    work += rt->poll(l.index);
    work += loop_drain(l);
    return work;
  }
  if (capture) {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    capture_ts = std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
  }
  for (std::uint32_t i = 0; i < ports.size(); ++i) work += rx(ports[i], i);
  if (work == 0) work += rt->poll(0);
  take_posted();
  if (!jobs.empty()) work += advance_jobs();
  for (std::uint32_t i = 0; i < ports.size(); ++i) work += tx_drain(ports[i], i);
  work += loop_drain(l);
  return work;
}

bool nic::impl::idle() const noexcept {
  if (!jobs.empty() || has_posted.load(std::memory_order_acquire)) return false;
  for (const auto& ps : ports) {
    if (!ps.stage.empty()) return false;
    if (ps.rx_head < ps.rx_pending.size() && ps.rx_pending[ps.rx_head].frame != nullptr) return false;
  }
  for (const auto& l : lanes) {
    if (!l.loop.empty() || rt->has_work(l.index)) return false;
    for (const auto& r : l.to_port)
      if (!r->empty()) return false;
  }
  return true;
}

}  // namespace spin::emu
