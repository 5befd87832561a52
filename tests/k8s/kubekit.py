"""Helpers of the cluster-tier tests (fixtures are in conftest.py): a handle on one cluster (local tier or kind)
through the Python `kubernetes` client, the user-facing commands (`make`, the built kubectl) and bounded waits.

Every wait polls real state with a deadline and, on timeout, fails naming what it waited for and what it saw last.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
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

            # And the object itself: KubeRay's finalizers keep it after its pods (GCS fault tolerance: until the
            # Redis clean-up Job of its RayCluster ends), and an apply meanwhile would only patch the dying object.
            def gone():
                try:
                    self.ray(plural, name)
                except ApiException as e:
                    if e.status == 404:
                        return True
                    raise
                return None

            wait_until(f"{plural}/{name} to be deleted", gone, timeout)


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


def selector_matches(selector: dict, labels: dict) -> bool:
    """A Kubernetes LabelSelector (matchLabels + matchExpressions) against a pod's labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        v = labels.get(e["key"])
        if e["operator"] == "In" and v not in e["values"]:
            return False
        if e["operator"] == "NotIn" and v in e["values"]:
            return False
        if e["operator"] == "Exists" and v is None:
            return False
        if e["operator"] == "DoesNotExist" and v is not None:
            return False
    return True


# -- RayJobs run to the end (Level B) -------------------------------------------------------------------------------
# Where the chart's shared storage lives on the host (hack/deploy-cluster.sh; kind mounts it into its nodes). It
# outlives a test session: a test that judges what a job wrote clears the job's folder first.
HOST_STORAGE = Path("/tmp/rl-platform")
JOB_TIMEOUT = 1200


def job_diagnostics(c: Cluster, name: str) -> str:
    job = c.ray("rayjobs", name)
    logs = ""
    for p in c.pods(f"job-name={name}"):
        logs += c.kubectl("-n", NAMESPACE, "logs", p.metadata.name, "--tail", "60", check=False).stdout
    return f"status: {dump(job.get('status', {}))}\nevents: {c.events_for(name)[-10:]}\nsubmitter logs:\n{logs[-4000:]}"


def wait_job(c: Cluster, name: str, timeout: float = JOB_TIMEOUT) -> dict:
    """Wait for RayJob `name` to end; fail (with its status, events and submitter logs) unless it SUCCEEDED."""
    def terminal():
        st = c.ray("rayjobs", name).get("status", {})
        if st.get("jobStatus") in ("SUCCEEDED", "FAILED", "STOPPED") or st.get("jobDeploymentStatus") in ("Failed", "ValidationFailed"):
            return st
        return None

    st = wait_until(f"RayJob {name} to finish", terminal, timeout, interval=3,
                    on_timeout=lambda: job_diagnostics(c, name))
    assert st.get("jobStatus") == "SUCCEEDED", f"RayJob {name}: {st.get('jobStatus')}\n{job_diagnostics(c, name)}"
    return st


def fresh_start(c: Cluster, plural: str, name: str, output: Path | None = None) -> str:
    """Before applying RayJob/RayService `name`: delete an earlier one (a finished RayJob of the same name would
    not run again) and its output folder; return the UTC time (ISO seconds) the new one starts from."""
    c.delete_ray(plural, name)
    if plural == "rayjobs":
        wait_until(f"the old submitter pods of {name} to go", lambda: not c.pods(f"job-name={name}"), 120)
    if output is not None:
        sh("rm", "-rf", str(output))
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def pong_cpu_job() -> str:
    """k8s/values/pong-cpu.yaml rendered with a 2-iteration, small-batch override (the documented CPU-learner Pong);
    it writes results/pong on the shared storage, the checkpoint k8s/serve/rayservice.yaml serves."""
    values = ROOT / "k8s" / "values" / "pong-cpu.yaml"
    overrides = yaml.safe_load(values.read_text())["rayJob"]["overrides"] + [
        "stop.iterations=2", "algo.train_batch_size=400", "algo.minibatch_size=100", "algo.num_epochs=1"]
    return sh(helm_path(), "template", "rl-platform", str(ROOT / "charts" / "rl-platform"), "--namespace", NAMESPACE,
              "-f", str(values), "--set-json", f"rayJob.overrides={json.dumps(overrides)}",
              "--show-only", "templates/rayjob.yaml").stdout


