"""A plain training loop (tune=none): train, check the stop criteria after every iteration, checkpoint, resume."""

from __future__ import annotations

import math
import os
import tempfile
import time
from typing import Any

from omegaconf import OmegaConf

from rl_checkpoint import BEST, FINAL, CheckpointError, CheckpointMetadata, RunCheckpoints, Storage, checkpoint_rel, iter_name
from trainer.artifacts import Progress, RunResult, learning_curve_png, read_csv_rows, row_from_result
from trainer.errors import TrainerError
from trainer.metrics import checkpoint_saved
from trainer.signals import STOP, Stopped
from trainer.startup import STARTUP
from trainer.stopping import stop_reason


def checkpoint_metadata(cfg, name: str, row: dict[str, Any]) -> CheckpointMetadata:
    """What the policy server needs to know about a checkpoint of this run besides the RLModule itself."""
    from rl_envs import get_spec

    env = OmegaConf.to_container(cfg.env, resolve=True)
    return CheckpointMetadata.new(
        experiment=cfg.experiment, name=name, iteration=row["iteration"], env_steps=row["env_steps"],
        episode_return_mean=row["episode_return_mean"], env=env["name"], env_config=env["env_config"],
        framestack=get_spec(env["name"]).framestack, algo=cfg.algo.name,
    )


def _resolve_resume(cfg, ckpts: RunCheckpoints, storage: Storage) -> str | None:
    mode = cfg.fault_tolerance.resume  # auto | never | must (checked by trainer.validate)
    latest = ckpts.latest
    if mode == "never":
        if latest:
            raise TrainerError(
                f"output_dir {storage.location} already holds a run (checkpoint {latest}); "
                "pass fault_tolerance.resume=auto to continue it or choose another output_dir"
            )
        return None
    if latest and not ckpts.is_complete(latest):
        raise TrainerError(f"checkpoint to resume is missing or incomplete: {storage.uri(latest)}")
    if mode == "must" and not latest:
        raise TrainerError(f"no checkpoint to resume in {storage.location} (fault_tolerance.resume=must)")
    return latest


def preflight(cfg, storage: Storage) -> None:
    """Resume problems (missing checkpoint, resume=must with nothing to resume) surface before Ray starts."""
    _resolve_resume(cfg, RunCheckpoints(storage, cfg.checkpoint.keep), storage)


