"""algo/ + env/ + resources/ (+ offline) config groups -> an RLlib (new API stack) AlgorithmConfig."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from omegaconf import OmegaConf

from rl_envs import get_spec, register_with_ray
from trainer.callbacks import WINDOW, EvalReturn, LastNEpisodeReturns
from trainer.config import AlgoConf, TrainConfig
from trainer.errors import TrainerError
from trainer.metrics import TrainingMetrics
from trainer.offline import OFFLINE_ALGOS, apply_offline
from trainer.policy_lag import LAG_ALGOS, ActingWeightsVersion, PolicyLag
from trainer.precision import apply_precision
from trainer.resources import placement

# Fields of AlgoConf handled outside AlgorithmConfig.training(), or translated below.
_NOT_TRAINING_KWARGS = {"name", "model", "precision", "steps_per_iteration"}


def _algo_config_class(name: str):
    # Import only the algorithm asked for: importing them all pulls in optional dependencies.
    if name == "ppo":
        from ray.rllib.algorithms.ppo import PPOConfig as cls
    elif name == "appo":
        from ray.rllib.algorithms.appo import APPOConfig as cls
    elif name == "impala":
        from ray.rllib.algorithms.impala import IMPALAConfig as cls
    elif name == "dqn":
        from ray.rllib.algorithms.dqn import DQNConfig as cls
    elif name == "bc":
        from ray.rllib.algorithms.bc import BCConfig as cls
    elif name == "marwil":
        from ray.rllib.algorithms.marwil import MARWILConfig as cls
    else:
        raise TrainerError(f"unknown algo {name!r}; known: ppo, appo, impala, dqn, bc, marwil")
    return cls


def training_kwargs(algo: dict[str, Any], num_learners: int = 0) -> dict[str, Any]:
    """AlgoConf fields -> AlgorithmConfig.training() keyword arguments.

    train_batch_size and minibatch_size are global: RLlib splits train_batch_size over the learners itself but
    takes minibatch_size per learner, so N DDP learners would each average N x more samples per SGD step and take
    N x fewer steps per iteration (measured: CartPole needed 1.5x the env steps). Splitting it keeps them equal.
    """
    kw = {k: v for k, v in algo.items() if k not in _NOT_TRAINING_KWARGS and v is not None}
    if num_learners > 1 and kw.get("minibatch_size"):
        kw["minibatch_size"] = max(1, kw["minibatch_size"] // num_learners)
    if algo["name"] == "dqn":
        kw["replay_buffer_config"] = {
            "type": "PrioritizedEpisodeReplayBuffer",
            "capacity": kw.pop("replay_capacity"),
            "alpha": 0.6,
            "beta": 0.4,
        }
        kw["epsilon"] = [
            (0, kw.pop("epsilon_initial")),
            (kw.pop("epsilon_timesteps"), kw.pop("epsilon_final")),
        ]
    return kw


def steps_per_iteration(algo: dict[str, Any]) -> int:
    """RLlib's min_sample_timesteps_per_iteration (its time minimum is turned off). 0 = one training_step: a train
    batch for PPO, one sampling round for DQN; APPO/IMPALA's training_step is one async round, so a train batch."""
    if algo.get("steps_per_iteration"):
        return int(algo["steps_per_iteration"])
    return int(algo["train_batch_size"]) if algo["name"] in ("appo", "impala") else 0


def model_config(model: dict[str, Any]):
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    kw = dict(model)
    if kw.get("conv_filters") is None:
        kw.pop("conv_filters", None)
    else:
        kw["conv_filters"] = [tuple(f) for f in kw["conv_filters"]]
    if not kw.get("head_fcnet_hiddens"):
        kw.pop("head_fcnet_hiddens", None)
    return DefaultModelConfig(**kw)


