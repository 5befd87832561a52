"""trainer -> s3:// -> server: serve a checkpoint straight from the URI the trainer wrote, reload to a newer one."""

from __future__ import annotations

import signal

import numpy as np
import pytest
import requests

from rl_checkpoint import FINAL, Storage, checkpoint_rel, iter_name, resolve
from test_api import cartpole_observations, reference_actions

pytestmark = [pytest.mark.serve, pytest.mark.slow]


def _served(server) -> dict:
    return requests.get(server.base + "/v1/policies/default", timeout=10).json()


def _actions(server, obs: np.ndarray) -> list:
    r = requests.post(server.base + "/v1/policies/default/act_batch", json={"observations": obs.tolist()}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["actions"]


def _cached(server) -> list[str]:
    """Downloaded checkpoints on the replicas (one directory per replica, one copy per remote policy inside)."""
    return sorted(str(p.relative_to(server.checkpoint_cache)) for p in server.checkpoint_cache.glob("*/*"))


def test_serve_from_s3_and_reload_to_a_newer_uri(server, s3_run):
    before = dict(server.policies)
    run = Storage.open(s3_run, create=False)
    first = run.uri(checkpoint_rel(iter_name(1)))
    obs = cartpole_observations(64, seed=21)
    try:
        server.reload({**before, "default": first})
        info = _served(server)
        assert info["checkpoint"] == first and info["checkpoint_id"] == resolve(first).metadata.checkpoint_id
        assert info["iteration"] == 1
        assert _actions(server, obs) == reference_actions(first, obs)
        assert len(_cached(server)) == 1

        # The run's URI itself resolves to its latest complete checkpoint: final, iteration 2.
        server.reload({**before, "default": s3_run})
        final = resolve(s3_run)
        assert final.location == run.uri(checkpoint_rel(FINAL))
        info = _served(server)
        assert info["checkpoint"] == final.location and info["checkpoint_id"] == final.metadata.checkpoint_id
        assert info["iteration"] == 2
        assert _actions(server, obs) == reference_actions(final.location, obs)
        cached = _cached(server)
        assert len(cached) == 1 and cached[0].split("/")[1].startswith(final.metadata.checkpoint_id[:40])

        # A URI with nothing behind it: the replica refuses it, naming it, and keeps serving the final checkpoint.
        missing = run.uri("no-such-checkpoint")
        server.write_config({**before, "default": missing}, check_paths=False)
        server.proc.send_signal(signal.SIGHUP)
        ev = server.wait_event("reload_failed", 120)
        assert "does not exist" in ev["error"] and "no-such-checkpoint" in ev["error"], ev
        assert _served(server)["checkpoint_id"] == final.metadata.checkpoint_id
    finally:
        server.reload(before)
    assert _cached(server) == []  # back on local checkpoints: nothing downloaded is kept