def train_loop(cfg, config, storage: Storage, log) -> RunResult:
    """Run until a stop criterion holds."""
    # RLlib/Tune imports here, not at the top: the entry point imports this module before ray.init (trainer.startup).
    from trainer.callbacks import window_history
    from trainer.metrics import checkpoint_saved
    from trainer.stopping import stop_reason

    ckpts = RunCheckpoints(storage, cfg.checkpoint.keep)
    resume_from = _resolve_resume(cfg, ckpts, storage)

    local_dir = storage.path() if storage.local else tempfile.mkdtemp(prefix="rl-platform-")
    rows: list[dict[str, Any]] = []
    if resume_from and storage.exists("progress.csv"):
        with storage.fs.open_input_stream(storage.path("progress.csv")) as f:
            rows = [r for r in read_csv_rows(f.read()) if r["iteration"] <= ckpts.state.iteration]
    progress = Progress(local_dir, rows)

    t_build = time.time()
    algo = config.build_algo()
    if resume_from:
        try:
            algo.restore_from_path(storage.path(resume_from), filesystem=storage.fs)
        except Exception as e:  # noqa: BLE001 - a truncated/corrupt/partial checkpoint: one line, no traceback
            algo.stop()
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise TrainerError(
                f"checkpoint to resume is unreadable: {storage.uri(resume_from)} ({type(e).__name__}: {first}); "
                "restore it, or pass fault_tolerance.resume=never with a new output_dir"
            ) from None
        # The return window is ours, not RLlib's state: carry it over so a resumed run judges "solved" alike.
        cb = window_history(algo)
        if cb is not None:
            cb.history.extend((int(n), float(m)) for n, m in ckpts.state.return_history)
        log(f"resumed from {storage.uri(resume_from)} at iteration {algo.iteration}, "
            f"{ckpts.state.env_steps} env steps")
    STARTUP.mark("build")
    log(f"algorithm built in {time.time() - t_build:.1f}s; training (stop: {OmegaConf.to_container(cfg.stop)})")

    best_ret = ckpts.state.best["episode_return_mean"] if ckpts.state.best else -math.inf
    every = cfg.checkpoint.every_n_iterations
    stop = OmegaConf.to_container(cfg.stop)
    prior_wall = float(ckpts.state.wall_s)
    t0 = time.time()
    steps_before = int(ckpts.state.env_steps)
    iters = 0
    restarts = 0
    reason = None
    row: dict[str, Any] | None = rows[-1] if rows else None

    def checkpoint(name: str, **extra: Any) -> str:
        nonlocal best_ret
        rel = ckpts.save(algo, name, checkpoint_metadata(cfg, name, row))
        if not math.isnan(row["episode_return_mean"]) and row["episode_return_mean"] >= best_ret:
            best_ret = row["episode_return_mean"]
            ckpts.mark_best(rel, checkpoint_metadata(cfg, BEST, row))
        return rel

    # SIGTERM/SIGINT (trainer.signals): checkpoint at the end of the iteration, then stop.
    STOP.latest = lambda: storage.uri(ckpts.latest) if ckpts.latest else None
    try:
        while reason is None:
            if STOP.requested and iters == 0:
                raise Stopped(STOP.requested, STOP.latest(), saved=False)
            t_iter = time.time()
            result = algo.train()
            now = time.time()
            iters += 1
            if iters == 1:
                STARTUP.first_result(result)
                log(STARTUP.line())
            row = row_from_result(result, prior_wall + now - t0, now - t_iter, steps_before)
            if _runner_restarts(algo) > restarts:  # a crashed env runner was replaced (fault_tolerance)
                restarts = _runner_restarts(algo)
                log(f"env runner restarted ({restarts} restart(s) in this run); training continues")
            steps_before = row["env_steps"]
            progress.add(row)
            reason = stop_reason(stop, return_mean=row["episode_return_mean"], return_window=row["return_window"],
                                 env_steps=row["env_steps"], iterations=iters, wall_s=now - t0)
            if cfg.log_every and (iters % cfg.log_every == 0 or reason):
                log(
                    f"iter {row['iteration']:4d} | env steps {row['env_steps']:>9,} | "
                    f"return {row['episode_return_mean']:8.2f} | {row['env_steps_per_s']:>7,.0f} steps/s | "
                    f"{row['wall_s']:7.1f}s"
                )
            if reason is None and ((every and row["iteration"] % every == 0) or STOP.requested):
                rel = checkpoint(iter_name(row["iteration"]))
                ckpts.add_periodic(rel)
                _flush(storage, progress, local_dir)
                _commit(ckpts, rel, row, algo)
                checkpoint_saved(algo)
            if reason is None and STOP.requested:
                raise Stopped(STOP.requested, storage.uri(rel), saved=True)
        log(f"stopping: {reason}")
        final = checkpoint(FINAL)
        _flush(storage, progress, local_dir)
        _commit(ckpts, final, row, algo, stop_reason=reason)
    except (OSError, CheckpointError) as e:  # the output storage failed (store down, disk full): one line, what is safe
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        kept = f"the last complete checkpoint {storage.uri(ckpts.latest)} is intact" if ckpts.latest else (
            "no checkpoint was completed")
        raise TrainerError(f"cannot write to output_dir {storage.location}: {first}; {kept}: rerun to resume") from None
    finally:
        progress.close()
        algo.stop()

    storage.write_bytes(learning_curve_png(progress.rows, cfg.experiment, cfg.stop.episode_return_mean), "learning_curve.png")
    return RunResult(
        checkpoint=storage.uri(final),
        best_checkpoint=storage.uri(checkpoint_rel(BEST)) if ckpts.state.best else None,
        episode_return_mean=row["episode_return_mean"],
        env_steps=row["env_steps"],
        iterations=row["iteration"],
        extra={"stop_reason": reason, "resumed_from": storage.uri(resume_from) if resume_from else None,
               "env_runner_restarts": restarts},
    )


def _commit(ckpts: RunCheckpoints, rel: str, row: dict[str, Any], algo, **extra: Any) -> None:
    ckpts.commit(rel, iteration=row["iteration"], env_steps=row["env_steps"],
                 episode_return_mean=row["episode_return_mean"], wall_s=row["wall_s"],
                 return_history=_history(algo), **extra)


def _runner_restarts(algo) -> int:
    group = getattr(algo, "env_runner_group", None)
    return int(group.num_remote_worker_restarts()) if group is not None else 0


def _history(algo) -> list[list[float]]:
    from trainer.callbacks import window_history

    cb = window_history(algo)
    return [[n, m] for n, m in cb.history] if cb is not None else []


def _flush(storage: Storage, progress: Progress, local_dir: str) -> None:
    progress.flush()
    storage.write_bytes(progress.csv_bytes(), "progress.csv")
    if not storage.local:
        storage.upload_dir(os.path.join(local_dir, "tb"), "tb")
