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


def _solved_checkpoint(target: float) -> str:
    """One CartPole PPO run to the target: long greedy episodes, the case evaluation throughput matters for."""
    out = Path(tempfile.mkdtemp(prefix="bench-eval-ckpt-"))
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    s = benchkit.timed_json_run([sys.executable, "-m", "trainer", f"output_dir={out}", f"stop.episode_return_mean={target}",
                                 "evaluation=off", f"resources.ray_tmp_dir={tempfile.mkdtemp(prefix='rb', dir='/tmp')}"], env)
    return s["checkpoint"]


def rl_eval(rounds: int, episodes: int, checkpoint: str | None, target: float) -> dict[str, Any]:
    """rl-eval episodes/s: in this process vs through the policy server's HTTP API (one client, a request per step),
    and the `rl-eval` command (its process start-up included) in process vs on two Ray workers (Ray's start-up
    included), interleaved on the same seeds; the returns must agree everywhere."""
    import subprocess
    import time

    sys.path[:0] = [str(benchkit.REPO), str(benchkit.REPO / "tests")]
    from serve_bench import stop_server, wait_ready
    from trainer_helpers import free_ports

    from rl_eval.cli import evaluate

    ckpt = checkpoint or _solved_checkpoint(target)
    work = Path(tempfile.mkdtemp(prefix="bench-rleval-", dir="/tmp"))
    port, metrics_port, proxy_port = free_ports(3)
    log = open(work / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "serving", "--policy", f"p={ckpt}", "--port", str(port),
                               "--proxy-port", str(proxy_port), "--metrics-port", str(metrics_port),
                               "--temp-dir", str(work / "ray")], cwd=benchkit.REPO,
                              stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        wait_ready(server, work / "server.log")
        url = f"http://127.0.0.1:{port}"

        def run(**kw) -> Callable[[], dict]:
            def go() -> dict:
                t0 = time.perf_counter()
                rec, _ = evaluate(ckpt, episodes=episodes, record=False, **kw)
                wall = time.perf_counter() - t0
                steps = sum(rec.lengths)
                return {"wall_s": round(wall, 3), "episodes_per_s": round(episodes / wall, 2),
                        "steps_per_s": round(steps / wall, 1), "mean": rec.mean, "returns": rec.returns}
            return go

        def cli(*args: str) -> Callable[[], dict]:
            # A process of its own: the embedded Ray's token auth must be set before `import ray`, which the
            # in-process variants have done in this one. Its wall includes the process and Ray start-up.
            def go() -> dict:
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, "-m", "rl_eval", ckpt, "--episodes", str(episodes), "--no-record",
                                      "--json", *args], cwd=benchkit.REPO, capture_output=True, text=True, timeout=900)
                wall = time.perf_counter() - t0
                if out.returncode != 0:
                    raise SystemExit(f"rl-eval failed: {out.stderr[-2000:]}")
                rec = json.loads(out.stdout.strip().splitlines()[-1])
                return {"wall_s": round(wall, 3), "episodes_per_s": round(episodes / wall, 2),
                        "steps_per_s": round(sum(rec["lengths"]) / wall, 1), "mean": rec["mean"], "returns": rec["returns"]}
            return go

        variants = {"in_process": run(workers=0), "server_1_client": run(workers=1, server=url, policy="p"),
                    "cli_ray_2_workers": cli("--workers", "2"), "cli_in_process": cli("--workers", "0")}
        runs = benchkit.interleave(variants, rounds, lambda name, r: (
            f"{r['episodes_per_s']:7.2f} episodes/s  {r['steps_per_s']:9.1f} steps/s  mean return {r['mean']:.1f}"))
    finally:
        stop_server(server)
        log.close()
    med = {name: {k: benchkit.median(rows, k) for k in ("wall_s", "episodes_per_s", "steps_per_s")}
           for name, rows in runs.items()}
    same = all(r["returns"] == runs["in_process"][0]["returns"] for rows in runs.values() for r in rows)
    base = med["in_process"]["steps_per_s"]
    return {"what": f"rl-eval, {episodes} greedy CartPole episodes of a solved policy (seeds 0..{episodes - 1})",
            "checkpoint": ckpt, "episodes": episodes, "rounds": rounds, "median": med,
            "ratio_over_in_process": {n: round(m["steps_per_s"] / base, 3) for n, m in med.items()},
            "same_returns_in_every_variant": same,
            "runs": {n: [{k: v for k, v in r.items() if k != "returns"} for r in rows] for n, rows in runs.items()}}


SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "solve": lambda a: solve(a.rounds, a.target),
    "rl_eval": lambda a: rl_eval(a.rounds, a.episodes, a.checkpoint, a.target),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--target", type=float, default=450.0)
    ap.add_argument("--episodes", type=int, default=20, help="rl_eval section: greedy episodes per variant")
    ap.add_argument("--checkpoint", default=None, help="rl_eval section: a solved CartPole checkpoint (else trains one)")
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
    for name, m in (report.get("rl_eval", {}).get("median") or {}).items():
        print(f"rl-eval {name:16s} {m['episodes_per_s']} episodes/s  {m['steps_per_s']} steps/s", flush=True)
    solve_med = report.get("solve", {}).get("median")
    if solve_med:
        for name, m in solve_med.items():
            print(f"{name:16s} wall {m['wall_s']}s  train {m['train_s']}s  env steps {m['env_steps']}  "
                  f"evaluations {m['evaluations']}  one evaluation +{m['eval_extra_s']}s", flush=True)


if __name__ == "__main__":
    main()
