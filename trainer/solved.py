"""The "solved" metric's names and arithmetic: the mean return of the last WINDOW training episodes.

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
