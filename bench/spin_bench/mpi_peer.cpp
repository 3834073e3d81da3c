// spin-bench-mpi: the Open MPI peer of spin-bench coll. Run under mpirun (spin-bench coll does
// that, also with libspin-mpi preloaded, so that the same MPI_Allreduce calls run on spin::coll
// with one process per rank); every rank times MPI_Allreduce (float32 sum) out of place and in place (MPI_IN_PLACE)
// on the same data as spin-bench's other implementations (coll_data.hpp), with the same
// warm-up, iteration counts and barrier before each call; rank 0 writes the rows as JSON.
//
// Exit status: 0 when every result was exact; 1 when any element was wrong; 2 on bad options.
#include "coll_data.hpp"
#include "coll_table.hpp"

#include <mpi.h>
#include <spin/mpi/spin_mpi.h>

#include <dlfcn.h>

#include <cstring>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace spin::bench;

// One mode: warm-up calls, then `iters` timed calls, each after a barrier; the time of a call is
// the slowest rank's.
coll_mode measure(int rank, int size, std::vector<float>& in, std::vector<float>& out, std::uint64_t count, bool in_place,
                  std::uint32_t warmup, std::uint32_t iters) {
  coll_mode m;
  double total = 0;
  for (std::uint32_t k = 0; k < warmup + iters; ++k) {
    if (in_place || k == 0) coll_fill(static_cast<std::uint32_t>(rank), in_place ? out.data() : in.data(), count);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    const int rc = in_place ? MPI_Allreduce(MPI_IN_PLACE, out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)
                            : MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = MPI_Wtime() - t0;
    if (rc != MPI_SUCCESS) m.error = "MPI_Allreduce returned " + std::to_string(rc);
    double slowest = 0;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (k >= warmup) total += slowest;
  }
  unsigned long long wrong = coll_wrong(static_cast<std::uint32_t>(size), out.data(), count), all = 0;
  MPI_Reduce(&wrong, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  set_rates(m, count * 4, static_cast<std::uint32_t>(size), total / iters);
  m.wrong = all;
  return m;
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CLI::App app{"spin-bench-mpi: MPI_Allreduce timings for spin-bench coll (run under mpirun)"};
  std::uint64_t min_bytes = 8, max_bytes = std::uint64_t{256} << 20, factor = 4, budget = std::uint64_t{64} << 20;
  std::uint32_t iters = 20, warmup = 2;
  std::string json_path, label = "mpi";
  app.add_option("--min-bytes", min_bytes)->check(CLI::Range(std::uint64_t{4}, std::uint64_t{1} << 33));
  app.add_option("--max-bytes", max_bytes)->check(CLI::Range(std::uint64_t{4}, std::uint64_t{1} << 33));
  app.add_option("--factor", factor)->check(CLI::Range(std::uint64_t{2}, std::uint64_t{1024}));
  app.add_option("--iters", iters)->check(CLI::Range(1u, 100000u));
  app.add_option("--warmup", warmup)->check(CLI::Range(0u, 1000u));
  app.add_option("--budget-bytes", budget)->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app.add_option("--json", json_path, "rank 0 writes the rows here")->required();
  app.add_option("--label", label, "the rows' algorithm name (edge_ring_mpi when libspin-mpi is preloaded)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0) (void)app.exit(e);
    MPI_Finalize();
    return 2;
  }
  if (min_bytes > max_bytes || max_bytes / 4 > static_cast<std::uint64_t>(INT32_MAX)) {
    if (rank == 0) std::fprintf(stderr, "spin-bench-mpi: need --min-bytes <= --max-bytes < 8 GiB\n");
    MPI_Finalize();
    return 2;
  }
  const auto sizes = coll_sizes(min_bytes, max_bytes, factor);
  std::vector<float> in(max_bytes / 4), out(max_bytes / 4);
  nlohmann::json rows = nlohmann::json::array();
  bool exact = true;
  for (std::uint64_t bytes : sizes) {
    coll_row r;
    r.algorithm = label;
    r.ranks = static_cast<std::uint32_t>(size);
    r.bytes = bytes;
    r.count = bytes / 4;
    r.iters = coll_iters(bytes, budget, iters);
    const std::uint32_t w = bytes <= (std::uint64_t{8} << 20) ? warmup : std::min<std::uint32_t>(warmup, 1);
    r.oop = measure(rank, size, in, out, r.count, false, w, r.iters);
    r.ip = measure(rank, size, in, out, r.count, true, w, r.iters);
    exact &= r.oop.wrong == 0 && r.ip.wrong == 0 && r.oop.error.empty() && r.ip.error.empty();
    rows.push_back(to_json(r));
  }
  // Rows labelled as spin::coll runs must be what ran: with libspin-mpi preloaded, every
  // MPI_Allreduce went to spin, and for switch_mpi through the switch (its counters, found with
  // dlsym: this program does not link libspin-mpi).
  std::string mislabelled;
  if (label != "mpi") {
    using get_fn = void (*)(spin_mpi_counters*);
    auto get = reinterpret_cast<get_fn>(dlsym(RTLD_DEFAULT, "spin_mpi_get_counters"));
    if (get == nullptr) {
      mislabelled = "libspin-mpi is not loaded (LD_PRELOAD)";
    } else {
      spin_mpi_counters c{};
      get(&c);
      if (c.fallback[SPIN_MPI_ALLREDUCE] != 0)
        mislabelled = std::to_string(c.fallback[SPIN_MPI_ALLREDUCE]) + " MPI_Allreduce calls went to MPI, not spin";
      else if (label == "switch_mpi" && c.switch_calls != c.spin[SPIN_MPI_ALLREDUCE])
        mislabelled = "only " + std::to_string(c.switch_calls) + " of " + std::to_string(c.spin[SPIN_MPI_ALLREDUCE]) +
                      " MPI_Allreduce calls ran through the switch";
    }
    if (!mislabelled.empty()) std::fprintf(stderr, "spin-bench-mpi: rank %d: rows labelled %s: %s\n", rank, label.c_str(), mislabelled.c_str());
  }
  int bad = mislabelled.empty() ? 0 : 1, any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  int library_len = 0;
  char library[MPI_MAX_LIBRARY_VERSION_STRING];
  MPI_Get_library_version(library, &library_len);
  int rc = any_bad != 0 ? 3 : 0;
  if (rank == 0 && rc == 0) {
    std::ofstream f(json_path);
    f << nlohmann::json{{"library", std::string(library, strnlen(library, static_cast<std::size_t>(library_len)))}, {"rows", rows}}.dump(2) << '\n';
    if (!f) {
      std::fprintf(stderr, "spin-bench-mpi: cannot write %s\n", json_path.c_str());
      rc = 2;
    }
  }
  MPI_Finalize();
  return rc != 0 ? rc : exact ? 0 : 1;
}
