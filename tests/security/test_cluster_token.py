"""A cluster with token auth refuses a trainer that lacks the token: one line saying what to set, in seconds
(Ray's own client retries an UNAUTHENTICATED GCS for minutes)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from trainer_helpers import REPO, RayHead, short_tmp, trainer_cmd, trainer_env

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def token_cluster():
    token = secrets.token_hex(32)
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    # Every port from the tests' own blocks (RayHead), none of Ray's defaults: a cold make test saw this head stop
    # right after its GCS answered (`ray start --block` stops the whole head when one of its processes exits, e.g. an
    # agent that found its default port taken by another suite's Ray), and every test then read "Connection refused".
    work = Path(short_tmp("rltok"))
    head = RayHead(str(work / "ray"), env, num_cpus=1)
    try:
        head.wait_metrics("ray_", 120)
        yield head, token
    finally:
        head.stop()
        shutil.rmtree(work, ignore_errors=True)


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
    head, _ = token_cluster
    proc = run(head.address, tmp_path, **auth_env)
    head.assert_alive()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    err = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and needle in err[0], proc.stderr[-3000:]


def test_trainer_with_the_token_gets_in(token_cluster, tmp_path):
    """With the right token ray.init connects; the run then stops at the capacity check (this head has no pools)."""
    head, token = token_cluster
    env = trainer_env()
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, HOME=str(tmp_path))
    proc = subprocess.run(trainer_cmd("resources=cluster", f"resources.address={head.address}",
                                      f"output_dir={tmp_path}", "resources.wait_for_resources_s=0"),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    head.assert_alive()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "ray ready" in proc.stdout and "rollout_pool" in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
