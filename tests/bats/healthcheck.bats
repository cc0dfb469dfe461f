#!/usr/bin/env bats
# The bash front door: help, interpreter lookup, the suite's verdict, hard deadline and
# exit-status mapping. The suite's interpreter is replaced by stub executables
# (HEALTHCHECK_PYTHON) that behave as the real one might: answer as the suite does under the
# front door (suite: exit 200 + its status, its hard deadline said on descriptor 3), or not (stub:
# an interpreter that is not the suite's); hang, ignore SIGTERM. Where the suite itself must act
# (a probe that signals it, a deadline from a profile), it is the real one.

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
  # What a real suite's run tells the person stays here, never in this machine's PID 1's stderr or /run.
  export HEALTHCHECK_NOTICE_FILE="$TMP/notice" _HEALTHCHECK_NOTICE_LOG="$TMP/pid1-stderr"
  # The suite's entry, as the front door passes it to the interpreter after -c.
  ENTRY='import gc, os, sys; gc.disable() # no collection pauses (probes.cli.entry: on again for serve)
sys.path[:0] = [home for home in [os.environ.pop("_HEALTHCHECK_HOME", "")] if home]
try: from probes.cli import entry
except ImportError: sys.exit(250)
entry(door=3)'
}

teardown() {
  pkill -KILL -f "$TMP/" 2>/dev/null || true
  rm -rf "$TMP"
}

# stub NAME BODY: an executable script in the stub bin dir
stub() {
  printf '#!/bin/bash\n%s\n' "$2" >"$BIN/$1"
  chmod +x "$BIN/$1"
}

# suite NAME BODY: a stand-in for the suite's interpreter that answers as probes/cli.py does
# under the front door: BODY, then `verdict N` exits 200 + N (0 after BODY); `deadline S` says
# its hard deadline S on descriptor 3.
suite() {
  stub "$1" 'verdict() { exit $((200 + $1)); }
deadline() { printf "%s\n" "$1" >&3; exec 3>&-; }
'"$2"'
verdict 0'
}

# real_suite: skip unless the .venv the real suite runs in is here
real_suite() {
  [ -x "$ROOT/.venv/bin/python" ] || skip "no .venv in $ROOT (run make install)"
  export ENABLE_GPU_CHECK=false ENABLE_TORCH_CHECK=false ENABLE_JUPYTER_CHECK=false ENABLE_SSH_CHECK=false
  export ENABLE_RUNTIME_CHECK=false HEALTHCHECK_STATE_DIR="$TMP/state" HEALTHCHECK_CHECKS_DIR="$TMP/checks"
  mkdir -p "$TMP/checks"
}

# dropin NAME BODY: a drop-in check in $TMP/checks (real_suite's HEALTHCHECK_CHECKS_DIR)
dropin() {
  printf '#!/bin/sh\n%s\n' "$2" >"$TMP/checks/$1"
  chmod 755 "$TMP/checks/$1"
}

@test "--help is the suite's: the usage, every probe and the exit status, exit 0" {
  run -0 "$ROOT/healthcheck" --help
  [[ "${lines[0]}" == "usage: healthcheck [--profile PROFILE]"* ]]
  [[ "$output" == *"probes (layer, toggle):"*"ssh (services, ENABLE_SSH_CHECK)"* ]]
  [[ "$output" == *"Exit status: 0 healthy, 1 unhealthy"* ]]
}

