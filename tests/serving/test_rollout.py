"""Progressive delivery end to end: `rl-rollout` drives a real `python -m serving` (its --config file is the desired
state) while client threads play whole CartPole episodes through the API and post their returns as feedback.

- a good candidate (solved) over a weak champion goes 5 -> 25 -> 50 -> 100% and is promoted, surviving a
  controller killed mid-rollout (`rl-rollout resume` continues from the state in the config);
- a sabotaged candidate (an untrained, random-acting module) over the solved champion is rolled back on returns
  without ever leaving its first step;
- a candidate whose forward pass raises is rolled back on its error ratio, and a slow one on its p99.
In all of them: zero failed client requests, and no session is answered by two checkpoints.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from conftest import REPO, ServerProcess, subprocess_env
from episode_clients import EpisodeClients
from faulty_modules import RaisingPPOModule, SlowPPOModule, faulty_checkpoint
from rl_checkpoint import resolve
from trainer_helpers import wait_for

pytestmark = [pytest.mark.serve, pytest.mark.slow]

BIN = Path(sys.executable).parent
INTERVAL_S = 3
# CartPole episodes are capped at 100 steps: a solved policy's episode is 100 requests, a random one's ~20.
MAX_STEPS = 100


@pytest.fixture(scope="module")
def srv(serving_workdir, cartpole_checkpoint):
    (serving_workdir / "rollout_server").mkdir()
    s = ServerProcess(serving_workdir / "rollout_server", {"cp": cartpole_checkpoint})
    yield s
    rc = s.stop()
    assert rc == 0, s.log_tail()


def _champion(srv: ServerProcess) -> dict:
    return yaml.safe_load(srv.config_path.read_text())["applications"][0]["deployments"][0]["user_config"][
        "policies"]["cp"]


def _set_champion(srv: ServerProcess, checkpoint: str) -> None:
    srv.reload({"cp": checkpoint})
    want = resolve(checkpoint).checkpoint_id
    wait_for(lambda: requests.get(f"{srv.base}/v1/policies/cp", timeout=10).json().get("checkpoint_id") == want,
             60, f"the server to serve {want}")


def _rollout(srv: ServerProcess, *args: str) -> list[str]:
    return [str(BIN / "rl-rollout"), *args, "--config", str(srv.config_path), "--server", srv.base]


def _run(srv: ServerProcess, *args: str, timeout: float = 420) -> tuple[int, dict, str]:
    proc = subprocess.run(_rollout(srv, *args, "--json"), cwd=REPO, env=subprocess_env(), capture_output=True,
                          text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    record = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return proc.returncode, record, proc.stdout + proc.stderr


def _assert_clean(clients: EpisodeClients) -> None:
    assert not clients.failures, f"{len(clients.failures)} failed client requests: {clients.failures[:5]}"
    mixed = clients.mixed_sessions()
    assert not mixed, f"{len(mixed)} sessions answered by two checkpoints: {mixed[:3]}"


def _events(record: dict) -> list[str]:
    return [h["event"] for h in record.get("history", [])]


def test_good_candidate_is_promoted_step_by_step_and_survives_a_controller_restart(
        srv, cartpole_checkpoint, solved_cartpole):
    _set_champion(srv, cartpole_checkpoint)
    weak_id, good_id = resolve(cartpole_checkpoint).checkpoint_id, resolve(solved_cartpole).checkpoint_id
    with EpisodeClients(srv.base, "cp", clients=6, max_steps=MAX_STEPS) as clients:
        ctl = subprocess.Popen(_rollout(srv, "start", "cp", solved_cartpole, "--steps", "5,25,50,100",
                                        "--interval", str(INTERVAL_S), "--min-episodes", "5",
                                        "--drain-timeout", "60"),
                               cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        try:
            # Kill the controller once the desired state in the config has moved past the first step.
            wait_for(lambda: ctl.poll() is not None or
                     (_champion(srv).get("candidate") or {}).get("rollout", {}).get("step", 0) >= 1,
                     240, "the rollout to reach its second step")
            assert ctl.poll() is None, f"the controller ended early:\n{ctl.stdout.read()}"
            ctl.send_signal(signal.SIGKILL)
            ctl.wait(timeout=30)
        finally:
            if ctl.poll() is None:
                ctl.kill()
        cand = _champion(srv)["candidate"]
        assert cand["rollout"]["status"] == "running" and cand["weight"] == 0.25, cand
        code, record, out = _run(srv, "resume", "cp")
    assert code == 0, out
    assert record["status"] == "promoted", record
    assert _events(record)[0] == "start" and "resume" in _events(record), _events(record)
    weights = [h["weight"] for h in record["history"] if h["event"] in ("start", "advance")]
    assert weights == [0.05, 0.25, 0.5, 1.0], record["history"]
    spec = _champion(srv)
    assert spec["checkpoint"] == solved_cartpole and "candidate" not in spec, spec
    info = requests.get(f"{srv.base}/v1/policies/cp", timeout=10).json()
    assert info["checkpoint_id"] == good_id and not info.get("candidate"), info
    _assert_clean(clients)
    returns = clients.returns_by_checkpoint()
    assert len(returns.get(good_id, [])) >= 5 and len(returns.get(weak_id, [])) >= 5, {k: len(v) for k, v in returns.items()}
    assert min(returns[good_id]) > sum(returns[weak_id]) / len(returns[weak_id]), returns


def test_sabotaged_candidate_is_rolled_back_on_returns_at_its_first_step(srv, solved_cartpole, cartpole_v2_checkpoint):
    _set_champion(srv, solved_cartpole)
    bad_id = resolve(cartpole_v2_checkpoint).checkpoint_id
    with EpisodeClients(srv.base, "cp", clients=6, max_steps=MAX_STEPS) as clients:
        code, record, out = _run(srv, "start", "cp", cartpole_v2_checkpoint, "--interval", str(INTERVAL_S),
                                 "--min-episodes", "5", "--drain-timeout", "60")
    assert code == 3, out
    assert record["status"] == "rolled_back" and "return" in record["reason"], record
    assert "advance" not in _events(record), record["history"]
    # Judged as soon as the data sufficed: at most two verdict-less intervals after both sides had 5 episodes.
    assert record["last"]["rule"] != "hold", record["last"]
    spec = _champion(srv)
    assert spec["checkpoint"] == solved_cartpole and "candidate" not in spec, spec
    _assert_clean(clients)
    assert len(clients.returns_by_checkpoint().get(bad_id, [])) >= 5


@pytest.mark.parametrize("fault, flags, rule_word", [
    (RaisingPPOModule, ("--max-error-ratio", "0.05"), "error"),
    (SlowPPOModule, ("--max-p99-ms", "50"), "p99"),
], ids=["raising", "slow"])
def test_failing_or_slow_candidate_is_rolled_back_with_no_failed_request(srv, serving_workdir, solved_cartpole, fault,
                                                                         flags, rule_word):
    _set_champion(srv, solved_cartpole)
    bad = faulty_checkpoint(serving_workdir / f"faulty_{fault.__name__}", fault)
    with EpisodeClients(srv.base, "cp", clients=6, max_steps=MAX_STEPS) as clients:
        code, record, out = _run(srv, "start", "cp", str(bad), "--steps", "25,50,100", "--interval",
                                 str(INTERVAL_S), "--min-episodes", "5", "--min-requests", "3",
                                 "--drain-timeout", "60", *flags)
    assert code == 3, out
    assert record["status"] == "rolled_back" and rule_word in record["reason"], record
    assert "advance" not in _events(record), record["history"]
    assert _champion(srv)["checkpoint"] == solved_cartpole
    _assert_clean(clients)
