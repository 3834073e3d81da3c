// The interposer's behaviour, run by tests/mpi/run_mpi_test.sh under mpirun against a spin-emu
// cluster: every supported collective, datatype and operation (in place too, on
// MPI_COMM_WORLD, a split and a duplicate) gives exactly what Open MPI's own PMPI call gives;
// unsupported datatypes, operations and communicators go to MPI, each counted with its reason.
// Exits 0 when every check held on this rank; prints what differed otherwise.
#include <spin/mpi/spin_mpi.h>

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int rank = 0, size = 0, failures = 0;

void check(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "mpi_check: rank %d: FAILED: %s\n", rank, what.c_str());
}

struct type_case {
  MPI_Datatype t;
  int bytes;
  const char* name;
};
const type_case types[] = {{MPI_FLOAT, 4, "MPI_FLOAT"},     {MPI_DOUBLE, 8, "MPI_DOUBLE"},     {MPI_INT, 4, "MPI_INT"},
                           {MPI_INT64_T, 8, "MPI_INT64_T"}, {MPI_UINT32_T, 4, "MPI_UINT32_T"}, {MPI_UINT64_T, 8, "MPI_UINT64_T"},
                           {MPI_LONG, 8, "MPI_LONG"}};
struct op_case {
  MPI_Op o;
  const char* name;
};
const op_case ops[] = {{MPI_SUM, "SUM"}, {MPI_MIN, "MIN"}, {MPI_MAX, "MAX"}, {MPI_PROD, "PROD"}};

// Small integers (1..5) in the type's representation: sums and products of up to 8 ranks stay
// exact in every type, so any order of combination gives Open MPI's bytes.
std::vector<std::byte> values(const type_case& tc, int n, int seed) {
  std::vector<std::byte> v(static_cast<std::size_t>(n) * tc.bytes);
  for (int i = 0; i < n; ++i) {
    const int x = 1 + (i * 7 + seed * 3) % 5;
    std::byte* p = v.data() + static_cast<std::size_t>(i) * tc.bytes;
    if (tc.t == MPI_FLOAT) {
      const float f = static_cast<float>(x);
      std::memcpy(p, &f, 4);
    } else if (tc.t == MPI_DOUBLE) {
      const double d = x;
      std::memcpy(p, &d, 8);
    } else if (tc.bytes == 4) {
      const std::int32_t k = x;
      std::memcpy(p, &k, 4);
    } else {
      const std::int64_t k = x;
      std::memcpy(p, &k, 8);
    }
  }
  return v;
}

void run_suite(MPI_Comm comm, const char* cname, int n) {
  int r = 0, s = 0;
  MPI_Comm_rank(comm, &r);
  MPI_Comm_size(comm, &s);
  for (const auto& tc : types) {
    const std::string tn = std::string(cname) + " " + tc.name + " n=" + std::to_string(n);
    for (const auto& oc : ops) {
      auto in = values(tc, n, r + 1);
      std::vector<std::byte> want(in.size()), got(in.size());
      PMPI_Allreduce(in.data(), want.data(), n, tc.t, oc.o, comm);
      MPI_Allreduce(in.data(), got.data(), n, tc.t, oc.o, comm);
      check(got == want, "MPI_Allreduce " + tn + " " + oc.name);
      auto inplace = in;
      MPI_Allreduce(MPI_IN_PLACE, inplace.data(), n, tc.t, oc.o, comm);
      check(inplace == want, "MPI_Allreduce in place " + tn + " " + oc.name);
    }
    {  // Reduce_scatter_block: s blocks of n elements in, one block out.
      auto in = values(tc, n * s, r + 2);
      std::vector<std::byte> want(static_cast<std::size_t>(n) * tc.bytes), got(want.size());
      PMPI_Reduce_scatter_block(in.data(), want.data(), n, tc.t, MPI_SUM, comm);
      MPI_Reduce_scatter_block(in.data(), got.data(), n, tc.t, MPI_SUM, comm);
      check(got == want, "MPI_Reduce_scatter_block " + tn);
      auto inplace = in;
      MPI_Reduce_scatter_block(MPI_IN_PLACE, inplace.data(), n, tc.t, MPI_SUM, comm);
      check(std::memcmp(inplace.data(), want.data(), want.size()) == 0, "MPI_Reduce_scatter_block in place " + tn);
    }
    {  // Allgather.
      auto in = values(tc, n, r + 3);
      std::vector<std::byte> want(in.size() * s), got(want.size());
      PMPI_Allgather(in.data(), n, tc.t, want.data(), n, tc.t, comm);
      MPI_Allgather(in.data(), n, tc.t, got.data(), n, tc.t, comm);
      check(got == want, "MPI_Allgather " + tn);
      std::vector<std::byte> inplace(want.size());
      std::memcpy(inplace.data() + static_cast<std::size_t>(r) * in.size(), in.data(), in.size());
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, inplace.data(), n, tc.t, comm);
      check(inplace == want, "MPI_Allgather in place " + tn);
    }
    for (int root : {0, s - 1}) {  // Bcast from the first and the last rank.
      auto want = values(tc, n, 40 + root);
      auto got = r == root ? want : std::vector<std::byte>(want.size());
      MPI_Bcast(got.data(), n, tc.t, root, comm);
      check(got == want, "MPI_Bcast root " + std::to_string(root) + " " + tn);
    }
  }
}

