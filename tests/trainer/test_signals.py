"""SIGTERM (Kubernetes preemption, eviction, `kubectl delete`) and SIGINT stop the trainer gracefully: it saves a
checkpoint at the end of the iteration, exits 143/130 with one line saying so, and a rerun resumes from it. An
iteration that cannot finish within `fault_tolerance.stop_grace_s` is cut short at that bound (trainer/signals.py)."""

import csv
import json
import signal
import subprocess
import sys
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

    # The same command resumes from the checkpoint just written (a RayJob's retry after SIGTERM, a user's rerun
    # after Ctrl-C): the iteration count goes on from it.
    rerun = run_trainer(f"output_dir={tmp_path}", "stop.iterations=1", *TINY)
    summary = summary_of(rerun)
    assert summary["resumed_from"] == str(tmp_path / state.latest_checkpoint), summary
    assert summary["iterations"] == state.iteration + 1, \
        f"{summary['iterations']} iterations after resuming from iteration {state.iteration}: {summary}"


# An iteration of this size takes 8-16 s here (asserted below to outlast the bound: `iteration_s`), so the stop
# cannot complete within GRACE_S and the watchdog must end it.
SLOW = ["algo.train_batch_size=40000", "algo.minibatch_size=4000", "algo.num_epochs=1",
        "checkpoint.every_n_iterations=1"]
GRACE_S = 1.0
# Signal to exit, measured 1.07 s on this machine (2 shared cores); the bound leaves room for a loaded machine. A
# correctness bound (a stop that waits for the iteration to end takes the iteration's seconds), not a speed target.
EXIT_BOUND_S = GRACE_S + 3


# The trainer with SIGTERM delivered to itself at one exact point: inside the first iteration's best-checkpoint
# judgement, i.e. after the loop decided that iteration takes no checkpoint and before it checks for a stop.
SIGNAL_IN_THE_WINDOW = """
import importlib.abc, importlib.util, os, runpy, signal, sys

def patch(loop):  # trainer.loop imports Ray, which must come after the trainer's own set-up: patched on import
    judge = loop.BestJudge.__call__
    def sigterm_then_judge(self, *a, **kw):
        if not getattr(loop, "_signalled", False):
            loop._signalled = True
            os.kill(os.getpid(), signal.SIGTERM)
        return judge(self, *a, **kw)
    loop.BestJudge.__call__ = sigterm_then_judge

class OnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "trainer.loop":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            patch(module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, OnImport())
sys.argv = ["trainer", *sys.argv[1:]]
runpy.run_module("trainer", run_name="__main__", alter_sys=True)
"""


def test_a_signal_between_the_checkpoint_decision_and_the_stop_check_still_stops_with_a_checkpoint(tmp_path):
    """Seen once in CI (the preStop hook's SIGTERM): the signal landed after the iteration was judged to need no
    checkpoint, the stop check then saw it, and the trainer died with UnboundLocalError instead of exit 143. The stop
    request is read once per iteration now: this one is acted on after the next iteration, with its checkpoint."""
    proc = subprocess.run([sys.executable, "-c", SIGNAL_IN_THE_WINDOW, f"output_dir={tmp_path}",
                           "stop.iterations=100000", "stop.episode_return_mean=null", *TINY,
                           f"resources.ray_tmp_dir={short_tmp()}"],
                          cwd=REPO, env=trainer_env(), capture_output=True, text=True, timeout=300)
    err = proc.stderr
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "UnboundLocalError" not in err, err[-3000:]
    line = [l for l in err.splitlines() if l.startswith("trainer: stopped by SIGTERM")]
    assert len(line) == 1 and "checkpoint saved" in line[0], err[-3000:]
    state = read_state(Storage.open(str(tmp_path), create=False))
    assert state.iteration == 2 and state.latest_checkpoint == checkpoint_rel(iter_name(2)), state


def test_stop_grace_s_bounds_a_stop_whose_iteration_cannot_finish(tmp_path):
    """trainer/signals.py: if the iteration and the save do not finish within stop_grace_s the process exits at that
    bound with the signal's code, one line naming the checkpoint a rerun resumes from, and no new checkpoint."""
    cmd = trainer_cmd(f"output_dir={tmp_path}", "stop.iterations=100000", "stop.episode_return_mean=null", *SLOW,
                      f"fault_tolerance.stop_grace_s={GRACE_S}", f"resources.ray_tmp_dir={short_tmp()}")
    with open(tmp_path / "out.log", "w") as out, open(tmp_path / "err.log", "w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env=trainer_env(), stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "state.json").exists() or read_state(Storage.open(str(tmp_path), create=False)) \
                .latest_checkpoint is None:  # iteration 1's checkpoint committed: iteration 2 has just begun
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err.log").read_text()[-3000:]
            time.sleep(0.05)
        before = read_state(Storage.open(str(tmp_path), create=False))
        t_signal = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
        took = time.monotonic() - t_signal
    finally:
        if proc.poll() is None:
            proc.kill()
    err = (tmp_path / "err.log").read_text()
    assert code == 130, f"exit {code}:\n{err[-3000:]}"
    assert GRACE_S * 0.9 <= took <= EXIT_BOUND_S, f"stopped {took:.1f}s after SIGINT, grace {GRACE_S}s:\n{err[-2000:]}"
    # The premise: an iteration here takes longer than the grace (progress.csv, flushed with iteration 1's checkpoint).
    iteration_s = float(next(csv.DictReader((tmp_path / "progress.csv").open()))["iter_s"])
    assert iteration_s > EXIT_BOUND_S, f"iteration 1 took {iteration_s}s: too short to tell a cut stop from a whole one"
    assert "Traceback" not in err and "logging.cc" not in err, err[-3000:]
    lines = [l for l in err.splitlines() if l.startswith("error: stopped by SIGINT")]
    assert lines == [f"error: stopped by SIGINT (not done within {GRACE_S:g}s) without a new checkpoint: a rerun "
                     f"resumes from {tmp_path / before.latest_checkpoint}"], err[-3000:]
    after = read_state(Storage.open(str(tmp_path), create=False))
    assert (after.iteration, after.latest_checkpoint) == (before.iteration, before.latest_checkpoint) == \
        (1, checkpoint_rel(iter_name(1))), (before, after)
    assert not (tmp_path / checkpoint_rel(iter_name(2))).exists()
    print(f"stopped {took:.2f}s after SIGINT (grace {GRACE_S:g}s); iteration 1 took {iteration_s:.1f}s")


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