@test "arguments reach the suite's interpreter in isolated mode, the source tree beside it first" {
  suite py 'echo "args: $* home=${_HEALTHCHECK_HOME:-}"'
  # The source tree beside the front door (the image's byte-compiled copy) comes first, whatever the profile.
  for profile in liveness readiness startup; do
    HEALTHCHECK_PYTHON="$BIN/py" _HEALTHCHECK_HOME=/elsewhere run -0 "$ROOT/healthcheck" --profile "$profile" --json
    [ "$output" = "args: -I -c $ENTRY --profile $profile --json home=$ROOT" ]
  done
  # Without one (installed by pip), no other directory comes first: not even the caller's.
  cp "$ROOT/healthcheck" "$TMP/healthcheck"
  HEALTHCHECK_PYTHON="$BIN/py" _HEALTHCHECK_HOME=/elsewhere run -0 "$TMP/healthcheck" --profile liveness
  [ "$output" = "args: -I -c $ENTRY --profile liveness home=" ]
  # The real interpreter: liveness passes, and a refused port still lists what listens
  # (psutil, from site-packages).
  [ -x "$ROOT/.venv/bin/python" ] || skip "no .venv in $ROOT (run make install)"
  ENABLE_GPU_CHECK=false ENABLE_JUPYTER_CHECK=false HEALTHCHECK_SSH_PORT=2 HEALTHCHECK_STATE_DIR="$TMP/state" \
    run -1 "$ROOT/healthcheck" --profile liveness
  [[ "${lines[0]}" == "unhealthy: ssh: connection refused: nothing listening on 127.0.0.1:2 ("* ]]
}

@test "the suite's verdicts 0, 1 and 3 pass through" {
  for s in 0 1 3; do
    suite py "echo verdict-$s; verdict $s"
    HEALTHCHECK_PYTHON="$BIN/py" run "$ROOT/healthcheck"
    [ "$status" -eq "$s" ]
    [ "$output" = "verdict-$s" ]
  done
}

@test "exit status 2 (reserved by Docker) becomes 1" {
  suite py 'verdict 2'
  HEALTHCHECK_PYTHON="$BIN/py" run -1 "$ROOT/healthcheck"
  [[ "$output" == "unhealthy: healthcheck: the suite ended with status 2" ]]
}

@test "a crash by signal becomes 1 with a reason, however soon it comes" {
  # At once: bash may have reaped it before the front door waits; and a moment later.
  for body in 'kill -SEGV $$' 'sleep 0.2; kill -SEGV $$'; do
    suite py "$body"
    SECONDS=0
    HEALTHCHECK_PYTHON="$BIN/py" run -1 --separate-stderr "$ROOT/healthcheck"
    [ "$output" = "unhealthy: healthcheck: the suite ended with status 139 (killed by signal 11) before its verdict" ]
    [ "$stderr" = "" ] # not bash's own note on the job
    [ "$SECONDS" -le 1 ]
  done
}

@test "an interpreter that is not the suite's is one exit-3 line naming HEALTHCHECK_PYTHON" {
  mkdir "$TMP/a-directory"
  stub talks 'echo "usage: talks [-x]" >&2; echo "ImportError: no probes"; exit 1'
  stub silent 'exit 0'
  stub crafty 'echo "healthy: all fine"; exit 0'
  printf '#!%s\n' "$TMP/no-such-interpreter" >"$BIN/shebang"
  chmod +x "$BIN/shebang"
  # Nothing it says and no ordinary exit status (0 included) passes a run.
  for python in /bin/true /bin/false "$TMP/a-directory" "$TMP/missing" "$BIN/silent"; do
    SECONDS=0
    HEALTHCHECK_PYTHON="$python" run -3 --separate-stderr "$ROOT/healthcheck" --profile liveness
    [ "$output" = "" ]
    [ "${#stderr_lines[@]}" -eq 1 ]
    [[ "$stderr" == "healthcheck: HEALTHCHECK_PYTHON=$python "* ]]
    [[ "$stderr" == *"(accepted: the path of "* ]]
    [ "$SECONDS" -le 2 ]
  done
  HEALTHCHECK_PYTHON=/bin/true run -3 "$ROOT/healthcheck"
  [ "$output" = "healthcheck: HEALTHCHECK_PYTHON=/bin/true cannot run the suite (exit status 0) (accepted: the path of a python with the suite installed)" ]
  # What one says (or bash, about one it cannot start) is its own; the front door's line comes last.
  for python in /bin/sh "$BIN/talks" "$BIN/crafty" "$BIN/shebang"; do
    HEALTHCHECK_PYTHON="$python" run -3 --separate-stderr "$ROOT/healthcheck"
    [[ "${stderr_lines[-1]}" == "healthcheck: HEALTHCHECK_PYTHON=$python cannot run the suite (exit status "* ]]
  done
}

