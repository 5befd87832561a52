"""A real 2-trial ASHA sweep, and kill -9 mid-run then rerun: training continues from the latest checkpoint."""

import csv
import os
import signal
import subprocess
import time

import pytest

from rl_checkpoint import FINAL, CheckpointError, RunState, Storage, checkpoint_rel, iter_name, read_state, resolve
from trainer.solved import WINDOW
from trainer_helpers import REPO, run_trainer, short_tmp, summary_of, trainer_cmd, trainer_env

pytestmark = pytest.mark.slow


def test_asha_sweep_two_trials(tmp_path):
    proc = run_trainer(
        "tune=asha", "tune.num_samples=2", "tune.grace_period=1", "tune.max_t=3", "stop.iterations=3",
        "algo.train_batch_size=256", "algo.minibatch_size=64", "algo.num_epochs=2", "checkpoint.every_n_iterations=1",
        "evaluation.interval=1", "evaluation.episodes=2", f"output_dir={tmp_path}", timeout=900,
    )
    summary = summary_of(proc)
    assert summary["trials"] == 2 and summary["trial_errors"] == []
    # With evaluation on, the best trial and checkpoint are judged by the greedy eval return, as in the plain loop.
    assert summary["best_judged_by"] == "eval_return_mean"
    best = resolve(summary["best_checkpoint"]).metadata
    assert best.eval_return_mean == pytest.approx(summary["best_eval_return_mean"])
    assert summary["best_eval_return_mean"] >= summary["eval_return_mean"] - 1e-3
    assert 1e-4 <= summary["best_config"]["lr"] <= 3e-3  # sampled from the configured loguniform space
    ckpt = summary["checkpoint"]
    assert ckpt.startswith(str(tmp_path / "tune"))
    meta = resolve(ckpt).metadata
    assert meta.env == "cartpole" and meta.iteration == summary["iterations"]
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
            "evaluation.interval=2", "evaluation.episodes=2", f"resources.ray_tmp_dir={ray_tmp}"]
    proc = subprocess.Popen(
        trainer_cmd(*args, "stop.iterations=500"), cwd=REPO, env=trainer_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + 300
    try:
        # Wait (bounded) until at least 3 iterations are checkpointed with a full return window behind them (a fast
        # learner can end fewer than WINDOW episodes in 3 iterations), then kill the whole process group like an
        # OOM kill of the pod would: no chance to clean up.
        while time.monotonic() < deadline:
            if out.is_dir():
                try:
                    state = read_state(Storage.open(str(out), create=False)) or RunState()
                    if state.iteration >= 3 and sum(n for n, _ in state.return_history) >= WINDOW:
                        break
                except CheckpointError:  # caught mid-write
                    pass
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            time.sleep(0.2)
        else:
            pytest.fail("no 3rd checkpoint within 300 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    subprocess.run(["pkill", "-9", "-f", ray_tmp], check=False)  # Ray daemons of the killed run

    killed_state = read_state(Storage.open(str(out), create=False))
    done = killed_state.iteration
    assert killed_state.return_history, "the return window is saved with each checkpoint"
    assert not (out / checkpoint_rel(FINAL)).exists()

    rerun = run_trainer(*args[:-1], "stop.iterations=2", timeout=600)
    summary = summary_of(rerun)
    assert summary["resumed_from"] == str(out / checkpoint_rel(iter_name(done)))
    # Continues at done+1: the iterations completed before the kill are not redone, and none is skipped.
    assert summary["iterations"] == done + 2
    assert _iterations(out) == list(range(1, done + 3))
    # The last-20-episodes window carries over the resume: the first resumed iteration already averages >= 20
    # (the killed run had ended >= 20; one iteration of 256 steps alone ends fewer).
    with open(out / "progress.csv") as f:
        rows = {int(r["iteration"]): r for r in csv.DictReader(f)}
    assert int(rows[done + 1]["return_window"]) >= WINDOW
    # The eval history carries over too: the evaluations before the kill stay in progress.csv, and best is still
    # the best evaluation of the whole run (state.json kept the figure best was judged by).
    evals = {i: float(r["eval_return_mean"]) for i, r in rows.items() if r["eval_return_mean"]}
    assert sorted(evals) == list(range(2, done + 3, 2)), rows
    assert killed_state.best["judged_by"] == "eval_return_mean"
    assert summary["best_eval_return_mean"] == pytest.approx(max(evals.values()), abs=1e-3)
    assert read_state(Storage.open(str(out), create=False)).best["eval_return_mean"] == pytest.approx(max(evals.values()))
    assert f"resumed from {out / checkpoint_rel(iter_name(done))} at iteration {done}" in rerun.stdout


def test_tune_retries_a_killed_trial_from_its_checkpoint(tmp_path):
    """tune.max_failures: the trial's process is SIGKILLed after its first checkpoint; Tune restarts the trial from
    that checkpoint and the sweep still finishes, with the failure recorded in the trial's folder."""
    import psutil

    cmd = trainer_cmd("tune=asha", "tune.num_samples=1", "tune.max_failures=1", "tune.grace_period=6", "tune.max_t=6",
                      "stop.iterations=6", "stop.episode_return_mean=null", "checkpoint.every_n_iterations=1",
                      "algo.train_batch_size=256", "algo.minibatch_size=64", "algo.num_epochs=1",
                      f"output_dir={tmp_path}", f"resources.ray_tmp_dir={short_tmp()}")
    proc = subprocess.Popen(cmd, cwd=REPO, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    killed = []
    try:
        deadline = time.monotonic() + 600
        while not killed and proc.poll() is None and time.monotonic() < deadline:
            if list((tmp_path / "tune").glob("PPO*/checkpoint_*")):  # the trial has a checkpoint to come back to
                for child in psutil.Process(proc.pid).children(recursive=True):
                    try:
                        if child.name().startswith("ray::PPO"):
                            child.kill()
                            killed.append(child.pid)
                    except psutil.Error:
                        pass
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed, f"no trial process to kill:\n{out[-3000:]}"
    assert proc.returncode == 0, out[-3000:]
    summary = summary_of(subprocess.CompletedProcess(cmd, 0, out, ""))
    assert summary["trials"] == 1 and summary["trial_errors"] == [] and summary["iterations"] == 6, summary
    trial = next((tmp_path / "tune").glob("PPO*"))
    assert (trial / "error.txt").is_file(), sorted(p.name for p in trial.iterdir())  # the failure Tune retried