// MPI_Bcast and MPI_Allgather with datatypes that differ between ranks but have one type
// signature (MPI-4.0 section 6.1): MPI_INT on some ranks, a contiguous type of MPI_INT, bytes, a
// strided vector on others. Every rank must take the same path and get Open MPI's bytes.
// Returns the number of calls made through the interposer (all of them spin's).
int mixed_types(MPI_Comm comm) {
  int r = 0, s = 0, calls = 0;
  MPI_Comm_rank(comm, &r);
  MPI_Comm_size(comm, &s);
  MPI_Datatype four_ints, strided;  // 4 MPI_INT in a row; 3 blocks of 4 MPI_INT, every other block
  MPI_Type_contiguous(4, MPI_INT, &four_ints);
  MPI_Type_commit(&four_ints);
  MPI_Type_vector(3, 4, 8, MPI_INT, &strided);
  MPI_Type_commit(&strided);
  // 12 ints as (count, type) on rank r; `sparse`: the strided type, whose buffer spans 20 ints.
  struct view {
    int count;
    MPI_Datatype t;
    bool sparse;
  };
  const auto view_of = [&](int k) {
    switch (k % 4) {
    case 0: return view{12, MPI_INT, false};
    case 1: return view{3, four_ints, false};
    case 2: return view{48, MPI_BYTE, false};
    default: return view{1, strided, true};
    }
  };
  const auto dense = [](const std::vector<int>& sparse) {  // the 12 ints a strided buffer holds
    std::vector<int> d;
    for (int b = 0; b < 3; ++b)
      for (int i = 0; i < 4; ++i) d.push_back(sparse[static_cast<std::size_t>(b * 8 + i)]);
    return d;
  };
  for (int root : {0, s - 1}) {  // Bcast: 48 bytes, a different datatype on each rank
    const view v = view_of(r);
    std::vector<int> want(12), got(v.sparse ? 20 : 12, -7);
    for (int i = 0; i < 12; ++i) want[static_cast<std::size_t>(i)] = 1000 * root + i;
    if (r == root) {
      if (v.sparse)
        for (int i = 0; i < 12; ++i) got[static_cast<std::size_t>((i / 4) * 8 + i % 4)] = want[static_cast<std::size_t>(i)];
      else
        got = want;
    }
    MPI_Bcast(got.data(), v.count, v.t, root, comm);
    ++calls;
    check((v.sparse ? dense(got) : got) == want, "MPI_Bcast of differing datatypes, root " + std::to_string(root));
    if (v.sparse) check(got[4] == -7 && got[15] == -7, "MPI_Bcast wrote into a strided type's gap");
  }
  {  // Bcast of 6 bytes: 3 MPI_SHORT on even ranks, 6 MPI_BYTE on odd ones (not a multiple of 4)
    std::vector<short> got(3, 0);
    const short want[3] = {-3, 12345, 7};
    if (r == 0) std::memcpy(got.data(), want, sizeof want);
    if (r % 2 == 0) MPI_Bcast(got.data(), 3, MPI_SHORT, 0, comm);
    else MPI_Bcast(got.data(), 6, MPI_BYTE, 0, comm);
    ++calls;
    check(std::memcmp(got.data(), want, sizeof want) == 0, "MPI_Bcast of 6 bytes as MPI_SHORT and MPI_BYTE");
  }
  {  // Allgather: each rank sends 12 ints as its own view and receives as the next rank's view
    const view sv = view_of(r), rv = view_of(r + 1);
    std::vector<int> send(sv.sparse ? 20 : 12, -1);
    for (int i = 0; i < 12; ++i)
      send[static_cast<std::size_t>(sv.sparse ? (i / 4) * 8 + i % 4 : i)] = 100 * r + i;
    const std::size_t extent_ints = rv.sparse ? 20 : 12;  // a strided element spans 20 ints; blocks follow at that stride
    std::vector<int> want(extent_ints * static_cast<std::size_t>(s), -9), got(want.size(), -9);
    PMPI_Allgather(send.data(), sv.count, sv.t, want.data(), rv.count, rv.t, comm);
    MPI_Allgather(send.data(), sv.count, sv.t, got.data(), rv.count, rv.t, comm);
    ++calls;
    check(got == want, "MPI_Allgather of differing datatypes");
    std::vector<int> inplace(want.size(), -9);  // in place, in the receive view
    const auto mine = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * extent_ints);
    std::copy(want.begin() + mine, want.begin() + mine + static_cast<std::ptrdiff_t>(extent_ints), inplace.begin() + mine);
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, inplace.data(), rv.count, rv.t, comm);
    ++calls;
    check(inplace == want, "MPI_Allgather in place of differing datatypes");
  }
  MPI_Type_free(&strided);
  MPI_Type_free(&four_ints);
  return calls;
}

