"""Level B: a canary rollout on the RayService, in place. `rl-rollout --rayservice` patches only the RayService's
spec.serveConfigV2 (candidate at 50%, then 100%, then promoted) while clients play short Pong sessions through the
RayService's Kubernetes Service and post episode feedback: KubeRay applies each step to the same RayCluster (same
name, the same pods), no request fails, and no session is answered by two checkpoints.

The champion is the Pong checkpoint the `pong_checkpoint` fixture (conftest.py) wrote in this session; `kubectl
apply` brings the manifest's champion back if a previous run promoted another. The candidate is an untrained Pong
module written to the shared storage the pods mount (HOST_STORAGE on the host = /mnt/rl-platform in the pods).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
import yaml

from kubekit import NAMESPACE, ROOT, Cluster, dump, first_doc, fresh_start, wait_until

sys.path.insert(0, str(ROOT / "tests" / "serving"))
from make_checkpoint import make_module_checkpoint  # noqa: E402

from rl_checkpoint import resolve  # noqa: E402

HOST_STORAGE = Path("/tmp/rl-platform")
POD_STORAGE = "/mnt/rl-platform"
FRAME = {"b64": base64.b64encode(bytes(210 * 160 * 3)).decode(), "dtype": "uint8", "shape": [210, 160, 3]}


@pytest.fixture(scope="module")
def real(cluster_b: Cluster) -> Cluster:
    if cluster_b.kind != "local":
        pytest.skip("kind: the host reaches no ClusterIP there; the local tier covers the in-place rollout")
    return cluster_b


def _serving(real: Cluster, name: str) -> str:
    """The serve Service's ClusterIP once the RayService answers an act request there."""
    svc = f"{name}-serve-svc"

    def probe():
        ip = real.core.read_namespaced_service(svc, NAMESPACE).spec.cluster_ip
        try:
            r = requests.post(f"http://{ip}:8000/v1/policies/default/act", timeout=10,
                              json={"session_id": "probe", "reset": True, "frame": FRAME})
        except requests.ConnectionError:
            return None
        return ip if r.status_code == 200 else None

    return wait_until(f"RayService {name} to answer on {svc}", probe, 900, interval=3,
                      on_timeout=lambda: dump(real.ray("rayservices", name).get("status", {})))


class PongSessions:
    """Clients playing 4-step sessions (blank frames) through the Service; each posts its return as feedback."""

    def __init__(self, url: str, clients: int = 3):
        self.url, self.failures, self.sessions = url, [], []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        s = requests.Session()
        while not self._stop.is_set():
            sid, seen = f"k8s-{uuid.uuid4().hex[:12]}", set()
            try:
                for step in range(4):
                    r = s.post(f"{self.url}/act", json={"session_id": sid, "reset": step == 0, "frame": FRAME},
                               timeout=30)
                    if r.status_code != 200:
                        raise RuntimeError(f"act HTTP {r.status_code}: {r.text[:200]}")
                    seen.add(r.json()["checkpoint_id"])
                r = s.post(f"{self.url}/feedback", json={"session_id": sid, "reward": -1.0, "done": True}, timeout=30)
                if r.status_code != 200:
                    raise RuntimeError(f"feedback HTTP {r.status_code}: {r.text[:200]}")
            except Exception as e:  # noqa: BLE001 - every failure is recorded and asserted on
                with self._lock:
                    self.failures.append(f"{type(e).__name__}: {e}")
                continue
            with self._lock:
                self.sessions.append(seen)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)


def test_rollout_updates_the_rayservice_in_place_with_no_failed_request(real: Cluster, pong_checkpoint: dict):
    doc = first_doc("k8s/serve/rayservice.yaml")
    name = doc["metadata"]["name"]
    # A RayService left running (another test, an earlier session) holds the checkpoint it loaded then, maybe not the
    # one now on disk under the same path, or a candidate a previous run promoted: start it anew from the manifest.
    fresh_start(real, "rayservices", name)
    real.apply("k8s/serve/rayservice.yaml")
    ip = _serving(real, name)
    url = f"http://{ip}:8000"
    champion = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"][0]["deployments"][0]["user_config"][
        "policies"]["default"]["checkpoint"]
    info = requests.get(f"{url}/v1/policies/default", timeout=10).json()
    assert info.get("checkpoint") == champion and info.get("checkpoint_id") == pong_checkpoint["checkpoint_id"], (
        info, pong_checkpoint)

    rel = f"candidates/pong-untrained-{int(time.time())}"
    cand_id = resolve(str(make_module_checkpoint(HOST_STORAGE / rel, "pong", seed=2))).checkpoint_id
    status = real.ray("rayservices", name)["status"]
    cluster = status["activeServiceStatus"]["rayClusterName"]
    pods_before = {p.metadata.uid: p.metadata.name for p in real.pods(f"ray.io/cluster={cluster}")}
    assert pods_before, f"no pods of RayCluster {cluster}"

    clients = PongSessions(f"{url}/v1/policies/default")
    try:
        cmd = [str(Path(sys.executable).parent / "rl-rollout"), "start", "default", f"{POD_STORAGE}/{rel}",
               "--rayservice", name, "-n", NAMESPACE, "--server", url, "--steps", "50,100", "--interval", "6",
               "--min-episodes", "3", "--min-requests", "3", "--drain-timeout", "60", "--apply-timeout", "300",
               "--max-p99-ms", "5000", "--json"]  # not a latency test: a loaded 2-core node is slow for both versions
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **real.env}, capture_output=True, text=True,
                              timeout=900)
    finally:
        clients.stop()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["status"] == "promoted", record
    real.figures["level_b_rollout_start_to_promoted_s"] = round(record["updated_at"] - record["started_at"], 1)

    # In place: the same RayCluster, the same pods (no pod created or deleted for the rollout).
    status = real.ray("rayservices", name)["status"]
    assert status["activeServiceStatus"]["rayClusterName"] == cluster, dump(status)
    assert not (status.get("pendingServiceStatus") or {}).get("rayClusterName"), dump(status)
    assert {p.metadata.uid: p.metadata.name for p in real.pods(f"ray.io/cluster={cluster}")} == pods_before
    # The desired state moved: the RayService's serveConfigV2 names the candidate as champion, and it serves.
    spec = yaml.safe_load(real.ray("rayservices", name)["spec"]["serveConfigV2"])["applications"][0][
        "deployments"][0]["user_config"]["policies"]["default"]
    assert spec["checkpoint"] == f"{POD_STORAGE}/{rel}" and "candidate" not in spec, spec
    assert requests.get(f"{url}/v1/policies/default", timeout=10).json()["checkpoint_id"] == cand_id

    assert not clients.failures, f"{len(clients.failures)} failed client requests: {clients.failures[:5]}"
    assert len(clients.sessions) >= 6, len(clients.sessions)
    mixed = [s for s in clients.sessions if len(s) != 1]
    assert not mixed, f"{len(mixed)} sessions answered by two checkpoints: {mixed[:3]}"
    assert {next(iter(s)) for s in clients.sessions} >= {cand_id}

    # Leave the manifest's champion serving for whatever runs next.
    real.apply("k8s/serve/rayservice.yaml")
