# Policy serving: Ray Serve app from checkpoints (serving/), its tests, export and benchmark.
# The one Serve config is serving/serve_config.yaml (also the RayService serveConfigV2, via the chart).

# Checkpoint served by `make serve` / exported by `make export-policy` / benchmarked by `make serve-bench`.
CHECKPOINT ?= outputs/cartpole_ppo/checkpoints/final
SERVE_HOST ?= 127.0.0.1
SERVE_PORT ?= 8000
# Ray's metrics export port (Prometheus text at http://127.0.0.1:$(SERVE_METRICS_PORT)/metrics).
SERVE_METRICS_PORT ?= 8080
# direct (default, ~1 ms/request) | proxy (Serve defaults, ~9 ms/request); see serving/README.md.
SERVE_INGRESS ?= direct
# Extra `python -m serving` flags, e.g. SERVE_ARGS="--policy pong=outputs/pong_ppo/checkpoints/final".
SERVE_ARGS ?=

.PHONY: serve test-serve export-policy serve-bench canary-bench serve-soak

serve: venv ## Serve CHECKPOINT (default: the `make train` output) on 127.0.0.1:8000 with an embedded Ray
	$(PY) -m serving --checkpoint $(CHECKPOINT) --host $(SERVE_HOST) --port $(SERVE_PORT) \
	  --metrics-port $(SERVE_METRICS_PORT) --ingress $(SERVE_INGRESS) $(SERVE_ARGS)

test-serve: venv ## Policy-server tests: trainer -> checkpoint -> real Serve over real HTTP (a few minutes)
	$(PY) -m pytest tests/serving -m serve $(PYTEST_ARGS)

export-policy: venv ## Export CHECKPOINT to TorchScript (CHECKPOINT/export/policy.pt) with an action-parity check
	$(PY) -m serving.export --checkpoint $(CHECKPOINT)

serve-bench: venv ## Benchmark the policy server (latency, 8-client throughput, in-process floor) -> bench/results/serve_bench.json
	$(PY) bench/serve_bench.py $(if $(wildcard $(CHECKPOINT)),--checkpoint $(CHECKPOINT),)

canary-bench: venv ## What a candidate costs: no candidate vs a 10% split vs shadow, side by side -> bench/results/canary_bench.json
	$(PY) bench/canary_bench.py $(if $(wildcard $(CHECKPOINT)),--checkpoint $(CHECKPOINT),)

SOAK_MINUTES ?= 5
serve-soak: venv ## Soak the policy server: SOAK_MINUTES at 8 clients, errors + RSS over time -> bench/results/soak_serve.json
	$(PY) bench/soak_serve.py --minutes $(SOAK_MINUTES) $(if $(wildcard $(CHECKPOINT)),--checkpoint $(CHECKPOINT),)
