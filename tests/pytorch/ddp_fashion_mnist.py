#!/usr/bin/env python3
"""Data-parallel training with torch.nn.parallel.DistributedDataParallel on Fashion-MNIST (from
Debian's dataset-fashion-mnist), the same model from the same seed trained twice in one job:
once over a "gloo" process group and once over a "spin" one (the gradients' allreduce runs in
the emulated NICs). After every epoch each run's parameters must be bitwise identical on every
rank; at the end the spin run must reach gloo's test accuracy (within 1 point: the two sum
float gradients in different orders). Prints each epoch's loss, accuracy and time, gloo beside
spin.

Launch: one process per rank, ranks from mpirun (OMPI_COMM_WORLD_*) or from RANK/WORLD_SIZE;
tests/mpi/run_mpi_test.sh starts the spin-emu cluster and mpirun.
  python3 ddp_fashion_mnist.py MASTER_PORT [--epochs E] [--train N] [--test M]
"""
import argparse
import gzip
import hashlib
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import spin_torch  # noqa: F401  registers the backend "spin"

DATA = "/usr/share/datasets/fashion-mnist"


def idx(path):
    with gzip.open(path, "rb") as f:
        magic, n = struct.unpack(">II", f.read(8))
        dims = [struct.unpack(">I", f.read(4))[0] for _ in range((magic & 0xFF) - 1)]
        return np.frombuffer(f.read(), dtype=np.uint8).reshape([n] + dims)


def load(kind, count):
    x = idx(f"{DATA}/{kind}-images-idx3-ubyte.gz")[:count].astype(np.float32) / 255.0
    y = idx(f"{DATA}/{kind}-labels-idx1-ubyte.gz")[:count].astype(np.int64)
    return torch.from_numpy(x).reshape(-1, 784), torch.from_numpy(y)


def digest(model):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return torch.tensor(list(hashlib.sha256(flat.numpy().tobytes()).digest()), dtype=torch.uint8)


def train(pg, name, args, data, rank, world):
    (xtr, ytr), (xte, yte) = data
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = nn.parallel.DistributedDataParallel(model, process_group=pg)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    history = []
    for epoch in range(args.epochs):
        order = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(epoch))
        mine = order[rank::world]  # this rank's shard: the same number of batches on every rank
        t0 = time.perf_counter()
        total = 0.0
        steps = len(mine) // args.batch
        for s in range(steps):
            i = mine[s * args.batch:(s + 1) * args.batch]
            loss = F.cross_entropy(ddp(xtr[i]), ytr[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        seconds = time.perf_counter() - t0
        # Every rank must hold the same parameters, bit for bit (compared over the default group).
        d = digest(model)
        every = [torch.empty_like(d) for _ in range(world)]
        dist.all_gather(every, d)
        identical = all(torch.equal(e, every[0]) for e in every)
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item()
        history.append(dict(epoch=epoch + 1, loss=total / steps, acc=acc, seconds=seconds, identical=identical))
    return history


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--train", type=int, default=12000)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.update(MASTER_PORT=args.port, RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    groups = {"gloo": dist.new_group(backend="gloo"), "spin": dist.new_group(backend="spin")}
    data = (load("train", args.train), load("t10k", args.test))
    runs = {name: train(pg, name, args, data, rank, world) for name, pg in groups.items()}
    ok = True
    if rank == 0:
        print(f"ddp_fashion_mnist: {world} ranks, MLP 784-128-10, {args.train} training images "
              f"({args.batch} per rank and step), {args.test} test images; gradients allreduced by gloo, then by spin")
        for g, s in zip(runs["gloo"], runs["spin"]):
            print(f"epoch {g['epoch']}: gloo loss {g['loss']:.4f} acc {g['acc']:.4f} {g['seconds']:.2f} s | "
                  f"spin loss {s['loss']:.4f} acc {s['acc']:.4f} {s['seconds']:.2f} s ({s['seconds'] / g['seconds']:.2f} x gloo)"
                  f" | identical on every rank: gloo {g['identical']}, spin {s['identical']}")
    for name, h in runs.items():
        for e in h:
            if not e["identical"]:
                ok = False
                print(f"ddp_fashion_mnist: rank {rank}: {name} parameters differ between ranks after epoch {e['epoch']}")
    gap = abs(runs["spin"][-1]["acc"] - runs["gloo"][-1]["acc"])
    if gap > 0.01 or runs["spin"][-1]["acc"] < 0.7:
        ok = False
        print(f"ddp_fashion_mnist: rank {rank}: spin's accuracy {runs['spin'][-1]['acc']:.4f} is not gloo's "
              f"{runs['gloo'][-1]['acc']:.4f}")
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)
    if rank == 0:
        print("ddp_fashion_mnist: " + ("every check held" if flag.item() == 0 else "CHECKS FAILED"))
    dist.destroy_process_group()
    return 0 if flag.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
