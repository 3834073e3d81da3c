#include <spin/emu/link.hpp>

#include "mbuf_sync.hpp"

#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <new>

namespace spin::emu {

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::uint64_t rate_kbps(double rate_gbps) {
  if (!(rate_gbps > 0)) return 0;
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(rate_gbps * 1e6)));
}

std::uint64_t splitmix64(std::uint64_t& x) noexcept {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }

// Single writer (the lcore polling the link): a relaxed load and store is enough and avoids a locked add.
inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

}  // namespace

// ---- model -------------------------------------------------------------------------------

namespace detail {
std::optional<bad_field> first_bad_field(const link_model& m) {
  if (std::isnan(m.rate_gbps) || m.rate_gbps < 0)
    return bad_field{"rate_gbps", "rate_gbps must be 0 (unlimited) or positive, got " + num(m.rate_gbps)};
  if (m.rate_gbps != 0 && (m.rate_gbps < 1e-6 || m.rate_gbps > max_link_rate_gbps))
    return bad_field{"rate_gbps", "rate_gbps must be 0 (unlimited) or in [1e-6, 10000] Gbit/s, got " +
                                      num(m.rate_gbps)};
  auto prob = [](const char* key, double p) -> std::optional<bad_field> {
    if (std::isnan(p) || p < 0 || p >= 1)
      return bad_field{key, std::string(key) + " is a probability and must be in [0, 1), got " + num(p)};
    return std::nullopt;
  };
  if (auto b = prob("loss", m.loss)) return b;
  if (auto b = prob("duplicate", m.duplicate)) return b;
  if (auto b = prob("reorder", m.reorder)) return b;
  auto delay = [](const char* key, std::chrono::nanoseconds d) -> std::optional<bad_field> {
    if (d.count() < 0 || d > max_link_delay)
      return bad_field{key, std::string(key) + " must be in [0, 1000000000] ns, got " + std::to_string(d.count())};
    return std::nullopt;
  };
  if (auto b = delay("latency_ns", m.latency)) return b;
  if (!(m.gap_ns >= 0 && m.gap_ns <= 1e9))
    return bad_field{"gap_ns", "gap_ns must be in [0, 1000000000] ns, got " + num(m.gap_ns)};
  if (auto b = delay("reorder_delay_ns", m.reorder_delay)) return b;
  if (m.queue_packets == 0 || m.queue_packets > max_link_queue_packets)
    return bad_field{"queue_packets",
                     "queue_packets must be in [1, 1048576], got " + std::to_string(m.queue_packets)};
  if (m.on_full != overflow_policy::drop && m.on_full != overflow_policy::backpressure)
    return bad_field{"on_full", "on_full must be \"drop\" or \"backpressure\", got " +
                                    std::to_string(static_cast<unsigned>(m.on_full))};
  return std::nullopt;
}
}  // namespace detail

result<void> validate(const link_model& m) {
  if (auto b = detail::first_bad_field(m)) return fail(errc::invalid_argument, "link model: " + b->message);
  return {};
}

const char* overflow_policy_name(overflow_policy p) noexcept {
  switch (p) {
  case overflow_policy::drop: return "drop";
  case overflow_policy::backpressure: return "backpressure";
  }
  return "unknown";
}

std::chrono::nanoseconds effective_reorder_delay(const link_model& m) noexcept {
  if (m.reorder_delay.count() > 0) return m.reorder_delay;
  link_sim s(m);
  auto d = std::chrono::nanoseconds(m.latency.count() + static_cast<std::int64_t>(4 * s.serialisation_ns(1500)));
  return std::max(d, std::chrono::nanoseconds(std::chrono::microseconds(10)));
}

prng::prng(std::uint64_t seed) noexcept {
  for (auto& w : _s) w = splitmix64(seed);
}

std::uint64_t prng::next() noexcept {
  const std::uint64_t result = rotl(_s[1] * 5, 7) * 9;
  const std::uint64_t t = _s[1] << 17;
  _s[2] ^= _s[0];
  _s[3] ^= _s[1];
  _s[1] ^= _s[2];
  _s[0] ^= _s[3];
  _s[2] ^= t;
  _s[3] = rotl(_s[3], 45);
  return result;
}

double prng::next_unit() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

