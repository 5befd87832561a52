"""tune/ config group -> a Ray Tune experiment over the RLlib algorithm (ASHA, HyperBand, PBT).

Schedulers compare trials by `tune.metric` (default: the training return of the last 20 episodes), which every
iteration reports. With evaluation on and that default metric, the best trial and its best checkpoint are judged
like the plain loop's checkpoints/best: by the greedy evaluation return (`rank_metric`). Tune scores each checkpoint
by its own iteration's result, so a checkpoint of an iteration without an evaluation (NaN) never ranks; keep
checkpoint.every_n_iterations a multiple of evaluation.interval (both 10 by default).
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import OmegaConf

from rl_checkpoint import Storage, write_metadata
from trainer.artifacts import RunResult
from trainer.callbacks import EVAL_EPISODES_KEY, EVAL_RETURN_KEY, RETURN_MEAN_KEY
from trainer.errors import TrainerError
from trainer.metrics import tune_checkpoint_callback
from trainer.signals import STOP, Stopped
from trainer.stopping import ENV_STEPS_KEY, ITERATION_KEY, StopRule
from trainer.validate import check_param_space


def search_space(param_space: dict[str, Any]) -> dict[str, Any]:
    """{"lr": {"loguniform": [1e-4, 1e-3]}} -> {"lr": tune.loguniform(1e-4, 1e-3)}; plain values pass through.

    The shape of `param_space` was checked by `check_param_space` before Ray started."""
    from ray import tune

    out: dict[str, Any] = {}
    for key, spec in param_space.items():
        if isinstance(spec, dict):
            kind, args = next(iter(spec.items()))
            if kind in ("choice", "grid_search"):
                out[key] = getattr(tune, kind)(list(args))
            else:
                out[key] = getattr(tune, kind)(*args)
        else:
            out[key] = spec
    return out


def scheduler(tc, metric: str, mode: str):
    from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler, PopulationBasedTraining

    name = tc.scheduler
    if name == "asha":
        return ASHAScheduler(
            metric=metric, mode=mode, time_attr="training_iteration",
            grace_period=tc.grace_period, reduction_factor=tc.reduction_factor, max_t=tc.max_t,
        )
    if name == "hyperband":
        return HyperBandScheduler(
            metric=metric, mode=mode, time_attr="training_iteration", max_t=tc.max_t,
            reduction_factor=tc.reduction_factor,
        )
    if name == "pbt":
        return PopulationBasedTraining(
            metric=metric, mode=mode, time_attr="training_iteration",
            perturbation_interval=tc.perturbation_interval,
            hyperparam_mutations=search_space(OmegaConf.to_container(tc.param_space, resolve=True)),
        )
    raise TrainerError(f"unknown tune.scheduler {name!r}; known: none, asha, hyperband, pbt")


def rank_metric(cfg) -> tuple[str, str]:
    """(metric, mode) the best trial and checkpoint are chosen by: the greedy evaluation return when evaluation is
    on and tune.metric is the default training return, else tune.metric."""
    if cfg.evaluation.interval and cfg.tune.metric == RETURN_MEAN_KEY:
        return EVAL_RETURN_KEY, "max"
    return cfg.tune.metric, cfg.tune.mode


def _best_scored_checkpoint(result, metric: str, mode: str):
    """The trial's kept checkpoint with the best finite `metric` (the latest among equals), else its latest."""
    scored = [(m.get(metric), i, c) for i, (c, m) in enumerate(result.best_checkpoints or [])]
    scored = [(v, i, c) for v, i, c in scored if isinstance(v, (int, float)) and math.isfinite(v)]
    if not scored:
        return result.checkpoint
    sign = 1 if mode == "max" else -1
    return max(scored, key=lambda t: (sign * t[0], t[1]))[2]