# -- Kueue (test_1c_queue, test_2f_queue_preemption) ----------------------------------------------------------------
QUEUE_RELEASE = "qtest"            # the chart release the test queues are rendered as (not the deployed one)
CARTPOLE_VALUES = ROOT / "k8s" / "values" / "cartpole.yaml"


def rl_submit(c: Cluster, *args: str, timeout: float = 180, check: int | None = None) -> subprocess.CompletedProcess:
    """The console script as a user runs it, against this cluster."""
    exe = ROOT / ".venv" / "bin" / "rl-submit"
    cmd = [str(exe)] if exe.exists() else [str(ROOT / ".venv" / "bin" / "python"), "-m", "rl_submit"]
    proc = subprocess.run(cmd + list(args), cwd=ROOT, env={**os.environ, **c.env}, capture_output=True, text=True,
                          timeout=timeout)
    if check is not None:
        assert proc.returncode == check, f"rl-submit {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


def one_job_quota() -> dict[str, str]:
    """The summed requests of every pod of one CartPole job (Kueue admits them at once), rounded up a little: room
    for one such job and not for two."""
    from rl_submit.queue import pod_sets

    job = yaml.safe_load(sh(helm_path(), "template", QUEUE_RELEASE, str(ROOT / "charts" / "rl-platform"),
                            "--namespace", NAMESPACE, "-f", str(CARTPOLE_VALUES), "--set", "rayJob.enabled=true",
                            "--show-only", "templates/rayjob.yaml").stdout)
    cpu = sum(p.count * p.requests.get("cpu", 0) for p in pod_sets(job))
    mem = sum(p.count * p.requests.get("memory", 0) for p in pod_sets(job))
    return {"cpu": f"{int(cpu * 1000) + 100}m", "memory": f"{int(mem / 2**20) + 512}Mi", "nvidia.com/gpu": "0"}


def queue_manifest(local_queue: str, cluster_queue: str, cpu_quota: dict, tmp: Path) -> str:
    """The chart's Kueue objects (templates/kueue.yaml) for a test queue: a cpu flavor with `cpu_quota`, a gpu flavor
    with one GPU, priorities qtest-high (1000) and qtest-low (100)."""
    values = {"kueue": {"enabled": True, "localQueue": local_queue, "clusterQueue": {
        "name": cluster_queue, "flavors": [
            {"name": "cpu", "nodeLabels": {"rl-platform.io/pool": "cpu"}, "quota": cpu_quota},
            {"name": "gpu", "nodeLabels": {"rl-platform.io/pool": "gpu"},
             "nodeTaints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
             "quota": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "1"}}]},
        # helm merges maps: null drops the chart's default classes (the deployed release owns those).
        "priorityClasses": {"qtest-high": 1000, "qtest-low": 100, "training-high": None, "training-low": None}}}
    f = tmp / "queue-values.yaml"
    f.write_text(yaml.safe_dump(values))
    return sh(helm_path(), "template", QUEUE_RELEASE, str(ROOT / "charts" / "rl-platform"), "--namespace", NAMESPACE,
              "-f", str(f), "--show-only", "templates/kueue.yaml").stdout


def job_pods(c: Cluster, name: str) -> list[str]:
    """Every pod of RayJob `name`: its RayCluster's (ray.io/cluster=<name>-xxxxx) and its submitter Job's."""
    return [p.metadata.name for p in c.core.list_namespaced_pod(NAMESPACE).items
            if (p.metadata.labels or {}).get("ray.io/cluster", "").startswith(name)
            or (p.metadata.labels or {}).get("job-name") == name]


def workload(c: Cluster, name: str) -> dict | None:
    """Kueue's Workload of RayJob `name` (None before Kueue made it)."""
    from rl_submit.queue import JOB_UID_LABEL, KUEUE

    uid = c.ray("rayjobs", name)["metadata"]["uid"]
    items = c.custom.list_namespaced_custom_object(*KUEUE, NAMESPACE, "workloads",
                                                  label_selector=f"{JOB_UID_LABEL}={uid}")["items"]
    return items[0] if items else None


def workload_condition(c: Cluster, name: str, kind: str) -> dict:
    wl = workload(c, name) or {}
    return next((x for x in (wl.get("status") or {}).get("conditions") or [] if x["type"] == kind), {})


def quota_reserved(c: Cluster, name: str) -> bool:
    return workload_condition(c, name, "QuotaReserved").get("status") == "True"
