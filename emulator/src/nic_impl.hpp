// The emulated NIC's private parts (nic::impl), shared by its files: nic.cpp (set-up, the
// control path, statistics), nic_datapath.cpp (receive, transmit, loopback, what handlers
// send: the run-to-completion data path of docs/emulator.md, "Data path") and nic_host.cpp
// (host messages and management datagrams).
#pragma once

#include <spin/emu/lcore.hpp>
#include <spin/emu/nic.hpp>
#include <spin/emu/pcap.hpp>

#include <spin/rt/ring.hpp>
#include <spin/rt/stats.hpp>
#include <spin/rt/tx.hpp>
#include <spin/rt/wire.hpp>

#include "mbuf_sync.hpp"

#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_prefetch.h>
#include <rte_ring.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

namespace spin::emu {

using rt::counter;

using detail::mbuf_alloc;
using detail::mbuf_free;
using detail::sync_in;
using detail::sync_out;

namespace detail {

// Copies `len` bytes into a new frame of one or (when `chain`) several mbufs of `pool`.
inline rte_mbuf* frame_to_mbufs(rte_mempool* pool, const std::byte* src, std::uint32_t len, bool chain) noexcept {
  rte_mbuf* head = mbuf_alloc(pool);
  if (head == nullptr) return nullptr;
  const std::uint32_t room = rte_pktmbuf_tailroom(head);
  if (len <= room) {
    std::memcpy(rte_pktmbuf_append(head, static_cast<std::uint16_t>(len)), src, len);
    return head;
  }
  if (!chain) {
    mbuf_free(head);
    return nullptr;
  }
  std::uint32_t done = 0;
  rte_mbuf* cur = head;
  while (true) {
    const std::uint32_t n = std::min<std::uint32_t>(len - done, rte_pktmbuf_tailroom(cur));
    std::memcpy(rte_pktmbuf_mtod(cur, std::byte*), src + done, n);
    cur->data_len = static_cast<std::uint16_t>(n);
    done += n;
    if (cur != head) {
      if (rte_pktmbuf_chain(head, cur) != 0) {
        mbuf_free(cur);
        mbuf_free(head);
        return nullptr;
      }
    } else {
      head->pkt_len = n;
    }
    if (done == len) break;
    cur = mbuf_alloc(pool);
    if (cur == nullptr) {
      mbuf_free(head);
      return nullptr;
    }
  }
  return head;
}

// A destination MAC of the emulated network (02:53:50:00:hi:lo) names a rank.
inline bool mac_rank(const std::byte* frame, std::uint32_t& rank) noexcept {
  const auto* b = reinterpret_cast<const std::uint8_t*>(frame);
  if (b[0] != 0x02 || b[1] != 0x53 || b[2] != 0x50 || b[3] != 0x00) return false;
  rank = (std::uint32_t{b[4]} << 8) | b[5];
  return true;
}

} // namespace detail

using detail::frame_to_mbufs;
using detail::mac_rank;

// Frames waiting for a transmit burst (or, for the loopback, for the runtime): a fixed array
// one lane's thread owns. Frames leave from the front; the rest move down.
class mbuf_stage {
public:
  void init(std::uint32_t capacity) {
    _a = std::make_unique<rte_mbuf*[]>(capacity);
    _cap = capacity;
  }
  std::uint32_t size() const noexcept { return _n; }
  std::uint32_t room() const noexcept { return _cap - _n; }
  bool empty() const noexcept { return _n == 0; }
  bool full() const noexcept { return _n == _cap; }
  rte_mbuf** data() noexcept { return _a.get(); }
  rte_mbuf* operator[](std::uint32_t i) const noexcept { return _a[i]; }
  void push_back(rte_mbuf* m) noexcept { _a[_n++] = m; }
  // Appends up to min(max, room()) frames from HPU ring `r` (this thread is its consumer).
  std::uint32_t dequeue_from(rt::spsc_ring<rte_mbuf*>& r, std::uint32_t max) noexcept {
    const auto got = static_cast<std::uint32_t>(r.try_pop_burst(_a.get() + _n, std::min(max, room())));
    _n += got;
    return got;
  }
  void drop_front(std::uint32_t k) noexcept {
    if (k == 0) return;
    std::memmove(_a.get(), _a.get() + k, (_n - k) * sizeof(rte_mbuf*));
    _n -= k;
  }
  void clear() noexcept { _n = 0; }

private:
  std::unique_ptr<rte_mbuf*[]> _a;
  std::uint32_t _n = 0, _cap = 0;
};

// One host message in progress (nic_control::send).
struct send_job {
  host::message m;
  std::span<const std::byte> data;
  // A management datagram (send_mgmt): a `control` packet of bytes the job owns, from no region.
  bool mgmt = false;
  std::vector<std::byte> owned;
  bool copy_inline = false;                      // post(): small messages are copied at once
  std::array<std::byte, nic::inline_bytes> inline_data{};
  std::uint64_t next_offset = 0;
  std::uint32_t seq = 0;
  std::uint32_t packets = 0;
  bool done = false, cancelled = false;
  error err;
  std::mutex mu;
  std::condition_variable cv;
};

struct nic::impl {
  struct port_state {
    std::unique_ptr<port> p;
    mbuf_stage stage;  // frames waiting for rte_eth_tx_burst (lane 0, which owns the port's queues)
    std::vector<rt::packet> rx_pending;  // accepted from the port, not yet taken by the runtime
    std::uint32_t rx_head = 0;
    counter rx_packets, rx_bytes, tx_packets, tx_bytes, forwarded;
  };

