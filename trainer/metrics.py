"""Training metrics users watch while a job runs, recorded with `ray.util.metrics` so they are exported on Ray's
metrics port (next to Ray's and RLlib's own series) from the process that runs the algorithm: the trainer driver,
or the Tune trial actor. Ray prefixes every name with `ray_`; counters gain `_total`.

| exported name                                      | type    | what                                               |
|----------------------------------------------------|---------|----------------------------------------------------|
| ray_rl_train_episode_return_mean                   | gauge   | mean return of the last 20 training episodes       |
| ray_rl_train_eval_return_mean                      | gauge   | mean return of the latest greedy evaluation        |
| ray_rl_train_env_steps_sampled_total               | counter | env steps sampled (rate() = steps/s)               |
| ray_rl_train_env_steps_per_second                  | gauge   | env steps sampled / s over the last iteration      |
| ray_rl_train_learner_update_seconds                | gauge   | learner update time of the last iteration          |
| ray_rl_train_iteration_seconds                     | gauge   | wall time of the last iteration                    |
| ray_rl_train_iterations_total                      | counter | finished training iterations                       |
| ray_rl_train_last_iteration_timestamp_seconds      | gauge   | unix time the last iteration finished              |
| ray_rl_train_env_runners_healthy / _expected       | gauge   | remote env runners alive / configured              |
| ray_rl_train_env_runner_restarts                   | gauge   | env runner restarts in this run (fault tolerance)  |
| ray_rl_train_learners_healthy / _expected          | gauge   | learners alive / configured (a local learner is 1) |
| ray_rl_train_last_checkpoint_timestamp_seconds     | gauge   | unix time of the last complete checkpoint          |
| ray_rl_train_policy_lag                            | gauge   | learner updates the acting weights were behind     |
|                                                    |         | (PPO 0, APPO/IMPALA; trainer/policy_lag.py)        |

Tags: `env`, `algo` and `trial` (the Tune trial id; "default" outside Tune). Ages are `time() - <timestamp>` in
PromQL: a timestamp stays right while nobody updates it, an exported "age" would freeze when the trainer hangs.
"""

from __future__ import annotations

import math
import time

from ray.rllib.callbacks.callbacks import RLlibCallback

from rl_metrics import KeptGauge
from trainer.callbacks import EVAL_RETURN_KEY, RETURN_MEAN_KEY
from trainer.solved import POLICY_LAG_KEY

NAMES = {
    "return_mean": "rl_train_episode_return_mean",
    "eval_return_mean": "rl_train_eval_return_mean",
    "env_steps": "rl_train_env_steps_sampled",
    "env_steps_per_s": "rl_train_env_steps_per_second",
    "learner_update_s": "rl_train_learner_update_seconds",
    "iteration_s": "rl_train_iteration_seconds",
    "iterations": "rl_train_iterations",
    "last_iteration": "rl_train_last_iteration_timestamp_seconds",
    "env_runners_healthy": "rl_train_env_runners_healthy",
    "env_runners_expected": "rl_train_env_runners_expected",
    "env_runner_restarts": "rl_train_env_runner_restarts",
    "learners_healthy": "rl_train_learners_healthy",
    "learners_expected": "rl_train_learners_expected",
    "last_checkpoint": "rl_train_last_checkpoint_timestamp_seconds",
    "policy_lag": "rl_train_policy_lag",
}
TAG_KEYS = ("env", "algo", "trial")


