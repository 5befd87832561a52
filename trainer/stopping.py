"""The one stop rule, used by the plain loop after every iteration and by Tune for every trial.

"Solved" means the mean return of the last WINDOW training episodes (trainer.callbacks) reached the target, and
only once that many episodes have ended: one lucky early episode must not stop a run. `stop.eval_return_mean` is
judged on the greedy evaluation of the iteration (evaluation group), only in iterations that ran one. Wall time: the
plain loop checks it per run here; Tune gets it as the experiment's time budget.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from ray.tune.stopper import Stopper

from trainer.solved import EVAL_RETURN_KEY, RETURN_MEAN_KEY, RETURN_WINDOW_KEY, WINDOW

ENV_STEPS_KEY = "num_env_steps_sampled_lifetime"
ITERATION_KEY = "training_iteration"


def stop_reason(stop: Mapping[str, Any], *, return_mean: float | None, return_window: int, env_steps: int,
                iterations: int, wall_s: float | None = None, eval_return_mean: float | None = None) -> str | None:
    """`stop` is the config's stop group; returns why to stop, or None to go on. `eval_return_mean`: this
    iteration's greedy evaluation return, None/NaN in an iteration without one."""
    target = stop.get("episode_return_mean")
    if (target is not None and return_mean is not None and not math.isnan(return_mean) and return_mean >= target
            and return_window >= WINDOW):
        return f"episode_return_mean {return_mean:.1f} (last {return_window} episodes) >= {target:g}"
    target = stop.get("eval_return_mean")
    if (target is not None and eval_return_mean is not None and not math.isnan(eval_return_mean)
            and eval_return_mean >= target):
        return f"eval_return_mean {eval_return_mean:.1f} (greedy evaluation) >= {target:g}"
    if stop.get("env_steps") is not None and env_steps >= stop["env_steps"]:
        return f"env_steps {env_steps} >= {stop['env_steps']}"
    if stop.get("iterations") is not None and iterations >= stop["iterations"]:
        return f"iterations {iterations} >= {stop['iterations']}"
    if wall_s is not None and stop.get("wall_s") is not None and wall_s >= stop["wall_s"]:
        return f"wall time {wall_s:.0f}s >= {stop['wall_s']:g}s"
    return None


def result_stop_reason(stop: Mapping[str, Any], result: Mapping[str, Any]) -> str | None:
    """The rule on an RLlib training result (what a Tune trial reports)."""
    env = result.get("env_runners") or {}
    ret = result.get(RETURN_MEAN_KEY)
    ev = result.get(EVAL_RETURN_KEY)
    return stop_reason(
        stop,
        return_mean=None if ret is None else float(ret),
        return_window=int(result.get(RETURN_WINDOW_KEY) or 0),
        env_steps=int(result.get(ENV_STEPS_KEY) or env.get(ENV_STEPS_KEY) or 0),
        iterations=int(result.get(ITERATION_KEY) or 0),
        eval_return_mean=None if ev is None else float(ev),
    )


class StopRule(Stopper):
    """The rule as a Tune Stopper, per trial (iterations = the trial's training_iteration)."""

    def __init__(self, stop: Mapping[str, Any]):
        self.stop = dict(stop)

    def __call__(self, trial_id: str, result: dict) -> bool:
        return result_stop_reason(self.stop, result) is not None

    def stop_all(self) -> bool:
        return False
