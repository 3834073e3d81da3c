#include <spin/emu/topology.hpp>

#include "nic_model_keys.hpp"

// toml++ without exceptions, header-only in this file: the packaged shared library (which
// pkg-config selects with TOML_SHARED_LIB=1 TOML_HEADER_ONLY=0) is built with exceptions and
// exports only the `ex` ABI namespace; ours is `noex`, so both may coexist in one program.
#undef TOML_SHARED_LIB
#define TOML_SHARED_LIB 0
#undef TOML_HEADER_ONLY
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 0
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

namespace spin::emu {

// ---- topology members ----------------------------------------------------------------------

std::optional<std::uint32_t> topology::find(std::string_view name) const {
  for (std::uint32_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].name == name) return i;
  return std::nullopt;
}

std::optional<std::uint32_t> topology::host_of_rank(std::uint32_t rank) const {
  for (std::uint32_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].kind == node_kind::host && nodes[i].rank == rank) return i;
  return std::nullopt;
}

std::size_t topology::host_count() const {
  return static_cast<std::size_t>(
      std::count_if(nodes.begin(), nodes.end(), [](const node& n) { return n.kind == node_kind::host; }));
}

namespace {

const char* kind_name(node_kind k) { return k == node_kind::host ? "host" : "switch"; }

bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > 32) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// Printable and at most 64 characters: names come from user files.
std::string quote(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 64)) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  if (s.size() > 64) out += "...";
  return out + "'";
}

// Per-node / per-link place strings ("file:3:1") for messages; empty for topologies built in code.
using where_fn = std::function<std::string(bool is_link, std::uint32_t index)>;

std::string at(const std::string& place) { return place.empty() ? std::string() : place + ": "; }

std::string link_label(const topology& t, std::uint32_t l) {
  const link_spec& s = t.links[l];
  auto nm = [&](std::uint32_t n) { return n < t.nodes.size() ? t.nodes[n].name : "#" + std::to_string(n); };
  return "link " + std::to_string(l) + " (" + quote(nm(s.a)) + " - " + quote(nm(s.b)) + ")";
}

// Hop distances from node `from` (none = unreachable).
constexpr std::uint32_t unreached = std::numeric_limits<std::uint32_t>::max();
std::vector<std::uint32_t> bfs(const topology& t, std::uint32_t from) {
  std::vector<std::uint32_t> dist(t.nodes.size(), unreached);
  std::vector<std::uint32_t> queue{from};
  dist[from] = 0;
  for (std::size_t qi = 0; qi < queue.size(); ++qi) {
    const std::uint32_t n = queue[qi];
    for (std::uint32_t l : t.nodes[n].ports) {
      const link_spec& s = t.links[l];
      const std::uint32_t m = s.a == n ? s.b : s.a;
      if (dist[m] == unreached) {
        dist[m] = dist[n] + 1;
        queue.push_back(m);
      }
    }
  }
  return dist;
}

