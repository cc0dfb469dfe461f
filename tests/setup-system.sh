#!/usr/bin/env bash
# Summary: install the Debian packages the tests need (sshd for the service tests, a
# C compiler for the fake NVML library, GNU parallel for bats --jobs, debootstrap for the
# end-to-end base image, Prometheus with promtool and Alertmanager for the alerting rules'
# tests, localedef and the charmaps for the Latin-1 locale test).
# Usage: bash tests/setup-system.sh   (as root; otherwise it only lists what is missing)
set -euo pipefail
[ -n "${HEALTHCHECK_DEBUG:-}" ] && set -x

packages=(openssh-server openssh-client openssl gcc make libc6-dev procps parallel debootstrap
  ca-certificates prometheus prometheus-alertmanager locales)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "setup-system: missing packages: ${missing[*]} (install them as root; tests that need them skip)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# Installing prometheus or prometheus-alertmanager starts its system service, listening on
# every address; the tests start their own on loopback. Keep services from starting unless
# the machine already has its own policy.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
