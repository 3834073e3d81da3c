#!/bin/bash
# Installs the build into a DESTDIR and builds against the installation only, as a user of an
# installed spinnic would: a handler package with the installed spinc (both targets) and a host
# program and a collectives program with pkg-config. Exit status 0 when everything builds and runs.
#
# usage: run_install_test.sh BUILD_DIR TEST_SOURCE_DIR CXX [SANITIZE]
# SANITIZE is the build's b_sanitize ("none", "address,undefined", "thread"): the installed
# libraries carry its instrumentation, so the programs link with it too.
set -euo pipefail
build=$1 src=$2 cxx=$3 sanitize=${4:-none}
san=()
if [ "$sanitize" != none ] && [ -n "$sanitize" ]; then san=(-fsanitize="$sanitize"); fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root

meson install -C "$build" --destdir "$root" --no-rebuild --quiet
pc=$(find "$root" -name spin-host.pc -printf '%h\n' | head -1)
spinc=$(find "$root" -path '*/bin/spinc' | head -1)
[ -n "$pc" ] || { echo "FAIL: no spin-host.pc installed"; exit 1; }
[ -n "$spinc" ] || { echo "FAIL: no spinc installed"; exit 1; }
for f in spin-handler.pc spin-host.pc spin-coll.pc; do
  [ -f "$pc/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
export PKG_CONFIG_PATH=$pc PKG_CONFIG_SYSROOT_DIR=$root

# The installed spinc takes the installed handler headers, not the source tree's.
headers=$("$spinc" --version | sed -n 's/^handler headers: //p')
case "$headers" in
  "$root"/*) ;;
  *) echo "FAIL: the installed spinc uses handler headers at '$headers', not the installation's"; exit 1 ;;
esac
# The handler package, for both targets; a copy of the source outside the tree.
cp "$src/counter.cpp" "$work/"
"$spinc" --target native "$work/counter.cpp" -o "$work/counter.native.spkg"
"$spinc" --target ebpf "$work/counter.cpp" -o "$work/counter.ebpf.spkg"
# Handler code may also take its flags from spin-handler.pc (an IDE, a syntax check).
"$cxx" -std=c++20 -fsyntax-only $(pkg-config --cflags spin-handler) "$work/counter.cpp"

# Host programs: compiled and linked with what pkg-config says, nothing of the build tree.
"$cxx" -std=c++20 "${san[@]}" $(pkg-config --cflags spin-host) "$src/host_program.cpp" -o "$work/host_program" $(pkg-config --libs spin-host)
"$work/host_program" "$work/counter.native.spkg" count_payload
"$work/host_program" "$work/counter.ebpf.spkg" count_payload
"$cxx" -std=c++20 "${san[@]}" $(pkg-config --cflags spin-coll) "$src/coll_program.cpp" -o "$work/coll_program" $(pkg-config --libs spin-coll)
"$work/coll_program"
# Neither links DPDK (ldd is enough here: these link lines are pkg-config's, checked above).
for p in host_program coll_program; do
  if ldd "$work/$p" | grep -qi 'librte_\|libboost\|libtoml\|libpcap'; then echo "FAIL: $p links DPDK, Boost, toml++ or libpcap"; exit 1; fi
done
echo "install test: spinc, spin-handler.pc, spin-host.pc and spin-coll.pc work from $root"
