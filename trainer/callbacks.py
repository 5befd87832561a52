"""RLlib callbacks: the "solved" metric as users define it, the mean return of the last N training episodes.

RLlib 2.58's `env_runners/episode_return_mean` averages only the episodes that finished in the current iteration
(often one or two long CartPole episodes), so one lucky iteration could stop training early. Env runners count the
episodes they finish; the algorithm keeps (count, mean) of recent iterations and reports the mean over the most
recent iterations that together hold at least N episodes (exact, never fewer than N episodes once N have ended).
"""

from __future__ import annotations

import math
from collections import deque

from ray.rllib.callbacks.callbacks import RLlibCallback

EPISODES_ENDED = "rl_platform_episodes_ended"
# Reported in every training result; the trainer's stop criterion and Tune's metric.
RETURN_MEAN_KEY = "episode_return_mean_last_n"
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


class LastNEpisodeReturns(RLlibCallback):
    def __init__(self):
        super().__init__()
        self.history: deque[tuple[int, float]] = deque(maxlen=WINDOW)

    def on_episode_end(self, *, metrics_logger=None, **kwargs) -> None:
        if metrics_logger is not None:
            metrics_logger.log_value(EPISODES_ENDED, 1, reduce="sum")

    def on_train_result(self, *, algorithm, metrics_logger=None, result: dict, **kwargs) -> None:
        env = result.get("env_runners", {})
        count = env.pop(EPISODES_ENDED, None)
        mean = env.get("episode_return_mean")
        # Both are NaN in an iteration where no episode ended.
        if count is not None and mean is not None and math.isfinite(count) and math.isfinite(mean) and count > 0:
            self.history.append((int(count), float(mean)))
        result[RETURN_MEAN_KEY], result["episode_return_window"] = window_mean(self.history)


def window_history(algo) -> LastNEpisodeReturns | None:
    """The algorithm's LastNEpisodeReturns instance (to save/restore its history across a resume)."""
    callbacks = algo.callbacks if isinstance(algo.callbacks, list) else [algo.callbacks]
    return next((c for c in callbacks if isinstance(c, LastNEpisodeReturns)), None)