@test "a python without the suite is one exit-3 line, not a traceback" {
  local python
  python=$(command -v python3) || skip "no python3 on PATH"
  ! "$python" -I -c 'import probes' 2>/dev/null || python=/usr/bin/python3
  [ -x "$python" ] && ! "$python" -I -c 'import probes' 2>/dev/null || skip "every python3 here has the suite"
  cp "$ROOT/healthcheck" "$TMP/healthcheck" # no source tree beside it
  HEALTHCHECK_PYTHON="$python" run -3 --separate-stderr "$TMP/healthcheck"
  [ "$output" = "" ]
  [ "$stderr" = "healthcheck: HEALTHCHECK_PYTHON=$python cannot run the suite (it cannot import probes.cli) (accepted: the path of a python with the suite installed)" ]
}

@test "the front door starts with an empty or a hostile PATH" {
  suite py 'echo "ran with PATH=$PATH"'
  for tool in bash env timeout readlink sed sleep; do
    stub "$tool" "touch '$TMP/hijacked-by-$tool'; exit 0"
  done
  ln -s "$ROOT/healthcheck" "$TMP/linked"
  HEALTHCHECK_PYTHON="$BIN/py" PATH= run -0 "$ROOT/healthcheck"
  [ "$output" = "ran with PATH=" ]
  HEALTHCHECK_PYTHON="$BIN/py" PATH="$BIN" run -0 "$TMP/linked" --profile liveness
  [ "$output" = "ran with PATH=$BIN" ]
  PATH="$BIN" run -0 "$TMP/linked" --help # the .venv beside the link's target
  [[ "${lines[0]}" == "usage: healthcheck "* ]]
  run ls "$TMP"
  [[ "$output" != *hijacked* ]]
  # The real suite, with nothing on PATH at all (its probes find nothing there: they are off).
  real_suite
  command -p env -i PATH= ENABLE_GPU_CHECK=false ENABLE_TORCH_CHECK=false ENABLE_JUPYTER_CHECK=false ENABLE_SSH_CHECK=false \
    ENABLE_RUNTIME_CHECK=false HEALTHCHECK_STATE_DIR="$TMP/state" HEALTHCHECK_CHECKS_DIR="$TMP/checks" \
    "$ROOT/healthcheck" --profile liveness >"$TMP/out" 2>&1 || { cat "$TMP/out"; false; }
  [[ "$(cat "$TMP/out")" == "healthy: "* ]]
}

