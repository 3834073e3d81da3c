// The runtime's statistics as text and JSON, and JSON read back into the typed snapshot. Each
// struct's keys are listed once (the *_fields functions) and read by the writer and the reader
// alike. No DPDK: the host library links this file to show a remote NIC's counters.
#include <spin/rt/stats.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
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

std::string text_table::str(std::string_view indent) const {
  std::size_t cols = 0;
  for (const auto& r : _rows) cols = std::max(cols, r.size());
  std::vector<std::size_t> width(cols, 0);
  for (const auto& r : _rows)
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  auto numeric = [](const std::string& v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) || ch == '.'; });
  };
  std::string out;
  for (const auto& r : _rows) {
    std::string line(indent);
    for (std::size_t c = 0; c < r.size(); ++c) {
      const std::string pad(width[c] - r[c].size(), ' ');
      if (c != 0) line += "  ";
      line += numeric(r[c]) ? pad + r[c] : r[c] + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

namespace {

using json = nlohmann::ordered_json;

const char* kind_name(std::size_t k) {
  static constexpr const char* names[] = {"header", "payload", "completion"};
  return names[k];
}

// Key lists, each read by the writer (v const) and the reader alike.
template <class L, class F> void latency_fields(L& l, F&& f) {
  f("count", l.count);
  f("mean_ns", l.mean_ns);
  f("p50_ns", l.p50_ns);
  f("p99_ns", l.p99_ns);
  f("max_ns", l.max_ns);
}

template <class H, class F> void handler_fields(H& h, F&& f) {
  f("invocations", h.invocations);
  f("bytes", h.bytes);
  f("over_budget", h.over_budget);
  f("faults", h.faults);
}

template <class H, class F> void hpu_fields(H& h, F&& f) {
  f("hpu", h.hpu);
  f("tasks", h.tasks);
  f("busy_ns", h.busy_ns);
  f("preempted", h.preempted);
  f("frames", h.frames);
  f("steered", h.steered);
}

template <class E, class F> void ec_fields(E& e, F&& f) {
  f("ec_id", e.ec_id);
  f("name", e.name);
  f("packets_in", e.packets_in);
  f("bytes_in", e.bytes_in);
  f("packets_skipped", e.packets_skipped);
  f("messages_started", e.messages_started);
  f("messages_completed", e.messages_completed);
  f("messages_dropped", e.messages_dropped);
  f("messages_aborted", e.messages_aborted);
  f("dma_to_host_bytes", e.dma_to_host_bytes);
  f("dma_from_host_bytes", e.dma_from_host_bytes);
  f("dma_ops", e.dma_ops);
  f("deposit_bytes", e.deposit_bytes);
  f("sends", e.sends);
  f("send_bytes", e.send_bytes);
  f("send_failed", e.send_failed);
  f("events_posted", e.events_posted);
  f("events_lost", e.events_lost);
  f("api_errors", e.api_errors);
  f("handler_mem_bytes", e.handler_mem_bytes);
  f("nic_mem_bytes", e.nic_mem_bytes);
}

template <class R, class F> void runtime_fields(R& s, F&& f) {
  f("frames_accepted", s.frames_accepted);
  f("unknown_ec", s.unknown_ec);
  f("watchdog_wakeups", s.watchdog_wakeups);
}

template <class R, class F> void memory_fields(R& s, F&& f) {
  f("capacity_bytes", s.nic_mem_capacity_bytes);
  f("used_bytes", s.nic_mem_used_bytes);
  f("peak_bytes", s.nic_mem_peak_bytes);
}

auto writer(json& j) {
  return [&j](const char* key, const auto& v) { j[key] = v; };
}
auto reader(const json& j) {
  return [&j](const char* key, auto& v) { j.at(key).get_to(v); };
}

json runtime_json(const runtime_stats& s) {
  json j;
  runtime_fields(s, writer(j));
  json& rej = j["frames_rejected"] = json::object();
  for (std::size_t i = 0; i < wire::reject_count; ++i) rej[wire::reject_name(static_cast<wire::reject>(i))] = s.frames_rejected[i];
  memory_fields(s, writer(j["nic_memory"]));
  json& hpus = j["hpus"] = json::array();
  for (const auto& h : s.hpus) {
    json jh;
    hpu_fields(h, writer(jh));
    hpus.push_back(std::move(jh));
  }
  json& ecs = j["ecs"] = json::array();
  for (const auto& e : s.ecs) {
    json je;
    ec_fields(e, writer(je));
    json& d = je["drops"] = json::object();
    for (std::size_t i = 0; i < drop_reason_count; ++i) d[drop_reason_name(static_cast<drop_reason>(i))] = e.drops[i];
    json& k = je["handlers"] = json::object();
    for (std::size_t i = 0; i < 3; ++i) {
      json& jk = k[kind_name(i)];
      handler_fields(e.kinds[i], writer(jk));
      latency_fields(e.kinds[i].time, writer(jk["time"]));
    }
    ecs.push_back(std::move(je));
  }
  return j;
}

runtime_stats runtime_from(const json& j) {
  runtime_stats s;
  runtime_fields(s, reader(j));
  const json& rej = j.at("frames_rejected");
  for (std::size_t i = 0; i < wire::reject_count; ++i) rej.at(wire::reject_name(static_cast<wire::reject>(i))).get_to(s.frames_rejected[i]);
  memory_fields(s, reader(j.at("nic_memory")));
  for (const auto& jh : j.at("hpus")) {
    hpu_stats h;
    hpu_fields(h, reader(jh));
    s.hpus.push_back(h);
  }
  for (const auto& je : j.at("ecs")) {
    ec_stats e;
    ec_fields(e, reader(je));
    const json& d = je.at("drops");
    for (std::size_t i = 0; i < drop_reason_count; ++i) d.at(drop_reason_name(static_cast<drop_reason>(i))).get_to(e.drops[i]);
    const json& k = je.at("handlers");
    for (std::size_t i = 0; i < 3; ++i) {
      const json& jk = k.at(kind_name(i));
      handler_fields(e.kinds[i], reader(jk));
      latency_fields(e.kinds[i].time, reader(jk.at("time")));
    }
    s.ecs.push_back(std::move(e));
  }
  return s;
}

std::string num(std::uint64_t v) { return std::to_string(v); }
std::string fixed(double v, int digits) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

} // namespace

std::string to_json(const runtime_stats& s) { return runtime_json(s).dump(2); }

result<runtime_stats> runtime_stats_from_json(std::string_view text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return fail(errc::invalid_argument, "runtime statistics: not JSON");
  try {
    return runtime_from(j);
  } catch (const nlohmann::json::exception& e) {
    return fail(errc::invalid_argument, std::string("runtime statistics: ") + e.what());
  }
}

std::string to_text(const runtime_stats& s) {
  std::string out = "frames accepted " + num(s.frames_accepted) + ", unknown EC " + num(s.unknown_ec) + "; NIC memory " +
                    num(s.nic_mem_used_bytes) + " of " + num(s.nic_mem_capacity_bytes) + " bytes used (peak " +
                    num(s.nic_mem_peak_bytes) + ")\n";
  std::string rejected;
  for (std::size_t i = 0; i < wire::reject_count; ++i)
    if (s.frames_rejected[i] != 0)
      rejected += (rejected.empty() ? "" : ", ") + std::string(wire::reject_name(static_cast<wire::reject>(i))) + " " +
                  num(s.frames_rejected[i]);
  if (!rejected.empty()) out += "frames rejected: " + rejected + "\n";
  if (!s.hpus.empty()) {
    rt::text_table t({"HPU", "frames", "steered", "tasks", "busy ms", "preempted"});
    for (const auto& h : s.hpus)
      t.row({num(h.hpu), num(h.frames), num(h.steered), num(h.tasks), fixed(static_cast<double>(h.busy_ns) / 1e6, 3),
             num(h.preempted)});
    out += t.str("");
  }
  if (s.ecs.empty()) return out;
  rt::text_table ecs({"EC", "name", "packets", "bytes in", "started", "completed", "dropped", "aborted", "drops"});
  rt::text_table handlers({"EC", "handler", "calls", "bytes", "mean ns", "p50 ns", "p99 ns", "max ns", "over budget", "faults"});
  std::string details;
  for (const auto& e : s.ecs) {
    ecs.row({num(e.ec_id), e.name, num(e.packets_in), num(e.bytes_in), num(e.messages_started), num(e.messages_completed),
             num(e.messages_dropped), num(e.messages_aborted), num(e.total_drops())});
    for (std::size_t i = 0; i < 3; ++i) {
      const auto& k = e.kinds[i];
      if (k.invocations == 0) continue;
      handlers.row({num(e.ec_id), kind_name(i), num(k.invocations), num(k.bytes), fixed(k.time.mean_ns, 1), num(k.time.p50_ns),
                    num(k.time.p99_ns), num(k.time.max_ns), num(k.over_budget), num(k.faults)});
    }
    std::string d;
    auto item = [&d](const std::string& what) { d += (d.empty() ? "" : ", ") + what; };
    if (e.dma_ops != 0)
      item("DMA " + num(e.dma_ops) + " ops, " + num(e.dma_to_host_bytes) + " bytes to host, " + num(e.dma_from_host_bytes) +
           " from host");
    if (e.deposit_bytes != 0) item("deposited " + num(e.deposit_bytes) + " bytes");
    if (e.sends != 0 || e.send_failed != 0)
      item("sent " + num(e.sends) + " packets, " + num(e.send_bytes) + " bytes, " + num(e.send_failed) + " failed");
    if (e.events_posted != 0 || e.events_lost != 0)
      item("events " + num(e.events_posted) + " posted, " + num(e.events_lost) + " lost");
    if (e.api_errors != 0) item("API errors " + num(e.api_errors));
    if (e.packets_skipped != 0) item("skipped " + num(e.packets_skipped) + " packets");
    for (std::size_t i = 0; i < drop_reason_count; ++i)
      if (e.drops[i] != 0) item("drop " + std::string(drop_reason_name(static_cast<drop_reason>(i))) + " " + num(e.drops[i]));
    if (!d.empty()) details += "EC " + num(e.ec_id) + ": " + d + "\n";
  }
  out += ecs.str("");
  if (handlers.rows() != 0) out += handlers.str("");
  return out + details;
}

} // namespace spin::rt
