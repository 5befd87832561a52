"""rl-rollout's bad input through the installed console script (no Ray, no server): each is exit 2 with one line
`error: ...` naming the problem, and nothing is written to the config. The checks that need the policy server
(a missing candidate, a bad registry reference, the champion itself) run against the real one in
tests/serving/test_rollout.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rl_checkpoint import CheckpointMetadata, Storage, write_metadata
from rl_checkpoint.checkpoint import _MODULE_MARKER

BIN = Path(sys.executable).parent


def rollout(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rl-rollout"), *args], capture_output=True, text=True, timeout=60)


def free_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def env(tmp_path):
    for name in ("champ", "cand"):
        st = Storage.open(str(tmp_path / name))
        st.write_bytes(b"", _MODULE_MARKER)
        write_metadata(st, CheckpointMetadata(checkpoint_id=name, env="cartpole", module_dir="."))
    cfg = {"applications": [{"name": "policy", "import_path": "serving.app:build_app", "deployments": [
        {"name": "PolicyServer", "user_config": {"policies": {"cartpole": str(tmp_path / "champ")}}}]}]}
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return tmp_path, path


def one_line_error(p: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.mark.parametrize("steps,why", [("0,100", "0 is not a percent in (0, 100]"),
                                       ("5,120", "120 is not a percent"),
                                       ("50,25,100", "steps must increase (25 after 50)"),
                                       ("5,50", "the last step must be 100"), ("a,b", "comma-separated percents")])
def test_bad_steps(env, steps, why):
    tmp, cfg = env
    before = cfg.read_text()
    one_line_error(rollout("start", "cartpole", str(tmp / "cand"), "--config", str(cfg), "--server", free_url(),
                           "--steps", steps), 2, why)
    assert cfg.read_text() == before


@pytest.mark.parametrize("flag,value,why", [("--interval", "0", "--interval must be > 0"),
                                            ("--interval", "x", "is not a number"),
                                            ("--max-error-ratio", "1.5", "must be in [0, 1]"),
                                            ("--min-episodes", "1", "at least 2"),
                                            ("--max-p99-ms", "-1", "must be > 0"),
                                            ("--mode", "canary", "invalid choice"),
                                            ("--min-agreement", "0.9", "--mode shadow only"),
                                            ("--prom-selector", "ns=x", "--prom-selector")])
def test_bad_flags(env, flag, value, why):
    tmp, cfg = env
    one_line_error(rollout("start", "cartpole", str(tmp / "cand"), "--config", str(cfg), "--server", free_url(),
                           flag, value), 2, why)


def test_unknown_policy(env):
    tmp, cfg = env
    one_line_error(rollout("start", "nope", str(tmp / "cand"), "--config", str(cfg), "--server", free_url()), 2,
                   "unknown policy 'nope'", "cartpole")
    one_line_error(rollout("status", "nope", "--config", str(cfg)), 2, "unknown policy 'nope'")


def test_server_unreachable_at_start(env):
    tmp, cfg = env
    url = free_url()
    one_line_error(rollout("start", "cartpole", str(tmp / "cand"), "--config", str(cfg), "--server", url), 2,
                   f"the server at {url} is unreachable: connection refused")


def test_targets(env):
    tmp, cfg = env
    one_line_error(rollout("start", "cartpole", str(tmp / "cand")), 2, "give one target")
    one_line_error(rollout("start", "cartpole", str(tmp / "cand"), "--config", str(cfg)), 2, "--config needs --server")
    one_line_error(rollout("start", "cartpole", str(tmp / "cand"), "--config", str(cfg), "--rayservice", "x",
                           "--server", free_url()), 2, "give one target")
    one_line_error(rollout("status", "cartpole", "--config", str(tmp / "missing.yaml")), 2, "no such file")
    one_line_error(rollout("status", "cartpole", "--rayservice", "rl", "--kubeconfig", str(tmp / "none")), 2,
                   "no kubeconfig")


def test_a_running_rollout_is_named_and_status_reads_it_from_the_config_alone(env):
    tmp, cfg = env
    raw = yaml.safe_load(cfg.read_text())
    raw["applications"][0]["deployments"][0]["user_config"]["policies"]["cartpole"] = {
        "checkpoint": str(tmp / "champ"),
        "candidate": {"checkpoint": str(tmp / "cand"), "weight": 0.25, "mode": "split", "rollout": {
            "id": "r-7", "policy": "cartpole", "candidate": str(tmp / "cand"), "champion": str(tmp / "champ"),
            "steps": [5, 25, 50, 100], "step": 1, "status": "running",
            "last": {"at": 0, "action": "hold", "rule": "episodes", "reason": "holding at 25% (1/10): 3 candidate"}}}}
    cfg.write_text(yaml.safe_dump(raw))
    one_line_error(rollout("start", "cartpole", str(tmp / "cand"), "--config", str(cfg), "--server", free_url()), 2,
                   "a rollout of cartpole is already running: r-7", "at 25%")
    s = rollout("status", "cartpole", "--config", str(cfg))
    assert s.returncode == 0 and s.stdout.startswith("cartpole: running at 25% (step 2/4, weight 0.25, split)")
    assert "no controller" in s.stdout and "holding at 25%" in s.stdout and len(s.stdout.splitlines()) == 1
    j = json.loads(rollout("status", "cartpole", "--config", str(cfg), "--json").stdout)
    assert j["rollout"]["id"] == "r-7" and j["candidate"] == {"checkpoint": str(tmp / "cand"), "weight": 0.25,
                                                              "mode": "split"}


def test_status_and_abort_without_a_rollout(env):
    tmp, cfg = env
    s = rollout("status", "cartpole", "--config", str(cfg))
    assert s.returncode == 0 and s.stdout.strip() == f"cartpole: no rollout (champion {tmp / 'champ'})"
    one_line_error(rollout("abort", "cartpole", "--config", str(cfg)), 2, "no rollout of cartpole to abort")
    one_line_error(rollout("resume", "cartpole", "--config", str(cfg)), 2, "no rollout of cartpole to resume")
