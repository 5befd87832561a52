# rl-platform: train RLlib policies on Ray locally or on KubeRay, serve them with Ray Serve.
# `make help` lists the targets. Area fragments live in mk/*.mk (k8s, images, serve).

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-m 'not docker'"`.
PYTEST_ARGS ?=
# Hydra overrides for `make train`, e.g. `make train ARGS="experiment=pong_ppo stop.iterations=2"`.
ARGS ?=
# `make test` runs its suites in two pytest-xdist workers (`--dist loadgroup`, one per group of tests/conftest.py
# LAYOUTS), laid out by what is cached (TEST_LAYOUT): `cached` when the cluster tier's binaries are built (the Ray
# suites beside the rest); `cold` when they are not (the Python suites one after the other beside the cluster tier,
# which starts once the background run has built its binaries). TEST_WORKERS=0: everything one after the other here.
TEST_LAYOUT ?= $(if $(CLUSTER_TIER),$(shell hack/tools.sh built cluster >/dev/null 2>&1 && echo cached || echo cold),cached)
TEST_WORKERS ?= 2
# Targets the full test suite needs first (fragments append, e.g. the chart tools).
TEST_PREREQS :=

-include mk/*.mk

.PHONY: help venv train timeline test test-fast clean

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_.-]+:.*?## ' $(MAKEFILE_LIST) | sort -u | \
	  awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[dev,envpool]'
	@touch $@

venv: $(VENV)/.installed ## Create .venv and install the project with its pinned dependencies

train: venv ## Train the default experiment (CartPole PPO, embedded Ray) and print the checkpoint path
	$(PY) -m trainer $(ARGS)

# Chrome trace written by `make timeline`.
TIMELINE ?= outputs/timeline.json

timeline: venv ## Trace a short CartPole run (1 env runner, 1 learner actor) into $(TIMELINE) for ui.perfetto.dev
	$(PY) -m trainer output_dir=$$(mktemp -d) stop.iterations=3 resources.num_env_runners=1 \
	  resources.num_learners=1 debug.timeline=$(TIMELINE) $(ARGS)

test: venv $(TEST_PREREQS) ## Run every test suite (unit, local Ray, serving, chart, containers)
	RLP_TEST_LAYOUT=$(TEST_LAYOUT) $(PY) -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup) \
	  $(PYTEST_ARGS)

test-fast: venv ## Unit tests only (seconds; no Ray cluster, no Docker)
	$(PY) -m pytest -m "not slow and not cluster and not docker and not serve and not chart and not k8s" $(PYTEST_ARGS)

clean: ## Remove local training outputs and caches (keeps .venv)
	rm -rf outputs multirun .pytest_cache
