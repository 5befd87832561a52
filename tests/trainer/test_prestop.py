"""The head pod's preStop hook (`python -m trainer.prestop`, the chart's head lifecycle): deleting the head stops
the running training job gracefully through Ray's job API, so the trainer checkpoints before the pod goes.

A real `ray start --head` with token auth on, a real job submitted through Ray's job API running the trainer, as a
RayJob's submitter does; the hook runs with the head's environment, as a preStop exec does.
"""

from __future__ import annotations

import secrets
import shlex
import subprocess
import sys
import time

import pytest

from rl_checkpoint import Storage, checkpoint_rel, iter_name, read_state, resolve
from trainer_helpers import REPO, RayHead, short_tmp, trainer_env

pytestmark = pytest.mark.slow


@pytest.fixture
def head():
    env = {**trainer_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_JOB_STOP_WAIT_TIME_S": "30"}
    h = RayHead(short_tmp("rayps") + "/ray", env)
    h.env = env
    try:
        yield h
    finally:
        h.stop()


def test_prestop_stops_the_training_job_with_a_checkpoint(head, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    api = f"http://127.0.0.1:{head.dashboard_port}"
    deadline = time.monotonic() + 180
    while True:  # the dashboard's job API comes up a few seconds after the GCS
        try:
            client = JobSubmissionClient(api, headers={"Authorization": f"Bearer {head.env['RAY_AUTH_TOKEN']}"})
            client.list_jobs()
            break
        except Exception:  # noqa: BLE001 - connection refused / not ready yet
            assert head.proc.poll() is None and time.monotonic() < deadline, "Ray's job API did not come up"
            time.sleep(0.5)
    overrides = [f"output_dir={tmp_path}", "stop.iterations=100000", "stop.episode_return_mean=null",
                 "algo.train_batch_size=200", "algo.minibatch_size=100", "algo.num_epochs=1",
                 "checkpoint.every_n_iterations=0", "resources.address=auto"]
    sid = client.submit_job(entrypoint=shlex.join([sys.executable, "-m", "trainer", *overrides]),
                            runtime_env={"working_dir": None, "env_vars": {"PYTHONPATH": str(REPO)}})
    deadline = time.monotonic() + 300
    while "| env steps" not in client.get_job_logs(sid):  # training is under way, no checkpoint yet
        assert not client.get_job_status(sid).is_terminal() and time.monotonic() < deadline, \
            client.get_job_logs(sid)[-3000:]
        time.sleep(0.5)
    hook = subprocess.run([sys.executable, "-m", "trainer.prestop", "--address", api, "--timeout-s", "60"],
                          cwd=REPO, env=head.env, capture_output=True, text=True, timeout=120)
    assert hook.returncode == 0, hook.stderr
    assert f"stopping job {sid}" in hook.stderr and f"{sid}=STOPPED" in hook.stderr, hook.stderr
    assert client.get_job_status(sid) == JobStatus.STOPPED
    logs = client.get_job_logs(sid)
    assert "logging.cc" not in logs and "Traceback" not in logs, logs[-3000:]
    line = [l for l in logs.splitlines() if l.startswith("trainer: stopped by SIGTERM")]
    assert len(line) == 1 and "checkpoint saved" in line[0], logs[-3000:]
    state = read_state(Storage.open(str(tmp_path), create=False))
    assert state.latest_checkpoint == checkpoint_rel(iter_name(state.iteration))
    assert resolve(str(tmp_path / state.latest_checkpoint)).metadata is not None


def test_prestop_never_blocks_termination_when_ray_is_gone():
    hook = subprocess.run([sys.executable, "-m", "trainer.prestop", "--address", "http://127.0.0.1:9",
                           "--timeout-s", "5"], cwd=REPO, env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert hook.returncode == 0 and "could not stop jobs through http://127.0.0.1:9" in hook.stderr, hook.stderr
    assert "Traceback" not in hook.stderr
