"""Atari (ALE) envs with the standard preprocessing used by RLlib's new API stack.

Per step: 64x64 greyscale warp and scale to [-1, 1] of each raw frame, then max over the last two of a 4-frame skip;
no-op reset, episodic life, fire reset.
Frame stacking (4) is done by connectors in the trainer and per session in the server, not by a wrapper,
so the env emits single (dim, dim, 1) frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import gymnasium as gym
import numpy as np

from rl_envs.envconfig import config_of

# The preprocessing both backends apply (rl_envs.envpool_atari passes them to EnvPool). The gymnasium backend gets
# them from RLlib's wrap_atari_for_new_api_stack, which fixes all but the frame skip and the sticky actions.
FRAME_SKIP = 4
NOOP_MAX = 30  # random no-op agent steps after a reset (RLlib's NoopResetEnv)
EPISODIC_LIFE = True  # a lost life ends the episode (RLlib's EpisodicLifeEnv; Pong has no lives)
MAX_EPISODE_FRAMES = 108_000  # RLlib's TimeLimit on the raw (frameskip=1) env
STICKY_ACTION_PROB = 0.0  # ALE repeat_action_probability


@dataclass
class AtariConfig:
    """env_config of the Atari envs; its defaults are the env's (and the Hydra schema's, env/pong)."""

    game: str = "ALE/Pong-v5"
    # Side of the square greyscale frame after preprocessing.
    dim: int = 64

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> "AtariConfig":
        return config_of(cls, config, "atari")

    def check(self) -> "AtariConfig":
        """The env's rules for its config (the trainer checks them before Ray starts): raises ValueError."""
        import ale_py  # registers the ALE/* ids (0.2 s; no emulator started)

        gym.register_envs(ale_py)
        if self.game not in gym.envs.registry:
            games = sorted(k for k in gym.envs.registry if k.startswith("ALE/") and k.endswith("-v5"))
            raise ValueError(f"atari env: unknown game {self.game!r}; e.g. {', '.join(games[:5])}, ...")
        if not 16 <= int(self.dim) <= 210:
            raise ValueError(f"atari env: `dim` must be in [16, 210] (the frame is 210x160), got {self.dim}")
        return self


def make_atari(cfg: Mapping[str, Any]) -> gym.Env:
    import ale_py  # ships the ROMs
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

    gym.register_envs(ale_py)
    c = AtariConfig.of(cfg).check()
    game, dim = c.game, int(c.dim)
    env = gym.make(game, frameskip=1, repeat_action_probability=STICKY_ACTION_PROB, full_action_space=False)
    return wrap_atari_for_new_api_stack(env, dim=dim, frameskip=FRAME_SKIP, framestack=None)


def preprocess_frame(rgb: np.ndarray, dim: int = AtariConfig.dim) -> np.ndarray:
    """Raw RGB ALE frames -> the one preprocessed frame (dim, dim, 1) float32 in [-1, 1] the policy sees.

    `rgb` is either the last two raw frames of a frame-skip step, shape (2, 210, 160, 3) uint8, or one raw frame
    (210, 160, 3). The env the trainer builds (`wrap_atari_for_new_api_stack`) runs MaxAndSkipEnv *outside*
    WarpFrame + NormalizedImageEnv: each raw frame is greyscaled, resized (INTER_AREA) and scaled first, and the
    max over the last two frames is taken after that. Maxing raw frames before preprocessing gives different
    pixels (greyscale and area resize do not commute with max), so a client sends both frames and this does the
    max in the trainer's order, with RLlib's own image functions. One frame is the env without frameskip.
    """
    from ray.rllib.utils.images import resize, rgb2gray

    arr = np.asarray(rgb)
    frames = arr[None] if arr.ndim == 3 else arr
    if frames.ndim != 4 or frames.shape[0] not in (1, 2) or frames.shape[-1] != 3:
        raise ValueError(f"expected an RGB frame (H, W, 3) or the last two of a frame skip (2, H, W, 3), "
                         f"got {tuple(arr.shape)}")
    # WarpFrame (greyscale + resize) then NormalizedImageEnv, per raw frame; then MaxAndSkipEnv's max.
    pre = [resize(rgb2gray(f.astype(np.uint8)), height=dim, width=dim)[:, :, None].astype(np.float32) / 128.0 - 1.0
           for f in frames]
    return np.max(np.stack(pre), axis=0)
