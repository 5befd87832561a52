"""Compose every experiment and config-group option; check the mapping to RLlib; bad configs fail at compose."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from trainer.algo import build_algo_config, training_kwargs
from trainer.config import register_configs
from trainer.errors import TrainerError
from trainer.tuning import search_space
from trainer.validate import validate
from trainer.offline import OFFLINE_ALGOS
from offline_logs import row, write_rows

CONF = Path(__file__).resolve().parents[2] / "hydra_conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
ALGOS = sorted(p.stem for p in (CONF / "algo").glob("*.yaml"))
ENVS = sorted(p.stem for p in (CONF / "env").glob("*.yaml"))

register_configs()


def cfg_of(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_evaluation_is_on_for_every_experiment_and_builds_rllib_evaluation():
    for experiment in EXPERIMENTS:
        ev = cfg_of(f"experiment={experiment}").evaluation
        assert ev.interval >= 1 and ev.episodes >= 1, experiment
    cfg = cfg_of()
    config = build_algo_config(cfg)
    assert config.evaluation_interval == cfg.evaluation.interval and config.evaluation_duration == cfg.evaluation.episodes
    assert config.evaluation_duration_unit == "episodes" and config.evaluation_num_env_runners == 0
    assert not config.evaluation_parallel_to_training
    ev_config = config.get_evaluation_config_object()
    assert ev_config.explore is False and ev_config.num_envs_per_env_runner == cfg.evaluation.episodes
    assert build_algo_config(cfg_of("evaluation=off")).evaluation_interval is None


def test_eval_env_runners_go_to_the_rollout_pool_and_stack_frames():
    cfg = cfg_of("experiment=pong_ppo", "resources=cluster", "evaluation=parallel", "evaluation.episodes=5")
    validate(cfg)
    config = build_algo_config(cfg)
    assert config.evaluation_parallel_to_training and config.evaluation_num_env_runners == 1
    ev_config = config.get_evaluation_config_object()  # what RLlib builds the eval env runners from
    assert ev_config.num_env_runners == 1 and ev_config.num_envs_per_env_runner == 5
    assert ev_config.custom_resources_per_env_runner == {"rollout_pool": 1}
    pipeline = ev_config._env_to_module_connector(None)
    assert type(pipeline).__name__ == "FrameStacking" and pipeline.num_frames == 4


def test_groups_present():
    assert EXPERIMENTS == ["cartpole_ppo", "pong_appo", "pong_ppo"]
    assert ALGOS == ["appo", "bc", "dqn", "impala", "marwil", "ppo"]
    assert set(ENVS) >= {"cartpole", "pong", "trading"}


def test_default_is_cartpole_ppo_local_solving_450():
    cfg = cfg_of()
    assert (cfg.experiment, cfg.algo.name, cfg.env.name) == ("cartpole_ppo", "ppo", "cartpole")
    assert cfg.resources.address is None and cfg.tune.scheduler == "none"
    assert cfg.stop.episode_return_mean == 450


@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("resources", ["local", "cluster"])
def test_every_experiment_builds_an_rllib_config(experiment, resources):
    cfg = cfg_of(f"experiment={experiment}", f"resources={resources}")
    validate(cfg)
    config = build_algo_config(cfg)
    assert config.algo_class.__name__.lower() == cfg.algo.name
    assert config.enable_rl_module_and_learner and config.enable_env_runner_and_connector_v2  # new API stack
    assert config.lr == cfg.algo.lr and config.gamma == cfg.algo.gamma
    assert config.env == f"rl_platform/{cfg.env.name}"
    if resources == "cluster":
        assert config.custom_resources_per_env_runner == {"rollout_pool": 1}
        assert config.custom_resources_per_learner == {"learner_pool": 1}
        assert config.num_gpus_per_learner == 1 and config.num_learners >= 1
        assert config.num_env_runners == cfg.resources.num_env_runners >= 1
    else:
        assert config.custom_resources_per_env_runner == {}
        assert config.custom_resources_per_learner == {}
        assert config.num_gpus_per_learner == 0 and config.num_learners == 0


def test_pong_uses_framestacking_connectors_and_conv_model():
    cfg = cfg_of("experiment=pong_ppo")
    config = build_algo_config(cfg)
    pipeline = config._env_to_module_connector(None)
    assert type(pipeline).__name__ == "FrameStacking" and pipeline.num_frames == 4
    assert config.model_config["conv_filters"][0] == (16, 4, 2)


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algo_composes_with_cartpole(algo, tmp_path):
    # Presets tune one algorithm; `~experiment` drops the preset to combine groups freely. Offline ones need a log.
    log = write_rows(tmp_path / "log" / "a.parquet", [row("e", 0, [0.0] * 4, 0, done=True)]).parent
    cfg = cfg_of("~experiment", f"algo={algo}", "env=cartpole",
                 *([f"offline.input={log}"] if algo in OFFLINE_ALGOS else []))
    assert cfg.algo.name == algo and cfg.experiment == f"cartpole_{algo}"
    validate(cfg)
    config = build_algo_config(cfg)
    assert config.algo_class.__name__.lower() == algo


def test_cluster_cpu_only_learner_keeps_learner_pool_without_gpus():
    cfg = cfg_of("resources=cluster", "resources.num_gpus_per_learner=0")
    config = build_algo_config(cfg)
    assert config.num_gpus_per_learner == 0
    assert config.custom_resources_per_learner == {"learner_pool": 1}


def test_dqn_training_kwargs_translate_replay_and_epsilon():
    cfg = cfg_of("~experiment", "algo=dqn")
    kw = training_kwargs(dict(cfg.algo))
    assert kw["replay_buffer_config"]["capacity"] == cfg.algo.replay_capacity
    assert kw["epsilon"] == [(0, 1.0), (cfg.algo.epsilon_timesteps, cfg.algo.epsilon_final)]
    assert "replay_capacity" not in kw and "model" not in kw


def test_misspelt_key_fails_at_compose_naming_it():
    with pytest.raises(ConfigCompositionException) as e:
        cfg_of("algo.lrr=0.1")
    assert "lrr" in str(e.value)
    # `+key=` forces Hydra to add a key; the schema check still rejects it before Ray starts.
    with pytest.raises(TrainerError, match=r"algo\.lrr"):
        validate(cfg_of("+algo.lrr=0.1"))


def test_wrong_type_fails_at_compose_naming_it():
    with pytest.raises((ValidationError, ConfigCompositionException)) as e:
        cfg_of("algo.lr=fast")
    assert "fast" in str(e.value) or "lr" in str(e.value.__cause__)
    with pytest.raises((ValidationError, ConfigCompositionException)):
        cfg_of("resources.num_env_runners=two")


def test_unknown_group_option_fails():
    with pytest.raises(Exception) as e:
        cfg_of("experiment=nope")
    assert "nope" in str(e.value)


@pytest.mark.parametrize(
    "override, needle",
    [
        ("resources.num_env_runners=-1", "num_env_runners"),
        ("env.name=atlantis", "atlantis"),
        ("algo.minibatch_size=100000", "minibatch_size"),
        ("resources.num_gpus_per_learner=1", "num_learners"),
        ("fault_tolerance.resume=sometimes", "resume"),
        ("stop.env_steps=0", "stop.env_steps"),
        ("evaluation.episodes=0", "evaluation.episodes"),
        ("evaluation.interval=-1", "evaluation.interval"),
        ("evaluation.num_env_runners=-1", "evaluation.num_env_runners"),
        ("evaluation.parallel_to_training=true", "evaluation.parallel_to_training needs evaluation.num_env_runners"),
        ("evaluation=off,stop.eval_return_mean=400", "stop.eval_return_mean needs evaluation on"),
        # The sweep of numeric bounds (trainer.validate.RANGES): each names its key and the bound.
        ("algo.gamma=1.5", "algo.gamma must be in [0, 1], got 1.5"),
        ("algo.gamma=-0.1", "algo.gamma must be in [0, 1]"),
        ("algo.lr=0", "algo.lr must be > 0"),
        ("algo.lr=nan", "algo.lr must be > 0, got nan"),
        ("algo.train_batch_size=0", "algo.train_batch_size must be >= 1"),
        ("algo.lambda_=2", "algo.lambda_ must be in [0, 1]"),
        ("algo.clip_param=0", "algo.clip_param must be > 0"),
        ("algo.entropy_coeff=-1", "algo.entropy_coeff must be >= 0"),
        ("algo.num_epochs=0", "algo.num_epochs must be >= 1"),
        ("algo.grad_clip=-5", "algo.grad_clip must be > 0"),
        ("algo.steps_per_iteration=0", "algo.steps_per_iteration must be >= 1"),
        ("algo.model.fcnet_hiddens=[0]", "algo.model.fcnet_hiddens must list layer sizes >= 1, got [0]"),
        ("~experiment,algo=dqn,algo.epsilon_final=1.5", "algo.epsilon_final must be in [0, 1]"),
        ("~experiment,algo=dqn,algo.n_step=0", "algo.n_step must be >= 1"),
        ("~experiment,algo=appo,algo.circular_buffer_num_batches=0", "algo.circular_buffer_num_batches must be >= 1"),
        ("~experiment,algo=impala,algo.broadcast_interval=0", "algo.broadcast_interval must be >= 1"),
        ("env.rollout_fragment_length=0", "env.rollout_fragment_length must be \"auto\" or an integer >= 1"),
        ("env.num_envs_per_env_runner=0", "env.num_envs_per_env_runner must be >= 1"),
        ("resources.num_cpus=0", "resources.num_cpus must be >= 1"),
        ("tune=asha,tune.reduction_factor=1", "tune.reduction_factor must be > 1"),
        ("tune.num_samples=0", "tune.num_samples must be >= 1"),
        ("log_every=0", "log_every must be >= 1"),
        # The env's own rules (rl_envs), checked at validation time instead of in every env runner.
        ("~experiment,algo=ppo,env=trading,env.env_config.symbols=[]", "env.env_config: trading env: `symbols` must"),
        ("~experiment,algo=ppo,env=trading,env.env_config.volatility=0", "`volatility` must be > 0"),
        ("experiment=pong_ppo,env.env_config.game=ALE/Pongg-v5", "env.env_config: atari env: unknown game 'ALE/Pongg-v5'"),
        ("experiment=pong_ppo,env.env_config.dim=8", "atari env: `dim` must be in [16, 210]"),
        ("+env.env_config.sutton_bartoo=true", "env.env_config: CartPoleEnv.__init__() got an unexpected keyword"),
    ],
)
def test_value_checks_name_the_key(override, needle):
    cfg = cfg_of(*override.split(","))
    with pytest.raises(TrainerError) as e:
        validate(cfg)
    assert needle in str(e.value)


def test_no_stop_criterion_is_rejected():
    cfg = cfg_of("stop.episode_return_mean=null", "stop.env_steps=null", "stop.wall_s=null")
    with pytest.raises(TrainerError, match="no stop criterion"):
        validate(cfg)
    validate(cfg_of("stop.episode_return_mean=null", "stop.env_steps=null", "stop.wall_s=null",
                    "stop.eval_return_mean=450"))  # the greedy evaluation's return alone is a stop criterion


def test_search_space_maps_to_tune_samplers():
    from ray.tune.search.sample import Categorical, Float

    space = search_space({"lr": {"loguniform": [1e-4, 1e-3]}, "gamma": {"choice": [0.9, 0.99]}, "clip_param": 0.3})
    assert isinstance(space["lr"], Float) and space["lr"].lower == 1e-4
    assert isinstance(space["gamma"], Categorical) and space["gamma"].categories == [0.9, 0.99]
    assert space["clip_param"] == 0.3
    # Malformed samplers and unknown keys are refused by validate(), before Ray starts.
    with pytest.raises(TrainerError, match=r"param_space\.gamma: expected one of"):
        validate(cfg_of("tune=asha", "+tune.param_space.gamma={sometimes: [1]}"))
    with pytest.raises(TrainerError, match="does not have: \\['nope'\\]"):
        validate(cfg_of("tune=asha", "+tune.param_space.nope={uniform: [0, 1]}"))


@pytest.mark.parametrize("sched", ["asha", "hyperband", "pbt"])
def test_tune_schedulers_compose(sched):
    from trainer.tuning import scheduler

    cfg = cfg_of(f"tune={sched}")
    s = scheduler(cfg.tune, cfg.tune.metric, cfg.tune.mode)
    assert type(s).__name__.lower().startswith({"asha": "async", "hyperband": "hyperband", "pbt": "populationbased"}[sched])


def test_env_config_defaults_come_from_the_env_and_typos_fail_at_compose():
    import dataclasses

    from omegaconf import OmegaConf

    from rl_envs import get_spec
    from rl_envs.trading import TradingConfig

    cfg = cfg_of("~experiment", "env=trading", "algo=ppo", "env.env_config.window_size=4")
    env_config = OmegaConf.to_container(cfg.env.env_config)
    assert env_config == {**dataclasses.asdict(TradingConfig()), "window_size": 4}
    assert OmegaConf.to_container(cfg_of("experiment=pong_ppo").env.env_config) == get_spec("pong").default_config
    with pytest.raises(ConfigCompositionException, match="env.env_config.windw_size"):
        cfg_of("~experiment", "env=trading", "algo=ppo", "env.env_config.windw_size=4")


@pytest.mark.parametrize("algo, steps", [("ppo", 0), ("appo", 500), ("impala", 500), ("dqn", 0)])
def test_an_iteration_is_bounded_in_env_steps_not_time(algo, steps):
    # RLlib's async algorithms default to >= 10 s per iteration: 5-7x a small stop.env_steps budget on CartPole.
    config = build_algo_config(cfg_of("~experiment", f"algo={algo}"))
    assert not config.min_time_s_per_iteration, config.min_time_s_per_iteration
    assert config.min_sample_timesteps_per_iteration == steps
    assert build_algo_config(cfg_of("experiment=pong_appo")).min_sample_timesteps_per_iteration == 10000
