"""What a run leaves behind besides checkpoints: progress CSV, TensorBoard events, learning-curve PNG, run summary."""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field
from typing import Any

from trainer.solved import (EVAL_EPISODES_KEY, EVAL_RETURN_KEY, POLICY_LAG_KEY, RETURN_MEAN_KEY, RETURN_WINDOW_KEY,
                            WINDOW)

# Columns of progress.csv: one row per training iteration. eval_* are empty in iterations without an evaluation.
COLUMNS = [
    "iteration",
    "env_steps",
    "episode_return_mean",
    "episodes",
    "return_window",
    "wall_s",
    "iter_s",
    "env_steps_per_s",
    "eval_return_mean",
    "eval_episodes",
    # APPO/IMPALA: learner updates the acting weights were behind (trainer/policy_lag.py); empty for the others.
    "policy_lag",
]


def row_from_result(result: dict[str, Any], wall_s: float, iter_s: float, steps_before: int) -> dict[str, Any]:
    env = result.get("env_runners", {})
    steps = int(result.get("num_env_steps_sampled_lifetime") or env.get("num_env_steps_sampled_lifetime") or 0)
    ret = result.get(RETURN_MEAN_KEY, env.get("episode_return_mean"))
    eval_ret = result.get(EVAL_RETURN_KEY)
    return {
        "iteration": int(result["training_iteration"]),
        "env_steps": steps,
        "episode_return_mean": float(ret) if ret is not None else math.nan,
        "episodes": int(env.get("num_episodes_lifetime") or 0),
        # Episodes behind episode_return_mean (>= WINDOW once that many have ended).
        "return_window": int(result.get(RETURN_WINDOW_KEY) or 0),
        "wall_s": round(wall_s, 3),
        "iter_s": round(iter_s, 3),
        "env_steps_per_s": round((steps - steps_before) / iter_s, 1) if iter_s > 0 else 0.0,
        # Greedy evaluation of this iteration (evaluation group); NaN / 0 without one.
        "eval_return_mean": math.nan if eval_ret is None else float(eval_ret),
        "eval_episodes": int(result.get(EVAL_EPISODES_KEY) or 0),
        "policy_lag": _float(result.get(POLICY_LAG_KEY)),
    }


def _float(value) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def _finite(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def latest_eval(rows: list[dict[str, Any]]) -> float | None:
    """The most recent evaluation return in `rows` (None before the first evaluation)."""
    return next((r["eval_return_mean"] for r in reversed(rows) if _finite(r.get("eval_return_mean"))), None)


class Progress:
    """Keeps rows in memory and mirrors them to progress.csv and TensorBoard under `local_dir`."""

    def __init__(self, local_dir: str, rows: list[dict[str, Any]] | None = None):
        self.local_dir = local_dir
        self.rows: list[dict[str, Any]] = list(rows or [])
        self._tb = None
        os.makedirs(local_dir, exist_ok=True)

    def _writer(self):
        if self._tb is None:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(self.local_dir, "tb"), flush_secs=10)
        return self._tb

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        tb = self._writer()
        step = row["env_steps"]
        for key in ("episode_return_mean", "env_steps_per_s", "iter_s", "policy_lag"):
            value = row[key]
            if _finite(value):
                tb.add_scalar(f"train/{key}", value, step)
        if _finite(row.get("eval_return_mean")):
            tb.add_scalar("eval/return_mean", row["eval_return_mean"], step)

    def csv_bytes(self) -> bytes:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=COLUMNS)
        w.writeheader()
        for r in self.rows:
            w.writerow({**r, "eval_return_mean": r["eval_return_mean"] if _finite(r.get("eval_return_mean")) else "",
                        "eval_episodes": r["eval_episodes"] if _finite(r.get("eval_return_mean")) else "",
                        "policy_lag": r["policy_lag"] if _finite(r.get("policy_lag")) else ""})
        return buf.getvalue().encode()

    def flush(self) -> None:
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_csv_rows(data: bytes) -> list[dict[str, Any]]:
    """progress.csv -> rows; a progress.csv written before the eval columns existed reads as "no evaluation"."""
    rows = []
    for r in csv.DictReader(io.StringIO(data.decode())):
        rows.append(
            {
                "iteration": int(r["iteration"]),
                "env_steps": int(r["env_steps"]),
                "episode_return_mean": float(r["episode_return_mean"]),
                "episodes": int(r["episodes"]),
                "return_window": int(r.get("return_window") or 0),
                "wall_s": float(r["wall_s"]),
                "iter_s": float(r["iter_s"]),
                "env_steps_per_s": float(r["env_steps_per_s"]),
                "eval_return_mean": float(r.get("eval_return_mean") or "nan"),
                "eval_episodes": int(r.get("eval_episodes") or 0),
                "policy_lag": float(r.get("policy_lag") or "nan"),
            }
        )
    return rows


def learning_curve_png(rows: list[dict[str, Any]], title: str, target: float | None) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    xs = [r["env_steps"] for r in rows]
    ys = [r["episode_return_mean"] for r in rows]
    ax.plot(xs, ys, marker=".", linewidth=1.5, label=f"training return (exploring; mean of last {WINDOW})")
    evals = [(r["env_steps"], r["eval_return_mean"]) for r in rows if _finite(r.get("eval_return_mean"))]
    if evals:
        ax.plot([x for x, _ in evals], [y for _, y in evals], marker="o", linewidth=1.5, color="tab:green",
                label="eval return (greedy)")
    if target is not None:
        ax.axhline(target, color="tab:red", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


@dataclass
class RunResult:
    """What a run (plain loop or Tune) ends with; `run_summary` turns it into the summary users read."""

    checkpoint: str  # local path or URI of the checkpoint to serve
    best_checkpoint: str | None
    episode_return_mean: float | None
    env_steps: int
    iterations: int
    extra: dict[str, Any] = field(default_factory=dict)  # stop_reason, resumed_from / trials, best_config, ...
    eval_return_mean: float | None = None  # the latest greedy evaluation's return (None: no evaluation yet)
    best_eval_return_mean: float | None = None  # the eval return checkpoints/best was judged by


def run_summary(experiment: str, output_dir: str, result: RunResult, wall_s: float) -> dict[str, Any]:
    """The run summary: the last stdout line of `python -m trainer` and summary.json. Built here only."""
    ret = result.episode_return_mean

    def rounded(v):
        return None if v is None or math.isnan(v) else round(float(v), 3)

    return {
        "experiment": experiment,
        "checkpoint": result.checkpoint,
        "episode_return_mean": rounded(ret),
        "eval_return_mean": rounded(result.eval_return_mean),
        "best_eval_return_mean": rounded(result.best_eval_return_mean),
        "env_steps": int(result.env_steps),
        "wall_s": round(wall_s, 2),
        "output_dir": output_dir,
        "best_checkpoint": result.best_checkpoint,
        "iterations": int(result.iterations),
        **result.extra,
    }
