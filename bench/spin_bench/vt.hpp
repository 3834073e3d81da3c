// spin-bench vt: benchmarks in virtual time (spin::sim, docs/virtual-time.md). Every figure is
// modelled time of the topology's NIC and network models, not this machine's wall clock, and
// the output says so; the same options give the same figures on any machine under any load.
//   pspin     the standard ping-pong handler on PsPIN's default NIC beside PsPIN's published
//             figures (ISCA 2021): handler time, feedback throughput, latency idle and loaded
//   allreduce spin::coll's allreduce (switch, edge_ring, host_ring) per host count and size
//   allgather, broadcast: the same for spin::coll's allgather and broadcast (switch, edge_ring)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spin::bench {

struct vt_options {
  std::string what = "pspin";       ///< pspin, allreduce, allgather, broadcast
  std::string topology_file;        ///< models (and, for allreduce, the hosts) from a topology file; empty: defaults
  std::vector<std::uint32_t> hosts{4};
  std::vector<std::uint64_t> sizes{std::uint64_t{1} << 20};  ///< bytes (float32 elements)
  std::vector<std::string> algorithms{"switch", "edge_ring", "host_ring"};
  std::uint32_t hosts_per_leaf = 0; ///< collectives: 0, a star; else a two-level fat tree with this many hosts per leaf
  std::uint32_t spines = 1;         ///< collectives: spine switches of the fat tree
  double link_gbps = 400;           ///< links of the generated topologies
  double link_latency_ns = 500;
  std::uint32_t iters = 2;          ///< timed calls (after one warm-up)
  std::uint32_t packets = 4096;     ///< pspin: packets per stream
  std::uint64_t staging_bytes = 0;  ///< allreduce: coll::options::staging_bytes per rank (0: 4 GiB / (2 x hosts), 1 .. 32 MiB)
  std::uint64_t warmup_bytes = 0;   ///< allreduce: size of the warm-up call (0: the timed size)
  std::uint32_t window = 32;        ///< allreduce: packets each rank keeps in flight (coll::options::window_packets)
  std::uint32_t switch_slots = 0;   ///< collectives: the group's aggregator slots (coll::options::switch_slots; 0: auto, slots_of in vt.cpp)
  std::uint32_t packet_bytes = 0;   ///< allreduce: payload bytes per packet (coll::options::packet_bytes; 0: 4096)
  std::string out_dir = "spin-bench-out";
  bool json = false;                ///< also print the statistics as JSON
  bool plots = true;                ///< allreduce: run gnuplot (vt_allreduce.png)
};

/// Exit status: 0 when every result was exact (and, for pspin, every figure within 2x of
/// PsPIN's), 1 otherwise, 2 on bad options or a set-up error.
int run_vt(const vt_options& o);

} // namespace spin::bench
