"""The policy lifecycle end to end with the real trainer, Ray and server: train -> rl-eval -> rl-policy register ->
promote (through the gate) -> a server on `registry:...@champion` follows promote + reload with no failed request
-> rollback. Plus the train/serve parity check: `rl-eval --server` plays the same seeded episodes through the HTTP
API and must get the same per-episode returns as in-process (CartPole solved, and Pong)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from conftest import REPO, ServerProcess, metric_samples, scrape, subprocess_env
from rl_checkpoint import read_eval_records, resolve
from trainer_helpers import wait_for

pytestmark = [pytest.mark.serve, pytest.mark.slow]

BIN = Path(sys.executable).parent


def rl_eval(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rl_eval", *args], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


def rl_policy(registry: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**subprocess_env(), "RL_REGISTRY": str(registry)}
    return subprocess.run([str(BIN / "rl-policy"), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def eval_json(*args: str) -> dict:
    proc = rl_eval(*args, "--json")
    assert proc.returncode == 0, f"rl-eval {args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_gate_refuses_a_weak_policy_and_a_server_on_champion_follows_promote_and_rollback(
        serving_workdir, cartpole_checkpoint, solved_cartpole):
    registry = serving_workdir / "registry"
    registry.mkdir()

    # A 1-iteration policy: evaluated (in this process), registered, refused by the gate, then forced.
    weak = eval_json(cartpole_checkpoint, "--episodes", "10", "--workers", "0")
    assert weak["episodes"] == 10 and weak["seeds"] == list(range(10)) and weak["mode"] == "in_process"
    assert weak["ci95"][0] <= weak["mean"] <= weak["ci95"][1] and weak["mean"] < 475
    assert [r.eval_id for r in read_eval_records(resolve(cartpole_checkpoint).storage)][-1] == weak["eval_id"]
    reg = rl_policy(registry, "register", "cp", cartpole_checkpoint)
    assert reg.returncode == 0, reg.stderr
    refused = rl_policy(registry, "promote", "cp", "1")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line and "475" in line, line
    forced = rl_policy(registry, "promote", "cp", "1", "--force", "test: start from a weak policy")
    assert forced.returncode == 0, forced.stderr

    # A server on the alias serves version 1.
    ref = f"registry:{registry}/cp@champion"
    (serving_workdir / "lifecycle_server").mkdir()
    srv = ServerProcess(serving_workdir / "lifecycle_server", {"cp": ref})
    try:
        info = requests.get(srv.base + "/v1/policies/cp", timeout=10).json()
        weak_id = resolve(cartpole_checkpoint).checkpoint_id
        assert info["checkpoint_id"] == weak_id
        assert info["registry"]["version"] == 1 and info["registry"]["alias"] == "champion", info
        assert info["evaluation"]["eval_id"] == weak["eval_id"], info

        # The solved policy: evaluated on two Ray workers, registered, promoted through the gate.
        good = eval_json(solved_cartpole, "--episodes", "20", "--workers", "2")
        assert good["ci95"][0] >= 400, good
        assert rl_policy(registry, "register", "cp", solved_cartpole).returncode == 0
        # A floor of 400 (not CartPole's 475): 20 fresh seeds may still hold an episode the policy fails.
        promoted = rl_policy(registry, "promote", "cp", "2", "--min-return", "400")
        assert promoted.returncode == 0, promoted.stderr

        # promote + reload under concurrent load: no failed request, the answers switch to version 2 once.
        good_id = resolve(solved_cartpole).checkpoint_id
        seen = _hammer_during(srv, lambda: srv.reload({"cp": ref}))
        failed = [s for s in seen if s[0] != 200]
        assert not failed, f"{len(failed)} of {len(seen)} requests failed around the promotion: {failed[:5]}"
        ids = [cid for _, cid, _ in seen]
        assert ids[0] == weak_id and ids[-1] == good_id, (ids[:3], ids[-3:])
        # Per client (each sends its next request after the previous answer): once it has been answered by
        # version 2, never again by version 1. Across clients answers interleave near the switch (a request
        # sent before the reload may finish after another client's first answer from version 2).
        for client in {c for _, _, c in seen}:
            mine = [cid for _, cid, c in seen if c == client]
            if good_id in mine:
                switch = mine.index(good_id)
                assert set(mine[switch:]) == {good_id}, f"client {client}: the version flapped after the switch"
        info = requests.get(srv.base + "/v1/policies/cp", timeout=10).json()
        assert info["registry"]["version"] == 2 and info["evaluation"]["eval_id"] == good["eval_id"], info
        # The metrics say which registry version serves and how it evaluated.
        wait_for(lambda: _served_version_metrics(srv, good_id), 90,
                 "policy_info{registry_version=2} and the eval gauge",
                 interval=1, on_timeout=lambda: "\n".join(l for l in scrape(srv.metrics_url).splitlines()
                                                          if "rl_serve_policy_" in l))

        # Train/serve parity: the same seeds through the HTTP API give the same per-episode returns.
        served = eval_json(ref, "--episodes", "5", "--server", srv.base, "--policy", "cp", "--no-record")
        assert served["mode"] == "server" and served["checkpoint_id"] == good_id
        assert served["returns"] == good["returns"][:5] and served["lengths"] == good["lengths"][:5]

        # Rollback: the previous champion serves again after a reload.
        back = rl_policy(registry, "rollback", "cp")
        assert back.returncode == 0, back.stderr
        srv.reload({"cp": ref})
        info = requests.get(srv.base + "/v1/policies/cp", timeout=10).json()
        assert info["checkpoint_id"] == weak_id and info["registry"]["version"] == 1, info
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log_tail()


def _served_version_metrics(srv: ServerProcess, checkpoint_id: str) -> bool:
    text = scrape(srv.metrics_url)
    info = metric_samples(text, "ray_rl_serve_policy_info", policy="cp", checkpoint_id=checkpoint_id,
                          registry_version="2", alias="champion")
    ev = metric_samples(text, "ray_rl_serve_policy_eval_return", policy="cp", checkpoint_id=checkpoint_id,
                        stat="ci95_low")
    return bool(info) and info[0][1] == 1.0 and bool(ev) and ev[0][1] >= 400


def _hammer_during(srv: ServerProcess, action, clients: int = 4) -> list[tuple[int | str, str | None, int]]:
    """`clients` threads send CartPole observations while `action` runs; every request's (status, checkpoint_id,
    client), in the order answered, a connection error counting as a failure."""
    seen: list[tuple[int | str, str | None, int]] = []
    stop = threading.Event()
    lock = threading.Lock()

    def hammer(client: int):
        s = requests.Session()
        while not stop.is_set():
            try:
                r = s.post(srv.base + "/v1/policies/cp/act", json={"observation": [0.01, 0.0, 0.02, 0.0]}, timeout=30)
                item: tuple[int | str, str | None, int] = (r.status_code, r.json().get("checkpoint_id"), client)
            except (requests.RequestException, ValueError) as e:
                item = (f"{type(e).__name__}: {e}", None, client)
            with lock:
                seen.append(item)

    threads = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while len(seen) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        action()
        n = len(seen)
        deadline = time.monotonic() + 30
        while len(seen) < n + 20 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert len(seen) > 40, f"too little traffic to judge: {len(seen)} requests"
    return seen


def test_pong_episodes_through_the_server_equal_in_process(server, pong_checkpoint):
    """Frame-stacked: the client sends one preprocessed frame per step in a session per episode. Sequential
    (one client): concurrent episodes are batched together, and batching may flip near-tied greedy actions."""
    args = ("--episodes", "2", "--seed", "7", "--max-episode-steps", "150", "--no-record")
    local = eval_json(pong_checkpoint, *args, "--workers", "0")
    served = eval_json(pong_checkpoint, *args, "--server", server.base, "--policy", "pong", "--workers", "1")
    assert served["returns"] == local["returns"] and served["lengths"] == local["lengths"] == [150, 150]
    assert served["seeds"] == local["seeds"] == [7, 8]


@pytest.mark.parametrize("args, needle", [
    (("--episodes", "0"), "--episodes must be >= 1"),
    (("--env", "pong"), "was trained on env 'cartpole', not 'pong'"),
    (("--server", "http://127.0.0.1:9", "--policy", "default"), "does not answer"),
    (("--server", "http://127.0.0.1:9"), "--server and --policy go together"),
])
def test_rl_eval_bad_input_is_one_line_and_exit_2(cartpole_checkpoint, args, needle):
    t0 = time.monotonic()
    proc = rl_eval(cartpole_checkpoint, *args, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [proc.stderr.strip().splitlines()[-1]]
    assert time.monotonic() - t0 < 30


def test_rl_eval_missing_checkpoint_and_unknown_server_policy(server, cartpole_checkpoint, tmp_path):
    before = read_eval_records(resolve(cartpole_checkpoint).storage)
    proc = rl_eval(str(tmp_path / "nope"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = rl_eval(cartpole_checkpoint, "--server", server.base, "--policy", "nosuch")
    assert proc.returncode == 2 and "serves no policy 'nosuch'" in proc.stderr, proc.stderr
    # A server that serves another checkpoint under that name: the record would be a lie.
    proc = rl_eval(cartpole_checkpoint, "--server", server.base, "--policy", "pong", "--env", "cartpole")
    assert proc.returncode == 2 and "serves checkpoint" in proc.stderr, proc.stderr
    assert read_eval_records(resolve(cartpole_checkpoint).storage) == before, "a failed evaluation left a record"


def test_rl_eval_records_into_an_s3_checkpoint(s3_run):
    """A run on object storage: rl-eval resolves it (latest), plays, and adds its record next to the checkpoint."""
    rec = eval_json(s3_run, "--episodes", "3", "--workers", "0", "--seed", "5")
    ckpt = resolve(s3_run)
    assert rec["checkpoint_id"] == ckpt.checkpoint_id and rec["seeds"] == [5, 6, 7]
    assert rec["eval_id"] in [r.eval_id for r in read_eval_records(ckpt.storage)]
