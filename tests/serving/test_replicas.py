"""More than one Serve replica: in `direct` ingress mode replica k answers on port + k, each with the policy."""

from __future__ import annotations

import time

import pytest
import requests

from conftest import ServerProcess
from test_api import cartpole_observations, reference_actions

pytestmark = [pytest.mark.serve, pytest.mark.slow]


def test_two_replicas_each_serve_the_policy(serving_workdir, cartpole_checkpoint):
    (serving_workdir / "replicas").mkdir()
    srv = ServerProcess(serving_workdir / "replicas", {"default": cartpole_checkpoint}, extra_args=("--num-replicas", "2"))
    try:
        obs = cartpole_observations(8, seed=21)
        want = reference_actions(cartpole_checkpoint, obs)
        for k in range(2):
            base = f"http://127.0.0.1:{srv.port + k}"
            deadline = time.monotonic() + 120
            while True:  # the launcher's "ready" waits for the app; each replica binds its own port
                try:
                    if requests.get(base + "/readyz", timeout=5).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                assert time.monotonic() < deadline, f"replica {k} never answered on port {srv.port + k}"
                time.sleep(0.5)
            r = requests.post(base + "/v1/policies/default/act_batch", json={"observations": obs.tolist()}, timeout=30)
            assert r.status_code == 200 and r.json()["actions"] == want, r.text
    finally:
        assert srv.stop() == 0, srv.log_tail()
