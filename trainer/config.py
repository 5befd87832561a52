"""Typed schemas for the Hydra configs in `hydra_conf/`.

Each config group has a dataclass schema registered in Hydra's ConfigStore, so a misspelt key or a value of the
wrong type fails when the config is composed, naming the key, before Ray starts. Group <-> code:
  algo/       -> trainer.algo      (RLlib AlgorithmConfig.training / rl_module)
  env/        -> rl_envs           (env registry shared with serving)
  resources/  -> trainer.resources (ray.init, env runners, learners, rollout/learner pools)
  tune/       -> trainer.tuning    (Tune schedulers and search space)
  evaluation/ -> trainer.algo      (greedy evaluation episodes while training; judge checkpoints/best)
  offline     -> trainer.offline   (algo=bc|marwil: the transition log to train from)
  experiment/ -> presets that pick one of each and tune the numbers
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from rl_envs.atari import AtariConfig
from rl_envs.trading import TradingConfig


@dataclass
class ModelConf:
    # Dense layers of the MLP encoder (vector observations) / head after the conv stack (images).
    fcnet_hiddens: List[int] = field(default_factory=lambda: [256, 256])
    fcnet_activation: str = "tanh"
    # Conv stack for image observations: [[out_channels, kernel, stride], ...]; None = RLlib's default.
    conv_filters: Optional[List[List[int]]] = None
    conv_activation: str = "relu"
    head_fcnet_hiddens: List[int] = field(default_factory=list)
    vf_share_layers: bool = False


@dataclass
class AlgoConf:
    """Settings every algorithm has; the subclasses add the algorithm's own `training()` arguments."""

    name: str = MISSING
    lr: float = 3e-4
    gamma: float = 0.99
    # Env steps collected per training iteration (per learner update round).
    train_batch_size: int = 4000
    grad_clip: Optional[float] = None
    # Learner arithmetic (trainer.precision): fp32 | bf16 (autocast; CPU or GPU) | fp16 (autocast + loss scaling;
    # GPU learners only). Weights and checkpoints stay fp32 either way.
    precision: str = "fp32"
    # Env steps a training iteration samples at least: an iteration is what stop criteria, evaluation.interval and
    # checkpoint cadence count, so an env-step budget is honoured within one iteration. None = one train batch
    # (PPO, APPO, IMPALA; RLlib's async algorithms would otherwise run >= 10 s per iteration, 5-7x a small budget);
    # DQN: one sampling round per iteration.
    steps_per_iteration: Optional[int] = None
    model: ModelConf = field(default_factory=ModelConf)


@dataclass
class PPOConf(AlgoConf):
    name: str = "ppo"
    # SGD minibatch across all learners: with resources.num_learners=N each learner takes minibatch_size // N and
    # DDP averages their gradients, so N only changes speed, not the optimisation (bench/ddp_bench.py).
    minibatch_size: int = 128
    num_epochs: int = 10
    lambda_: float = 0.95
    clip_param: float = 0.2
    vf_clip_param: float = 10.0
    entropy_coeff: float = 0.0
    vf_loss_coeff: float = 1.0
    use_kl_loss: bool = False
    kl_coeff: float = 0.2


@dataclass
class APPOConf(AlgoConf):
    name: str = "appo"
    vtrace: bool = True
    clip_param: float = 0.4
    entropy_coeff: float = 0.01
    vf_loss_coeff: float = 0.5
    use_kl_loss: bool = False
    num_epochs: int = 1
    minibatch_size: Optional[int] = None
    # The learner's in-queue (RLlib's circular buffer): N train batches, each trained on up to K times, sampled
    # uniformly; the oldest is dropped when a new one arrives, so a learner slower than sampling trains on the
    # newest data rather than on a backlog.
    circular_buffer_num_batches: int = 8
    circular_buffer_iterations_per_batch: int = 2
    # Training steps between two weight broadcasts to the env runners (RLlib's; the learner also reports its
    # results every this many updates): the env runners act with weights up to this many updates old, which is
    # what the policy lag (trainer/policy_lag.py) measures.
    broadcast_interval: int = 1


