"""Benchmark: what evaluation while training costs (the `evaluation` config group), side by side.

Section `solve`: the default `make train` job (CartPole PPO until the mean of the last 20 training episodes >= 450)
with evaluation off, on in the driver (the default: greedy episodes between iterations) and on a dedicated eval env
runner in parallel to training (`evaluation=parallel`), interleaved, N rounds each; round k runs every variant with
`seed=k`, so their training is the same (evaluation does not change it: same env steps to solve) and the
differences are what evaluation costs. Reports medians of process wall and env steps to solve, the training time after start-up, the cost of one evaluation (eval iterations' mean time
minus the others', from progress.csv) and each variant's ratio over evaluation off.

    .venv/bin/python bench/eval_bench.py [--rounds 2] [--section solve] [--target 450]

Writes bench/results/eval_bench.json, one key per section; running some sections keeps the others' results.
The machine is shared and noisy: read the ratios, not the absolute seconds.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402

NAME = "eval_bench"
SOLVE_VARIANTS = {
    "off": ["evaluation=off"],
    "driver": ["evaluation=default"],
    "parallel_runner": ["evaluation=parallel"],
}


def _iteration_costs(progress: Path) -> dict[str, Any]:
    """Mean iteration time with and without an evaluation, from a run's progress.csv."""
    with progress.open() as f:
        rows = list(csv.DictReader(f))
    evaluated = [float(r["iter_s"]) for r in rows if r.get("eval_return_mean")]
    plain = [float(r["iter_s"]) for r in rows if not r.get("eval_return_mean")]
    out: dict[str, Any] = {"evaluations": len(evaluated), "plain_iter_s": round(statistics.mean(plain), 3) if plain else None}
    if evaluated and plain:
        out["eval_iter_s"] = round(statistics.mean(evaluated), 3)
        out["eval_extra_s"] = round(out["eval_iter_s"] - out["plain_iter_s"], 3)
        # The evaluations' extra time spread over every iteration, as a fraction of a plain iteration.
        out["eval_overhead_per_iteration"] = round(
            out["eval_extra_s"] * len(evaluated) / len(rows) / out["plain_iter_s"], 3)
    return out


def _train(target: float, overrides: list[str], seed: int) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    s = benchkit.timed_json_run(
        [sys.executable, "-m", "trainer", f"output_dir={out}", f"stop.episode_return_mean={target}", f"seed={seed}",
         f"resources.ray_tmp_dir={tempfile.mkdtemp(prefix='rb', dir='/tmp')}", *overrides], env)
    startup = (s.get("startup") or {}).get("before_first_sample") or 0.0
    return {"seed": seed, "solved": (s["episode_return_mean"] or 0) >= target, "wall_s": s["process_wall_s"],
            "train_s": round(s["process_wall_s"] - startup, 2), "env_steps": s["env_steps"],
            "iterations": s["iterations"], "episode_return_mean": s["episode_return_mean"],
            "eval_return_mean": s.get("eval_return_mean"), "best_eval_return_mean": s.get("best_eval_return_mean"),
            **_iteration_costs(out / "progress.csv")}


def solve(rounds: int, target: float) -> dict[str, Any]:
    seeds = {name: itertools.count(1) for name in SOLVE_VARIANTS}  # round k: seed k for every variant
    variants: dict[str, Callable[[], dict]] = {
        name: (lambda o=overrides, n=name: _train(target, o, next(seeds[n]))) for name, overrides in SOLVE_VARIANTS.items()}
    runs = benchkit.interleave(variants, rounds, lambda name, r: (
        f"wall {r['wall_s']:6.1f}s  train {r['train_s']:6.1f}s  steps {r['env_steps']:>7,}  evals {r['evaluations']:2d}"
        f"  eval +{r.get('eval_extra_s') or 0:.2f}s  best eval {r['best_eval_return_mean']}  solved {r['solved']}"))
    keys = ("wall_s", "train_s", "env_steps", "iterations", "evaluations", "plain_iter_s", "eval_iter_s",
            "eval_extra_s", "eval_overhead_per_iteration")
    med = {name: {k: benchkit.median(rows, k) for k in keys} | {"solved": sum(r["solved"] for r in rows)}
           for name, rows in runs.items()}
    off = med["off"]
    ratios = {name: {k: round(m[k] / off[k], 3) for k in ("wall_s", "train_s", "env_steps") if m[k] and off[k]}
              for name, m in med.items() if name != "off"}
    return {"what": f"process start -> CartPole PPO solved (training return >= {target:g}), evaluation off vs on",
            "target": target, "rounds": rounds, "variants": SOLVE_VARIANTS, "median": med,
            "ratio_over_off": ratios, "runs": runs}


SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "solve": lambda a: solve(a.rounds, a.target),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--target", type=float, default=450.0)
    ap.add_argument("--section", action="append", choices=sorted(SECTIONS),
                    help="section to run (repeatable; default: all)")
    args = ap.parse_args()
    load = os.getloadavg()
    path = benchkit.RESULTS / f"{NAME}.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    for name in args.section or sorted(SECTIONS):
        report[name] = SECTIONS[name](args) | {"command": f"bench/eval_bench.py --section {name} --rounds {args.rounds}"}
        report[name]["machine"] = benchkit.machine(load)
    report.pop("command", None)
    benchkit.write(NAME, {"command": "bench/eval_bench.py " + " ".join(sys.argv[1:]), **report})
    solve_med = report.get("solve", {}).get("median")
    if solve_med:
        for name, m in solve_med.items():
            print(f"{name:16s} wall {m['wall_s']}s  train {m['train_s']}s  env steps {m['env_steps']}  "
                  f"evaluations {m['evaluations']}  one evaluation +{m['eval_extra_s']}s", flush=True)


if __name__ == "__main__":
    main()
