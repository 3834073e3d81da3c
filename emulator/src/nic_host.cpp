// The emulated NIC's host messages (nic_control::send and post: a host buffer cut into packets
// by lane 0) and management datagrams (send_mgmt, wait_mgmt).
#include "nic_impl.hpp"

namespace spin::emu {

void nic::impl::finish_job(send_job& j, error e) noexcept {
  std::lock_guard lk(j.mu);
  j.done = true;
  j.err = std::move(e);
  j.cv.notify_all();
}

std::uint32_t nic::impl::advance_jobs() noexcept {
  std::uint32_t built = 0;
  while (!jobs.empty()) {
    send_job& j = *jobs.front();
    bool finished = j.cancelled;
    bool unencodable = false;
    while (!finished) {
      const std::int32_t pi = route(j.m.dest_rank);
      auto& st = static_cast<std::size_t>(pi) == ports.size() ? lanes[0].loop : ports[static_cast<std::uint32_t>(pi)].stage;
      if (st.full()) return built;  // port busy: continue next round
      const std::uint64_t left = j.m.len_bytes - j.next_offset;
      const std::uint32_t n = static_cast<std::uint32_t>(std::min<std::uint64_t>(left, host_payload));
      const rt::wire::header h = host::packet_header(j.m, cfg.rank, j.seq, j.next_offset, n, j.mgmt);
      // Straight from host memory into the frame: the one copy a real NIC's DMA also makes.
      bool bad = false;
      rte_mbuf* m = encode_frame(static_cast<std::uint32_t>(pi), rt::wire::rank_endpoint(j.m.dest_rank, cfg.runtime.udp_port),
                                 h, j.data.subspan(j.next_offset, n), host_frame, bad);
      if (m == nullptr && bad) {
        unencodable = true;
        break;
      }
      if (m == nullptr) return built;  // no mbuf now: the message waits (nothing is dropped)
      st.push_back(m);
      if (capture && &st != &lanes[0].loop) capture_mbuf(m);
      ++built;
      host_packets.add(1);
      host_bytes.add(n);
      j.next_offset += n;
      ++j.seq;
      finished = j.next_offset == j.m.len_bytes;
      if (built >= cfg.burst) break;
    }
    if (!finished && !unencodable) return built;
    if (!j.cancelled && !unencodable) host_messages.add(1);
    if (!j.mgmt) region_done(j.m.region);
    auto keep = jobs.front();
    jobs.pop_front();
    if (keep->cancelled) continue;
    if (unencodable)
      finish_job(*keep, error{errc::invalid_argument, "send: packet " + std::to_string(keep->seq) + " of the message cannot be encoded as a frame (" +
                                                          std::to_string(host_payload) + " bytes of payload per packet)"});
    else
      finish_job(*keep, error{});
  }
  return built;
}

result<void> nic::impl::queue_job(const std::shared_ptr<send_job>& job) {
  const host::message& m = job->m;
  std::lock_guard lk(post_mu);
  if (stopped) return fail(errc::bad_state, "send: the NIC was stopped");
  if (job->mgmt) {
    if (route(m.dest_rank) < 0) return fail(errc::not_found, "send_mgmt: no route from " + cfg.name + " to rank " + std::to_string(m.dest_rank));
    const std::uint32_t pi = static_cast<std::uint32_t>(route(m.dest_rank));
    rt::wire::header probe;
    if (pi < ports.size() && rt::wire::encoded_len(probe, m.len_bytes) > tx_room && !ports[pi].p->tx_multi_seg())
      return fail(errc::invalid_argument, "send_mgmt: a datagram of " + std::to_string(m.len_bytes) + " bytes does not fit one mbuf of port " +
                                              ports[pi].p->name());
    job->data = job->owned;
    posted.push_back(job);
    has_posted.store(true, std::memory_order_release);
    lanes[0].bell->ring();
    return {};
  }
  if (m.region >= regions.size() || regions[m.region].mem.empty())
    return fail(errc::not_found, "send: host region " + std::to_string(m.region) + " is not registered");
  auto& reg = regions[m.region];
  if (m.offset_bytes > reg.mem.size() || m.len_bytes > reg.mem.size() - m.offset_bytes)
    return fail(errc::out_of_bounds, "send: bytes [" + std::to_string(m.offset_bytes) + ", +" + std::to_string(m.len_bytes) +
                                         ") lie outside host region " + std::to_string(m.region) + " of " + std::to_string(reg.mem.size()) + " bytes");
  if (route(m.dest_rank) < 0) return fail(errc::not_found, "send: no route from " + cfg.name + " to rank " + std::to_string(m.dest_rank));
  if (m.len_bytes / host_payload >= (1ull << 32)) return fail(errc::invalid_argument, "send: message needs more than 2^32 packets");
  const std::uint32_t pi = static_cast<std::uint32_t>(route(m.dest_rank));
  rt::wire::header probe;
  const std::size_t frame = rt::wire::encoded_len(probe, std::min<std::uint64_t>(m.len_bytes, host_payload));
  if (pi < ports.size() && frame > tx_room && !ports[pi].p->tx_multi_seg())
    return fail(errc::invalid_argument, "send: frames of " + std::to_string(frame) + " bytes do not fit one " + std::to_string(tx_room) +
                                            "-byte mbuf and port " + ports[pi].p->name() +
                                            " cannot send chained mbufs: lower the payload per packet or raise the mbuf size");
  job->data = reg.mem.subspan(m.offset_bytes, m.len_bytes);
  if (job->copy_inline && m.len_bytes <= job->inline_data.size()) {
    std::memcpy(job->inline_data.data(), job->data.data(), job->data.size());
    job->data = std::span<const std::byte>(job->inline_data.data(), job->data.size());
  }
  reg.active_sends++;
  posted.push_back(job);
  has_posted.store(true, std::memory_order_release);
  lanes[0].bell->ring();
  return {};
}

result<void> nic::post(const host::message& m) {
  auto job = std::make_shared<send_job>();
  job->m = m;
  job->copy_inline = true;
  return _p->queue_job(job);
}

result<void> nic::send(const host::message& m, std::chrono::milliseconds timeout) {
  auto job = std::make_shared<send_job>();
  job->m = m;
  auto queued = _p->queue_job(job);
  if (!queued) return queued;
  std::unique_lock lk(job->mu);
  if (job->cv.wait_for(lk, timeout, [&] { return job->done; })) return job->err.code == errc::ok ? result<void>() : result<void>(job->err);
  lk.unlock();
  // Timed out: take the rest of the message back (packets already staged are sent).
  std::unique_lock sl(_p->lanes[0].mu);
  std::unique_lock jl(job->mu);
  if (job->done) return job->err.code == errc::ok ? result<void>() : result<void>(job->err);
  job->cancelled = true;
  return fail(errc::timeout, "send to rank " + std::to_string(m.dest_rank) + ": the transmit queue stayed full for " +
                                 std::to_string(timeout.count()) + " ms; " + std::to_string(job->next_offset) + " of " +
                                 std::to_string(m.len_bytes) + " bytes were queued");
}

result<void> nic::send_mgmt(std::uint32_t dest, std::span<const std::byte> bytes) {
  if (bytes.empty() || bytes.size() > _p->max_payload)
    return fail(errc::invalid_argument, "send_mgmt: a datagram holds 1.." + std::to_string(_p->max_payload) + " bytes, not " +
                                            std::to_string(bytes.size()));
  if (dest == _p->cfg.rank) return fail(errc::invalid_argument, "send_mgmt: " + _p->cfg.name + " cannot send a datagram to itself");
  auto job = std::make_shared<send_job>();
  job->mgmt = true;
  job->owned.assign(bytes.begin(), bytes.end());
  job->m.dest_rank = dest;
  job->m.message_id = _p->mgmt_ids.fetch_add(1, std::memory_order_relaxed) + 1;
  job->m.len_bytes = bytes.size();
  auto r = _p->queue_job(job);
  if (r) _p->mgmt_sent.add(1);
  return r;
}

std::size_t nic::wait_mgmt(std::span<mgmt_datagram> out, std::chrono::nanoseconds timeout) {
  if (out.empty()) return 0;
  std::unique_lock lk(_p->mgmt_mu);
  _p->mgmt_cv.wait_for(lk, timeout, [&] { return !_p->mgmt_in.empty() || _p->mgmt_stop; });
  std::size_t n = 0;
  while (n < out.size() && !_p->mgmt_in.empty()) {
    out[n++] = std::move(_p->mgmt_in.front());
    _p->mgmt_in.pop_front();
  }
  return n;
}

}  // namespace spin::emu
