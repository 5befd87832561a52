"""Training from logged transitions (algo=bc|marwil, `offline.input`): checks before Ray starts, and the
`AlgorithmConfig.offline_data` arguments.

The log is the policy server's transition log (rl_eval.logs: Parquet rows in RLlib's offline column format), read
by RLlib's OfflineData through Ray Data. The env group still names the env: it gives the spaces the RLModule is
built for and the env the greedy evaluation plays. No env is stepped for training, so "env steps" offline are
logged transitions trained on (OfflineEnvSteps).
"""

from __future__ import annotations

from typing import Any

from trainer.errors import TrainerError

OFFLINE_ALGOS = ("bc", "marwil")


def is_offline(cfg) -> bool:
    return cfg.algo.name in OFFLINE_ALGOS


def check_offline(cfg) -> None:
    """The offline rules a config alone decides (trainer.validate; also where `rl-submit` renders a cluster job):
    offline algos get an input, online ones none, and nothing that needs training episodes or stacked frames."""
    off = cfg.offline
    if not is_offline(cfg):
        if off.input:
            raise TrainerError(f"offline.input is for algo=bc or algo=marwil; algo={cfg.algo.name} trains online "
                               "from the env (drop offline.input)")
        return
    if not off.input:
        raise TrainerError(f"algo={cfg.algo.name} trains from logged transitions: give offline.input=<folder or "
                           "URI of the transition log's Parquet files>")
    for key in ("updates_per_iteration", "prelearners"):
        if off[key] < 1:
            raise TrainerError(f"offline.{key} must be >= 1, got {off[key]}")
    if cfg.algo.get("steps_per_iteration"):
        raise TrainerError("algo.steps_per_iteration counts env steps sampled; offline training samples none: size "
                           "an iteration with offline.updates_per_iteration")
    if cfg.stop.episode_return_mean is not None:
        raise TrainerError("stop.episode_return_mean is the return of training episodes, and offline training plays "
                           "none: stop on stop.eval_return_mean (the greedy evaluation), stop.iterations, "
                           "stop.env_steps or stop.wall_s")
    if cfg.tune.scheduler != "none" and cfg.tune.metric == "episode_return_mean_last_n":
        raise TrainerError("tune.metric episode_return_mean_last_n is the training return, which offline training "
                           "does not have: set tune.metric=eval_return_mean")
    import rl_envs

    spec = rl_envs.get_spec(cfg.env.name)
    if spec.framestack > 1:
        raise TrainerError(f"env {cfg.env.name} stacks {spec.framestack} frames per observation; a transition log "
                           "holds single transitions, so offline training supports envs without frame stacking")


def check_offline_input(cfg) -> None:
    """In the process that trains, before Ray starts (not where `rl-submit` renders a job: a pod's path is not a
    local one): the log exists and fits the env. Reads Parquet footers and one row, nothing more."""
    if not is_offline(cfg):
        return
    import rl_envs
    from rl_eval.logs import LogError, check_log, find_log

    env = rl_envs.make_env(cfg.env.name, dict(cfg.env.env_config))
    try:
        log = find_log(cfg.offline.input, "offline.input")
        check_log(log, env.observation_space, env.action_space, cfg.env.name)
    except LogError as e:
        raise TrainerError(str(e)) from None
    finally:
        env.close()


def offline_data_kwargs(cfg) -> dict[str, Any]:
    """offline group -> AlgorithmConfig.offline_data() keyword arguments. The files found by check_offline are
    passed as a list with their pyarrow filesystem: RLlib turns a string input into a pathlib.Path, which would
    mangle `s3://` and lose the URI's options (endpoint, credentials)."""
    from rl_eval.logs import TRAINING_COLUMNS, LogError, find_log

    off = cfg.offline
    try:
        log = find_log(off.input, "offline.input")
    except LogError as e:
        raise TrainerError(str(e)) from None
    kw: dict[str, Any] = {
        "input_": list(log.files),
        "input_read_method": "read_parquet",
        # Only RLlib's columns: the provenance ones (policy, version, session_id, ...) would reach the learner.
        "input_read_method_kwargs": {"columns": list(TRAINING_COLUMNS)},
        "dataset_num_iters_per_learner": off.updates_per_iteration,
        # Transitions, not episodes: each row becomes a one-step episode (next observation included).
        "input_read_episodes": False,
        "map_batches_kwargs": {"concurrency": off.prelearners},
    }
    if not log.storage.local:
        kw["input_filesystem"] = log.storage.fs
    return kw


def _steps_callback(updates_per_iteration: int):
    from ray.rllib.callbacks.callbacks import RLlibCallback

    from trainer.stopping import ENV_STEPS_KEY

    class OfflineEnvSteps(RLlibCallback):
        """RLlib's offline algorithms count one train batch per iteration, however many updates
        (`dataset_num_iters_per_learner`) it ran; offline "env steps" are the logged transitions trained on."""

        def on_train_result(self, *, algorithm, metrics_logger=None, result: dict, **kwargs) -> None:
            if result.get(ENV_STEPS_KEY) is not None:
                result[ENV_STEPS_KEY] = int(result[ENV_STEPS_KEY]) * updates_per_iteration

    return OfflineEnvSteps


def apply_offline(config, cfg):
    """The offline part of the AlgorithmConfig: the data, and env steps counted as transitions trained on."""
    import logging

    import ray.data

    # Ray Data logs a progress block every 10 s on a non-terminal stdout; the trainer prints its own progress.
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    # The learner's data iterator is collected at exit, after Ray shut down, and its last stats update then logs
    # a warning with a traceback (the stats actor is gone): noise after a finished run.
    logging.getLogger("ray.data._internal.stats").setLevel(logging.ERROR)
    config = config.offline_data(**offline_data_kwargs(cfg))
    return config.callbacks([_steps_callback(cfg.offline.updates_per_iteration), *config.callbacks_class])
