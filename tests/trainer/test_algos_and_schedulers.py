"""Every algorithm, the Pong APPO preset and every Tune scheduler the README lists, each at toy size through the
real entry point to a finished run with a checkpoint that loads; plus checkpoint pruning and the wall-clock stop."""

import pytest

from rl_checkpoint import iter_name, resolve
from trainer_helpers import run_trainer, summary_of

pytestmark = pytest.mark.slow

TINY = ["algo.train_batch_size=64", "env.num_envs_per_env_runner=1"]

RUNS = {
    # (overrides, env, framestack). APPO x HyperBand and IMPALA x PBT share a run each: one Tune trial.
    "appo-hyperband": (["~experiment", "algo=appo", "tune=hyperband", "tune.num_samples=1", "stop.iterations=1", *TINY],
                       "cartpole", 1),
    "impala-pbt": (["~experiment", "algo=impala", "tune=pbt", "tune.num_samples=1", "stop.iterations=1", *TINY],
                   "cartpole", 1),
    # DQN, 4 iterations, a periodic checkpoint after each but the last (that one is `final`), checkpoint.keep=2:
    # iter 1 is pruned.
    "dqn-keep": (["~experiment", "algo=dqn", "stop.iterations=4", "checkpoint.every_n_iterations=1",
                  "checkpoint.keep=2", "algo.train_batch_size=32", "env.num_envs_per_env_runner=1"], "cartpole", 1),
    # pong_appo stopped by the wall clock alone: stop.wall_s=1 ends it after its first iteration.
    "pong_appo-wall_s": (["experiment=pong_appo", "stop.wall_s=1", "stop.episode_return_mean=null", *TINY], "pong", 4),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_toy_run_finishes_with_a_loadable_checkpoint(name, tmp_path):
    overrides, env, framestack = RUNS[name]
    proc = run_trainer(*overrides, f"output_dir={tmp_path}", timeout=600)
    summary = summary_of(proc)
    ckpt = resolve(summary["checkpoint"])
    assert ckpt.metadata.env == env and ckpt.metadata.framestack == framestack
    algo = next(o.split("=", 1)[1] for o in overrides + ["algo=appo"] if o.startswith("algo="))
    assert ckpt.metadata.algo == algo, ckpt.metadata

    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(str(ckpt.local_module_dir()[0]))
    assert module.observation_space.shape[-1] == (4 if env == "cartpole" else framestack)

    if name == "dqn-keep":
        assert summary["iterations"] == 4
        kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("iter_"))
        assert kept == [iter_name(2), iter_name(3)], kept
    if name == "pong_appo-wall_s":
        assert summary["stop_reason"].startswith("wall time"), summary
        assert summary["iterations"] == 1
    if "tune=" in " ".join(overrides):
        assert summary["trials"] == 1 and summary["trial_errors"] == [], summary
