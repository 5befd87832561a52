# Benchmarks (bench/): each writes bench/results/<name>.json and .png; variants run interleaved in one invocation,
# so read the ratios (the machine is shared and noisy). BENCH_ROUNDS sets the rounds of each A/B comparison.
BENCH_ROUNDS ?= 3

.PHONY: bench bench-startup bench-train bench-sampling bench-sampling-profile bench-pong bench-broadcast bench-tune bench-ddp

bench: bench-startup bench-train bench-sampling bench-sampling-profile bench-broadcast bench-tune bench-ddp serve-bench canary-bench ## Run every benchmark (tens of minutes on 2 cores) -> bench/results/*.json + *.png

bench-startup: venv ## Start-up phases of the trainer, before/after, per change -> bench/results/startup_bench.*
	$(PY) bench/startup_bench.py --rounds $(BENCH_ROUNDS)

bench-train: venv ## CartPole wall-to-solve vs Stable-Baselines3 rl-zoo PPO -> bench/results/train_bench.*
	$(PY) bench/train_bench.py --rounds $(BENCH_ROUNDS)

bench-sampling: venv ## RLlib env steps/s vs a raw env loop (CartPole, Pong), env runners x envs -> bench/results/sampling_bench.*
	$(PY) bench/sampling_bench.py --rounds $(BENCH_ROUNDS)

bench-sampling-profile: venv ## An env runner's time per stage, gymnasium vs EnvPool Pong -> bench/results/sampling_profile.json
	$(PY) bench/sampling_profile.py --rounds $(BENCH_ROUNDS)

bench-pong: venv ## Does Pong learn? 45 min of PPO on CPU, greedy rl-eval -> bench/results/pong_learning.* (not in `make bench`)
	$(PY) bench/pong_learning.py --minutes 45 resources.torch_threads=2 resources.num_env_runners=1

bench-broadcast: venv ## Weight broadcast: object store vs pickling per actor, numpy/torch -> bench/results/broadcast_bench.*
	$(PY) bench/broadcast_bench.py --rounds $(BENCH_ROUNDS)

bench-tune: venv ## Grid search vs HyperBand vs ASHA: compute to solve CartPole -> bench/results/tune_bench.*
	$(PY) bench/tune_bench.py

bench-ddp: venv ## One learner vs two DDP learners on CartPole -> bench/results/ddp_bench.json
	$(PY) bench/ddp_bench.py
