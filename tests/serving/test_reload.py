"""Checkpoint reload through user_config -> reconfigure: the version switches, with no failed request."""

from __future__ import annotations

import shutil
import signal
import threading
import time

import numpy as np
import pytest
import requests

from conftest import metric_samples, scrape
from rl_checkpoint import CheckpointMetadata, Storage, write_metadata
from test_api import checkpoint_id, reference_actions

pytestmark = pytest.mark.serve


def _ckpt_id(path: str) -> str:
    return checkpoint_id(path)


def test_reload_switches_version_without_downtime(server, cartpole_checkpoint, cartpole_v2_checkpoint):
    old_id, new_id = _ckpt_id(cartpole_checkpoint), _ckpt_id(cartpole_v2_checkpoint)
    assert old_id != new_id
    # One entry per request: (HTTP status, checkpoint_id) or (error text, None). A refused or reset connection
    # or a timeout is downtime too, so it is recorded as a failure, never skipped.
    seen: list[tuple[int | str, str | None]] = []
    attempts = [0]  # requests started; every one must end up in `seen`
    died: list[BaseException] = []  # what killed the request thread, if anything did
    stop = threading.Event()

    def hammer():
        s = requests.Session()
        try:
            while not stop.is_set():
                attempts[0] += 1
                try:
                    r = s.post(server.base + "/v1/policies/default/act",
                               json={"observation": [0.01, 0.0, 0.02, 0.0]}, timeout=30)
                    seen.append((r.status_code, r.json().get("checkpoint_id")))
                except (requests.RequestException, ValueError) as e:
                    seen.append((f"{type(e).__name__}: {e}", None))
        except BaseException as e:  # a dead thread would stop recording, and hide the failures after it
            died.append(e)

    t = threading.Thread(target=hammer, daemon=True)
    t.start()
    reload_failure: AssertionError | None = None
    n_at_reload = 0
    try:
        deadline = time.monotonic() + 30
        while len(seen) < 5 and time.monotonic() < deadline and t.is_alive():  # traffic flows before the reload
            time.sleep(0.05)
        try:
            server.reload({**server.policies, "default": cartpole_v2_checkpoint})
        except AssertionError as e:  # reported after what the clients saw meanwhile
            reload_failure = e
        n_at_reload = len(seen)
        deadline = time.monotonic() + 30
        while len(seen) < n_at_reload + 5 and time.monotonic() < deadline and t.is_alive():
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(timeout=60)
    assert not t.is_alive(), "the request thread hung"
    assert not died, f"the request thread died after {len(seen)} requests: {died[0]!r}"
    assert len(seen) == attempts[0], \
        f"{attempts[0] - len(seen)} of {attempts[0]} requests were neither answered nor recorded as a failure"
    failed = [s for s in seen if s[0] != 200]
    assert not failed, f"{len(failed)} of {len(seen)} requests failed around the reload: {failed[:5]}"
    assert reload_failure is None, f"the reload failed: {reload_failure}"
    assert len(seen) >= n_at_reload + 5, f"requests stopped during the reload: {seen[-5:]}"
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
    write_metadata(Storage.open(str(broken)), CheckpointMetadata(checkpoint_id="broken", module_dir="nothing/here"))
    before = requests.get(server.base + "/v1/policies/default", timeout=10).json()["checkpoint_id"]
    server.write_config({**server.policies, "default": str(broken)}, check_paths=False)
    server.proc.send_signal(__import__("signal").SIGHUP)
    ev = server.wait_event("reload_failed", 180)
    assert "holds no RLModule" in ev["error"], ev
    r = requests.post(server.base + "/v1/policies/default/act", json={"observation": [0.0, 0.0, 0.0, 0.0]}, timeout=30)
    assert r.status_code == 200 and r.json()["checkpoint_id"] == before
    # And a good config is accepted again afterwards.
    server.reload(server.policies)


