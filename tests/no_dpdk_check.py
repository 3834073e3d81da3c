#!/usr/bin/env python3
"""Checks that a host program (one linked with the host client, spin_host_dep, or spin::coll's
rank side, spin_coll_rank_dep) links no DPDK, Boost, toml++ or libpcap, nor the emulator or the
runtime's rte_bpf engine.

usage: no_dpdk_check.py BUILD_DIR TARGET_PATH BINARY

Two views, because each alone can miss something: the link command ninja runs for the target
(its inputs and flags, as build.ninja spells them), and the symbols of the linked binary (a
static DPDK library would leave rte_* symbols; --as-needed hides shared ones from ldd).
"""
import re
import subprocess
import sys

FORBIDDEN_LINK = [
    (re.compile(r"rte_|dpdk", re.I), "DPDK"),
    (re.compile(r"boost", re.I), "Boost"),
    (re.compile(r"toml", re.I), "toml++"),
    (re.compile(r"pcap", re.I), "libpcap"),
    (re.compile(r"libspin_emulator|libspin_runtime\.a|libspin_bpf_engine|libspin_coll_local"), "a DPDK-linked spinnic library"),
]


def link_statement(build_dir, target):
    text = open(f"{build_dir}/build.ninja", encoding="utf-8").read()
    # "build <target>: cpp_LINKER <inputs> | <implicit deps>" and its indented variables.
    m = re.search(r"^build " + re.escape(target) + r": (\S*LINKER\S*) (.*?)\n((?:[ \t]+.*\n)*)", text, re.M)
    if not m:
        sys.exit(f"no_dpdk_check: no link statement for {target} in {build_dir}/build.ninja")
    inputs = m.group(2).split(" | ")[0]
    variables = m.group(3)
    return inputs + "\n" + variables


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    build_dir, target, binary = sys.argv[1:]
    problems = []
    link = link_statement(build_dir, target)
    for pattern, what in FORBIDDEN_LINK:
        for word in sorted(set(w for w in re.split(r"\s+", link) if pattern.search(w))):
            problems.append(f"link line pulls in {what}: {word}")
    syms = subprocess.run(["nm", "-C", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    rte = sorted(set(l.split()[-1] for l in syms.splitlines() if re.search(r"\brte_[a-z]", l)))
    if rte:
        problems.append(f"the binary defines {len(rte)} DPDK symbols, e.g. {', '.join(rte[:5])}")
    emu = [l for l in syms.splitlines() if "spin::emu::" in l]
    if emu:
        problems.append(f"the binary holds emulator code, e.g. {emu[0].strip()}")
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(f"no_dpdk_check: {target} links no DPDK, Boost, toml++, libpcap or emulator")


if __name__ == "__main__":
    main()
