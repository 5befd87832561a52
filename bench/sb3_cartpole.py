"""Baseline for bench/train_bench.py: Stable-Baselines3 PPO with rl-zoo's CartPole-v1 hyperparameters.

Stops when the mean return of the last 20 training episodes reaches the target; prints one JSON line.
rl-zoo (hyperparams/ppo.yml, CartPole-v1): n_envs 8, n_steps 32, batch_size 256, gae_lambda 0.8, gamma 0.98,
n_epochs 20, ent_coef 0.0, learning_rate lin_0.001, clip_range lin_0.2, n_timesteps 1e5, policy MlpPolicy.
"""

import time

T0 = time.time()

import json  # noqa: E402
import sys  # noqa: E402
from collections import deque  # noqa: E402

import psutil  # noqa: E402
import torch  # noqa: E402
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

TARGET = float(sys.argv[1]) if len(sys.argv) > 1 else 450.0
torch.set_num_threads(1)


def linear(start):
    return lambda progress_remaining: progress_remaining * start


class StopAtTarget(BaseCallback):
    def __init__(self):
        super().__init__()
        self.returns = deque(maxlen=20)
        self.solved_at = None

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(info["episode"]["r"])
        if len(self.returns) == 20 and sum(self.returns) / 20 >= TARGET:
            self.solved_at = self.num_timesteps
            return False
        return True


env = make_vec_env("CartPole-v1", n_envs=8)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
            learning_rate=linear(0.001), clip_range=linear(0.2), verbose=0, device="cpu")
cb = StopAtTarget()
T_LEARN = time.time()  # SB3's start-up ends here: imports, env and model built
model.learn(total_timesteps=100_000 * 3, callback=cb)
mean = sum(cb.returns) / max(len(cb.returns), 1)
print(json.dumps({"solved": cb.solved_at is not None, "env_steps": cb.solved_at or model.num_timesteps,
                  "episode_return_mean": round(mean, 2), "wall_s": round(time.time() - T0, 2),
                  "startup_s": round(T_LEARN - psutil.Process().create_time(), 2)}))
