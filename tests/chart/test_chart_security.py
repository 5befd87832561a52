"""Security properties of every rendering: Ray ports never leave ClusterIP, pods pass the "restricted" Pod Security
Standard (k8s/ files included: shared storage is a claim, never a hostPath volume), and the NetworkPolicy covers every
Ray pod."""

import pytest
import yaml

from chartkit import CI_VALUES, K8S_VALUES, ROOT, k8s_values_stack, pod_templates, pod_templates_with_metadata

K8S_MANIFESTS = sorted([*(ROOT / "k8s" / "jobs").glob("*.yaml"), *(ROOT / "k8s" / "serve").glob("*.yaml")])

pytestmark = pytest.mark.chart

ALL_ON = {"rayJob.enabled": True, "rayService.enabled": True, "monitoring.enabled": True, "storage.enabled": True,
          "autoscaling.enabled": True, "workerGroups.learner-gpu.enabled": True}
CASES = [(p.name, [p], {}) for p in CI_VALUES] + [("everything-on", [], ALL_ON)]


@pytest.mark.parametrize("name, values, sets", CASES, ids=[c[0] for c in CASES])
def test_ray_ports_never_leave_clusterip(tools, name, values, sets):
    docs = tools.render(*values, sets=sets)
    for d in docs:
        if d["kind"] == "Service":
            assert d["spec"].get("type", "ClusterIP") == "ClusterIP", d["metadata"]["name"]
        if d["kind"] == "Ingress":
            pytest.fail(f"an Ingress exposes Ray: {d['metadata']['name']}")
        specs = {"RayCluster": lambda s: s, "RayJob": lambda s: s.get("rayClusterSpec"),
                 "RayService": lambda s: s["rayClusterConfig"]}
        if d["kind"] in specs and specs[d["kind"]](d["spec"]):
            cs = specs[d["kind"]](d["spec"])
            assert cs["headGroupSpec"]["serviceType"] == "ClusterIP"
            assert not cs["headGroupSpec"].get("enableIngress")
            assert "headService" not in cs["headGroupSpec"]
        if d["kind"] == "RayService":
            assert d["spec"].get("serveService", {}).get("spec", {}).get("type", "ClusterIP") == "ClusterIP"


def _pods(docs):
    return [p for d in docs for p in pod_templates_with_metadata(d)]


@pytest.mark.parametrize("name, values, sets", CASES, ids=[c[0] for c in CASES])
def test_pods_pass_the_restricted_pod_security_standard(tools, name, values, sets):
    """The upstream PodSecurity admission checks (k8s.io/pod-security-admission) at level restricted."""
    docs = tools.render(*values, sets=sets)
    pods = _pods(docs)
    assert len(pods) >= 2
    rc, results, err = tools.pod_security(pods)
    assert [r for r in results if not r["allowed"]] == [] and rc == 0, err
    assert len(results) == len(pods)
    for d in docs:
        if d["kind"] == "RayCluster" and d["spec"].get("autoscalerOptions"):
            # KubeRay injects the autoscaler sidecar into the head with this securityContext.
            sc = d["spec"]["autoscalerOptions"]["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
            assert sc["runAsNonRoot"] is True and sc["seccompProfile"]["type"] == "RuntimeDefault"


def test_restricted_check_bites(tools):
    docs = tools.render(sets={"containerSecurityContext": {"allowPrivilegeEscalation": True}})
    rc, results, _ = tools.pod_security(_pods(docs))
    assert rc == 1
    assert all("allowPrivilegeEscalation != false" in r["forbidden"] for r in results)


@pytest.mark.parametrize("values", sorted(K8S_VALUES.glob("*.yaml")), ids=lambda p: p.name)
def test_k8s_values_pods_pass_the_restricted_pod_security_standard(tools, values):
    docs = tools.render(*k8s_values_stack(values))
    pods = _pods(docs)
    assert pods
    rc, results, err = tools.pod_security(pods)
    assert [r for r in results if not r["allowed"]] == [] and rc == 0, err
    for where, _, spec in pods:
        assert all("hostPath" not in v for v in spec.get("volumes", [])), where


@pytest.mark.parametrize("path", K8S_MANIFESTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_k8s_manifests_pass_the_restricted_pod_security_standard(tools, path):
    """What users apply into the namespace `make deploy-cluster` labels enforce=restricted."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    pods = _pods(docs)
    assert pods
    rc, results, err = tools.pod_security(pods)
    assert [r for r in results if not r["allowed"]] == [] and rc == 0, err
    assert len(results) == len(pods)
    assert "hostPath" not in path.read_text()


def test_hostpath_storage_reaches_pods_only_through_a_claim(tools):
    docs = tools.render(sets={"storage.enabled": True, "storage.hostPathVolume.enabled": True})
    (pv,) = [d for d in docs if d["kind"] == "PersistentVolume"]
    (pvc,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert pv["spec"]["hostPath"]["path"] == "/mnt/rl-platform"
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["spec"]["claimRef"] == {"namespace": "rl", "name": pvc["metadata"]["name"]}
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"] and pvc["spec"]["storageClassName"] == ""
    pods = _pods(docs)
    for where, _, spec in pods:
        (storage,) = [v for v in spec["volumes"] if v["name"] == "storage"] if "submitter" not in where else [None]
        assert storage is None or storage == {"name": "storage",
                                              "persistentVolumeClaim": {"claimName": pvc["metadata"]["name"]}}
    rc, results, err = tools.pod_security(pods)
    assert rc == 0, err


def test_network_policy_selects_every_ray_pod(tools):
    docs = tools.render(sets=ALL_ON)
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    pods = [(w, d) for d in docs for w, _ in pod_templates(d)]
    assert len(pods) >= 8
    for d in docs:
        for where, pod in pod_templates(d):
            labels = _pod_labels(d, where)
            assert selector.items() <= labels.items(), where
    ingress = policy["spec"]["ingress"]
    # The only rule without ports is the same-namespace one.
    assert [r for r in ingress if "ports" not in r] == [{"from": [{"podSelector": {}}]}]


def _pod_labels(doc, where):
    spec = doc["spec"]
    if "submitterPodTemplate" in where:
        return spec["submitterPodTemplate"]["metadata"]["labels"]
    cs = {"RayCluster": spec, "RayJob": spec.get("rayClusterSpec"), "RayService": spec.get("rayClusterConfig")}[doc["kind"]]
    if "headGroupSpec" in where:
        return cs["headGroupSpec"]["template"]["metadata"]["labels"]
    group = where.split("[")[-1].rstrip("]")
    return next(g for g in cs["workerGroupSpecs"] if g["groupName"] == group)["template"]["metadata"]["labels"]
