// A NIC's statistics as text and JSON. Each struct's keys are listed once (the *_fields
// functions) and read by the writer and the reader alike.
#include "stats_json.hpp"

namespace spin::host {

const char* nic_drop_name(nic_drop d) {
  switch (d) {
    case nic_drop::no_mbuf: return "no_mbuf";
    case nic_drop::oversize: return "oversize";
    case nic_drop::malformed: return "malformed";
    case nic_drop::unknown_ec: return "unknown_ec";
    case nic_drop::rx_queue_full: return "rx_queue_full";
    case nic_drop::tx_queue_full: return "tx_queue_full";
    case nic_drop::unroutable: return "unroutable";
    case nic_drop::mgmt_queue_full: return "mgmt_queue_full";
    case nic_drop::count_: break;
  }
  return "?";
}

std::uint64_t nic_stats::total_drops() const {
  std::uint64_t n = 0;
  for (auto d : drops) n += d;
  return n;
}

namespace {

using json = nlohmann::ordered_json;

template <class P, class F> void hw_fields(P& h, F&& f) {
  f("ipackets", h.ipackets);
  f("ibytes", h.ibytes);
  f("opackets", h.opackets);
  f("obytes", h.obytes);
  f("imissed", h.imissed);
  f("rx_nombuf", h.rx_nombuf);
  f("ierrors", h.ierrors);
  f("oerrors", h.oerrors);
}

template <class P, class F> void port_fields(P& p, F&& f) {
  f("name", p.name);
  f("rx_packets", p.rx_packets);
  f("rx_bytes", p.rx_bytes);
  f("tx_packets", p.tx_packets);
  f("tx_bytes", p.tx_bytes);
  f("forwarded", p.forwarded);
}

template <class S, class F> void nic_fields(S& s, F&& f) {
  f("host_messages_sent", s.host_messages_sent);
  f("host_packets_sent", s.host_packets_sent);
  f("host_bytes_sent", s.host_bytes_sent);
  f("loopback_packets", s.loopback_packets);
  f("multicast_shared", s.multicast_shared);
  f("forward_in_place", s.forward_in_place);
  f("forward_chained", s.forward_chained);
  f("unshared", s.unshared);
  f("mbufs_in_use", s.mbufs_in_use);
  f("capture_frames", s.capture_frames);
  f("capture_errors", s.capture_errors);
  f("mgmt_received", s.mgmt_received);
  f("mgmt_sent", s.mgmt_sent);
}

auto writer(json& j) {
  return [&j](const char* key, const auto& v) { j[key] = v; };
}
auto reader(const nlohmann::json& j) {
  return [&j](const char* key, auto& v) { j.at(key).get_to(v); };
}

std::string num(std::uint64_t v) { return std::to_string(v); }

} // namespace

namespace detail {

json nic_json(const nic_stats& s) {
  json j;
  j["name"] = s.name;
  j["rank"] = s.rank;
  json& ports = j["ports"] = json::array();
  for (const auto& p : s.ports) {
    json jp;
    port_fields(p, writer(jp));
    hw_fields(p.hw, writer(jp["hw"]));
    ports.push_back(std::move(jp));
  }
  json& d = j["drops"] = json::object();
  for (std::size_t i = 0; i < nic_drop_count; ++i) d[nic_drop_name(static_cast<nic_drop>(i))] = s.drops[i];
  nic_fields(s, writer(j));
  j["runtime"] = json::parse(rt::to_json(s.runtime));
  return j;
}

json nodes_json(const std::vector<node_stats>& nodes) {
  json list = json::array();
  for (const auto& n : nodes)
    list.push_back({{"node", n.node}, {"name", n.stats.name}, {"rank", n.stats.rank}, {"stats", nic_json(n.stats)}});
  return list;
}

result<nic_stats> nic_from(const nlohmann::json& j) {
  try {
    nic_stats s;
    j.at("name").get_to(s.name);
    j.at("rank").get_to(s.rank);
    for (const auto& jp : j.at("ports")) {
      nic_port_stats p;
      port_fields(p, reader(jp));
      hw_fields(p.hw, reader(jp.at("hw")));
      s.ports.push_back(std::move(p));
    }
    const nlohmann::json& d = j.at("drops");
    for (std::size_t i = 0; i < nic_drop_count; ++i) d.at(nic_drop_name(static_cast<nic_drop>(i))).get_to(s.drops[i]);
    nic_fields(s, reader(j));
    auto rt = rt::runtime_stats_from_json(j.at("runtime").dump());
    if (!rt) return rt.err();
    s.runtime = std::move(rt.value());
    return s;
  } catch (const nlohmann::json::exception& e) {
    return fail(errc::invalid_argument, std::string("NIC statistics: ") + e.what());
  }
}

} // namespace detail

std::string to_json(const nic_stats& s) { return detail::nic_json(s).dump(); }

std::string to_json(const std::vector<node_stats>& nodes) { return detail::nodes_json(nodes).dump(); }

result<nic_stats> nic_stats_from_json(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return fail(errc::invalid_argument, "NIC statistics: not JSON");
  return detail::nic_from(j);
}

std::string to_text(const nic_stats& s) {
  std::string out = "nic " + s.name + " (rank " + num(s.rank) + ")\n";
  if (!s.ports.empty()) {
    rt::text_table t({"port", "rx packets", "rx bytes", "tx packets", "tx bytes", "forwarded", "imissed", "rx_nombuf",
                              "ierrors", "oerrors"});
    for (const auto& p : s.ports)
      t.row({p.name, num(p.rx_packets), num(p.rx_bytes), num(p.tx_packets), num(p.tx_bytes), num(p.forwarded),
             num(p.hw.imissed), num(p.hw.rx_nombuf), num(p.hw.ierrors), num(p.hw.oerrors)});
    out += t.str("  ");
  }
  std::string drops;
  for (std::size_t i = 0; i < nic_drop_count; ++i)
    if (s.drops[i] != 0)
      drops += std::string(drops.empty() ? "" : ", ") + nic_drop_name(static_cast<nic_drop>(i)) + " " + num(s.drops[i]);
  if (!drops.empty()) out += "  drops: " + drops + "\n";
  if (s.host_messages_sent != 0)
    out += "  host sends: " + num(s.host_messages_sent) + " messages, " + num(s.host_packets_sent) + " packets, " +
           num(s.host_bytes_sent) + " bytes\n";
  std::string frames;
  auto item = [&frames](const char* what, std::uint64_t v) {
    if (v != 0) frames += std::string(frames.empty() ? "" : ", ") + what + " " + num(v);
  };
  item("loopback", s.loopback_packets);
  item("multicast shared", s.multicast_shared);
  item("forwarded in place", s.forward_in_place);
  item("forwarded chained", s.forward_chained);
  item("unshared", s.unshared);
  if (!frames.empty()) out += "  frames: " + frames + "\n";
  if (s.mgmt_received != 0 || s.mgmt_sent != 0)
    out += "  management datagrams: " + num(s.mgmt_received) + " received, " + num(s.mgmt_sent) + " sent\n";
  if (s.capture_frames != 0 || s.capture_errors != 0)
    out += "  capture: " + num(s.capture_frames) + " frames, " + num(s.capture_errors) + " errors\n";
  out += "  mbufs in use " + num(s.mbufs_in_use) + "\n";
  const std::string rt_text = rt::to_text(s.runtime);
  std::size_t at = 0;
  while (at < rt_text.size()) {
    const std::size_t nl = rt_text.find('\n', at);
    const std::size_t end = nl == std::string::npos ? rt_text.size() : nl + 1;
    out += "  " + rt_text.substr(at, end - at);
    at = end;
  }
  return out;
}

} // namespace spin::host
