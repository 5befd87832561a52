"""Each `--ingress` mode of `python -m serving` serves the policy, through the listener that mode promises.

`direct`: the Serve replica itself listens on `--port` (direct ingress). `proxy`: Serve's classic proxy actor
does, as on Kubernetes. Which process listens is read from the server's process tree (psutil): Ray titles its
worker processes `ray::<actor class>`, Serve's replica class is `ServeReplica:<app>:<deployment>` and its proxy
class `ProxyActor` (Ray 2.58).
"""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest
import requests

from conftest import REPO, ServerProcess, subprocess_env
from test_api import cartpole_observations, reference_actions

pytestmark = pytest.mark.serve

LISTENER = {"direct": "ray::ServeReplica:policy:PolicyServer", "proxy": "ray::ProxyActor"}


def listeners(pid: int) -> list[tuple[str, str, int]]:
    """(process title, ip, port) of every TCP socket listening in `pid`'s process tree."""
    root = psutil.Process(pid)
    out = []
    for p in [root, *root.children(recursive=True)]:
        try:
            conns = p.net_connections(kind="inet")
            cmd = p.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        title = cmd[0].strip() if cmd else ""
        out += [(title, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def answers_http(ip: str, port: int) -> bool:
    """Whether an HTTP/1.1 GET /readyz there gets the server's 200 (Ray's gRPC listeners do not speak it)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(ip, ip)
    try:
        return requests.get(f"http://{'[' + host + ']' if ':' in host else host}:{port}/readyz", timeout=3).ok
    except requests.RequestException:
        return False


@pytest.mark.parametrize("mode", ["direct", "proxy"])
def test_ingress_mode_serves_through_its_listener(mode, serving_workdir, cartpole_v2_checkpoint):
    work = serving_workdir / f"ingress_{mode}"
    work.mkdir()
    srv = ServerProcess(work, {"default": cartpole_v2_checkpoint}, extra_args=("--ingress", mode))
    try:
        obs = cartpole_observations(4, seed=7)
        want = reference_actions(cartpole_v2_checkpoint, obs)
        got = []
        for o in obs:
            r = requests.post(srv.base + "/v1/policies/default/act", json={"observation": o.tolist()}, timeout=30)
            assert r.status_code == 200, r.text
            got.append(r.json()["action"])
        assert got == want
        found = listeners(srv.proc.pid)
        on_port = {title for title, _, port in found if port == srv.port}
        assert on_port and all(t.startswith(LISTENER[mode]) for t in on_port), (
            f"--ingress {mode}: port {srv.port} should be served by {LISTENER[mode]}, listeners: {on_port}")
        # Direct ingress is the replica answering HTTP itself, on --port only; with the proxy, no replica does.
        replica_http = {port for title, ip, port in found
                        if title.startswith(LISTENER["direct"]) and answers_http(ip, port)}
        assert replica_http == ({srv.port} if mode == "direct" else set()), (mode, replica_http)
    finally:
        assert srv.stop() == 0, srv.log_tail()


def test_removed_haproxy_mode_is_refused_before_ray_starts():
    proc = subprocess.run([sys.executable, "-m", "serving", "--ingress", "haproxy"], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "invalid choice: 'haproxy'" in proc.stderr and "Traceback" not in proc.stderr