def run_tune(cfg, build_algo_config, storage: Storage, log):
    """-> (RunResult, the best trial's ray.tune.Result)."""
    from ray import tune
    from ray.tune import CheckpointConfig, FailureConfig, RunConfig, TuneConfig

    tc = cfg.tune
    metric, mode = tc.metric, tc.mode
    rank, rank_mode = rank_metric(cfg)
    check_param_space(cfg)
    space = search_space(OmegaConf.to_container(tc.param_space, resolve=True))
    config = build_algo_config(cfg, algo_overrides=space if tc.scheduler != "pbt" else None)

    name = "tune"
    exp_path = storage.uri(name)
    trainable = config.algo_class
    if tune.Tuner.can_restore(exp_path) and cfg.fault_tolerance.resume != "never":
        log(f"resuming Tune experiment at {exp_path}")
        tuner = tune.Tuner.restore(exp_path, trainable=trainable, resume_errored=True, param_space=config)
    else:
        if cfg.fault_tolerance.resume == "must":
            raise TrainerError(f"no Tune experiment to resume at {exp_path} (fault_tolerance.resume=must)")
        every = cfg.checkpoint.every_n_iterations
        tuner = tune.Tuner(
            trainable,
            param_space=config,
            tune_config=TuneConfig(
                scheduler=scheduler(tc, metric, mode),
                num_samples=tc.num_samples,
                max_concurrent_trials=tc.max_concurrent_trials,
                time_budget_s=cfg.stop.wall_s,
            ),
            run_config=RunConfig(
                name=name,
                storage_path=storage.location,
                stop=StopRule(OmegaConf.to_container(cfg.stop)),
                checkpoint_config=CheckpointConfig(
                    checkpoint_frequency=every,
                    num_to_keep=max(cfg.checkpoint.keep, 1),
                    checkpoint_at_end=True,
                    checkpoint_score_attribute=rank,
                    checkpoint_score_order=rank_mode,
                ),
                failure_config=FailureConfig(max_failures=tc.max_failures),
                callbacks=[tune_checkpoint_callback()],
                verbose=1,
            ),
        )
    if STOP.requested:  # a signal before Tune could take it: nothing of this run to save
        saved = exp_path if tune.Tuner.can_restore(exp_path) else None
        raise Stopped(STOP.requested, None, saved=False, experiment=saved)
    results = tuner.fit()
    if STOP.requested:  # trainer.signals: Tune was interrupted and saved its state; a rerun restores it
        ckpts = [r.checkpoint for r in results]
        try:  # the best trial's checkpoint first, else any trial's
            ckpts.insert(0, results.get_best_result(metric=metric, mode=mode, filter_nan_and_inf=True).checkpoint)
        except RuntimeError:  # no trial reported the metric yet
            pass
        best = next((c for c in ckpts if c is not None), None)
        raise Stopped(STOP.requested, best and _checkpoint_uri(storage, best), saved=False, experiment=exp_path)
    errors = [str(r.error).splitlines()[0] for r in results if r.error]
    try:  # the trial whose best evaluation was best (any iteration), else the best by tune.metric at its end
        best = results.get_best_result(metric=rank, mode=rank_mode, scope="all", filter_nan_and_inf=True)
    except RuntimeError:  # no trial evaluated yet (runs shorter than evaluation.interval), or rank == metric
        rank = None
        try:
            best = results.get_best_result(metric=metric, mode=mode, filter_nan_and_inf=True)
        except RuntimeError as e:
            raise TrainerError(f"no Tune trial reported {metric}: {errors[:1] or e}") from e
    if best.checkpoint is None:
        raise TrainerError(f"best trial has no checkpoint; trial errors: {errors[:3]}")
    ret = best.metrics.get(RETURN_MEAN_KEY)
    best_ckpt = _best_scored_checkpoint(best, rank, rank_mode) if rank else best.checkpoint
    df = best.metrics_dataframe
    evals = [] if df is None or EVAL_RETURN_KEY not in df else [v for v in df[EVAL_RETURN_KEY] if math.isfinite(v)]
    return RunResult(
        checkpoint=_checkpoint_uri(storage, best.checkpoint),
        best_checkpoint=_checkpoint_uri(storage, best_ckpt),
        episode_return_mean=None if ret is None else float(ret),
        env_steps=int(best.metrics.get(ENV_STEPS_KEY) or 0),
        iterations=int(best.metrics.get(ITERATION_KEY) or 0),
        extra={"trials": len(results), "trial_errors": errors,
               "best_config": {k: best.config.get(k) for k in space} if space else {},
               "best_judged_by": rank or metric},
        eval_return_mean=evals[-1] if evals else None,
        best_eval_return_mean=_scored(best, best_ckpt, EVAL_RETURN_KEY) if rank == EVAL_RETURN_KEY else None,
    ), best


def _scored(result, checkpoint, key: str) -> float | None:
    """`key` in the result Tune recorded with `checkpoint` (one of the trial's kept checkpoints)."""
    for c, m in result.best_checkpoints or []:
        if c.path == checkpoint.path and isinstance(m.get(key), (int, float)) and math.isfinite(m[key]):
            return float(m[key])
    return None


def _checkpoint_uri(storage: Storage, checkpoint) -> str:
    """A Tune checkpoint's path is inside its filesystem (no scheme for s3): name it like the output_dir does."""
    path = checkpoint.path.rstrip("/")
    if storage.local or not path.startswith(storage.root + "/"):
        return path
    return storage.uri(path[len(storage.root) + 1:])


def finish_tune(cfg, storage: Storage, result: RunResult, best) -> RunResult:
    """Leave the same artifacts as a plain run: the best trial's curve, PNG and checkpoint metadata."""
    from trainer.artifacts import learning_curve_png
    from trainer.loop import checkpoint_metadata

    df = best.metrics_dataframe
    if df is not None and len(df):
        rows = [{"iteration": int(r.get(ITERATION_KEY, 0)), "env_steps": int(r.get(ENV_STEPS_KEY, 0) or 0),
                 "episode_return_mean": float(r.get(RETURN_MEAN_KEY, math.nan)),
                 "eval_return_mean": float(r.get(EVAL_RETURN_KEY, math.nan)),
                 "eval_episodes": int(r.get(EVAL_EPISODES_KEY, 0) or 0)} for _, r in df.iterrows()]
        storage.write_bytes(df.to_csv(index=False).encode(), "progress.csv")
        storage.write_bytes(learning_curve_png(rows, f"{cfg.experiment} (best trial)", cfg.stop.episode_return_mean),
                            "learning_curve.png")
    # Every checkpoint the best trial kept gets its own metadata (the served one and the best-scored one).
    latest = best.checkpoint.path.rstrip("/")
    kept = list(best.best_checkpoints or [])
    if not any(c.path.rstrip("/") == latest for c, _ in kept):
        kept.append((best.checkpoint, best.metrics))
    for checkpoint, m in kept:
        path = checkpoint.path.rstrip("/")
        row = {"iteration": int(m.get(ITERATION_KEY) or 0), "env_steps": int(m.get(ENV_STEPS_KEY) or 0),
               "episode_return_mean": float(m.get(RETURN_MEAN_KEY, math.nan)),
               "eval_return_mean": float(m.get(EVAL_RETURN_KEY, math.nan))}
        where = Storage(_checkpoint_uri(storage, checkpoint), checkpoint.filesystem, path)
        write_metadata(where, checkpoint_metadata(cfg, "tune-best" if path == latest else "tune", row))
    return result
