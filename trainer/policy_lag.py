"""Policy lag of the asynchronous algorithms (APPO, IMPALA): how many learner updates the weights that acted behind
a training batch are behind the weights that batch updates.

RLlib numbers weight versions: the learner's `weights_seq_no` counts its updates, and every env step carries the
`weights_seq_no` of the weights its env runner acted with (the episode's extra model outputs). A learner connector
piece runs once per learner update, so it counts the updates; for update k (the learner holds version k - 1 before
it) on a batch whose steps were acted with versions v_i:

    lag = (k - 1) - mean(v_i)          0 for a synchronous algorithm (PPO trains on data from its current weights)

It grows with the time the env runners act on one set of weights: the broadcast interval (`algo.broadcast_interval`,
weights sent every N training steps) and the updates in flight between a broadcast and the batch. It does not grow
when the learner is slower than sampling: RLlib 2.58 keeps no backlog for a slow learner (its `update()` waits for
the learner every broadcast interval and the driver drops what it sampled beyond the calls in flight), so a slow
learner trains on fresh batches, fewer of them (tests/trainer/test_policy_lag.py has the figures). A resumed run
restores the versions; the count follows the highest version seen. The lag is computed in the learner, in the update it describes: RLlib reports learner
metrics asynchronously (APPO/IMPALA), so pairing two separately logged versions in the driver mixes updates.
Reported as `policy_lag` (the latest update's; an iteration whose results carry no update repeats the last
figure) in the result dict, progress.csv and `ray_rl_train_policy_lag` (trainer/metrics.py).
"""

from __future__ import annotations

import math
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import ALL_MODULES
from ray.rllib.utils.metrics import LEARNER_RESULTS, WEIGHTS_SEQ_NO

from trainer.solved import POLICY_LAG_KEY

LAG_METRIC = "policy_lag"  # learner metric under __all_modules__: the latest update's lag
# Algorithms whose learner trains on env runner episodes as they come (PPO: 0 by construction, measured alike).
LAG_ALGOS = ("ppo", "appo", "impala")


class ActingWeightsVersion(ConnectorV2):
    """Learner connector piece: logs the update's policy lag; passes the batch through unchanged."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._updates = 0  # learner updates seen, = the learner's weights_seq_no after this one

    def __call__(self, *, rl_module, batch, episodes, explore=None, shared_data=None, metrics=None, **kwargs):
        import numpy as np

        self._updates += 1
        total, count, newest = 0.0, 0, 0.0
        for episode in episodes:
            agents = episode.agent_episodes.values() if hasattr(episode, "agent_episodes") else [episode]
            for sa in agents:
                if WEIGHTS_SEQ_NO in sa.extra_model_outputs:
                    seq = np.asarray(sa.get_extra_model_outputs(key=WEIGHTS_SEQ_NO), dtype=np.float64).ravel()
                    total, count = total + float(seq.sum()), count + seq.size
                    newest = max(newest, float(seq.max(initial=0)))
        # Acting weights newer than our count: a resumed learner (its version restored), continue from there.
        self._updates = max(self._updates, int(newest) + 1)
        if count and metrics is not None:
            metrics.log_value((ALL_MODULES, LAG_METRIC), (self._updates - 1) - total / count, window=1)
        return batch


def policy_lag(result: dict[str, Any]) -> float:
    """The latest update's policy lag from an RLlib result (NaN when its results carry none)."""
    lag = ((result.get(LEARNER_RESULTS) or {}).get(ALL_MODULES) or {}).get(LAG_METRIC)
    return float(lag) if isinstance(lag, (int, float)) and math.isfinite(lag) else math.nan


class PolicyLag(RLlibCallback):
    """Puts the policy lag at the top of every result (NaN for algorithms without it), where progress.csv and the
    metrics read it."""

    def __init__(self):
        super().__init__()
        self._last = math.nan

    def on_train_result(self, *, algorithm, metrics_logger=None, result: dict, **kwargs) -> None:
        if algorithm.config.algo_class.__name__.lower().removesuffix("config") not in LAG_ALGOS:
            result[POLICY_LAG_KEY] = math.nan
            return
        lag = policy_lag(result)
        self._last = lag if math.isfinite(lag) else self._last
        result[POLICY_LAG_KEY] = self._last