void user_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  for (int i = 0; i < *len; ++i) static_cast<int*>(inout)[i] += static_cast<int*>(in)[i];
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // --unavailable: no spin-emu answers (SPIN_MPI_SOCKET names nothing). Every call must still
  // give MPI's answer, every member must fall back together, and the reason must be counted.
  if (argc > 1 && std::strcmp(argv[1], "--unavailable") == 0) {
    run_suite(MPI_COMM_WORLD, "world", 300);
    spin_mpi_counters c{};
    spin_mpi_get_counters(&c);
    const std::uint64_t calls = 7 * (8 + 2 + 2 + 2);
    std::uint64_t on_spin = 0, on_mpi = 0;
    for (int i = 0; i < SPIN_MPI_CALLS; ++i) {
      on_spin += c.spin[i];
      on_mpi += c.fallback[i];
    }
    check(on_spin == 0, "calls on spin without a spin-emu: " + std::to_string(on_spin));
    check(on_mpi == calls && c.reasons[SPIN_MPI_R_UNAVAILABLE] == calls,
          "fallbacks " + std::to_string(on_mpi) + ", unavailable " + std::to_string(c.reasons[SPIN_MPI_R_UNAVAILABLE]) +
              ", expected " + std::to_string(calls));
    check(c.communicators == 0, "spin communicators: " + std::to_string(c.communicators));
    int all = 0;
    PMPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) std::printf("mpi_check --unavailable: %d ranks, %s\n", size, all == 0 ? "every check held" : "CHECKS FAILED");
    MPI_Finalize();
    return all == 0 ? 0 : 1;
  }

  // Supported: 7 types x (8 allreduce + 2 reduce-scatter + 2 allgather + 2 bcast) per suite.
  run_suite(MPI_COMM_WORLD, "world", 1000);
  run_suite(MPI_COMM_WORLD, "world", 5000);  // several packets per rank and block
  MPI_Comm dup, half;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  run_suite(dup, "dup", 300);
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  run_suite(half, "split", 300);
  const int suites = 4;
  const int mixed = mixed_types(MPI_COMM_WORLD);  // 3 bcast, 2 allgather

  {  // A root that is not a rank: MPI's error (MPI_ERR_ROOT), from MPI itself.
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    int x = 5, cls = 0;
    const int rc = MPI_Bcast(&x, 1, MPI_INT, size, dup);
    MPI_Error_class(rc, &cls);
    check(cls == MPI_ERR_ROOT, "MPI_Bcast with root " + std::to_string(size) + " gave error class " + std::to_string(cls));
  }

  // Unsupported: each goes to MPI and gives MPI's answer.
  {
    std::vector<short> in(64, static_cast<short>(rank + 1)), out(64);
    MPI_Allreduce(in.data(), out.data(), 64, MPI_SHORT, MPI_SUM, MPI_COMM_WORLD);
    check(out[5] == size * (size + 1) / 2, "MPI_SHORT allreduce through MPI");
    std::vector<int> iv(64, rank + 1), ov(64);
    MPI_Allreduce(iv.data(), ov.data(), 64, MPI_INT, MPI_BAND, MPI_COMM_WORLD);
    int band = 1;
    for (int k = 2; k <= size; ++k) band &= k;
    check(ov[3] == band, "MPI_BAND allreduce through MPI");
    MPI_Op mine;
    MPI_Op_create(user_sum, 1, &mine);
    MPI_Allreduce(iv.data(), ov.data(), 64, MPI_INT, mine, MPI_COMM_WORLD);
    check(ov[7] == size * (size + 1) / 2, "user op allreduce through MPI");
    MPI_Op_free(&mine);
    MPI_Comm self_comm;
    MPI_Comm_split(MPI_COMM_WORLD, rank, 0, &self_comm);  // one rank each
    MPI_Allreduce(iv.data(), ov.data(), 64, MPI_INT, MPI_SUM, self_comm);
    check(ov[0] == rank + 1, "one-rank communicator through MPI");
    MPI_Comm_free(&self_comm);
    MPI_Comm inter;
    MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 == 0 ? 1 : 0, 99, &inter);
    int one = 1, sum = 0;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, inter);  // the remote group's sum
    check(sum == size / 2, "intercommunicator allreduce through MPI");
    MPI_Comm_free(&inter);
    MPI_Allreduce(iv.data(), ov.data(), 0, MPI_INT, MPI_SUM, MPI_COMM_WORLD);  // count 0
  }
  MPI_Comm_free(&half);
  MPI_Comm_free(&dup);

  spin_mpi_counters c{};
  spin_mpi_get_counters(&c);
  const std::uint64_t per_suite = 7;  // types
  check(c.spin[SPIN_MPI_ALLREDUCE] == suites * per_suite * 8, "allreduce calls on spin: " + std::to_string(c.spin[SPIN_MPI_ALLREDUCE]));
  check(c.spin[SPIN_MPI_REDUCE_SCATTER_BLOCK] == suites * per_suite * 2,
        "reduce_scatter_block calls on spin: " + std::to_string(c.spin[SPIN_MPI_REDUCE_SCATTER_BLOCK]));
  check(mixed == 5, "mixed-type calls: " + std::to_string(mixed));
  check(c.spin[SPIN_MPI_ALLGATHER] == suites * per_suite * 2 + 2, "allgather calls on spin: " + std::to_string(c.spin[SPIN_MPI_ALLGATHER]));
  check(c.spin[SPIN_MPI_BCAST] == suites * per_suite * 2 + 3, "bcast calls on spin: " + std::to_string(c.spin[SPIN_MPI_BCAST]));
  check(c.fallback[SPIN_MPI_BCAST] == 1, "bcast calls on MPI (the bad root): " + std::to_string(c.fallback[SPIN_MPI_BCAST]));
  check(c.fallback[SPIN_MPI_ALLREDUCE] == 6, "allreduce calls on MPI: " + std::to_string(c.fallback[SPIN_MPI_ALLREDUCE]));
  check(c.reasons[SPIN_MPI_R_DATATYPE] == 1, "datatype fallbacks: " + std::to_string(c.reasons[SPIN_MPI_R_DATATYPE]));
  check(c.reasons[SPIN_MPI_R_OP] == 2, "op fallbacks: " + std::to_string(c.reasons[SPIN_MPI_R_OP]));
  check(c.reasons[SPIN_MPI_R_COMMUNICATOR] == 2, "communicator fallbacks: " + std::to_string(c.reasons[SPIN_MPI_R_COMMUNICATOR]));
  check(c.reasons[SPIN_MPI_R_ARGUMENTS] == 2, "argument fallbacks: " + std::to_string(c.reasons[SPIN_MPI_R_ARGUMENTS]));
  check(c.reasons[SPIN_MPI_R_UNAVAILABLE] == 0, "unavailable: " + std::to_string(c.reasons[SPIN_MPI_R_UNAVAILABLE]));
  check(c.errors == 0, "errors: " + std::to_string(c.errors));
  check(c.communicators == 3, "spin communicators: " + std::to_string(c.communicators));
  // --switch (with SPIN_MPI_SWITCH_NODE): world and dup hold slots on the switch. The two
  // halves of the split agree on their group ids apart and take the same one; the switch
  // grants the id to the half that asks first and refuses the other (which runs on the edge
  // ring). Every allreduce, allgather and bcast of a group on the switch went through it
  // (reduce-scatter runs on the edge ring).
  const bool via_switch = argc > 1 && std::strcmp(argv[1], "--switch") == 0;
  const std::uint64_t per_switch_suite = per_suite * (8 + 2 + 2);
  if (via_switch) {
    check(c.switch_communicators == 2 || c.switch_communicators == 3,
          "communicators on the switch: " + std::to_string(c.switch_communicators));
    const std::uint64_t on_switch = c.switch_communicators == 3 ? 4 : 3;  // suites: world twice, dup, maybe split
    check(c.switch_calls == on_switch * per_switch_suite + mixed, "calls through the switch: " + std::to_string(c.switch_calls));
    int mine = static_cast<int>(c.switch_communicators), total = 0;
    PMPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    check(total == 2 * size + size / 2, "communicators on the switch over all ranks: " + std::to_string(total));
  } else {
    check(c.switch_communicators == 0, "communicators on the switch: " + std::to_string(c.switch_communicators));
    check(c.switch_calls == 0, "calls through the switch: " + std::to_string(c.switch_calls));
  }

  int all = 0;
  PMPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("mpi_check%s: %d ranks, %s\n", via_switch ? " --switch" : "", size, all == 0 ? "every check held" : "CHECKS FAILED");
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}
