"""Level B: the chart's PodMonitors, turned into a Prometheus scrape config as prometheus-operator would
(hack/promconfig.py), discover exactly the Ray pods each is meant for through the cluster's apiserver (the release's
Ray head, a live RayService's head and workers, nothing else, each by one monitor) and scrape Ray's metrics from them, labelled as the
dashboards expect. Prometheus is the upstream server with kubernetes_sd (hack/tools.sh prometheus-k8s), on 127.0.0.1
on the host, which reaches pod IPs on the cluster bridge."""

from __future__ import annotations

import sys

import pytest
import yaml
from kubernetes.client.rest import ApiException

from kubekit import NAMESPACE, ROOT, Cluster, first_doc, helm_path, sh, wait_until

sys.path.insert(0, str(ROOT / "tests" / "monitoring"))
sys.path.insert(0, str(ROOT / "tests" / "chart"))
from chartkit import tool_env  # noqa: E402
from promkit import start_podmonitor_prometheus  # noqa: E402


@pytest.fixture(scope="module")
def live_rayservice(cluster_b: Cluster):
    """k8s/serve/rayservice.yaml with its pods Running (its Serve application need not be healthy for its pods to be
    scraped); deleted afterwards when this test created it."""
    c = cluster_b
    if c.kind != "local":
        pytest.skip("kind: no host route to pod IPs; kube-prometheus-stack covers it there")
    name = first_doc("k8s/serve/rayservice.yaml")["metadata"]["name"]
    try:
        c.ray("rayservices", name)
        existed = True
    except ApiException as e:
        if e.status != 404:
            raise
        existed = False
    c.apply("k8s/serve/rayservice.yaml")

    def running():
        st = c.ray("rayservices", name).get("status", {})
        rc = (st.get("activeServiceStatus") or {}).get("rayClusterName") or (st.get("pendingServiceStatus") or {}).get("rayClusterName")
        if not rc:
            return None
        spec = c.ray("rayclusters", rc)["spec"]
        want = 1 + sum(int(g.get("replicas", 0)) for g in spec.get("workerGroupSpecs", []))
        pods = [p for p in c.pods(f"ray.io/cluster={rc}") if p.status.phase == "Running" and p.status.pod_ip]
        return rc if len(pods) >= want else None

    rc = wait_until(f"the pods of RayService {name} to run", running, 600, interval=3)
    yield c, rc
    if not existed:
        c.delete_ray("rayservices", name)


def _intended_targets(c: Cluster) -> set[tuple[str, str]]:
    """(scrape job, pod) for every live Ray pod of the namespace, by what the chart means its three PodMonitors to
    scrape, decided from KubeRay's own labels and owners and not from the monitors' selectors: a RayService's pods
    -> rl-platform-serve; the heads / workers of the release's RayCluster and of RayJobs -> rl-platform-head /
    rl-platform-workers."""
    owners = {rc["metadata"]["name"]: ((rc["metadata"].get("ownerReferences") or [{}])[0].get("kind") or "RayCluster")
              for rc in c.ray_list("rayclusters")}
    want = set()
    for p in c.core.list_namespaced_pod(NAMESPACE).items:
        labels = p.metadata.labels or {}
        rc = labels.get("ray.io/cluster")
        if not rc or p.status.phase in ("Succeeded", "Failed") or not p.status.pod_ip or p.metadata.deletion_timestamp:
            continue
        if owners.get(rc) == "RayService":
            monitor = "serve"
        else:
            monitor = {"head": "head", "worker": "workers"}[labels["ray.io/node-type"]]
        want.add((f"podMonitor/{NAMESPACE}/rl-platform-{monitor}/0", p.metadata.name))
    return want


def test_podmonitors_scrape_exactly_the_ray_pods_each_is_meant_for(live_rayservice, tmp_path):
    c, service_cluster = live_rayservice
    env = tool_env("all", "prometheus-k8s")
    # The release exactly as `make deploy-cluster` installs it, with its monitors rendered (the local cluster has no
    # prometheus-operator CRDs, so the deploy leaves them off; the flag changes no pod labels or ports).
    rendered = sh(helm_path(), "template", "rl-platform", str(ROOT / "charts" / "rl-platform"), "--namespace", NAMESPACE,
                  "--kube-version", env["KUBE_VERSION"], "-f", str(ROOT / "k8s" / "values" / "kind.yaml"),
                  "-f", str(ROOT / "k8s" / "values" / "local.yaml"), "--set", "monitoring.enabled=true").stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    monitors = [d for d in docs if d.get("kind") == "PodMonitor"]
    assert monitors, "the chart rendered no PodMonitor with monitoring.enabled=true"
    prom = start_podmonitor_prometheus(env["PROMETHEUS_K8S"], c.kubeconfig, docs, tmp_path / "prom")
    try:
        seen: dict[str, object] = {}

        def same_set():
            want = _intended_targets(c)
            active = prom.targets()
            got = {(t["scrapePool"], t["labels"].get("pod", "")) for t in active}
            seen.update(want=sorted(want), got=sorted(got), down=[(t["scrapePool"], t["labels"].get("pod"), t["lastError"])
                                                                  for t in active if t["health"] != "up"])
            return want if want == got and not seen["down"] else None

        want = wait_until("Prometheus' targets to equal the pods the PodMonitors select, all up", same_set, 300, interval=2,
                          on_timeout=lambda: f"{seen}\n{prom.discovery_report()}")
        assert {job for job, _ in want} >= {f"podMonitor/{NAMESPACE}/rl-platform-{m}/0" for m in ("head", "serve")}, want
        pods = {pod for _, pod in want}
        # What the set must hold on this cluster: the release's head and every pod of the live RayService.
        assert any(p.startswith("rl-platform-head-") for p in pods), sorted(pods)
        service_pods = {p.metadata.name for p in c.pods(f"ray.io/cluster={service_cluster}")}
        assert service_pods and service_pods <= pods, (sorted(service_pods), sorted(pods))
        serve_job = f"podMonitor/{NAMESPACE}/rl-platform-serve/0"
        assert {pod for job, pod in want if job == serve_job} == service_pods, sorted(want)

        def series():
            return prom.query('ray_node_cpu_utilization{ray_io_cluster="rl-platform"}') or None

        got = wait_until("Ray's node metrics scraped from the head pod", series, 180, interval=2)
        labels = got[0]["metric"]
        assert labels["namespace"] == NAMESPACE and labels["ray_io_node_type"] == "head", labels
        assert labels["pod"].startswith("rl-platform-head-"), labels
    finally:
        prom.stop()

