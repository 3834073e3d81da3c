#!/usr/bin/env python3
"""mpi4py through libspin-mpi: an ordinary mpi4py script, unchanged, run twice under mpirun
against a spin-emu cluster: once with LD_PRELOAD=libspin-mpi.so and once without. Every
result array of the two runs must be byte for byte the same, and the preloaded run must have
sent its collectives through spin (the interposer's counters at MPI_Finalize say so).

  mpi4py_test.py RUN_MPI_TEST SPIN_EMU LIBSPIN_MPI SANITIZE   (the driver, what meson runs)
  mpi4py_test.py --rank OUT_PREFIX                           (what each MPI rank runs)

Values are small integers, so sums and products are exact in every datatype and any order of
combination gives the same bytes. Skips (exit 77, meson's 'skipped') in sanitizer builds: an
interpreter built without the sanitizer runtime cannot load an instrumented library; the same
collectives run there in mpi_check, which links the library.
"""
import os
import re
import subprocess
import sys
import tempfile


def rank_main(prefix):
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    out = {}
    n = 3000
    for dt in (np.float32, np.float64, np.int32, np.int64):
        base = (np.arange(n) * 7 + rank * 3) % 5 + 1
        a = base.astype(dt)
        for name, op in (("sum", MPI.SUM), ("min", MPI.MIN), ("max", MPI.MAX), ("prod", MPI.PROD)):
            r = np.empty_like(a)
            comm.Allreduce(a, r, op=op)
            out[f"allreduce_{dt.__name__}_{name}"] = r
            b = a.copy()
            comm.Allreduce(MPI.IN_PLACE, b, op=op)
            out[f"allreduce_inplace_{dt.__name__}_{name}"] = b
        g = np.empty(n * size, dtype=dt)
        comm.Allgather(a, g)
        out[f"allgather_{dt.__name__}"] = g
        big = np.tile(a, size)
        rs = np.empty(n, dtype=dt)
        comm.Reduce_scatter_block(big, rs, op=MPI.SUM)
        out[f"reduce_scatter_{dt.__name__}"] = rs
        for root in (0, size - 1):
            c = a.copy() if rank == root else np.zeros(n, dtype=dt)
            comm.Bcast(c, root=root)
            out[f"bcast_{dt.__name__}_{root}"] = c
    # Python objects (pickled: MPI_BYTE under the hood) and a sub-communicator.
    out["allreduce_object"] = np.array([comm.allreduce(rank + 1)])
    sub = comm.Split(rank % 2, rank)
    s = np.empty(16, dtype=np.float64)
    sub.Allreduce(np.full(16, rank + 1.0), s, op=MPI.SUM)
    out["split_allreduce"] = s
    sub.Free()
    np.savez(f"{prefix}.rank{rank}.npz", **out)


def driver(run_mpi_test, spin_emu, lib, sanitize):
    if sanitize not in ("", "none"):
        print(f"mpi4py_test: skipped in the {sanitize} build: /usr/bin/python3 cannot load a library built with "
              "-fsanitize (its runtime must come first); mpi_check runs the same collectives in this build")
        return 77
    py = "/usr/bin/python3"
    with tempfile.TemporaryDirectory(prefix="spin_mpi4py.") as d:
        logs = {}
        for tag, preload in (("mpi", ""), ("spin", lib)):
            cmd = ["bash", run_mpi_test, spin_emu, "4", preload, "--", py, os.path.abspath(__file__), "--rank",
                   os.path.join(d, tag)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            logs[tag] = p.stdout + p.stderr
            if p.returncode != 0:
                print(f"mpi4py_test: the {tag} run failed ({p.returncode}):\n{logs[tag]}")
                return 1
        import numpy as np

        problems = []
        for r in range(4):
            a = np.load(os.path.join(d, f"mpi.rank{r}.npz"))
            b = np.load(os.path.join(d, f"spin.rank{r}.npz"))
            if sorted(a.files) != sorted(b.files):
                problems.append(f"rank {r}: different result sets")
                continue
            for k in a.files:
                if a[k].dtype != b[k].dtype or a[k].tobytes() != b[k].tobytes():
                    problems.append(f"rank {r}: {k} differs from Open MPI's")
        # The preloaded run's counters: what ran on spin, on every rank.
        lines = [l for l in logs["spin"].splitlines() if l.startswith("spin-mpi: rank")]
        counts = {}
        for l in lines:
            m = re.match(r"spin-mpi: rank (\d+): spin MPI_Allreduce=(\d+) MPI_Reduce_scatter_block=(\d+) "
                         r"MPI_Allgather=(\d+) MPI_Bcast=(\d+);", l)
            if m:
                counts[int(m.group(1))] = tuple(int(x) for x in m.group(2, 3, 4, 5))
        # 4 dtypes x (8 allreduce, 1 allgather, 1 reduce-scatter, 2 bcast), plus the split's
        # allreduce; mpi4py's pickled allreduce adds calls of its own (a bcast of int64 on spin).
        want = (4 * 8 + 1, 4, 4, 8)
        for r in range(4):
            if counts.get(r) is None:
                problems.append(f"rank {r}: no interposer summary in the preloaded run's output")
            elif counts[r][0] < want[0] or counts[r][1:3] != want[1:3] or counts[r][3] < want[3]:
                problems.append(f"rank {r}: spin ran {counts[r]}, expected at least {want}")
        if any("spin-mpi" in l for l in logs["mpi"].splitlines()):
            problems.append("the run without LD_PRELOAD printed interposer lines")
        if problems:
            print("mpi4py_test: " + "\n  ".join(problems) + "\n--- preloaded run ---\n" + logs["spin"])
            return 1
        print(f"mpi4py_test: 4 ranks, {len(a.files)} results per rank equal Open MPI's byte for byte; "
              f"on spin per rank (allreduce, reduce_scatter_block, allgather, bcast): {counts[0]}")
        return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2])
    elif len(sys.argv) == 5:
        sys.exit(driver(*sys.argv[1:]))
    else:
        sys.exit(__doc__)
