"""A real 2-trial ASHA sweep, and kill -9 mid-run then rerun: training continues from the latest checkpoint."""

import csv
import json
import os
import signal
import subprocess
import time

import pytest

from trainer_helpers import REPO, run_trainer, short_tmp, summary_of, trainer_cmd, trainer_env

pytestmark = pytest.mark.slow


def test_asha_sweep_two_trials(tmp_path):
    proc = run_trainer(
        "tune=asha", "tune.num_samples=2", "tune.grace_period=1", "tune.max_t=3", "stop.iterations=3",
        "algo.train_batch_size=256", "algo.minibatch_size=64", "algo.num_epochs=2", "checkpoint.every_n_iterations=1",
        f"output_dir={tmp_path}", timeout=900,
    )
    summary = summary_of(proc)
    assert summary["trials"] == 2 and summary["trial_errors"] == []
    assert 1e-4 <= summary["best_config"]["lr"] <= 3e-3  # sampled from the configured loguniform space
    ckpt = summary["checkpoint"]
    assert ckpt.startswith(str(tmp_path / "tune"))
    meta = json.loads(open(os.path.join(ckpt, "rl_platform.json")).read())
    assert meta["env"] == "cartpole" and meta["iteration"] == summary["iterations"]
    assert (tmp_path / "learning_curve.png").exists() and (tmp_path / "progress.csv").exists()
    trial_dirs = [p for p in (tmp_path / "tune").iterdir() if p.is_dir() and p.name.startswith("PPO")]
    assert len(trial_dirs) == 2


def _iterations(out):
    with open(out / "progress.csv") as f:
        return [int(r["iteration"]) for r in csv.DictReader(f)]


def test_kill_and_resume_continues_without_redoing_iterations(tmp_path):
    out = tmp_path / "run"
    ray_tmp = short_tmp()
    args = [f"output_dir={out}", "checkpoint.every_n_iterations=1", "stop.episode_return_mean=null",
            "algo.train_batch_size=256", "algo.minibatch_size=64", "algo.num_epochs=2",
            f"resources.ray_tmp_dir={ray_tmp}"]
    proc = subprocess.Popen(
        trainer_cmd(*args, "stop.iterations=500"), cwd=REPO, env=trainer_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    state = out / "state.json"
    deadline = time.monotonic() + 300
    try:
        # Wait (bounded) until at least 3 iterations are checkpointed, then kill the whole process group like an OOM
        # kill of the pod would: no chance to clean up.
        while time.monotonic() < deadline:
            if state.exists():
                try:
                    if json.loads(state.read_text())["iteration"] >= 3:
                        break
                except (json.JSONDecodeError, KeyError):
                    pass
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            time.sleep(0.2)
        else:
            pytest.fail("no 3rd checkpoint within 300 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    subprocess.run(["pkill", "-9", "-f", ray_tmp], check=False)  # Ray daemons of the killed run

    killed_state = json.loads(state.read_text())
    done = killed_state["iteration"]
    assert killed_state["return_history"], "the return window is saved with each checkpoint"
    assert "final" not in os.listdir(out / "checkpoints")

    rerun = run_trainer(*args[:-1], "stop.iterations=2", timeout=600)
    summary = summary_of(rerun)
    assert summary["resumed_from"] == str(out / "checkpoints" / f"iter_{done:06d}")
    # Continues at done+1: the iterations completed before the kill are not redone, and none is skipped.
    assert summary["iterations"] == done + 2
    assert _iterations(out) == list(range(1, done + 3))
    # The last-20-episodes window carries over the resume: the first resumed iteration already averages >= 20.
    with open(out / "progress.csv") as f:
        rows = {int(r["iteration"]): r for r in csv.DictReader(f)}
    assert int(rows[done + 1]["return_window"]) >= 20
    assert f"resumed from {out}/checkpoints/iter_{done:06d} at iteration {done}" in rerun.stdout
