"""The services layer: Jupyter Server and sshd, judged by their protocols. Its declarations live here
(each probe's ``Spec``, causes and settings; ``SPECS``): every run reads them, so only ``probes.spec``
is imported here; a probe's module is imported when the probe runs (``Spec.load``)."""

from __future__ import annotations

from probes import spec
from probes.spec import ABSOLUTE_PATH, ALL_PROFILES, BOOL, NUMBER, PORT, TEXT, URL_PATH, Spec, cause, setting

CONNECT_TIMEOUT = cause("connect-timeout", "connection not accepted before the deadline (accept queue full)",
                        "the server is hung or its accept queue is full: restart it",
                        action="restart-app", actor="tenant")
UNREACHABLE = cause("unreachable", "host does not resolve or cannot be reached",
                    "check `HEALTHCHECK_HOST` (an address such as `127.0.0.1`)", action="fix-config",
                    actor="tenant")
# ssh and ssh-login: sshd took the connection but did not finish its part in time.
SSHD_STUCK = cause("deadline", "sshd gave no complete answer before the deadline "
                               "(a banner cut short, a stall in key exchange, a hung session)",
                   "sshd is overloaded or stuck: restart it", action="restart-app", actor="tenant")


# ---------------------------------------------------------------- jupyter (probes/services/jupyter.py)
class JupyterSettings(spec.Declared):
    jupyter_port: int = setting("HEALTHCHECK_JUPYTER_PORT", PORT, 8888, "Jupyter Server port")
    jupyter_base_url: str = setting("HEALTHCHECK_JUPYTER_BASE_URL", URL_PATH, "/",
                                    "Jupyter base URL, when no trusted runtime file says otherwise")
    jupyter_tls: bool = setting("HEALTHCHECK_JUPYTER_TLS", BOOL, False,
                                "Jupyter serves HTTPS, when no trusted runtime file says otherwise")
    jupyter_runtime_dir: str | None = setting(
        "HEALTHCHECK_JUPYTER_RUNTIME_DIR", TEXT, None,
        "where `jpserver-*.json` files are looked for (see \"What is trusted in the runtime directory\")",
        shown_default="`$JUPYTER_RUNTIME_DIR`, else `~/.local/share/jupyter/runtime`")
    jupyter_token_file: str | None = setting(
        "HEALTHCHECK_JUPYTER_TOKEN_FILE", ABSOLUTE_PATH, None,
        "a file holding the server's token, for when no trusted runtime file gives it; its owner is "
        "whose server the port must be (see \"What is trusted in the runtime directory\"), "
        "and `jupyter-kernel` sends the token only to that user's listener", shown_default="none")


# Jupyter Server is the tenant's own service: restarting it, or setting the probe right, is theirs.
JUPYTER_REFUSED = cause(
    "refused", "nothing listening (the message lists what is, and names a refused runtime file and why)",
    "start Jupyter or set `HEALTHCHECK_JUPYTER_PORT` to its port; remove stale `jpserver-*.json`",
    action="restart-app", actor="tenant")
JUPYTER_STUCK = "Jupyter is hung or overloaded: restart it and check its log"
JUPYTER_HUNG = cause("hung", "accepted but no answer to `GET {base_url}api` before the deadline",
                     JUPYTER_STUCK, action="restart-app", actor="tenant")
JUPYTER_DEADLINE = cause("deadline", "answer incomplete at the deadline", JUPYTER_STUCK, action="restart-app",
                         actor="tenant")
NOT_JUPYTER = cause(
    "not-jupyter", "answered, but not 200 with a JSON `version` "
    "(404 = wrong base URL, 403 = Host check, 3xx/401 = proxy or login page), "
    "not HTTP at all, or a reply over 144 KiB or with more than 1024 chunks",
    "check `HEALTHCHECK_JUPYTER_PORT`, `HEALTHCHECK_JUPYTER_BASE_URL` (Jupyter's `ServerApp.base_url`) "
    "and the server's log; probe Jupyter itself via `127.0.0.1` (or set `ServerApp.allow_remote_access`)",
    action="fix-config", actor="tenant")
