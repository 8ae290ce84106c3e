SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PROTO_FILES := $(shell find proto -name '*.proto' | sort)
PROTO_OUT := libs/api

.PHONY: setup run test unit integration proto proto-check proto-lint down clean

$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(PY) || python3.11 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

setup: $(VENV)/.installed

# The default model: the deterministic tiny test checkpoint, generated on first run.
MODEL_DIR ?= .fornax/models/tiny
STAGES ?= 2
BACKEND ?= max
BOUNDARY_DTYPE ?= bf16
PORT ?= 8000

$(MODEL_DIR)/config.json: | setup
	$(VENV)/bin/fornax model make-test-checkpoint --preset tiny --out $(MODEL_DIR)

# FLEET=fleets/two-unlike-hosts.yaml runs each host in its own namespace and cgroup (root).
FLEET ?=
ifeq ($(FLEET),)
FLEET_ARGS := --stages $(STAGES) --backend $(BACKEND) --boundary-dtype $(BOUNDARY_DTYPE)
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

proto-lint:
	cd proto && ../$(VENV)/bin/buf lint

# Regenerates into a scratch dir and fails when the checked-in code differs.
proto-check: proto-lint
	rm -rf .proto-check && mkdir -p .proto-check
	bash scripts/gen_proto.sh $(PY) .proto-check
	diff -r -x __pycache__ .proto-check/fornax $(PROTO_OUT)/fornax
	rm -rf .proto-check
	@echo "proto-check: generated code is current"

test: setup proto-check
	$(VENV)/bin/pytest -p no:cacheprovider tests

unit: setup
	$(VENV)/bin/pytest tests/unit

integration: setup
	$(VENV)/bin/pytest tests/integration

clean:
	rm -rf $(VENV) .fornax .proto-check

# One container image per service (buildah, debootstrap base, host-built wheelhouse).
# Needs root with buildah and debootstrap; IMAGE_SERVICES picks a subset, e.g. "planner".
IMAGE_SERVICES ?= planner evidence_registry artifact_builder orchestrator stage_worker
# A checkpoint dir whose MAX graphs the stage worker image carries precompiled (empty: none).
COMPILE_CACHE_CHECKPOINT ?=
.PHONY: images
images: setup
	PY=$(PY) COMPILE_CACHE_CHECKPOINT=$(COMPILE_CACHE_CHECKPOINT) bash scripts/images/build.sh $(IMAGE_SERVICES)
