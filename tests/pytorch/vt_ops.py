#!/usr/bin/env python3
"""The "spin" backend in virtual time (spin-emu --virtual-time; docs/virtual-time.md, "PyTorch
programs"): allreduce, broadcast, allgather, reduce_scatter and barrier on the world, an
allreduce on a group of ranks 0 and 2 (new_group), and three DistributedDataParallel steps,
with exact results (DDP: every rank's parameters bitwise identical). Each rank prints its
virtual time after each step ("vt: rank R: ...", ns, spin_torch.virtual_time_ns()), which two
runs must print alike (tests/mpi/vt_test.sh compares them).

Run under mpirun by tests/mpi/vt_test.sh: python3 vt_ops.py MASTER_PORT. Exits 0 when every
check held on this rank.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import spin_torch

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK=str(rank), WORLD_SIZE=str(world))
dist.init_process_group("spin")
failures = []
times = []


def check(ok, what):
    if not ok:
        failures.append(what)


def stamp():
    t = spin_torch.virtual_time_ns()
    check(t is not None, "virtual_time_ns() is None against spin-emu --virtual-time")
    times.append(t if t is not None else -1)


n = 3001
x = torch.arange(n, dtype=torch.float32) + rank
dist.all_reduce(x)
check(torch.equal(x, torch.arange(n, dtype=torch.float32) * world + sum(range(world))), "all_reduce float32 SUM")
stamp()
y = torch.arange(n, dtype=torch.int64) * (rank + 1)
dist.all_reduce(y, op=dist.ReduceOp.MAX)
check(torch.equal(y, torch.arange(n, dtype=torch.int64) * world), "all_reduce int64 MAX")
stamp()
b = torch.arange(1000, dtype=torch.float64) * 3 if rank == 1 else torch.zeros(1000, dtype=torch.float64)
dist.broadcast(b, src=1)
check(torch.equal(b, torch.arange(1000, dtype=torch.float64) * 3), "broadcast from rank 1")
stamp()
parts = [torch.zeros(500, dtype=torch.int32) for _ in range(world)]
dist.all_gather(parts, torch.full((500,), rank * 7, dtype=torch.int32))
check(all(torch.equal(p, torch.full((500,), r * 7, dtype=torch.int32)) for r, p in enumerate(parts)), "all_gather")
stamp()
out = torch.zeros(300, dtype=torch.float32)
dist.reduce_scatter(out, [torch.full((300,), float(rank + r), dtype=torch.float32) for r in range(world)])
check(torch.equal(out, torch.full((300,), float(sum(q + rank for q in range(world))), dtype=torch.float32)), "reduce_scatter")
stamp()

# A group of some ranks: every rank calls new_group, only its members use it.
pair = dist.new_group([0, 2], backend="spin")
if rank in (0, 2):
    u = torch.full((100,), float(rank + 1))
    dist.all_reduce(u, group=pair)
    check(torch.equal(u, torch.full((100,), 4.0)), "all_reduce on new_group([0, 2])")
stamp()
dist.barrier()
stamp()

# DistributedDataParallel: its gradient buckets are allreduced through spin.
torch.manual_seed(7)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(100 + rank)
for step in range(3):
    inputs = torch.randn(8, 32, generator=g)
    target = torch.randint(0, 4, (8,), generator=g)
    opt.zero_grad()
    nn.functional.cross_entropy(model(inputs), target).backward()
    opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
every = [torch.zeros_like(flat) for _ in range(world)]
dist.all_gather(every, flat)
check(all(torch.equal(e, flat) for e in every), "DDP: parameters differ between ranks after 3 steps")
stamp()

check(all(b >= a for a, b in zip(times, times[1:])), f"the virtual clock went back: {times}")
# One write per line: print() writes the text and the newline apart, and mpirun may put another
# rank's output between them.
sys.stdout.write(f"vt: rank {rank}: " + " ".join(str(t) for t in times) + "\n")
sys.stdout.flush()
for f in failures:
    print(f"vt_ops: rank {rank}: FAILED: {f}", file=sys.stderr, flush=True)
dist.destroy_process_group()
sys.exit(1 if failures else 0)
