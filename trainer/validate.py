"""Value checks Hydra's types cannot express; run before Ray starts so a bad config costs nothing."""

from __future__ import annotations

import dataclasses
import os

from omegaconf import DictConfig, OmegaConf

from trainer.config import ALGO_SCHEMAS
from trainer.errors import TrainerError


def _check_known_keys(node, path: str) -> None:
    """`+key=value` bypasses Hydra's struct check; reject keys the schema does not declare."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        if key not in fields:
            raise TrainerError(f"unknown key {path}{key} (not in {schema.__name__}; known: {', '.join(fields)})")
        child = node._get_node(key)
        if isinstance(child, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(child)):
            _check_known_keys(child, f"{path}{key}.")


def validate(cfg) -> None:
    from rl_envs import ENVS

    _check_known_keys(cfg, "")

    if cfg.algo.name not in ALGO_SCHEMAS:
        raise TrainerError(f"unknown algo.name {cfg.algo.name!r}; known: {', '.join(ALGO_SCHEMAS)}")
    if cfg.env.name not in ENVS:
        raise TrainerError(f"unknown env.name {cfg.env.name!r}; known: {', '.join(sorted(ENVS))}")
    _check_env_config(cfg)
    _check_ranges(cfg)
    if cfg.tune.scheduler not in ("none", "asha", "hyperband", "pbt"):
        raise TrainerError(f"unknown tune.scheduler {cfg.tune.scheduler!r}; known: none, asha, hyperband, pbt")
    if cfg.tune.mode not in ("max", "min"):
        raise TrainerError(f"tune.mode must be max or min, not {cfg.tune.mode!r}")
    if cfg.fault_tolerance.resume not in ("auto", "never", "must"):
        raise TrainerError(f"fault_tolerance.resume must be auto, never or must, not {cfg.fault_tolerance.resume!r}")
    s = cfg.stop
    if all(v is None for v in (s.episode_return_mean, s.eval_return_mean, s.env_steps, s.wall_s, s.iterations)):
        raise TrainerError("no stop criterion set: give stop.episode_return_mean, stop.eval_return_mean, stop.env_steps, "
                           "stop.wall_s or stop.iterations")
    ev = cfg.evaluation
    if ev.interval < 0:
        raise TrainerError(f"evaluation.interval must be >= 0 (0 = no evaluation), got {ev.interval}")
    if ev.episodes < 1:
        raise TrainerError(f"evaluation.episodes must be >= 1, got {ev.episodes}")
    if ev.num_env_runners < 0:
        raise TrainerError(f"evaluation.num_env_runners must be >= 0, got {ev.num_env_runners}")
    if ev.parallel_to_training and ev.num_env_runners < 1:
        raise TrainerError("evaluation.parallel_to_training needs evaluation.num_env_runners >= 1 (the driver cannot "
                           "evaluate while it trains)")
    if s.eval_return_mean is not None and not ev.interval:
        raise TrainerError("stop.eval_return_mean needs evaluation on (evaluation.interval >= 1), not evaluation=off")
    _check_registry(cfg)
    for key in ("env_steps", "iterations", "wall_s"):
        v = s[key]
        if v is not None and v <= 0:
            raise TrainerError(f"stop.{key} must be > 0, got {v}")
    r = cfg.resources
    for key in ("num_env_runners", "num_learners", "torch_threads"):
        if r[key] < 0:
            raise TrainerError(f"resources.{key} must be >= 0, got {r[key]}")
    if cfg.fault_tolerance.stop_grace_s <= 0:
        raise TrainerError(f"fault_tolerance.stop_grace_s must be > 0, got {cfg.fault_tolerance.stop_grace_s}")
    if r.wait_for_resources_s < 0:
        raise TrainerError(f"resources.wait_for_resources_s must be >= 0, got {r.wait_for_resources_s}")
    if r.auth not in ("token", "disabled"):
        raise TrainerError(f"resources.auth must be token or disabled, not {r.auth!r}")
    if r.num_gpus_per_learner > 0 and r.num_learners == 0:
        raise TrainerError("resources.num_gpus_per_learner > 0 needs resources.num_learners >= 1 (a GPU learner actor)")
    a = cfg.algo
    from trainer.precision import check as check_precision

    problem = check_precision(a.precision, r.num_learners, r.num_gpus_per_learner, a.grad_clip)
    if problem:
        raise TrainerError(problem)
    if a.name == "ppo" and a.minibatch_size > a.train_batch_size:
        raise TrainerError(f"algo.minibatch_size ({a.minibatch_size}) > algo.train_batch_size ({a.train_batch_size})")
    rfl = cfg.env.rollout_fragment_length
    if rfl != "auto" and (isinstance(rfl, bool) or not isinstance(rfl, int) or rfl < 1):
        raise TrainerError(f"env.rollout_fragment_length must be \"auto\" or an integer >= 1, got {rfl!r}")
    if a.name == "appo" and a.get("minibatch_size"):
        # APPO (IMPALA underneath) trains on whole rollout fragments: RLlib needs minibatch_size to be a multiple
        # of the fragment length (and raises a TypeError on "auto", the default).
        if rfl == "auto":
            raise TrainerError(f"algo.minibatch_size={a.minibatch_size} with {a.name} needs an integer "
                               "env.rollout_fragment_length that divides it (it is \"auto\")")
        if a.minibatch_size % rfl or a.minibatch_size > a.train_batch_size:
            raise TrainerError(f"algo.minibatch_size ({a.minibatch_size}) must be a multiple of "
                               f"env.rollout_fragment_length ({rfl}) and at most algo.train_batch_size "
                               f"({a.train_batch_size}) for {a.name}")
    if cfg.debug.timeline and "://" in cfg.debug.timeline:
        raise TrainerError(f"debug.timeline must be a local file path, not {cfg.debug.timeline!r}")
    if cfg.checkpoint.every_n_iterations < 0 or cfg.checkpoint.keep < 1:
        raise TrainerError("checkpoint.every_n_iterations must be >= 0 and checkpoint.keep >= 1")
    if cfg.tune.scheduler != "none":
        check_param_space(cfg)
    from trainer.offline import check_offline

    check_offline(cfg)


# Numeric bounds Hydra's types cannot express: (key, low, high, low excluded). A key the composed config does not
# have (another algorithm's) or set to null is skipped.
RANGES = [
    ("algo.lr", 0, None, True),
    ("algo.gamma", 0, 1, False),
    ("algo.train_batch_size", 1, None, False),
    ("algo.grad_clip", 0, None, True),
    ("algo.steps_per_iteration", 1, None, False),
    ("algo.minibatch_size", 1, None, False),
    ("algo.num_epochs", 1, None, False),
    ("algo.circular_buffer_num_batches", 1, None, False),
    ("algo.circular_buffer_iterations_per_batch", 1, None, False),
    ("algo.broadcast_interval", 1, None, False),
    ("algo.lambda_", 0, 1, False),
    ("algo.clip_param", 0, None, True),
    ("algo.vf_clip_param", 0, None, True),
    ("algo.entropy_coeff", 0, None, False),
    ("algo.vf_loss_coeff", 0, None, False),
    ("algo.kl_coeff", 0, None, False),
    ("algo.n_step", 1, None, False),
    ("algo.target_network_update_freq", 1, None, False),
    ("algo.num_steps_sampled_before_learning_starts", 0, None, False),
    ("algo.replay_capacity", 1, None, False),
    ("algo.epsilon_initial", 0, 1, False),
    ("algo.epsilon_final", 0, 1, False),
    ("algo.epsilon_timesteps", 0, None, False),
    ("env.num_envs_per_env_runner", 1, None, False),
    ("resources.num_cpus", 1, None, False),
    ("resources.num_cpus_per_env_runner", 0, None, False),
    ("resources.num_cpus_per_learner", 0, None, False),
    ("resources.num_gpus_per_learner", 0, None, False),
    ("tune.num_samples", 1, None, False),
    ("tune.max_concurrent_trials", 1, None, False),
    ("tune.grace_period", 1, None, False),
    ("tune.reduction_factor", 1, None, True),
    ("tune.max_t", 1, None, False),
    ("tune.perturbation_interval", 1, None, False),
    ("tune.max_failures", -1, None, False),
    ("log_every", 1, None, False),
]


def _check_ranges(cfg) -> None:
    import math

    for key, lo, hi, lo_open in RANGES:
        v = OmegaConf.select(cfg, key, default=None)
        if v is None:
            continue
        bad = (isinstance(v, float) and math.isnan(v)) or (v <= lo if lo_open else v < lo) or (hi is not None and v > hi)
        if bad:
            want = f"in [{lo}, {hi}]" if hi is not None else (f"> {lo}" if lo_open else f">= {lo}")
            raise TrainerError(f"{key} must be {want}, got {v}")
    for key in ("fcnet_hiddens", "head_fcnet_hiddens"):
        sizes = list(cfg.algo.model[key] or [])
        if any(n < 1 for n in sizes):
            raise TrainerError(f"algo.model.{key} must list layer sizes >= 1, got {sizes}")


def _check_env_config(cfg) -> None:
    """The env's own rules for env.env_config (rl_envs), now rather than in every env runner after Ray started."""
    from rl_envs.registry import get_spec, merged_config

    from rl_envs.registry import check_backend

    env_config = OmegaConf.to_container(cfg.env.env_config, resolve=True)
    try:
        get_spec(cfg.env.name).check_config(merged_config(cfg.env.name, env_config))
    except (ValueError, TypeError) as e:
        raise TrainerError(f"env.env_config: {e}") from None
    try:
        check_backend(cfg.env.name, cfg.env.backend, env_config)
    except ValueError as e:
        raise TrainerError(str(e)) from None


