"""tune/ config group -> a Ray Tune experiment over the RLlib algorithm (ASHA, HyperBand, PBT)."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import OmegaConf

from trainer.callbacks import RETURN_MEAN_KEY
from trainer.errors import TrainerError
from trainer.storage import Storage

_SAMPLERS = ("loguniform", "uniform", "choice", "randint", "grid_search")


def search_space(param_space: dict[str, Any]) -> dict[str, Any]:
    """{"lr": {"loguniform": [1e-4, 1e-3]}} -> {"lr": tune.loguniform(1e-4, 1e-3)}; plain values pass through."""
    from ray import tune

    out: dict[str, Any] = {}
    for key, spec in param_space.items():
        if isinstance(spec, dict):
            if len(spec) != 1 or next(iter(spec)) not in _SAMPLERS:
                raise TrainerError(
                    f"tune.param_space.{key}: expected one of {', '.join(_SAMPLERS)} as the only key, got {list(spec)}"
                )
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


def run_tune(cfg, build_algo_config, storage: Storage, log) -> dict[str, Any]:
    from ray import tune
    from ray.tune import CheckpointConfig, FailureConfig, RunConfig, TuneConfig

    tc = cfg.tune
    metric, mode = tc.metric, tc.mode
    space = search_space(OmegaConf.to_container(tc.param_space, resolve=True))
    unknown = [k for k in space if k not in cfg.algo]
    if unknown:
        raise TrainerError(f"tune.param_space names keys that algo/{cfg.algo.name} does not have: {unknown}")
    config = build_algo_config(cfg, algo_overrides=space if tc.scheduler != "pbt" else None)

    stop: dict[str, Any] = {}
    if cfg.stop.episode_return_mean is not None:
        stop[RETURN_MEAN_KEY] = cfg.stop.episode_return_mean
    if cfg.stop.env_steps is not None:
        stop["num_env_steps_sampled_lifetime"] = cfg.stop.env_steps
    if cfg.stop.iterations is not None:
        stop["training_iteration"] = cfg.stop.iterations

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
                stop=stop or None,
                checkpoint_config=CheckpointConfig(
                    checkpoint_frequency=every,
                    num_to_keep=max(cfg.checkpoint.keep, 1),
                    checkpoint_at_end=True,
                    checkpoint_score_attribute=metric,
                    checkpoint_score_order=mode,
                ),
                failure_config=FailureConfig(max_failures=tc.max_failures),
                verbose=1,
            ),
        )
    results = tuner.fit()
    errors = [str(r.error).splitlines()[0] for r in results if r.error]
    try:
        best = results.get_best_result(metric=metric, mode=mode, filter_nan_and_inf=True)
    except RuntimeError as e:
        raise TrainerError(f"no Tune trial reported {metric}: {errors[:1] or e}") from e
    if best.checkpoint is None:
        raise TrainerError(f"best trial has no checkpoint; trial errors: {errors[:3]}")
    ret = best.metrics.get(RETURN_MEAN_KEY)
    return {
        "checkpoint": best.checkpoint.path,
        "best_checkpoint": best.checkpoint.path,
        "episode_return_mean": None if ret is None or math.isnan(ret) else round(float(ret), 3),
        "env_steps": int(best.metrics.get("num_env_steps_sampled_lifetime") or 0),
        "iterations": int(best.metrics.get("training_iteration") or 0),
        "trials": len(results),
        "trial_errors": errors,
        "best_config": {k: best.config.get(k) for k in space} if space else {},
        "_best_result": best,
    }


def finish_tune(cfg, storage: Storage, summary: dict[str, Any]) -> dict[str, Any]:
    """Leave the same artifacts as a plain run: the best trial's curve, PNG and checkpoint metadata."""
    import json

    import pyarrow.fs as pafs

    from trainer.artifacts import learning_curve_png
    from trainer.loop import checkpoint_metadata

    best = summary.pop("_best_result")
    df = best.metrics_dataframe
    rows = []
    if df is not None and len(df):
        for _, r in df.iterrows():
            rows.append({
                "iteration": int(r.get("training_iteration", 0)),
                "env_steps": int(r.get("num_env_steps_sampled_lifetime", 0) or 0),
                "episode_return_mean": float(r.get(RETURN_MEAN_KEY, math.nan)),
            })
        storage.write_bytes(df.to_csv(index=False).encode(), "progress.csv")
        storage.write_bytes(learning_curve_png(rows, f"{cfg.experiment} (best trial)", cfg.stop.episode_return_mean),
                            "learning_curve.png")
    fs, path = pafs.FileSystem.from_uri(best.checkpoint.path) if "://" in best.checkpoint.path else (pafs.LocalFileSystem(), best.checkpoint.path)
    row = {"iteration": summary["iterations"], "env_steps": summary["env_steps"],
           "episode_return_mean": summary["episode_return_mean"]}
    meta = checkpoint_metadata(cfg, "tune-best", row)
    with fs.open_output_stream(path.rstrip("/") + "/rl_platform.json") as f:
        f.write(json.dumps(meta, indent=2).encode())
    return summary