// The checks shared by validate(topology) and parse_topology (which checks types and keys first).
result<void> check_graph(const topology& t, const where_fn& where) {
  auto bad = [](std::string msg) { return fail(errc::invalid_argument, std::move(msg)); };
  std::map<std::string_view, std::uint32_t> names;
  std::map<std::uint32_t, std::uint32_t> ranks;
  for (std::uint32_t i = 0; i < t.nodes.size(); ++i) {
    const node& n = t.nodes[i];
    const std::string w = at(where(false, i));
    if (!valid_name(n.name))
      return bad(w + "invalid " + kind_name(n.kind) + " name " + quote(n.name) + ": names are 1 to 32 of A-Z a-z 0-9 _ -");
    if (auto [it, fresh] = names.emplace(n.name, i); !fresh) {
      const std::string first = where(false, it->second);
      return bad(w + "duplicate node name " + quote(n.name) + " (first used " +
                 (first.empty() ? "by node " + std::to_string(it->second) : "at " + first) + ")");
    }
    if (n.kind != node_kind::host) continue;
    if (n.rank > max_rank)
      return bad(w + "host " + quote(n.name) + ": rank must be in [0, 65535], got " + std::to_string(n.rank));
    if (n.hpus < 1 || n.hpus > max_hpus)
      return bad(w + "host " + quote(n.name) + ": hpus must be in [1, 64], got " + std::to_string(n.hpus));
    if (auto [it, fresh] = ranks.emplace(n.rank, i); !fresh)
      return bad(w + "duplicate rank " + std::to_string(n.rank) + ": hosts " + quote(t.nodes[it->second].name) +
                 " and " + quote(n.name));
  }
  std::size_t port_refs = 0;
  for (const node& n : t.nodes) port_refs += n.ports.size();
  for (std::uint32_t l = 0; l < t.links.size(); ++l) {
    const link_spec& s = t.links[l];
    const std::string w = at(where(true, l));
    if (s.a >= t.nodes.size() || s.b >= t.nodes.size())
      return bad(w + link_label(t, l) + ": endpoint is not a node");
    if (s.a == s.b) return bad(w + "link from " + quote(t.nodes[s.a].name) + " to itself");
    const auto& pa = t.nodes[s.a].ports;
    const auto& pb = t.nodes[s.b].ports;
    if (s.a_port >= pa.size() || pa[s.a_port] != l || s.b_port >= pb.size() || pb[s.b_port] != l)
      return bad(w + link_label(t, l) + ": a_port/b_port do not match the nodes' port lists");
    if (auto f = detail::first_bad_field(s.model)) return bad(w + link_label(t, l) + ": " + f->message);
  }
  if (port_refs != 2 * t.links.size())
    return bad("the nodes' port lists name " + std::to_string(port_refs) + " link ends, but there are " +
               std::to_string(t.links.size()) + " links (" + std::to_string(2 * t.links.size()) + " ends)");
  std::vector<std::uint32_t> hosts;
  for (std::uint32_t i = 0; i < t.nodes.size(); ++i)
    if (t.nodes[i].kind == node_kind::host) hosts.push_back(i);
  if (hosts.empty()) return bad(at(where(false, unreached)) + "no hosts: a topology needs at least one [[host]]");
  const std::vector<std::uint32_t> dist = bfs(t, hosts[0]);
  for (std::uint32_t h : hosts)
    if (dist[h] == unreached)
      return bad(at(where(false, h)) + "hosts " + quote(t.nodes[hosts[0]].name) + " and " + quote(t.nodes[h].name) +
                 " are not connected (no path between them)");
  return {};
}

// ---- TOML reading --------------------------------------------------------------------------

