"""SIGTERM (Kubernetes preemption, eviction, `kubectl delete`) and SIGINT stop the trainer gracefully: it saves a
checkpoint at the end of the iteration, exits 143/130 with one line saying so, and a rerun resumes from it."""

import json
import signal
import subprocess
import time

import pytest

from rl_checkpoint import Storage, checkpoint_rel, iter_name, read_state, resolve
from trainer_helpers import REPO, run_trainer, short_tmp, summary_of, trainer_cmd, trainer_env

pytestmark = pytest.mark.slow

TINY = ["algo.train_batch_size=200", "algo.minibatch_size=100", "algo.num_epochs=1", "checkpoint.every_n_iterations=0"]


def run_until_training_then_signal(output_dir, sig) -> subprocess.CompletedProcess:
    cmd = trainer_cmd(f"output_dir={output_dir}", "stop.iterations=100000", *TINY,
                      f"resources.ray_tmp_dir={short_tmp()}")
    proc = subprocess.Popen(cmd, cwd=REPO, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out = []
    deadline = time.monotonic() + 300
    for line in proc.stdout:  # the trainer flushes every line; an "iter" line means training is under way
        out.append(line)
        if "| env steps" in line or time.monotonic() > deadline:
            break
    proc.send_signal(sig)
    try:
        rest, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest, err = proc.communicate()
        raise AssertionError(f"trainer did not stop within 120 s of {sig!r}:\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(out) + rest, err)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_checkpoints_and_exits_with_the_conventional_code(sig, code, tmp_path):
    proc = run_until_training_then_signal(tmp_path, sig)
    assert proc.returncode == code, proc.stderr[-3000:]
    err = proc.stderr
    assert "logging.cc" not in err and "Traceback" not in err, err[-3000:]
    line = [l for l in err.splitlines() if l.startswith(f"trainer: stopped by {sig.name}")]
    assert len(line) == 1 and "checkpoint saved" in line[0], err[-3000:]
    state = read_state(Storage.open(str(tmp_path), create=False))
    assert state.latest_checkpoint == checkpoint_rel(iter_name(state.iteration)), state  # a periodic one, not final
    assert str(tmp_path / state.latest_checkpoint) in line[0]
    assert resolve(str(tmp_path / state.latest_checkpoint)).metadata is not None

    if sig == signal.SIGTERM:  # the RayJob's retry: the same command resumes from the checkpoint just written
        rerun = run_trainer(f"output_dir={tmp_path}", "stop.iterations=1", *TINY)
        summary = summary_of(rerun)
        assert summary["resumed_from"] == str(tmp_path / state.latest_checkpoint)
        assert summary["iterations"] == state.iteration + 1


def test_sigterm_under_tune_saves_the_experiment_and_a_rerun_resumes_it(tmp_path):
    """tune != none: SIGTERM is handed to Tune (trainer.signals), which stops its trials and saves the experiment;
    the process exits 143 with one line, no Ray stack dump; the same command then restores the experiment and the
    trial finishes from its latest checkpoint instead of starting over."""
    args = ("tune=asha", "tune.num_samples=1", "tune.grace_period=8", "tune.max_t=8", "stop.iterations=8",
            "stop.episode_return_mean=null", "checkpoint.every_n_iterations=1", "algo.train_batch_size=256",
            "algo.minibatch_size=64", "algo.num_epochs=1", f"output_dir={tmp_path}")
    cmd = trainer_cmd(*args, f"resources.ray_tmp_dir={short_tmp()}")
    proc = subprocess.Popen(cmd, cwd=REPO, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 600
        while not list((tmp_path / "tune").glob("PPO*/checkpoint_*")):  # a trial checkpoint to come back to
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "logging.cc" not in err and "Traceback" not in err, err[-3000:]
    line = [l for l in err.splitlines() if l.startswith("trainer: stopped by SIGTERM")]
    assert len(line) == 1 and f"Tune experiment state saved in {tmp_path / 'tune'}" in line[0], err[-3000:]
    done_before = len(list((tmp_path / "tune").glob("PPO*/checkpoint_*")))
    assert "summary.json" not in {p.name for p in tmp_path.iterdir()}  # the run did not finish

    rerun = run_trainer(*args)
    summary = summary_of(rerun)
    assert "resuming Tune experiment" in rerun.stdout + rerun.stderr
    assert summary["trials"] == 1 and summary["iterations"] == 8 and summary["trial_errors"] == [], summary
    # The trial went on from its checkpoint: after the restore its result log continues, never back at iteration 1.
    trial = next((tmp_path / "tune").glob("PPO*"))
    iters = [json.loads(l)["training_iteration"] for l in (trial / "result.json").read_text().splitlines() if l]
    assert done_before >= 1 and iters.count(1) == 1 and iters[-1] == 8, iters