link_sim::link_sim(const link_model& m) noexcept
    : _model(m), _rate_kbps(rate_kbps(m.rate_gbps)),
      _latency_ns(static_cast<std::uint64_t>(std::max<std::int64_t>(0, m.latency.count()))), _rng(m.seed) {
  _reorder_delay_ns = m.reorder_delay.count() > 0
                          ? static_cast<std::uint64_t>(m.reorder_delay.count())
                          : std::max<std::uint64_t>(_latency_ns + 4 * serialisation_ns(1500), 10'000);
}

std::uint64_t link_sim::serialisation_ns(std::uint32_t len_bytes) const noexcept {
  if (_rate_kbps == 0) return 0;
  // ns = bits * 1e6 / (kbit/s), rounded up: exact in integers.
  const std::uint64_t num = std::uint64_t{len_bytes} * 8u * 1'000'000u;
  return (num + _rate_kbps - 1) / _rate_kbps;
}

fate link_sim::on_packet(std::uint32_t len_bytes, std::uint64_t now_ns) noexcept {
  // Always three draws, whatever the outcome, so packet k's numbers depend only on k.
  const double u_loss = _rng.next_unit();
  const double u_dup = _rng.next_unit();
  const double u_reorder = _rng.next_unit();
  ++_packets;

  fate f;
  const std::uint64_t ser = serialisation_ns(len_bytes);
  const std::uint64_t start = std::max(now_ns, _busy_until_ns);
  const std::uint64_t departure = start + ser;
  _busy_until_ns = start + std::max(ser, static_cast<std::uint64_t>(std::ceil(_model.gap_ns)));
  if (u_loss < _model.loss) {
    f.drop = true;
    return f;
  }
  f.deliver_ns = departure + _latency_ns;
  if (u_reorder < _model.reorder) {
    f.reordered = true;
    f.deliver_ns += _reorder_delay_ns;
  }
  if (u_dup < _model.duplicate) {
    f.duplicate = true;
    _busy_until_ns += ser;
    f.duplicate_deliver_ns = f.deliver_ns + ser;
  }
  return f;
}

// ---- stats -------------------------------------------------------------------------------

std::string to_json(const link_stats& s) {
  nlohmann::json j = {
      {"packets_in", s.packets_in},
      {"bytes_in", s.bytes_in},
      {"packets_delivered", s.packets_delivered},
      {"bytes_delivered", s.bytes_delivered},
      {"dropped_loss", s.dropped_loss},
      {"dropped_queue_full", s.dropped_queue_full},
      {"duplicated", s.duplicated},
      {"dup_no_mbuf", s.dup_no_mbuf},
      {"reordered", s.reordered},
      {"output_stalls", s.output_stalls},
      {"held", s.held},
  };
  return j.dump();
}

// ---- DPDK link ---------------------------------------------------------------------------

result<std::unique_ptr<link>> link::create(rte_ring* in, rte_ring* out, rte_mempool* dup_pool,
                                           const link_model& m) {
  if (in == nullptr) return fail(errc::invalid_argument, "link: the input ring is null");
  if (out == nullptr) return fail(errc::invalid_argument, "link: the output ring is null");
  if (in == out) return fail(errc::invalid_argument, "link: the input and output rings are the same ring");
  if (auto r = validate(m); !r) return r.err();
  if (dup_pool == nullptr && m.duplicate > 0)
    return fail(errc::invalid_argument,
                "link: duplicate = " + num(m.duplicate) + " needs a mempool for the copies, got null");
  std::unique_ptr<entry[]> heap(new (std::nothrow) entry[m.queue_packets]);
  if (!heap)
    return fail(errc::no_memory, "link: cannot allocate the holding heap of " + std::to_string(m.queue_packets) +
                                     " packets");
  return std::unique_ptr<link>(new link(in, out, dup_pool, m, std::move(heap)));
}

link::link(rte_ring* in, rte_ring* out, rte_mempool* pool, const link_model& m, std::unique_ptr<entry[]> heap)
    : _in(in), _out(out), _pool(pool), _sim(m), _heap(std::move(heap)), _cap(m.queue_packets) {}

link::~link() {
  for (std::uint32_t i = 0; i < _size; ++i) detail::mbuf_free(_heap[i].m);
  _size = 0;
}

std::uint64_t link::now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

bool link::before(const entry& x, const entry& y) noexcept {
  return x.deliver_ns != y.deliver_ns ? x.deliver_ns < y.deliver_ns : x.seq < y.seq;
}

void link::push(const entry& e) noexcept {
  std::uint32_t i = _size++;
  while (i > 0) {
    const std::uint32_t parent = (i - 1) / 2;
    if (!before(e, _heap[parent])) break;
    _heap[i] = _heap[parent];
    i = parent;
  }
  _heap[i] = e;
}

link::entry link::pop() noexcept {
  const entry top = _heap[0];
  const entry last = _heap[--_size];
  std::uint32_t i = 0;
  for (;;) {
    std::uint32_t child = 2 * i + 1;
    if (child >= _size) break;
    if (child + 1 < _size && before(_heap[child + 1], _heap[child])) ++child;
    if (!before(_heap[child], last)) break;
    _heap[i] = _heap[child];
    i = child;
  }
  if (_size > 0) _heap[i] = last;
  return top;
}

std::optional<std::uint64_t> link::next_due_ns() const noexcept {
  if (_size == 0) return std::nullopt;
  return _heap[0].deliver_ns;
}

std::uint32_t link::deliver(std::uint64_t now_ns, std::uint32_t& bursts_left) noexcept {
  std::uint32_t total = 0;
  for (; bursts_left > 0; --bursts_left) {
    entry due[burst];
    rte_mbuf* mbufs[burst];
    std::uint32_t n = 0;
    while (n < burst && _size > 0 && _heap[0].deliver_ns <= now_ns) {
      due[n] = pop();
      mbufs[n] = due[n].m;
      ++n;
    }
    if (n == 0) break;
    // The receiver may run on another lcore: its lengths are read before the hand-over.
    std::uint32_t lens[burst];
    for (std::uint32_t i = 0; i < n; ++i) {
      lens[i] = rte_pktmbuf_pkt_len(mbufs[i]);
      detail::sync_out(mbufs[i]);
    }
    const std::uint32_t sent = rte_ring_sp_enqueue_burst(_out, reinterpret_cast<void* const*>(mbufs), n, nullptr);
    std::uint64_t bytes = 0;
    for (std::uint32_t i = 0; i < sent; ++i) bytes += lens[i];
    // Not delivered: back into the heap with their keys, so they keep their place in line.
    for (std::uint32_t i = sent; i < n; ++i) push(due[i]);
    bump(_c.packets_delivered, sent);
    bump(_c.bytes_delivered, bytes);
    _c.held.store(_size, std::memory_order_relaxed);
    total += sent;
    if (sent < n) {
      bump(_c.output_stalls);
      bursts_left = 0;  // the ring is full: no point in trying again in this poll
      break;
    }
  }
  return total;
}

std::uint32_t link::ingest(std::uint64_t now_ns) noexcept {
  const link_model& m = _sim.model();
  std::uint32_t total = 0;
  for (std::uint32_t b = 0; b < max_bursts_per_poll; ++b) {
    std::uint32_t want = burst;
    if (m.on_full == overflow_policy::backpressure) want = std::min(want, _cap - _size);
    if (want == 0) break;
    rte_mbuf* mbufs[burst];
    const std::uint32_t n = rte_ring_sc_dequeue_burst(_in, reinterpret_cast<void**>(mbufs), want, nullptr);
    if (n == 0) break;
    std::uint64_t bytes = 0;
    for (std::uint32_t i = 0; i < n; ++i) detail::sync_in(mbufs[i]);  // the sender may run on another lcore
    for (std::uint32_t i = 0; i < n; ++i) {
      rte_mbuf* pkt = mbufs[i];
      const std::uint32_t len = rte_pktmbuf_pkt_len(pkt);
      bytes += len;
      if (_size >= _cap) {  // only reached under overflow_policy::drop
        detail::mbuf_free(pkt);
        bump(_c.dropped_queue_full);
        continue;
      }
      const fate f = _sim.on_packet(len, now_ns);
      if (f.drop) {
        detail::mbuf_free(pkt);
        bump(_c.dropped_loss);
        continue;
      }
      if (f.reordered) bump(_c.reordered);
      push(entry{f.deliver_ns, _seq++, pkt});
      if (f.duplicate) {
        bump(_c.duplicated);
        if (_size >= _cap) {
          bump(_c.dropped_queue_full);
        } else if (rte_mbuf* copy = detail::mbuf_copy(pkt, _pool); copy == nullptr) {
          bump(_c.dup_no_mbuf);
        } else {
          push(entry{f.duplicate_deliver_ns, _seq++, copy});
        }
      }
    }
    bump(_c.packets_in, n);
    bump(_c.bytes_in, bytes);
    _c.held.store(_size, std::memory_order_relaxed);
    total += n;
    if (n < want) break;
  }
  return total;
}

std::uint32_t link::poll(std::uint64_t now_ns) noexcept {
  std::uint32_t out_bursts = max_bursts_per_poll;  // shared by both deliveries
  std::uint32_t work = deliver(now_ns, out_bursts);
  work += ingest(now_ns);
  if (_size > 0 && _heap[0].deliver_ns <= now_ns) work += deliver(now_ns, out_bursts);
  return work;
}

link_stats link::stats() const noexcept {
  constexpr auto r = std::memory_order_relaxed;
  link_stats s;
  s.packets_in = _c.packets_in.load(r);
  s.bytes_in = _c.bytes_in.load(r);
  s.packets_delivered = _c.packets_delivered.load(r);
  s.bytes_delivered = _c.bytes_delivered.load(r);
  s.dropped_loss = _c.dropped_loss.load(r);
  s.dropped_queue_full = _c.dropped_queue_full.load(r);
  s.duplicated = _c.duplicated.load(r);
  s.dup_no_mbuf = _c.dup_no_mbuf.load(r);
  s.reordered = _c.reordered.load(r);
  s.output_stalls = _c.output_stalls.load(r);
  s.held = _c.held.load(r);
  return s;
}

std::string link::to_json() const { return emu::to_json(stats()); }

}  // namespace spin::emu
