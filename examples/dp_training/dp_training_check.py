#!/usr/bin/env python3
"""The short dp_training run (a slice of Fashion-MNIST, one epoch) and the checks on its summary.

Usage: dp_training_check.py DP_TRAINING ALGORITHM OUT_DIR [EXTRA DP_TRAINING ARGUMENTS]
       dp_training_check.py DP_TRAINING data-errors OUT_DIR  (damaged data and bad arguments)
The program itself checks that the ranks hold bitwise-identical parameters and that they equal
single-process training's (exit status 1 otherwise); this script also checks that accuracy is
clearly above chance and that the traffic figures are what the algorithm promises.
"""
import gzip
import json
import os
import shutil
import subprocess
import sys

DATA = "/usr/share/datasets/fashion-mnist"
FILES = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]


def data_errors(binary, out):
    """A missing, truncated, non-gzip or wrongly typed file: exit status 2 and a message naming
    the file (and the Debian package when a file is missing)."""
    shutil.rmtree(out, ignore_errors=True)
    cases = {}
    cases["missing"] = (["dataset-fashion-mnist", "train-images-idx3-ubyte.gz"], None)
    cases["truncated"] = (["train-images-idx3-ubyte.gz is damaged"], lambda d: truncate(d + "/" + FILES[0], 200000))
    cases["not-gzip"] = (["t10k-labels-idx1-ubyte.gz is damaged: not gzip-compressed"],
                         lambda d: write(d + "/" + FILES[3], b"these are not labels\n"))
    cases["magic"] = (["t10k-images-idx3-ubyte.gz is damaged: IDX magic 2049"],
                      lambda d: write(d + "/" + FILES[2], gzip.compress(b"\x00\x00\x08\x01" + bytes(64))))
    failures = []
    for name, (want, damage) in cases.items():
        d = out + "/" + name
        os.makedirs(d)
        if damage is not None:
            for f in FILES:
                shutil.copy(DATA + "/" + f, d + "/" + f)
            damage(d)
        failures += expect_exit_2(name, [binary, "--data", d, "--out", out + "/unused"], want)
    # Bad arguments: exit status 2 and a message naming the option, before any data is read.
    bad = {
        "topk-zero": (["--sparsify", "topk:0"], ["--sparsify", "0 < P <= 100"]),
        "topk-form": (["--sparsify", "top1%"], ["--sparsify", "want topk:P"]),
        "topk-host-ring": (["--sparsify", "topk:1", "--algorithm", "host_ring"], ["--sparsify needs NIC or switch handlers"]),
        "topk-block": (["--sparsify", "topk:1", "--gradients", "bfp"], ["sparse windows carry f32, bf16, f16 or MX values"]),
        "topk-fixed": (["--sparsify", "topk:1", "--aggregation", "fixed"], ["not --aggregation fixed"]),
        "gradients-int": (["--gradients", "i32"], ["--gradients", "not a gradient datatype"]),
        "ranks-range": (["--ranks", "0"], ["--ranks"]),
    }
    for name, (args, want) in bad.items():
        failures += expect_exit_2(name, [binary, "--data", out + "/missing"] + args + ["--out", out + "/unused"], want)
    return failures


def expect_exit_2(name, cmd, want):
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    print(f"[{name}] exit {run.returncode}: {run.stdout.strip()}")
    failures = []
    if run.returncode != 2:
        failures.append(f"{name}: exit status {run.returncode}, want 2")
    for w in want:
        if w not in run.stdout:
            failures.append(f"{name}: the message does not say '{w}'")
    return failures


def truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


binary, algo, out, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
if algo == "data-errors":
    failures = data_errors(binary, out)
    for f in failures:
        print("FAIL:", f)
    print("dp_training_check:", "ok" if not failures else f"{len(failures)} failures")
    sys.exit(1 if failures else 0)
ranks = 4
cmd = [binary, "--ranks", str(ranks), "--epochs", "1", "--train-limit", "8192", "--test-limit", "2000",
       "--algorithm", algo, "--out", out] + extra
print("$", " ".join(cmd), flush=True)
run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=540)
print(run.stdout)
failures = []
if run.returncode != 0:
    failures.append(f"exit status {run.returncode}")
