"""A plain training loop (tune=none): train, check the stop criteria after every iteration, checkpoint, resume."""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import os
import tempfile
import time
from typing import Any

from omegaconf import OmegaConf

from trainer.callbacks import WINDOW, window_history
from trainer.artifacts import Progress, learning_curve_png, read_csv_rows, row_from_result
from trainer.errors import TrainerError
from trainer.storage import Storage

POLICY_ID = "default_policy"
MODULE_DIR = f"learner_group/learner/rl_module/{POLICY_ID}"
STATE_FILE = "state.json"


def stop_reason(cfg, row: dict[str, Any], run_wall_s: float, iters_this_run: int) -> str | None:
    stop = cfg.stop
    ret = row["episode_return_mean"]
    if (stop.episode_return_mean is not None and not math.isnan(ret) and ret >= stop.episode_return_mean
            and row["return_window"] >= WINDOW):
        return f"episode_return_mean {ret:.1f} (last {row['return_window']} episodes) >= {stop.episode_return_mean:g}"
    if stop.env_steps is not None and row["env_steps"] >= stop.env_steps:
        return f"env_steps {row['env_steps']} >= {stop.env_steps}"
    if stop.iterations is not None and iters_this_run >= stop.iterations:
        return f"iterations {iters_this_run} >= {stop.iterations}"
    if stop.wall_s is not None and run_wall_s >= stop.wall_s:
        return f"wall time {run_wall_s:.0f}s >= {stop.wall_s:g}s"
    return None


def checkpoint_metadata(cfg, name: str, row: dict[str, Any]) -> dict[str, Any]:
    """rl_platform.json: what the policy server needs to know about a checkpoint besides the RLModule itself."""
    from rl_envs import get_spec

    ident = f"{cfg.experiment}-{name}-iter{row['iteration']}-steps{row['env_steps']}"
    env = OmegaConf.to_container(cfg.env, resolve=True)
    ret = row["episode_return_mean"]
    return {
        "format_version": 1,
        "policy_id": POLICY_ID,
        "module_dir": MODULE_DIR,
        "env": env["name"],
        "env_config": env["env_config"],
        "framestack": get_spec(env["name"]).framestack,
        "algo": cfg.algo.name,
        "experiment": cfg.experiment,
        "iteration": row["iteration"],
        "env_steps": row["env_steps"],
        "episode_return_mean": None if ret is None or math.isnan(ret) else ret,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "checkpoint_id": ident + "-" + hashlib.sha1(f"{ident}{time.time_ns()}".encode()).hexdigest()[:8],
    }


class CheckpointManager:
    """checkpoints/iter_NNNNNN (periodic, last `keep`), checkpoints/best, checkpoints/final + state.json pointer.

    state.json is written only after a checkpoint is complete, so a process killed mid-save resumes from the
    previous complete checkpoint.
    """

    def __init__(self, storage: Storage, cfg):
        self.storage = storage
        self.cfg = cfg
        self.state: dict[str, Any] = {}
        if storage.exists(STATE_FILE):
            self.state = storage.read_json(STATE_FILE)

    @property
    def latest(self) -> str | None:
        return self.state.get("latest_checkpoint")

    def save(self, algo, name: str, row: dict[str, Any]) -> str:
        rel = f"checkpoints/{name}"
        self.storage.delete_dir(rel)
        algo.save_to_path(self.storage.path(rel), filesystem=self.storage.fs)
        self.storage.write_json(checkpoint_metadata(self.cfg, name, row), rel, "rl_platform.json")
        return rel

    def mark_best(self, rel: str, row: dict[str, Any]) -> dict[str, Any]:
        """Copy checkpoint `rel` to checkpoints/best (with its own metadata); returns the state's `best` entry."""
        self.storage.copy_dir((rel,), ("checkpoints/best",))
        self.storage.write_json(checkpoint_metadata(self.cfg, "best", row), "checkpoints/best", "rl_platform.json")
        return {"checkpoint": "checkpoints/best", **{k: row[k] for k in ("iteration", "env_steps", "episode_return_mean")}}

    def commit(self, rel: str, row: dict[str, Any], best: dict[str, Any] | None, extra: dict[str, Any]) -> None:
        self.state.update(extra)
        self.state.update(
            latest_checkpoint=rel,
            iteration=row["iteration"],
            env_steps=row["env_steps"],
            episode_return_mean=row["episode_return_mean"],
        )
        if best is not None:
            self.state["best"] = best
        self.storage.write_json(self.state, STATE_FILE)

    def prune(self) -> None:
        keep = max(self.cfg.checkpoint.keep, 1)
        periodic = sorted(self.state.get("periodic", []))
        for old in periodic[:-keep]:
            self.storage.delete_dir(old)
        self.state["periodic"] = periodic[-keep:]


def _resolve_resume(cfg, ckpts: CheckpointManager, storage: Storage) -> str | None:
    mode = cfg.fault_tolerance.resume  # auto | never | must (checked by trainer.validate)
    latest = ckpts.latest
    if mode == "never":
        if latest:
            raise TrainerError(
                f"output_dir {storage.location} already holds a run (checkpoint {latest}); "
                "pass fault_tolerance.resume=auto to continue it or choose another output_dir"
            )
        return None
    if latest and not storage.exists(latest, MODULE_DIR):
        raise TrainerError(f"checkpoint to resume is missing or incomplete: {storage.uri(latest)}")
    if mode == "must" and not latest:
        raise TrainerError(f"no checkpoint to resume in {storage.location} (fault_tolerance.resume=must)")
    return latest