@test "a probe that signals the suite still leaves a verdict" {
  real_suite
  # A drop-in, and a stub nvidia-smi, that TERM, KILL or INT their parent (the suite).
  for signal in TERM KILL INT; do
    rm -f "$TMP/checks"/*
    dropin "sig-$signal" "kill -$signal \$PPID; sleep 5; echo late"
    run -1 "$ROOT/healthcheck"
    [ "${#lines[@]}" -ge 1 ]
    case "$signal" in
      TERM) [[ "${lines[0]}" == "unhealthy: healthcheck: the suite got SIGTERM before its verdict"* ]] ;;
      KILL) [ "${lines[0]}" = "unhealthy: healthcheck: the suite ended with status 137 (killed by signal 9) before its verdict" ] ;;
      INT) [ "${lines[0]}" = "unhealthy: healthcheck: interrupted (SIGINT) before a verdict" ] ;;
    esac
  done
  rm -f "$TMP/checks"/*
  stub nvidia-smi 'kill -TERM $PPID; sleep 5'
  ENABLE_GPU_CHECK=true run -1 "$ROOT/healthcheck" --only nvidia-smi
  [[ "${lines[0]}" == "unhealthy: healthcheck: the suite got SIGTERM before its verdict"* ]]
}

@test "a drop-in that stops the suite (SIGSTOP) is answered at the hard deadline" {
  real_suite
  dropin stopper 'kill -STOP $PPID; echo "stopped it"'
  SECONDS=0
  HEALTHCHECK_TIMEOUT=1 run -1 "$ROOT/healthcheck"
  # Continued and TERMed at 4 s (1 s + 3 s), the suite ends what it started and leaves the line to
  # the front door.
  [ "$output" = "unhealthy: healthcheck: no verdict within 4s (hard deadline): a probe is stuck; see HEALTHCHECK_LOG_FILE" ]
  [ "$SECONDS" -le 6 ]
}

@test "the hard deadline is the one the suite says for its settings" {
  real_suite
  # A hanging nvidia-smi: the suite's own deadline (4.5 s) answers; the front door's hard stop,
  # 4.5 s rounded up + 3 s as the suite said, is 8 s: 3 s of start-up bound and a sleep of 5 s.
  stub nvidia-smi 'exec sleep 300'
  SECONDS=0
  ENABLE_GPU_CHECK=true HEALTHCHECK_TIMEOUT=4.5 HEALTHCHECK_DEBUG=1 run -1 --separate-stderr \
    "$ROOT/healthcheck" --only nvidia-smi
  [[ "${lines[0]}" == "unhealthy: nvidia-smi: "*"deadline"* ]]
  [[ "$stderr" == *$'\n'"+ command -p sleep 5"$'\n'* ]]
  [ "$SECONDS" -le 7 ]
}

@test "a hung suite is stopped at the hard deadline it said, with exit 1 and one line" {
  suite py 'deadline 4; exec sleep 60'
  SECONDS=0
  HEALTHCHECK_PYTHON="$BIN/py" run -1 "$ROOT/healthcheck"
  [ "$output" = "unhealthy: healthcheck: no verdict within 4s (hard deadline): a probe is stuck; see HEALTHCHECK_LOG_FILE" ]
  [ "$SECONDS" -ge 4 ] && [ "$SECONDS" -le 6 ]
  ! pgrep -f "$BIN/py" >/dev/null
}

@test "an interpreter that says no deadline is stopped at the start-up bound (3 s)" {
  # Silent, or what it says is no deadline after 3 s (a word, a deadline shorter than the bound,
  # a part of a line).
  for body in 'exec sleep 60' 'deadline soon; exec sleep 60' 'deadline 2; exec sleep 60' \
    'printf 9 >&3; exec sleep 60'; do
    suite py "$body"
    SECONDS=0
    HEALTHCHECK_PYTHON="$BIN/py" run -1 "$ROOT/healthcheck"
    [[ "$output" == "unhealthy: healthcheck: no "* ]]
    [ "${#lines[@]}" -eq 1 ]
    [ "$SECONDS" -ge 3 ] && [ "$SECONDS" -le 6 ]
    ! pgrep -f "$BIN/py" >/dev/null
  done
  suite py 'exec sleep 60'
  HEALTHCHECK_PYTHON="$BIN/py" run -1 "$ROOT/healthcheck"
  [ "$output" = "unhealthy: healthcheck: no hard deadline from the suite within 3s: its interpreter is stuck" ]
}

@test "a suite that ignores SIGTERM is killed a second later, with what it started" {
  suite py "trap '' TERM; deadline 4; (exec -a '$TMP/child' sleep 60) & while :; do sleep 0.1; done"
  SECONDS=0
  HEALTHCHECK_PYTHON="$BIN/py" run -1 "$ROOT/healthcheck"
  [ "$SECONDS" -ge 5 ] && [ "$SECONDS" -le 7 ]
  [ "$output" = "unhealthy: healthcheck: no verdict within 4s (hard deadline): a probe is stuck; see HEALTHCHECK_LOG_FILE" ]
  sleep 0.2
  ! pgrep -f "$BIN/py" >/dev/null
  ! pgrep -f "$TMP/child" >/dev/null # in the suite's process group
}

@test "a 100,000-character setting is one bounded exit-3 line, read at once" {
  real_suite
  local padded
  printf -v padded '%100000s1' ''
  for var in HEALTHCHECK_TIMEOUT HEALTHCHECK_PROFILE; do
    SECONDS=0
    run -3 --separate-stderr env "$var=$padded" "$ROOT/healthcheck"
    [ "$SECONDS" -le 2 ]
    [ "${#stderr_lines[@]}" -eq 1 ]
    [ "${#stderr}" -lt 400 ]
    [[ "$stderr" == "healthcheck: $var='  "*"' is too long: 100001 characters (accepted: at most 4096)" ]]
  done
}

@test "serve runs without a deadline" {
  stub py 'echo "args: $*"'
  stub timeout 'echo "timeout must not be used"; exit 9'
  HEALTHCHECK_PYTHON="$BIN/py" run -0 "$ROOT/healthcheck" serve --port 1234
  [ "$output" = "args: -I -c $ENTRY serve --port 1234" ]
}

@test "a HEALTHCHECK_PYTHON that is not executable is a usage error" {
  HEALTHCHECK_PYTHON="$TMP/nope" run -3 "$ROOT/healthcheck"
  [ "$output" = "healthcheck: HEALTHCHECK_PYTHON=$TMP/nope is not an executable file (accepted: the path of the suite's python)" ]
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
  suite py 'echo "py: $*"; [ "${4:-}" != serve ] || exit 0'
  installed "$TMP/env/bin"
  printf '#!%s\n# -*- coding: utf-8 -*-\n' "$BIN/py" >"$TMP/env/bin/healthcheck-probes"
  run -0 "$TMP/env/bin/healthcheck" --profile liveness
  [ "$output" = "py: -I -c $ENTRY --profile liveness" ]
  # Through a symlink on PATH (/usr/local/bin/healthcheck in an image), the same.
  ln -s "$TMP/env/bin/healthcheck" "$BIN/healthcheck"
  run -0 healthcheck serve
  [ "$output" = "py: -I -c $ENTRY serve" ]
  # HEALTHCHECK_PYTHON still wins; a record that names no interpreter is a usage error.
  suite other 'echo "other: $*"'
  HEALTHCHECK_PYTHON="$BIN/other" run -0 "$TMP/env/bin/healthcheck" --json
  [[ "$output" == "other: -I -c "* ]]
  printf 'garbage\n' >"$TMP/env/bin/healthcheck-probes"
  run -3 "$TMP/env/bin/healthcheck"
  [ "$output" = "healthcheck: no interpreter named in $TMP/env/bin/healthcheck-probes: reinstall gpu-healthcheck, or set HEALTHCHECK_PYTHON" ]
}

@test "installed in a path with spaces: the installer's /bin/sh form" {
  mkdir -p "$TMP/my env"
  suite py 'echo "spaced: $*"'
  cp "$BIN/py" "$TMP/my env/python"
  installed "$TMP/env/bin"
  # shellcheck disable=SC2016 # the installer's literal text
  printf '#!/bin/sh\n'"'''"'exec'"'"' "%s" "$0" "$@"\n'"' '''"'\n' "$TMP/my env/python" \
    >"$TMP/env/bin/healthcheck-probes"
  run -0 "$TMP/env/bin/healthcheck" --json
  [ "$output" = "spaced: -I -c $ENTRY --json" ]
}

# The runtime the front door lives in: wall-clock steps, children that write into its pipes,
# signals, readers that went away, low limits.

# bare CMD...: CMD with stdin, stdout and stderr only, as a runtime starts it (bats holds more
# descriptors, which its children inherit)
bare() {
  # shellcheck disable=SC2016 # run by bash -c
  bash -c 'for fd in /proc/$$/fd/*; do fd=${fd##*/}; [ "$fd" -le 2 ] || eval "exec $fd>&-"; done; exec "$@"' - "$@"
}

