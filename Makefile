SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PROTO_FILES := $(shell find proto -name '*.proto' | sort)
PROTO_OUT := libs/api

.PHONY: setup system-deps run test lint unit integration proto proto-check proto-lint proto-breaking proto-baseline \
	down clean

$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(PY) || python3.11 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

setup: $(VENV)/.installed

# System tools the tests drive beyond Python (Debian's prometheus; the image tools when
# FORNAX_IMAGE_TESTS=1). Idempotent: a machine that has them pays one `command -v` each.
system-deps:
	bash scripts/system_deps.sh

# The default model: the deterministic tiny test checkpoint, generated on first run.
MODEL_DIR ?= .fornax/models/tiny
STAGES ?= 2
BACKEND ?= max
# measured: the live switch from numpy to MAX happens only where MAX measured faster; always: forced.
MAX_SWITCH ?= measured
BOUNDARY_DTYPE ?= bf16
PORT ?= 8000

$(MODEL_DIR)/config.json: | setup
	$(VENV)/bin/fornax model make-test-checkpoint --preset tiny --out $(MODEL_DIR)

# FLEET=fleets/two-unlike-hosts.yaml runs each host in its own namespace and cgroup (root).
FLEET ?=
ifeq ($(FLEET),)
FLEET_ARGS := --stages $(STAGES) --backend $(BACKEND) --boundary-dtype $(BOUNDARY_DTYPE) --max-switch $(MAX_SWITCH)
else
FLEET_ARGS := --fleet $(FLEET)
endif

run: setup $(MODEL_DIR)/config.json
	MODULAR_TELEMETRY_ENABLED=0 $(VENV)/bin/fornax up --foreground --checkpoint $(MODEL_DIR) \
		$(FLEET_ARGS) --http-port $(PORT)

down:
	$(VENV)/bin/fornax down

proto:
	bash scripts/gen_proto.sh $(PY) $(PROTO_OUT)

proto-lint: setup
	cd proto && ../$(VENV)/bin/buf lint

# Upgrade compatibility: the protos must not break the committed baseline image (buf FILE
# rules), so a running fleet keeps talking across an upgrade. A deliberate break moves the
# baseline with `make proto-baseline` in the same commit.
PROTO_BASELINE := baseline.binpb
proto-breaking: setup
	cd proto && ../$(VENV)/bin/buf breaking --against $(PROTO_BASELINE)

proto-baseline: setup
	cd proto && ../$(VENV)/bin/buf build --exclude-source-info -o $(PROTO_BASELINE)

# Regenerates into a scratch dir and fails when the checked-in code differs.
proto-check: proto-lint proto-breaking
	rm -rf .proto-check && mkdir -p .proto-check
	bash scripts/gen_proto.sh $(PY) .proto-check
	diff -r -x __pycache__ .proto-check/fornax $(PROTO_OUT)/fornax
	rm -rf .proto-check
	@echo "proto-check: generated code is current"

# ruff (lint, import order, mccabe complexity <= 10) and mypy, both configured in pyproject.toml.
# Module and function length limits are tests/unit/tooling/test_size_limits.py (unit group).
lint: setup
	$(VENV)/bin/ruff check libs services apps tests
	$(VENV)/bin/mypy

test: setup system-deps proto-check lint
	bash scripts/run_tests.sh $(VENV)/bin/pytest

unit: setup
	$(VENV)/bin/pytest tests/unit

integration: setup
	$(VENV)/bin/pytest tests/integration

clean:
	rm -rf $(VENV) .fornax .proto-check

# One container image per service from the template images/Dockerfile (buildah, debootstrap
# base, host-built wheelhouse; scripts/images/build.sh gives each service its build args).
# Needs root with buildah and debootstrap; IMAGE_SERVICES picks a subset, e.g. "planner".
IMAGE_SERVICES ?= planner evidence_registry artifact_builder orchestrator stage_worker
# A checkpoint dir whose MAX graphs the stage worker image carries precompiled (empty: none).
COMPILE_CACHE_CHECKPOINT ?=
.PHONY: images
images: setup
	PY=$(PY) COMPILE_CACHE_CHECKPOINT=$(COMPILE_CACHE_CHECKPOINT) bash scripts/images/build.sh $(IMAGE_SERVICES)