def _seconds(value) -> float | None:
    """A timer from RLlib's result (seconds; a float, or a dict from older stacks) -> float or None."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _learners(algorithm) -> tuple[int, int]:
    group = getattr(algorithm, "learner_group", None)
    if group is None or group.is_local:
        return 1, 1
    manager = group._worker_manager  # RLlib keeps the remote learners' health there (no public accessor in 2.58)
    return manager.num_healthy_actors(), manager.num_actors()


class TrainingMetrics(RLlibCallback):
    """Updates the metrics after every training iteration; runs after LastNEpisodeReturns and EvalReturn (it reads
    their keys)."""

    def __init__(self):
        super().__init__()
        from ray.util import metrics as m

        def gauge(key, doc):
            return KeptGauge(NAMES[key], doc, tag_keys=TAG_KEYS)

        def counter(key, doc):
            return m.Counter(NAMES[key], doc, tag_keys=TAG_KEYS)

        self.return_mean = gauge("return_mean", "Mean episode return over the last 20 training episodes.")
        self.eval_return_mean = gauge("eval_return_mean", "Mean return of the latest greedy evaluation (explore=False).")
        self.env_steps = counter("env_steps", "Environment steps sampled by the env runners.")
        self.env_steps_per_s = gauge("env_steps_per_s", "Environment steps sampled per second, last iteration.")
        self.learner_update_s = gauge("learner_update_s", "Learner update time of the last iteration (s).")
        self.iteration_s = gauge("iteration_s", "Wall time of the last training iteration (s).")
        self.iterations = counter("iterations", "Training iterations finished.")
        self.last_iteration = gauge("last_iteration", "Unix time the last training iteration finished.")
        self.env_runners_healthy = gauge("env_runners_healthy", "Remote env runners alive.")
        self.env_runners_expected = gauge("env_runners_expected", "Remote env runners configured.")
        # A gauge, not a counter: it is exported at 0 from the first iteration (a counter cannot inc(0)), so
        # delta() over it has a series to compare before anything failed.
        self.env_runner_restarts = gauge("env_runner_restarts", "Env runner restarts in this run (RLlib fault tolerance).")
        self.learners_healthy = gauge("learners_healthy", "Learners alive (a local learner counts 1).")
        self.learners_expected = gauge("learners_expected", "Learners configured (a local learner counts 1).")
        self.last_checkpoint = gauge("last_checkpoint", "Unix time of the last complete checkpoint.")
        self.policy_lag = gauge("policy_lag", "Learner updates the weights that acted behind the latest trained batch "
                                              "were behind (APPO/IMPALA; 0 for PPO).")
        self._tags: dict[str, str] | None = None
        self._steps = 0

    def tags(self, algorithm) -> dict[str, str]:
        if self._tags is None:
            env = algorithm.config.env
            self._tags = {
                "env": env if isinstance(env, str) else getattr(env, "__name__", "custom"),
                "algo": algorithm.config.algo_class.__name__,
                "trial": str(getattr(algorithm, "trial_id", None) or "default"),
            }
        return self._tags

    def on_train_result(self, *, algorithm, metrics_logger=None, result: dict, **kwargs) -> None:
        tags = self.tags(algorithm)
        now = time.time()
        ret = result.get(RETURN_MEAN_KEY)
        if ret is not None and math.isfinite(ret):
            self.return_mean.set(float(ret), tags)
        ev = result.get(EVAL_RETURN_KEY)  # NaN in iterations without an evaluation: the gauge keeps the latest
        if ev is not None and math.isfinite(ev):
            self.eval_return_mean.set(float(ev), tags)
        steps = int(result.get("num_env_steps_sampled_lifetime") or 0)
        if steps > self._steps:
            self.env_steps.inc(steps - self._steps, tags)
        self._steps = max(self._steps, steps)
        timers = result.get("timers", {})
        it = _seconds(timers.get("training_iteration"))
        if it:
            self.iteration_s.set(it, tags)
            sampled = (result.get("env_runners") or {}).get("num_env_steps_sampled")
            if isinstance(sampled, (int, float)) and math.isfinite(sampled):
                self.env_steps_per_s.set(float(sampled) / it, tags)
        lag = result.get(POLICY_LAG_KEY)
        if isinstance(lag, (int, float)) and math.isfinite(lag):
            self.policy_lag.set(float(lag), tags)
        upd = _seconds(timers.get("learner_update_timer"))
        if upd is not None:
            self.learner_update_s.set(upd, tags)
        self.iterations.inc(1.0, tags)
        self.last_iteration.set(now, tags)

        group = algorithm.env_runner_group
        if group is not None:
            self.env_runners_healthy.set(group.num_healthy_remote_workers(), tags)
            self.env_runners_expected.set(algorithm.config.num_env_runners, tags)
            self.env_runner_restarts.set(group.num_remote_worker_restarts(), tags)
        healthy, expected = _learners(algorithm)
        self.learners_healthy.set(healthy, tags)
        self.learners_expected.set(expected, tags)

    def checkpoint_saved(self, algorithm) -> None:
        self.last_checkpoint.set(time.time(), self.tags(algorithm))


def training_metrics(algo) -> TrainingMetrics | None:
    callbacks = algo.callbacks if isinstance(algo.callbacks, list) else [algo.callbacks]
    return next((c for c in callbacks if isinstance(c, TrainingMetrics)), None)


def checkpoint_saved(algo) -> None:
    """Call after a checkpoint of `algo` is complete (the plain training loop)."""
    cb = training_metrics(algo)
    if cb is not None:
        cb.checkpoint_saved(algo)


def tune_checkpoint_callback():
    """A Tune callback (driver side) that sets the checkpoint timestamp when Tune has saved a trial's checkpoint:
    the trial's algorithm is not told when Tune checkpoints it."""
    from ray import tune

    class TuneCheckpointMetrics(tune.Callback):
        def __init__(self):
            self.gauge = KeptGauge(NAMES["last_checkpoint"], "Unix time of the last complete checkpoint.",
                                   tag_keys=TAG_KEYS)

        def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
            env = (trial.config or {}).get("env")
            self.gauge.set(time.time(), {"env": env if isinstance(env, str) else "custom",
                                         "algo": str(trial.trainable_name), "trial": str(trial.trial_id)})

    return TuneCheckpointMetrics()
