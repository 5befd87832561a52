"""Benchmark (seed claim "HyperBand ~40% less compute than grid search"): compute to find a CartPole config that
solves, grid search vs HyperBand vs ASHA over the same space.

Every variant runs the same trials (the default cartpole_ppo experiment, `--space` as a grid over algo keys, each
trial stopped by the trainer's own stop rule: solved at --target or --max-steps env steps) with Ray Tune on one
embedded Ray; schedulers differ only in which trials they stop early. Compute = env steps summed over all trials,
and wall time; "found" = at least one trial solved. Variants alternate round by round.

Writes bench/results/tune_bench.json and .png.

    .venv/bin/python bench/tune_bench.py [--rounds 1] [--target 450] [--max-steps 60000]
        [--space 'lr=1e-4,3e-4,1e-3,3e-3']
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402

REPO = benchkit.REPO
sys.path.insert(0, str(REPO))


def run(variant: str, space: dict[str, list[float]], target: float, max_steps: int) -> dict:
    from hydra import compose, initialize_config_dir
    from ray import tune
    from ray.tune import RunConfig, TuneConfig
    from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler

    from trainer.algo import build_algo_config
    from trainer.config import register_configs
    from trainer.solved import RETURN_MEAN_KEY
    from trainer.stopping import ENV_STEPS_KEY, StopRule

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "hydra_conf"), version_base="1.3"):
        cfg = compose("config")
    config = build_algo_config(cfg, algo_overrides={k: tune.grid_search(v) for k, v in space.items()})
    metric, mode = RETURN_MEAN_KEY, "max"
    # max_t in iterations: the env-step budget over the experiment's batch size.
    max_t = max(1, max_steps // int(cfg.algo.train_batch_size))
    sched = {"grid": None,
             "hyperband": HyperBandScheduler(metric=metric, mode=mode, time_attr="training_iteration", max_t=max_t,
                                             reduction_factor=3),
             "asha": ASHAScheduler(metric=metric, mode=mode, time_attr="training_iteration", max_t=max_t,
                                   grace_period=max(1, max_t // 9), reduction_factor=3)}[variant]
    t0 = time.time()
    results = tune.Tuner(
        config.algo_class, param_space=config,
        tune_config=TuneConfig(scheduler=sched, max_concurrent_trials=1),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="bench-tune-"), verbose=0,
                             stop=StopRule({"episode_return_mean": target, "env_steps": max_steps})),
    ).fit()
    wall = time.time() - t0
    steps = [int(r.metrics.get(ENV_STEPS_KEY) or 0) for r in results]
    solved = [r.config.get(k) for r in results for k in space if (r.metrics.get(RETURN_MEAN_KEY) or 0) >= target]
    return {"env_steps_total": sum(steps), "wall_s": round(wall, 1), "trials": len(steps), "found": bool(solved),
            "solving_configs": solved}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--target", type=float, default=450.0)
    ap.add_argument("--max-steps", type=int, default=60_000)
    ap.add_argument("--space", default="lr=1e-4,3e-4,1e-3,3e-3")
    args = ap.parse_args()
    space = {k: [float(x) for x in v.split(",")] for k, v in (p.split("=") for p in args.space.split(";"))}
    load = os.getloadavg()
    os.environ["OMP_NUM_THREADS"] = "1"
    import ray

    ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="rb", dir="/tmp"),
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}})
    runs = benchkit.interleave({v: (lambda v=v: run(v, space, args.target, args.max_steps))
                                for v in ("grid", "hyperband", "asha")}, args.rounds,
                               lambda n, r: f"{r['env_steps_total']:>9,} env steps {r['wall_s']:7.1f}s found {r['found']}")
    ray.shutdown()
    med = {n: {k: benchkit.median(v, k) for k in ("env_steps_total", "wall_s")} for n, v in runs.items()}
    grid = med["grid"]
    report = {"space": space, "target": args.target, "max_steps_per_trial": args.max_steps, "median": med,
              "compute_ratio_vs_grid": {n: round(m["env_steps_total"] / grid["env_steps_total"], 3)
                                        for n, m in med.items()},
              "seed_claim": "HyperBand ~40% less compute than grid search (ratio ~0.6)",
              "runs": runs, "machine": benchkit.machine(load)}
    benchkit.write("tune_bench", report)
    benchkit.bar_png("tune_bench", "env steps to search the space (median)", list(med),
                     [m["env_steps_total"] for m in med.values()], "env steps",
                     peer=0.6 * grid["env_steps_total"], peer_label="seed claim: 0.6 x grid")


if __name__ == "__main__":
    main()
