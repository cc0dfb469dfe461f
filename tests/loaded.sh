#!/usr/bin/env bash
# Usage: tests/loaded.sh COMMAND [ARG...]
#
# Run COMMAND while a busy loop per core (nproc) competes for the CPU, as a training job does
# beside a health check: its data loader workers and its training loop keep every core busy
# at the default priority, so the loops are not niced. Whatever happens (COMMAND fails, the
# run is interrupted or terminated, this script is killed), no loop is left running: they
# end with this script (an EXIT trap, and a parent-death signal for a SIGKILL). The exit
# status is COMMAND's; 130/143 when interrupted or terminated.
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: tests/loaded.sh COMMAND [ARG...]" >&2; exit 3; }

hogs=()
# shellcheck disable=SC2329 # invoked by the traps below
stop_hogs() {
  [ "${#hogs[@]}" -eq 0 ] && return
  kill -KILL "${hogs[@]}" 2>/dev/null || true
  wait "${hogs[@]}" 2>/dev/null || true
  hogs=()
}
trap stop_hogs EXIT
trap 'stop_hogs; trap - INT; kill -INT $$' INT
trap 'stop_hogs; exit 143' TERM HUP

cores=$(nproc)
for ((i = 0; i < cores; i++)); do
  # setpriv --pdeathsig: the loop gets SIGKILL when this script ends, however it ends.
  setpriv --pdeathsig KILL bash -c 'while :; do :; done' &
  hogs+=("$!")
done
echo "loaded: $cores busy loops (pids ${hogs[*]}) while: $*" >&2
start=$SECONDS
status=0
"$@" || status=$?
echo "loaded: '$*' ended with status $status after $((SECONDS - start)) s" >&2
exit "$status"
