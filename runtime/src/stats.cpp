#include <spin/rt/stats.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstdio>

namespace spin::rt {

const char* drop_reason_name(drop_reason r) {
  switch (r) {
  case drop_reason::duplicate: return "duplicate";
  case drop_reason::out_of_window: return "out_of_window";
  case drop_reason::bad_sequence: return "bad_sequence";
  case drop_reason::inconsistent: return "inconsistent";
  case drop_reason::no_message_slot: return "no_message_slot";
  case drop_reason::parking_full: return "parking_full";
  case drop_reason::handler_drop: return "handler_drop";
  case drop_reason::bad_return: return "bad_return";
  case drop_reason::message_aborted: return "message_aborted";
  case drop_reason::not_data: return "not_data";
  case drop_reason::ec_removed: return "ec_removed";
  case drop_reason::host_window: return "host_window";
  case drop_reason::unauthenticated: return "unauthenticated";
  case drop_reason::no_private_copy: return "no_private_copy";
  case drop_reason::count_: break;
  }
  return "unknown";
}

std::uint64_t ec_stats::total_drops() const {
  std::uint64_t n = 0;
  for (auto d : drops) n += d;
  return n;
}

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

namespace {

const char* kind_name(std::size_t k) {
  static constexpr const char* names[] = {"header", "payload", "completion"};
  return names[k];
}

nlohmann::json latency_json(const latency_summary& l) {
  return {{"count", l.count}, {"mean_ns", l.mean_ns}, {"p50_ns", l.p50_ns}, {"p99_ns", l.p99_ns}, {"max_ns", l.max_ns}};
}

} // namespace

std::string to_json(const runtime_stats& s) {
  nlohmann::json j;
  j["frames_accepted"] = s.frames_accepted;
  nlohmann::json rej = nlohmann::json::object();
  for (std::size_t i = 0; i < wire::reject_count; ++i) rej[wire::reject_name(static_cast<wire::reject>(i))] = s.frames_rejected[i];
  j["frames_rejected"] = rej;
  j["unknown_ec"] = s.unknown_ec;
  j["watchdog_wakeups"] = s.watchdog_wakeups;
  j["nic_memory"] = {{"capacity_bytes", s.nic_mem_capacity_bytes}, {"used_bytes", s.nic_mem_used_bytes},
                     {"peak_bytes", s.nic_mem_peak_bytes}};
  j["hpus"] = nlohmann::json::array();
  for (const auto& h : s.hpus)
    j["hpus"].push_back({{"hpu", h.hpu}, {"tasks", h.tasks}, {"busy_ns", h.busy_ns}, {"preempted", h.preempted},
                         {"frames", h.frames}, {"steered", h.steered}});
  j["ecs"] = nlohmann::json::array();
  for (const auto& e : s.ecs) {
    nlohmann::json je = {{"ec_id", e.ec_id}, {"name", e.name}, {"packets_in", e.packets_in}, {"bytes_in", e.bytes_in}, {"packets_skipped", e.packets_skipped},
                         {"messages_started", e.messages_started}, {"messages_completed", e.messages_completed},
                         {"messages_dropped", e.messages_dropped}, {"messages_aborted", e.messages_aborted},
                         {"dma_to_host_bytes", e.dma_to_host_bytes}, {"dma_from_host_bytes", e.dma_from_host_bytes},
                         {"dma_ops", e.dma_ops}, {"deposit_bytes", e.deposit_bytes}, {"sends", e.sends},
                         {"send_bytes", e.send_bytes}, {"send_failed", e.send_failed},
                         {"events_posted", e.events_posted}, {"events_lost", e.events_lost},
                         {"api_errors", e.api_errors}, {"handler_mem_bytes", e.handler_mem_bytes},
                         {"nic_mem_bytes", e.nic_mem_bytes}};
    nlohmann::json d = nlohmann::json::object();
    for (std::size_t i = 0; i < drop_reason_count; ++i) d[drop_reason_name(static_cast<drop_reason>(i))] = e.drops[i];
    je["drops"] = d;
    nlohmann::json k = nlohmann::json::object();
    for (std::size_t i = 0; i < 3; ++i)
      k[kind_name(i)] = {{"invocations", e.kinds[i].invocations}, {"bytes", e.kinds[i].bytes},
                         {"over_budget", e.kinds[i].over_budget}, {"faults", e.kinds[i].faults}, {"time", latency_json(e.kinds[i].time)}};
    je["handlers"] = k;
    j["ecs"].push_back(je);
  }
  return j.dump(2);
}

std::string to_text(const runtime_stats& s) {
  std::string out;
  char line[256];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    out += line;
  };
  add("frames accepted %llu, unknown EC %llu\n", static_cast<unsigned long long>(s.frames_accepted),
      static_cast<unsigned long long>(s.unknown_ec));
  for (std::size_t i = 0; i < wire::reject_count; ++i)
    if (s.frames_rejected[i] != 0)
      add("  rejected %-16s %llu\n", wire::reject_name(static_cast<wire::reject>(i)),
          static_cast<unsigned long long>(s.frames_rejected[i]));
  add("NIC memory: %llu of %llu bytes used (peak %llu)\n", static_cast<unsigned long long>(s.nic_mem_used_bytes),
      static_cast<unsigned long long>(s.nic_mem_capacity_bytes), static_cast<unsigned long long>(s.nic_mem_peak_bytes));
  for (const auto& h : s.hpus)
    add("HPU %u: %llu frames (%llu steered to another HPU), %llu tasks, busy %.3f ms, preempted %llu\n", h.hpu,
        static_cast<unsigned long long>(h.frames), static_cast<unsigned long long>(h.steered),
        static_cast<unsigned long long>(h.tasks), static_cast<double>(h.busy_ns) / 1e6,
        static_cast<unsigned long long>(h.preempted));
  for (const auto& e : s.ecs) {
    add("EC %u \"%s\": %llu packets, %llu bytes in; messages %llu started, %llu completed, %llu dropped, %llu aborted\n",
        e.ec_id, e.name.c_str(), static_cast<unsigned long long>(e.packets_in), static_cast<unsigned long long>(e.bytes_in),
        static_cast<unsigned long long>(e.messages_started), static_cast<unsigned long long>(e.messages_completed),
        static_cast<unsigned long long>(e.messages_dropped), static_cast<unsigned long long>(e.messages_aborted));
    for (std::size_t i = 0; i < 3; ++i) {
      const auto& k = e.kinds[i];
      if (k.invocations == 0) continue;
      add("  %-10s %llu calls, %llu bytes, time ns mean %.1f p50 %llu p99 %llu max %llu, over budget %llu, faults %llu\n",
          kind_name(i), static_cast<unsigned long long>(k.invocations), static_cast<unsigned long long>(k.bytes),
          k.time.mean_ns, static_cast<unsigned long long>(k.time.p50_ns), static_cast<unsigned long long>(k.time.p99_ns),
          static_cast<unsigned long long>(k.time.max_ns), static_cast<unsigned long long>(k.over_budget),
          static_cast<unsigned long long>(k.faults));
    }
    if (e.dma_ops != 0)
      add("  DMA: %llu ops, %llu bytes to host, %llu from host\n", static_cast<unsigned long long>(e.dma_ops),
          static_cast<unsigned long long>(e.dma_to_host_bytes), static_cast<unsigned long long>(e.dma_from_host_bytes));
    if (e.deposit_bytes != 0) add("  deposited %llu bytes\n", static_cast<unsigned long long>(e.deposit_bytes));
    if (e.sends != 0 || e.send_failed != 0)
      add("  sent %llu packets, %llu bytes, %llu failed\n", static_cast<unsigned long long>(e.sends),
          static_cast<unsigned long long>(e.send_bytes), static_cast<unsigned long long>(e.send_failed));
    if (e.events_posted != 0 || e.events_lost != 0)
      add("  events %llu posted, %llu lost\n", static_cast<unsigned long long>(e.events_posted),
          static_cast<unsigned long long>(e.events_lost));
    if (e.api_errors != 0) add("  API errors %llu\n", static_cast<unsigned long long>(e.api_errors));
    for (std::size_t i = 0; i < drop_reason_count; ++i)
      if (e.drops[i] != 0)
        add("  drop %-16s %llu\n", drop_reason_name(static_cast<drop_reason>(i)), static_cast<unsigned long long>(e.drops[i]));
  }
  return out;
}

} // namespace spin::rt
