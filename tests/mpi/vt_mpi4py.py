# An mpi4py script under spin-emu --virtual-time (run by tests/mpi/vt_test.sh with libspin-mpi
# preloaded): mpi4py's lowercase methods of Python objects, which are point to point inside
# (send, recv through MPI_Mprobe and MPI_Mrecv, allreduce, bcast, gather), and its buffer
# methods (Send, Recv, Sendrecv, Isend, Irecv, Waitall), with exact results. Each rank prints
# its MPI_Wtime after each step ("vt: rank R: ..." in ns), which two runs must print alike.
import sys

from mpi4py import MPI
import numpy as np

c = MPI.COMM_WORLD
r, n = c.Get_rank(), c.Get_size()
times = []


def stamp():
    times.append(round(MPI.Wtime() * 1e9))


def check(ok, what):
    if not ok:
        sys.stdout.write(f"vt_mpi4py: rank {r}: FAILED: {what}\n")
        sys.stdout.flush()
        sys.exit(1)


right, left = (r + 1) % n, (r - 1) % n
c.send({"from": r, "list": list(range(r + 3))}, dest=right, tag=1)
got = c.recv(source=left, tag=1)
check(got == {"from": left, "list": list(range(left + 3))}, f"recv got {got}")
stamp()
status = MPI.Status()
got = c.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status) if r == 0 else c.send(("hi", r), dest=0, tag=10 + r)
if r == 0:
    check(got == ("hi", status.Get_source()) and status.Get_tag() == 10 + status.Get_source(), f"any source got {got}")
    rest = sorted(c.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)[1] for _ in range(n - 2))
    check(sorted(rest + [status.Get_source()]) == list(range(1, n)), f"senders {rest}")
stamp()
check(c.allreduce(r + 1) == n * (n + 1) // 2, "allreduce of objects")
check(c.bcast({"x": 5} if r == 0 else None, root=0) == {"x": 5}, "bcast of an object")
g = c.gather(r * r, root=1)
check(g == [i * i for i in range(n)] if r == 1 else g is None, f"gather gave {g}")
stamp()
a = np.arange(50000, dtype=np.float64) * (r + 1)
b = np.empty_like(a)
c.Sendrecv(a, dest=right, sendtag=2, recvbuf=b, source=left, recvtag=2)
check((b == np.arange(50000, dtype=np.float64) * (left + 1)).all(), "Sendrecv of 400 kB")
stamp()
reqs = [c.Isend(a[:1000], dest=right, tag=3), c.Irecv(b[:1000], source=left, tag=3)]
MPI.Request.Waitall(reqs)
check((b[:1000] == np.arange(1000, dtype=np.float64) * (left + 1)).all(), "Isend and Irecv")
stamp()
c.Barrier()
stamp()
# One write per line: print() writes the text and the newline apart, and mpirun may put another
# rank's output between them.
sys.stdout.write(f"vt: rank {r}: " + " ".join(str(t) for t in times) + "\n")
sys.stdout.flush()
