#!/usr/bin/env bats
# The bash front door: help, interpreter lookup, hard deadline and exit-status mapping.
# The suite's interpreter is replaced by stub executables (HEALTHCHECK_PYTHON) that
# behave as the real one might: exit with a status, hang, ignore SIGTERM.

bats_require_minimum_version 1.5.0

setup() {
  ROOT="$(cd "$BATS_TEST_DIRNAME/../.." && pwd)"
  TMP="$(mktemp -d)"
  BIN="$TMP/bin"
  mkdir -p "$BIN"
  # A clean, explicit PATH; no ENABLE_*/HEALTHCHECK_* from the caller.
  PATH="$BIN:/usr/local/bin:/usr/bin:/bin"
  while read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(ENABLE_|HEALTHCHECK_)')
  export PATH
  # The suite's entry, as the front door passes it to the interpreter after -c.
  ENTRY='import os, sys; home = os.environ.pop("_HEALTHCHECK_HOME", ""); sys.path[:0] = [home] if home else []; from probes.cli import entry; entry()'
}

teardown() {
  pkill -KILL -f "$TMP/" 2>/dev/null || true
  rm -rf "$TMP"
}

# stub NAME BODY: an executable script in the stub bin dir
stub() {
  printf '#!/usr/bin/env bash\n%s\n' "$2" >"$BIN/$1"
  chmod +x "$BIN/$1"
}

@test "--help prints the header comment and exits 0" {
  run -0 "$ROOT/healthcheck" --help
  [[ "${lines[0]}" == "Summary: prove that this GPU container can do its job"* ]]
  [[ "$output" == *"Usage: healthcheck [--profile startup|readiness|liveness]"* ]]
  [[ "$output" == *"Exit status: 0 healthy, 1 unhealthy"* ]]
  [[ "$output" != *"set -euo"* ]]
}

@test "arguments reach the suite's interpreter in isolated mode" {
  stub py 'echo "args: $* home=${_HEALTHCHECK_HOME:-}"'
  HEALTHCHECK_PYTHON="$BIN/py" _HEALTHCHECK_HOME=/elsewhere run -0 "$ROOT/healthcheck" --profile readiness --json
  [ "$output" = "args: -I -c $ENTRY --profile readiness --json home=" ]
}

@test "liveness from the source tree: no site-packages, the suite found beside the front door" {
  stub py 'echo "args: $* home=${_HEALTHCHECK_HOME:-}"'
  HEALTHCHECK_PYTHON="$BIN/py" run -0 "$ROOT/healthcheck" --profile liveness --json
  [ "$output" = "args: -I -S -c $ENTRY --profile liveness --json home=$ROOT" ]
  HEALTHCHECK_PYTHON="$BIN/py" HEALTHCHECK_PROFILE=liveness run -0 "$ROOT/healthcheck" --profile startup
  [ "$output" = "args: -I -c $ENTRY --profile startup home=" ]
  # The real interpreter: liveness passes, and a refused port still lists what listens
  # (psutil, from site-packages, put on the path when the probe needs it).
  [ -x "$ROOT/.venv/bin/python" ] || skip "no .venv in $ROOT (run make install)"
  ENABLE_GPU_CHECK=false ENABLE_JUPYTER_CHECK=false HEALTHCHECK_SSH_PORT=2 HEALTHCHECK_STATE_DIR="$TMP/state" \
    run -1 "$ROOT/healthcheck" --profile liveness
  [[ "${lines[0]}" == "unhealthy: ssh: connection refused: nothing listening on 127.0.0.1:2 ("* ]]
}

@test "exit statuses 0, 1 and 3 pass through" {
  for s in 0 1 3; do
    stub py "exit $s"
    HEALTHCHECK_PYTHON="$BIN/py" run "$ROOT/healthcheck"
    [ "$status" -eq "$s" ]
  done
}

@test "exit status 2 (reserved by Docker) becomes 1" {
  stub py 'exit 2'
  HEALTHCHECK_PYTHON="$BIN/py" run -1 "$ROOT/healthcheck"
  [[ "$output" == "unhealthy: healthcheck: the suite ended with status 2" ]]
}

