// The control protocol's JSON: the only file that spells its keys (spin/host/protocol.hpp).
#include <spin/host/protocol.hpp>
#include <spin/host/env.hpp>

#include <spin/host/shm.hpp>

#include "stats_json.hpp"

#include <nlohmann/json.hpp>

#include <limits>
#include <set>

namespace spin::host::protocol {

using json = nlohmann::json;

namespace {

constexpr std::uint64_t u32_max = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint64_t id_max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

/// A request that failed validation.
struct invalid {
  std::string message;
};
[[noreturn]] void reject(std::string message) { throw invalid{std::move(message)}; }

// A 16-byte key as 32 hexadecimal digits, written only when it is not all zero.
void put_key(nlohmann::json& j, const char* key, const secret& k) {
  if (k != secret{}) j[key] = secret_hex(k);
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string max_text(std::uint64_t v) { return v == u64_max ? "2^64-1" : std::to_string(v); }

/// Reads the fields of one JSON object, checking types and ranges, and at the end that no key
/// was left unread (unknown keys are errors).
class fields {
public:
  fields(const json& j, std::string where) : _j(j), _where(std::move(where)) {
    if (!_j.is_object()) reject(_where + " must be a JSON object");
  }
  std::uint64_t u64(const char* key, std::uint64_t lo, std::uint64_t hi) {
    const json* v = find(key);
    if (v == nullptr) reject("missing field " + name(key));
    return as_u64(*v, key, lo, hi);
  }
  std::uint32_t u32(const char* key) { return static_cast<std::uint32_t>(u64(key, 0, u32_max)); }
  std::optional<std::uint64_t> opt_u64(const char* key, std::uint64_t lo, std::uint64_t hi) {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    return as_u64(*v, key, lo, hi);
  }
  std::string str(const char* key, std::size_t max_bytes) {
    const json* v = find(key);
    if (v == nullptr) reject("missing field " + name(key));
    if (!v->is_string()) reject("field " + name(key) + " must be a string");
    const auto& s = v->get_ref<const std::string&>();
    if (s.empty() || s.size() > max_bytes) reject("field " + name(key) + " must have 1.." + std::to_string(max_bytes) + " bytes");
    for (unsigned char c : s)
      if (c < 0x20 || c == 0x7f) reject("field " + name(key) + " contains a control character");
    return s;
  }
  /// An optional 16-byte key: 32 hexadecimal digits (either case); all zero when absent. The
  /// error names the field, never its value.
  secret opt_key(const char* key) {
    const json* v = find(key);
    if (v == nullptr) return {};
    const auto k = v->is_string() ? parse_secret(v->get_ref<const std::string&>()) : std::nullopt;
    if (!k) reject("field " + name(key) + " must be 32 hexadecimal digits (16 bytes)");
    return *k;
  }
  /// An array of 0..max_items integers of 0..2^32-1.
  std::vector<std::uint32_t> u32_list(const char* key, std::size_t max_items) {
    const json* v = find(key);
    if (v == nullptr) reject("missing field " + name(key));
    if (!v->is_array() || v->size() > max_items)
      reject("field " + name(key) + " must be an array of at most " + std::to_string(max_items) + " integers");
    std::vector<std::uint32_t> out;
    out.reserve(v->size());
    for (const json& x : *v) out.push_back(static_cast<std::uint32_t>(as_u64(x, key, 0, u32_max)));
    return out;
  }
  /// An array of 0..max_items integers of 0..2^64-1.
  std::vector<std::uint64_t> u64_list(const char* key, std::size_t max_items) {
    const json* v = find(key);
    if (v == nullptr) reject("missing field " + name(key));
    if (!v->is_array() || v->size() > max_items)
      reject("field " + name(key) + " must be an array of at most " + std::to_string(max_items) + " integers");
    std::vector<std::uint64_t> out;
    out.reserve(v->size());
    for (const json& x : *v) out.push_back(as_u64(x, key, 0, u64_max));
    return out;
  }
  /// A string of 0..max_bytes bytes (control characters allowed: a message for people).
  std::string text(const char* key, std::size_t max_bytes) {
    const json* v = find(key);
    if (v == nullptr) reject("missing field " + name(key));
    if (!v->is_string() || v->get_ref<const std::string&>().size() > max_bytes)
      reject("field " + name(key) + " must be a string of at most " + std::to_string(max_bytes) + " bytes");
    return v->get<std::string>();
  }
  bool boolean(const char* key) {
    const json* v = find(key);
    if (v == nullptr) reject("missing field " + name(key));
    if (!v->is_boolean()) reject("field " + name(key) + " must be true or false");
    return v->get<bool>();
  }
  std::optional<std::string> opt_str(const char* key, std::size_t max_bytes) {
    if (find(key) == nullptr) return std::nullopt;
    return str(key, max_bytes);
  }
  bool opt_bool(const char* key, bool dflt) {
    const json* v = find(key);
    if (v == nullptr) return dflt;
    if (!v->is_boolean()) reject("field " + name(key) + " must be true or false");
    return v->get<bool>();
  }
  /// A nested object (null when absent and optional).
  const json* obj(const char* key, bool required) {
    const json* v = find(key);
    if (v == nullptr) {
      if (required) reject("missing field " + name(key));
      return nullptr;
    }
    if (!v->is_object()) reject("field " + name(key) + " must be a JSON object");
    return v;
  }
  /// Fails on any key that was not read.
  void done() const {
    for (auto it = _j.begin(); it != _j.end(); ++it)
      if (!_used.contains(it.key())) {
        std::string k = it.key();
        if (k.size() > 64) k = k.substr(0, 64) + "...";
        reject("unknown field " + name(k.c_str()));
      }
  }

private:
  std::string name(const char* key) const { return "'" + (_where.empty() ? std::string() : _where + ".") + key + "'"; }
  const json* find(const char* key) {
    _used.insert(key);
    auto it = _j.find(key);
    return it == _j.end() ? nullptr : &*it;
  }
  std::uint64_t as_u64(const json& v, const char* key, std::uint64_t lo, std::uint64_t hi) const {
    const std::string range = " must be an integer in " + std::to_string(lo) + ".." + max_text(hi);
    if (v.is_number_unsigned()) {
      const auto x = v.get<std::uint64_t>();
      if (x < lo || x > hi) reject("field " + name(key) + range + ", not " + std::to_string(x));
      return x;
    }
    if (v.is_number_integer()) reject("field " + name(key) + range + ", not " + std::to_string(v.get<std::int64_t>()));
    reject("field " + name(key) + range);
  }

  const json& _j;
  std::string _where;
  std::set<std::string, std::less<>> _used;
};

// ---- each request: its op, its fields both ways ----------------------------------------------

template <class R> struct op_of;
template <> struct op_of<hello> { static constexpr const char* name = "hello"; };
template <> struct op_of<nodes> { static constexpr const char* name = "nodes"; };
template <> struct op_of<register_memory> { static constexpr const char* name = "register"; };
template <> struct op_of<unregister_memory> { static constexpr const char* name = "unregister"; };
template <> struct op_of<install> { static constexpr const char* name = "install"; };
template <> struct op_of<uninstall> { static constexpr const char* name = "uninstall"; };
template <> struct op_of<open_events> { static constexpr const char* name = "events"; };
template <> struct op_of<close_events> { static constexpr const char* name = "close_events"; };
template <> struct op_of<send> { static constexpr const char* name = "send"; };
template <> struct op_of<stats> { static constexpr const char* name = "stats"; };
template <> struct op_of<stop> { static constexpr const char* name = "stop"; };
template <> struct op_of<pool> { static constexpr const char* name = "group_pool"; };
template <> struct op_of<join> { static constexpr const char* name = "group_join"; };
template <> struct op_of<decide> { static constexpr const char* name = "group_decide"; };
template <> struct op_of<leave> { static constexpr const char* name = "group_leave"; };
template <> struct op_of<attach> { static constexpr const char* name = "attach"; };
template <> struct op_of<wait> { static constexpr const char* name = "wait"; };
template <> struct op_of<sleep> { static constexpr const char* name = "sleep"; };
template <> struct op_of<charge> { static constexpr const char* name = "charge"; };
template <> struct op_of<barrier> { static constexpr const char* name = "barrier"; };
template <> struct op_of<p2p_send> { static constexpr const char* name = "p2p_send"; };
template <> struct op_of<p2p_recv> { static constexpr const char* name = "p2p_recv"; };
template <> struct op_of<p2p_wait> { static constexpr const char* name = "p2p_wait"; };
template <> struct op_of<p2p_probe> { static constexpr const char* name = "p2p_probe"; };

constexpr std::size_t max_members = 65535;
constexpr std::size_t max_lease_words = 65536;
constexpr std::size_t max_reason_bytes = 1024;

void put(json&, const hello&) {}
void put(json&, const nodes&) {}
void put(json&, const stats&) {}
void put(json&, const stop&) {}
void put(json& j, const register_memory& r) {
  j["node"] = r.node;
  j["bytes"] = r.bytes;
}
void put(json& j, const unregister_memory& r) {
  j["node"] = r.node;
  j["region"] = r.region;
}
void put(json& j, const install& r) {
  j["node"] = r.node;
  j["package"] = r.package;
  j["name"] = r.name;
  j["match"] = {{"bits", r.match.bits}, {"ignore_mask", r.match.ignore_mask}};
  const auto& l = r.limits;
  j["limits"] = {{"max_messages", l.max_messages},
                 {"retired_history", l.retired_history},
                 {"window_packets", l.window_packets},
                 {"max_parked_packets", l.max_parked_packets},
                 {"handler_budget_ns", l.handler_budget.count()},
                 {"event_queue_depth", l.event_queue_depth},
                 {"read_only_multicast", l.read_only_multicast}};
  j["bpf"] = r.bpf == rt::bpf_exec::jit ? "jit" : "interpreter";
  j["persist"] = r.persist;
  if (r.handler_mem_bytes != 0) j["handler_mem_bytes"] = r.handler_mem_bytes;
  if (r.scratchpad_bytes != 0) j["scratchpad_bytes"] = r.scratchpad_bytes;
  if (r.scratchpad == rt::scratchpad_init::undefined) j["scratchpad"] = "undefined";
  if (r.window)
    j["window"] = {{"region", r.window->region}, {"offset_bytes", r.window->offset_bytes}, {"len_bytes", r.window->len_bytes}};
  put_key(j, "frame_key", r.frame_key);
}
void put(json& j, const uninstall& r) {
  j["node"] = r.node;
  j["ec"] = r.ec;
}
void put(json& j, const open_events& r) {
  j["node"] = r.node;
  j["ec"] = r.ec;
  j["capacity"] = r.capacity;
}
void put(json& j, const close_events& r) {
  j["node"] = r.node;
  j["ec"] = r.ec;
}
void put(json& j, const send& r) {
  j["node"] = r.node;
  j["dest_rank"] = r.msg.dest_rank;
  j["match_bits"] = r.msg.match_bits;
  j["message_id"] = r.msg.message_id;
  j["region"] = r.msg.region;
  j["offset_bytes"] = r.msg.offset_bytes;
  j["len_bytes"] = r.msg.len_bytes;
  j["timeout_ms"] = r.timeout.count();
}

void put(json& j, const pool& r) {
  j["node"] = r.node;
  if (r.set) j["set"] = {{"slots", r.set->slots}, {"slot_bytes", r.set->slot_bytes}};
}
void put(json& j, const join& r) {
  j["node"] = r.node;
  j["group"] = r.group.group;
  j["members"] = r.group.members;
  j["slots"] = r.group.slots;
  j["proof"] = r.group.proof;
  j["me"] = r.me;
  if (r.group.packet_bytes != 0) j["packet_bytes"] = r.group.packet_bytes;
  put_key(j, "frame_key", r.group.frame_key);
  if (r.group.via != group_join::own_registry) j["via"] = r.group.via;
}
void put(json& j, const decide& r) {
  j["node"] = r.node;
  j["group"] = r.decision.group;
  j["granted"] = r.decision.granted;
  j["lease"] = r.decision.lease;
  j["reason"] = r.decision.reason;
  if (r.decision.via != group_join::own_registry) j["via"] = r.decision.via;
}
void put(json& j, const leave& r) {
  j["node"] = r.node;
  j["group"] = r.group;
  j["me"] = r.me;
  if (r.via != group_join::own_registry) j["via"] = r.via;
}

void put(json& j, const attach& r) { j["node"] = r.node; }
void put(json& j, const wait& r) {
  j["node"] = r.node;
  j["ec"] = r.ec;
  j["max_events"] = r.max_events;
  j["timeout_ns"] = r.timeout.count();
}
void put(json& j, const sleep& r) {
  j["node"] = r.node;
  j["ns"] = r.duration.count();
}
void put(json& j, const charge& r) {
  j["node"] = r.node;
  j["work"] = r.op == work::copy ? "copy" : "reduce";
  j["bytes"] = r.bytes;
}
void put(json& j, const barrier& r) {
  j["node"] = r.node;
  j["members"] = r.members;
  j["seq"] = r.seq;
}

void put(json& j, const p2p_send& r) {
  j["node"] = r.node;
  j["dest"] = r.dest;
  j["match_bits"] = r.match_bits;
  j["bytes"] = r.bytes;
  j["sync"] = r.id;
}
void put(json& j, const p2p_recv& r) {
  j["node"] = r.node;
  j["recv"] = r.id;
  j["source"] = r.source;
  j["match_bits"] = r.match_bits;
  j["ignore_bits"] = r.ignore_bits;
}
void put(json& j, const p2p_wait& r) {
  j["node"] = r.node;
  j["ids"] = r.ids;
  j["need"] = r.need;
  j["timeout_ns"] = r.timeout.count();
}
void put(json& j, const p2p_probe& r) {
  j["node"] = r.node;
  j["source"] = r.source;
  j["match_bits"] = r.match_bits;
  j["ignore_bits"] = r.ignore_bits;
  j["timeout_ns"] = r.timeout.count();
}

constexpr std::uint64_t ns_max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
constexpr std::size_t max_p2p_ids = 65535;

void get(fields& f, attach& r) { r.node = f.u32("node"); }
void get(fields& f, wait& r) {
  r.node = f.u32("node");
  r.ec = f.u32("ec");
  r.max_events = static_cast<std::uint32_t>(f.u64("max_events", 1, max_wait_events));
  r.timeout = std::chrono::nanoseconds(static_cast<std::int64_t>(f.u64("timeout_ns", 0, ns_max)));
}
void get(fields& f, sleep& r) {
  r.node = f.u32("node");
  r.duration = std::chrono::nanoseconds(static_cast<std::int64_t>(f.u64("ns", 0, ns_max)));
}
void get(fields& f, charge& r) {
  r.node = f.u32("node");
  const std::string w = f.str("work", 16);
  if (w == "copy")
    r.op = work::copy;
  else if (w == "reduce")
    r.op = work::reduce;
  else
    reject("field 'work' must be \"copy\" or \"reduce\"");
  r.bytes = f.u64("bytes", 0, u64_max);
}
void get(fields& f, barrier& r) {
  r.node = f.u32("node");
  r.members = f.u32_list("members", max_members);
  if (r.members.empty()) reject("field 'members' must name at least one node");
  r.seq = f.u64("seq", 0, u64_max);
}

void get(fields& f, p2p_send& r) {
  r.node = f.u32("node");
  r.dest = f.u32("dest");
  r.match_bits = f.u64("match_bits", 0, u64_max);
  r.bytes = f.u64("bytes", 0, ns_max);
  r.id = f.u64("sync", 0, u64_max);
}
void get(fields& f, p2p_recv& r) {
  r.node = f.u32("node");
  r.id = f.u64("recv", 1, u64_max);
  r.source = f.u32("source");
  r.match_bits = f.u64("match_bits", 0, u64_max);
  r.ignore_bits = f.u64("ignore_bits", 0, u64_max);
}
void get(fields& f, p2p_wait& r) {
  r.node = f.u32("node");
  r.ids = f.u64_list("ids", max_p2p_ids);
  if (r.ids.empty()) reject("field 'ids' must name at least one operation");
  for (std::uint64_t id : r.ids)
    if (id == 0) reject("field 'ids' must not hold 0 (the id of a buffered send, which completes at once)");
  r.need = static_cast<std::uint32_t>(f.u64("need", 1, r.ids.size()));
  r.timeout = std::chrono::nanoseconds(static_cast<std::int64_t>(f.u64("timeout_ns", 0, ns_max)));
}
void get(fields& f, p2p_probe& r) {
  r.node = f.u32("node");
  r.source = f.u32("source");
  r.match_bits = f.u64("match_bits", 0, u64_max);
  r.ignore_bits = f.u64("ignore_bits", 0, u64_max);
  r.timeout = std::chrono::nanoseconds(static_cast<std::int64_t>(f.u64("timeout_ns", 0, ns_max)));
}

void get(fields&, hello&) {}
void get(fields& f, pool& r) {
  r.node = f.u32("node");
  if (const json* s = f.obj("set", false)) {
    fields sf(*s, "set");
    slot_pool p;
    p.slots = static_cast<std::uint32_t>(sf.u64("slots", 1, 32767));
    p.slot_bytes = static_cast<std::uint32_t>(sf.u64("slot_bytes", 8, 4096));
    sf.done();
    r.set = p;
  }
}
void get(fields& f, join& r) {
  r.node = f.u32("node");
  r.group.group = f.u32("group");
  r.group.members = f.u32_list("members", max_members);
  r.group.slots = static_cast<std::uint32_t>(f.u64("slots", 1, 32767));
  r.group.proof = f.u64("proof", 0, u64_max);
  r.me = f.u32("me");
  r.group.packet_bytes = static_cast<std::uint32_t>(f.opt_u64("packet_bytes", 0, 65535).value_or(0));
  r.group.frame_key = f.opt_key("frame_key");
  r.group.via = static_cast<std::uint32_t>(f.opt_u64("via", 0, group_join::own_registry - 1).value_or(group_join::own_registry));
}
void get(fields& f, decide& r) {
  r.node = f.u32("node");
  r.decision.group = f.u32("group");
  r.decision.granted = f.boolean("granted");
  r.decision.lease = f.u32_list("lease", max_lease_words);
  r.decision.reason = f.text("reason", max_reason_bytes);
  r.decision.via = static_cast<std::uint32_t>(f.opt_u64("via", 0, group_join::own_registry - 1).value_or(group_join::own_registry));
}
void get(fields& f, leave& r) {
  r.node = f.u32("node");
  r.group = f.u32("group");
  r.me = f.u32("me");
  r.via = static_cast<std::uint32_t>(f.opt_u64("via", 0, group_join::own_registry - 1).value_or(group_join::own_registry));
}
void get(fields&, nodes&) {}
void get(fields&, stats&) {}
void get(fields&, stop&) {}
void get(fields& f, register_memory& r) {
  r.node = f.u32("node");
  r.bytes = f.u64("bytes", 1, max_region_bytes);
}
void get(fields& f, unregister_memory& r) {
  r.node = f.u32("node");
  r.region = f.u32("region");
}
void get(fields& f, install& r) {
  r.node = f.u32("node");
  r.package = f.str("package", max_path_bytes);
  r.name = f.str("name", max_name_bytes);
  {
    fields m(*f.obj("match", true), "match");
    r.match.bits = m.u64("bits", 0, u64_max);
    r.match.ignore_mask = m.u64("ignore_mask", 0, u64_max);
    m.done();
  }
  r.handler_mem_bytes = f.opt_u64("handler_mem_bytes", 0, std::uint64_t{1} << 40).value_or(0);
  r.scratchpad_bytes = f.opt_u64("scratchpad_bytes", 0, std::uint64_t{1} << 40).value_or(0);
  if (const json* w = f.obj("window", false)) {
    fields wf(*w, "window");
    rt::host_window win;
    win.region = wf.u32("region");
    win.offset_bytes = wf.u64("offset_bytes", 0, u64_max);
    win.len_bytes = wf.u64("len_bytes", 0, u64_max);
    wf.done();
    r.window = win;
  }
  if (const json* l = f.obj("limits", false)) {
    fields lf(*l, "limits");
    using mx = rt::ec_limits_max;
    auto& lim = r.limits;
    auto u32_in = [&](const char* key, std::uint32_t hi, std::uint32_t dflt) {
      return static_cast<std::uint32_t>(lf.opt_u64(key, 1, hi).value_or(dflt));
    };
    lim.max_messages = u32_in("max_messages", mx::messages, lim.max_messages);
    lim.retired_history = u32_in("retired_history", mx::retired_history, lim.retired_history);
    lim.window_packets = u32_in("window_packets", mx::window_packets, lim.window_packets);
    lim.max_parked_packets = u32_in("max_parked_packets", mx::parked_packets, lim.max_parked_packets);
    const auto budget_max = static_cast<std::uint64_t>(mx::handler_budget.count());
    if (auto b = lf.opt_u64("handler_budget_ns", 1, budget_max)) lim.handler_budget = std::chrono::nanoseconds(*b);
    lim.event_queue_depth = u32_in("event_queue_depth", mx::event_queue_depth, lim.event_queue_depth);
    lim.read_only_multicast = lf.opt_bool("read_only_multicast", lim.read_only_multicast);
    lf.done();
  }
  if (auto b = f.opt_str("bpf", 16)) {
    if (*b == "jit")
      r.bpf = rt::bpf_exec::jit;
    else if (*b == "interpreter")
      r.bpf = rt::bpf_exec::interpreter;
    else
      reject("field 'bpf' must be \"jit\" or \"interpreter\"");
  }
  if (auto sc = f.opt_str("scratchpad", 16)) {
    if (*sc == "zeroed")
      r.scratchpad = rt::scratchpad_init::zeroed;
    else if (*sc == "undefined")
      r.scratchpad = rt::scratchpad_init::undefined;
    else
      reject("field 'scratchpad' must be \"zeroed\" or \"undefined\"");
  }
  r.persist = f.opt_bool("persist", false);
  r.frame_key = f.opt_key("frame_key");
}
void get(fields& f, uninstall& r) {
  r.node = f.u32("node");
  r.ec = f.u32("ec");
}
void get(fields& f, open_events& r) {
  r.node = f.u32("node");
  r.ec = f.u32("ec");
  r.capacity = static_cast<std::uint32_t>(f.u64("capacity", 1, event_ring_layout::max_capacity));
}
void get(fields& f, close_events& r) {
  r.node = f.u32("node");
  r.ec = f.u32("ec");
}
void get(fields& f, send& r) {
  r.node = f.u32("node");
  r.msg.dest_rank = f.u32("dest_rank");
  r.msg.match_bits = f.u64("match_bits", 0, u64_max);
  r.msg.message_id = f.u64("message_id", 0, u64_max);
  r.msg.region = f.u32("region");
  r.msg.offset_bytes = f.u64("offset_bytes", 0, u64_max);
  r.msg.len_bytes = f.u64("len_bytes", 0, u64_max);
  r.timeout = std::chrono::milliseconds(f.u64("timeout_ms", 0, max_send_timeout_ms));
}

/// Decodes the request whose op is `op` into alternative I or a later one of `request`.
template <std::size_t I = 0> request decode_op(const std::string& op, fields& f) {
  if constexpr (I == std::variant_size_v<request>) {
    std::string shown = op;
    reject("unknown op '" + shown + "'");
  } else {
    using R = std::variant_alternative_t<I, request>;
    if (op != op_of<R>::name) return decode_op<I + 1>(op, f);
    R r;
    get(f, r);
    return r;
  }
}

// ---- replies ------------------------------------------------------------------------------------

void put(json&, const done&) {}
void put(json& j, const hello_reply& r) {
  j["protocol"] = r.protocol;
  j["server"] = r.server;
  j["nodes"] = r.nodes;
  if (r.virtual_time) j["virtual_time"] = true;
}
void put(json& j, const clock_reply& r) {
  j["now_ns"] = r.now.count();
  j["events"] = r.events;
}
void put(json& j, const p2p_reply& r) {
  j["now_ns"] = r.now.count();
  json list = json::array();
  for (const auto& m : r.done)
    list.push_back({{"id", m.id}, {"source", m.source}, {"match_bits", m.match_bits}, {"bytes", m.bytes}, {"order", m.order}});
  j["done"] = std::move(list);
}
void put(json& j, const nodes_reply& r) {
  json list = json::array();
  for (const auto& n : r.nodes)
    list.push_back({{"node", n.node}, {"name", n.name}, {"rank", n.rank}, {"max_payload_bytes", n.max_payload_bytes}});
  j["nodes"] = std::move(list);
}
void put(json& j, const register_reply& r) { j["region"] = r.region; }
void put(json& j, const install_reply& r) { j["ec"] = r.ec; }
void put(json& j, const events_reply& r) {
  j["capacity"] = r.capacity;
  j["bytes"] = r.bytes;
}
void put(json& j, const stats_reply& r) { j["stats"] = json(host::detail::nodes_json(r.nodes)); }

void put(json& j, const pool_reply& r) {
  j["slots"] = r.usage.pool.slots;
  j["slot_bytes"] = r.usage.pool.slot_bytes;
  j["free"] = r.usage.free;
  j["groups"] = r.usage.groups;
  j["waiting"] = r.usage.waiting;
}
void put(json& j, const join_reply& r) {
  j["state"] = name(r.answer.state);
  j["lease"] = r.answer.lease;
  j["reason"] = r.answer.reason;
  j["installer"] = r.answer.installer;
}

// Reply decoders read with at() and get<>(): a missing key or a wrong type throws
// json::exception, which decode_reply turns into bad_state.
void get(const json&, done&) {}
void get(const json& j, hello_reply& r) {
  r.protocol = j.at("protocol").get<int>();
  r.server = j.at("server").get<std::string>();
  r.nodes = j.at("nodes").get<std::uint32_t>();
  r.virtual_time = j.value("virtual_time", false);
}
void get(const json& j, clock_reply& r) {
  r.now = std::chrono::nanoseconds(j.at("now_ns").get<std::int64_t>());
  r.events = j.at("events").get<std::uint32_t>();
}
void get(const json& j, p2p_reply& r) {
  r.now = std::chrono::nanoseconds(j.at("now_ns").get<std::int64_t>());
  for (const auto& m : j.at("done"))
    r.done.push_back(p2p_match{m.at("id").get<std::uint64_t>(), m.at("source").get<std::uint32_t>(),
                               m.at("match_bits").get<std::uint64_t>(), m.at("bytes").get<std::uint64_t>(),
                               m.at("order").get<std::uint64_t>()});
}
void get(const json& j, nodes_reply& r) {
  for (const auto& n : j.at("nodes"))
    r.nodes.push_back(node_entry{n.at("node").get<std::uint32_t>(), n.at("name").get<std::string>(),
                                 n.at("rank").get<std::uint32_t>(), n.at("max_payload_bytes").get<std::uint32_t>()});
}
void get(const json& j, register_reply& r) { r.region = j.at("region").get<rt::region_id>(); }
void get(const json& j, install_reply& r) { r.ec = j.at("ec").get<rt::ec_id>(); }
void get(const json& j, events_reply& r) {
  r.capacity = j.at("capacity").get<std::uint32_t>();
  r.bytes = j.at("bytes").get<std::uint64_t>();
}
void get(const json& j, pool_reply& r) {
  r.usage.pool.slots = j.at("slots").get<std::uint32_t>();
  r.usage.pool.slot_bytes = j.at("slot_bytes").get<std::uint32_t>();
  r.usage.free = j.at("free").get<std::uint32_t>();
  r.usage.groups = j.at("groups").get<std::uint32_t>();
  r.usage.waiting = j.at("waiting").get<std::uint32_t>();
}
void get(const json& j, join_reply& r) {
  const std::string s = j.at("state").get<std::string>();
  bool known = false;
  for (join_state k : {join_state::install, join_state::wait, join_state::granted, join_state::refused})
    if (s == name(k)) {
      r.answer.state = k;
      known = true;
    }
  if (!known) throw json::other_error::create(501, "unknown join state '" + s + "'", &j);
  r.answer.lease = j.at("lease").get<std::vector<std::uint32_t>>();
  r.answer.reason = j.at("reason").get<std::string>();
  r.answer.installer = j.at("installer").get<bool>();
}
void get(const json& j, stats_reply& r) {
  for (const auto& n : j.at("stats")) {
    auto s = host::detail::nic_from(n.at("stats"));
    if (!s) reject("node " + dump(n.at("node")) + ": " + s.err().message);
    r.nodes.push_back(node_stats{n.at("node").get<std::uint32_t>(), std::move(s.value())});
  }
}

} // namespace

const char* op_name(const request& r) noexcept {
  return std::visit([](const auto& x) { return op_of<std::decay_t<decltype(x)>>::name; }, r);
}

std::size_t fds_of(const request& r) noexcept { return std::holds_alternative<register_memory>(r) ? 1 : 0; }

std::string encode_request(std::uint64_t id, const request& r) {
  json j{{"id", id}, {"op", op_name(r)}};
  std::visit([&](const auto& x) { put(j, x); }, r);
  return dump(j);
}

result<decoded_request> decode_request(std::string_view line, std::optional<std::uint64_t>& id_out) {
  id_out.reset();
  try {
    json req = json::parse(line, nullptr, false);
    if (req.is_discarded()) {
      // Parse again for the parser's own words on what is wrong.
      try {
        (void)json::parse(line);
      } catch (const json::exception& e) {
        reject(std::string("request is not valid JSON (UTF-8): ") + e.what());
      }
      reject("request is not valid JSON (UTF-8)");
    }
    if (!req.is_object()) reject("request must be a JSON object");
    if (auto it = req.find("id"); it != req.end() && it->is_number_unsigned() && it->get<std::uint64_t>() <= id_max)
      id_out = it->get<std::uint64_t>();
    fields f(req, "");
    decoded_request out;
    out.id = f.u64("id", 0, id_max);
    const std::string op = f.str("op", 32);
    out.req = decode_op(op, f);
    f.done();
    return out;
  } catch (const invalid& e) {
    return fail(errc::invalid_argument, e.message);
  } catch (const json::exception& e) {
    return fail(errc::invalid_argument, std::string("malformed request: ") + e.what());
  }
}

std::string encode_reply(std::uint64_t id, const reply& r) {
  json j{{"id", id}, {"ok", true}};
  std::visit([&](const auto& x) { put(j, x); }, r);
  return dump(j);
}

std::string encode_error(std::optional<std::uint64_t> id, std::string_view code, std::string_view message) {
  json j{{"id", id ? json(*id) : json(nullptr)},
         {"ok", false},
         {"error", {{"code", std::string(code)}, {"message", std::string(message)}}}};
  return dump(j);
}

std::string encode_error(std::optional<std::uint64_t> id, const error& e) { return encode_error(id, errc_name(e.code), e.message); }

errc errc_from_name(std::string_view name) noexcept {
  for (int v = 0; v >= -13; --v)
    if (name == errc_name(static_cast<errc>(v))) return static_cast<errc>(v);
  if (name == "permission") return errc::not_supported;
  return errc::bad_state;
}

template <class R> result<R> decode_reply(std::string_view line, std::uint64_t expected_id, bool& other_id) {
  other_id = false;
  json rep = json::parse(line, nullptr, false);
  if (rep.is_discarded() || !rep.is_object() || !rep.contains("ok") || !rep["ok"].is_boolean())
    return fail(errc::bad_state, "control reply is not a protocol object: " + std::string(line.substr(0, 200)));
  if (!rep["ok"].get<bool>()) {
    const json& e = rep.value("error", json::object());
    const std::string code = e.is_object() && e.contains("code") && e["code"].is_string() ? e["code"].get<std::string>() : "";
    const std::string msg = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                                                : std::string(line);
    return fail(errc_from_name(code), msg);
  }
  if (!rep.contains("id") || rep["id"] != expected_id) {
    other_id = true;
    return fail(errc::bad_state, "control reply for another request (id " + dump(rep.value("id", json())) + ", expected " +
                                     std::to_string(expected_id) + ")");
  }
  R out;
  try {
    get(rep, out);
  } catch (const json::exception& e) {
    return fail(errc::bad_state, std::string("malformed control reply (") + e.what() + "): " + std::string(line.substr(0, 200)));
  } catch (const invalid& e) {
    return fail(errc::bad_state, "malformed control reply: " + e.message);
  }
  return out;
}

template result<done> decode_reply<done>(std::string_view, std::uint64_t, bool&);
template result<hello_reply> decode_reply<hello_reply>(std::string_view, std::uint64_t, bool&);
template result<nodes_reply> decode_reply<nodes_reply>(std::string_view, std::uint64_t, bool&);
template result<register_reply> decode_reply<register_reply>(std::string_view, std::uint64_t, bool&);
template result<install_reply> decode_reply<install_reply>(std::string_view, std::uint64_t, bool&);
template result<events_reply> decode_reply<events_reply>(std::string_view, std::uint64_t, bool&);
template result<stats_reply> decode_reply<stats_reply>(std::string_view, std::uint64_t, bool&);
template result<pool_reply> decode_reply<pool_reply>(std::string_view, std::uint64_t, bool&);
template result<join_reply> decode_reply<join_reply>(std::string_view, std::uint64_t, bool&);
template result<clock_reply> decode_reply<clock_reply>(std::string_view, std::uint64_t, bool&);
template result<p2p_reply> decode_reply<p2p_reply>(std::string_view, std::uint64_t, bool&);

} // namespace spin::host::protocol
