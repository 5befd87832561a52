"""algo.precision: config checks, the RLlib hooks it sets, and what the bf16 learner really computes in."""

from __future__ import annotations

import gymnasium as gym
import pytest

from rl_checkpoint.checkpoint import POLICY_ID
import torch

from test_config import cfg_of
from trainer.algo import build_algo_config
from trainer.errors import TrainerError
from trainer.precision import AutocastLearnerMixin
from trainer.validate import validate

GPU_LEARNERS = ["resources.num_learners=1", "resources.num_gpus_per_learner=1"]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["algo.precision=fp16"], "needs GPU learners"),
        (["algo.precision=fp16", "resources.num_learners=2"], "needs GPU learners"),
        (["algo.precision=fp16", *GPU_LEARNERS, "algo.grad_clip=0.5"], "algo.grad_clip=null"),
        (["algo.precision=half"], "one of fp32, bf16, fp16"),
    ],
)
def test_bad_precision_is_one_config_error(overrides, needle):
    with pytest.raises(TrainerError, match=needle):
        validate(cfg_of(*overrides))


def test_fp32_is_the_default_and_leaves_rllib_alone():
    cfg = cfg_of()
    assert cfg.algo.precision == "fp32"
    config = build_algo_config(cfg)
    assert not issubclass(config.learner_class, AutocastLearnerMixin)
    assert config._torch_grad_scaler_class is None


def test_fp16_on_gpu_learners_uses_rllibs_loss_scaler():
    cfg = cfg_of("algo.precision=fp16", *GPU_LEARNERS)
    validate(cfg)
    config = build_algo_config(cfg)
    assert issubclass(config.learner_class, AutocastLearnerMixin) and config.learner_class.autocast_dtype == "float16"
    scaler = config._torch_grad_scaler_class
    assert scaler.func is torch.amp.GradScaler and scaler.args == ("cuda",)


def test_bf16_learner_runs_the_network_in_bf16_and_keeps_fp32_weights():
    env = gym.make("CartPole-v1")
    config = build_algo_config(cfg_of("algo.precision=bf16")).environment(
        observation_space=env.observation_space, action_space=env.action_space
    )
    learner = config.build_learner(env=None)
    assert isinstance(learner, AutocastLearnerMixin)
    module = learner.module[POLICY_ID]
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    batch = {"obs": torch.zeros((3, 4))}
    with learner._autocast():
        out = module.forward_train(batch)
    assert out["action_dist_inputs"].dtype == torch.bfloat16
    # Outside the learner's update the same module is plain fp32 (what env runners and the server run).
    assert module.forward_train(batch)["action_dist_inputs"].dtype == torch.float32


def test_minibatch_size_is_global_across_ddp_learners():
    one = build_algo_config(cfg_of())
    two = build_algo_config(cfg_of("resources.num_learners=2"))
    assert (one.minibatch_size, one.train_batch_size_per_learner) == (128, 512)
    # Each of the two learners takes half the batch and half the minibatch: same SGD steps per iteration.
    assert (two.minibatch_size, two.train_batch_size_per_learner) == (64, 256)


@pytest.mark.parametrize("algo", ["ppo", "appo", "impala", "dqn"])
def test_bf16_wraps_every_algorithms_own_learner(algo):
    config = build_algo_config(cfg_of("~experiment", f"algo={algo}", "algo.precision=bf16"))
    base = config.learner_class.__mro__[2]
    assert issubclass(config.learner_class, AutocastLearnerMixin)
    assert base.__name__.lower().startswith(algo) and base.__name__.endswith("TorchLearner"), base