@test "a crash by signal becomes 1 with a reason" {
  stub py 'kill -SEGV $$'
  HEALTHCHECK_PYTHON="$BIN/py" run -1 "$ROOT/healthcheck"
  [[ "$output" == *"the suite ended with status 139"* ]]
}

@test "a hung suite is stopped at the hard deadline with exit 1 and one line" {
  stub py 'exec sleep 60'
  SECONDS=0
  HEALTHCHECK_PYTHON="$BIN/py" HEALTHCHECK_TIMEOUT=1 run -1 "$ROOT/healthcheck"
  [ "$SECONDS" -le 6 ]
  [ "$output" = "unhealthy: healthcheck: no verdict within 4s (hard deadline): a probe is stuck; see HEALTHCHECK_LOG_FILE" ]
  ! pgrep -f "$BIN/py" >/dev/null
}

@test "a suite that ignores SIGTERM is killed a second later" {
  stub py "trap '' TERM; while :; do sleep 0.1; done"
  SECONDS=0
  HEALTHCHECK_PYTHON="$BIN/py" HEALTHCHECK_TIMEOUT=1 run -1 "$ROOT/healthcheck"
  [ "$SECONDS" -le 7 ]
  [[ "$output" == *"no verdict within 4s (hard deadline)"* ]]
  sleep 0.2
  ! pgrep -f "$BIN/py" >/dev/null
}

@test "the hard deadline follows the profile" {
  stub py 'exit 0'
  stub timeout 'echo "timeout $*"'
  HEALTHCHECK_PYTHON="$BIN/py" run -0 "$ROOT/healthcheck" --profile liveness
  [[ "$output" == "timeout -k 1 13 "* ]]
  HEALTHCHECK_PYTHON="$BIN/py" run -0 "$ROOT/healthcheck" --profile=startup
  [[ "$output" == "timeout -k 1 63 "* ]]
  HEALTHCHECK_PYTHON="$BIN/py" HEALTHCHECK_PROFILE=liveness run -0 "$ROOT/healthcheck"
  [[ "$output" == "timeout -k 1 13 "* ]]
  HEALTHCHECK_PYTHON="$BIN/py" HEALTHCHECK_TIMEOUT=2.5 run -0 "$ROOT/healthcheck"
  [[ "$output" == "timeout -k 1 6 "* ]]
  # Surrounding whitespace is ignored, as the suite ignores it.
  HEALTHCHECK_PYTHON="$BIN/py" HEALTHCHECK_TIMEOUT=" 30 " HEALTHCHECK_PROFILE=" liveness" run -0 "$ROOT/healthcheck"
  [[ "$output" == "timeout -k 1 33 "* ]]
  # A value the suite refuses (exit 3) never breaks the arithmetic and gets the longest budget.
  HEALTHCHECK_PYTHON="$BIN/py" HEALTHCHECK_TIMEOUT=-1 run -0 "$ROOT/healthcheck"
  [[ "$output" == "timeout -k 1 63 "* ]]
  HEALTHCHECK_PYTHON="$BIN/py" HEALTHCHECK_TIMEOUT=99999999999999999999999999 run -0 "$ROOT/healthcheck"
  [[ "$output" == "timeout -k 1 28 "* ]]
}

@test "serve runs without a deadline" {
  stub py 'echo "args: $*"'
  stub timeout 'echo "timeout must not be used"; exit 9'
  HEALTHCHECK_PYTHON="$BIN/py" run -0 "$ROOT/healthcheck" serve --port 1234
  [ "$output" = "args: -I -c $ENTRY serve --port 1234" ]
}

@test "a HEALTHCHECK_PYTHON that is not executable is a usage error" {
  HEALTHCHECK_PYTHON="$TMP/nope" run -3 "$ROOT/healthcheck"
  [ "$output" = "healthcheck: HEALTHCHECK_PYTHON=$TMP/nope is not an executable (accepted: the path of the suite's python)" ]
}

@test "a strange HEALTHCHECK_PYTHON is one line with its control characters visible" {
  HEALTHCHECK_PYTHON=$'/x\n\e[31m'"$(printf 'y%.0s' {1..300})" run -3 "$ROOT/healthcheck"
  [ "${#lines[@]}" -eq 1 ]
  [[ "$output" == *"\\n\\E[31m"* ]]
  [ "${#output}" -lt 400 ]
}

