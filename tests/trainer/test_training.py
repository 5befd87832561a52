"""Run the real trainer on a real embedded Ray at toy sizes and check what it leaves behind."""

import csv
import json
import math

import pytest
import yaml

from rl_checkpoint import BEST, FINAL, Storage, checkpoint_rel, read_state, resolve
from trainer_helpers import run_trainer, summary_of

pytestmark = pytest.mark.slow


def test_cartpole_ppo_learns_and_writes_every_artifact(tmp_path):
    out = tmp_path / "run"
    proc = run_trainer(
        f"output_dir={out}", "stop.episode_return_mean=150", "stop.env_steps=80000", "checkpoint.every_n_iterations=5",
        timeout=900,
    )
    summary = summary_of(proc)
    assert summary["episode_return_mean"] >= 150, summary
    assert summary["stop_reason"].startswith("episode_return_mean")
    assert set(summary) >= {"checkpoint", "episode_return_mean", "env_steps", "wall_s"}
    assert json.loads((out / "summary.json").read_text()) == summary
    # Readable progress lines while it runs.
    assert "iter    1 | env steps" in proc.stdout
    # Start-up phases: one line before the first progress line, and in the summary; they add up to the time
    # before the first sample (trainer.startup).
    assert proc.stdout.index("startup: imports ") < proc.stdout.index("iter    1 | env steps")
    phases = summary["startup"]
    assert set(phases) >= {"imports", "ray_init", "build", "before_first_sample", "first_sample"}, phases
    assert all(v >= 0 for v in phases.values()), phases
    assert phases["before_first_sample"] == pytest.approx(phases["imports"] + phases["ray_init"] + phases["build"],
                                                          abs=0.05)
    assert phases["before_first_sample"] <= summary["wall_s"]

    final = out / checkpoint_rel(FINAL)
    assert summary["checkpoint"] == str(final)
    ckpt = resolve(str(final))  # raises unless the RLModule and the metadata are both there
    meta = ckpt.metadata
    assert meta.env == "cartpole" and meta.framestack == 1 and meta.iteration == summary["iterations"]
    assert resolve(str(out), BEST).metadata is not None

    rows = list(csv.DictReader((out / "progress.csv").open()))
    assert [int(r["iteration"]) for r in rows] == list(range(1, summary["iterations"] + 1))
    assert int(rows[-1]["env_steps"]) == summary["env_steps"]
    # PPO is synchronous: every batch was acted with the weights it trains (trainer/policy_lag.py; APPO's lag is
    # tests/trainer/test_policy_lag.py's).
    assert [float(r["policy_lag"]) for r in rows] == [0.0] * len(rows), [r["policy_lag"] for r in rows]
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["experiment"] == "cartpole_ppo" and config["stop"]["episode_return_mean"] == 150

    # The saved RLModule acts: greedy CartPole actions from the checkpoint alone (what serving relies on).
    import numpy as np
    import torch
    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(str(ckpt.local_module_dir()[0]))
    obs = torch.tensor(np.zeros((3, 4), np.float32))
    logits = module.forward_inference({"obs": obs})["action_dist_inputs"]
    assert tuple(logits.shape) == (3, 2) and torch.isfinite(logits).all()


