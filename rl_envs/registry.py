"""Registry of the environments this project trains and serves."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import gymnasium as gym

GYMNASIUM = "gymnasium"  # the default backend: the env's own gymnasium.Env, vectorised by RLlib
from rl_envs.atari import AtariConfig
from rl_envs.trading import TradingConfig


@dataclass(frozen=True)
class EnvSpec:
    """How to build an env, and what a policy trained on it expects at inference time."""

    name: str
    # Builds the (preprocessed) env from an env_config mapping.
    creator: Callable[[Mapping[str, Any]], gym.Env]
    description: str
    # Frames stacked by RLlib connectors (FrameStackingEnvToModule / FrameStackingLearner); 1 = none.
    # The served RLModule sees `framestack` consecutive preprocessed observations along the last axis.
    framestack: int = 1
    # The env_config dataclass: its defaults are merged under the user's (None = no options).
    config_class: type | None = None
    # The greedy return at which the env counts as solved: the promotion gate's default floor for the lower end of
    # an evaluation's confidence interval (None = no floor unless `--min-return` is given).
    solved_return: float | None = None
    # Backends other than "gymnasium" (always there): name -> (check(env_config) raising ValueError,
    # make(env_config, num_envs, seed) -> a gymnasium VectorEnv stepping num_envs sub-envs at once).
    vector_backends: Mapping[str, tuple[Callable[[Mapping[str, Any]], None], Callable[..., Any]]] = \
        dataclasses.field(default_factory=dict)

    @property
    def backends(self) -> tuple[str, ...]:
        return (GYMNASIUM, *self.vector_backends)

    def check_config(self, env_config: Mapping[str, Any]) -> None:
        """The env's own rules for a merged env_config, cheaply: its config class's check() where it has one, else
        build the env once (CartPole: milliseconds). Raises ValueError/TypeError naming the problem."""
        if self.config_class is not None:
            self.config_class.of(env_config).check()
        else:
            self.creator(env_config).close()

    @property
    def default_config(self) -> dict[str, Any]:
        return dataclasses.asdict(self.config_class()) if self.config_class else {}


def _cartpole(cfg: Mapping[str, Any]) -> gym.Env:
    return gym.make("CartPole-v1", **dict(cfg))


def _pong(cfg: Mapping[str, Any]) -> gym.Env:
    from rl_envs.atari import make_atari

    return make_atari(cfg)


def _pong_envpool_check(cfg: Mapping[str, Any]) -> None:
    from rl_envs.envpool_atari import check_envpool

    check_envpool(cfg)


def _pong_envpool(cfg: Mapping[str, Any], num_envs: int, seed: int | None = None):
    from rl_envs.envpool_atari import make_envpool_atari

    return make_envpool_atari(cfg, num_envs, seed=seed)


def _trading(cfg: Mapping[str, Any]) -> gym.Env:
    from rl_envs.trading import TradingEnv

    return TradingEnv(dict(cfg))


ENVS: dict[str, EnvSpec] = {
    "cartpole": EnvSpec(
        name="cartpole",
        creator=_cartpole,
        description="gymnasium CartPole-v1 (4 floats in, 2 actions)",
        solved_return=475.0,  # gymnasium's CartPole-v1 reward_threshold
    ),
    "pong": EnvSpec(
        name="pong",
        creator=_pong,
        description="ALE Pong with standard Atari preprocessing (64x64 grey, [-1,1]) and 4-frame stacking",
        framestack=4,
        config_class=AtariConfig,
        solved_return=18.0,  # the usual "solved" mark for Pong (max 21)
        vector_backends={"envpool": (_pong_envpool_check, _pong_envpool)},
    ),
    "trading": EnvSpec(
        name="trading",
        creator=_trading,
        description="Example custom env: a toy multi-asset trading env driven by synthetic prices",
        config_class=TradingConfig,
    ),
}


def get_spec(name: str) -> EnvSpec:
    try:
        return ENVS[name]
    except KeyError:
        raise KeyError(f"unknown env {name!r}; known envs: {', '.join(sorted(ENVS))}") from None


def merged_config(name: str, env_config: Mapping[str, Any] | None) -> dict[str, Any]:
    cfg = dict(get_spec(name).default_config)
    cfg.update(dict(env_config or {}))
    return cfg


def make_env(name: str, env_config: Mapping[str, Any] | None = None) -> gym.Env:
    """Build the env exactly as the trainer's env runners build it."""
    return get_spec(name).creator(merged_config(name, env_config))


def check_backend(name: str, backend: str, env_config: Mapping[str, Any] | None = None) -> None:
    """`backend` exists for env `name` and can run its merged env_config (ValueError naming the problem)."""
    spec = get_spec(name)
    if backend not in (GYMNASIUM, "envpool") or backend not in spec.backends:
        known = ", ".join(spec.backends)
        if backend in (GYMNASIUM, "envpool"):
            raise ValueError(f"env.backend={backend} is for Atari envs (pong); env {name!r} has: {known}")
        raise ValueError(f"unknown env.backend {backend!r}; env {name!r} has: {known}")
    if backend != GYMNASIUM:
        spec.vector_backends[backend][0](merged_config(name, env_config))


def register_with_ray(name: str, backend: str = GYMNASIUM) -> str:
    """Register `name` with Ray Tune's registry under a project-prefixed id; returns the id.

    A vector backend's creator returns the whole vector env when RLlib asks for one (`num_envs` in the context,
    `gym_env_vectorize_mode=vector_entry_point`) and the gymnasium env otherwise (same spaces)."""
    from ray.tune.registry import register_env

    spec = get_spec(name)
    env_id = f"rl_platform/{spec.name}" + ("" if backend == GYMNASIUM else f"@{backend}")

    def _creator(env_context):  # env_context is an EnvContext (a dict subclass)
        cfg = dict(env_context)
        num_envs = cfg.pop("num_envs", None)
        if backend == GYMNASIUM or num_envs is None:
            return spec.creator(merged_config(name, cfg))
        # Sub-env seeds of env runner w start at w * 10_007 (distinct runners, distinct episodes) unless RLlib
        # resets with a seed (config.seed), which replaces it.
        seed = getattr(env_context, "worker_index", 0) * 10_007 + getattr(env_context, "vector_index", 0)
        return spec.vector_backends[backend][1](merged_config(name, cfg), int(num_envs), seed=seed)

    register_env(env_id, _creator)
    return env_id