# Another uid's listener where the notebook user's server should be: a program of the tenant's
# container or pod (a host-network neighbour too) took the port, most often while Jupyter was down.
JUPYTER_IMPOSTOR = cause(
    "impostor", "the port is held by another uid than the owner of the token file "
    "(`HEALTHCHECK_JUPYTER_TOKEN_FILE`), Jupyter's user: a stand-in would answer for Jupyter, "
    "so nothing is sent to it",
    "stop what holds the port (`ss -ltne` shows its uid) and restart Jupyter, or set "
    "`HEALTHCHECK_JUPYTER_PORT` to Jupyter's; the token file must be Jupyter's user's",
    action="fix-config", actor="tenant")
JUPYTER_HTTP_ERROR = cause("http-error", "HTTP 5xx", "Jupyter is failing: see its log", action="restart-app",
                           actor="tenant")
JUPYTER_TLS_MISMATCH = cause(
    "tls-mismatch", "plain HTTP sent to a TLS server, or HTTPS to a plain one",
    "set `HEALTHCHECK_JUPYTER_TLS=true` for a server with `ServerApp.certfile`, `false` for one without, "
    "or point `HEALTHCHECK_JUPYTER_RUNTIME_DIR` at the server's runtime directory; "
    "remove stale `jpserver-*.json`", action="fix-config", actor="tenant")
JUPYTER_TLS_ERROR = cause(
    "tls-error", "TLS handshake failed, or certificate not trusted (off loopback)",
    "check `ServerApp.certfile` and `keyfile`, and that Jupyter holds the port; "
    "probe over loopback (`HEALTHCHECK_HOST=127.0.0.1`), where a self-signed certificate is accepted",
    action="fix-config", actor="tenant")

JUPYTER_SPEC = Spec(
    "jupyter", layer="services", module=f"{__name__}.jupyter", toggle="ENABLE_JUPYTER_CHECK", timeout=3.0,
    profiles=ALL_PROFILES, measurement="responseTime",
    about="Jupyter Server answers `GET {base_url}api` with its version", settings=JupyterSettings.SETTINGS,
    causes=(JUPYTER_REFUSED, JUPYTER_IMPOSTOR, JUPYTER_HUNG, JUPYTER_DEADLINE, NOT_JUPYTER,
            JUPYTER_HTTP_ERROR, JUPYTER_TLS_MISMATCH, JUPYTER_TLS_ERROR, CONNECT_TIMEOUT, UNREACHABLE),
)


# ---------------------------------------------------------------- jupyter-kernel (jupyter_kernel.py)
class KernelSettings(spec.Declared):
    jupyter_kernel_name: str | None = setting("HEALTHCHECK_JUPYTER_KERNEL_NAME", TEXT, None,
                                              "the kernelspec jupyter-kernel starts",
                                              shown_default="the server's default kernelspec")
    jupyter_kernel_ttl: float = setting("HEALTHCHECK_JUPYTER_KERNEL_TTL", NUMBER, 600.0,
                                        "seconds a passing jupyter-kernel result is reused by readiness "
                                        "while the server is in use (an idle server's last result stands "
                                        "until it is used)",
                                        low=0, high=86400, low_inclusive=True)


# The kernel, its kernelspec and its environment are the tenant's (their image, their ~/.local).
KERNEL_API_ERROR = cause(
    "api-error", "the kernel API did not answer `GET {base_url}api/kernelspecs` "
    "(401/403: no trusted runtime file gave the token, or the token file's was withheld from a "
    "listener of another uid; or the server is unreachable)",
    "point `HEALTHCHECK_JUPYTER_RUNTIME_DIR` at the server's runtime directory, "
    "or `HEALTHCHECK_JUPYTER_TOKEN_FILE` at its token; on HTTP 5xx see Jupyter Server's log",
    action="fix-config", actor="tenant")
KERNELSPEC_MISSING = cause(
    "kernelspec-missing", "the named (or default) kernelspec is not among the server's; "
    "the message lists those that are",
    "set `HEALTHCHECK_JUPYTER_KERNEL_NAME` to one of them, "
    "or install the kernel (`python -m ipykernel install`)",
    action="fix-config", actor="tenant")
KERNEL_START_FAILED = cause(
    "kernel-start-failed", "the server refused to start the kernel "
    "(its reason, cleaned and bounded: for example an interpreter that is gone)",
    "fix the kernelspec's `argv` (`jupyter kernelspec list`) or reinstall the kernel; see the server's log",
    action="fix-config", actor="tenant")