@dataclass
class IMPALAConf(AlgoConf):
    name: str = "impala"
    vtrace: bool = True
    entropy_coeff: float = 0.01
    vf_loss_coeff: float = 0.5
    # As APPO's: training steps between two weight broadcasts to the env runners.
    broadcast_interval: int = 1


@dataclass
class DQNConf(AlgoConf):
    name: str = "dqn"
    double_q: bool = True
    dueling: bool = True
    n_step: int = 1
    target_network_update_freq: int = 500
    num_steps_sampled_before_learning_starts: int = 1000
    replay_capacity: int = 50000
    epsilon_initial: float = 1.0
    epsilon_final: float = 0.02
    epsilon_timesteps: int = 10000


@dataclass
class BCConf(AlgoConf):
    """Behaviour cloning from logged transitions (offline.input): maximise the log-likelihood of the logged
    actions. train_batch_size = logged transitions per SGD update."""

    name: str = "bc"


@dataclass
class MARWILConf(AlgoConf):
    """Advantage-weighted behaviour cloning from logged transitions: actions with a higher advantage weigh more
    (beta = 0 is BC). Each logged row is a one-step episode, so the advantage is the one-step TD error
    r + gamma V(s') - V(s) of a learned value function."""

    name: str = "marwil"
    beta: float = 1.0
    vf_coeff: float = 1.0
    # Start of the running mean of squared advantages that normalises them.
    moving_average_sqd_adv_norm_start: float = 100.0


@dataclass
class EnvConf:
    # A name from rl_envs.ENVS (cartpole, pong, trading).
    name: str = MISSING
    # Passed to the env creator (merged over the env's defaults), e.g. symbols/window_size for trading.
    env_config: Dict[str, Any] = field(default_factory=dict)
    # Vectorised sub-envs inside each env runner.
    num_envs_per_env_runner: int = 1
    # Env steps per env per sample call; "auto" lets RLlib derive it from the train batch size.
    rollout_fragment_length: Any = "auto"
    # How env runners step their sub-envs: gymnasium (the env's gymnasium.Env, vectorised by RLlib) or envpool
    # (Atari only: one batched C++ ALE pool per env runner, same preprocessing; rl_envs/envpool_atari.py).
    backend: str = "gymnasium"


@dataclass
class CartPoleEnvConf(EnvConf):
    name: str = "cartpole"


@dataclass
class PongEnvConf(EnvConf):
    name: str = "pong"
    env_config: AtariConfig = field(default_factory=AtariConfig)


@dataclass
class TradingEnvConf(EnvConf):
    name: str = "trading"
    env_config: TradingConfig = field(default_factory=TradingConfig)


# env/<name>.yaml picks <name>_schema: the env's typed env_config, whose defaults live in rl_envs.
ENV_SCHEMAS = {"cartpole": CartPoleEnvConf, "pong": PongEnvConf, "trading": TradingEnvConf}


@dataclass
class ResourcesConf:
    """Where things run. `local` = an embedded Ray in this process; `cluster` = an existing Ray (KubeRay)."""

    # None: start an embedded local Ray (ray.init()). "auto" or "ray://host:10001" or "host:6379": connect.
    address: Optional[str] = None
    # CPUs the embedded Ray may use (None = all cores). Ignored when connecting to a cluster.
    num_cpus: Optional[int] = None
    # 0 = sample in the driver's own env runner (fastest to start; no actors).
    num_env_runners: int = 0
    num_cpus_per_env_runner: float = 1.0
    # 0 = one local learner inside the driver process.
    num_learners: int = 0
    num_cpus_per_learner: float = 1.0
    num_gpus_per_learner: float = 0.0
    # Ray custom resources that pin env runners to the CPU rollout pool and learners to the GPU learner pool.
    # Nodes advertise them (rayStartParams.resources in the chart); None = no isolation.
    rollout_resource: Optional[str] = None
    learner_resource: Optional[str] = None
    # A cluster that cannot yet place every env runner/learner gets this long to add nodes (autoscaling) before
    # the run fails naming the missing resource; 0 = fail at once (a fixed-size cluster). Embedded Ray: never waits.
    wait_for_resources_s: float = 300.0
    # Torch intra-op threads per process (driver, env runners, learners). Oversubscribing 2 cores costs ~5x.
    torch_threads: int = 1
    # Ray's temp/session dir for the embedded Ray (None = Ray's default /tmp/ray).
    ray_tmp_dir: Optional[str] = None
    # Embedded Ray only: "token" = Ray token authentication (a per-run token; every Ray RPC/HTTP call must carry
    # it) and all Ray ports on 127.0.0.1. "disabled" turns the token off (ports stay on loopback): any local
    # process, e.g. another user's, can then run code through Ray. Clusters (address) follow their own setting.
    auth: str = "token"


