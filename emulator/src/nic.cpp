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

namespace {

using rt::detail::counter;

using detail::mbuf_alloc;
using detail::mbuf_free;
using detail::sync_in;
using detail::sync_out;

// Copies `len` bytes into a new frame of one or (when `chain`) several mbufs of `pool`.
rte_mbuf* frame_to_mbufs(rte_mempool* pool, const std::byte* src, std::uint32_t len, bool chain) noexcept {
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
bool mac_rank(const std::byte* frame, std::uint32_t& rank) noexcept {
  const auto* b = reinterpret_cast<const std::uint8_t*>(frame);
  if (b[0] != 0x02 || b[1] != 0x53 || b[2] != 0x50 || b[3] != 0x00) return false;
  rank = (std::uint32_t{b[4]} << 8) | b[5];
  return true;
}

}  // namespace

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
  std::uint32_t dequeue_from(rt::detail::spsc_ring<rte_mbuf*>& r, std::uint32_t max) noexcept {
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
  message_send m;
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

  class tx final : public rt::tx_port {
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
    std::vector<std::unique_ptr<rt::detail::spsc_ring<rte_mbuf*>>> to_port;
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
  tx tx_port{*this};
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
  const std::uint32_t overhead = rt::wire::min_overhead + rt::wire::spin_coll_len + rt::wire::spin_auth_len;
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
      for (std::uint32_t p = 0; p < nports; ++p) l.to_port.push_back(std::make_unique<rt::detail::spsc_ring<rte_mbuf*>>(cfg.tx_ring_packets));
  }
  mbuf_buf.resize(cfg.burst);
  host_frame.resize(cfg.port.max_frame_bytes);

  rt::runtime_config rc = cfg.runtime;
  rc.rank = cfg.rank;
  rc.tx = &tx_port;
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
  if (m->nb_segs == 2 && RTE_MBUF_CLONED(tail) && m->data_len <= rt::wire::min_overhead + rt::wire::spin_coll_len + rt::wire::spin_auth_len) {
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
      rt::wire::header h;
      h.type = j.mgmt ? rt::wire::packet_type::control : rt::wire::packet_type::data;
      h.source_rank = cfg.rank;
      h.match_bits = j.m.match_bits;
      h.message_id = j.m.message_id;
      h.seq = j.seq;
      h.message_len = j.m.len_bytes;
      h.offset = j.next_offset;
      h.flags = static_cast<std::uint16_t>((j.seq == 0 ? rt::wire::flag_start : 0) | (n == left ? rt::wire::flag_end : 0));
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

result<void> nic::impl::queue_job(const std::shared_ptr<send_job>& job) {
  const message_send& m = job->m;
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

result<void> nic::post(const message_send& m) {
  auto job = std::make_shared<send_job>();
  job->m = m;
  job->copy_inline = true;
  return _p->queue_job(job);
}

result<void> nic::send(const message_send& m, std::chrono::milliseconds timeout) {
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
