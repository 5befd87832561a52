"""Faulty candidates for the rollout tests: real RLlib PPO modules whose forward pass fails or is slow.

A candidate that raises or stalls in production is a real module with a real defect (a custom layer that breaks on
some inputs, a model far too large for the serving CPU). These subclasses reproduce the two symptoms with the
stock CartPole module, saved as ordinary RLModule checkpoints: the policy server loads them by their import path
(`tests.serving.faulty_modules`, importable in Ray workers because the repo root is on their PYTHONPATH).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule

SLOW_FORWARD_S = 0.08


class RaisingPPOModule(DefaultPPOTorchRLModule):
    """Every inference forward raises (as a module with a broken custom layer would)."""

    def _forward_inference(self, batch, **kwargs):
        raise RuntimeError("injected fault: this candidate's forward pass always fails")


class SlowPPOModule(DefaultPPOTorchRLModule):
    """The stock (seeded, untrained) module's actions, each inference forward taking SLOW_FORWARD_S (a model too big
    for the serving CPU)."""

    def _forward_inference(self, batch, **kwargs):
        time.sleep(SLOW_FORWARD_S)
        return super()._forward_inference(batch, **kwargs)


def faulty_checkpoint(out_dir: str | Path, module_cls: type, env: str = "cartpole") -> Path:
    """A CartPole checkpoint (bare RLModule dir + rl_platform metadata) whose module class is `module_cls`."""
    import importlib

    import torch

    import rl_envs

    # The class as the server's Ray workers import it (the checkpoint records its module path): pytest may have
    # imported this file under its bare name.
    module_cls = getattr(importlib.import_module("tests.serving.faulty_modules"), module_cls.__name__)
    from rl_checkpoint import CheckpointMetadata, Storage, write_metadata

    spec = rl_envs.get_spec(env)
    e = rl_envs.make_env(env, spec.default_config)
    obs_space, act_space = e.observation_space, e.action_space
    e.close()
    torch.manual_seed(0)
    module = module_cls(observation_space=obs_space, action_space=act_space, inference_only=False, model_config={})
    out = Path(out_dir)
    module.save_to_path(str(out.resolve()))
    meta = CheckpointMetadata.new(experiment=f"{env}_ppo", name=module_cls.__name__, iteration=0, env_steps=0,
                                  episode_return_mean=None, env=env, env_config=dict(spec.default_config),
                                  framestack=spec.framestack, algo="ppo", module_dir=".")
    write_metadata(Storage.open(str(out)), dataclasses.replace(meta, checkpoint_id=f"{env}-{module_cls.__name__}"))
    return out
