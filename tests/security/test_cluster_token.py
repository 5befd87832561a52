"""A cluster with token auth refuses a trainer that lacks the token: one line saying what to set, in seconds
(Ray's own client retries an UNAUTHENTICATED GCS for minutes)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import psutil
import pytest

from trainer_helpers import REPO, free_port, short_tmp, trainer_cmd, trainer_env, wait_for_port

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def token_cluster():
    port = free_port()
    token = secrets.token_hex(32)
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    proc = subprocess.Popen([ray, "start", "--head", "--block", f"--port={port}", f"--temp-dir={short_tmp('rltok')}",
                             "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc, 120, "ray start --head")
        yield f"127.0.0.1:{port}", token
    finally:
        tree = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        proc.terminate()
        proc.wait(timeout=60)
        for p in tree:  # whatever `ray start` left behind (only its own children)
            try:
                p.kill()
            except psutil.Error:
                pass


def run(address: str, tmp_path, **auth_env: str) -> subprocess.CompletedProcess:
    env = trainer_env()
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(k, None)
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token of the machine's user
    env.update(auth_env)
    return subprocess.run(trainer_cmd("resources=cluster", f"resources.address={address}", f"output_dir={tmp_path}"),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("auth_env, needle", [
    ({}, "requires token authentication"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, "rejected this process's token"),
])
def test_trainer_without_the_clusters_token_fails_with_one_line(token_cluster, tmp_path, auth_env, needle):
    address, _ = token_cluster
    proc = run(address, tmp_path, **auth_env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    err = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and needle in err[0], proc.stderr[-3000:]


def test_trainer_with_the_token_gets_in(token_cluster, tmp_path):
    """With the right token ray.init connects; the run then stops at the capacity check (this head has no pools)."""
    address, token = token_cluster
    env = trainer_env()
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, HOME=str(tmp_path))
    proc = subprocess.run(trainer_cmd("resources=cluster", f"resources.address={address}", f"output_dir={tmp_path}",
                                      "resources.wait_for_resources_s=0"),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "ray ready" in proc.stdout and "rollout_pool" in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