  class tx final : public rt::transmitter {
  public:
    explicit tx(impl& n) : _n(n) {}
    errc send(std::uint32_t hpu, std::uint32_t dest_rank, const rt::wire::header& h,
              std::span<const std::byte> payload) noexcept override {
      return _n.hpu_send(hpu, dest_rank, h, payload);
    }
    std::uint32_t multicast(std::uint32_t hpu, std::span<const std::uint32_t> dests, const rt::wire::header& h,
                            std::span<const std::byte> payload, errc& last_error) noexcept override {
      return _n.hpu_multicast(hpu, dests, h, payload, last_error);
    }
    errc forward(std::uint32_t hpu, std::uint32_t dest_rank, const rt::wire::header& h, std::uint64_t cookie,
                 std::span<const std::byte> payload) noexcept override {
      return _n.hpu_forward(hpu, dest_rank, h, reinterpret_cast<rte_mbuf*>(cookie), payload);
    }
    std::uint32_t max_payload_bytes() const noexcept override { return _n.max_payload; }

  private:
    impl& _n;
  };

  // One HPU of the NIC, run to completion by the thread that polls it (an lcore). Lane 0 owns
  // the ports' queues: it receives (the runtime steers frames of other HPUs' messages to their
  // inboxes), sends, and advances host messages. Another lane hands the frames its handlers
  // send to lane 0 through one SPSC ring per port.
  struct lane_state {
    std::uint32_t index = 0;
    std::mutex mu;                     // held by the polling thread for one round; control calls take every lane's
    mbuf_stage loop;                   // frames to this NIC's own rank, waiting for this lane's runtime HPU
    // [port]: frames this lane's handlers send (lanes other than 0). Our SPSC ring (C++ atomics)
    // rather than rte_ring, whose generic x86 build ThreadSanitizer cannot follow.
    std::vector<std::unique_ptr<rt::spsc_ring<rte_mbuf*>>> to_port;
    std::vector<std::byte> buf;        // encode buffer for frames that do not fit one mbuf
    std::vector<rt::packet> rx_buf;
    counter tx_full, no_mbuf, unroutable, loopback, shared_sends, forward_in_place, forward_chained;
    doorbell own_bell;
    doorbell* bell = &own_bell;        // rung when work arrives for a sleeping poller (nic_config::lane_doorbells)
  };

  nic_config cfg;
  std::unique_ptr<group_registry> groups;  // its slot pool when it acts as a switch
  rt::wire::endpoint self;
  std::deque<port_state> ports;  // deque: port_state holds atomics and never moves
  std::deque<lane_state> lanes;
  rte_mempool* lin_pool = nullptr;  // whole-frame mbufs for linearising chained RX frames
  // Multicast's own pools (as DPDK's ipv4_multicast example): shared payloads, the header mbufs
  // chained in front of them and the clones that reference them. A shared copy takes nothing
  // from the pools ports receive into, so a switch replicating results cannot starve its own
  // RX; when these run dry, copies go whole from their egress port's pool as before.
  rte_mempool* mc_payload_pool = nullptr;
  rte_mempool* mc_header_pool = nullptr;
  rte_mempool* mc_clone_pool = nullptr;
  rte_mempool* tx_pool = nullptr;   // the first port's pool: loopback frames, injected frames
  std::uint32_t tx_room = 0;        // bytes of frame one port mbuf holds (data room - headroom; every port alike)
  std::uint32_t max_payload = 0;
  std::uint32_t host_payload = 0;
  // Below this payload a multicast copies the payload per destination: a header mbuf and a
  // clone cost about as much as copying 256 bytes.
  static constexpr std::size_t share_min_bytes = 256;
  static constexpr std::uint16_t mc_header_room = 128;  // Ethernet, IPv4, UDP, spin and collective headers: 104 bytes
  tx transmitter{*this};
  std::unique_ptr<rt::runtime> rt;
  std::vector<rte_mbuf*> mbuf_buf;
  std::vector<std::byte> host_frame;  // encode buffer for host messages (lane 0)

