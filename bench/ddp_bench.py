"""Benchmark: CartPole PPO to solved with one learner vs two DDP learners (torch DDP over gloo), side by side.

Variants, run alternately (round-robin) so machine noise hits them alike; each is `python -m trainer` with the
default CartPole preset plus:
  one_learner      resources.num_learners=0 (the local learner in the driver; the default)
  ddp2             resources.num_learners=2 (two learner actors; algo.minibatch_size is global, so each takes 64)
  ddp2_mb_per_learner  resources.num_learners=2 algo.minibatch_size=256 (each learner takes 128 = what RLlib does
                   when minibatch_size is passed through per learner: half the SGD steps per iteration)
Reports per variant the median env steps and process wall to solved, and the median learner iteration time
(progress.csv iter_s), and writes bench/results/ddp_bench.json. The machine is shared: read ratios, not seconds.

    .venv/bin/python bench/ddp_bench.py [--rounds 2] [--target 450] [--variants one_learner,ddp2]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "one_learner": [],
    "ddp2": ["resources.num_learners=2"],
    "ddp2_mb_per_learner": ["resources.num_learners=2", "algo.minibatch_size=256"],
}


def run(name: str, target: float) -> dict:
    out_dir = tempfile.mkdtemp(prefix="bench-ddp-")
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "trainer", f"output_dir={out_dir}", f"stop.episode_return_mean={target}",
           f"resources.ray_tmp_dir={tempfile.mkdtemp(prefix='rb', dir='/tmp')}", *VARIANTS[name]]
    s = benchkit.timed_json_run(cmd, env)
    wall = s["process_wall_s"]
    with open(os.path.join(out_dir, "progress.csv")) as f:
        iter_s = [float(r["iter_s"]) for r in csv.DictReader(f)]
    return {"solved": (s["episode_return_mean"] or 0) >= target, "env_steps": s["env_steps"],
            "iterations": s["iterations"], "episode_return_mean": s["episode_return_mean"], "wall_s": round(wall, 2),
            "median_iter_s": round(statistics.median(iter_s[1:] or iter_s), 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--target", type=float, default=450.0)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    names = args.variants.split(",")
    results: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(args.rounds):
        for name in names:
            r = run(name, args.target)
            results[name].append(r)
            print(f"round {i + 1} {name:20s} wall {r['wall_s']:6.1f}s  steps {r['env_steps']:>7,}  "
                  f"iter {r['median_iter_s']:.2f}s  return {r['episode_return_mean']}  solved {r['solved']}", flush=True)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("wall_s", "env_steps", "iterations", "median_iter_s")}
           | {"solved": sum(r["solved"] for r in v)} for k, v in results.items()}
    report = {"target": args.target, "rounds": args.rounds, "median": med, "runs": results,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "loadavg_at_end": os.getloadavg()},
              "command": "bench/ddp_bench.py " + " ".join(sys.argv[1:])}
    out = REPO / "bench" / "results" / "ddp_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for k, m in med.items():
        print(f"median {k:20s} wall {m['wall_s']:6.1f}s  steps {m['env_steps']:>9,.0f}  iter {m['median_iter_s']:.2f}s")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
