"""Does our Pong configuration learn? A bounded-wall-time training run on CPU, recorded.

Runs the real trainer (`python -m trainer experiment=<pong_ppo|pong_appo> stop.wall_s=<minutes x 60>`, plus any
extra Hydra overrides), reads its progress.csv (return of the last 20 training episodes and the greedy evaluations
the run made, vs env steps and vs wall time), then plays a final greedy evaluation of the final checkpoint with
`rl-eval` (seeded episodes, mean and 95% bootstrap CI; explore=False, as the server acts). Random play scores about
-21; the target is an evaluation return >= -17 within 45 minutes on 2 cores (issue 23).

Writes bench/results/pong_learning.json and, with matplotlib, .png. Not part of `make test`.

    .venv/bin/python bench/pong_learning.py --minutes 45                       # the recorded run (PPO)
    .venv/bin/python bench/pong_learning.py --experiment pong_appo --minutes 45 env.backend=envpool
    .venv/bin/python bench/pong_learning.py --minutes 3 --eval-episodes 2      # a smoke run of the script
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402

REPO = benchkit.REPO
RANDOM_RETURN, TARGET = -21.0, -17.0


def _float(v: str) -> float | None:
    return float(v) if v not in ("", None) and v.lower() != "nan" else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiment", default="pong_ppo", choices=["pong_ppo", "pong_appo"])
    ap.add_argument("--minutes", type=float, default=45.0, help="training wall time (the trainer's stop.wall_s)")
    ap.add_argument("--eval-episodes", type=int, default=10, help="final greedy evaluation (rl-eval)")
    ap.add_argument("--output-dir", default=None, help="the run's output_dir (default: a temp dir, kept)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for the trainer")
    args = ap.parse_args()
    load = os.getloadavg()
    out = Path(args.output_dir or tempfile.mkdtemp(prefix="pong_learning_"))
    cmd = [sys.executable, "-m", "trainer", f"experiment={args.experiment}", f"output_dir={out}",
           f"stop.wall_s={args.minutes * 60:.0f}", "stop.env_steps=null", *args.overrides]
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, text=True, stdout=subprocess.PIPE)
    wall = time.time() - t0
    if proc.returncode != 0:
        sys.exit(f"trainer exited {proc.returncode}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = list(csv.DictReader((out / "progress.csv").open()))
    curve = [{"iteration": int(r["iteration"]), "env_steps": int(r["env_steps"]), "wall_s": float(r["wall_s"]),
              "episode_return_mean": _float(r["episode_return_mean"]),
              "eval_return_mean": _float(r.get("eval_return_mean", "")),
              "env_steps_per_s": float(r["env_steps_per_s"])} for r in rows]

    eval_cmd = [str(REPO / ".venv" / "bin" / "rl-eval"), str(out), "--select", "final",
                "--episodes", str(args.eval_episodes), "--workers", "0", "--json"]
    print("$", " ".join(eval_cmd), flush=True)
    ev = subprocess.run(eval_cmd, cwd=REPO, text=True, stdout=subprocess.PIPE)
    final_eval = json.loads(ev.stdout.strip().splitlines()[-1]) if ev.returncode == 0 else {"error": ev.returncode}
    keep = ("mean", "std", "min", "max", "ci95", "episodes", "returns", "lengths", "seeds", "wall_s")
    final_eval = {k: final_eval[k] for k in keep if k in final_eval} or final_eval
    evals = [c["eval_return_mean"] for c in curve if c["eval_return_mean"] is not None]
    best = max(evals + ([final_eval["mean"]] if "mean" in final_eval else []), default=None)
    report = {
        "command": " ".join(["bench/pong_learning.py", f"--experiment {args.experiment}", f"--minutes {args.minutes:g}",
                             f"--eval-episodes {args.eval_episodes}", *args.overrides]),
        "trainer_command": " ".join(cmd[1:]),
        "experiment": args.experiment,
        "minutes": args.minutes,
        "process_wall_s": round(wall, 1),
        "env_steps": summary.get("env_steps"),
        "iterations": summary.get("iterations"),
        "curve": curve,
        "final_greedy_eval": final_eval,
        "random_return": RANDOM_RETURN,
        "target": f"greedy eval return >= {TARGET:g} within 45 minutes on 2 cores",
        "target_met": best is not None and best >= TARGET and args.minutes <= 45,
        "output_dir": str(out),
        "machine": benchkit.machine(load),
    }
    benchkit.write("pong_learning", report)
    try:
        _png(report)
    except ImportError:
        print("matplotlib not installed: JSON only", flush=True)
    fe = report["final_greedy_eval"]
    print(f"{args.experiment}: {report['env_steps']:,} env steps in {wall / 60:.1f} min; final greedy eval "
          f"{fe.get('mean')} (95% CI {fe.get('ci95')}, {fe.get('episodes')} episodes); "
          f"target met: {report['target_met']}", flush=True)


def _png(report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=100, sharey=True)
    curve = report["curve"]
    for ax, x, label in ((axes[0], "env_steps", "env steps"), (axes[1], "wall_s", "wall time (s)")):
        tr = [(c[x], c["episode_return_mean"]) for c in curve if c["episode_return_mean"] is not None]
        ev = [(c[x], c["eval_return_mean"]) for c in curve if c["eval_return_mean"] is not None]
        ax.plot([a for a, _ in tr], [b for _, b in tr], marker=".", label="training return (last 20 episodes)")
        if ev:
            ax.plot([a for a, _ in ev], [b for _, b in ev], marker="o", color="tab:green", label="greedy eval")
        fe = report["final_greedy_eval"]
        if "mean" in fe and curve:
            lo, hi = fe["ci95"]
            ax.errorbar([curve[-1][x]], [fe["mean"]], yerr=[[fe["mean"] - lo], [hi - fe["mean"]]],
                        fmt="s", color="black", capsize=4, label="final greedy eval (95% CI)")
        ax.axhline(TARGET, color="tab:red", linestyle="--", linewidth=1, label=f"target {TARGET:g}")
        ax.axhline(RANDOM_RETURN, color="grey", linestyle=":", linewidth=1, label="random play")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("episode return")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{report['experiment']}, {report['minutes']:g} min on CPU")
    fig.tight_layout()
    fig.savefig(REPO / "bench" / "results" / "pong_learning.png")
    plt.close(fig)


if __name__ == "__main__":
    main()
