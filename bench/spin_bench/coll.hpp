// spin-bench coll: nccl-tests-style allreduce tables for spin::coll's algorithms on an emulated
// cluster, beside Gloo's ring allreduce and Open MPI's MPI_Allreduce on the same data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spin::bench {

struct coll_options {
  std::uint32_t ranks = 4;
  std::uint64_t min_bytes = 8;
  std::uint64_t max_bytes = std::uint64_t{256} << 20;
  std::uint64_t factor = 4;                         ///< nccl-tests' -f
  /// switch, edge_ring, host_ring (spin::coll on the emulated cluster in this process), gloo
  /// (Gloo's ring allreduce over TCP on loopback), mpi (Open MPI's MPI_Allreduce under mpirun),
  /// edge_ring_mpi and host_ring_mpi (spin::coll with one process per rank: spin-bench-mpi under
  /// mpirun with libspin-mpi preloaded, against a spin-emu cluster process).
  std::vector<std::string> algorithms{"switch", "edge_ring", "host_ring", "gloo", "mpi"};
  /// Datatypes of spin::coll's algorithms (coll::name: f32, bf16, mxfp8_e4m3, bfp16_16, ...).
  /// Sizes are those of the float32 tensor: every datatype carries the same values, in its own
  /// bytes. Gloo and Open MPI run float32.
  std::vector<std::string> dtypes{"f32"};
  std::uint32_t max_iters = 20;                     ///< nccl-tests' -n
  std::uint32_t warmup_iters = 2;                   ///< nccl-tests' -w (for messages up to 8 MiB; 1 above)
  std::uint64_t budget_bytes = std::uint64_t{64} << 20;  ///< data per measurement (sets iterations)
  std::uint32_t packet_bytes = 4096;                ///< spin::coll payload per packet (coll::options' default)
  std::uint32_t lcores = 0;                         ///< lcores of the emulated cluster; 0: every CPU
  std::uint32_t window_packets = 32;                ///< packets each rank's NIC keeps in flight (coll::options' default)
  std::uint32_t switch_slots = 64;                  ///< aggregator slots the group takes on the switch (coll::options' default)
  /// spin::coll's in-process algorithms with a random job secret (coll::options::job_secret):
  /// every data frame carries a SipHash-2-4 tag that its receiver checks (the *_mpi modes
  /// always have one, as every MPI job does).
  bool authenticate = false;
  /// One-way propagation delay of every emulated link (emu::link_model::latency), ns; 0: none.
  /// A host's packet to another host crosses two links (through the switch).
  std::uint64_t link_latency_ns = 0;
  /// spin::coll's repair timer: shortest and longest interval (options::repair_min_interval and
  /// repair_max_interval). The interval follows the measured round trips in between.
  std::uint32_t repair_min_us = 1000;
  std::uint32_t repair_max_ms = 1000;
  std::string out_dir = "spin-bench-out";
  std::string mpi_peer;                             ///< the spin-bench-mpi binary
  std::string mpirun = "mpirun";
  std::string spin_mpi_lib;                         ///< libspin-mpi.so (for edge_ring_mpi, host_ring_mpi)
  std::string spin_emu;                             ///< the spin-emu binary (ditto)
  bool plots = true;
  /// After the wall-clock tables, the same allreduce of spin::coll's in-process algorithms
  /// (float32, the same ranks, sizes, packet size, window and slots) in virtual time
  /// (spin-bench vt allreduce: PsPIN's NIC model, 400 Gbit/s links of link_latency_ns).
  bool virtual_time = false;
};

/// Runs the tables, prints them, writes coll.csv, coll.json and coll.png to out_dir. Exit
/// status: 0 when every result was exact, 1 when any #wrong is non-zero or a collective failed,
/// 2 on bad options or a set-up error. A peer that is not available here (Gloo not built in,
/// mpirun missing) is reported as not run and does not change the status.
int run_coll(const coll_options& o);

} // namespace spin::bench
