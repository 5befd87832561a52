"""Level A: the chart and k8s/ manifests on a real API server, scheduler and KubeRay operator, with KWOK fake nodes
(a CPU rollout pool and a GPU learner node carrying `nvidia.com/gpu`, the chart's GPU taint and labels).

`make deploy-cluster` installs the release; then k8s/jobs/pong.yaml, k8s/jobs/cartpole.yaml and
k8s/serve/rayservice.yaml are applied with kubectl exactly as the README says, and every assertion is on what the
real operator created from them.
"""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kubekit import (NAMESPACE, RAY, ROOT, Cluster, all_scheduled, conditions, container_command, dump, first_doc,
                     helm_path, selector_matches, sh, wait_until)

MANIFESTS = ["k8s/jobs/pong.yaml", "k8s/jobs/cartpole.yaml", "k8s/serve/rayservice.yaml"]



def _ray_cluster_of(c: Cluster, kind: str, name: str) -> str | None:
    obj = c.ray(kind, name)
    st = obj.get("status", {})
    if kind == "rayjobs":
        return st.get("rayClusterName")
    for key in ("activeServiceStatus", "pendingServiceStatus"):
        if st.get(key, {}).get("rayClusterName"):
            return st[key]["rayClusterName"]
    return None


@pytest.fixture(scope="module")
def applied(cluster_a: Cluster):
    """Apply the three manifests; wait until the operator made every pod and the scheduler placed them all."""
    c = cluster_a
    if c.kind == "local" and c.level != "a":
        pytest.skip("level A needs the fake CPU pool")
    objs = {p: first_doc(p) for p in MANIFESTS}
    t0 = time.monotonic()
    for p in MANIFESTS:
        c.apply(p)
    names: dict[str, str] = {}  # manifest -> RayCluster name the operator made for it

    def clusters_made():
        for p, d in objs.items():
            plural = "rayjobs" if d["kind"] == "RayJob" else "rayservices"
            rc = _ray_cluster_of(c, plural, d["metadata"]["name"])
            if not rc:
                return False
            names[p] = rc
        return True

    wait_until("the operator to create a RayCluster for each manifest", clusters_made, 120)

    def expected_pods(rc_name: str) -> int:
        rc = c.ray("rayclusters", rc_name)
        return 1 + sum(int(g.get("replicas", 0)) for g in rc["spec"].get("workerGroupSpecs", []))

    def placed():
        for rc in names.values():
            pods = c.pods(f"ray.io/cluster={rc}")
            if len(pods) < expected_pods(rc) or not all_scheduled(pods):
                return False
        return True

    wait_until("every Ray pod of the three manifests to be scheduled", placed, 180)
    c.figures["level_a_apply_to_all_scheduled_s"] = round(time.monotonic() - t0, 1)
    yield c, objs, names
    for p, d in objs.items():
        c.delete_ray("rayjobs" if d["kind"] == "RayJob" else "rayservices", d["metadata"]["name"], wait_pods=False)


def _nodes_by_pool(c: Cluster) -> dict[str, str]:
    return {n: labels.get("rl-platform.io/pool", "") for n, labels in c.node_labels().items()}


def test_namespace_enforces_restricted_pod_security(cluster_a: Cluster):
    ns = cluster_a.core.read_namespace(NAMESPACE)
    assert ns.metadata.labels.get("pod-security.kubernetes.io/enforce") == "restricted", ns.metadata.labels
    # Enforcement is real: the API server rejects a pod that breaks the standard.
    bad = client.V1Pod(metadata=client.V1ObjectMeta(name="psa-probe"), spec=client.V1PodSpec(containers=[
        client.V1Container(name="c", image="psa-probe:never-pulled",
                           security_context=client.V1SecurityContext(privileged=True))]))
    with pytest.raises(ApiException) as e:
        cluster_a.core.create_namespaced_pod(NAMESPACE, bad, dry_run="All")
    assert e.value.status == 403 and "violates PodSecurity" in e.value.body, e.value.body


def test_rollout_workers_only_on_cpu_pool_nodes(applied):
    c, objs, names = applied
    pools = _nodes_by_pool(c)
    rollout = [p for rc in names.values() for p in c.pods(f"ray.io/cluster={rc},ray.io/group=rollout-cpu")]
    assert rollout, "no rollout-cpu worker pods were created"
    for p in rollout:
        assert pools[p.spec.node_name] == "cpu", f"{p.metadata.name} on {p.spec.node_name} ({pools[p.spec.node_name]})"
        limits = p.spec.containers[0].resources.limits or {}
        assert "nvidia.com/gpu" not in limits, f"rollout pod {p.metadata.name} asks for a GPU"


