#!/usr/bin/env bash
# Summary: make a Docker engine (25+) answer on this machine, installing and starting one if needed
# Usage: bash tests/e2e/engine.sh
#
# If `docker info` already answers, nothing is done. Otherwise, as root, Debian trixie's docker.io,
# docker-cli and containerd (26.x) are downloaded through a private apt state directory (the host's
# own sources stay untouched) from the Debian mirror those sources already use (debian-mirror.sh;
# E2E_TRIXIE_MIRROR overrides it) and installed together with the host's runc, tini and iptables, then
# dockerd is started in the background and we wait for its socket. Engine 25+ is needed because the
# image's HEALTHCHECK uses --start-interval.
set -euo pipefail
[ -n "${E2E_DEBUG:-}" ] && set -x

abort() {
  echo "engine.sh: $*" >&2
  exit 1
}

STATE_DIR="${E2E_APT_DIR:-/var/cache/gpu-dev-e2e/apt}"
DOCKERD_LOG="${E2E_DOCKERD_LOG:-/var/log/gpu-dev-e2e-dockerd.log}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MIN_MAJOR=25

engine_answers() {
  docker info >/dev/null 2>&1
}

dockerd_major() {
  local v
  v="$(dockerd --version 2>/dev/null | sed -nE 's/^Docker version ([0-9]+)\..*/\1/p')"
  echo "${v:-0}"
}

install_engine() {
  [ "$(id -u)" -eq 0 ] || abort "no Docker engine answers and we are not root: start dockerd (25+) or run as root"
  command -v apt-get >/dev/null || abort "apt-get not found: install Docker Engine 25+ by hand"
  local apt_opts debs mirror
  mirror="${E2E_TRIXIE_MIRROR:-}"
  [ -n "$mirror" ] || mirror="$(bash "$HERE/debian-mirror.sh")" \
    || abort "no Debian mirror in this machine's apt sources: set E2E_TRIXIE_MIRROR"
  mkdir -p "$STATE_DIR/lists/partial" "$STATE_DIR/cache/archives/partial" "$STATE_DIR/debs"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" \
    >"$STATE_DIR/trixie.list"
  apt_opts=(-o "Dir::Etc::SourceList=$STATE_DIR/trixie.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$STATE_DIR/lists" -o "Dir::Cache=$STATE_DIR/cache")
  echo "engine.sh: installing Docker Engine 26.x from Debian trixie ($mirror)" >&2
  apt-get -qq "${apt_opts[@]}" update
  rm -f "$STATE_DIR"/debs/*.deb
  (cd "$STATE_DIR/debs" && apt-get -qq "${apt_opts[@]}" -o APT::Sandbox::User=root download docker.io docker-cli containerd)
  debs=("$STATE_DIR"/debs/*.deb)
  [ -e "${debs[0]}" ] || abort "apt-get download fetched nothing: check access to $mirror"
  # The host's lists are needed for runc, tini and iptables (bookworm versions satisfy the .debs).
  apt-get -qq update
  DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends \
    runc tini iptables ca-certificates "${debs[@]}" >/dev/null
}

start_engine() {
  # A socket file left by a dockerd that died would make us wait for nothing.
  if [ -S /var/run/docker.sock ] && ! pgrep -x dockerd >/dev/null; then
    rm -f /var/run/docker.sock
  fi
  if ! pgrep -x dockerd >/dev/null; then
    echo "engine.sh: starting dockerd (log: $DOCKERD_LOG)" >&2
    # The legacy iptables backend works where nftables kernel support is missing.
    if command -v update-alternatives >/dev/null && [ -x /usr/sbin/iptables-legacy ] \
      && ! iptables -L >/dev/null 2>&1; then
      update-alternatives --set iptables /usr/sbin/iptables-legacy >/dev/null || true
    fi
    # Only stdin, stdout and stderr: under `flock /tmp/docker.lock make e2e` an inherited lock
    # descriptor would keep the lock held for as long as dockerd lives, and nobody would get it again.
    (
      for fd in /proc/self/fd/*; do
        fd=${fd##*/}
        if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
      done
      exec nohup dockerd >"$DOCKERD_LOG" 2>&1 </dev/null
    ) &
    disown || true
  fi
  for _ in $(seq 1 120); do
    engine_answers && return 0
    pgrep -x dockerd >/dev/null || break
    sleep 0.5
  done
  tail -n 20 "$DOCKERD_LOG" >&2 || true
  abort "dockerd did not answer within 60 s: see $DOCKERD_LOG"
}

if engine_answers; then
  server="$(docker version --format '{{.Server.Version}}' 2>/dev/null || echo 0)"
  [ "${server%%.*}" -ge "$MIN_MAJOR" ] 2>/dev/null \
    || abort "Docker Engine $server answers but $MIN_MAJOR+ is needed (HEALTHCHECK --start-interval): upgrade it"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  abort "no Docker engine answers and we are not root: start dockerd (25+) or run as root"
fi
if ! command -v dockerd >/dev/null || [ "$(dockerd_major)" -lt "$MIN_MAJOR" ]; then
  install_engine
fi
[ "$(dockerd_major)" -ge "$MIN_MAJOR" ] || abort "dockerd $(dockerd_major).x is too old: Engine $MIN_MAJOR+ is needed for --start-interval"
start_engine
docker version --format 'engine.sh: Docker Engine {{.Server.Version}} answers' >&2