std::string place(std::string_view src, const toml::source_region& r) {
  if (r.begin.line == 0) return std::string(src);
  return std::string(src) + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

const char* type_name(toml::node_type t) {
  switch (t) {
  case toml::node_type::table: return "a table";
  case toml::node_type::array: return "an array";
  case toml::node_type::string: return "a string";
  case toml::node_type::integer: return "an integer";
  case toml::node_type::floating_point: return "a float";
  case toml::node_type::boolean: return "a boolean";
  case toml::node_type::date: return "a date";
  case toml::node_type::time: return "a time";
  case toml::node_type::date_time: return "a date-time";
  case toml::node_type::none: break;
  }
  return "nothing";
}

const std::vector<std::string_view> model_keys = {"rate_gbps", "latency_ns", "gap_ns", "loss", "duplicate", "reorder",
                                                  "reorder_delay_ns", "seed", "queue_packets", "on_full"};

class reader {
public:
  explicit reader(std::string_view src) : _src(src) {}

  std::string at_node(const toml::node& n) const { return place(_src, n.source()) + ": "; }

  error err_at(const toml::node& n, std::string msg) const {
    return error{errc::invalid_argument, at_node(n) + std::move(msg)};
  }

  // Every key of `tbl` must be in `allowed`; reports the first unknown one in file order (toml++
  // iterates keys sorted by name).
  std::optional<error> check_keys(const toml::table& tbl, const std::vector<std::string_view>& allowed,
                                  const std::string& what) const {
    // Copies, not pointers: the positions must outlive the iteration.
    std::optional<std::string> first;
    toml::source_region first_at{};
    for (auto&& [k, v] : tbl) {
      if (std::find(allowed.begin(), allowed.end(), k.str()) != allowed.end()) continue;
      const toml::source_region r = k.source().begin.line != 0 ? k.source() : v.source();
      if (!first || r.begin < first_at.begin) {
        first = std::string(k.str());
        first_at = r;
      }
    }
    if (!first) return std::nullopt;
    std::string list;
    for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    return error{errc::invalid_argument, place(_src, first_at) + ": unknown key " + quote(*first) + " in " +
                                             what + " (known keys: " + list + ")"};
  }

  result<std::optional<std::string>> get_string(const toml::table& tbl, std::string_view key,
                                                const std::string& what) const {
    const toml::node* n = tbl.get(key);
    if (n == nullptr) return std::optional<std::string>{};
    if (!n->is_string())
      return err_at(*n, quote(key) + " in " + what + " must be a string, got " + type_name(n->type()));
    return std::optional<std::string>{std::string(n->as_string()->get())};
  }

  result<std::optional<std::int64_t>> get_int(const toml::table& tbl, std::string_view key,
                                              const std::string& what) const {
    const toml::node* n = tbl.get(key);
    if (n == nullptr) return std::optional<std::int64_t>{};
    if (!n->is_integer())
      return err_at(*n, quote(key) + " in " + what + " must be an integer, got " + type_name(n->type()));
    return std::optional<std::int64_t>{n->as_integer()->get()};
  }

  result<std::optional<double>> get_number(const toml::table& tbl, std::string_view key,
                                           const std::string& what) const {
    const toml::node* n = tbl.get(key);
    if (n == nullptr) return std::optional<double>{};
    if (n->is_integer()) return std::optional<double>{static_cast<double>(n->as_integer()->get())};
    if (!n->is_floating_point())
      return err_at(*n, quote(key) + " in " + what + " must be a number, got " + type_name(n->type()));
    return std::optional<double>{n->as_floating_point()->get()};
  }

  // Reads the link-model keys of `tbl` over `m`. Sets `seed_set` when the table has a seed.
  result<void> read_model(const toml::table& tbl, const std::string& what, link_model& m, bool& seed_set) const {
    for (const char* key : {"rate_gbps", "gap_ns", "loss", "duplicate", "reorder"}) {
      auto v = get_number(tbl, key, what);
      if (!v) return v.err();
      if (!*v) continue;
      const std::string_view k = key;
      double& field = k == "rate_gbps" ? m.rate_gbps : k == "gap_ns" ? m.gap_ns : k == "loss" ? m.loss : k == "duplicate" ? m.duplicate : m.reorder;
      field = **v;
    }
    for (const char* key : {"latency_ns", "reorder_delay_ns", "queue_packets", "seed"}) {
      auto v = get_int(tbl, key, what);
      if (!v) return v.err();
      if (!*v) continue;
      const std::string_view k = key;
      const std::int64_t x = **v;
      if (k == "seed") {
        m.seed = static_cast<std::uint64_t>(x);  // any 64-bit value; negatives wrap
        seed_set = true;
      } else if (k == "queue_packets") {
        if (x < 1 || x > std::int64_t{max_link_queue_packets})
          return err_at(*tbl.get(key), what + ": queue_packets must be in [1, 1048576], got " + std::to_string(x));
        m.queue_packets = static_cast<std::uint32_t>(x);
      } else {
        if (x < 0 || x > max_link_delay.count())
          return err_at(*tbl.get(key), what + ": " + std::string(key) + " must be in [0, 1000000000] ns, got " +
                                           std::to_string(x));
        (k == "latency_ns" ? m.latency : m.reorder_delay) = std::chrono::nanoseconds(x);
      }
    }
    auto policy = get_string(tbl, "on_full", what);
    if (!policy) return policy.err();
    if (*policy) {
      if (**policy == "drop") m.on_full = overflow_policy::drop;
      else if (**policy == "backpressure") m.on_full = overflow_policy::backpressure;
      else return err_at(*tbl.get("on_full"), what + ": on_full must be \"drop\" or \"backpressure\", got " + quote(**policy));
    }
    if (auto f = detail::first_bad_field(m)) {
      const toml::node* n = tbl.get(f->key);
      const std::string w = n ? at_node(*n) : place(_src, tbl.source()) + ": ";
      return error{errc::invalid_argument, w + what + ": " + f->message};
    }
    return {};
  }

  // Reads the table `name` ([nic], [switch_nic]) over `m`, when the file has it: every key of
  // detail::nic_model_keys(), integers where the key takes one, each in its range.
  result<void> read_nic_model(const toml::table& root, std::string_view name, nic_model& m) const {
    const toml::node* n = root.get(name);
    if (n == nullptr) return {};
    const std::string what = "[" + std::string(name) + "]";
    if (!n->is_table()) return err_at(*n, what + " must be a table, got " + std::string(type_name(n->type())));
    const toml::table& tbl = *n->as_table();
    std::vector<std::string_view> keys;
    for (const detail::model_key& k : detail::nic_model_keys()) keys.push_back(k.key);
    if (auto e = check_keys(tbl, keys, what)) return *e;
    for (const detail::model_key& k : detail::nic_model_keys()) {
      const toml::node* v = tbl.get(k.key);
      if (v == nullptr) continue;
      double x = 0;
      if (k.type == detail::model_key::f64) {
        auto d = get_number(tbl, k.key, what);
        if (!d) return d.err();
        x = **d;
      } else {
        auto i = get_int(tbl, k.key, what);
        if (!i) return i.err();
        x = static_cast<double>(**i);
      }
      if (auto why = k.check(x)) return err_at(*v, what + ": " + *why);
      k.set(m, x);
    }
    return {};
  }

  // `arr_name` must be an array of tables ([[arr_name]]); returns them (none when absent).
  result<std::vector<const toml::table*>> tables(const toml::table& root, std::string_view arr_name) const {
    std::vector<const toml::table*> out;
    const toml::node* n = root.get(arr_name);
    if (n == nullptr) return out;
    const toml::array* arr = n->as_array();
    if (arr == nullptr || !arr->is_array_of_tables())
      return err_at(*n, quote(arr_name) + " must be an array of tables, written [[" + std::string(arr_name) +
                            "]], got " + type_name(n->type()));
    for (const toml::node& e : *arr) out.push_back(e.as_table());
    return out;
  }

  std::string_view src() const { return _src; }

private:
  std::string_view _src;
};

std::string fmt_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

// ---- parse ---------------------------------------------------------------------------------

result<topology> parse_topology(std::string_view toml_text, std::string_view source_name) {
  const std::string src(source_name.empty() ? "<topology>" : source_name);
  toml::parse_result parsed = toml::parse(toml_text, src);
  if (!parsed) {
    const toml::parse_error& e = parsed.error();
    return fail(errc::invalid_argument,
                place(src, e.source()) + ": TOML syntax error: " + std::string(e.description()));
  }
  const toml::table& root = parsed.table();
  reader rd(src);
  if (auto e = rd.check_keys(root, {"defaults", "host", "switch", "link", "nic", "switch_nic", "switch_model"}, "the top level"))
    return *e;

  link_model defaults;
  if (const toml::node* d = root.get("defaults")) {
    if (!d->is_table())
      return rd.err_at(*d, "'defaults' must be a table, written [defaults], got " + std::string(type_name(d->type())));
    const toml::table& dt = *d->as_table();
    if (auto e = rd.check_keys(dt, model_keys, "[defaults]")) return *e;
    bool seed_set = false;
    if (auto r = rd.read_model(dt, "[defaults]", defaults, seed_set); !r) return r.err();
  }

  topology t;
  if (auto r = rd.read_nic_model(root, "nic", t.nic); !r) return r.err();
  t.switch_nic = switch_nic_of(t.nic);
  if (auto r = rd.read_nic_model(root, "switch_nic", t.switch_nic); !r) return r.err();
  if (const toml::node* n = root.get("switch_model")) {
    if (!n->is_table()) return rd.err_at(*n, "[switch_model] must be a table, got " + std::string(type_name(n->type())));
    const toml::table& st = *n->as_table();
    if (auto e = rd.check_keys(st, {"latency_ns"}, "[switch_model]")) return *e;
    auto v = rd.get_int(st, "latency_ns", "[switch_model]");
    if (!v) return v.err();
    if (*v) {
      t.switch_params.latency = std::chrono::nanoseconds(**v);
      if (auto f = detail::first_bad_field(t.switch_params)) return rd.err_at(*st.get("latency_ns"), "[switch_model]: " + f->message);
    }
  }
  std::vector<const toml::node*> node_src;  // per node: its table
  std::vector<const toml::node*> link_src;  // per link: its table

  auto hosts = rd.tables(root, "host");
  if (!hosts) return hosts.err();
  auto switches = rd.tables(root, "switch");
  if (!switches) return switches.err();
  auto links = rd.tables(root, "link");
  if (!links) return links.err();

  for (std::uint32_t i = 0; i < hosts->size(); ++i) {
    const toml::table& ht = *(*hosts)[i];
    std::string what = "[[host]] #" + std::to_string(i);
    if (auto e = rd.check_keys(ht, {"name", "rank", "hpus"}, what)) return *e;
    auto name = rd.get_string(ht, "name", what);
    if (!name) return name.err();
    if (!*name) return rd.err_at(ht, what + " has no 'name'");
    if (!valid_name(**name))
      return rd.err_at(*ht.get("name"), "invalid host name " + quote(**name) + ": names are 1 to 32 of A-Z a-z 0-9 _ -");
    what = "host " + quote(**name);
    node n;
    n.kind = node_kind::host;
    n.name = **name;
    n.rank = i;
    auto rank = rd.get_int(ht, "rank", what);
    if (!rank) return rank.err();
    if (*rank) {
      if (**rank < 0 || **rank > std::int64_t{max_rank})
        return rd.err_at(*ht.get("rank"), what + ": rank must be in [0, 65535], got " + std::to_string(**rank));
      n.rank = static_cast<std::uint32_t>(**rank);
    }
    auto hpus = rd.get_int(ht, "hpus", what);
    if (!hpus) return hpus.err();
    if (*hpus) {
      if (**hpus < 1 || **hpus > std::int64_t{max_hpus})
        return rd.err_at(*ht.get("hpus"), what + ": hpus must be in [1, 64], got " + std::to_string(**hpus));
      n.hpus = static_cast<std::uint32_t>(**hpus);
    }
    t.nodes.push_back(std::move(n));
    node_src.push_back(&ht);
  }
  for (std::uint32_t i = 0; i < switches->size(); ++i) {
    const toml::table& st = *(*switches)[i];
    const std::string what = "[[switch]] #" + std::to_string(i);
    if (auto e = rd.check_keys(st, {"name"}, what)) return *e;
    auto name = rd.get_string(st, "name", what);
    if (!name) return name.err();
    if (!*name) return rd.err_at(st, what + " has no 'name'");
    if (!valid_name(**name))
      return rd.err_at(*st.get("name"), "invalid switch name " + quote(**name) + ": names are 1 to 32 of A-Z a-z 0-9 _ -");
    node n;
    n.kind = node_kind::switch_;
    n.name = **name;
    t.nodes.push_back(std::move(n));
    node_src.push_back(&st);
  }

  std::vector<std::string_view> link_keys = {"a", "b"};
  link_keys.insert(link_keys.end(), model_keys.begin(), model_keys.end());
  for (std::uint32_t i = 0; i < links->size(); ++i) {
    const toml::table& lt = *(*links)[i];
    std::string what = "[[link]] #" + std::to_string(i);
    if (auto e = rd.check_keys(lt, link_keys, what)) return *e;
    link_spec s;
    std::uint32_t* ends[2] = {&s.a, &s.b};
    for (int e = 0; e < 2; ++e) {
      const char* key = e == 0 ? "a" : "b";
      auto name = rd.get_string(lt, key, what);
      if (!name) return name.err();
      if (!*name) return rd.err_at(lt, what + " has no '" + key + "' (the node names it joins)");
      auto idx = t.find(**name);
      if (!idx) return rd.err_at(*lt.get(key), what + ": " + key + " = " + quote(**name) + " is not a [[host]] or [[switch]] name");
      *ends[e] = *idx;
    }
    what = "link " + quote(t.nodes[s.a].name) + " - " + quote(t.nodes[s.b].name);
    if (s.a == s.b) return rd.err_at(lt, what + ": a link from a node to itself");
    s.model = defaults;
    bool seed_set = false;
    if (auto r = rd.read_model(lt, what, s.model, seed_set); !r) return r.err();
    if (!seed_set) s.model.seed = defaults.seed + i;
    s.a_port = static_cast<std::uint32_t>(t.nodes[s.a].ports.size());
    t.nodes[s.a].ports.push_back(i);
    s.b_port = static_cast<std::uint32_t>(t.nodes[s.b].ports.size());
    t.nodes[s.b].ports.push_back(i);
    t.links.push_back(s);
    link_src.push_back(&lt);
  }

  const where_fn where = [&](bool is_link, std::uint32_t i) -> std::string {
    const auto& v = is_link ? link_src : node_src;
    if (i >= v.size()) return src;
    return place(src, v[i]->source());
  };
  if (auto r = check_graph(t, where); !r) return r.err();
  return t;
}

result<topology> load_topology_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return fail(errc::not_found, "cannot read topology file " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return fail(errc::not_found, "cannot read topology file " + path + ": " + std::strerror(errno));
  return parse_topology(ss.str(), path);
}

result<void> validate(const topology& t) {
  if (auto r = validate(t.nic, "[nic]"); !r) return r;
  if (auto r = validate(t.switch_nic, "[switch_nic]"); !r) return r;
  if (auto r = validate(t.switch_params, "[switch_model]"); !r) return r;
  return check_graph(t, [](bool, std::uint32_t) { return std::string(); });
}

std::string to_toml(const topology& t) {
  std::string out = "# spin-emu topology (written by spin::emu::to_toml)\n";
  for (const auto& [name, m] : {std::pair<const char*, const nic_model*>{"nic", &t.nic}, {"switch_nic", &t.switch_nic}}) {
    out += std::string("\n[") + name + "]\n";
    for (const detail::model_key& k : detail::nic_model_keys()) {
      const double v = k.get(*m);
      out += std::string(k.key) + " = " + (k.type == detail::model_key::f64 ? fmt_double(v) : std::to_string(static_cast<std::uint64_t>(v))) + "\n";
    }
  }
  out += "\n[switch_model]\nlatency_ns = " + std::to_string(t.switch_params.latency.count()) + "\n";
  for (const node& n : t.nodes) {
    if (n.kind != node_kind::host) continue;
    out += "\n[[host]]\nname = \"" + n.name + "\"\nrank = " + std::to_string(n.rank) + "\nhpus = " +
           std::to_string(n.hpus) + "\n";
  }
  for (const node& n : t.nodes)
    if (n.kind == node_kind::switch_) out += "\n[[switch]]\nname = \"" + n.name + "\"\n";
  for (const link_spec& s : t.links) {
    const link_model& m = s.model;
    out += "\n[[link]]\na = \"" + t.nodes[s.a].name + "\"\nb = \"" + t.nodes[s.b].name + "\"\n";
    out += "rate_gbps = " + fmt_double(m.rate_gbps) + "\n";
    out += "latency_ns = " + std::to_string(m.latency.count()) + "\n";
    out += "gap_ns = " + fmt_double(m.gap_ns) + "\n";
    out += "loss = " + fmt_double(m.loss) + "\n";
    out += "duplicate = " + fmt_double(m.duplicate) + "\n";
    out += "reorder = " + fmt_double(m.reorder) + "\n";
    out += "reorder_delay_ns = " + std::to_string(m.reorder_delay.count()) + "\n";
    out += "seed = " + std::to_string(static_cast<std::int64_t>(m.seed)) + "\n";
    out += "queue_packets = " + std::to_string(m.queue_packets) + "\n";
    out += "on_full = \"" + std::string(overflow_policy_name(m.on_full)) + "\"\n";
  }
  return out;
}

// ---- routes --------------------------------------------------------------------------------

namespace {
// The egress port of node n on a shortest path, given the hop counts `dist` towards the
// destination: among the ports whose neighbour is one hop closer, the one with the lowest link
// index (so routes are deterministic); no_port when none is.
std::uint32_t best_port(const topology& t, const std::vector<std::uint32_t>& dist, std::uint32_t n) {
  std::uint32_t best = no_port, best_link = no_port;
  const auto& ports = t.nodes[n].ports;
  for (std::uint32_t p = 0; p < ports.size(); ++p) {
    const link_spec& s = t.links[ports[p]];
    const std::uint32_t m = s.a == n ? s.b : s.a;
    if (dist[m] + 1 == dist[n] && ports[p] < best_link) {
      best_link = ports[p];
      best = p;
    }
  }
  return best;
}
}  // namespace

std::vector<std::uint32_t> ports_towards(const topology& t, std::uint32_t dest) {
  std::vector<std::uint32_t> out(t.nodes.size(), no_port);
  if (dest >= t.nodes.size()) return out;
  const std::vector<std::uint32_t> dist = bfs(t, dest);
  for (std::uint32_t n = 0; n < t.nodes.size(); ++n)
    if (n != dest && dist[n] != unreached) out[n] = best_port(t, dist, n);
  return out;
}

routing_table routes(const topology& t) {
  routing_table rt;
  rt._nodes = static_cast<std::uint32_t>(t.nodes.size());
  std::vector<std::uint32_t> host_nodes;
  for (std::uint32_t i = 0; i < t.nodes.size(); ++i)
    if (t.nodes[i].kind == node_kind::host && t.nodes[i].rank <= max_rank) host_nodes.push_back(i);
  rt._hosts = static_cast<std::uint32_t>(host_nodes.size());
  std::uint32_t top_rank = 0;
  for (std::uint32_t h : host_nodes) top_rank = std::max(top_rank, t.nodes[h].rank);
  rt._slot_of_rank.assign(host_nodes.empty() ? 0 : top_rank + 1, routing_table::none);
  rt._port.assign(std::size_t{rt._nodes} * rt._hosts, routing_table::none);
  rt._dist.assign(std::size_t{rt._nodes} * rt._hosts, routing_table::none);
  for (std::uint32_t slot = 0; slot < host_nodes.size(); ++slot) {
    const std::uint32_t dest = host_nodes[slot];
    if (rt._slot_of_rank[t.nodes[dest].rank] != routing_table::none) continue;  // duplicate rank: first wins
    rt._slot_of_rank[t.nodes[dest].rank] = slot;
    const std::vector<std::uint32_t> dist = bfs(t, dest);
    for (std::uint32_t n = 0; n < t.nodes.size(); ++n) {
      if (n == dest || dist[n] == unreached) continue;
      rt._port[std::size_t{n} * rt._hosts + slot] = best_port(t, dist, n);
      rt._dist[std::size_t{n} * rt._hosts + slot] = dist[n];
    }
  }
  return rt;
}

std::optional<std::uint32_t> routing_table::next_port(std::uint32_t node, std::uint32_t dest_rank) const noexcept {
  if (node >= _nodes || dest_rank >= _slot_of_rank.size()) return std::nullopt;
  const std::uint32_t slot = _slot_of_rank[dest_rank];
  if (slot == none) return std::nullopt;
  const std::uint32_t p = _port[std::size_t{node} * _hosts + slot];
  if (p == none) return std::nullopt;
  return p;
}

std::optional<std::uint32_t> routing_table::distance(std::uint32_t node, std::uint32_t dest_rank) const noexcept {
  if (node >= _nodes || dest_rank >= _slot_of_rank.size()) return std::nullopt;
  const std::uint32_t slot = _slot_of_rank[dest_rank];
  if (slot == none) return std::nullopt;
  const std::uint32_t d = _dist[std::size_t{node} * _hosts + slot];
  if (d == none) return std::nullopt;
  return d;
}

// ---- generators ----------------------------------------------------------------------------

namespace {
void add_link(topology& t, std::uint32_t a, std::uint32_t b, link_model m) {
  const auto l = static_cast<std::uint32_t>(t.links.size());
  link_spec s;
  s.a = a;
  s.b = b;
  s.a_port = static_cast<std::uint32_t>(t.nodes[a].ports.size());
  t.nodes[a].ports.push_back(l);
  s.b_port = static_cast<std::uint32_t>(t.nodes[b].ports.size());
  t.nodes[b].ports.push_back(l);
  m.seed += l;
  s.model = m;
  t.links.push_back(s);
}

void add_hosts(topology& t, std::uint32_t n) {
  for (std::uint32_t i = 0; i < n; ++i) {
    node h;
    h.kind = node_kind::host;
    h.name = "h" + std::to_string(i);
    h.rank = i;
    t.nodes.push_back(std::move(h));
  }
}
}  // namespace

topology star(std::uint32_t n_hosts, const link_model& model) {
  topology t;
  add_hosts(t, n_hosts);
  node s;
  s.kind = node_kind::switch_;
  s.name = "s0";
  t.nodes.push_back(std::move(s));
  for (std::uint32_t i = 0; i < n_hosts; ++i) add_link(t, i, n_hosts, model);
  return t;
}

topology fat_tree(std::uint32_t leaves, std::uint32_t hosts_per_leaf, std::uint32_t spines, const link_model& model) {
  topology t;
  const std::uint32_t n_hosts = leaves * hosts_per_leaf;
  add_hosts(t, n_hosts);
  for (std::uint32_t l = 0; l < leaves; ++l) {
    node s;
    s.kind = node_kind::switch_;
    s.name = "l" + std::to_string(l);
    t.nodes.push_back(std::move(s));
  }
  for (std::uint32_t p = 0; p < spines; ++p) {
    node s;
    s.kind = node_kind::switch_;
    s.name = "s" + std::to_string(p);
    t.nodes.push_back(std::move(s));
  }
  for (std::uint32_t i = 0; i < n_hosts; ++i) add_link(t, i, n_hosts + i / hosts_per_leaf, model);
  for (std::uint32_t l = 0; l < leaves; ++l)
    for (std::uint32_t p = 0; p < spines; ++p) add_link(t, n_hosts + l, n_hosts + leaves + p, model);
  return t;
}

topology ring(std::uint32_t n_hosts, const link_model& model) {
  topology t;
  add_hosts(t, n_hosts);
  if (n_hosts >= 2)
    for (std::uint32_t i = 0; i < n_hosts; ++i) add_link(t, i, (i + 1) % n_hosts, model);
  return t;
}

topology pair(const link_model& model) {
  topology t;
  add_hosts(t, 2);
  add_link(t, 0, 1, model);
  return t;
}

}  // namespace spin::emu