@dataclass
class TuneConf:
    """A Tune experiment around the algorithm; scheduler=none runs a plain training loop instead."""

    scheduler: str = "none"  # none | asha | hyperband | pbt
    num_samples: int = 1
    max_concurrent_trials: Optional[int] = None
    # What schedulers compare trials by (every iteration): the mean return of the last 20 training episodes
    # (trainer.callbacks), or any key of RLlib's result dict. With this default and evaluation on, the best trial
    # and checkpoint are chosen by the greedy eval return (`eval_return_mean`; trainer.tuning.rank_metric).
    metric: str = "episode_return_mean_last_n"
    mode: str = "max"
    # Search space over algo keys, e.g. {"lr": {"loguniform": [1e-4, 1e-3]}, "gamma": {"choice": [0.98, 0.99]}}.
    param_space: Dict[str, Any] = field(default_factory=dict)
    # ASHA / HyperBand
    grace_period: int = 2
    reduction_factor: int = 2
    max_t: int = 100
    # PBT
    perturbation_interval: int = 4
    # Trial restarts on failure (Tune FailureConfig.max_failures); -1 = unlimited.
    max_failures: int = 0


@dataclass
class EvaluationConf:
    """Greedy evaluation while training (RLlib `AlgorithmConfig.evaluation`): every `interval` training iterations,
    `episodes` episodes with explore=False, the way the policy server acts. checkpoints/best is judged by their mean
    return; with evaluation off (interval 0) by the training return (the exploring policy's last 20 episodes)."""

    # Evaluate after every k-th training iteration; 0 = no evaluation. 10 = checkpoint.every_n_iterations, so
    # every periodic checkpoint is judged. CartPole: one evaluation ~1 s vs ~0.35 s per training iteration.
    interval: int = 10
    # Greedy episodes per evaluation, run side by side (one sub-env each); the eval return is their mean.
    episodes: int = 10
    # Dedicated eval env runner actors (on the rollout pool on a cluster, like the training ones); 0 = an env
    # runner in the driver, which evaluates between training iterations.
    num_env_runners: int = 0
    # Evaluate on the eval env runners while the training iteration runs (needs num_env_runners >= 1). RLlib then
    # scores the weights the iteration started from: best is one update newer than the weights evaluated.
    parallel_to_training: bool = False


@dataclass
class OfflineConf:
    """Where offline algorithms (algo=bc|marwil) read logged transitions: the policy server's transition log
    (Parquet rows in RLlib's offline column format, rl_eval.logs), read through Ray Data."""

    # A folder, a .parquet file or a URI (s3://bucket/prefix?endpoint_override=...); every *.parquet below it.
    # Required by offline algorithms, refused by online ones.
    input: Optional[str] = None
    # SGD updates (of algo.train_batch_size transitions each) per training iteration: an iteration is when
    # stop criteria, evaluation and checkpoints are considered (RLlib's dataset_num_iters_per_learner).
    updates_per_iteration: int = 50
    # Ray Data actors turning rows into training batches (RLlib's OfflinePreLearner), one CPU each. RLlib's
    # default (2) plus the read tasks cannot all be placed on a 2-CPU Ray, which then waits for ever.
    prelearners: int = 1


