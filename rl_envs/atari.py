"""Atari (ALE) envs with the standard preprocessing used by RLlib's new API stack.

Per frame: no-op reset, max-and-skip 4, episodic life, fire reset, 64x64 greyscale warp, scale to [-1, 1].
Frame stacking (4) is done by connectors in the trainer and per session in the server, not by a wrapper,
so the env emits single (dim, dim, 1) frames.
"""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import numpy as np


def make_atari(cfg: Mapping[str, Any]) -> gym.Env:
    import ale_py  # ships the ROMs
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

    gym.register_envs(ale_py)
    game = cfg.get("game", "ALE/Pong-v5")
    dim = int(cfg.get("dim", 64))
    env = gym.make(game, frameskip=1, repeat_action_probability=0.0, full_action_space=False)
    return wrap_atari_for_new_api_stack(env, dim=dim, framestack=None)


def preprocess_frame(rgb: np.ndarray, dim: int = 64) -> np.ndarray:
    """One raw RGB ALE frame (210, 160, 3) uint8 -> one preprocessed frame (dim, dim, 1) float32 in [-1, 1].

    Mirrors RLlib's WarpFrame (greyscale + INTER_AREA resize) + NormalizedImageEnv. Max-pooling over skipped
    frames happens in the env before the client sees a frame, so a client that steps its own ALE env with
    frameskip should send the max of the last two frames (what MaxAndSkipEnv returns).
    """
    import cv2

    if rgb.ndim != 3 or rgb.shape[-1] != 3:
        raise ValueError(f"expected an RGB frame of shape (H, W, 3), got {tuple(rgb.shape)}")
    grey = cv2.cvtColor(rgb.astype(np.uint8), cv2.COLOR_RGB2GRAY)
    small = cv2.resize(grey, (dim, dim), interpolation=cv2.INTER_AREA)
    return (small[:, :, None].astype(np.float32) / 128.0) - 1.0
