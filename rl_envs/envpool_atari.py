"""The EnvPool backend of the Atari envs (`env.backend=envpool`): one batched C++ ALE pool per env runner.

RLlib's env runner steps it as a gymnasium VectorEnv (`gym_env_vectorize_mode=vector_entry_point`): one call steps
every sub-env in C++ (frame skip, max-pool, greyscale, resize included), instead of a Python wrapper stack per
sub-env and per raw frame. The policy sees what the gymnasium backend (rl_envs.atari) gives it, from the same
emulator, with these documented differences (tests/unit/test_envpool_atari.py measures them on fixed seeds):

- Max-pool before resize: EnvPool maxes the last two greyscale raw frames of a skip, then resizes; the gymnasium
  wrapper (and the server's preprocess_frame) resizes each frame, then maxes. Pixels differ only in the cells
  covering what moved between those two frames (ball, paddles), by a few grey levels.
- Resets: EnvPool's no-ops count raw frames (uniform in [0, 4 x NOOP_MAX)), RLlib's count agent steps of 4 frames
  (uniform in [1, NOOP_MAX]); the same span of start states. EnvPool presses FIRE for one frame, RLlib's
  FireResetEnv FIRE then RIGHT for one agent step each. The first observation of an episode is one frame, not a
  max of two.

The raw frames are identical (the ALE inside EnvPool and ale-py render the same frames for the same actions),
and so is the greyscale palette for Pong. Sticky actions, episodic life and the time limit are the gymnasium
backend's (rl_envs.atari constants).
"""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import numpy as np

from rl_envs.atari import (EPISODIC_LIFE, FRAME_SKIP, MAX_EPISODE_FRAMES, NOOP_MAX, STICKY_ACTION_PROB,
                           AtariConfig)


def envpool_task(game: str) -> str:
    """gymnasium's id ("ALE/Pong-v5") -> EnvPool's ("Pong-v5")."""
    return game.split("/", 1)[-1]


def check_envpool(config: Mapping[str, Any]) -> None:
    """The backend's rules, before Ray starts: envpool installed and the game one of its tasks (ValueError)."""
    c = AtariConfig.of(config).check()
    try:
        import envpool
    except ImportError as e:
        raise ValueError(f"env.backend=envpool needs the envpool package ({e}); pip install 'rl-platform[envpool]' (envpool==1.2.5)") from None
    task = envpool_task(c.game)
    if task not in envpool.list_all_envs():
        raise ValueError(f"env.backend=envpool: EnvPool has no task {task!r} (game {c.game!r})")


class EnvPoolAtari(gym.vector.VectorEnv):
    """`num_envs` Atari envs in one EnvPool (sync mode: every step steps them all), observations (dim, dim, 1) float32
    in [-1, 1] like rl_envs.atari. Autoreset: the step after an episode ends returns the new episode's first
    observation (gymnasium's NEXT_STEP, what RLlib's env runner expects)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, config: Mapping[str, Any] | None, num_envs: int, seed: int | None = None,
                 num_threads: int = 1, **envpool_overrides: Any):
        c = AtariConfig.of(config).check()
        self.num_envs = int(num_envs)
        dim = int(c.dim)
        # num_threads=1: the env runner holds one CPU; EnvPool's C++ worker steps while Python waits.
        self._kwargs = dict(
            env_type="gymnasium", num_envs=self.num_envs, batch_size=self.num_envs, num_threads=num_threads,
            img_height=dim, img_width=dim, stack_num=1, gray_scale=True, use_inter_area_resize=True,
            frame_skip=FRAME_SKIP, noop_max=FRAME_SKIP * NOOP_MAX, use_fire_reset=True,
            episodic_life=EPISODIC_LIFE, repeat_action_probability=STICKY_ACTION_PROB,
            max_episode_steps=MAX_EPISODE_FRAMES // FRAME_SKIP, reward_clip=False, full_action_space=False,
        )
        self._kwargs.update(envpool_overrides)
        self._task = envpool_task(c.game)
        self._pool = self._make(seed)
        self.single_observation_space = gym.spaces.Box(-1.0, 1.0, shape=(dim, dim, 1), dtype=np.float32)
        self.single_action_space = gym.spaces.Discrete(int(self._pool.action_space.n))
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)

    def _make(self, seed: int | None):
        import envpool

        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (2**31 - 1))
        return envpool.make(self._task, seed=int(seed), **self._kwargs)

    @staticmethod
    def _obs(frames: np.ndarray) -> np.ndarray:
        # (N, 1, dim, dim) uint8 -> (N, dim, dim, 1) float32, scaled exactly as RLlib's NormalizedImageEnv.
        return np.moveaxis(frames, 1, -1).astype(np.float32) / 128.0 - 1.0

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        if seed is not None:  # EnvPool seeds at construction: sub-env i gets seed + i
            self._pool.close()
            self._pool = self._make(seed[0] if isinstance(seed, (list, tuple)) else seed)
        obs, _ = self._pool.reset()
        return self._obs(obs), {}

    def step(self, actions):
        obs, reward, terminated, truncated, _ = self._pool.step(np.asarray(actions, dtype=np.int32).reshape(-1))
        return self._obs(obs), reward.astype(np.float64), terminated.astype(bool), truncated.astype(bool), {}

    def close_extras(self, **kwargs: Any) -> None:
        self._pool.close()


def make_envpool_atari(config: Mapping[str, Any], num_envs: int, seed: int | None = None) -> EnvPoolAtari:
    return EnvPoolAtari(config, num_envs, seed=seed)