# clock_step: tests/fakes/clock_step.c (a wall-clock step for LD_PRELOAD) built into $TMP
clock_step() {
  command -v cc >/dev/null || skip "no C compiler to build tests/fakes/clock_step.c"
  cc -O2 -shared -fPIC -o "$TMP/clock_step.so" "$ROOT/tests/fakes/clock_step.c"
}

# stepping_suite ACTION: $BIN/py, a suite that says its hard deadline (5 s), steps the wall
# clock (creates $TMP/step, see clock_step), runs ACTION and answers healthy.
stepping_suite() {
  suite py "deadline 5; touch '$TMP/step'; $1; echo 'healthy: after the step'"
}

@test "a wall-clock step forward mid-run does not cut the run at a hard deadline" {
  clock_step
  # An hour forward (NTP, a VM resume) once the suite has started, past the start-up bound (3 s)
  # and into the rest of its deadline: its healthy verdict stands.
  stepping_suite 'sleep 3.5'
  LD_PRELOAD="$TMP/clock_step.so" CLOCK_STEP_FILE="$TMP/step" CLOCK_STEP_SECONDS=3600 \
    HEALTHCHECK_PYTHON="$BIN/py" run -0 "$ROOT/healthcheck"
  [ "$output" = "healthy: after the step" ]
}

