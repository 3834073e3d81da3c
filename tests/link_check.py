#!/usr/bin/env python3
"""Checks what a program links.

usage: link_check.py no-dpdk|no-llvm BUILD_DIR TARGET_PATH BINARY

no-dpdk: a host program (one linked with the host client, spin_host_dep, or spin::coll's rank
side, spin_coll_rank_dep) links no DPDK, Boost, toml++ or libpcap, nor the emulator or the
runtime's rte_bpf engine.
no-llvm: a program links no LLVM or clang library (spin-bench: only spinc needs them).

Two views, because each alone can miss something: the link command ninja runs for the target
(its inputs and flags, as build.ninja spells them), and the symbols of the linked binary (a
static library would leave its symbols; --as-needed hides shared ones from ldd).
"""
import re
import subprocess
import sys

FORBIDDEN_LINK = {
    "no-dpdk": [
        (re.compile(r"rte_|dpdk", re.I), "DPDK"),
        (re.compile(r"boost", re.I), "Boost"),
        (re.compile(r"toml", re.I), "toml++"),
        (re.compile(r"pcap", re.I), "libpcap"),
        (re.compile(r"libspin_emulator|libspin_runtime\.a|libspin_bpf_engine|libspin_coll_local"), "a DPDK-linked spinnic library"),
    ],
    "no-llvm": [
        (re.compile(r"llvm|clang-cpp|libclang|libspin_compiler", re.I), "LLVM or clang"),
    ],
}
# Defined symbols that betray a forbidden library linked statically.
FORBIDDEN_SYMBOLS = {
    "no-dpdk": [(re.compile(r"\brte_[a-z]"), "DPDK symbols"), (re.compile(r"spin::emu::"), "emulator code")],
    "no-llvm": [(re.compile(r"\bllvm::|\bclang::"), "LLVM or clang code")],
}


def link_statement(build_dir, target):
    text = open(f"{build_dir}/build.ninja", encoding="utf-8").read()
    # "build <target>: cpp_LINKER <inputs> | <implicit deps>" and its indented variables.
    m = re.search(r"^build " + re.escape(target) + r": (\S*LINKER\S*) (.*?)\n((?:[ \t]+.*\n)*)", text, re.M)
    if not m:
        sys.exit(f"link_check: no link statement for {target} in {build_dir}/build.ninja")
    inputs = m.group(2).split(" | ")[0]
    variables = m.group(3)
    return inputs + "\n" + variables


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in FORBIDDEN_LINK:
        sys.exit(__doc__)
    mode, build_dir, target, binary = sys.argv[1:]
    problems = []
    link = link_statement(build_dir, target)
    for pattern, what in FORBIDDEN_LINK[mode]:
        for word in sorted(set(w for w in re.split(r"\s+", link) if pattern.search(w))):
            problems.append(f"link line pulls in {what}: {word}")
    syms = subprocess.run(["nm", "-C", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    for pattern, what in FORBIDDEN_SYMBOLS[mode]:
        found = [l.strip() for l in syms.splitlines() if pattern.search(l)]
        if found:
            problems.append(f"the binary defines {len(found)} {what}, e.g. {'; '.join(found[:3])}")
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(f"link_check {mode}: {target} links none of them")


if __name__ == "__main__":
    main()
