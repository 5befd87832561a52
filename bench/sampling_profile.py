"""Where an env runner's time goes, gymnasium vs EnvPool backend (Pong, the trainer's own config): why EnvPool's
1.8x faster raw emulator loop does not make RLlib's env runner 1.5x faster here.

One env runner in this process (the driver's local one, `resources.num_env_runners=0`, 16 Pong sub-envs, the
trainer's AlgorithmConfig from trainer.algo.build_algo_config: frame-stacking connector, the real RLModule). Each
stage of RLlib's sampling loop (`SingleAgentEnvRunner._sample`) is timed with perf_counter around the call that
does it, on the runner instance (four timers per vector step, no profiler: its overhead would inflate the Python
stages):

  env step        `_try_env_step`: the backend (gymnasium: ale-py + RLlib's Python Atari wrappers per sub-env;
                  EnvPool: one C++ call for all sub-envs, preprocessing included)
  env-to-module   the env-to-module connector pipeline (frame stacking, batching, numpy -> torch)
  forward         `RLModule.forward_exploration` (the CNN on 16 stacked observations)
  module-to-env   the module-to-env connector pipeline (action distribution, sampling, unbatching)
  episodes        the rest of `sample()`: per-sub-env episode bookkeeping (`add_env_step`), callbacks, unbatch

Backends alternate round by round; medians per 1000 env steps. `ceiling_if_env_free` = the speedup a backend whose
step cost nothing would give (Amdahl: total / (total - env step)).

    .venv/bin/python bench/sampling_profile.py [--seconds 8] [--rounds 3] [--envs 16]

Writes bench/results/sampling_profile.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402
from sampling_bench import compose  # noqa: E402

STAGES = ("env step", "env-to-module", "forward", "module-to-env", "episodes")


def _timed(fn, acc: dict, key: str):
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            acc[key] += time.perf_counter() - t0
    return wrapper


def profile(backend: str, envs: int, seconds: float) -> dict:
    from trainer.algo import build_algo_config

    cfg = compose("pong", 0, envs, backend)
    algo = build_algo_config(cfg).env_runners(rollout_fragment_length=max(1, 256 // envs)).build_algo()
    try:
        runner = algo.env_runner_group.local_env_runner
        runner.sample()  # warm-up: env resets, first forward passes
        acc: dict[str, float] = defaultdict(float)
        runner._try_env_step = _timed(runner._try_env_step, acc, "env step")
        runner._env_to_module = _timed(runner._env_to_module, acc, "env-to-module")
        runner._module_to_env = _timed(runner._module_to_env, acc, "module-to-env")
        runner.module.forward_exploration = _timed(runner.module.forward_exploration, acc, "forward")
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            steps += sum(e.env_steps() for e in runner.sample())
        total = time.perf_counter() - t0
    finally:
        algo.stop()
    acc["episodes"] = total - sum(acc[k] for k in STAGES if k != "episodes")
    per_k = {k: round(1000 * acc[k] / steps * 1000, 2) for k in STAGES}  # ms per 1000 env steps
    return {"env_steps": steps, "seconds": round(total, 2), "steps_per_s": round(steps / total, 1),
            "ms_per_1000_steps": per_k, "total_ms_per_1000_steps": round(sum(per_k.values()), 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0, help="sampling wall time per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--envs", type=int, default=16, help="Pong sub-envs in the env runner (the pong experiments' 16)")
    args = ap.parse_args()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    load = os.getloadavg()
    runs = benchkit.interleave(
        {b: (lambda b=b: profile(b, args.envs, args.seconds)) for b in ("gymnasium", "envpool")}, args.rounds,
        lambda name, r: f"{r['steps_per_s']:8.1f} steps/s  " + "  ".join(
            f"{k} {v:7.1f}" for k, v in r["ms_per_1000_steps"].items()))
    ray.shutdown()
    median = {}
    for b, rows in runs.items():
        stages = {k: benchkit.median([r["ms_per_1000_steps"] for r in rows], k) for k in STAGES}
        total = round(sum(stages.values()), 2)
        median[b] = {"steps_per_s": benchkit.median(rows, "steps_per_s"), "ms_per_1000_steps": stages,
                     "total_ms_per_1000_steps": total,
                     "share": {k: round(v / total, 3) for k, v in stages.items()},
                     "ceiling_if_env_free": round(total / (total - stages["env step"]), 2)}
    g, e = median["gymnasium"], median["envpool"]
    report = {
        "command": f"bench/sampling_profile.py --seconds {args.seconds:g} --rounds {args.rounds} --envs {args.envs}",
        "envs_per_runner": args.envs,
        "median": median,
        "envpool_vs_gymnasium": {
            "steps_per_s": round(e["steps_per_s"] / g["steps_per_s"], 2),
            "env_step_cost": round(e["ms_per_1000_steps"]["env step"] / g["ms_per_1000_steps"]["env step"], 2),
            "rest_cost": round((e["total_ms_per_1000_steps"] - e["ms_per_1000_steps"]["env step"])
                               / (g["total_ms_per_1000_steps"] - g["ms_per_1000_steps"]["env step"]), 2),
        },
        "runs": runs,
        "machine": benchkit.machine(load),
    }
    benchkit.write("sampling_profile", report)
    for b, m in median.items():
        print(f"{b:10s} {m['steps_per_s']:8.1f} steps/s; ms per 1000 env steps: "
              + ", ".join(f"{k} {v}" for k, v in m["ms_per_1000_steps"].items())
              + f"; ceiling if the env cost nothing {m['ceiling_if_env_free']}x", flush=True)
    print(f"envpool / gymnasium: {report['envpool_vs_gymnasium']}", flush=True)


if __name__ == "__main__":
    main()