@test "a wall-clock step back mid-run still ends a stopped suite at its hard deadline" {
  clock_step
  # An hour back, and the suite stops itself: continued and TERMed at 5 s, as it said.
  stepping_suite 'kill -STOP $$'
  SECONDS=0
  LD_PRELOAD="$TMP/clock_step.so" CLOCK_STEP_FILE="$TMP/step" CLOCK_STEP_SECONDS=-3600 \
    HEALTHCHECK_PYTHON="$BIN/py" run -1 timeout 20 "$ROOT/healthcheck"
  [ "$output" = "unhealthy: healthcheck: no verdict within 5s (hard deadline): a probe is stuck; see HEALTHCHECK_LOG_FILE" ]
  [ "$SECONDS" -ge 5 ] && [ "$SECONDS" -le 7 ]
  ! pgrep -f "$BIN/py" >/dev/null
}

@test "a drop-in that writes into the suite's and the front door's pipes cannot pass the run" {
  real_suite
  # It fails (exit 2), then writes deadlines and exit statuses into every pipe that the suite and
  # the front door's processes hold (but their stdout and stderr), as any process of the same user
  # can through /proc.
  # shellcheck disable=SC2016 # the drop-in's own text
  dropin forger 'echo "forged: this check fails"
forge() {
  for fd in /proc/$1/fd/*; do
    case ${fd##*/} in 0 | 1 | 2) continue ;; esac
    [ -p "$fd" ] || continue
    if [ "$fd" -ef "/proc/$1/fd/1" ] || [ "$fd" -ef "/proc/$1/fd/2" ]; then continue; fi
    printf "0\n200\n60\n" 2>/dev/null >"$fd" || true
  done
}
parent() { read -r stat <"/proc/$1/stat"; set -- ${stat##*") "}; pid=$2; }
forge "$PPID"
parent "$PPID"
while tr "\\0" "\\n" <"/proc/$pid/cmdline" | grep -qx ".*/healthcheck"; do
  forge "$pid"
  parent "$pid"
done
exit 2'
  run -1 bare "$ROOT/healthcheck"
  [[ "${lines[0]}" == "unhealthy: forger: "* ]]
}

@test "a reader that went away costs the front door its own line, never its exit status" {
  # A pipe whose reader has already ended: the front door's own lines after a suite that ended
  # without its verdict (stdout), about an interpreter that is not the suite's (stderr, exit 3),
  # and its help text. SIGPIPE as a caller leaves it (bats ignores it).
  # shellcheck disable=SC2016 # run by bash -c
  local gone='exec {w}> >(:); wait "$!"; env --default-signal=PIPE "$@" 1>&"$w" 2>&"$w"; echo "status $?"'
  suite py 'verdict 2'
  HEALTHCHECK_PYTHON="$BIN/py" run -0 --separate-stderr bash -c "$gone" - "$ROOT/healthcheck"
  [ "$output" = "status 1" ]
  [ "$stderr" = "" ]
  stub silent 'exit 0'
  HEALTHCHECK_PYTHON="$BIN/silent" run -0 --separate-stderr bash -c "$gone" - "$ROOT/healthcheck"
  [ "$output" = "status 3" ]
  [ "$stderr" = "" ]
  run -0 --separate-stderr bash -c "$gone" - "$ROOT/healthcheck" --help
  [ "$output" = "status 0" ]
  [ "$stderr" = "" ]
}

@test "SIGTERM, SIGINT or SIGHUP to the front door ends the suite, with one line" {
  suite py "touch '$TMP/started'; while :; do sleep 0.1; done"
  local signal pid status
  for signal in TERM INT HUP; do
    rm -f "$TMP/started"
    # As a supervisor starts it: no signal ignored. A background job here has SIGINT ignored, and
    # whatever started the tests may ignore SIGHUP (nohup, a detached job): a signal ignored on
    # entry cannot be trapped by bash, and the front door would then run to its hard deadline.
    HEALTHCHECK_PYTHON="$BIN/py" env --default-signal=TERM,INT,HUP "$ROOT/healthcheck" >"$TMP/out" 2>"$TMP/err" 3>&- &
    pid=$!
    SECONDS=0
    until [ -e "$TMP/started" ] || [ "$SECONDS" -gt 10 ]; do sleep 0.05; done
    kill -"$signal" "$pid"
    status=0
    wait "$pid" || status=$?
    [ "$status" -eq 1 ]
    [ "$(cat "$TMP/out")" = "unhealthy: healthcheck: stopped by SIG$signal before the verdict" ]
    [ ! -s "$TMP/err" ]
    ! pgrep -f "$BIN/py" >/dev/null
  done
}

@test "a very low open-file limit is one line, at once" {
  suite py 'echo "healthy: ran"'
  # shellcheck disable=SC2016 # run by bash -c
  local n limited='ulimit -n "$1" && exec "$2"'
  # bash's own error (it names its descriptors from 10 up), or the suite's answer: one line.
  for n in 5 6 8 10 11 12 13 16; do
    SECONDS=0
    HEALTHCHECK_PYTHON="$BIN/py" run --separate-stderr bare bash -c "$limited" - "$n" "$ROOT/healthcheck"
    [ "${#lines[@]}" -eq 1 ]
    [[ "$status" = 1 && "$output" == "unhealthy: healthcheck: bash failed (status "* ]] ||
      [[ "$status" = 0 && "$output" == "healthy: ran" ]]
    [ "$SECONDS" -le 2 ]
  done
  [ "$output" = "healthy: ran" ] # 16
}

@test "a fork that fails for good (the process limit) is still one line and exit 1" {
  [ "$(id -u)" = 0 ] || skip "needs root to run as another user (root itself ignores RLIMIT_NPROC)"
  command -v setpriv >/dev/null && command -v prlimit >/dev/null || skip "no setpriv or prlimit"
  suite py 'echo "healthy: ran"'
  cp "$ROOT/healthcheck" "$TMP/healthcheck"
  chmod -R a+rX "$TMP"
  # A user of its own: the kernel counts each user's processes across the whole machine. The
  # front door's first fork fails, and bash gives up after its retries.
  local uid=$((40000 + $$ % 20000))
  HEALTHCHECK_PYTHON="$BIN/py" run -1 --separate-stderr \
    setpriv --reuid "$uid" --regid "$uid" --clear-groups prlimit --nproc=1 "$TMP/healthcheck"
  [ "$output" = "unhealthy: healthcheck: bash failed (status 254; its message is on stderr) before the verdict" ]
  [[ "$stderr" == *"fork: Resource temporarily unavailable" ]]
  # Three are enough: the front door, its sleep and the suite.
  HEALTHCHECK_PYTHON="$BIN/py" run -0 setpriv --reuid "$uid" --regid "$uid" --clear-groups prlimit --nproc=3 "$TMP/healthcheck"
  [ "$output" = "healthy: ran" ]
}

@test "a suite that has ended before the front door first looks still gives its exit status" {
  # bash may reap the suite before the front door first waits for it (a busy machine; the trace
  # of HEALTHCHECK_DEBUG slows the front door), and for a crash it may drop the job (`wait -n`
  # then knows it no more). Four at once, 40 runs each of either.
  local j body
  for body in 'echo "healthy: ran"' 'kill -SEGV $$'; do
    suite py "$body"
    for j in 1 2 3 4; do
      (
        for _ in $(seq 40); do
          out=$(HEALTHCHECK_DEBUG=1 HEALTHCHECK_PYTHON="$BIN/py" "$ROOT/healthcheck" 2>/dev/null) || true
          [[ "$out" == "healthy: ran" || "$out" == *"(killed by signal 11) before its verdict" ]] || echo "$out" >>"$TMP/wrong"
        done
      ) &
    done
    wait
  done
  [ ! -e "$TMP/wrong" ] || { head -3 "$TMP/wrong"; false; }
}
