"""tune/ config group -> a Ray Tune experiment over the RLlib algorithm (ASHA, HyperBand, PBT)."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import OmegaConf

from rl_checkpoint import Storage, write_metadata
from trainer.artifacts import RunResult
from trainer.callbacks import RETURN_MEAN_KEY
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


def run_tune(cfg, build_algo_config, storage: Storage, log):
    """-> (RunResult, the best trial's ray.tune.Result)."""
    from ray import tune
    from ray.tune import CheckpointConfig, FailureConfig, RunConfig, TuneConfig

    tc = cfg.tune
    metric, mode = tc.metric, tc.mode
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
                    checkpoint_score_attribute=metric,
                    checkpoint_score_order=mode,
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
    try:
        best = results.get_best_result(metric=metric, mode=mode, filter_nan_and_inf=True)
    except RuntimeError as e:
        raise TrainerError(f"no Tune trial reported {metric}: {errors[:1] or e}") from e
    if best.checkpoint is None:
        raise TrainerError(f"best trial has no checkpoint; trial errors: {errors[:3]}")
    ret = best.metrics.get(RETURN_MEAN_KEY)
    ckpt = _checkpoint_uri(storage, best.checkpoint)
    return RunResult(
        checkpoint=ckpt,
        best_checkpoint=ckpt,
        episode_return_mean=None if ret is None else float(ret),
        env_steps=int(best.metrics.get(ENV_STEPS_KEY) or 0),
        iterations=int(best.metrics.get(ITERATION_KEY) or 0),
        extra={"trials": len(results), "trial_errors": errors,
               "best_config": {k: best.config.get(k) for k in space} if space else {}},
    ), best


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
                 "episode_return_mean": float(r.get(RETURN_MEAN_KEY, math.nan))} for _, r in df.iterrows()]
        storage.write_bytes(df.to_csv(index=False).encode(), "progress.csv")
        storage.write_bytes(learning_curve_png(rows, f"{cfg.experiment} (best trial)", cfg.stop.episode_return_mean),
                            "learning_curve.png")
    row = {"iteration": result.iterations, "env_steps": result.env_steps,
           "episode_return_mean": math.nan if result.episode_return_mean is None else result.episode_return_mean}
    ckpt = Storage(result.checkpoint, best.checkpoint.filesystem, best.checkpoint.path.rstrip("/"))
    write_metadata(ckpt, checkpoint_metadata(cfg, "tune-best", row))
    return result
