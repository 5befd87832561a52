"""Benchmark: RLlib sampling throughput vs a raw env loop on the same cores (CartPole, Pong), and rollout scaling.

raw: one process steps `make_env(name)` (the trainer's own env, Atari preprocessing included) with random actions
  in a loop: the emulator's/physics' own cost per core, no policy.
rllib: the trainer's AlgorithmConfig (trainer.algo.build_algo_config: connectors, frame stacking, the real RLModule
  forward pass) with env runners x envs per runner as given; env steps/s over `sample()` calls on all env runners
  at once (0 env runners = the driver's local one). Per core = steps/s / max(1, env runners).
efficiency = rllib per core / raw per core. Variants alternate round by round; medians are reported.
`--runners 0,1,2,4,8,16,32,64` on a bigger box gives the rollout-scaling curve (seed claim: 8 -> 64 runners ~7x).

Backends (`--backends gymnasium,envpool`, Pong only for envpool) and modes (`--modes sync,async`), side by side:
  raw: the gymnasium loop above; EnvPool sync (one C++ thread steps 16 envs per call) and async (send/recv, a
  batch of half the envs: the other half steps while Python handles one).
  rllib: the env runner with env.backend=gymnasium (sync: RLlib's SyncVectorEnv; async: gymnasium's AsyncVectorEnv,
  a subprocess per sub-env) or env.backend=envpool (sync only: RLlib steps every sub-env in lockstep, so EnvPool's
  async mode has nothing to overlap inside an env runner). Gymnasium-sync variants keep their old names.
`vs_gymnasium` holds each variant's per-core steps/s over the gymnasium-sync variant of the same shape (medians).

Writes bench/results/sampling_bench.json and .png.

    .venv/bin/python bench/sampling_bench.py [--envs cartpole,pong] [--runners 0,1,2] [--per-runner 1,2,4,8]
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
# Wall time per measurement (seconds of sampling after one warm-up call).
SECONDS = {"cartpole": 3.0, "pong": 6.0}


def raw(name: str, seconds: float) -> dict:
    from rl_envs import make_env

    env = make_env(name)
    env.reset(seed=0)
    env.action_space.seed(0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        n += 1
        if term or trunc:
            env.reset()
    dt = time.perf_counter() - t0
    env.close()
    return {"steps_per_s": round(n / dt, 1), "per_core": round(n / dt, 1)}


def raw_envpool(seconds: float, num_envs: int = 16, batch: int | None = None) -> dict:
    """EnvPool's own loop with the backend's preprocessing (rl_envs.envpool_atari), random actions, one thread."""
    import numpy as np

    from rl_envs.envpool_atari import EnvPoolAtari

    batch = batch or num_envs
    env = EnvPoolAtari({}, num_envs, seed=0, batch_size=batch)
    pool, rng = env._pool, np.random.default_rng(0)
    if batch == num_envs:
        env.reset()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            env.step(rng.integers(0, 6, num_envs))
            n += num_envs
    else:  # async: send the batch that came back, receive the next one ready
        pool.async_reset()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            obs, _, _, _, info = pool.recv()
            EnvPoolAtari._obs(obs)
            pool.send(rng.integers(0, 6, batch), info["env_id"])
            n += batch
    dt = time.perf_counter() - t0
    env.close()
    return {"steps_per_s": round(n / dt, 1), "per_core": round(n / dt, 1)}


def compose(name: str, runners: int, per_runner: int, backend: str = "gymnasium"):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    from trainer.config import register_configs

    register_configs()
    experiment = {"cartpole": "cartpole_ppo", "pong": "pong_ppo"}[name]
    with initialize_config_dir(config_dir=str(REPO / "hydra_conf"), version_base="1.3"):
        return hcompose("config", overrides=[f"experiment={experiment}", f"resources.num_env_runners={runners}",
                                             f"env.num_envs_per_env_runner={per_runner}", f"env.backend={backend}"])


def rllib(name: str, runners: int, per_runner: int, seconds: float, backend: str = "gymnasium",
          mode: str = "sync") -> dict:
    from trainer.algo import build_algo_config

    cfg = compose(name, runners, per_runner, backend)
    config = build_algo_config(cfg).env_runners(rollout_fragment_length=max(1, 256 // per_runner))
    if mode == "async":
        config = config.env_runners(gym_env_vectorize_mode="async")
    algo = config.build_algo()
    group = algo.env_runner_group
    local = runners == 0

    def sample_all() -> int:
        eps = group.foreach_env_runner(lambda r: sum(e.env_steps() for e in r.sample()), local_env_runner=local)
        return int(sum(eps))

    sample_all()  # warm-up: first forward passes, env resets
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += sample_all()
    dt = time.perf_counter() - t0
    algo.stop()
    return {"steps_per_s": round(n / dt, 1), "per_core": round(n / dt / max(1, runners), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", default="cartpole,pong")
    ap.add_argument("--runners", default="0,1,2")
    ap.add_argument("--per-runner", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backends", default="gymnasium", help="gymnasium,envpool (envpool: Pong only)")
    ap.add_argument("--modes", default="sync", help="sync,async")
    args = ap.parse_args()
    load = os.getloadavg()
    os.environ["OMP_NUM_THREADS"] = "1"
    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="rb", dir="/tmp"),
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}})
    report: dict = {"seconds_per_measurement": SECONDS, "envs": {}}
    labels, values = [], []
    for name in args.envs.split(","):
        secs = SECONDS[name]
        variants = {"raw env loop": lambda name=name, secs=secs: raw(name, secs)}
        backends = [b for b in args.backends.split(",") if b == "gymnasium" or name == "pong"]
        modes = args.modes.split(",")
        if "envpool" in backends:
            if "sync" in modes:
                variants["raw envpool sync 16 envs"] = lambda secs=secs: raw_envpool(secs)
            if "async" in modes:
                variants["raw envpool async 16 envs"] = lambda secs=secs: raw_envpool(secs, batch=8)
        for r in map(int, args.runners.split(",")):
            for e in map(int, args.per_runner.split(",")):
                for b in backends:
                    for m in modes:
                        if b == "envpool" and m == "async":
                            continue  # RLlib steps all sub-envs in lockstep (module docstring)
                        label = "rllib" + ("" if b == "gymnasium" else f" {b}") + ("" if m == "sync" else f" {m}")
                        variants[f"{label} {r} runners x {e} envs"] = (
                            lambda name=name, r=r, e=e, secs=secs, b=b, m=m: rllib(name, r, e, secs, b, m))
        runs = benchkit.interleave(variants, args.rounds,
                                   lambda n, r: f"{r['steps_per_s']:>9,.0f} steps/s ({r['per_core']:,.0f}/core)")
        med = {n: {k: benchkit.median(v, k) for k in ("steps_per_s", "per_core")} for n, v in runs.items()}
        raw_core = med["raw env loop"]["per_core"]
        eff = {n: round(m["per_core"] / raw_core, 3) for n, m in med.items() if n != "raw env loop"}
        best = max((n for n in eff if n.startswith("rllib")), key=eff.get)
        vs_gym = {}
        for n in med:
            if n.startswith("raw envpool"):
                vs_gym[n] = round(med[n]["per_core"] / raw_core, 3)
            elif n.startswith("rllib ") and n.split()[1] in ("envpool", "async"):
                shape = n.split(maxsplit=2)[2]
                base = f"rllib {shape}"
                if base in med:
                    vs_gym[n] = round(med[n]["per_core"] / med[base]["per_core"], 3)
        report["envs"][name] = {"median": med, "efficiency_per_core_vs_raw": eff, "best": best, "runs": runs,
                                "vs_gymnasium": vs_gym}
        for n, v in vs_gym.items():
            print(f"{name}: {n}: {v:.2f}x the gymnasium {'raw loop' if n.startswith('raw') else 'sync runner'} "
                  "per core", flush=True)
        print(f"{name}: raw {raw_core:,.0f}/core; best RLlib {best}: {eff[best]:.0%} of raw per core", flush=True)
        for n, v in eff.items():
            labels.append(f"{name}: {n.replace('rllib ', '')}")
            values.append(v)
    ray.shutdown()
    report["goal"] = "Pong sampling >= 50% of the raw env loop per core"
    report["machine"] = benchkit.machine(load)
    benchkit.write("sampling_bench", report)
    benchkit.bar_png("sampling_bench", "RLlib env steps/s per core / raw env loop per core (median)", labels, values,
                     "fraction of raw", peer=0.5, peer_label="goal for Pong: 0.5")


if __name__ == "__main__":
    main()