@test "without .venv beside it the front door says how to install" {
  cp "$ROOT/healthcheck" "$TMP/healthcheck"
  run -3 "$TMP/healthcheck"
  [ "$output" = "healthcheck: no interpreter at $TMP/.venv/bin/python: run 'make install' in $TMP, or set HEALTHCHECK_PYTHON" ]
}

@test "found through a symlink, it uses the .venv beside the real script" {
  ln -s "$ROOT/healthcheck" "$BIN/healthcheck"
  [ -x "$ROOT/.venv/bin/python" ] || skip "no .venv in $ROOT (run make install)"
  run -0 healthcheck --version
  [[ "$output" == "healthcheck "[0-9]* ]]
}

@test "run by a relative path from another directory, it names its own directory" {
  cp "$ROOT/healthcheck" "$TMP/healthcheck"
  mkdir "$TMP/elsewhere"
  cd "$TMP/elsewhere"
  run -3 bash ../healthcheck
  [ "$output" = "healthcheck: no interpreter at $TMP/elsewhere/../.venv/bin/python: run 'make install' in $TMP/elsewhere/.., or set HEALTHCHECK_PYTHON" ]
}

@test "the real suite: a bad setting exits 3 without a traceback" {
  [ -x "$ROOT/.venv/bin/python" ] || skip "no .venv in $ROOT (run make install)"
  ENABLE_SSH_CHECK=maybe run -3 --separate-stderr "$ROOT/healthcheck"
  [ "$output" = "" ]
  [[ "$stderr" == "healthcheck: ENABLE_SSH_CHECK='maybe' is not a boolean"* ]]
  [[ "$stderr" != *Traceback* ]]
}

# installed ENVBIN: the front door as pip installs it, beside the healthcheck-probes script
# whose first line(s) name the environment's interpreter as the installer wrote them.
installed() {
  mkdir -p "$1"
  cp "$ROOT/healthcheck" "$1/healthcheck"
}

@test "installed by pip, it runs the interpreter the installer wrote beside it" {
  stub py 'echo "py: $*"'
  installed "$TMP/env/bin"
  printf '#!%s\n# -*- coding: utf-8 -*-\n' "$BIN/py" >"$TMP/env/bin/healthcheck-probes"
  run -0 "$TMP/env/bin/healthcheck" --profile liveness
  [ "$output" = "py: -I -c $ENTRY --profile liveness" ]
  # Through a symlink on PATH (/usr/local/bin/healthcheck in an image), the same.
  ln -s "$TMP/env/bin/healthcheck" "$BIN/healthcheck"
  run -0 healthcheck serve
  [ "$output" = "py: -I -c $ENTRY serve" ]
  # HEALTHCHECK_PYTHON still wins; a record that names no interpreter is a usage error.
  stub other 'echo "other: $*"'
  HEALTHCHECK_PYTHON="$BIN/other" run -0 "$TMP/env/bin/healthcheck" --json
  [[ "$output" == "other: -I -c "* ]]
  printf 'garbage\n' >"$TMP/env/bin/healthcheck-probes"
  run -3 "$TMP/env/bin/healthcheck"
  [ "$output" = "healthcheck: no interpreter named in $TMP/env/bin/healthcheck-probes: reinstall gpu-healthcheck, or set HEALTHCHECK_PYTHON" ]
}

@test "installed in a path with spaces: the installer's /bin/sh form" {
  mkdir -p "$TMP/my env"
  printf '#!/usr/bin/env bash\necho "spaced: $*"\n' >"$TMP/my env/python"
  chmod +x "$TMP/my env/python"
  installed "$TMP/env/bin"
  # shellcheck disable=SC2016 # the installer's literal text
  printf '#!/bin/sh\n'"'''"'exec'"'"' "%s" "$0" "$@"\n'"' '''"'\n' "$TMP/my env/python" \
    >"$TMP/env/bin/healthcheck-probes"
  run -0 "$TMP/env/bin/healthcheck" --json
  [ "$output" = "spaced: -I -c $ENTRY --json" ]
}
