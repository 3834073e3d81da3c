// An MPI program under spin-emu --virtual-time (run by tests/mpi/vt_test.sh through
// run_mpi_test.sh): collectives that run on spin::coll (MPI_Allreduce, MPI_Bcast) and
// collectives that go to MPI (MPI_Barrier, MPI_Reduce, MPI_Allgatherv, MPI_Comm_split) on
// MPI_COMM_WORLD and on a split, with exact results. MPI_Wtime is the virtual clock: after a
// collective that went to MPI every member reads the same time (the members met in virtual
// time first), and each rank prints its times ("vt: rank R: ...", nanoseconds), which two runs
// must print alike. Point to point is refused in virtual time with MPI_ERR_OTHER.
//
//   mpi_vt [--wall-clock]     (--wall-clock: against a wall-clock spin-emu; skips the time checks)
//
// Exits 0 when every check held on this rank; prints what differed otherwise.
#include <spin/mpi/spin_mpi.h>

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int rank = 0, size = 0, failures = 0;
bool virtual_time = true;
std::vector<long long> times;  // MPI_Wtime after each step, ns

void check(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "mpi_vt: rank %d: FAILED: %s\n", rank, what.c_str());
}

long long now_ns() { return std::llround(MPI_Wtime() * 1e9); }

// Records the time after a step; with `same`, every member of `comm` must read the same time.
void stamp(MPI_Comm comm, const char* step, bool same) {
  const long long t = now_ns();
  times.push_back(t);
  if (!virtual_time || !same) return;
  int n = 0;
  MPI_Comm_size(comm, &n);
  std::vector<long long> all(static_cast<std::size_t>(n));
  // PMPI: a check of the time must not be a step of its own.
  PMPI_Allgather(&t, 1, MPI_LONG_LONG, all.data(), 1, MPI_LONG_LONG, comm);
  for (int i = 0; i < n; ++i)
    check(all[static_cast<std::size_t>(i)] == t, std::string(step) + ": member " + std::to_string(i) + " left at " +
                                                     std::to_string(all[static_cast<std::size_t>(i)]) + " ns, this rank at " +
                                                     std::to_string(t) + " ns");
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--wall-clock") == 0) virtual_time = false;
  if (virtual_time) check(MPI_Wtime() == 0.0, "MPI_Wtime is not 0 before anything ran (" + std::to_string(MPI_Wtime()) + " s)");

  MPI_Barrier(MPI_COMM_WORLD);
  stamp(MPI_COMM_WORLD, "MPI_Barrier", true);

  // On spin::coll: an allreduce of 3000 int32 (its first call sets the communicator up).
  const int n = 3000;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::int32_t> in(n), out(n, -1);
    for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(i)] = rank * 1000 + i + round;
    check(MPI_Allreduce(in.data(), out.data(), n, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS, "MPI_Allreduce failed");
    bool exact = true;
    for (int i = 0; i < n; ++i)
      exact = exact && out[static_cast<std::size_t>(i)] == 1000 * size * (size - 1) / 2 + size * (i + round);
    check(exact, "MPI_Allreduce round " + std::to_string(round) + " is not the exact sum");
    stamp(MPI_COMM_WORLD, "MPI_Allreduce", false);
  }

  // To MPI: MPI_Reduce (not interposed), with the root's result exact.
  {
    long long mine = rank + 1, sum = 0;
    MPI_Reduce(&mine, &sum, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) check(sum == static_cast<long long>(size) * (size + 1) / 2, "MPI_Reduce gave " + std::to_string(sum));
    stamp(MPI_COMM_WORLD, "MPI_Reduce", true);
  }

  // A split into even and odd ranks; an allreduce on spin and an allgatherv to MPI on it.
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  stamp(half, "MPI_Comm_split", true);
  {
    int hr = 0, hn = 0;
    MPI_Comm_rank(half, &hr);
    MPI_Comm_size(half, &hn);
    std::vector<double> in(1000), out(1000);
    for (int i = 0; i < 1000; ++i) in[static_cast<std::size_t>(i)] = rank + 0.5 * i;
    check(MPI_Allreduce(in.data(), out.data(), 1000, MPI_DOUBLE, MPI_MAX, half) == MPI_SUCCESS, "MPI_Allreduce on the split failed");
    const int top = (size - 1) - ((size - 1 - rank % 2) % 2);  // the highest world rank of this half
    bool exact = true;
    for (int i = 0; i < 1000; ++i) exact = exact && out[static_cast<std::size_t>(i)] == top + 0.5 * i;
    check(exact, "MPI_Allreduce (MAX) on the split is not exact");
    stamp(half, "MPI_Allreduce on the split", false);

    std::vector<int> counts(static_cast<std::size_t>(hn)), displs(static_cast<std::size_t>(hn));
    for (int i = 0; i < hn; ++i) {
      counts[static_cast<std::size_t>(i)] = i + 1;
      displs[static_cast<std::size_t>(i)] = i * (i + 1) / 2;
    }
    std::vector<int> mine(static_cast<std::size_t>(hr + 1), rank), all(static_cast<std::size_t>(hn * (hn + 1) / 2), -1);
    MPI_Allgatherv(mine.data(), hr + 1, MPI_INT, all.data(), counts.data(), displs.data(), MPI_INT, half);
    bool exact_v = true;
    for (int i = 0; i < hn; ++i)
      for (int k = 0; k <= i; ++k) exact_v = exact_v && all[static_cast<std::size_t>(displs[static_cast<std::size_t>(i)] + k)] == 2 * i + rank % 2;
    check(exact_v, "MPI_Allgatherv on the split is not exact");
    stamp(half, "MPI_Allgatherv", true);
  }
  MPI_Comm_free(&half);

  // On spin::coll: a broadcast from rank 1.
  {
    std::vector<std::int32_t> b(500, rank == 1 ? 7 : 0);
    if (rank == 1)
      for (int i = 0; i < 500; ++i) b[static_cast<std::size_t>(i)] = 7 * i;
    MPI_Bcast(b.data(), 500, MPI_INT32_T, 1, MPI_COMM_WORLD);
    bool exact = true;
    for (int i = 0; i < 500; ++i) exact = exact && b[static_cast<std::size_t>(i)] == 7 * i;
    check(exact, "MPI_Bcast is not exact");
    stamp(MPI_COMM_WORLD, "MPI_Bcast", false);
  }

  // Point to point: refused in virtual time (a rank could wait in MPI for one that needs the
  // simulation to move), reported through the communicator's error handler.
  if (virtual_time) {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    int v = rank;
    const int e = MPI_Send(&v, 1, MPI_INT, (rank + 1) % size, 0, c);
    check(e == MPI_ERR_OTHER, "MPI_Send in virtual time returned " + std::to_string(e) + ", not MPI_ERR_OTHER");
    MPI_Comm_free(&c);
  }

  spin_mpi_counters k{};
  spin_mpi_get_counters(&k);
  check(k.spin[SPIN_MPI_ALLREDUCE] == 3 && k.spin[SPIN_MPI_BCAST] == 1,
        "collectives on spin: " + std::to_string(k.spin[SPIN_MPI_ALLREDUCE]) + " allreduce, " + std::to_string(k.spin[SPIN_MPI_BCAST]) +
            " bcast (want 3 and 1)");
  if (virtual_time) {
    for (std::size_t i = 1; i < times.size(); ++i)
      check(times[i] >= times[i - 1], "the virtual clock went back at step " + std::to_string(i));
    check(times.back() > 0, "the virtual clock did not move");
    std::string line = "vt: rank " + std::to_string(rank) + ":";
    for (long long t : times) line += " " + std::to_string(t);
    std::printf("%s\n", line.c_str());
  }
  int all_failures = 0;
  // MPI_Reduce goes to MPI, after the members met: in virtual time a PMPI call here could wait
  // for a rank still inside its broadcast.
  MPI_Reduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) std::printf("mpi_vt: %s (%d failed checks over %d ranks)\n", all_failures == 0 ? "ok" : "FAILED", all_failures, size);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
