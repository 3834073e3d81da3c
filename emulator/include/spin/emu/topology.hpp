// The topology of spin-emu's emulated cluster: hosts (one emulated NIC each), switches and the
// links between them, read from a TOML file, plus shortest-path routes and small generators.
//
// File format (TOML 1.0; every key is checked, an unknown key is an error):
//
//   [defaults]            # optional: link defaults, the keys of [[link]] except a and b
//   rate_gbps = 100       # Gbit/s, 0 = unlimited (integer or float)        default 0
//   latency_ns = 1000     # propagation delay, 0 .. 1e9                      default 0
//   seed = 1              # global seed: link i gets seed + i unless it sets its own
//
//   [[host]]              # one per emulated host NIC
//   name = "h0"           # unique among all nodes, [A-Za-z0-9_-]{1,32}     required
//   rank = 0              # address in the network, unique, 0 .. 65535      default: index among hosts
//   hpus = 1              # handler processing units, 1 .. 64               default 1
//
//   [[switch]]            # a switch node (forwards by destination rank)
//   name = "s0"           # unique among all nodes                            required
//
//   [[link]]              # a full-duplex link; both directions use the same model
//   a = "h0"              # node names                                        required
//   b = "s0"
//   rate_gbps = 100       # every key below: default from [defaults], else link_model's default
//   latency_ns = 500
//   gap_ns = 0            # LogGP g: shortest time between two packets' starts, ns (float) default 0
//   loss = 0.0            # probabilities in [0, 1)
//   duplicate = 0.0
//   reorder = 0.0
//   reorder_delay_ns = 0  # 0 = automatic (link_model::reorder_delay)
//   seed = 7              # any 64-bit integer (negative values are taken modulo 2^64)
//   queue_packets = 4096  # 1 .. 1048576
//   on_full = "drop"      # "drop" or "backpressure" (overflow_policy)
//
//   [nic]                 # optional, virtual time only (docs/virtual-time.md): every host's
//   clusters = 4          #   NIC model, emu::nic_model; each key defaults to PsPIN's value
//   hpus_per_cluster = 8  #   (keys: clusters, hpus_per_cluster, hpu_ghz, cpi, invocation_cycles,
//   ...                   #   command_cycles, scheduler_latency_ns, l1_copy_gbps,
//                         #   packet_buffer_bytes, tx_latency_ns, pcie_latency_ns, pcie_gbps,
//                         #   memory_bytes)
//   [switch_nic]          # optional: the switches' handler units, the same keys; a key not given
//                         #   takes [nic]'s value (memory_bytes: at least 1 GiB)
//   [switch_model]        # optional: latency_ns = 300, a switch's forwarding latency
//
// Node order: all hosts in file order, then all switches in file order. Ports: each node numbers
// its links 0, 1, ... in the order the [[link]] tables appear. Every pair of hosts must be
// connected; parallel links between two nodes are allowed; a link from a node to itself is not.
#pragma once

#include <spin/emu/link.hpp>
#include <spin/emu/nic_model.hpp>
#include <spin/result.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spin::emu {

/// Kind of a topology node.
enum class node_kind : std::uint8_t {
  host,     ///< an emulated host NIC (runs handlers, has a rank)
  switch_,  ///< a switch (forwards packets by destination rank)
};

/// Largest host rank (ranks are 16 bits in the emulated addresses, wire::rank_endpoint).
inline constexpr std::uint32_t max_rank = 65535;
/// Largest number of HPUs per host.
inline constexpr std::uint32_t max_hpus = 64;

/// A host or switch.
struct node {
  node_kind kind = node_kind::host;
  std::string name;
  std::uint32_t rank = 0;  ///< hosts: the rank; switches: 0 (unused)
  std::uint32_t hpus = 1;  ///< hosts: HPUs; switches: 1 (unused)
  /// The node's ports: ports[p] is the index in topology::links of the link on port p, in link
  /// order.
  std::vector<std::uint32_t> ports;
  bool operator==(const node&) const = default;
};

/// A full-duplex link between port `a_port` of node `a` and port `b_port` of node `b` (indices
/// into topology::nodes and node::ports). Both directions run `model` (each direction of the
/// cluster may derive its own seed from it).
struct link_spec {
  std::uint32_t a = 0;
  std::uint32_t b = 0;
  std::uint32_t a_port = 0;
  std::uint32_t b_port = 0;
  link_model model;
  bool operator==(const link_spec&) const = default;
};

/// A cluster: nodes (hosts first) and links, and the models virtual time runs them with.
struct topology {
  std::vector<node> nodes;
  std::vector<link_spec> links;
  nic_model nic;         ///< [nic]: every host's NIC in virtual time
  /// [switch_nic]: every switch's handler unit in virtual time; a key the file does not give takes
  /// [nic]'s value, except memory_bytes and packet_buffer_bytes, at least switch_memory_bytes and
  /// switch_packet_buffer_bytes (switch_nic_of).
  nic_model switch_nic = switch_nic_of(nic_model{});
  switch_model switch_params;  ///< [switch_model]: what a switch adds to a frame it forwards

