"""The "solved" metric's names and arithmetic: the mean return of the last WINDOW training episodes, and the
greedy evaluation return that ranks checkpoints.

Kept free of Ray/RLlib imports so the trainer's entry point, artifacts and stop rule can use them before the heavy
imports (which overlap ray.init, trainer.startup); trainer.callbacks computes the metric inside RLlib.
"""

from __future__ import annotations

import math

EPISODES_ENDED = "rl_platform_episodes_ended"
# Reported in every training result; the trainer's stop criterion and Tune's metric.
RETURN_MEAN_KEY = "episode_return_mean_last_n"
# Episodes behind RETURN_MEAN_KEY (>= WINDOW once that many have ended).
RETURN_WINDOW_KEY = "episode_return_window"
WINDOW = 20
# Mean return of the greedy evaluation episodes run in this iteration (the evaluation group), NaN in an iteration
# without one, and their count; trainer.callbacks puts them at the top of every result. (RLlib's own
# result["evaluation"] repeats the last evaluation in the iterations after it.)
EVAL_RETURN_KEY = "eval_return_mean"
EVAL_EPISODES_KEY = "eval_episodes"
# APPO/IMPALA: learner updates the acting weights were behind in the latest update (trainer.policy_lag), NaN else.
POLICY_LAG_KEY = "policy_lag"


def eval_of(evaluation) -> tuple[float, int]:
    """RLlib's evaluation results of one evaluation -> (mean return of its episodes, their count); (NaN, 0) when
    it ran no episode."""
    env = (evaluation or {}).get("env_runners") or {}
    mean, count = env.get("episode_return_mean"), env.get("num_episodes")
    if mean is None or not math.isfinite(mean) or not count or not math.isfinite(count):
        return math.nan, 0
    return float(mean), int(count)


def window_mean(history, window: int = WINDOW) -> tuple[float, int]:
    """history: (episodes, mean return) per iteration, oldest first -> (mean over >= window newest episodes, count)."""
    total, n = 0.0, 0
    for count, mean in reversed(history):
        if count <= 0 or math.isnan(mean):
            continue
        total += count * mean
        n += count
        if n >= window:
            break
    return (total / n if n else math.nan), n
