#!/usr/bin/env bash
# Integration test of host_hello: starts spin-emu on a two-host, one-switch topology with its
# own control socket, runs host_hello against it, stops spin-emu, and exits with host_hello's
# status (spin-emu not coming up, or not stopping, is a failure too).
#
#   run_test.sh SPIN_EMU SPINCTL HOST_HELLO [host_hello arguments...]
#
# Without host_hello arguments it sends 50 messages of 100000 bytes from h0 to h1.
set -euo pipefail

spin_emu=$1 spinctl=$2 host_hello=$3
shift 3
hello_args=("$@")
[[ ${#hello_args[@]} -gt 0 ]] || hello_args=(--from h0 --to h1 --bytes 100000 --messages 50)

dir=$(mktemp -d "${TMPDIR:-/tmp}/host_hello.XXXXXX")
emu_pid= hello_pid=
cleanup() {
  [[ -z $hello_pid ]] || kill -TERM "$hello_pid" 2>/dev/null || true
  if [[ -n $emu_pid ]] && kill -0 "$emu_pid" 2>/dev/null; then
    kill -TERM "$emu_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$emu_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$emu_pid" 2>/dev/null || true
    wait "$emu_pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' INT TERM  # exit through cleanup (children run in the background: wait returns)

cat > "$dir/star.toml" <<'TOML'
# Two hosts around one switch, lossless so that every message must arrive.
[defaults]
rate_gbps = 10
latency_ns = 2000

[[host]]
name = "h0"

[[host]]
name = "h1"
hpus = 2

[[switch]]
name = "s0"

[[link]]
a = "h0"
b = "s0"

[[link]]
a = "h1"
b = "s0"
TOML

sock=$dir/emu.sock
"$spin_emu" --topology "$dir/star.toml" --socket "$sock" --duration 60 -q > "$dir/emu.log" 2>&1 &
emu_pid=$!

# Wait (at most 20 s) until the control socket answers.
up=0
for _ in $(seq 200); do
  if timeout 10 "$spinctl" --socket "$sock" nodes > "$dir/nodes.txt" 2>/dev/null; then up=1; break; fi
  if ! kill -0 "$emu_pid" 2>/dev/null; then break; fi
  sleep 0.1
done
if [[ $up != 1 ]]; then
  echo "run_test: spin-emu did not come up; its output:" >&2
  cat "$dir/emu.log" >&2
  exit 1
fi
cat "$dir/nodes.txt"

status=0
"$host_hello" --socket "$sock" "${hello_args[@]}" &
hello_pid=$!
wait "$hello_pid" || status=$?
hello_pid=

timeout 10 "$spinctl" --socket "$sock" stop || { [[ $status != 0 ]] || status=1; }
# spin-emu settles traffic for up to 500 ms after stop; give it 10 s.
for _ in $(seq 100); do kill -0 "$emu_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$emu_pid" 2>/dev/null; then
  echo "run_test: spin-emu did not exit after spinctl stop" >&2
  exit 1
fi
emu_status=0
wait "$emu_pid" || emu_status=$?
emu_pid=
if [[ $emu_status != 0 ]]; then
  echo "run_test: spin-emu exited with status $emu_status; its output:" >&2
  cat "$dir/emu.log" >&2
  [[ $status != 0 ]] || status=1
fi
exit "$status"