def test_learner_on_gpu_node_with_gpu_limit_and_num_gpus(applied):
    c, objs, names = applied
    pools = _nodes_by_pool(c)
    learners = c.pods(f"ray.io/cluster={names['k8s/jobs/pong.yaml']},ray.io/group=learner-gpu")
    assert len(learners) == 1, [p.metadata.name for p in learners]
    pod = learners[0]
    assert pools[pod.spec.node_name] == "gpu", f"learner on {pod.spec.node_name}"
    ray_ctr = pod.spec.containers[0]
    assert ray_ctr.resources.limits.get("nvidia.com/gpu") == "1", ray_ctr.resources.limits
    cmd = container_command(pod)
    # KubeRay adds --num-gpus from the nvidia.com/gpu limit only when it could parse the group's `resources`.
    assert re.search(r"--num-gpus[= ]1\b", cmd), f"no --num-gpus=1 in the learner's ray start: {cmd}"
    m = re.search(r"--resources[= ]('[^']*'|\"(?:[^\"\\]|\\.)*\"|\S+)", cmd)
    assert m, f"no --resources in the learner's ray start: {cmd}"
    assert json.loads(shlex.split(m.group(1))[0]) == {"learner_pool": 1}, m.group(1)
    tolerations = {(t.key, t.effect) for t in pod.spec.tolerations or []}
    assert ("nvidia.com/gpu", "NoSchedule") in tolerations


def test_heads_never_on_gpu_nodes(applied):
    c, _, names = applied
    pools = _nodes_by_pool(c)
    heads = c.pods("ray.io/node-type=head")
    assert len(heads) >= len(names), "missing head pods"
    for p in heads:
        assert pools[p.spec.node_name] != "gpu", f"head {p.metadata.name} on GPU node {p.spec.node_name}"


def test_operator_accepted_every_object(applied):
    """No ValidationFailed (e.g. a RayJob name over 47 characters) and no operator warning events."""
    c, objs, names = applied
    for p, d in objs.items():
        plural = "rayjobs" if d["kind"] == "RayJob" else "rayservices"
        obj = c.ray(plural, d["metadata"]["name"])
        st = obj.get("status", {})
        assert st.get("jobDeploymentStatus") != "ValidationFailed", dump(st)
        for cond in conditions(obj).values():
            assert "Validation" not in (cond.get("reason") or ""), dump(cond)
        warnings = [e for e in c.events_for(d["metadata"]["name"]) if e.startswith("Warning")]
        assert not [w for w in warnings if "Validation" in w or "Invalid" in w], warnings
    for rc in names.values():
        warnings = [e for e in c.events_for(rc) if e.startswith("Warning")]
        assert not warnings, f"RayCluster {rc}: {warnings}"


def test_operator_parsed_every_group_resources(applied):
    """KubeRay logs 'failed to add accelerator resources' when a group's rayStartParams.resources don't parse."""
    c, *_ = applied
    if c.kind != "local":
        pytest.skip("the operator log is a local file only on the local tier")
    log = (c.kubeconfig.rsplit("/", 1)[0] + "/logs/kuberay-operator.log")
    text = open(log, encoding="utf-8", errors="replace").read()
    assert "failed to add accelerator resources" not in text
    assert "invalid character" not in text


def _rendered_podmonitors(c: Cluster) -> list[dict]:
    helm = helm_path()
    out = sh(helm, "template", "rl-platform", str(ROOT / "charts" / "rl-platform"), "--namespace", NAMESPACE,
             "-f", str(ROOT / "k8s" / "values" / "kind.yaml"), "--set", "monitoring.enabled=true",
             "--show-only", "templates/podmonitors.yaml").stdout
    return [d for d in yaml.safe_load_all(out) if d and d.get("kind") == "PodMonitor"]


def test_every_ray_pod_is_scraped_by_exactly_one_podmonitor_on_its_metrics_port(applied):
    c, _, names = applied
    monitors = _rendered_podmonitors(c)
    assert monitors, "the chart rendered no PodMonitor with monitoring.enabled=true"
    ray_pods = [p for rc in names.values() for p in c.pods(f"ray.io/cluster={rc}")]
    for p in ray_pods:
        labels = p.metadata.labels or {}
        hits = [m["metadata"]["name"] for m in monitors if selector_matches(m["spec"]["selector"], labels)]
        assert len(hits) == 1, f"{p.metadata.name} {labels} matched by {hits}"
        port_names = {pt.name: pt.container_port for ctr in p.spec.containers for pt in ctr.ports or []}
        want = {ep["port"] for m in monitors for ep in m["spec"]["podMetricsEndpoints"]}
        for name in want:
            assert port_names.get(name) == 8080, f"{p.metadata.name}: port {name!r} -> {port_names}"