SAMPLERS = ("loguniform", "uniform", "choice", "randint", "grid_search")  # tune.param_space value forms


def check_param_space(cfg) -> None:
    """tune.param_space names algo keys and uses known samplers (trainer/tuning.py builds the search space)."""
    space = OmegaConf.to_container(cfg.tune.param_space, resolve=True)
    unknown = [k for k in space if k not in cfg.algo]
    if unknown:
        raise TrainerError(f"tune.param_space names keys that algo/{cfg.algo.name} does not have: {unknown}")
    for key, spec in space.items():
        if isinstance(spec, dict) and (len(spec) != 1 or next(iter(spec)) not in SAMPLERS):
            raise TrainerError(
                f"tune.param_space.{key}: expected one of {', '.join(SAMPLERS)} as the only key, got {list(spec)}"
            )


def default_output_dir(cfg) -> str:
    """outputs/<experiment>[/<overrides>]: reruns with the same overrides resume the same run; sweeps don't clash."""
    sub = ""
    try:
        from hydra.core.hydra_config import HydraConfig

        sub = HydraConfig.get().job.override_dirname
    except ValueError:
        pass
    return os.path.join("outputs", cfg.experiment, sub) if sub else os.path.join("outputs", cfg.experiment)


def _check_registry(cfg) -> None:
    """registry.*: a root the run could never register into fails now, not after hours of training."""
    reg = cfg.registry
    if reg.eval_episodes < 1:
        raise TrainerError(f"registry.eval_episodes must be >= 1, got {reg.eval_episodes}")
    if reg.eval_workers < 0:
        raise TrainerError(f"registry.eval_workers must be >= 0, got {reg.eval_workers}")
    if not reg.root:
        return
    from rl_checkpoint.registry import Registry, RegistryError, _check_name

    try:
        Registry(reg.root)
        _check_name(reg.name or cfg.experiment)
    except RegistryError as e:
        raise TrainerError(f"registry: {e}") from None


def check_registry_root(cfg) -> None:
    """In the process that trains (not where `rl-submit` renders a cluster job: a pod path is not a local one):
    a local registry root must exist, or its parent so that the first registration can create it."""
    import os

    from rl_checkpoint import is_uri

    root = cfg.registry.root
    if root and not is_uri(root):
        root = os.path.abspath(os.path.expanduser(root))
        if not os.path.isdir(root) and not os.path.isdir(os.path.dirname(root.rstrip("/")) or "/"):
            raise TrainerError(f"registry.root {root} does not exist, nor its parent directory")