  std::optional<pcap_writer> capture;
  std::uint64_t capture_ts = 0;  // one wall-clock reading per poll round of lane 0
  counter capture_frames, capture_errors;
  // Lane 0 only (the capture file has one writer).
  void capture_mbuf(const rte_mbuf* m) noexcept {
    rt::wire::segment segs[16];
    std::uint32_t n = 0;
    for (const rte_mbuf* s = m; s != nullptr && n < 16; s = s->next)
      segs[n++] = {rte_pktmbuf_mtod(s, const std::byte*), s->data_len};
    if (m->nb_segs > n || capture->write(std::span<const rt::wire::segment>(segs, n), capture_ts) != errc::ok)
      capture_errors.add(1);
    else
      capture_frames.add(1);
  }

  std::array<counter, nic_drop_count> drops;
  counter host_messages, host_packets, host_bytes;
  std::atomic<std::uint64_t> unshared{0};  // shared packets given a private frame (unshare_mbuf, on any HPU's thread)

  // Control path.
  std::atomic<int> ctl_waiting{0};
  std::deque<std::shared_ptr<send_job>> jobs;  // lane 0
  // Host messages queued by send() and post() that lane 0 has not taken into `jobs` yet, and
  // the registered regions: guarded by post_mu (a queue, not the lanes: a host that sends does
  // not stop the NIC's lcores).
  std::mutex post_mu;
  std::vector<std::shared_ptr<send_job>> posted;
  std::atomic<bool> has_posted{false};
  bool stopped = false;  // post_mu: stop() ran; nothing is queued any more
  result<void> queue_job(const std::shared_ptr<send_job>& job);
  void take_posted() noexcept {
    if (!has_posted.load(std::memory_order_acquire)) return;
    std::lock_guard lk(post_mu);
    for (auto& j : posted) jobs.push_back(std::move(j));
    posted.clear();
    has_posted.store(false, std::memory_order_relaxed);
  }
  // Management datagrams that reached this NIC (rx, lane 0), for its agent (wait_mgmt).
  std::mutex mgmt_mu;
  std::condition_variable mgmt_cv;
  std::deque<mgmt_datagram> mgmt_in;
  bool mgmt_stop = false;  // mgmt_mu: stop() ran; waiters return at once
  std::atomic<std::uint64_t> mgmt_ids{0};
  counter mgmt_received, mgmt_sent;
  // A well-formed one-packet `control` frame for this NIC goes to the management queue (true);
  // anything else goes on to the runtime, which counts what it refuses.
  bool take_mgmt(const rte_mbuf* m) noexcept;
  void region_done(std::uint32_t region) noexcept {
    std::lock_guard lk(post_mu);
    if (region < regions.size()) regions[region].active_sends--;
  }
  struct region_entry {
    std::span<std::byte> mem;
    std::uint32_t active_sends = 0;
  };
  std::vector<region_entry> regions;  // indexed by region id