def preflight(cfg, storage: Storage) -> None:
    """Resume problems (missing checkpoint, resume=must with nothing to resume) surface before Ray starts."""
    _resolve_resume(cfg, CheckpointManager(storage, cfg), storage)


def train_loop(cfg, config, storage: Storage, log) -> dict[str, Any]:
    """Run until a stop criterion holds; returns the summary."""
    ckpts = CheckpointManager(storage, cfg)
    resume_from = _resolve_resume(cfg, ckpts, storage)

    local_dir = storage.path() if storage.local else tempfile.mkdtemp(prefix="rl-platform-")
    rows: list[dict[str, Any]] = []
    if resume_from and storage.exists("progress.csv"):
        with storage.fs.open_input_stream(storage.path("progress.csv")) as f:
            rows = [r for r in read_csv_rows(f.read()) if r["iteration"] <= ckpts.state["iteration"]]
    progress = Progress(local_dir, rows)

    t_build = time.time()
    algo = config.build_algo()
    if resume_from:
        algo.restore_from_path(storage.path(resume_from), filesystem=storage.fs)
        # The return window is ours, not RLlib's state: carry it over so a resumed run judges "solved" alike.
        cb = window_history(algo)
        if cb is not None:
            cb.history.extend((int(n), float(m)) for n, m in ckpts.state.get("return_history", []))
        log(f"resumed from {storage.uri(resume_from)} at iteration {algo.iteration}, "
            f"{ckpts.state.get('env_steps', 0)} env steps")
    log(f"algorithm built in {time.time() - t_build:.1f}s; training (stop: {OmegaConf.to_container(cfg.stop)})")

    best = ckpts.state.get("best")
    best_ret = best["episode_return_mean"] if best else -math.inf
    every = cfg.checkpoint.every_n_iterations
    prior_wall = float(ckpts.state.get("wall_s", 0.0))
    t0 = time.time()
    steps_before = int(ckpts.state.get("env_steps", 0))
    iters = 0
    reason = None
    row: dict[str, Any] | None = rows[-1] if rows else None
    try:
        while reason is None:
            t_iter = time.time()
            result = algo.train()
            now = time.time()
            iters += 1
            row = row_from_result(result, prior_wall + now - t0, now - t_iter, steps_before)
            steps_before = row["env_steps"]
            progress.add(row)
            reason = stop_reason(cfg, row, now - t0, iters)
            if cfg.log_every and (iters % cfg.log_every == 0 or reason):
                log(
                    f"iter {row['iteration']:4d} | env steps {row['env_steps']:>9,} | "
                    f"return {row['episode_return_mean']:8.2f} | {row['env_steps_per_s']:>7,.0f} steps/s | "
                    f"{row['wall_s']:7.1f}s"
                )
            if reason is None and every and row["iteration"] % every == 0:
                rel = ckpts.save(algo, f"iter_{row['iteration']:06d}", row)
                ckpts.state.setdefault("periodic", []).append(rel)
                if not math.isnan(row["episode_return_mean"]) and row["episode_return_mean"] >= best_ret:
                    best_ret = row["episode_return_mean"]
                    best = ckpts.mark_best(rel, row)
                ckpts.prune()
                _flush(storage, progress, local_dir)
                ckpts.commit(rel, row, best, {"wall_s": row["wall_s"], "return_history": _history(algo)})
        log(f"stopping: {reason}")
        final = ckpts.save(algo, "final", row)
        if not math.isnan(row["episode_return_mean"]) and row["episode_return_mean"] >= best_ret:
            best = ckpts.mark_best(final, row)
        _flush(storage, progress, local_dir)
        ckpts.commit(final, row, best, {"wall_s": row["wall_s"], "stop_reason": reason,
                                        "return_history": _history(algo)})
    finally:
        progress.close()
        algo.stop()

    storage.write_bytes(learning_curve_png(progress.rows, cfg.experiment, cfg.stop.episode_return_mean), "learning_curve.png")
    return {
        "checkpoint": storage.uri(final),
        "best_checkpoint": storage.uri("checkpoints/best") if best else None,
        "episode_return_mean": None if math.isnan(row["episode_return_mean"]) else round(row["episode_return_mean"], 3),
        "env_steps": row["env_steps"],
        "iterations": row["iteration"],
        "stop_reason": reason,
        "resumed_from": storage.uri(resume_from) if resume_from else None,
    }


def _history(algo) -> list[list[float]]:
    cb = window_history(algo)
    return [[n, m] for n, m in cb.history] if cb is not None else []


def _flush(storage: Storage, progress: Progress, local_dir: str) -> None:
    progress.flush()
    storage.write_bytes(progress.csv_bytes(), "progress.csv")
    if not storage.local:
        storage.upload_dir(os.path.join(local_dir, "tb"), "tb")
