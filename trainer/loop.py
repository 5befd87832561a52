"""A plain training loop (tune=none): train, check the stop criteria after every iteration, checkpoint, resume."""

from __future__ import annotations

import math
import os
import tempfile
import time
from typing import Any

from omegaconf import OmegaConf

from rl_checkpoint import BEST, FINAL, CheckpointError, CheckpointMetadata, RunCheckpoints, Storage, checkpoint_rel, iter_name
from trainer.artifacts import Progress, RunResult, latest_eval, learning_curve_png, read_csv_rows, row_from_result
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
        episode_return_mean=row["episode_return_mean"], eval_return_mean=row.get("eval_return_mean"),
        env=env["name"], env_config=env["env_config"],
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

    judge = BestJudge(cfg.evaluation.interval > 0, ckpts.state.best if resume_from else None)
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
        rel = ckpts.save(algo, name, checkpoint_metadata(cfg, name, row))
        judge_best(rel, final=name == FINAL)
        return rel

    def judge_best(rel: str | None, final: bool = False) -> None:
        """checkpoints/best after this iteration: `rel` is its checkpoint, None if it has none (then `algo` is
        saved there directly when this iteration's evaluation is the best so far)."""
        by = judge(row, checkpointed=rel is not None, final=final)
        if by:
            ckpts.mark_best(rel, checkpoint_metadata(cfg, BEST, row), judged_by=by, algo=algo)

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
                                 env_steps=row["env_steps"], iterations=iters, wall_s=now - t0,
                                 eval_return_mean=row["eval_return_mean"])
            if cfg.log_every and (iters % cfg.log_every == 0 or reason):
                evaluated = "" if math.isnan(row["eval_return_mean"]) else (
                    f"eval {row['eval_return_mean']:8.2f} ({row['eval_episodes']} ep) | ")
                log(
                    f"iter {row['iteration']:4d} | env steps {row['env_steps']:>9,} | "
                    f"return {row['episode_return_mean']:8.2f} | {evaluated}{row['env_steps_per_s']:>7,.0f} steps/s | "
                    f"{row['wall_s']:7.1f}s"
                )
            # Read once: a signal that lands between deciding this iteration's checkpoint and acting on the stop
            # would otherwise stop with no checkpoint taken (it is acted on after the next iteration instead).
            stopping = STOP.requested is not None
            periodic = reason is None and ((every and row["iteration"] % every == 0) or stopping)
            if reason is None and not periodic:
                judge_best(None)  # an evaluated iteration between periodic checkpoints may be the best
            if periodic:
                rel = checkpoint(iter_name(row["iteration"]))
                ckpts.add_periodic(rel)
                _flush(storage, progress, local_dir)
                _commit(ckpts, rel, row, algo, eval_return_mean=latest_eval(progress.rows))
                checkpoint_saved(algo)
            if reason is None and stopping:
                raise Stopped(STOP.requested, storage.uri(rel), saved=True)
        log(f"stopping: {reason}")
        final = checkpoint(FINAL)
        _flush(storage, progress, local_dir)
        _commit(ckpts, final, row, algo, stop_reason=reason, eval_return_mean=latest_eval(progress.rows))
    except (OSError, CheckpointError) as e:  # the output storage failed (store down, disk full): one line, what is safe
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        kept = f"the last complete checkpoint {storage.uri(ckpts.latest)} is intact" if ckpts.latest else (
            "no checkpoint was completed")
        raise TrainerError(f"cannot write to output_dir {storage.location}: {first}; {kept}: rerun to resume") from None
    finally:
        progress.close()
        algo.stop()

    storage.write_bytes(learning_curve_png(progress.rows, cfg.experiment, cfg.stop.episode_return_mean), "learning_curve.png")
    best = ckpts.state.best or {}
    return RunResult(
        checkpoint=storage.uri(final),
        best_checkpoint=storage.uri(checkpoint_rel(BEST)) if ckpts.state.best else None,
        episode_return_mean=row["episode_return_mean"],
        env_steps=row["env_steps"],
        iterations=row["iteration"],
        extra={"stop_reason": reason, "resumed_from": storage.uri(resume_from) if resume_from else None,
               "env_runner_restarts": restarts},
        eval_return_mean=ckpts.state.eval_return_mean,
        best_eval_return_mean=best.get("eval_return_mean") if best.get("judged_by") == EVAL else None,
    )


EVAL, TRAINING = "eval_return_mean", "episode_return_mean"  # what checkpoints/best is judged by (RunState.best)


class BestJudge:
    """Which iterations become checkpoints/best.

    Evaluation on: an iteration whose greedy evaluation return is >= the best evaluation so far; iterations without
    an evaluation are not judged. A run that ends before its first evaluation makes its final checkpoint best,
    judged by the training return, and any later evaluation replaces it. Evaluation off: a checkpointed iteration
    (periodic or final) whose training return (last 20 episodes, exploring) is >= the best so far."""

    def __init__(self, evaluation: bool, best: dict[str, Any] | None):
        self.evaluation = evaluation
        self.best = dict(best) if best else None  # RunState.best of the run resumed, None for a fresh run

    def _figure(self, by: str) -> float:
        b = self.best
        if not b or b.get("judged_by", TRAINING) != by or b.get(by) is None:
            return -math.inf
        return float(b[by])

    def __call__(self, row: dict[str, Any], checkpointed: bool, final: bool) -> str | None:
        """-> the figure iteration `row` wins best by, or None when it does not become best. `checkpointed`: the
        iteration has a periodic or final checkpoint."""
        by = None
        if self.evaluation:
            if not math.isnan(row["eval_return_mean"]) and row["eval_return_mean"] >= self._figure(EVAL):
                by = EVAL
            elif final and self.best is None and not math.isnan(row["episode_return_mean"]):
                by = TRAINING
        elif (checkpointed and not math.isnan(row["episode_return_mean"])
              and row["episode_return_mean"] >= self._figure(TRAINING)):
            by = TRAINING
        if by:
            self.best = {EVAL: row["eval_return_mean"], TRAINING: row["episode_return_mean"], "judged_by": by}
        return by


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
