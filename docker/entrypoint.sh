#!/usr/bin/env bash
# Summary: start sshd and Jupyter (and healthcheck serve when asked) in the GPU dev image, and stop them cleanly
#
# Usage: gpu-dev-entrypoint [COMMAND [ARG...]]
#   With a command, run it instead (`docker run -it IMAGE bash`). Its environment: docs/image.md.
set -euo pipefail

log() { echo "entrypoint: $*" >&2; }

abort() {
  log "$*"
  exit 1
}

[ "$#" -eq 0 ] || exec "$@"

# The suite's boolean grammar (probes/config.py): anything else is a configuration error.
case "$(printf '%s' "${HEALTHCHECK_SERVE:-false}" | tr '[:upper:]' '[:lower:]')" in
  1 | true | yes | on) serve=1 ;;
  0 | false | no | off | "") serve= ;;
  *) abort "HEALTHCHECK_SERVE=${HEALTHCHECK_SERVE:0:40}: expected true or false (1/0, yes/no, on/off)" ;;
esac

runtime_dir=${JUPYTER_RUNTIME_DIR:-/run/jupyter}
port=${JUPYTER_PORT:-8888}
ssh=1
if [ "$(id -u)" -ne 0 ]; then
  # An arbitrary UID (OpenShift; docker run --user), maybe without a passwd entry: Jupyter runs as it.
  ssh=
  user=$(id -u)
  group=$(id -g)
  home=${HOME:-/}
  log "running as uid $user (not root): sshd is not started (it needs root); set ENABLE_SSH_CHECK=false"
else
  user=${DEV_USER:-dev}
  home=$(getent passwd "$user" | cut -d: -f6) || abort "user '$user' does not exist: set DEV_USER to an existing user"
  group=$(id -gn "$user")
fi

# --- SSH -----------------------------------------------------------------------------------
sshd_args=()
setup_ssh() {
  install -d -m 0755 /run/sshd || abort "cannot create /run/sshd: a read-only root needs a writable /run (docker run --tmpfs /run)"
  # Host keys belong to the container, not the image: two containers never share them. (ssh-keygen
  # -A exits 0 even when it could not write a key: what it left is checked.)
  local keys_dir=/etc/ssh key
  if [ -w /etc/ssh ]; then
    ssh-keygen -A >/dev/null
  else
    keys_dir=/run/ssh-host-keys/etc/ssh
    install -d -m 0700 "$keys_dir"
    ssh-keygen -A -f /run/ssh-host-keys >/dev/null
    for key in "$keys_dir"/ssh_host_*_key; do
      sshd_args+=(-o "HostKey=$key")
    done
    log "ssh: read-only /etc/ssh: host keys made in /run/ssh-host-keys"
  fi
  [ -s "$keys_dir/ssh_host_ed25519_key" ] || abort "cannot make this container's SSH host keys in $keys_dir"

  local keys_file=${SSH_AUTHORIZED_KEYS_FILE:-/run/secrets/authorized_keys} keys
  keys=$(
    [ -r "$keys_file" ] && cat "$keys_file"
    [ -n "${SSH_AUTHORIZED_KEYS:-}" ] && printf '%s\n' "$SSH_AUTHORIZED_KEYS"
    true
  )
  if [ -n "$keys" ]; then
    install -d -m 0700 -o "$user" -g "$group" "$home/.ssh" \
      || abort "cannot write $home/.ssh for the SSH keys: on a read-only root, mount a volume at $home"
    printf '%s\n' "$keys" | install -m 0600 -o "$user" -g "$group" /dev/stdin "$home/.ssh/authorized_keys.new"
    mv -f "$home/.ssh/authorized_keys.new" "$home/.ssh/authorized_keys"
    log "ssh: $(grep -c -v -e '^#' -e '^$' "$home/.ssh/authorized_keys" || true) authorized key(s) for $user"
  else
    log "ssh: no authorized keys given (SSH_AUTHORIZED_KEYS or $keys_file): nobody can log in"
  fi

  # The health check's own SSH login: docs/image.md, "The SSH probe principal".
  local probe_key=${HEALTHCHECK_SSH_PROBE_KEY:-} probe_user probe_home=/run/healthcheck-ssh-home
  if [ -n "$probe_key" ]; then
    probe_user=${HEALTHCHECK_SSH_PROBE_USER:-healthcheck}
    if ! getent passwd "$probe_user" >/dev/null; then
      useradd --system --no-create-home --home-dir "$probe_home" --shell /bin/sh --password '*' "$probe_user" ||
        abort "cannot create the SSH probe user '$probe_user' (on a read-only root the image must have it)"
    fi
    [ "$(getent passwd "$probe_user" | cut -d: -f6)" = "$probe_home" ] ||
      abort "user '$probe_user' exists and is not the SSH probe principal (home $probe_home): set HEALTHCHECK_SSH_PROBE_USER to another name"
    install -d -m 0755 -o root -g root "$probe_home" "$probe_home/.ssh"
    [ -d "$(dirname "$probe_key")" ] || install -d -m 0700 -o root -g root "$(dirname "$probe_key")"
    rm -f "$probe_key" "$probe_key.pub"
    (umask 077 && ssh-keygen -q -t ed25519 -N '' -C healthcheck-probe -f "$probe_key" </dev/null >/dev/null) ||
      abort "cannot make the SSH probe key $probe_key"
    printf 'restrict,from="127.0.0.1,::1",command="/bin/true" %s\n' "$(cut -d' ' -f1,2 "$probe_key.pub")" |
      install -m 0644 /dev/stdin "$probe_home/.ssh/authorized_keys.new"
    mv -f "$probe_home/.ssh/authorized_keys.new" "$probe_home/.ssh/authorized_keys"
    rm -f "$probe_key.pub"
    log "ssh: probe key made for $probe_user (loopback only, forced /bin/true)"
  fi

  # Loopback exemption from OpenSSH 9.8+ penalties, only where this sshd knows the option.
  local piece=/etc/ssh/gpu-dev/penalty-exempt.conf
  if [ -r "$piece" ] && /usr/sbin/sshd -T -f "$piece" >/dev/null 2>&1; then
    cp "$piece" /etc/ssh/sshd_config.d/20-penalty-exempt.conf \
      || log "ssh: read-only /etc/ssh: loopback is not exempt from sshd's penalties"
  else
    rm -f /etc/ssh/sshd_config.d/20-penalty-exempt.conf
  fi
  /usr/sbin/sshd -t "${sshd_args[@]}" || abort "sshd refuses its configuration: see the line above"
}
[ -z "$ssh" ] || setup_ssh