with open(out + "/dp_training.json") as f:
    s = json.load(f)
acc = s["final_test_accuracy"]
if acc < 0.60:  # chance is 0.10; one epoch on 8192 images reaches about 0.75
    failures.append(f"test accuracy {acc:.4f} is not clearly above chance (want >= 0.60)")
if not s["identical_across_ranks"]:
    failures.append("ranks hold different parameters")
if s["single_process_reference"] != "equal":
    failures.append("parameters differ from single-process training: " + s["single_process_reference"])
e = s["epochs"][0]
steps = s["config"]["steps_per_epoch"]
wire = s["config"]["wire_bytes_per_step"]
if e["float32_payload_bytes_per_host"] != (s["config"]["parameters"] + 1) * 4 * steps:
    failures.append("the float32 payload is not (parameters + 1) x 4 x steps")
if "--sparsify" in extra:
    # Each step's windows: every window's head (and at most 2 bytes of padding), and at most k + 1
    # pairs of a 2-byte offset and a value (MX: a one-byte code, and per window a block mask and
    # up to 32 scales; the loss starts a window of its own). What a host sends (frame headers,
    # the ring's partial sums with their fill-in, each window in a packet of its own) stays far
    # below float32's.
    k, g = s["config"]["topk_per_rank"], s["config"]["gradients"]
    if g.startswith("mx"):
        windows = -(-s["config"]["parameters"] // 1020) + 1
        bound = steps * ((k + 1) * 3 + windows * (6 + 4 + 32))
    else:
        windows = -(-(s["config"]["parameters"] + 1) // 1020)
        bound = steps * ((k + 1) * (2 + (4 if g == "f32" else 2)) + windows * 6)
    payload, f32 = e["payload_bytes_per_host"], e["float32_payload_bytes_per_host"]
    print(f"sparse: windows {payload} bytes per host (at most {bound}), sent {e['bytes_sent_per_host']}, float32 {f32}")
    if not 0 < payload <= bound:
        failures.append(f"sparse windows of {payload} bytes per host, want at most {bound}")
    dense = f32 if algo == "switch" else 2 * (ranks - 1) * f32 // ranks  # what float32 sends by this algorithm
    if not e["bytes_sent_per_host"] < 0.1 * dense:
        failures.append(f"a host sent {e['bytes_sent_per_host']} bytes, not below 0.1 x float32's {dense} by {algo}")
    for f in failures:
        print("FAIL:", f)
    print("dp_training_check:", "ok" if not failures else f"{len(failures)} failures")
    sys.exit(1 if failures else 0)
if "--gradients" not in extra and wire != (s["config"]["parameters"] + 1) * 4:
    failures.append(f"{wire} bytes per step on the wire, want (parameters + 1) x 4")
if "--gradients" in extra:  # a block format: a block per 32 (or 16) values, and the loss's block
    if not wire < 0.3 * s["config"]["float32_bytes_per_step"]:
        failures.append(f"{wire} bytes per step in {s['config']['gradients']}, not below 0.3 x float32's")
if e["payload_bytes_per_host"] != wire * steps:
    failures.append(f"payload per host {e['payload_bytes_per_host']} != S x steps = {wire * steps}")
if e["ring_payload_bytes_per_host"] != 2 * (ranks - 1) * wire * steps // ranks:
    failures.append("ring payload is not 2(N-1)/N x S per step")
sent, payload, ring = e["bytes_sent_per_host"], e["payload_bytes_per_host"], e["ring_payload_bytes_per_host"]
# Frames carry headers (about 10% at 1024-byte payloads) and the collective protocol's control packets.
if algo == "switch":
    if not payload <= sent <= 1.25 * payload:
        failures.append(f"switch: a host sent {sent} bytes, want S x steps = {payload} plus at most 25% of headers")
    if not sent < ring:
        failures.append(f"switch: a host sent {sent} bytes, not less than a ring's payload {ring}")
else:
    if not ring <= sent <= 1.25 * ring:
        failures.append(f"{algo}: a host sent {sent} bytes, want 2(N-1)/N x S x steps = {ring} plus at most 25%")
for f in failures:
    print("FAIL:", f)
print("dp_training_check:", "ok" if not failures else f"{len(failures)} failures")
sys.exit(1 if failures else 0)
