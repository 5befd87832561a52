"""Checkpoint reload through user_config -> reconfigure: the version switches, with no failed request."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import requests

from test_api import reference_actions

pytestmark = pytest.mark.serve


def _ckpt_id(path: str) -> str:
    return json.loads(open(f"{path}/rl_platform.json").read())["checkpoint_id"]


def test_reload_switches_version_without_downtime(server, cartpole_checkpoint, cartpole_v2_checkpoint):
    old_id, new_id = _ckpt_id(cartpole_checkpoint), _ckpt_id(cartpole_v2_checkpoint)
    assert old_id != new_id
    seen: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def hammer():
        s = requests.Session()
        while not stop.is_set():
            r = s.post(server.base + "/v1/policies/default/act", json={"observation": [0.01, 0.0, 0.02, 0.0]}, timeout=30)
            seen.append((r.status_code, r.json().get("checkpoint_id")))

    t = threading.Thread(target=hammer, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while len(seen) < 5 and time.monotonic() < deadline:  # traffic is flowing before the reload
            time.sleep(0.05)
        server.reload({**server.policies, "default": cartpole_v2_checkpoint})
        n_at_reload = len(seen)
        deadline = time.monotonic() + 30
        while len(seen) < n_at_reload + 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(timeout=60)
    assert seen and all(code == 200 for code, _ in seen), [s for s in seen if s[0] != 200][:5]
    ids = [cid for _, cid in seen]
    assert ids[0] == old_id and ids[-1] == new_id
    switch = ids.index(new_id)
    assert set(ids[:switch]) == {old_id} and set(ids[switch:]) == {new_id}, "version flapped during reload"

    info = requests.get(server.base + "/v1/policies/default", timeout=10).json()
    assert info["checkpoint_id"] == new_id and info["checkpoint"] == cartpole_v2_checkpoint
    obs = np.random.default_rng(11).uniform(-0.2, 0.2, size=(16, 4)).astype(np.float32)
    r = requests.post(server.base + "/v1/policies/default/act_batch", json={"observations": obs.tolist()}, timeout=30)
    assert r.json()["actions"] == reference_actions(cartpole_v2_checkpoint, obs)

    # The loaded-version gauge follows: 1 for the new checkpoint, 0 for the old one.
    deadline = time.monotonic() + 90
    want = {f'checkpoint_id="{new_id}"': " 1.0", f'checkpoint_id="{old_id}"': " 0.0"}
    lines: list[str] = []
    while time.monotonic() < deadline:
        text = requests.get(server.metrics_url, timeout=10).text
        lines = [l for l in text.splitlines() if l.startswith("ray_rl_serve_policy_info{") and 'policy="default"' in l]
        if all(any(k in l and l.endswith(v) for l in lines) for k, v in want.items()):
            break
        time.sleep(1)
    else:
        pytest.fail(f"policy_info gauge did not follow the reload: {lines}")


def test_failed_reload_keeps_serving_the_previous_checkpoint(server, serving_workdir):
    before = requests.get(server.base + "/v1/policies/default", timeout=10).json()["checkpoint_id"]
    good = dict(server.policies)
    server.write_config({**good, "default": str(serving_workdir / "no-such-checkpoint")}, check_paths=False)
    server.proc.send_signal(__import__("signal").SIGHUP)
    ev = server.wait_event("reload_failed", 60)
    assert "does not exist" in ev["error"]
    server.write_config(good)
    r = requests.post(server.base + "/v1/policies/default/act", json={"observation": [0.0, 0.0, 0.0, 0.0]}, timeout=30)
    assert r.status_code == 200 and r.json()["checkpoint_id"] == before


def test_broken_checkpoint_is_rejected_by_the_replica_and_old_one_kept(server, serving_workdir):
    """A directory that exists but holds no RLModule: the replica's reconfigure refuses it."""
    broken = serving_workdir / "broken_ckpt"
    broken.mkdir(exist_ok=True)
    (broken / "rl_platform.json").write_text('{"checkpoint_id": "broken", "module_dir": "nothing/here"}')
    before = requests.get(server.base + "/v1/policies/default", timeout=10).json()["checkpoint_id"]
    server.write_config({**server.policies, "default": str(broken)}, check_paths=False)
    server.proc.send_signal(__import__("signal").SIGHUP)
    ev = server.wait_event("reload_failed", 180)
    assert "holds no RLModule" in ev["error"], ev
    r = requests.post(server.base + "/v1/policies/default/act", json={"observation": [0.0, 0.0, 0.0, 0.0]}, timeout=30)
    assert r.status_code == 200 and r.json()["checkpoint_id"] == before
    # And a good config is accepted again afterwards.
    server.reload(server.policies)
