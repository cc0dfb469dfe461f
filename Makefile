# The health-check suite: build, run, test, lint, image, end-to-end and benchmark.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
IMAGE ?= gpu-dev:$(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' probes/__init__.py)
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: help install setup system-deps fakes run test unit bats manifests stress loaded loaded-tests e2e e2e-image image bench lint \
	clean gpu-verify docs

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# A strict editable install is a static .pth entry to a tree of symlinks under build/:
# the suite starts on every probe, and the default mode's import-hook finder would add
# ~10 ms to each start. A new module needs `make install` again (make setup does it).
EDITABLE := --config-settings editable_mode=strict

install: $(PY) ## install the suite into .venv (what `run` needs)
	$(PY) -m pip install -q $(EDITABLE) -e '.[serve,jupyter]'

system-deps: ## apt packages the tests need (as root; skipped otherwise)
	bash tests/setup-system.sh

setup: $(PY) system-deps ## everything the tests need: apt packages, .venv with test tools, the fakes
	$(PY) -m pip install -q $(EDITABLE) -e '.[dev,serve]'
	$(MAKE) fakes

fakes: ## build the fake NVML library used by the tests
	$(MAKE) -C tests/fakes

run: install ## run the health check on this host (readiness profile, all probes)
	./healthcheck -v

test: setup ## every test: unit and integration, bats, manifests, then the stress suite and what load can break under load, end to end
	$(MAKE) unit bats manifests loaded e2e

# Both cores: most of the suite's time is spent waiting on children, servers and deadlines, and every
# test has its own ports, state dir and process markers. The offline manifest and rule checks are
# `make manifests`, not here. ALONE: tests that SIGKILL a suite and check what the next run ends;
# any suite's run on the machine ends a gone suite's leftovers (probes/orphans.py), so they run
# after the others, one at a time.
ALONE := tests/framework/test_killed_suite.py
unit: ## pytest on both cores: unit and integration tests with real services (no docker)
	$(PY) -m pytest -n 2 --durations=15 -m 'not stress and not e2e' --ignore=tests/k8s \
		--ignore=tests/alerting/test_rules.py --ignore=$(ALONE) tests
	$(PY) -m pytest -q $(ALONE)

# Four at a time: the front door's tests wait on deadlines of seconds, each in its own directory
# (and as its own uid where it limits processes).
bats: ## bats: the bash front door
	$(BIN)/bats --jobs 4 tests/bats

manifests: ## render and validate the Kubernetes manifests offline; promtool checks and tests the alerting rules
	$(PY) -m pytest -q tests/k8s tests/alerting/test_rules.py

stress: ## the fault-injection and concurrency suite
	$(PY) -m pytest --durations=10 -m stress tests

# A health check runs beside a training job that keeps every core busy: what load can break runs again
# under it. The stress suite, one test at a time, then on both cores the tests marked `loaded`: the
# front door, process containment, the deep checks' lock, cache and latch, and the kernel check's
# death detection (pytestmark in their modules, or by name in tests/conftest.py). The rest (judges,
# parsers, settings, docs, servers' replies) holds no promise about time. The stress suite runs only
# here: its promises are about a busy machine. tests/loaded.sh ends its loops however the run ends.
loaded: ## the stress suite and the `loaded` tests while a busy loop per core competes for the CPU
	bash tests/loaded.sh $(MAKE) --no-print-directory -k stress loaded-tests

loaded-tests: ## the tests marked `loaded`, on both cores (make loaded runs them under load)
	$(PY) -m pytest -n 2 --durations=10 -m 'loaded and not stress' --ignore=$(ALONE) tests
	$(PY) -m pytest -q -m 'loaded and not stress' $(ALONE)

image: ## build the GPU dev image (BASE_IMAGE=... to override the base)
	docker build --network host $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) -t $(IMAGE) .

e2e: ## end-to-end tests on a real Docker engine (installs and starts one as root if missing)
	bash tests/e2e/run.sh

e2e-image: ## only what e2e needs first: the Docker engine, the CPU base image and the image under test
	bash tests/e2e/run.sh --build-only

# VS=dir: also run liveness and cached readiness through a baseline checkout (its own .venv),
# paired round by round (bench/run.py --vs). With a Docker engine and the test image it also
# times the probes through `docker exec` (E2E_IMAGE, default gpu-dev:e2e), with VS the baseline's
# too, from its source tree copied into the same container.
bench: fakes ## the benchmark: wall time, CPU time and peak RSS per profile against the floors
	$(PY) bench/run.py $(if $(VS),--vs '$(VS)')

# No dependency on .venv: a GPU machine has no network for `make setup`. FAKE=1 uses .venv.
gpu-verify: ## prove every CUDA path on a real GPU, offline (FAKE=1: self-test on the fakes; OUT=dir)
	FAKE='$(FAKE)' OUT='$(OUT)' bash tests/gpu/verify.sh

docs: install ## regenerate the manual's probe, environment, cause and Xid tables from the code
	$(PY) -m probes.docs

lint: ## ruff, mypy, shellcheck, hadolint
	$(BIN)/ruff check probes tests bench k8s docker
	$(BIN)/mypy
	$(BIN)/shellcheck healthcheck tests/*.sh tests/e2e/*.sh tests/gpu/*.sh tests/corpus/*.sh docker/*.sh .ci/run
	$(BIN)/hadolint --config .hadolint.yaml Dockerfile

clean: ## remove build outputs
	rm -rf build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	$(MAKE) -C tests/fakes clean
