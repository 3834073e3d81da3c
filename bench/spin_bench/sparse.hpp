// spin-bench sparse: spin::coll's sparse allreduce (communicator::allreduce_sparse) on an
// emulated cluster, per rank count, algorithm, value type and density, beside the dense float32
// and bfloat16 allreduces of the same vectors in the same run: time per call, bytes each rank's
// NIC sent, the union's density, the error against the exact float64 sum, and an exactness check
// against the documented order (docs/collectives.md, "Sparse allreduce").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spin::bench {

struct sparse_options {
  std::vector<std::uint32_t> ranks{2, 4, 8, 16};
  std::vector<double> densities{0.001, 0.01, 0.1, 0.5};  ///< of each rank's vector (fraction of values given)
  std::vector<std::string> algorithms{"switch", "edge_ring"};
  std::vector<std::string> dtypes{"f32", "bf16", "mxfp8_e4m3"};  ///< value types: f32, bf16, f16, MX types
  std::uint64_t values = std::uint64_t{1} << 22;   ///< length of the vector
  std::uint32_t iters = 3;                         ///< timed calls per row (after one warm-up call)
  std::uint32_t lcores = 0;                        ///< lcores of the emulated cluster; 0: every CPU
  std::string out_dir = "spin-bench-out";
};

/// Prints the table and writes sparse.csv to out_dir. Exit status: 0 when every result was
/// exact, 1 when any #wrong is non-zero or a collective failed, 2 on bad options or a set-up
/// error.
int run_sparse(const sparse_options& o);

} // namespace spin::bench
