// spin::sim: statistics (histograms, text and JSON).
#include <spin/rt/stats.hpp>
#include <spin/sim/cluster.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>

namespace spin::sim {

using rt::detail::latency_histogram;

void histogram::add(std::uint64_t v) noexcept {
  buckets[latency_histogram::bucket_of(v)] += 1;
  ++count;
  sum += v;
  if (v > max) max = v;
}

std::uint64_t histogram::quantile(double q) const noexcept {
  if (count == 0) return 0;
  const auto want = static_cast<std::uint64_t>(q * static_cast<double>(count - 1)) + 1;
  std::uint64_t seen = 0;
  for (unsigned b = 0; b < buckets.size(); ++b) {
    seen += buckets[b];
    if (seen >= want) return std::min(latency_histogram::bucket_upper(b), max);
  }
  return max;
}

const char* drop_name(drop d) noexcept {
  switch (d) {
  case drop::packet_buffer_full: return "packet_buffer_full";
  case drop::queue_full: return "queue_full";
  case drop::link_loss: return "link_loss";
  case drop::unroutable: return "unroutable";
  case drop::frame_too_large: return "frame_too_large";
  case drop::count_: break;
  }
  return "unknown";
}

namespace {
std::string fmt(double v, const char* f = "%.1f") {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
std::string ns(std::uint64_t ps_) { return fmt(static_cast<double>(ps_) / 1000.0); }
double share(picoseconds part, picoseconds whole, std::uint32_t n = 1) {
  return whole.count() == 0 || n == 0 ? 0.0 : static_cast<double>(part.count()) / static_cast<double>(whole.count()) / n;
}
nlohmann::json hist_json(const histogram& h) {
  return {{"count", h.count}, {"mean_ns", h.mean() / 1000.0}, {"p50_ns", static_cast<double>(h.quantile(0.5)) / 1000.0},
          {"p99_ns", static_cast<double>(h.quantile(0.99)) / 1000.0}, {"max_ns", static_cast<double>(h.max) / 1000.0}};
}
} // namespace

std::string to_text(const cluster_stats& s) {
  std::string out = "virtual time " + fmt(static_cast<double>(s.now.count()) / 1e6, "%.3f") + " us, " + std::to_string(s.events) +
                    " events, " + std::to_string(s.actor_switches) + " actor hand-overs\n";
  rt::text_table t({"node", "rank", "packets", "handled", "moved", "instructions", "HPU busy %", "wait p50 ns", "latency p50 ns",
                    "latency p99 ns", "buffer max B", "waiting max", "DMA busy %", "drops"});
  for (const node_stats& n : s.nodes) {
    std::uint64_t drops = 0;
    for (auto d : n.drops) drops += d;
    t.row({n.name, std::to_string(n.rank), std::to_string(n.packets_in), std::to_string(n.handled), std::to_string(n.moved), std::to_string(n.instructions),
           fmt(100.0 * share(n.hpu_busy, s.now, n.hpus), "%.2f"), ns(n.wait.quantile(0.5)), ns(n.latency.quantile(0.5)),
           ns(n.latency.quantile(0.99)), std::to_string(n.packet_buffer_max), std::to_string(n.waiting_max),
           fmt(100.0 * share(n.dma_busy, s.now), "%.2f"), std::to_string(drops)});
  }
  out += t.str("  ");
  rt::text_table p({"port", "packets", "bytes", "busy %", "depth max", "depth mean", "queue drops", "loss"});
  for (const port_stats& q : s.ports) {
    if (q.packets == 0 && q.dropped_queue_full == 0 && q.dropped_loss == 0) continue;
    p.row({q.from + "->" + q.to, std::to_string(q.packets), std::to_string(q.bytes), fmt(100.0 * share(q.busy, s.now), "%.2f"),
           std::to_string(q.depth_max), fmt(q.depth_mean, "%.3f"), std::to_string(q.dropped_queue_full), std::to_string(q.dropped_loss)});
  }
  if (p.rows() > 0) out += p.str("  ");
  return out;
}

std::string to_json(const cluster_stats& s) {
  nlohmann::json j;
  j["now_ps"] = s.now.count();
  j["events"] = s.events;
  j["actor_switches"] = s.actor_switches;
  j["nodes"] = nlohmann::json::array();
  for (const node_stats& n : s.nodes) {
    nlohmann::json d = nlohmann::json::object();
    for (std::size_t i = 0; i < drop_count; ++i) d[drop_name(static_cast<drop>(i))] = n.drops[i];
    j["nodes"].push_back({{"name", n.name}, {"rank", n.rank}, {"switch", n.is_switch}, {"packets_in", n.packets_in},
                          {"bytes_in", n.bytes_in}, {"forwarded", n.forwarded}, {"handled", n.handled}, {"moved", n.moved},
                          {"invocations", n.invocations}, {"instructions", n.instructions}, {"host_packets", n.host_packets},
                          {"hpus", n.hpus}, {"hpu_busy_ps", n.hpu_busy.count()}, {"hpu_occupancy", share(n.hpu_busy, s.now, n.hpus)},
                          {"dma_busy_ps", n.dma_busy.count()}, {"dma_bytes", n.dma_bytes}, {"packet_buffer_max", n.packet_buffer_max},
                          {"waiting_max", n.waiting_max}, {"latency", hist_json(n.latency)}, {"wait", hist_json(n.wait)}, {"drops", d}});
  }
  j["ports"] = nlohmann::json::array();
  for (const port_stats& q : s.ports)
    j["ports"].push_back({{"from", q.from}, {"to", q.to}, {"packets", q.packets}, {"bytes", q.bytes}, {"busy_ps", q.busy.count()},
                          {"depth_max", q.depth_max}, {"depth_mean", q.depth_mean}, {"dropped_queue_full", q.dropped_queue_full},
                          {"dropped_loss", q.dropped_loss}});
  return j.dump(2) + "\n";
}

} // namespace spin::sim
