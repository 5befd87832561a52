"""Nothing unauthenticated off loopback: what `make serve` and `make train` actually listen on.

Each test starts the real entry point, lists the LISTEN sockets of its whole process tree (psutil) and fails on a
listener outside loopback that does not refuse a request without Ray's token. It also checks that the token is
on at all: Ray's GCS refuses an unauthenticated call (a local user without the token cannot drive Ray).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from listeners import grpc_code, listeners, ray_token, token_guarded
from trainer_helpers import REPO, free_ports, short_tmp, stop_process, trainer_cmd, trainer_env



def _own_ip() -> str:
    """An address of this machine other than loopback, to reach listeners bound to all interfaces."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent; picks the outgoing interface
        return s.getsockname()[0]


def _start(cmd: list[str], ready: str, timeout_s: float) -> tuple[subprocess.Popen, list[str]]:
    """Popen `cmd`; return once a stdout line contains `ready` (lines seen are returned for messages)."""
    env = trainer_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    seen: list[str] = []
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)], daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if ready in line:
            return proc, seen
    stop_process(proc, signal.SIGINT, 90)
    raise AssertionError(f"no {ready!r} line in {timeout_s}s (exit {proc.poll()}):\n{''.join(seen[-60:])}")


# The one listener Ray opens on all interfaces (README, Security): a Serve replica's inter-deployment gRPC server.
# Its process is named `ray::ServeReplica:<app>:<deployment>`.
SERVE_REPLICA = "ray::ServeReplica:"
# An env runner actor is a Ray worker process with its own gRPC server.
ENV_RUNNER = "ray::SingleAgentEnvRunner"
# driver 1, gcs_server 1, raylet 2, dashboard agent 2, runtime-env agent 1, env runner 1, idle worker 1 (seen: 9).
MIN_TRAIN_LISTENERS = 8


def token_on_any_command_line(token: str) -> list[str]:
    """Processes (any user's) whose command line holds the token: a command line is readable by every local user."""
    found = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        if token in " ".join(p.info["cmdline"] or []):
            found.append(f"{p.info['name']}[{p.info['pid']}]")
    return found


def assert_exposure(pid: int, allowed_exposed: tuple[str, ...], min_listeners: int, must_listen: set[str]) -> None:
    """The process tree's listeners: at least `min_listeners` sockets inspected, every process of `must_listen`
    among them, off loopback exactly one listener per process-name prefix in `allowed_exposed` (each refusing a
    call without the token) and nothing else; the token on no command line; Ray's GCS refusing an
    unauthenticated call."""
    token = ray_token(pid)
    assert token, "Ray's daemons run without RAY_AUTH_TOKEN: token auth is off"
    found = listeners(pid)
    names = {l.name for l in found}
    # Too few sockets would mean the tree was not Ray's (or psutil saw only part of it): nothing was really checked.
    assert len(found) >= min_listeners, f"only {len(found)} listeners inspected (< {min_listeners}): {sorted(map(str, found))}"
    missing = {m for m in must_listen if not any(n.startswith(m) for n in names)}
    assert not missing, f"no listener of {sorted(missing)} in the tree: {sorted(names)}"
    gcs = next(l for l in found if l.name == "gcs_server")
    assert grpc_code("127.0.0.1", gcs.port, "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo", None) == "UNAUTHENTICATED"
    assert grpc_code("127.0.0.1", gcs.port, "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo", token) == "OK"
    exposed = [l for l in found if not l.loopback]
    unexpected = [str(l) for l in exposed if not any(l.name.startswith(a) for a in allowed_exposed)]
    assert not unexpected, f"listening off loopback beyond the documented exception {allowed_exposed}: {unexpected}"
    per_exception = {a: [str(l) for l in exposed if l.name.startswith(a)] for a in allowed_exposed}
    assert all(len(v) == 1 for v in per_exception.values()), f"want exactly one listener of each exception: {per_exception}"
    host = _own_ip()
    open_ = [str(l) for l in exposed if token_guarded(host, l.port, token) is None]
    assert not open_, f"listening off loopback without token auth: {open_}"
    leaked = token_on_any_command_line(token)
    assert not leaked, f"Ray's token is on the command line of {leaked} (readable by every local user)"


@pytest.mark.serve
def test_make_serve_exposes_nothing_unauthenticated(tmp_path):
    from make_checkpoint import make_module_checkpoint

    ckpt = make_module_checkpoint(tmp_path / "ckpt", "cartpole")
    port, proxy_port, metrics_port = free_ports(3)
    cmd = [sys.executable, "-m", "serving", "--checkpoint", str(ckpt), "--port", str(port),
           "--proxy-port", str(proxy_port), "--metrics-port", str(metrics_port), "--temp-dir", short_tmp("rlsec"),
           "--num-cpus", "2"]
    proc, _ = _start(cmd, '"event": "ready"', 300)
    try:
        # gcs_server 1, raylet 2, dashboard agent 2, runtime-env agent 1, proxy 2, controller 1, replica 3 (seen: 13).
        assert_exposure(proc.pid, (SERVE_REPLICA,), min_listeners=10,
                        must_listen={"gcs_server", "raylet", "ray::DashboardAgent", "ray::ProxyActor", SERVE_REPLICA})
    finally:
        stop_process(proc, signal.SIGINT, 90)
    assert proc.returncode == 0


@pytest.mark.slow
def test_make_train_exposes_nothing_unauthenticated(tmp_path):
    # One env runner actor, so a Ray worker process (with its own gRPC server) is part of the tree.
    cmd = trainer_cmd(f"output_dir={tmp_path}", "stop.iterations=1000", "resources.num_env_runners=1",
                      "algo.train_batch_size=200", "algo.minibatch_size=100", "algo.num_epochs=1",
                      f"resources.ray_tmp_dir={short_tmp('rlsec')}")
    proc, _ = _start(cmd, "| env steps", 300)
    try:
        # Training opens no Serve replica: nothing at all may listen off loopback.
        assert_exposure(proc.pid, (), min_listeners=MIN_TRAIN_LISTENERS,
                        must_listen={"gcs_server", "raylet", "ray::DashboardAgent", ENV_RUNNER})
    finally:
        stop_process(proc, signal.SIGINT, 90)
