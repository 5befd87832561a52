"""Stand-in for the trainer while `python -m trainer` is not in the tree: one PPO iteration, then
`algo.save_to_path` + `rl_platform.json` exactly as the trainer's contract describes.

Used only by the serving tests' fixture (and by hand: `python tests/serving/make_checkpoint.py DIR [env]`).
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path

MODULE_DIR = "learner_group/learner/rl_module/default_policy"


def make_checkpoint(out_dir: str | Path, env: str = "cartpole", iterations: int = 1) -> Path:
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig

    import rl_envs

    out_dir = Path(out_dir)
    env_id = rl_envs.register_with_ray(env)
    spec = rl_envs.get_spec(env)
    config = (
        PPOConfig()
        .environment(env_id, env_config=dict(spec.default_config))
        .env_runners(num_env_runners=0, num_envs_per_env_runner=1)
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=1)
    )
    if spec.framestack > 1:
        from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
        from ray.rllib.connectors.learner.frame_stacking import FrameStackingLearner

        n = spec.framestack
        config = config.env_runners(env_to_module_connector=lambda env, spaces=None, device=None: FrameStackingEnvToModule(num_frames=n))
        config = config.training(learner_connector=lambda obs_space, act_space: FrameStackingLearner(num_frames=n))
        config = config.rl_module(model_config={"conv_filters": [[16, [4, 4], 2], [32, [4, 4], 2], [64, [4, 4], 2], [128, [8, 8], 1]]})
    algo = config.build_algo()
    result = {}
    for _ in range(iterations):
        result = algo.train()
    algo.save_to_path(str(out_dir.resolve()))
    algo.stop()
    if ray.is_initialized():
        ray.shutdown()
    meta = {
        "format_version": 1,
        "policy_id": "default_policy",
        "module_dir": MODULE_DIR,
        "env": env,
        "env_config": dict(spec.default_config),
        "framestack": spec.framestack,
        "algo": "ppo",
        "experiment": f"{env}_ppo",
        "iteration": iterations,
        "env_steps": int(result.get("num_env_steps_sampled_lifetime", 0) or 0),
        "episode_return_mean": float(result.get("env_runners", {}).get("episode_return_mean", float("nan")) or 0.0),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "checkpoint_id": f"{env}_ppo-it{iterations}-{_dt.datetime.now().strftime('%Y%m%d%H%M%S%f')}",
    }
    (out_dir / "rl_platform.json").write_text(json.dumps(meta, indent=2))
    return out_dir


if __name__ == "__main__":
    print(make_checkpoint(sys.argv[1], *(sys.argv[2:3] or ["cartpole"])))
