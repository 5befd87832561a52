"""Helpers for tests that run the real trainer entry point (`python -m trainer`) as a user would."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from embedded_ray import DID_NOT_START

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, outside the ranges anything else picks from (servers under test
    bind it next)."""
    return free_ports(1)[0]


def wait_for(pred, deadline_s: float, what: str, interval: float = 0.25, on_timeout=None,
             tolerate: tuple[type[BaseException], ...] = (Exception,)):
    """Poll `pred` until it returns something truthy and return that. An exception of a `tolerate` type counts as
    "not yet" (an object not created yet, a server not listening yet). After `deadline_s`: an AssertionError naming
    `what`, the last value or error, and `on_timeout()` (logs that say why)."""
    end = time.monotonic() + deadline_s
    last = None
    while True:
        try:
            last = pred()
            if last:
                return last
        except tolerate as e:
            last = e
        if time.monotonic() >= end:
            extra = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what} (last seen: {last!r})"
                                 + (f"\n{extra}" if extra else ""))
        time.sleep(interval)


# Ports handed out by this process (a server may not have bound its port yet when the next test asks).
_HANDED_OUT: set[int] = set()
PORT_BLOCK = 64  # each port handed out starts its own block: Serve's direct ingress binds port..port+32


def _xdist_worker() -> tuple[int, int]:
    """(this pytest-xdist worker's index, the number of workers); (0, 1) outside xdist."""
    name, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if name.startswith("gw") and name[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(name[2:]) % int(count), int(count)
    return 0, 1


def _private_port_range() -> tuple[int, int]:
    """Ports no other process picks on its own: above Ray's worker ports (10002-19999) and below the kernel's
    ephemeral range, where every bind(0) and every outgoing connection's source port comes from. A port taken
    from the ephemeral range and released can be given to a Ray process before our server binds it (CI saw
    Serve's proxy fail to bind one that way)."""
    try:
        lo = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    return 20000, lo - 1


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1, none handed out before by this process, each the start of its own
    `PORT_BLOCK`-port block of the private range (see `_private_port_range`)."""
    import random
    import socket

    lo, hi = _private_port_range()
    # Each pytest-xdist worker takes every Nth block, so two workers never hand out the same port (each keeps its
    # own _HANDED_OUT; CI saw a policy server's port answered by another worker's Ray metrics port).
    index, count = _xdist_worker()
    blocks = [b for i, b in enumerate(range(lo, hi - PORT_BLOCK + 2, PORT_BLOCK))
              if i % count == index and b not in _HANDED_OUT]
    random.shuffle(blocks)
    ports: list[int] = []
    for port in blocks:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            _HANDED_OUT.update(ports)
            return ports
    raise RuntimeError(f"fewer than {n} bindable ports in {lo}-{hi}")


def stop_process(proc: subprocess.Popen, sig: int, timeout_s: float = 30) -> int | None:
    """Send `sig` (the process's own clean-stop signal), wait `timeout_s`, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    return proc.returncode


# Clean-ups to run right after the last test of a suite (tests/<suite>/; tests/conftest.py runs them): session
# fixtures whose processes (a policy server and its Ray) would otherwise idle through every later suite of `make
# test` and take CPU from them. The fixture's own teardown still runs at the session's end: make both idempotent.
SUITE_END: dict[str, list] = {}


def at_suite_end(suite: str, fn) -> None:
    SUITE_END.setdefault(suite, []).append(fn)


@contextlib.contextmanager
def docker_containers_lock(exclusive: bool):
    """Held shared while the containers suite runs its containers (and by hack/images.sh while it builds or fetches:
    a build's containers, debootstrap's chroot mounts), exclusive by the cluster tier around its host photographs
    (tests/k8s/hostsnap.py): `make test`'s cold layout runs the suites in different workers beside the background
    build, and a container started or removed between the photographs (its veth, overlay mount, iptables rules) is
    not the cluster's doing."""
    d = Path(os.environ.get("RLP_CACHE") or Path.home() / ".cache" / "rl-platform") / "logs"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "docker-containers.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float, what: str) -> None:
    """Until 127.0.0.1:`port` accepts a connection; fails naming `what` if `proc` exits or `timeout_s` passes."""
    import socket
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, f"{what} did not come up"
            time.sleep(0.1)


def short_tmp(prefix: str = "rlp") -> str:
    """Ray's unix sockets live under its temp dir; pytest's tmp_path can exceed the 107-byte socket path limit."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


def trainer_cmd(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "trainer", *overrides]


def trainer_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # never attach to somebody else's cluster by accident
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_trainer(*overrides: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    """Run the trainer to completion with its own Ray temp dir; returns the completed process."""
    args = list(overrides)
    if not any(a.startswith("resources.ray_tmp_dir=") for a in args) and not any(
        a.startswith("resources.address=") for a in args
    ):
        args.append(f"resources.ray_tmp_dir={short_tmp()}")
    for attempt in range(2):
        proc = subprocess.run(
            trainer_cmd(*args), cwd=REPO, env=trainer_env(), capture_output=True, text=True, timeout=timeout
        )
        if attempt or not (proc.returncode == 2 and DID_NOT_START in proc.stderr):
            break
        # Ray's fixed 30 s for its raylet to register, missed when make test's two suite groups load both cores
        # (seen once in a full run): the machine, not the trainer. One more try, said in the test's output.
        print(f"trainer: {proc.stderr.strip()}; retrying once")
    if check and proc.returncode != 0:
        raise AssertionError(
            f"trainer exited {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        )
    return proc


def summary_of(proc: subprocess.CompletedProcess) -> dict:
    """The trainer's contract: its last stdout line is the run summary as one JSON object."""
    last = proc.stdout.strip().splitlines()[-1]
    return json.loads(last)


class RayHead:
    """`ray start --head --block` on 127.0.0.1 with every port from free_ports, in its own process group (stopped
    by signalling that group: never `ray stop`, which would stop every Ray on the machine)."""

    def __init__(self, temp_dir: str, env: dict[str, str], num_cpus: int = 3):
        (self.gcs, self.metrics_port, self.dashboard_port, agent, agent_grpc, runtime_env, client, node_manager,
         object_manager) = free_ports(9)
        self.address = f"127.0.0.1:{self.gcs}"
        Path(temp_dir).mkdir(parents=True, exist_ok=True)
        self.log = open(Path(temp_dir).parent / "ray-head.log", "w")
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
               "--node-ip-address=127.0.0.1", f"--port={self.gcs}", f"--temp-dir={temp_dir}",
               f"--metrics-export-port={self.metrics_port}", "--dashboard-host=127.0.0.1",
               f"--dashboard-port={self.dashboard_port}", f"--dashboard-agent-listen-port={agent}",
               f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={runtime_env}",
               f"--ray-client-server-port={client}", f"--node-manager-port={node_manager}",
               f"--object-manager-port={object_manager}", f"--num-cpus={num_cpus}", "--disable-usage-stats"]
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_metrics(self, name: str, timeout_s: float) -> None:
        import requests

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"ray start exited {self.proc.returncode}"
            try:
                if name in requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{name} not on Ray's metrics port after {timeout_s}s")

    def assert_alive(self) -> None:
        """The head still runs; else its `ray start` output names which of its processes exited."""
        if self.proc.poll() is not None:
            self.log.flush()
            tail = Path(self.log.name).read_text(errors="replace")[-3000:]
            raise AssertionError(f"ray start --head exited {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        self.log.close()
