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
# `make test` runs the suites one after the other in SUITE_ORDER (tests/conftest.py) while the builds run behind.
# TEST_WORKERS=2 runs its two suite groups side by side instead (pytest-xdist, one worker per group): the default on a
# machine with 4 or more cores once nothing is left to compile for the cluster tier. On 2 cores it costs time: the
# local-Ray suites and the cluster's Ray pods share the cores (load 11-14), each runs 2-2.5x slower, and Ray's own
# fixed 30 s start-up wait is missed (bench/results/make_test_side_by_side.json).
TEST_WORKERS ?= $(if $(CLUSTER_TIER),$(shell [ "$$(nproc)" -ge 4 ] && hack/tools.sh built cluster >/dev/null 2>&1 && echo 2 || echo 0),$(shell [ "$$(nproc)" -ge 4 ] && echo 2 || echo 0))
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
	$(PY) -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup) $(PYTEST_ARGS)

test-fast: venv ## Unit tests only (seconds; no Ray cluster, no Docker)
	$(PY) -m pytest -m "not slow and not cluster and not docker and not serve and not chart and not k8s" $(PYTEST_ARGS)

clean: ## Remove local training outputs and caches (keeps .venv)
	rm -rf outputs multirun .pytest_cache
