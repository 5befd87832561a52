"""Policy checkpoints for the serving tests that need no training run.

`make_module_checkpoint` saves an untrained PPO RLModule with an env's served spaces (frames stacked for Pong)
plus the trainer's checkpoint metadata (`rl_checkpoint.CheckpointMetadata`), in seconds. CartPole checkpoints come from the real trainer instead
(see conftest.py), so the suite still exercises trainer -> checkpoint -> serving.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


def make_module_checkpoint(out_dir: str | Path, env: str = "pong", seed: int = 0) -> Path:
    """An untrained PPO RLModule with the env's served spaces, saved as a bare RLModule dir + its metadata.

    Seconds instead of minutes for Pong; the module's input is what training feeds it (frames stacked).
    """
    import gymnasium as gym
    import numpy as np
    import torch
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule

    import rl_envs
    from rl_checkpoint import CheckpointMetadata, Storage, write_metadata

    spec = rl_envs.get_spec(env)
    e = rl_envs.make_env(env, spec.default_config)
    obs_space, act_space = e.observation_space, e.action_space
    e.close()
    if spec.framestack > 1:
        low = np.repeat(obs_space.low, spec.framestack, axis=-1)
        high = np.repeat(obs_space.high, spec.framestack, axis=-1)
        obs_space = gym.spaces.Box(low, high, dtype=obs_space.dtype)
    torch.manual_seed(seed)
    module = DefaultPPOTorchRLModule(observation_space=obs_space, action_space=act_space, inference_only=False,
                                     model_config={})
    out_dir = Path(out_dir)
    module.save_to_path(str(out_dir.resolve()))
    meta = CheckpointMetadata.new(experiment=f"{env}_ppo", name="untrained", iteration=0, env_steps=0,
                                  episode_return_mean=None, env=env, env_config=dict(spec.default_config),
                                  framestack=spec.framestack, algo="ppo", module_dir=".")
    meta = dataclasses.replace(meta, checkpoint_id=f"{env}-untrained-{seed}")
    write_metadata(Storage.open(str(out_dir)), meta)
    return out_dir


if __name__ == "__main__":
    import sys

    print(make_module_checkpoint(sys.argv[1], *(sys.argv[2:3] or ["pong"])))
