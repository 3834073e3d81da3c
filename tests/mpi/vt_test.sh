#!/usr/bin/env bash
# A program of 4 ranks in virtual time (tests/mpi/mpi_vt, tests/pytorch/vt_ops.py) under mpirun
# against spin-emu --virtual-time, twice; the second time both cores are busy in two other
# processes (each stops by itself after 120 s, and when this script ends). Both runs must pass every check, and every rank must print
# the same virtual times both times. With SPIN_TEST_SWITCH_NODE the ranks aggregate on that node
# (run_mpi_test.sh passes it on), and some calls must have gone through it.
#
# Each rank prints its times on a line "vt: rank R: ..." and the program exits 0 when every
# check held. SPIN_TEST_PRELOAD: libspin-mpi's path for LD_PRELOAD (a program not linked with it).
#
#   vt_test.sh RUN_MPI_TEST SPIN_EMU -- PROGRAM [ARGS...]    ("{port}": as run_mpi_test.sh)
set -euo pipefail
run=$1 spin_emu=$2
shift 2
[[ ${1:-} == -- ]] && shift
dir=$(mktemp -d "${TMPDIR:-/tmp}/spin_mpi_vt.XXXXXX")
burners=()
cleanup() {
  for p in "${burners[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${burners[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

once() {
  SPIN_TEST_VIRTUAL_TIME=1 "$run" "$spin_emu" 4 "${SPIN_TEST_PRELOAD:-}" -- "${program[@]}" > "$dir/$1.out" 2>&1 || {
    echo "run $1 failed:"; cat "$dir/$1.out"; exit 1; }
  grep '^vt: rank' "$dir/$1.out" | sort > "$dir/$1.times"
  [[ $(wc -l < "$dir/$1.times") -eq 4 ]] || { echo "run $1: not 4 ranks' times:"; cat "$dir/$1.out"; exit 1; }
  # SPIN_TEST_SWITCH_NODE: some calls must have gone through the switch (each rank's counters).
  if [[ -n ${SPIN_TEST_SWITCH_NODE:-} ]] && ! grep -q 'switch_calls=[1-9]' "$dir/$1.out"; then
    echo "run $1: no call went through the switch:"; cat "$dir/$1.out"; exit 1
  fi
}

program=("$@")
once quiet
# The load: two loops that stop by themselves after 120 s. Each is the process started here (no
# wrapper such as timeout, whose kill would leave its child running), so cleanup's kill ends it.
for _ in 1 2; do
  /usr/bin/python3 -c $'import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass' &
  burners+=($!)
done
once loaded
cat "$dir/quiet.times"
if ! diff "$dir/quiet.times" "$dir/loaded.times"; then
  echo "the virtual times differ between the runs (above: quiet <, loaded >)"
  exit 1
fi
echo "vt_test: both runs passed and printed the same virtual times"
