# The GPU development image: PyTorch + CUDA, JupyterLab and SSH, with a HEALTHCHECK that
# proves the container can do its job (driver, GPUs, a real tensor op, Jupyter, sshd).
#
#   docker build --network host -t gpu-dev:latest .      (make image)
#   docker run -d --gpus all --shm-size=8g -p 8888:8888 -p 2222:22 \
#     -e SSH_AUTHORIZED_KEYS="$(cat ~/.ssh/id_ed25519.pub)" gpu-dev:latest
#
# BASE_IMAGE may be any image whose python3 on PATH owns torch (the end-to-end tests use a
# CPU-only Debian stand-in, since no registry can be reached there).
ARG BASE_IMAGE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

# OCI image annotations (github.com/opencontainers/image-spec, annotations.md): what this
# image is, which version, and what it was built on. VERSION follows probes/__init__.py (a test
# in tests/k8s/test_manifests.py checks it, with the manifests' version labels and tag).
ARG BASE_IMAGE
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpu-dev" \
      org.opencontainers.image.description="GPU development image: PyTorch + CUDA, JupyterLab and SSH, with health checks for Docker and Kubernetes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"

ARG JUPYTERLAB_VERSION=4.6.4
ARG DEV_USER=dev
ARG DEV_UID=1000

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# tini is PID 1: it forwards signals and reaps what a timed-out probe leaves behind
# (Docker kills only the probe's top process). Host keys made by the package's install
# script are removed: each container generates its own at first start. The health check's
# SSH probe principal exists in the image (a read-only root cannot add it at start); its
# home, authorized key and private key are made under /run at every start (entrypoint).
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates openssh-server procps tini \
 && rm -rf /var/lib/apt/lists/* \
 && rm -f /etc/ssh/ssh_host_* \
 && useradd --create-home --uid "${DEV_UID}" --shell /bin/bash "${DEV_USER}" \
 && useradd --system --no-create-home --home-dir /run/healthcheck-ssh-home --shell /bin/sh \
      --password '*' healthcheck

# JupyterLab goes into the image's own Python, next to torch.
RUN python3 -m pip install --no-cache-dir "jupyterlab==${JUPYTERLAB_VERSION}"

# The health-check suite lives in its own virtual environment, so no `pip install` by a
# user can break it; it never imports torch itself (HEALTHCHECK_TORCH_PYTHON, default
# python3 on PATH, runs the tensor op). The `serve` extra brings prometheus-client for
# `healthcheck serve` (the http overlay). pip installs it as into any Python: the package
# byte-compiled in site-packages (a read-only or non-root container never compiles it on a
# probe), and in bin the front door beside healthcheck-probes, whose first line names the
# interpreter. Both are hard-linked into /usr/local/bin: through a symbolic link the front
# door would pay a readlink on every probe. setuptools goes once the suite is in: its .pth
# file would import a shim at every interpreter start, on every probe.
COPY pyproject.toml healthcheck /tmp/healthcheck-src/
COPY probes/ /tmp/healthcheck-src/probes/
RUN python3 -m venv /opt/healthcheck/.venv \
 && /opt/healthcheck/.venv/bin/pip install --no-cache-dir --disable-pip-version-check "/tmp/healthcheck-src[serve,jupyter]" \
 && /opt/healthcheck/.venv/bin/pip uninstall -q -y --disable-pip-version-check setuptools \
 && rm -rf /tmp/healthcheck-src \
 && ln /opt/healthcheck/.venv/bin/healthcheck /opt/healthcheck/.venv/bin/healthcheck-probes /usr/local/bin/ \
 && healthcheck --help >/dev/null

COPY docker/sshd/gpu-dev.conf /etc/ssh/sshd_config.d/10-gpu-dev.conf
COPY docker/sshd/penalty-exempt.conf /etc/ssh/gpu-dev/penalty-exempt.conf
COPY docker/entrypoint.sh /usr/local/bin/gpu-dev-entrypoint
# The person's notices (docs/image.md, "Notices"): an interactive SSH login and the first cell of
# every kernel show the health check's published verdict when it is not healthy, from one small
# file (HEALTHCHECK_NOTICE_FILE); HEALTHCHECK_NOTICES=false turns them and the log line off.
COPY docker/gpu-health-notice.sh /etc/profile.d/gpu-health-notice.sh
COPY docker/ipython_kernel_config.py /etc/ipython/ipython_kernel_config.py
# Jupyter's runtime dir is writable by GID 0, so that an arbitrary UID (OpenShift's, with
# GID 0) can start Jupyter; started as root, the entrypoint hands it to the dev user, 0700.
RUN chmod 0755 /usr/local/bin/gpu-dev-entrypoint \
 && chmod 0644 /etc/ssh/sshd_config.d/10-gpu-dev.conf /etc/ssh/gpu-dev/penalty-exempt.conf \
      /etc/profile.d/gpu-health-notice.sh /etc/ipython/ipython_kernel_config.py \
 && install -d -m 0770 -g 0 /run/jupyter

# Global, so the health check (which runs with the image's environment, not the
# entrypoint's) finds the server's jpserver-<pid>.json. DEV_USER tells the entrypoint whom
# Jupyter runs as; the container itself starts as root because sshd needs it.
# HEALTHCHECK_SERVE=true makes the entrypoint start and supervise `healthcheck serve`
# (HTTP probes and metrics on HEALTHCHECK_SERVE_PORT, 8779) beside sshd and Jupyter.
# HEALTHCHECK_SSH_PROBE_KEY makes the entrypoint create the health check's own SSH principal
# and key at each start, and turns on the ssh-login probe (a real login over loopback).
# The entrypoint writes Jupyter's token to /run/jupyter/token, the notebook user's file: its
# owner is whose server the Jupyter port must be, and jupyter-kernel sends the token only there.
# The variable names a file's path, not a secret: DL3064 reads "TOKEN" in its name.
# hadolint ignore=DL3064
ENV JUPYTER_RUNTIME_DIR=/run/jupyter \
    HEALTHCHECK_JUPYTER_TOKEN_FILE=/run/jupyter/token \
    DEV_USER=${DEV_USER} \
    HEALTHCHECK_SERVE=false \
    HEALTHCHECK_SSH_PROBE_KEY=/run/healthcheck-ssh/id_ed25519

EXPOSE 22 8888

# Numbers measured on the end-to-end runs; see docs/image.md, "Docker HEALTHCHECK tuning".
# The suite's own deadline (readiness: 25 s, hard stop 28 s) stays below --timeout, so a
# stuck probe reports its own reason instead of Docker's "Health check exceeded timeout".
HEALTHCHECK --interval=30s --timeout=35s --start-period=60s --start-interval=5s --retries=3 \
  CMD ["/usr/local/bin/healthcheck"]

ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/gpu-dev-entrypoint"]
