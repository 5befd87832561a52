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

from trainer.solved import (  # noqa: F401
    EPISODES_ENDED,
    EVAL_EPISODES_KEY,
    EVAL_RETURN_KEY,
    RETURN_MEAN_KEY,
    RETURN_WINDOW_KEY,
    WINDOW,
    eval_of,
    window_mean,
)


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
        result[RETURN_MEAN_KEY], result[RETURN_WINDOW_KEY] = window_mean(self.history)


class EvalReturn(RLlibCallback):
    """Puts the greedy evaluation's mean return and episode count at the top of every result (NaN / 0 in an
    iteration without an evaluation), where the stop rule, progress.csv, Tune's checkpoint ranking and the metrics
    read it. Taken when the evaluation ends: RLlib's result["evaluation"] repeats the last one in later iterations."""

    def __init__(self):
        super().__init__()
        self._latest: tuple[float, int] | None = None

    def on_evaluate_end(self, *, algorithm, metrics_logger=None, evaluation_metrics: dict, **kwargs) -> None:
        self._latest = eval_of(evaluation_metrics)

    def on_train_result(self, *, algorithm, metrics_logger=None, result: dict, **kwargs) -> None:
        result[EVAL_RETURN_KEY], result[EVAL_EPISODES_KEY] = self._latest or (math.nan, 0)
        self._latest = None


def window_history(algo) -> LastNEpisodeReturns | None:
    """The algorithm's LastNEpisodeReturns instance (to save/restore its history across a resume)."""
    callbacks = algo.callbacks if isinstance(algo.callbacks, list) else [algo.callbacks]
    return next((c for c in callbacks if isinstance(c, LastNEpisodeReturns)), None)
