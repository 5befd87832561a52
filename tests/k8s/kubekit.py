"""Helpers of the cluster-tier tests (fixtures are in conftest.py): a handle on one cluster (local tier or kind)
through the Python `kubernetes` client, the user-facing commands (`make`, the built kubectl) and bounded waits.

Every wait polls real state with a deadline and, on timeout, fails naming what it waited for and what it saw last.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from trainer_helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "rl-platform"
RAY = ("ray.io", "v1")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def sh(*args: str, env: dict | None = None, timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"`{' '.join(args)}` exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def helm_path() -> str:
    """The helm hack/tools.sh built (the one `make deploy-cluster` uses)."""
    env = sh(str(ROOT / "hack" / "tools.sh"), "env").stdout
    return dict(line.split("=", 1) for line in env.splitlines() if "=" in line)["HELM"]


def first_doc(path: str) -> dict:
    """The first YAML document of a repo file (a k8s/ manifest)."""
    return next(d for d in yaml.safe_load_all((ROOT / path).read_text()) if d)


def wait_until(what: str, probe: Callable[[], Any], timeout: float, interval: float = 1.0,
               on_timeout: Callable[[], str] | None = None) -> Any:
    """trainer_helpers.wait_for, where an API error (an object not created yet) is a normal state while waiting."""
    return wait_for(probe, timeout, what, interval, on_timeout, tolerate=(ApiException,))


@dataclass
class Cluster:
    """One running cluster: its kubeconfig, the kubectl/helm users run, and API clients."""

    kind: str                      # "local" | "kind"
    kubeconfig: str
    bin_dir: str                   # holds kubectl and helm (the PATH the cluster prints)
    level: str = "a"
    figures: dict = field(default_factory=dict)

    def __post_init__(self):
        self.api_client = config.new_client_from_config(config_file=self.kubeconfig)
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)

    # -- the commands a user runs ---------------------------------------------------------------------------
    @property
    def env(self) -> dict:
        return {"KUBECONFIG": self.kubeconfig, "PATH": f"{self.bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        return sh(f"{self.bin_dir}/kubectl", *args, env=self.env, check=check, timeout=timeout, **kw)

    def apply(self, path: str) -> None:
        """`kubectl -n rl-platform apply -f PATH`, exactly as the README tells users."""
        self.kubectl("-n", NAMESPACE, "apply", "-f", path)

    # -- reading state ------------------------------------------------------------------------------------------
    def ray(self, plural: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(*RAY, NAMESPACE, plural, name)

    def ray_list(self, plural: str, **kw) -> list[dict]:
        return self.custom.list_namespaced_custom_object(*RAY, NAMESPACE, plural, **kw)["items"]

    def pods(self, selector: str) -> list:
        return self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items

    def node_labels(self) -> dict[str, dict]:
        return {n.metadata.name: (n.metadata.labels or {}) for n in self.core.list_node().items}

    def events_for(self, name: str) -> list[str]:
        evs = self.core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
        return [f"{e.type} {e.reason}: {e.message}" for e in evs]

    def delete_ray(self, plural: str, name: str, wait_pods: bool = True, timeout: float = 180) -> None:
        try:
            self.custom.delete_namespaced_custom_object(*RAY, NAMESPACE, plural, name)
        except ApiException as e:
            if e.status != 404:
                raise
        if wait_pods:
            # Pods of a deleted RayJob/RayService cluster carry its name as a label prefix of ray.io/cluster.
            wait_until(f"pods of {plural}/{name} to go", lambda: not [
                p for p in self.core.list_namespaced_pod(NAMESPACE).items
                if (p.metadata.labels or {}).get("ray.io/cluster", "").startswith(name)], timeout)


def all_scheduled(pods: list) -> bool:
    return bool(pods) and all(any(c.type == "PodScheduled" and c.status == "True" for c in (p.status.conditions or []))
                              for p in pods)


def container_command(pod, name_prefix: str = "ray-") -> str:
    """The shell command KubeRay generated for the Ray container (`ray start ...` lives in args or command)."""
    for c in pod.spec.containers:
        if c.name.startswith(name_prefix) or c.name in ("ray-head", "ray-worker"):
            return " ".join((c.command or []) + (c.args or []))
    return " ".join(" ".join((c.command or []) + (c.args or [])) for c in pod.spec.containers)


def conditions(obj: dict) -> dict[str, dict]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", []) or []}


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)[:3000]