def test_greedy_evaluation_ranks_checkpoints_best(tmp_path):
    """evaluation.interval=2: every 2nd iteration evaluates the greedy policy; checkpoints/best is the iteration
    with the best eval return (not the training return), also between periodic checkpoints."""
    out = tmp_path / "run"
    proc = run_trainer(f"output_dir={out}", "evaluation.interval=2", "evaluation.episodes=4", "stop.iterations=8",
                       "checkpoint.every_n_iterations=3", timeout=600)
    summary = summary_of(proc)
    rows = list(csv.DictReader((out / "progress.csv").open()))
    evals = {int(r["iteration"]): float(r["eval_return_mean"]) for r in rows if r["eval_return_mean"]}
    assert sorted(evals) == [2, 4, 6, 8], rows
    assert all(int(r["eval_episodes"]) == 4 for r in rows if r["eval_return_mean"])
    assert all(r["eval_episodes"] == "" for r in rows if not r["eval_return_mean"])
    assert summary["eval_return_mean"] == pytest.approx(evals[8], abs=1e-3)
    assert f"eval {evals[2]:8.2f} (4 ep)" in proc.stdout  # the progress line of an evaluated iteration
    # Best: the latest iteration with the highest eval return; state.json and the checkpoint's metadata agree.
    top = max(evals.values())
    best_iter = max(i for i, v in evals.items() if v == top)
    state = read_state(Storage.open(str(out), create=False))
    assert state.best["judged_by"] == "eval_return_mean" and state.best["iteration"] == best_iter, (state.best, evals)
    assert state.eval_return_mean == pytest.approx(evals[8])
    assert summary["best_eval_return_mean"] == pytest.approx(top, abs=1e-3)
    meta = resolve(str(out), BEST).metadata
    assert meta.iteration == best_iter and meta.eval_return_mean == pytest.approx(top)
    assert meta.episode_return_mean == pytest.approx(float(rows[best_iter - 1]["episode_return_mean"]))


def test_stop_on_the_greedy_evaluation_return(tmp_path):
    proc = run_trainer(f"output_dir={tmp_path}", "evaluation.interval=1", "evaluation.episodes=2",
                       "stop.episode_return_mean=null", "stop.eval_return_mean=60", "stop.iterations=30", timeout=600)
    summary = summary_of(proc)
    assert summary["stop_reason"].startswith("eval_return_mean"), summary
    assert summary["eval_return_mean"] >= 60 and summary["best_eval_return_mean"] >= 60


def test_pong_ppo_smoke_one_tiny_iteration(tmp_path):
    proc = run_trainer(
        "experiment=pong_ppo", f"output_dir={tmp_path}", "stop.iterations=1",
        "algo.train_batch_size=64", "algo.minibatch_size=32", "algo.num_epochs=1", "env.num_envs_per_env_runner=1",
        timeout=600,
    )
    summary = summary_of(proc)
    assert summary["env_steps"] >= 64 and summary["iterations"] == 1
    ckpt = resolve(str(tmp_path), FINAL)
    assert ckpt.metadata.env == "pong" and ckpt.metadata.framestack == 4

    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(str(ckpt.local_module_dir()[0]))
    # Frame stacking by connectors: the module sees 4 stacked 64x64 frames.
    assert tuple(module.observation_space.shape) == (64, 64, 4)
    assert module.action_space.n == 6


def test_custom_trading_env_trains_through_config(tmp_path):
    proc = run_trainer(
        "~experiment", "env=trading", "algo=ppo", "env.env_config.symbols=[A,B,C]", "env.env_config.window_size=4",
        "algo.train_batch_size=256", "algo.minibatch_size=64", "algo.num_epochs=2", "stop.iterations=2",
        f"output_dir={tmp_path}", timeout=600,
    )
    summary = summary_of(proc)
    assert summary["experiment"] == "trading_ppo" and summary["iterations"] == 2
    assert math.isfinite(summary["episode_return_mean"] or 0.0)
    meta = resolve(str(tmp_path), FINAL).metadata
    assert meta.env == "trading" and meta.env_config["symbols"] == ["A", "B", "C"]


def test_hydra_multirun_sweeps_into_separate_output_dirs(tmp_path):
    proc = run_trainer(
        "-m", "algo.lr=0.001,0.0005", "stop.iterations=1", "algo.train_batch_size=128", "algo.minibatch_size=64",
        f"hydra.sweep.dir={tmp_path}/sweep", f"output_dir={tmp_path}/runs/${{hydra:job.override_dirname}}",
        timeout=900,
    )
    summaries = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 2, proc.stdout[-3000:]
    dirs = {s["output_dir"] for s in summaries}
    assert sorted(d.rsplit("/", 1)[-1].split(",")[0] for d in dirs) == ["algo.lr=0.0005", "algo.lr=0.001"]
    for d in dirs:
        assert json.loads((tmp_path / "runs" / d.rsplit("/", 1)[-1] / "summary.json").read_text())["iterations"] == 1
