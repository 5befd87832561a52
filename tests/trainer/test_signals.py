"""SIGTERM (Kubernetes preemption, eviction, `kubectl delete`) and SIGINT stop the trainer gracefully: it saves a
checkpoint at the end of the iteration, exits 143/130 with one line saying so, and a rerun resumes from it."""

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
