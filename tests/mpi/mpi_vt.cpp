// An MPI program under spin-emu --virtual-time (run by tests/mpi/vt_test.sh through
// run_mpi_test.sh): collectives that run on spin::coll (MPI_Allreduce, MPI_Bcast) and
// collectives that go to MPI (MPI_Barrier, MPI_Reduce, MPI_Allgatherv, MPI_Comm_split) on
// MPI_COMM_WORLD and on a split, with exact results. MPI_Wtime is the virtual clock: after a
// collective that went to MPI every member reads the same time (the members met in virtual
// time first), and each rank prints its times ("vt: rank R: ...", nanoseconds), which two runs
// must print alike. Point to point (MPI_Send, _Ssend, _Bsend, _Recv, _Sendrecv, _Isend, _Irecv,
// _Wait, _Waitall, _Test, _Probe, _Iprobe, _Request_get_status, _Request_free) with exact data, MPI's matching order, any source
// and any tag, and a 1 MiB message that takes the model's line-rate time.
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

  // Point to point, on a duplicate of MPI_COMM_WORLD (a communicator of its own context).
  {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    stamp(c, "MPI_Comm_dup", true);
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    // A ring: every rank sends to its right and receives from its left at once.
    {
      long long v = 100 + rank, got = -1;
      MPI_Status st;
      check(MPI_Sendrecv(&v, 1, MPI_LONG_LONG, right, 3, &got, 1, MPI_LONG_LONG, left, 3, c, &st) == MPI_SUCCESS, "MPI_Sendrecv failed");
      check(got == 100 + left && st.MPI_SOURCE == left && st.MPI_TAG == 3,
            "MPI_Sendrecv got " + std::to_string(got) + " from " + std::to_string(st.MPI_SOURCE) + " tag " + std::to_string(st.MPI_TAG));
      stamp(c, "MPI_Sendrecv ring", false);
    }
    // 1 MiB from rank 0 to rank 1 with MPI_Send: in virtual time it takes at least its bytes
    // over a 100 Gbit/s link (the run script's topology), and less than twice that.
    MPI_Barrier(c);
    stamp(c, "MPI_Barrier", true);
    {
      const int words = 262144;
      std::vector<std::int32_t> big(static_cast<std::size_t>(words));
      if (rank == 0) {
        for (int i = 0; i < words; ++i) big[static_cast<std::size_t>(i)] = i ^ 0x5a5a;
        check(MPI_Send(big.data(), words, MPI_INT32_T, 1, 11, c) == MPI_SUCCESS, "MPI_Send of 1 MiB failed");
      } else if (rank == 1) {
        const long long t0 = now_ns();
        MPI_Status st;
        check(MPI_Recv(big.data(), words, MPI_INT32_T, 0, 11, c, &st) == MPI_SUCCESS, "MPI_Recv of 1 MiB failed");
        int cnt = -1;
        MPI_Get_count(&st, MPI_INT32_T, &cnt);
        bool exact = cnt == words;
        for (int i = 0; i < words && exact; ++i) exact = big[static_cast<std::size_t>(i)] == (i ^ 0x5a5a);
        check(exact, "MPI_Recv of 1 MiB is not exact (count " + std::to_string(cnt) + ")");
        const long long took = now_ns() - t0, line = 4LL * words * 8 / 100;  // ns at 100 Gbit/s
        if (virtual_time) check(took >= line && took < 2 * line, "1 MiB took " + std::to_string(took) + " ns (line rate: " + std::to_string(line) + " ns)");
      }
      stamp(c, "1 MiB", false);
    }
    // Any source, any tag: rank 0 posts a receive per other rank, each of which sends its rank
    // as the tag; every sender is seen once, with its own value.
    {
      if (rank == 0) {
        std::vector<MPI_Request> req(static_cast<std::size_t>(size - 1));
        std::vector<long long> got(static_cast<std::size_t>(size - 1), -1);
        std::vector<MPI_Status> st(static_cast<std::size_t>(size - 1));
        for (int i = 0; i < size - 1; ++i)
          MPI_Irecv(&got[static_cast<std::size_t>(i)], 1, MPI_LONG_LONG, MPI_ANY_SOURCE, MPI_ANY_TAG, c, &req[static_cast<std::size_t>(i)]);
        check(MPI_Waitall(size - 1, req.data(), st.data()) == MPI_SUCCESS, "MPI_Waitall failed");
        std::vector<int> seen(static_cast<std::size_t>(size), 0);
        for (int i = 0; i < size - 1; ++i) {
          const MPI_Status& s = st[static_cast<std::size_t>(i)];
          check(s.MPI_SOURCE > 0 && s.MPI_SOURCE < size && s.MPI_TAG == s.MPI_SOURCE && got[static_cast<std::size_t>(i)] == 10LL * s.MPI_SOURCE,
                "any-source receive " + std::to_string(i) + ": source " + std::to_string(s.MPI_SOURCE) + " tag " + std::to_string(s.MPI_TAG) +
                    " value " + std::to_string(got[static_cast<std::size_t>(i)]));
          if (s.MPI_SOURCE > 0 && s.MPI_SOURCE < size) ++seen[static_cast<std::size_t>(s.MPI_SOURCE)];
        }
        for (int r = 1; r < size; ++r) check(seen[static_cast<std::size_t>(r)] == 1, "rank " + std::to_string(r) + " seen " + std::to_string(seen[static_cast<std::size_t>(r)]) + " times");
      } else {
        const long long v = 10LL * rank;
        MPI_Request r;
        check(MPI_Isend(&v, 1, MPI_LONG_LONG, 0, rank, c, &r) == MPI_SUCCESS, "MPI_Isend failed");
        check(MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS && r == MPI_REQUEST_NULL, "MPI_Wait of an MPI_Isend failed");
      }
      stamp(c, "any source", false);
      // Rank 0's any-tag receives would take the next stage's messages too if a sender came on
      // before they all matched.
      MPI_Barrier(c);
    }
    // Two receives of one source and tag, completed in the opposite order: the first posted
    // still gets the first sent (MPI's order). Then a synchronous send found by MPI_Probe, and
    // a message polled for with MPI_Iprobe and MPI_Test.
    if (rank == 0) {
      int a = -1, b = -1;
      MPI_Request ra, rb;
      MPI_Irecv(&a, 1, MPI_INT, 1, 7, c, &ra);
      MPI_Irecv(&b, 1, MPI_INT, 1, 7, c, &rb);
      MPI_Wait(&rb, MPI_STATUS_IGNORE);
      MPI_Wait(&ra, MPI_STATUS_IGNORE);
      check(a == 71 && b == 72, "two receives of one source and tag got " + std::to_string(a) + " and " + std::to_string(b) + " (want 71 and 72)");
      MPI_Status st;
      MPI_Probe(MPI_ANY_SOURCE, 9, c, &st);
      int cnt = -1;
      MPI_Get_count(&st, MPI_INT, &cnt);
      check(st.MPI_SOURCE == 1 && cnt == 3, "MPI_Probe: source " + std::to_string(st.MPI_SOURCE) + ", count " + std::to_string(cnt));
      std::vector<int> three(3, -1);
      MPI_Recv(three.data(), 3, MPI_INT, st.MPI_SOURCE, 9, c, MPI_STATUS_IGNORE);
      check(three == std::vector<int>({9, 99, 999}), "the synchronous message is not exact");
      int flag = 0, polls = 0;
      while (!flag && polls < 100000) {
        MPI_Iprobe(2 % size, 13, c, &flag, MPI_STATUS_IGNORE);
        ++polls;
      }
      check(flag == 1, "MPI_Iprobe never found rank 2's message");
      int x = -1;
      MPI_Request rx;
      MPI_Irecv(&x, 1, MPI_INT, 2 % size, 13, c, &rx);
      int done = 0;
      for (int i = 0; i < 100000 && !done; ++i) MPI_Test(&rx, &done, MPI_STATUS_IGNORE);
      check(done == 1 && x == 13, "MPI_Test: done " + std::to_string(done) + ", value " + std::to_string(x));
      if (size > 3) {  // MPI_Request_get_status polls without completing; the wait then frees
        int y = -1, got = 0;
        MPI_Request ry;
        MPI_Irecv(&y, 1, MPI_INT, 3, 14, c, &ry);
        MPI_Status gs;
        for (int i = 0; i < 100000 && !got; ++i) MPI_Request_get_status(ry, &got, &gs);
        check(got == 1 && y == 33 && gs.MPI_SOURCE == 3 && gs.MPI_TAG == 14 && ry != MPI_REQUEST_NULL,
              "MPI_Request_get_status: flag " + std::to_string(got) + ", value " + std::to_string(y));
        check(MPI_Wait(&ry, MPI_STATUS_IGNORE) == MPI_SUCCESS && ry == MPI_REQUEST_NULL && y == 33, "MPI_Wait after get_status");
      }
    } else if (rank == 1) {
      int a = 71, b = 72;
      MPI_Send(&a, 1, MPI_INT, 0, 7, c);
      MPI_Send(&b, 1, MPI_INT, 0, 7, c);
      const int three[3] = {9, 99, 999};
      check(MPI_Ssend(three, 3, MPI_INT, 0, 9, c) == MPI_SUCCESS, "MPI_Ssend failed");
    } else if (rank == 2) {
      int x = 13;
      MPI_Send(&x, 1, MPI_INT, 0, 13, c);
    } else if (rank == 3) {  // a send freed at once: its bytes still arrive
      int y = 33;
      MPI_Request ry;
      MPI_Isend(&y, 1, MPI_INT, 0, 14, c, &ry);
      check(MPI_Request_free(&ry) == MPI_SUCCESS && ry == MPI_REQUEST_NULL, "MPI_Request_free of an MPI_Isend");
    }
    stamp(c, "order, probe, test", false);
    // Many small messages in a row (the sender's buffered sends pile up in MPI): all arrive,
    // in order, whatever their tags.
    {
      const int k = 1000;
      if (rank == 0) {
        for (int i = 0; i < k; ++i) MPI_Send(&i, 1, MPI_INT, 1, i % 5, c);
      } else if (rank == 1) {
        bool ordered = true;
        for (int i = 0; i < k && ordered; ++i) {
          int v = -1;
          MPI_Status st;
          MPI_Recv(&v, 1, MPI_INT, 0, MPI_ANY_TAG, c, &st);
          ordered = v == i && st.MPI_TAG == i % 5;
        }
        check(ordered, "1000 messages in a row did not arrive in order");
      }
      stamp(c, "1000 messages", false);
    }
    // A halo exchange of 8000 bytes a side (above Open MPI's shared-memory eager limit: the
    // receiver's PMPI_Recv needs the sender's MPI to move), then an allreduce on spin, five
    // times. A rank whose neighbour's bytes wait in MPI must not hold the simulation while that
    // neighbour waits in spin::coll's allreduce (its buffered sends move in every wait).
    for (int it = 0; it < 5; ++it) {
      const int m = 1000;
      std::vector<double> mine(static_cast<std::size_t>(m)), from_left(static_cast<std::size_t>(m), -1), from_right(static_cast<std::size_t>(m), -1);
      for (int i = 0; i < m; ++i) mine[static_cast<std::size_t>(i)] = rank * 1e6 + it * 1e3 + i;
      MPI_Request rq[4];
      MPI_Irecv(from_left.data(), m, MPI_DOUBLE, left, 30, c, &rq[0]);
      MPI_Irecv(from_right.data(), m, MPI_DOUBLE, right, 31, c, &rq[1]);
      MPI_Isend(mine.data(), m, MPI_DOUBLE, right, 30, c, &rq[2]);
      MPI_Isend(mine.data(), m, MPI_DOUBLE, left, 31, c, &rq[3]);
      MPI_Waitall(4, rq, MPI_STATUSES_IGNORE);
      check(from_left[7] == left * 1e6 + it * 1e3 + 7 && from_right[999] == right * 1e6 + it * 1e3 + 999,
            "halo exchange " + std::to_string(it) + " is not exact");
      double one = 1, sum = 0;
      MPI_Allreduce(&one, &sum, 1, MPI_DOUBLE, MPI_SUM, c);
      check(sum == size, "the allreduce after halo exchange " + std::to_string(it) + " gave " + std::to_string(sum));
    }
    stamp(c, "halo exchanges", false);
    // The textbook synchronous exchange (Irecv, Ssend, Wait) on a Cartesian ring: the
    // synchronous send completes when the peer's receive matched it, in virtual time, before
    // the peer takes the bytes from MPI.
    {
      MPI_Comm ring;
      const int dims[1] = {size}, periods[1] = {1};
      check(MPI_Cart_create(c, 1, dims, periods, 0, &ring) == MPI_SUCCESS, "MPI_Cart_create failed");
      int src = -1, dst = -1;
      MPI_Cart_shift(ring, 0, 1, &src, &dst);
      const int peer = rank ^ 1;
      int got = -1, mine = 500 + rank;
      MPI_Request r;
      MPI_Irecv(&got, 1, MPI_INT, peer, 40, ring, &r);
      check(MPI_Ssend(&mine, 1, MPI_INT, peer, 40, ring) == MPI_SUCCESS, "MPI_Ssend in an exchange failed");
      MPI_Wait(&r, MPI_STATUS_IGNORE);
      check(got == 500 + peer, "the synchronous exchange got " + std::to_string(got));
      int from = -1;
      MPI_Sendrecv(&mine, 1, MPI_INT, dst, 41, &from, 1, MPI_INT, src, 41, ring, MPI_STATUS_IGNORE);
      check(from == 500 + src, "a shift on the Cartesian ring got " + std::to_string(from));
      MPI_Comm_free(&ring);
      stamp(c, "synchronous exchange", false);
    }
    // A message longer than the receive: MPI's own error (MPI_ERR_TRUNCATE), returned.
    {
      MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
      std::vector<int> big(100, 5), small(10, -1);
      if (rank == 0) {
        MPI_Send(big.data(), 100, MPI_INT, 1, 21, c);
        MPI_Send(big.data(), 100, MPI_INT, 1, 22, c);
      } else if (rank == 1) {
        int cls = -1;
        MPI_Error_class(MPI_Recv(small.data(), 10, MPI_INT, 0, 21, c, MPI_STATUS_IGNORE), &cls);
        check(cls == MPI_ERR_TRUNCATE, "a truncating MPI_Recv returned class " + std::to_string(cls));
        MPI_Request r;
        MPI_Irecv(small.data(), 10, MPI_INT, 0, 22, c, &r);
        MPI_Error_class(MPI_Wait(&r, MPI_STATUS_IGNORE), &cls);
        check(cls == MPI_ERR_TRUNCATE, "a truncating MPI_Irecv's MPI_Wait returned class " + std::to_string(cls));
      }
      MPI_Comm_set_errhandler(c, MPI_ERRORS_ARE_FATAL);
      stamp(c, "truncation", false);
    }
    MPI_Comm_free(&c);
  }

  spin_mpi_counters k{};
  spin_mpi_get_counters(&k);
  check(k.spin[SPIN_MPI_ALLREDUCE] == 8 && k.spin[SPIN_MPI_BCAST] == 1,
        "collectives on spin: " + std::to_string(k.spin[SPIN_MPI_ALLREDUCE]) + " allreduce, " + std::to_string(k.spin[SPIN_MPI_BCAST]) +
            " bcast (want 8 and 1)");
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
