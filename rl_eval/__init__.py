"""Judge a checkpoint's greedy policy: `rl-eval` (cli), the episode players (episodes).

The figures go into the checkpoint as `rl_checkpoint.EvalRecord`s, which the registry's promotion gate reads.
"""

from rl_eval.episodes import Episode, EvalError

__all__ = ["Episode", "EvalError"]