@dataclass
class StopConf:
    """Training stops at whichever comes first; None disables a criterion."""

    episode_return_mean: Optional[float] = None
    # Mean return of the latest greedy evaluation (evaluation group); needs evaluation on.
    eval_return_mean: Optional[float] = None
    # Offline (algo=bc|marwil): logged transitions trained on (algo.train_batch_size x
    # offline.updates_per_iteration per iteration; a transition drawn again counts again).
    env_steps: Optional[int] = 1_000_000
    wall_s: Optional[float] = None
    iterations: Optional[int] = None


@dataclass
class CheckpointConf:
    # Periodic checkpoint every N iterations (0 = only best and final).
    every_n_iterations: int = 10
    # Periodic checkpoints kept (best and final are kept besides).
    keep: int = 2


@dataclass
class FaultToleranceConf:
    # Restart crashed env runner actors instead of failing the run.
    restart_failed_env_runners: bool = True
    max_num_env_runner_restarts: int = 1000
    # auto: resume from the latest checkpoint in output_dir if there is one; never: start fresh (refuses a
    # non-empty output_dir); must: fail unless there is a checkpoint to resume.
    resume: str = "auto"
    # SIGTERM/SIGINT: finish the iteration, checkpoint and exit 143/130 within this many seconds, else exit without
    # a new checkpoint. Kubernetes sends SIGKILL 30 s after SIGTERM (terminationGracePeriodSeconds) by default.
    stop_grace_s: float = 25.0


@dataclass
class DebugConf:
    # Write a Chrome trace (chrome://tracing, ui.perfetto.dev) of every Ray task/actor call of the run here, via
    # ray.timeline(), just before Ray shuts down. A local path; None = no trace.
    timeline: Optional[str] = None


@dataclass
class RegistryConf:
    """Register the run's policy (trainer.register): when `root` is set, the best checkpoint (else the final one)
    is evaluated greedily (rl-eval) when the run ends and added to the policy registry as the next version.
    Promotion stays a decision: `rl-policy promote`, through the gate."""

    # A folder or s3://bucket/prefix (rl_checkpoint.registry); None = do not register.
    root: Optional[str] = None
    # The policy's name in the registry; None = the experiment's name.
    name: Optional[str] = None
    # Greedy episodes of the evaluation recorded with the version (the gate's figures).
    eval_episodes: int = 20
    # Episode i resets with seed eval_seed + i.
    eval_seed: int = 0
    # Ray worker tasks playing them (on the rollout pool when resources.rollout_resource is set); 0 = the driver.
    eval_workers: int = 2


@dataclass
class TrainConfig:
    # Name of the run (experiment presets set it); without a preset (`~experiment`) it is <env>_<algo>.
    experiment: str = "${env.name}_${algo.name}"
    algo: AlgoConf = MISSING
    env: EnvConf = MISSING
    resources: ResourcesConf = MISSING
    tune: TuneConf = MISSING
    evaluation: EvaluationConf = MISSING
    stop: StopConf = field(default_factory=StopConf)
    checkpoint: CheckpointConf = field(default_factory=CheckpointConf)
    fault_tolerance: FaultToleranceConf = field(default_factory=FaultToleranceConf)
    debug: DebugConf = field(default_factory=DebugConf)
    registry: RegistryConf = field(default_factory=RegistryConf)
    offline: OfflineConf = field(default_factory=OfflineConf)
    # A local path or a URI pyarrow understands (s3://bucket/prefix, gs://...). None = outputs/<experiment>.
    output_dir: Optional[str] = None
    seed: Optional[int] = None
    # Print a progress line every N iterations.
    log_every: int = 1


ALGO_SCHEMAS = {"ppo": PPOConf, "appo": APPOConf, "impala": IMPALAConf, "dqn": DQNConf, "bc": BCConf,
                "marwil": MARWILConf}


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for name, node in ALGO_SCHEMAS.items():
        cs.store(group="algo", name=f"{name}_schema", node=node)
    cs.store(group="env", name="env_schema", node=EnvConf)
    for name, node in ENV_SCHEMAS.items():
        cs.store(group="env", name=f"{name}_schema", node=node)
    cs.store(group="resources", name="resources_schema", node=ResourcesConf)
    cs.store(group="tune", name="tune_schema", node=TuneConf)
    cs.store(group="evaluation", name="evaluation_schema", node=EvaluationConf)
