"""An example custom env registered through config: a small multi-asset trading env.

Prices are synthetic (seeded geometric random walks with regime-dependent drift), so it needs no data download.
Observation: the last `window_size` log-returns of every symbol plus the current position per symbol,
flattened to a float32 vector. Action: per symbol, 0 = flat, 1 = long, 2 = short (MultiDiscrete).
Reward: the portfolio's log-return over the step minus a transaction cost on position changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Mapping

import gymnasium as gym
import numpy as np

from rl_envs.envconfig import config_of
from gymnasium import spaces

OBS_CLIP = 10.0


@dataclass
class TradingConfig:
    """env_config of the trading env; its defaults are the env's (and the Hydra schema's, env/trading)."""

    symbols: List[str] = field(default_factory=lambda: ["AAA", "BBB"])
    # Log-returns of each symbol in one observation.
    window_size: int = 16
    episode_length: int = 200
    # Cost per unit of position change, as a fraction.
    transaction_cost: float = 1e-3
    # Per-step volatility of the synthetic prices.
    volatility: float = 0.01

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> "TradingConfig":
        return config_of(cls, config, "trading")

    def check(self) -> "TradingConfig":
        """The env's rules for its config (the trainer checks them before Ray starts): raises ValueError."""
        if not self.symbols:
            raise ValueError("trading env: `symbols` must name at least one symbol")
        if len(set(self.symbols)) != len(self.symbols):
            raise ValueError(f"trading env: `symbols` must be distinct, got {list(self.symbols)}")
        if self.window_size < 1 or self.episode_length < 1:
            raise ValueError("trading env: `window_size` and `episode_length` must be >= 1")
        if not 0 <= self.transaction_cost < 1:
            raise ValueError(f"trading env: `transaction_cost` must be in [0, 1), got {self.transaction_cost}")
        if not self.volatility > 0:
            raise ValueError(f"trading env: `volatility` must be > 0, got {self.volatility}")
        return self


class TradingEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, config: Mapping[str, Any] | None = None):
        cfg = TradingConfig.of(config).check()
        self.symbols = list(cfg.symbols)
        self.window_size = int(cfg.window_size)
        self.episode_length = int(cfg.episode_length)
        self.cost = float(cfg.transaction_cost)
        self.volatility = float(cfg.volatility)
        n = len(self.symbols)
        obs_len = n * self.window_size + n
        # Returns are expressed in units of volatility and clipped, so the space is bounded (servers validate it).
        self.observation_space = spaces.Box(low=-OBS_CLIP, high=OBS_CLIP, shape=(obs_len,), dtype=np.float32)
        self.action_space = spaces.MultiDiscrete([3] * n)
        self._returns: np.ndarray | None = None
        self._t = 0
        self._position = np.zeros(n, dtype=np.float32)

    def _simulate(self) -> np.ndarray:
        n = len(self.symbols)
        steps = self.window_size + self.episode_length
        # A persistent per-symbol drift that flips sign with a regime process: learnable momentum.
        regime = np.sign(self.np_random.standard_normal(n))
        drift = np.empty((steps, n), dtype=np.float64)
        for t in range(steps):
            flip = self.np_random.random(n) < 0.02
            regime = np.where(flip, -regime, regime)
            drift[t] = regime * self.volatility * 0.3
        noise = self.np_random.standard_normal((steps, n)) * self.volatility
        return (drift + noise).astype(np.float32)

    def _obs(self) -> np.ndarray:
        assert self._returns is not None
        window = self._returns[self._t : self._t + self.window_size]  # (window, n)
        # Scale returns to unit-ish magnitude so the default MLP needs no normaliser.
        scaled = np.clip(window / self.volatility, -OBS_CLIP, OBS_CLIP)
        return np.concatenate([scaled.T.ravel(), self._position]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._returns = self._simulate()
        self._t = 0
        self._position = np.zeros(len(self.symbols), dtype=np.float32)
        return self._obs(), {}

    def step(self, action):
        assert self._returns is not None
        action = np.asarray(action, dtype=np.int64)
        new_position = np.select([action == 1, action == 2], [1.0, -1.0], 0.0).astype(np.float32)
        traded = np.abs(new_position - self._position).sum()
        self._position = new_position
        next_ret = self._returns[self._t + self.window_size]
        reward = float((self._position * next_ret).sum() - self.cost * traded)
        self._t += 1
        terminated = False
        truncated = self._t >= self.episode_length
        return self._obs(), reward, terminated, truncated, {"position": self._position.copy()}