# --- Jupyter -------------------------------------------------------------------------------
if [ -n "$ssh" ]; then
  install -d -m 0700 -o "$user" -g "$group" "$runtime_dir"
else
  [ -d "$runtime_dir" ] || mkdir -m 0700 "$runtime_dir"
fi \
  || abort "cannot create $runtime_dir: give the container a writable /run (docker run --tmpfs /run)"
# A server killed without cleanup leaves its runtime file: the health check must see the live one's.
rm -f "$runtime_dir"/jpserver-*.json "$runtime_dir"/jpserver-*.html

if [ -z "${JUPYTER_TOKEN:-}" ]; then
  JUPYTER_TOKEN=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
  log "jupyter: generated a token; read it with: docker exec <container> cat $runtime_dir/token"
fi
(umask 077 && printf '%s\n' "$JUPYTER_TOKEN" >"$runtime_dir/token")
[ -z "$ssh" ] || chown "$user:$group" "$runtime_dir/token"
export JUPYTER_TOKEN

# --- Run them all, stop them all ---------------------------------------------------------------
declare -A names=() # pid -> service, while it runs

# shellcheck disable=SC2329  # invoked through the trap below
stop() {
  trap - TERM INT
  log "stopping ${ssh:+sshd, }jupyter${serve:+ and healthcheck serve}"
  kill -TERM "${!names[@]}" 2>/dev/null || true
  wait || true
  exit 0
}
trap stop TERM INT

if [ -n "$ssh" ]; then
  /usr/sbin/sshd -D -e "${sshd_args[@]}" &
  names[$!]=sshd
  log "sshd started (pid $!)"
fi

# The token travels in the environment (not argv, which `ps` shows to everyone).
jupyter_argv=(jupyter lab --no-browser --ip=0.0.0.0 --port="$port" --ServerApp.port_retries=0
  --ServerApp.root_dir="$home")
(
  cd "$home"
  [ -n "$ssh" ] || exec "${jupyter_argv[@]}" # already the user it runs as
  exec setpriv --reuid="$user" --regid="$group" --init-groups \
    env HOME="$home" USER="$user" LOGNAME="$user" SHELL=/bin/bash "${jupyter_argv[@]}"
) &
names[$!]=jupyter
log "jupyter lab started as $user on port $port (pid $!)"

# serve runs as root like the exec probes (it reads Jupyter's runtime dir and ends what its runs
# leave behind); if it ends, /livez stops answering and the kubelet restarts the container.
if [ -n "$serve" ]; then
  healthcheck serve &
  names[$!]="healthcheck serve"
  log "healthcheck serve started (pid $!)"
fi

# A service that ends is reported by the health check (the container becomes unhealthy)
# rather than stopping the container; the entrypoint ends when all have ended.
while [ "${#names[@]}" -gt 0 ]; do
  ended='' status=0
  wait -n -p ended "${!names[@]}" || status=$?
  [ -n "$ended" ] || break
  log "${names[$ended]} (pid $ended) ended with status $status; the health check will report it"
  unset "names[$ended]"
done
abort "${ssh:+sshd, }jupyter${serve:+ and healthcheck serve} have all ended"
