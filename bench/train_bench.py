"""Benchmark: process start -> CartPole solved (mean of last 20 training episodes >= 450), side by side.

Runs `python -m trainer` (the default `make train` job) and Stable-Baselines3 PPO with rl-zoo's CartPole settings
alternately, N rounds each, on the same machine, and reports medians and the ratio. Writes
bench/results/train_bench.json. The machine is shared and noisy: read the ratio, not the absolute seconds.

    .venv/bin/python bench/train_bench.py [--rounds 3] [--target 450] [--variant NAME="override override ..."]

--variant adds a run of the trainer with extra Hydra overrides (e.g. a candidate cartpole_ppo setting), interleaved
with the others, so a change's before/after is measured in the same invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SB3_VERSION = "2.9.2"
SB3_DIR = Path(os.environ.get("RLP_CACHE", Path.home() / ".cache/rl-platform")) / f"bench-sb3-{SB3_VERSION}"


def ensure_sb3() -> None:
    # SB3's dependencies (torch, gymnasium, numpy, pandas, matplotlib, cloudpickle) are already in the project venv;
    # install only the package itself, outside the venv, so the project's pins stay untouched.
    if not (SB3_DIR / "stable_baselines3").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(SB3_DIR),
                        f"stable-baselines3=={SB3_VERSION}"], check=True)


def run(cmd: list[str], env: dict[str, str]) -> dict:
    sys.path.insert(0, str(REPO / "bench"))
    import benchkit

    return benchkit.timed_json_run(cmd, env)


def ours(target: float, overrides: tuple[str, ...] = ()) -> dict:
    out_dir = tempfile.mkdtemp(prefix="bench-train-")
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    s = run([sys.executable, "-m", "trainer", f"output_dir={out_dir}", f"stop.episode_return_mean={target}",
             f"resources.ray_tmp_dir={tempfile.mkdtemp(prefix='rb', dir='/tmp')}", *overrides], env)
    # Time to solved = process wall minus the post-solve work (final checkpoint, PNG, Ray shutdown) is not
    # subtracted: the user waits for all of it.
    return {"solved": (s["episode_return_mean"] or 0) >= target, "env_steps": s["env_steps"],
            "episode_return_mean": s["episode_return_mean"], "wall_s": s["process_wall_s"],
            "iterations": s.get("iterations"), "startup": s.get("startup")}


def sb3(target: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(SB3_DIR))
    s = run([sys.executable, str(REPO / "bench" / "sb3_cartpole.py"), str(target)], env)
    s["wall_s"] = s["process_wall_s"]
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target", type=float, default=450.0)
    ap.add_argument("--variant", action="append", default=[], help='NAME="hydra overrides" (repeatable)')
    args = ap.parse_args()
    load = os.getloadavg()
    ensure_sb3()
    runners = {"rl_platform": ours, "sb3_rlzoo": sb3}
    for v in args.variant:
        name, _, overrides = v.partition("=")
        runners[name] = lambda target, o=tuple(overrides.split()): ours(target, o)
    results: dict[str, list[dict]] = {name: [] for name in runners}
    for i in range(args.rounds):
        for name, fn in runners.items():
            r = fn(args.target)
            results[name].append(r)
            print(f"round {i + 1} {name:12s} wall {r['wall_s']:6.1f}s  steps {r['env_steps']:>7,}  "
                  f"return {r['episode_return_mean']}  solved {r['solved']}", flush=True)
    med = {k: {"wall_s": statistics.median(r["wall_s"] for r in v),
               "env_steps": statistics.median(r["env_steps"] for r in v),
               "solved": sum(r["solved"] for r in v)} for k, v in results.items()}
    ratio = med["rl_platform"]["wall_s"] / med["sb3_rlzoo"]["wall_s"]
    ratios = {k: round(m["wall_s"] / med["sb3_rlzoo"]["wall_s"], 3) for k, m in med.items() if k != "sb3_rlzoo"}
    report = {"target": args.target, "rounds": args.rounds, "median": med, "wall_ratio_ours_over_sb3": round(ratio, 3),
              "wall_ratio_over_sb3": ratios, "variants": args.variant,
              "runs": results, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "loadavg_before": load, "loadavg_at_end": os.getloadavg(),
                                           "note": "runs interleaved; compare ratios, not seconds"},
              "command": "bench/train_bench.py " + " ".join(sys.argv[1:])}
    sys.path.insert(0, str(REPO / "bench"))
    import benchkit

    benchkit.bar_png("train_bench", f"process start -> CartPole solved ({args.target:g}), median wall", list(med),
                     [m["wall_s"] for m in med.values()], "seconds", peer=med["sb3_rlzoo"]["wall_s"],
                     peer_label="SB3 rl-zoo PPO")
    out = REPO / "bench" / "results" / "train_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"median wall: rl_platform {med['rl_platform']['wall_s']:.1f}s ({med['rl_platform']['env_steps']:,.0f} steps) "
          f"vs SB3 rl-zoo {med['sb3_rlzoo']['wall_s']:.1f}s ({med['sb3_rlzoo']['env_steps']:,.0f} steps); "
          f"ratio {ratio:.2f} -> {out}")


if __name__ == "__main__":
    main()