def test_head_services_expose_ray_ports_inside_the_cluster_only(applied):
    c, objs, names = applied
    svcs = {s.metadata.name: s for s in c.core.list_namespaced_service(NAMESPACE).items}
    for rc in names.values():
        head = [s for n, s in svcs.items() if n.startswith(rc) and n.endswith("head-svc")]
        assert head, f"no head Service for {rc}: {sorted(svcs)}"
        s = head[0]
        assert s.spec.type == "ClusterIP", f"{s.metadata.name} is {s.spec.type}"
        ports = {p.name: p.port for p in s.spec.ports}
        assert ports.get("dashboard") == 8265 and ports.get("gcs-server") == 6379 and ports.get("metrics") == 8080, ports
    # (The RayService's serve Service appears once Serve reports healthy: level B checks it answers.)
    assert all(s.spec.type == "ClusterIP" for s in svcs.values()), {n: s.spec.type for n, s in svcs.items()}


@pytest.fixture
def release_workers(cluster_a: Cluster):
    """The release's RayCluster with one pod in each worker group: k8s/values/local.yaml runs none (a 2-core node),
    and a budget over no pods proves nothing. The groups' sizes are put back afterwards."""
    c = cluster_a
    rc = c.ray("rayclusters", "rl-platform")
    groups = rc["spec"].get("workerGroupSpecs") or []
    assert groups, "the release's RayCluster has no worker groups"
    before = [{k: g.get(k) for k in ("replicas", "minReplicas", "maxReplicas")} for g in groups]
    patch = [{**g, "replicas": max(1, int(g.get("replicas") or 0)),
              "minReplicas": min(1, int(g.get("minReplicas") or 0)), "maxReplicas": max(1, int(g.get("maxReplicas") or 0))}
             for g in groups]
    c.custom.patch_namespaced_custom_object(*RAY, NAMESPACE, "rayclusters", "rl-platform",
                                            {"spec": {"workerGroupSpecs": patch}})
    try:
        yield c
    finally:
        restore = [{**g, **{k: v for k, v in b.items() if v is not None}}
                   for g, b in zip(c.ray("rayclusters", "rl-platform")["spec"]["workerGroupSpecs"], before)]
        c.custom.patch_namespaced_custom_object(*RAY, NAMESPACE, "rayclusters", "rl-platform",
                                                {"spec": {"workerGroupSpecs": restore}})
        want = sum(int(b["replicas"] or 0) for b in before)
        wait_until("the release's workers back to their size", lambda: len(
            [p for p in c.pods("ray.io/cluster=rl-platform,ray.io/node-type=worker")
             if p.metadata.deletion_timestamp is None]) == want, 120)


def test_disruption_budgets_count_the_release_pods_without_warnings(release_workers: Cluster):
    """Every budget of the release selects pods that exist (head and workers), counts them all healthy, and the
    disruption controller reports no warning for it (a RayCluster has no scale subresource: with maxUnavailable it
    would report CalculateExpectedPodCountFailed and block every drain)."""
    c = release_workers
    policy = client.PolicyV1Api(c.api_client)
    seen: dict[str, str] = {}

    def computed():
        pdbs = policy.list_namespaced_pod_disruption_budget(NAMESPACE).items
        if not pdbs:
            return None
        for pdb in pdbs:
            selector = ",".join(f"{k}={v}" for k, v in pdb.spec.selector.match_labels.items())
            pods = [p for p in c.pods(selector) if p.metadata.deletion_timestamp is None]
            st = pdb.status
            seen[pdb.metadata.name] = f"{len(pods)} pods ({selector}); status {st.to_dict() if st else None}"
            if not pods or st is None or st.observed_generation != pdb.metadata.generation:
                return None
            if st.expected_pods != len(pods) or st.current_healthy != len(pods):
                return None
        return pdbs

    pdbs = wait_until("every PodDisruptionBudget to count its (existing) pods", computed, 120,
                      on_timeout=lambda: "\n".join(f"{k}: {v}" for k, v in seen.items()))
    assert {p.metadata.name for p in pdbs} == {"rl-platform-head", "rl-platform-workers"}, seen
    for pdb in pdbs:
        assert pdb.status.expected_pods >= 1, f"{pdb.metadata.name}: {seen[pdb.metadata.name]}"
        warnings = [e for e in c.events_for(pdb.metadata.name) if e.startswith("Warning")]
        assert not warnings, f"{pdb.metadata.name}: {warnings}"
    # The head's budget holds the head (0 may be down); the workers' lets one go at a time.
    by_name = {p.metadata.name: p for p in pdbs}
    assert by_name["rl-platform-head"].status.disruptions_allowed == 0, by_name["rl-platform-head"].status
    assert by_name["rl-platform-workers"].status.disruptions_allowed >= 1, by_name["rl-platform-workers"].status