  /// Index of the node called `name`, or nullopt.
  std::optional<std::uint32_t> find(std::string_view name) const;
  /// Index of the host with rank `rank`, or nullopt.
  std::optional<std::uint32_t> host_of_rank(std::uint32_t rank) const;
  /// Number of hosts.
  std::size_t host_count() const;
  bool operator==(const topology&) const = default;
};

/// Parses a topology file's text. `source_name` names it in messages ("cluster.toml"). Control
/// path. Errors (invalid_argument; the message starts with "source:line:col: " where the TOML
/// library knows the place, and quotes the offending key or name): TOML syntax error (the TOML
/// library's description), unknown key (with the keys allowed there), wrong type, missing
/// name / a / b, invalid name, duplicate node name, duplicate rank, link to an unknown node,
/// link from a node to itself, value out of range (hpus, rank, and every link_model field as
/// validate(link_model) checks it), no hosts, two hosts with no path between them.
result<topology> parse_topology(std::string_view toml_text, std::string_view source_name);

/// Reads and parses the file at `path` (its path names it in messages). Errors: not_found (the
/// file cannot be read; the message has strerror), and those of parse_topology.
result<topology> load_topology_file(const std::string& path);

/// Checks a topology built in code (as parse_topology checks a file): names, unique names and
/// ranks, ranks and hpus in range, link endpoints and ports consistent with node::ports, no
/// self-links, valid link models and NIC and switch models, at least one host, all hosts
/// connected. Errors:
/// invalid_argument with a message naming the node or link.
result<void> validate(const topology& t);

/// The topology as a TOML file that parse_topology reads back equal (every key written out, no
/// [defaults]). `t` should be valid.
std::string to_toml(const topology& t);

/// Shortest-path routes of a topology: for every node and every host rank, the port a packet
/// for that rank leaves on. Read-only after construction: any thread may call next_port.
class routing_table {
public:
  routing_table() = default;
  /// The egress port (index into node::ports) of node `node` towards the host of rank
  /// `dest_rank`, or nullopt when there is none: unknown node or rank, or `dest_rank` is the
  /// node's own rank. Data path: noexcept, no allocation.
  std::optional<std::uint32_t> next_port(std::uint32_t node, std::uint32_t dest_rank) const noexcept;
  /// Hop count from `node` to the host of `dest_rank`, or nullopt (same conditions).
  std::optional<std::uint32_t> distance(std::uint32_t node, std::uint32_t dest_rank) const noexcept;

private:
  friend routing_table routes(const topology& t);
  static constexpr std::uint32_t none = 0xffffffffu;
  std::uint32_t _nodes = 0;
  std::uint32_t _hosts = 0;
  std::vector<std::uint32_t> _slot_of_rank;  // rank -> host slot, none when no host has it
  std::vector<std::uint32_t> _port;          // [node * _hosts + slot]
  std::vector<std::uint32_t> _dist;          // [node * _hosts + slot]
};

/// Computes the routes of `t` (which should be valid): breadth-first search from every host;
/// among the ports on a shortest path a node takes the one whose link has the lowest index, so
/// routes are deterministic. Control path.
routing_table routes(const topology& t);

/// No egress port (ports_towards).
inline constexpr std::uint32_t no_port = 0xffffffffu;

/// The egress port of every node towards node `dest` (a switch, or any node) along a shortest
/// path, with routes()'s tie-break; no_port for `dest` itself and for nodes that cannot reach
/// it. Control path.
std::vector<std::uint32_t> ports_towards(const topology& t, std::uint32_t dest);

/// A star: hosts "h0".."h<n-1>" (ranks 0..n-1) each linked to switch "s0" (link i joins host
/// i and the switch; the switch's port i leads to host i). Link i's seed is model.seed + i.
/// n_hosts must be 1 .. 65536 for a valid topology.
topology star(std::uint32_t n_hosts, const link_model& model);

/// A two-level fat tree (leaf-spine): `leaves` leaf switches "l0".."l<L-1>", each linked to
/// `hosts_per_leaf` hosts (host i, rank i, to leaf i / hosts_per_leaf; links 0 .. n-1), and
/// `spines` spine switches "s0".."s<S-1>", each linked to every leaf (links n + l x S + s).
/// Switch ranks count down from 65535: leaves first, then spines. Link i's seed is
/// model.seed + i. Valid for leaves >= 1, hosts_per_leaf >= 1, spines >= 1 (a single leaf's
/// hosts also reach each other through it).
topology fat_tree(std::uint32_t leaves, std::uint32_t hosts_per_leaf, std::uint32_t spines, const link_model& model);

/// A ring of hosts "h0".."h<n-1>" (ranks 0..n-1) without switches: link i joins host i and
/// host (i+1) mod n, so host 0's port 0 leads to host 1 and its port 1 to host n-1, and host
/// i > 0's port 0 leads to host i-1 and its port 1 to host i+1. Link i's seed is
/// model.seed + i. n_hosts must be 3 .. 65536 (two hosts make a pair()).
topology ring(std::uint32_t n_hosts, const link_model& model);

/// Two hosts "h0" and "h1" (ranks 0 and 1) joined by one link with `model`.
topology pair(const link_model& model);

}  // namespace spin::emu