KERNEL_DIED = cause(
    "kernel-died", "the kernel process exited during start-up (or the server said it died); "
    "the message gives the line of its output that names the cause (the module or file that failed "
    "to import), read by running the kernelspec again as the server's uid, or says why it was not read",
    "remove or fix what breaks it (often a package under `~/.local`: `pip list --user`)",
    action="fix-config", actor="tenant")
KERNEL_TIMEOUT = cause(
    "kernel-timeout", "no verified reply within the kernel's share of the deadline; the kernel is removed "
    "(by the next run when the server had not yet answered its start)",
    "the kernel hangs or the machine is overloaded; raise `HEALTHCHECK_TIMEOUT` if the image is slow",
    action="retry", actor="tenant")
KERNEL_NO_TORCH = cause(
    "kernel-no-torch", "the kernel's interpreter cannot import torch",
    "install torch in the kernel's environment or point the kernelspec at the image's Python",
    action="fix-config", actor="tenant")
KERNEL_NO_GPU = cause(
    "kernel-no-gpu", "the kernel's torch sees no CUDA device "
    "(a CPU-only torch in the kernel's environment, or `CUDA_VISIBLE_DEVICES` emptied)",
    "install a CUDA build of torch in the kernel's environment, or use the image's kernel; "
    "`HEALTHCHECK_TORCH_DEVICE=cpu` on CPU-only images", action="fix-config", actor="tenant")
KERNEL_OP_FAILED = cause(
    "kernel-op-failed", "the op raised in the kernel (a CUDA error, out of memory)",
    "see the error it names; check the torch-cuda probe", action="retry", actor="tenant")
# A wrong matmul is the GPU's: only the node's operator can drain the node and test it.
KERNEL_WRONG_RESULT = cause(
    "kernel-wrong-result", "the cell's answer is not the verified result "
    "(a wrong matmul, no result line, an error)",
    "silent data corruption; drain the node and run `dcgmi diag`", action="service-hardware",
    actor="operator")
KERNEL_WORKLOAD_MEMORY = cause(
    "workload-memory", "NVML says the workload holds a GPU's memory: "
    "torch imported and the GPU seen, no op run",
    "not a fault: nothing to do", "warn", action="none", actor="tenant")
KERNEL_CLIENT_MISSING = cause(
    "client-missing", "websocket-client is not installed beside the suite: no kernel was started",
    "install the suite with its `jupyter` extra (`pip install gpu-healthcheck[jupyter]`)", "warn",
    action="fix-config", actor="tenant")
KERNEL_LEFT = cause(
    "kernel-left", "the kernel could not be removed (its processes could not be ended)",
    "end them by hand (`jupyter` server log, `ps`); the suite may not signal the server's user",
    action="restart-app", actor="tenant")

KERNEL_SPEC = Spec(
    "jupyter-kernel", layer="services", module=f"{__name__}.jupyter_kernel",
    toggle="ENABLE_JUPYTER_KERNEL_CHECK", follows="ENABLE_JUPYTER_CHECK", timeout=40.0,
    profiles=("startup", "readiness"), requires=("jupyter",), measurement="startTime",
    about="through Jupyter Server, a kernel of the default kernelspec starts, imports torch and runs a "
          "verified op on `HEALTHCHECK_TORCH_DEVICE`, and is shut down", settings=KernelSettings.SETTINGS,
    causes=(KERNEL_API_ERROR, KERNELSPEC_MISSING, KERNEL_START_FAILED, KERNEL_DIED, KERNEL_TIMEOUT,
            KERNEL_NO_TORCH, KERNEL_NO_GPU, KERNEL_OP_FAILED, KERNEL_WRONG_RESULT, KERNEL_WORKLOAD_MEMORY,
            KERNEL_CLIENT_MISSING, KERNEL_LEFT),
)


# ---------------------------------------------------------------- ssh (probes/services/ssh.py)
class SshSettings(spec.Declared):
    ssh_port: int = setting("HEALTHCHECK_SSH_PORT", PORT, 22, "sshd port")


SSH_REFUSED = cause("refused", "nothing listening on the SSH port (the message lists what is listening)",
                    "start sshd (`/usr/sbin/sshd`) or set `HEALTHCHECK_SSH_PORT` to its port",
                    action="restart-app", actor="tenant")