def evaluation_kwargs(ev) -> dict[str, Any]:
    """evaluation/ group -> AlgorithmConfig.evaluation() keyword arguments.

    The eval env runners are built from a copy of the training config (RLlib's get_evaluation_config_object), so
    they inherit its env, frame-stacking connector and `custom_resources_per_env_runner`: on a cluster they go to
    the rollout pool like the training env runners. explore=False: the greedy policy the server runs.
    Each eval runner steps as many sub-envs as it has episodes to run, so an evaluation is one round of episodes
    side by side (CartPole: 10 x 500 steps in ~1 s) and RLlib, which counts the first episodes to end, is not
    biased to short ones by sub-envs that start a second episode."""
    if not ev.interval:
        return {"evaluation_interval": None}
    per_runner = math.ceil(ev.episodes / max(1, ev.num_env_runners))
    return {
        "evaluation_interval": ev.interval,
        "evaluation_duration": ev.episodes,
        "evaluation_duration_unit": "episodes",
        "evaluation_num_env_runners": ev.num_env_runners,
        "evaluation_parallel_to_training": ev.parallel_to_training,
        # The eval return is the mean over exactly this evaluation's episodes, however many are asked for.
        "evaluation_config": {"explore": False, "metrics_num_episodes_for_smoothing": ev.episodes,
                              "num_envs_per_env_runner": per_runner},
    }


def as_dict(node) -> dict[str, Any]:
    if dataclasses.is_dataclass(node):
        return dataclasses.asdict(node)
    return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]


def build_algo_config(cfg: TrainConfig, algo_overrides: dict[str, Any] | None = None):
    """The one place a Hydra config becomes an RLlib AlgorithmConfig."""
    algo = as_dict(cfg.algo)
    if algo_overrides:
        algo.update(algo_overrides)
    env = as_dict(cfg.env)
    try:
        spec = get_spec(env["name"])
    except KeyError as e:
        raise TrainerError(str(e.args[0])) from None
    backend = env.get("backend", "gymnasium")
    env_id = register_with_ray(spec.name, backend)

    env_runner_kw, learner_kw = placement(cfg.resources)  # type: ignore[arg-type]
    cls = _algo_config_class(algo["name"])
    config = (
        cls()
        .environment(env_id, env_config=dict(env["env_config"]))
        .env_runners(
            num_envs_per_env_runner=env["num_envs_per_env_runner"],
            rollout_fragment_length=env["rollout_fragment_length"],
            **env_runner_kw,
        )
        .learners(**learner_kw)
        .training(**training_kwargs(algo, cfg.resources.num_learners))
        .rl_module(model_config=model_config(algo["model"]))
        .fault_tolerance(
            restart_failed_env_runners=cfg.fault_tolerance.restart_failed_env_runners,
            max_num_env_runner_restarts=cfg.fault_tolerance.max_num_env_runner_restarts,
        )
        # Sample no more than steps_per_iteration per iteration: the stop criteria are checked after every one.
        .reporting(metrics_num_episodes_for_smoothing=WINDOW, min_time_s_per_iteration=None,
                   min_sample_timesteps_per_iteration=steps_per_iteration(algo))
        # Reports the mean return of the last WINDOW training episodes (the usual "solved" criterion), then
        # exports it and the greedy evaluation return with the other training metrics on Ray's metrics port
        # (trainer/metrics.py).
        .callbacks([LastNEpisodeReturns, EvalReturn, PolicyLag, TrainingMetrics])
    )
    config = config.evaluation(**evaluation_kwargs(cfg.evaluation))
    if backend != "gymnasium":  # the backend's creator returns the whole vector env (rl_envs.registry)
        config = config.env_runners(gym_env_vectorize_mode="vector_entry_point")
    if algo["name"] in OFFLINE_ALGOS:  # trained from a transition log; the env above gives spaces and evaluation
        config = apply_offline(config, cfg)
    learner_pieces = []  # classes, built in each learner
    if spec.framestack > 1:
        from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
        from ray.rllib.connectors.learner.frame_stacking import FrameStackingLearner

        n = spec.framestack
        config = config.env_runners(env_to_module_connector=lambda env, spaces=None, device=None: FrameStackingEnvToModule(num_frames=n))
        learner_pieces.append(lambda: FrameStackingLearner(num_frames=n))
    if algo["name"] in LAG_ALGOS:  # policy lag (trainer/policy_lag.py)
        learner_pieces.append(ActingWeightsVersion)
    if learner_pieces:
        config = config.learners(learner_connector=lambda obs_space, act_space: [p() for p in learner_pieces])
    if cfg.seed is not None:
        config = config.debugging(seed=cfg.seed)
    return apply_precision(config, algo.get("precision", "fp32"))