def test_checkpoint_that_passes_the_layout_check_but_cannot_load_is_reported(server, serving_workdir,
                                                                            cartpole_v2_checkpoint):
    """The launcher's layout check passes (files are where they belong), the replica's RLModule load fails:
    the old policy keeps serving and the failure shows in reload_error, /readyz errors and reloads_total."""
    good = dict(server.policies)
    before = requests.get(server.base + "/v1/policies/default", timeout=10).json()["checkpoint_id"]
    errors_before = sum(v for _, v in metric_samples(scrape(server.metrics_url), "ray_rl_serve_policy_reloads_total",
                                                     policy="default", result="error"))
    corrupt = serving_workdir / "corrupt_ckpt"
    shutil.copytree(cartpole_v2_checkpoint, corrupt, dirs_exist_ok=True)
    (corrupt / "module_state.pkl").write_bytes(b"not a pickle")  # the weights, truncated by a bad copy
    server.write_config({**good, "default": str(corrupt)})  # check_paths: the launcher's layout check passes
    server.proc.send_signal(signal.SIGHUP)
    ev = server.wait_event("reload_failed", 180)
    assert "kept the previous checkpoint" in ev["error"] and "cannot load RLModule" in ev["error"], \
        f"the launcher did not learn from the replica that the load failed: {ev}"

    info = requests.get(server.base + "/v1/policies/default", timeout=10).json()
    assert info["checkpoint_id"] == before, info
    err = info.get("reload_error") or {}
    assert err.get("checkpoint") == str(corrupt) and "cannot load RLModule" in err.get("error", ""), \
        f"GET /v1/policies/default does not report the failed load in reload_error: {info}"
    r = requests.get(server.base + "/readyz", timeout=10)
    assert r.status_code == 200, r.text  # still ready: the previous policy serves
    assert "cannot load RLModule" in r.json().get("errors", {}).get("default", ""), \
        f"/readyz does not list the failed load under errors: {r.text}"
    r = requests.post(server.base + "/v1/policies/default/act", json={"observation": [0.0, 0.0, 0.0, 0.0]}, timeout=30)
    assert r.status_code == 200 and r.json()["checkpoint_id"] == before
    deadline, errors = time.monotonic() + 90, errors_before
    while time.monotonic() < deadline:
        errors = sum(v for _, v in metric_samples(scrape(server.metrics_url), "ray_rl_serve_policy_reloads_total",
                                                  policy="default", result="error"))
        if errors > errors_before:
            break
        time.sleep(1)
    assert errors > errors_before, "ray_rl_serve_policy_reloads_total{result=\"error\"} did not count the failed load"

    server.reload(good)  # a good config clears the error
    r = requests.get(server.base + "/readyz", timeout=10)
    assert r.status_code == 200 and "errors" not in r.json(), r.text


def test_new_policy_whose_checkpoint_cannot_load_leaves_the_others_serving(server, serving_workdir,
                                                                          cartpole_v2_checkpoint):
    """A reload that adds a policy whose checkpoint passes the layout check but cannot load: the replica keeps
    serving the others (no restart, no failed request), the new name answers 503 load_failed with the load error, /readyz
    lists it, and the launcher reports the failure."""
    good = dict(server.policies)
    corrupt = serving_workdir / "corrupt_new_policy"
    shutil.copytree(cartpole_v2_checkpoint, corrupt, dirs_exist_ok=True)
    (corrupt / "module_state.pkl").write_bytes(b"not a pickle")
    seen: list[int | str] = []
    stop = threading.Event()

    def hammer():
        s = requests.Session()
        while not stop.is_set():
            try:
                seen.append(s.post(server.base + "/v1/policies/default/act",
                                   json={"observation": [0.0, 0.0, 0.0, 0.0]}, timeout=30).status_code)
            except requests.RequestException as e:  # a refused/reset connection: the replica went down
                seen.append(f"{type(e).__name__}: {e}")

    t = threading.Thread(target=hammer, daemon=True)
    t.start()
    try:
        server.write_config({**good, "extra": str(corrupt)})  # check_paths: the launcher's layout check passes
        server.proc.send_signal(signal.SIGHUP)
        ev = server.wait_event("reload_failed", 180)
        n_at_event = len(seen)
        deadline = time.monotonic() + 30
        while len(seen) < n_at_event + 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(timeout=60)
    failed = [s for s in seen if s != 200]
    assert not failed, f"{len(failed)} of {len(seen)} requests to the other policy failed: {failed[:5]}"
    assert len(seen) >= n_at_event + 5, f"requests stopped: {seen[-5:]}"
    assert "extra" in ev["error"] and "cannot load RLModule" in ev["error"], \
        f"the launcher did not report the policy that failed to load: {ev}"

    r = requests.get(server.base + "/v1/policies/extra", timeout=10)
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "load_failed" and "cannot load RLModule" in err["message"], err
    assert err["detail"]["reload_error"]["checkpoint"] == str(corrupt), err
    r = requests.get(server.base + "/readyz", timeout=10)
    assert r.status_code == 200, r.text  # the configured policies that load keep the replica ready
    assert "cannot load RLModule" in r.json().get("errors", {}).get("extra", ""), r.text

    server.reload(good)  # dropping it clears the error
    r = requests.get(server.base + "/readyz", timeout=10)
    assert r.status_code == 200 and "errors" not in r.json(), r.text
    assert "detail" not in requests.get(server.base + "/v1/policies/extra", timeout=10).json()["error"]