SSH_NO_BANNER = cause(
    "no-banner", "port accepts but sends nothing before the deadline, or closes without a banner",
    "sshd is hung, or refuses this client (MaxStartups, PerSourcePenalties, tcp wrappers): "
    "restart it and check its log", action="restart-app", actor="tenant")
NOT_SSH = cause("not-ssh", "the first line is not `SSH-2.0-`/`SSH-1.99-` (short excerpt quoted), "
                           "or the server speaks only SSH protocol 1",
                "another service holds the port; check `HEALTHCHECK_SSH_PORT` and what listens there "
                "(an sshd of protocol 1 only: install a current openssh-server)", action="fix-config",
                actor="tenant")
SSH_ECHO = cause("echo", "the server sent back our own `SSH-2.0-healthcheck` line "
                         "(an echo service, or a port forward that loops back)",
                 "not sshd: point `HEALTHCHECK_SSH_PORT` at sshd's port", action="fix-config", actor="tenant")

SSH_SPEC = Spec(
    "ssh", layer="services", module=f"{__name__}.ssh", toggle="ENABLE_SSH_CHECK", timeout=3.0,
    profiles=ALL_PROFILES, measurement="banner", about="sshd sends an `SSH-2.0-` identification line",
    settings=SshSettings.SETTINGS,
    causes=(SSH_REFUSED, SSH_NO_BANNER, NOT_SSH, SSH_ECHO, SSHD_STUCK, CONNECT_TIMEOUT, UNREACHABLE),
)


# ---------------------------------------------------------------- ssh-keys (probes/services/ssh_keys.py)
class SshKeysSettings(spec.Declared):
    ssh_user: str | None = setting("HEALTHCHECK_SSH_USER", TEXT, None,
                                   "the user whose key files and account are checked as sshd would",
                                   shown_default="`$DEV_USER`, else the check is skipped")


KEYS_ACCOUNT = cause(
    "ssh-account", "the account cannot log in: no such user, login shell missing or `nologin`, "
    "account expired, or password locked (`!`) while sshd runs without PAM",
    "create the account or fix it (`usermod -s /bin/bash USER`, `usermod -e '' USER`, `usermod -U USER`)",
    action="fix-config", actor="tenant")
# The message gives the command that mends the path it names (remedy=False).
KEYS_STRICT_MODES = cause("ssh-strict-modes", "sshd's StrictModes refuses the key file: "
                                              "it, `~/.ssh` or the home directory is group/other-writable "
                                              "or owned by another user, or the file is not a regular file "
                                              "(the message names the path, owner and mode)",
                          "the command the message gives, e.g. `chmod g-w /home/dev`", action="fix-config",
                          actor="tenant")
KEYS_NONE = cause(
    "ssh-no-keys", "no authorized keys file, or it is empty or holds no public key that parses: "
    "nobody can log in with a key yet",
    "give keys (`SSH_AUTHORIZED_KEYS` in the image) or fix the file's lines", "warn",
    action="fix-config", actor="tenant")
# A home directory on a network or host mount that hangs: the node's storage, not the container.
KEYS_HUNG = cause("deadline", "the key files were not read before the deadline (a hung file system)",
                  "check the home directory's mount", action="retry", actor="operator")
KEYS_NO_USER = cause("no-user", "neither `HEALTHCHECK_SSH_USER` nor `DEV_USER` is set",
                     "set `HEALTHCHECK_SSH_USER` (or `DEV_USER`) to the user who logs in over SSH", "skip",
                     action="fix-config", actor="tenant")

KEYS_SPEC = Spec(
    "ssh-keys", layer="services", module=f"{__name__}.ssh_keys", toggle="ENABLE_SSH_CHECK", timeout=2.0,
    profiles=("startup", "readiness"), measurement="strict-modes",
    about="the SSH user's home, `~/.ssh` and `authorized_keys` pass sshd's StrictModes, hold a key, and the "
          "account may log in", settings=SshKeysSettings.SETTINGS,
    causes=(KEYS_ACCOUNT, KEYS_STRICT_MODES, KEYS_NONE, KEYS_HUNG, KEYS_NO_USER),
)


# ---------------------------------------------------------------- ssh-login (probes/services/ssh_login.py)
def parse_host_keys(text: str) -> str:
    """Comma-separated absolute paths of public host key files (``HEALTHCHECK_SSH_HOST_KEYS``)."""
    paths = [p.strip() for p in text.split(",")]
    if not all(p.startswith("/") for p in paths):
        raise ValueError("is not a list of absolute paths (accepted: /etc/ssh/ssh_host_ed25519_key.pub,...)")
    return ",".join(paths)