  ~impl();
  result<void> init();
  void stop() noexcept;
  errc hpu_send(std::uint32_t hpu, std::uint32_t dest, const rt::wire::header& h, std::span<const std::byte> payload) noexcept;
  std::uint32_t hpu_multicast(std::uint32_t hpu, std::span<const std::uint32_t> dests, const rt::wire::header& h,
                              std::span<const std::byte> payload, errc& last_error) noexcept;
  errc hpu_forward(std::uint32_t hpu, std::uint32_t dest, const rt::wire::header& h, rte_mbuf* m,
                   std::span<const std::byte> payload) noexcept;
  // Frame for `dst` with headers `h` in a header mbuf of the multicast pools, chained in front
  // of a clone showing `payload`, which lies in segment `seg`. Null: a pool is dry (`bad`
  // unset), or the headers cannot be encoded (`bad` set).
  rte_mbuf* chain_to(const rte_mbuf* seg, std::uint32_t dest, const rt::wire::header& h, std::span<const std::byte> payload,
                     bool& bad) noexcept;
  // Hands frame `m` for egress `pi` (ports.size(): the loopback) to where lane `hpu` sends it
  // from; frees it and returns no_space when that queue is full.
  errc enqueue(std::uint32_t hpu, std::uint32_t pi, rte_mbuf* m) noexcept;
  // The runtime's view of frame `m`: contiguous, or the header segment and a shared payload
  // segment of a multicast copy; any other chain is first copied into one mbuf (`m` is then
  // that copy). False: no mbuf for the copy (`m` is freed and the drop counted).
  bool to_packet(lane_state& l, rte_mbuf*& m, rt::packet& out) noexcept;
  // Egress port towards `dest`; ports.size() for this NIC's own rank (loopback); -1: none.
  std::int32_t route(std::uint32_t dest) const noexcept {
    if (dest == cfg.rank) return static_cast<std::int32_t>(ports.size());
    if (cfg.routes.empty()) return 0;
    return dest < cfg.routes.size() ? cfg.routes[dest] : -1;
  }
  std::uint32_t poll_lane_locked(lane_state& l) noexcept;
  std::uint32_t rx(port_state& ps, std::uint32_t index) noexcept;
  std::uint32_t tx_flush(port_state& ps) noexcept;
  std::uint32_t tx_drain(port_state& ps, std::uint32_t index) noexcept;
  std::uint32_t loop_drain(lane_state& l) noexcept;
  // A frame in mbufs for egress `pi`: chained when the port sends chains; one mbuf (a large one
  // when needed) for the loopback, since the runtime takes contiguous frames.
  rte_mbuf* build(std::uint32_t pi, const std::byte* frame, std::uint32_t len) noexcept {
    if (pi == ports.size()) {
      rte_mempool* pool = lin_pool != nullptr && len > tx_room ? lin_pool : tx_pool;
      return frame_to_mbufs(pool, frame, len, false);
    }
    return frame_to_mbufs(ports[pi].p->pool(), frame, len, ports[pi].p->tx_multi_seg());
  }
  // Frame for egress `pi` with spin header `h` and `payload` to `dst`, in one copy of the payload
  // when the frame fits one mbuf of the egress pool (the usual case), else encoded whole into
  // `buf` first and then cut into mbufs by build(). Null: no mbuf, or the frame cannot be
  // encoded (`bad` set).
  rte_mbuf* encode_frame(std::uint32_t pi, const rt::wire::endpoint& dst, const rt::wire::header& h,
                         std::span<const std::byte> payload, std::span<std::byte> buf, bool& bad) noexcept {
    bad = false;
    const bool loop = pi == ports.size();
    if (rt::wire::encoded_len(h, payload.size()) <= tx_room) {
      // From the egress port's own pool: a switch that multicasts to N ports spreads its frames
      // over N pools (one shared pool ran dry at 16 ports: no_mbuf drops, then repair timeouts).
      rte_mbuf* m = mbuf_alloc(loop ? tx_pool : ports[pi].p->pool());
      if (m == nullptr) return nullptr;
      const std::size_t len =
          rt::wire::encode(self, dst, h, payload, std::span<std::byte>(rte_pktmbuf_mtod(m, std::byte*), rte_pktmbuf_tailroom(m)));
      if (len == 0) {
        mbuf_free(m);
        bad = true;
        return nullptr;
      }
      (void)rte_pktmbuf_append(m, static_cast<std::uint16_t>(len));
      return m;
    }
    const std::size_t len = rt::wire::encode(self, dst, h, payload, buf);
    if (len == 0) {
      bad = true;
      return nullptr;
    }
    return build(pi, buf.data(), static_cast<std::uint32_t>(len));
  }
  // One mbuf holding the whole of chain `m` (from the large-frame pool when it needs one);
  // null when there is none. `m` is left as it was.
  rte_mbuf* linear_copy(const rte_mbuf* m) noexcept {
    rte_mbuf* lin = mbuf_alloc(lin_pool != nullptr && m->pkt_len > tx_room ? lin_pool : tx_pool);
    if (lin == nullptr || rte_pktmbuf_tailroom(lin) < m->pkt_len) {
      if (lin != nullptr) mbuf_free(lin);
      return nullptr;
    }
    auto* dst = reinterpret_cast<std::byte*>(rte_pktmbuf_append(lin, static_cast<std::uint16_t>(m->pkt_len)));
    std::uint32_t off = 0;
    for (const rte_mbuf* sg = m; sg != nullptr; sg = sg->next) {
      std::memcpy(dst + off, rte_pktmbuf_mtod(sg, const std::byte*), sg->data_len);
      off += sg->data_len;
    }
    return lin;
  }
  std::uint32_t advance_jobs() noexcept;
  void finish_job(send_job& j, error e) noexcept;
  bool stage_push(std::uint32_t port_index, rte_mbuf* m) noexcept;
  bool idle() const noexcept;
  template <class F> auto with_lanes_aside(const char* what, F&& f) -> decltype(f());
  void count_drop(nic_drop d, std::uint64_t n = 1) noexcept { drops[static_cast<std::size_t>(d)].add(n); }
  std::uint64_t mbufs_in_use() const noexcept;
};

}  // namespace spin::emu
