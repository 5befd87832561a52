"""Fault injection: SIGKILL one of two Serve replicas under steady HTTP load.

The server runs with `--ingress proxy` (the classic Serve proxy balances over the replicas, as a Kubernetes
Service in front of a RayService does); in `direct` mode each replica owns a port, so a client of the killed
one has nobody to fail over to. Requests on the dying replica fail (Serve answers 500 "actor died", or the
connection breaks): every non-200 and every client-side exception counts as an error. The error ratio over
the whole window must stay <= 1%, and Serve must bring the replica back (its own healthy-replica gauge reads 2
again, from a new replica process). The recovery time is printed, not asserted (speed belongs in bench/).
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time

import psutil
import pytest
import requests

from conftest import ServerProcess, metric_samples, scrape
from test_api import cartpole_observations
from trainer_helpers import wait_for as shared_wait_for

pytestmark = [pytest.mark.serve, pytest.mark.slow]

CLIENTS = 4
REPLICA_TITLE = "ray::ServeReplica:policy:PolicyServer"


def replica_pids(srv: ServerProcess) -> set[int]:
    """Live PolicyServer replica processes of this server (Ray titles its workers `ray::<actor class>`)."""
    out = set()
    for p in psutil.Process(srv.proc.pid).children(recursive=True):
        try:
            cmd = p.cmdline()
            if cmd and cmd[0].startswith(REPLICA_TITLE) and p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def healthy_replicas(srv: ServerProcess) -> frozenset[str]:
    """Replica ids the Serve controller reports healthy: its `serve_deployment_replica_healthy` gauge has one
    sample per replica (1 healthy, 0 not; Ray's default high-cardinality tags)."""
    samples = metric_samples(scrape(srv.metrics_url), "ray_serve_deployment_replica_healthy", deployment="PolicyServer")
    return frozenset(labels["replica"] for labels, v in samples if v == 1 and "replica" in labels)


def wait_for(cond, timeout_s: float, what: str, srv: ServerProcess):
    return shared_wait_for(cond, timeout_s, what, interval=0.2, on_timeout=lambda: "log tail:\n" + srv.log_tail(),
                           tolerate=())


class Load:
    """CLIENTS threads posting act_batch in a loop over keep-alive sessions; counts outcomes."""

    def __init__(self, base: str):
        self.url = base + "/v1/policies/default/act_batch"
        self.body = {"observations": cartpole_observations(4, seed=5).tolist()}
        self.ok = 0
        self.errors: collections.Counter = collections.Counter()
        self.lock = threading.Lock()
        self.stop_evt = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]

    def _run(self) -> None:
        s = requests.Session()
        while not self.stop_evt.is_set():
            try:
                r = s.post(self.url, json=self.body, timeout=30)
                kind = None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:120]}"
            except requests.RequestException as e:
                kind = type(e).__name__
                s = requests.Session()
            with self.lock:
                if kind is None:
                    self.ok += 1
                else:
                    self.errors[kind] += 1

    def total(self) -> int:
        with self.lock:
            return self.ok + sum(self.errors.values())

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop_evt.set()
        for t in self.threads:
            t.join(timeout=60)


def test_killing_a_replica_under_load_keeps_errors_under_1_percent(serving_workdir, cartpole_checkpoint):
    (serving_workdir / "replica_kill").mkdir()
    srv = ServerProcess(serving_workdir / "replica_kill", {"default": cartpole_checkpoint},
                        extra_args=("--num-replicas", "2", "--ingress", "proxy"))
    try:
        before = wait_for(lambda: p if len(p := replica_pids(srv)) == 2 else None, 120, "two replica processes", srv)
        healthy_before = wait_for(lambda: h if len(h := healthy_replicas(srv)) == 2 else None, 120,
                                  "Serve reporting 2 healthy replicas", srv)
        with Load(srv.base) as load:
            wait_for(lambda: load.total() >= 200, 120, "200 requests before the kill", srv)
            victim = min(before)
            os.kill(victim, signal.SIGKILL)
            t_kill = time.monotonic()
            new = wait_for(lambda: p if len(p := replica_pids(srv)) == 2 and p != before else None, 180,
                           "a replacement replica process", srv)
            # Two healthy again, one of them a replica id that did not exist before the kill (not a stale scrape).
            healthy_after = wait_for(
                lambda: h if len(h := healthy_replicas(srv)) == 2 and h != healthy_before else None, 180,
                "Serve reporting 2 healthy replicas again, one of them new", srv)
            recovery_s = time.monotonic() - t_kill
            # Keep the load on the recovered pair for a while: the new replica must take traffic without errors.
            n_recovered = load.total()
            wait_for(lambda: load.total() >= n_recovered + 200, 120, "200 requests after recovery", srv)
            (replacement,) = healthy_after - healthy_before
            wait_for(lambda: sum(v for _, v in metric_samples(
                scrape(srv.metrics_url), "ray_serve_deployment_request_counter_total", replica=replacement)) > 0,
                     60, f"requests served by the replacement replica {replacement}", srv)
        errors = sum(load.errors.values())
        total = load.ok + errors
        print(f"\nreplica kill: {total} requests, {errors} errors ({errors / total:.3%}), killed pid {victim}, "
              f"replacement pid {sorted(new - before)} id {replacement}, 2 healthy again in {recovery_s:.1f}s; "
              f"errors by kind: {dict(load.errors)}")
        assert victim not in new and len(healthy_after & healthy_before) == 1
        assert errors / total <= 0.01, f"{errors}/{total} requests failed: {dict(load.errors)}"
        r = requests.get(srv.base + "/healthz", timeout=10)
        assert r.status_code == 200, r.text
    finally:
        assert srv.stop() == 0, srv.log_tail()