class SshLoginSettings(SshSettings):
    """The settings ssh-login reads (``ctx.config.of(SshLoginSettings)``): ssh's port, and its own."""

    ssh_probe_key: str | None = setting(
        "HEALTHCHECK_SSH_PROBE_KEY", ABSOLUTE_PATH, None,
        "the probe principal's private key (root-only); setting it turns the `ssh-login` probe on",
        shown_default="unset (the image sets `/run/healthcheck-ssh/id_ed25519`)")
    ssh_probe_user: str = setting("HEALTHCHECK_SSH_PROBE_USER", TEXT, "healthcheck",
                                  "the user the probe logs in as")
    ssh_host_keys: str | None = setting(
        "HEALTHCHECK_SSH_HOST_KEYS", TEXT, None,
        "comma-separated public host key files the server's key must be one of",
        shown_default="`/etc/ssh/ssh_host_*_key.pub`", parse=parse_host_keys)
    ssh_login_ttl: float = setting("HEALTHCHECK_SSH_LOGIN_TTL", NUMBER, 600.0,
                                   "seconds a passing ssh-login result is reused by readiness",
                                   low=0, high=86400, low_inclusive=True)


LOGIN_AUTH_FAILED = cause(
    "ssh-auth-failed", "sshd refused the probe key (publickey): the key is not authorized, "
    "or StrictModes, the account or AuthorizedKeysFile turned it away",
    "see sshd's log; the `ssh-keys` probe names a StrictModes problem; "
    "restore the probe's authorized key (restart the container)", action="restart-container", actor="tenant")
LOGIN_FAILED = cause("ssh-login-failed", "authenticated, but the session did not run or its command failed "
                                         "(account, shell, PAM, MaxSessions)",
                     "see sshd's log and the probe user's account and shell", action="fix-config",
                     actor="tenant")
LOGIN_HOSTKEY = cause(
    "ssh-hostkey", "the server's host key is none of the container's own public host keys",
    "another server answers on the SSH port, or the host keys changed under sshd: restart sshd",
    action="restart-app", actor="tenant")
LOGIN_PROBE_KEY = cause("ssh-probe-key", "the probe key is missing, a link, not owned by the suite's user, "
                                         "or readable by others (the client refuses it)",
                        "fix `HEALTHCHECK_SSH_PROBE_KEY` (the suite's own file, `chmod 600`)",
                        action="fix-config", actor="tenant")
LOGIN_NO_HOST_KEYS = cause("no-host-keys", "no public host key could be read to check the server against",
                           "set `HEALTHCHECK_SSH_HOST_KEYS`, or generate host keys (`ssh-keygen -A`)",
                           action="fix-config", actor="tenant")
LOGIN_NO_CLIENT = cause("no-client", "the `ssh` client is not installed", "install openssh-client",
                        action="fix-config", actor="tenant")
LOGIN_COULD_NOT = cause("could-not", "the run's known hosts file could not be written "
                                     "(no state dir, or a full one: it is never written to /tmp)",
                        "give the suite a writable `HEALTHCHECK_STATE_DIR`", "warn",
                        action="fix-config", actor="tenant")

LOGIN_SPEC = Spec(
    "ssh-login", layer="services", module=f"{__name__}.ssh_login", toggle="ENABLE_SSH_LOGIN_CHECK",
    timeout=5.0, profiles=("startup", "readiness"), requires=("ssh",), measurement="login", default_on=False,
    on_with="ssh_probe_key", follows="ENABLE_SSH_CHECK",
    about="a real SSH key login of a restricted loopback-only probe principal "
          "runs its forced command (opt-in)", settings=SshLoginSettings.SETTINGS,
    causes=(LOGIN_AUTH_FAILED, LOGIN_FAILED, LOGIN_HOSTKEY, LOGIN_PROBE_KEY, LOGIN_NO_HOST_KEYS,
            LOGIN_NO_CLIENT, SSHD_STUCK, LOGIN_COULD_NOT),
)

SPECS = (JUPYTER_SPEC, KERNEL_SPEC, SSH_SPEC, KEYS_SPEC, LOGIN_SPEC)
