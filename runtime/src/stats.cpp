#include <spin/rt/stats.hpp>

#include <algorithm>
#include <bit>

namespace spin::rt {

namespace detail {

unsigned latency_histogram::bucket_of(std::uint64_t v) noexcept {
  constexpr std::uint64_t sub = 1u << sub_bits;
  if (v < sub) return static_cast<unsigned>(v);
  const unsigned msb = 63u - static_cast<unsigned>(std::countl_zero(v));
  const unsigned s = static_cast<unsigned>((v >> (msb - sub_bits)) & (sub - 1));
  return ((msb - sub_bits + 1) << sub_bits) + s;
}

std::uint64_t latency_histogram::bucket_upper(unsigned b) noexcept {
  constexpr std::uint64_t sub = 1u << sub_bits;
  if (b < sub) return b;
  const unsigned msb = (b >> sub_bits) + sub_bits - 1;
  const std::uint64_t s = b & (sub - 1);
  const std::uint64_t lo = (std::uint64_t{1} << msb) | (s << (msb - sub_bits));
  return lo + (std::uint64_t{1} << (msb - sub_bits)) - 1;
}

void latency_histogram::record(std::uint64_t ns) noexcept {
  _b[bucket_of(ns)].add(1);
  _count.add(1);
  _sum.add(ns);
  if (ns > _max.get()) _max.add(ns - _max.get());
}

latency_summary latency_histogram::summary() const {
  const latency_histogram* self = this;
  return merged(&self, 1);
}

latency_summary latency_histogram::merged(const latency_histogram* const* hs, std::size_t n) {
  latency_summary s;
  std::uint64_t sum = 0;
  for (std::size_t k = 0; k < n; ++k) {
    s.count += hs[k]->_count.get();
    sum += hs[k]->_sum.get();
    s.max_ns = std::max(s.max_ns, hs[k]->_max.get());
  }
  if (s.count == 0) return s;
  s.mean_ns = static_cast<double>(sum) / static_cast<double>(s.count);
  auto bucket = [&](unsigned i) {
    std::uint64_t v = 0;
    for (std::size_t k = 0; k < n; ++k) v += hs[k]->_b[i].get();
    return v;
  };
  // Ranks are taken over the bucket total, which a concurrent writer may have moved past count.
  std::uint64_t total = 0;
  for (unsigned i = 0; i < buckets; ++i) total += bucket(i);
  const std::uint64_t r50 = (total * 50 + 99) / 100, r99 = (total * 99 + 99) / 100;
  std::uint64_t seen = 0;
  bool have50 = false;
  for (unsigned i = 0; i < buckets; ++i) {
    seen += bucket(i);
    if (!have50 && seen >= r50) {
      s.p50_ns = std::min(bucket_upper(i), s.max_ns);
      have50 = true;
    }
    if (seen >= r99) {
      s.p99_ns = std::min(bucket_upper(i), s.max_ns);
      break;
    }
  }
  return s;
}

void ec_counters::snapshot(const ec_counters* const* cs, std::size_t n, ec_stats& o) {
  for (std::size_t k = 0; k < n; ++k) {
    const ec_counters& c = *cs[k];
    o.packets_in += c.packets_in.get();
    o.bytes_in += c.bytes_in.get();
    o.messages_started += c.messages_started.get();
    o.messages_completed += c.messages_completed.get();
    o.messages_dropped += c.messages_dropped.get();
    o.messages_aborted += c.messages_aborted.get();
    for (std::size_t i = 0; i < drop_reason_count; ++i) o.drops[i] += c.drops[i].get();
    for (std::size_t kind = 0; kind < 3; ++kind) {
      o.kinds[kind].invocations += c.kinds[kind].invocations.get();
      o.kinds[kind].bytes += c.kinds[kind].bytes.get();
      o.kinds[kind].over_budget += c.kinds[kind].over_budget.get();
      o.kinds[kind].faults += c.kinds[kind].faults.get();
    }
  }
  std::vector<const latency_histogram*> hs(n);
  for (std::size_t kind = 0; kind < 3; ++kind) {
    for (std::size_t k = 0; k < n; ++k) hs[k] = &cs[k]->kinds[kind].time;
    o.kinds[kind].time = latency_histogram::merged(hs.data(), n);
  }
}

} // namespace detail

} // namespace spin::rt
