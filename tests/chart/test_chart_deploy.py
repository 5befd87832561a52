"""`make deploy-cluster` needs Docker and kind (users' machines); where they are missing it stops at once with a
message that says what to do, before touching anything."""

import os
import subprocess

import pytest

from chartkit import ROOT, versions

pytestmark = pytest.mark.chart


def _run(env_updates, *args):
    # CLUSTER=kind: these checks are about the kind path; never let "auto" pick (and start) another cluster.
    env = {**os.environ, "CLUSTER": "kind", **env_updates}
    return subprocess.run([str(ROOT / "hack" / "deploy-cluster.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_deploy_without_kind_says_how_to_get_it(tmp_path):
    proc = _run({"RLP_CACHE": str(tmp_path)}, "up")
    assert proc.returncode != 0
    assert "kind is not built" in proc.stderr and "make kind-tool" in proc.stderr


def test_deploy_without_a_docker_daemon_says_so_before_running_kind(tmp_path):
    kind = tmp_path / "tools" / f"kind-{versions()['KIND_VERSION']}" / "bin" / "kind"
    kind.parent.mkdir(parents=True)
    marker = tmp_path / "kind-was-called"
    kind.write_text(f"#!/bin/sh\ntouch {marker}\n")
    kind.chmod(0o755)
    # A docker client whose daemon does not answer, first on PATH.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "docker").write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    (fake_bin / "docker").chmod(0o755)
    proc = _run({"RLP_CACHE": str(tmp_path), "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"}, "up")
    assert proc.returncode != 0
    assert "the Docker daemon is not reachable" in proc.stderr
    assert not marker.exists(), "kind ran before the Docker check"


def test_deploy_script_rejects_unknown_commands(tmp_path):
    proc = _run({"RLP_CACHE": str(tmp_path)}, "sideways")
    assert proc.returncode != 0 and "usage" in proc.stderr
