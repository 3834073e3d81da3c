#!/usr/bin/env bash
# Runs an MPI program under Open MPI's mpirun against a spin-emu cluster (4 hosts around one
# switch, lossless) started here with its own control socket, then stops spin-emu
# (SPIN_TEST_VIRTUAL_TIME=1: in virtual time).
#
#   run_mpi_test.sh SPIN_EMU NP PRELOAD -- PROGRAM [ARGS...]
#
# PRELOAD is libspin-mpi.so's path for LD_PRELOAD, or "" for a program linked with it. Every
# rank reaches its NIC through the control socket (SPIN_MPI_SOCKET, SPIN_TORCH_SOCKET); rank k uses node k (its
# local rank), which the topology makes host k. Exits with mpirun's status; spin-emu not coming
# up is a failure too. SPIN_MPI_LOG=1: each rank prints its counters at MPI_Finalize. An
# argument "{port}" becomes a free TCP port of 127.0.0.1 (for torch.distributed's store).
set -euo pipefail

spin_emu=$1 np=$2 preload=$3
shift 3
[[ ${1:-} == -- ]] && shift

dir=$(mktemp -d "${TMPDIR:-/tmp}/spin_mpi.XXXXXX")
emu_pid=
cleanup() {
  if [[ -n $emu_pid ]] && kill -0 "$emu_pid" 2>/dev/null; then
    kill -TERM "$emu_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$emu_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$emu_pid" 2>/dev/null || true
    wait "$emu_pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' INT TERM

{
  echo '[defaults]'
  echo 'rate_gbps = 100'
  echo 'latency_ns = 1000'
  for ((h = 0; h < np; h++)); do printf '[[host]]\nname = "h%d"\n' "$h"; done
  printf '[[switch]]\nname = "s0"\n'
  for ((h = 0; h < np; h++)); do printf '[[link]]\na = "h%d"\nb = "s0"\n' "$h"; done
} > "$dir/star.toml"

sock=$dir/emu.sock
# The fabric's management key (docs/deployment.md): in-band joins of a group with a job secret
# (every MPI and PyTorch group has one) carry its frame key wrapped under it.
# SPIN_TEST_VIRTUAL_TIME=1: the cluster runs in virtual time (spin-emu --virtual-time).
emu_args=(--topology "$dir/star.toml" --socket "$sock" --duration 600 -q)
[[ ${SPIN_TEST_VIRTUAL_TIME:-0} != 1 ]] || emu_args+=(--virtual-time)
SPIN_MGMT_KEY=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n') \
  "$spin_emu" "${emu_args[@]}" > "$dir/emu.log" 2>&1 &
emu_pid=$!
for _ in $(seq 200); do
  [[ -S $sock ]] && break
  kill -0 "$emu_pid" 2>/dev/null || { echo "spin-emu exited early:"; cat "$dir/emu.log"; exit 1; }
  sleep 0.1
done
[[ -S $sock ]] || { echo "spin-emu's control socket did not appear within 20 s:"; cat "$dir/emu.log"; exit 1; }

# SPIN_TEST_SOCKET overrides the socket the ranks are told (a path where nothing listens tests
# what a rank does without its spin-emu).
rank_sock=${SPIN_TEST_SOCKET:-$sock}
env_args=(-x SPIN_MPI_SOCKET="$rank_sock" -x SPIN_TORCH_SOCKET="$rank_sock" -x SPIN_MPI_LOG="${SPIN_MPI_LOG:-1}")
[[ -z $preload ]] || env_args+=(-x LD_PRELOAD="$preload")
# SPIN_TEST_SWITCH_NODE: the ranks aggregate on that node of the cluster (the switch).
[[ -z ${SPIN_TEST_SWITCH_NODE:-} ]] || env_args+=(-x SPIN_MPI_SWITCH_NODE="$SPIN_TEST_SWITCH_NODE" -x SPIN_TORCH_SWITCH_NODE="$SPIN_TEST_SWITCH_NODE")
# SPIN_TEST_SWITCH_RANK: the ranks aggregate on the switch of that rank, joining in-band through
# their own NICs (the node agents of the cluster process).
[[ -z ${SPIN_TEST_SWITCH_RANK:-} ]] || env_args+=(-x SPIN_MPI_SWITCH_RANK="$SPIN_TEST_SWITCH_RANK" -x SPIN_TORCH_SWITCH_RANK="$SPIN_TEST_SWITCH_RANK")
for v in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS PYTHONPATH OMP_NUM_THREADS SPIN_MPI_ALGORITHM SPIN_TORCH_ALGORITHM; do
  [[ -z ${!v:-} ]] || env_args+=(-x "$v=${!v}")
done
# SPIN_TEST_RANK_ASAN_OPTIONS: ASAN_OPTIONS for the ranks only (spin-emu keeps the caller's).
[[ -z ${SPIN_TEST_RANK_ASAN_OPTIONS:-} ]] || env_args+=(-x "ASAN_OPTIONS=$SPIN_TEST_RANK_ASAN_OPTIONS")
# SPIN_TEST_RANK_TSAN_OPTIONS: TSAN_OPTIONS for the ranks only.
[[ -z ${SPIN_TEST_RANK_TSAN_OPTIONS:-} ]] || env_args+=(-x "TSAN_OPTIONS=$SPIN_TEST_RANK_TSAN_OPTIONS")
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
args=()
for a in "$@"; do [[ $a == "{port}" ]] && args+=("$port") || args+=("$a"); done
status=0
timeout 500 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
  --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
  "${env_args[@]}" "${args[@]}" || status=$?
if [[ $status -ne 0 ]]; then
  echo "mpirun exited with $status; spin-emu's log:"
  cat "$dir/emu.log"
fi
exit $status
