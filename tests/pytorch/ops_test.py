#!/usr/bin/env python3
"""The "spin" torch.distributed backend, op by op: every operation the backend has (allreduce
with SUM, MIN, MAX, PRODUCT on float32, float64, int32, int64, bfloat16; broadcast; allgather;
_allgather_base; reduce_scatter; _reduce_scatter_base; barrier) gives exactly gloo's bytes, in
the same job, on integer-valued inputs (the exact answer where gloo has no such operation:
bfloat16, reduce-scatter), and the ones it lacks, and a bad setting, raise a clear error.

Run by tests/pytorch/meson.build under mpirun (tests/mpi/run_mpi_test.sh starts the spin-emu
cluster): python3 ops_test.py MASTER_PORT. Exits 0 when every check held on every rank.
"""
import os
import sys

import torch
import torch.distributed as dist

import spin_torch  # noqa: F401  registers the backend "spin"

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK=str(rank), WORLD_SIZE=str(world))
dist.init_process_group("gloo")
spin = dist.new_group(backend="spin")
gloo = dist.new_group(backend="gloo")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


n = 3001  # not a multiple of anything in particular
for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
    base = ((torch.arange(n) * 7 + rank * 3) % 5 + 1).to(dt)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
        a, b = base.clone(), base.clone()
        dist.all_reduce(a, op=op, group=spin)
        if dt == torch.bfloat16:  # gloo has no bfloat16: the exact answer, computed here
            if op == dist.ReduceOp.PRODUCT:
                continue  # products above 256 round in bfloat16, differently in any other order
            every = torch.stack([((torch.arange(n) * 7 + r * 3) % 5 + 1).to(torch.float64) for r in range(world)])
            b = {dist.ReduceOp.SUM: every.sum(0), dist.ReduceOp.MIN: every.min(0).values,
                 dist.ReduceOp.MAX: every.max(0).values}[op].to(dt)
        else:
            dist.all_reduce(b, op=op, group=gloo)
        check(same(a, b), f"all_reduce {dt} {op}")
    # A non-contiguous tensor goes through a contiguous copy.
    if dt != torch.bfloat16:
        a = base.clone().view(-1)[::2]
        b = a.clone()
        dist.all_reduce(a, group=spin)
        dist.all_reduce(b, group=gloo)
        check(same(a, b), f"all_reduce non-contiguous {dt}")
    for root in (0, world - 1):
        a = base.clone() if rank == root else torch.zeros(n, dtype=dt)
        dist.broadcast(a, src=root, group=spin)
        check(same(a, ((torch.arange(n) * 7 + root * 3) % 5 + 1).to(dt)), f"broadcast {dt} root {root}")
    outs_s = [torch.empty(n, dtype=dt) for _ in range(world)]
    outs_g = [((torch.arange(n) * 7 + r * 3) % 5 + 1).to(dt) for r in range(world)]
    dist.all_gather(outs_s, base, group=spin)
    check(all(same(x, y) for x, y in zip(outs_s, outs_g)), f"all_gather {dt}")
    flat = torch.empty(n * world, dtype=dt)
    dist.all_gather_into_tensor(flat, base, group=spin)  # _allgather_base
    check(same(flat, torch.cat(outs_g)), f"_all_gather_base {dt}")
    ins = [((torch.arange(n) + k + rank) % 4 + 1).to(dt) for k in range(world)]
    rs = torch.empty(n, dtype=dt)
    dist.reduce_scatter(rs, ins, group=spin)
    want = sum(((torch.arange(n) + rank + r) % 4 + 1).to(torch.float64) for r in range(world)).to(dt)
    check(same(rs, want), f"reduce_scatter {dt}")
    rs2 = torch.empty(n, dtype=dt)
    dist.reduce_scatter_tensor(rs2, torch.cat(ins), group=spin)  # _reduce_scatter_base
    check(same(rs2, want), f"_reduce_scatter_base {dt}")

# Bytes of any dtype move unchanged through broadcast and all_gather (odd sizes too).
u8 = torch.arange(13, dtype=torch.uint8) + rank
outs = [torch.empty(13, dtype=torch.uint8) for _ in range(world)]
dist.all_gather(outs, u8, group=spin)
check(all(same(outs[r], torch.arange(13, dtype=torch.uint8) + r) for r in range(world)), "all_gather uint8, 13 bytes")
b = torch.arange(7, dtype=torch.uint8) * (rank + 1)
dist.broadcast(b, src=1, group=spin)
check(same(b, torch.arange(7, dtype=torch.uint8) * 2), "broadcast uint8, 7 bytes")
dist.barrier(group=spin)

# What the backend lacks raises, naming it.
for name, call in (("gather", lambda: dist.gather(torch.zeros(4), [torch.zeros(4)] * world if rank == 0 else None, dst=0, group=spin)),
                   ("send", lambda: dist.send(torch.zeros(4), dst=(rank + 1) % world, group=spin)),
                   ("BAND", lambda: dist.all_reduce(torch.zeros(4, dtype=torch.int32), op=dist.ReduceOp.BAND, group=spin)),
                   ("uint8 sum", lambda: dist.all_reduce(torch.zeros(4, dtype=torch.uint8), group=spin))):
    try:
        call()
        failures.append(f"{name} did not raise")
    except (RuntimeError, ValueError) as e:
        check("spin" in str(e) or "not support" in str(e), f"{name}: unclear error: {e}")

# A bad setting is refused, naming the variable (on every rank: new_group is collective).
os.environ["SPIN_TORCH_NODE"] = "-1"
try:
    dist.new_group(backend="spin")
    failures.append("SPIN_TORCH_NODE=-1 was accepted")
except ValueError as e:
    check("SPIN_TORCH_NODE='-1'" in str(e), f"SPIN_TORCH_NODE=-1: unclear error: {e}")
del os.environ["SPIN_TORCH_NODE"]
os.environ["SPIN_JOB_SECRET"] = "not-a-secret"
try:
    dist.new_group(backend="spin")
    failures.append("SPIN_JOB_SECRET=not-a-secret was accepted")
except ValueError as e:
    check("SPIN_JOB_SECRET must be 32 hexadecimal digits" in str(e) and "not-a-secret" not in str(e),
          f"SPIN_JOB_SECRET: unclear error, or one that shows the value: {e}")
del os.environ["SPIN_JOB_SECRET"]

bad = torch.tensor([len(failures)])
dist.all_reduce(bad, group=gloo)
for f in failures:
    print(f"ops_test: rank {rank}: FAILED: {f}", flush=True)
if rank == 0:
    print(f"ops_test: {world} ranks, " + ("every check held" if bad.item() == 0 else f"{bad.item()} checks failed"), flush=True)
dist.barrier(group=gloo)
dist.destroy_process_group()
sys.exit(0 if bad.item() == 0 else 1)
