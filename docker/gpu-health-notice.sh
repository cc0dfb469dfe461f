# shellcheck shell=bash
# Summary: at an interactive login, the health check's notice when the container is not healthy
# (/etc/profile.d/gpu-health-notice.sh; its rules: docs/image.md, "Notices")
[ -n "${BASH_VERSION:-}" ] || return 0
case $- in *i*) ;; *) return 0 ;; esac

__gpu_health_notice() {
  local f=${HEALTHCHECK_NOTICE_FILE:-/run/healthcheck-notice/notice} IFS=$' \t\n'
  local info t ttl state when l1 l2 now age ago
  case ${HEALTHCHECK_NOTICES:-} in
    [Ff][Aa][Ll][Ss][Ee] | 0 | [Nn][Oo] | [Oo][Ff][Ff]) return 0 ;;
  esac
  [[ $f == /* && -f $f && ! -L $f ]] || return 0
  # Owner, mode (hex) and size of the directory, then of the file: never follow a link, never
  # open what could block (a FIFO swapped in needs a directory another user can write).
  info=$(LC_ALL=C stat -c '%u %f %s' -- "${f%/*}/" "$f" 2>/dev/null) || return 0
  # shellcheck disable=SC2086  # stat's output: six numbers, split on purpose
  set -- $info
  [[ $# -eq 6 && "$2$5" != *[!0-9a-f]* && "$1$3$4$6" != *[!0-9]* ]] || return 0
  [[ ($1 -eq 0 || $1 -eq $EUID) && ($4 -eq 0 || $4 -eq $EUID) ]] || return 0
  (((16#$2 & 8#170000) == 8#40000 && ((16#$2 & 8#22) == 0 || (16#$2 & 8#1000) != 0))) || return 0
  (((16#$5 & 8#170000) == 8#100000 && ${#6} < 6 && 10#$6 <= 4096)) || return 0
  { read -r t ttl state when && IFS= read -r l1 && IFS= read -r l2; } <"$f" 2>/dev/null
  [[ -n $t && -n $ttl && "$t$ttl" != *[!0-9]* && ${#t} -le 12 && ${#ttl} -le 12 ]] || return 0
  [[ $state == healthy || $state == starting || $state == unhealthy ]] || return 0
  when=${when//[[:cntrl:]]/} l1=${l1//[[:cntrl:]]/} l2=${l2//[[:cntrl:]]/}
  when=${when:0:300} l1=${l1:0:300} l2=${l2:0:300}
  printf -v now '%(%s)T' -1
  age=$((now - 10#$t))
  ((age >= 0)) || age=0
  ago="$age s ago"
  ((age < 120)) || ago="$((age / 60)) min ago"
  ((age < 7200)) || ago="$((age / 3600)) h ago"
  [[ $state == unhealthy && -n $l1 ]] || l1='' l2=''
  if ((age > 10#$ttl)); then
    printf 'gpu-health: not checked since %s (%s); last verdict: %s\n' "$when" "$ago" "${l1:-$state}" >&2
  elif [[ -n $l1 ]]; then
    printf 'gpu-health: %s (checked %s)\n' "$l1" "$ago" >&2
  fi
  [[ -z $l2 ]] || printf 'gpu-health: %s\n' "$l2" >&2
  return 0
}
__gpu_health_notice || true
unset -f __gpu_health_notice
