"""kubeconform -strict of every rendering and every file under k8s/ against Kubernetes, KubeRay, prometheus-operator
and Kueue schemas (all offline, built by `make tools`)."""

import pytest
import yaml

from chartkit import CI_VALUES, K8S_VALUES, ROOT, k8s_values_stack

pytestmark = pytest.mark.chart

K8S_MANIFESTS = sorted(p for p in (ROOT / "k8s").rglob("*.yaml") if p.parent.name not in ("values", "kind"))


def _assert_all_valid(rc, resources, out, expected_kinds=()):
    assert rc == 0, out
    resources = [r for r in resources if r["kind"] or r["status"]]  # comment-only documents
    statuses = {r["status"] for r in resources}
    # -strict + no skips: a resource without a schema ("statusSkipped") would pass silently otherwise.
    assert statuses == {"statusValid"}, out
    kinds = {r["kind"] for r in resources}
    assert set(expected_kinds) <= kinds, (kinds, out)


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda p: p.name if p else "defaults")
def test_rendered_chart_is_valid(tools, values):
    manifest = tools.template(*([values] if values else [])).stdout
    rc, resources, out = tools.kubeconform(stdin=manifest)
    expected = ["RayCluster", "ServiceAccount", "NetworkPolicy", "PodDisruptionBudget"]
    if values and values.name == "monitoring-on-values.yaml":
        expected += ["PodMonitor", "PrometheusRule", "ConfigMap", "RayService"]
    if values and values.name == "gpu-learners-values.yaml":
        expected += ["RayJob", "PersistentVolumeClaim"]
    if values and values.name == "kueue-values.yaml":
        expected += ["RayJob", "LocalQueue", "ClusterQueue", "ResourceFlavor", "WorkloadPriorityClass"]
    if values and values.name == "hostpath-storage-values.yaml":
        expected += ["PersistentVolume", "PersistentVolumeClaim"]
    _assert_all_valid(rc, resources, out, expected)


@pytest.mark.parametrize("values", sorted(K8S_VALUES.glob("*.yaml")), ids=lambda p: f"k8s/values/{p.name}")
def test_k8s_values_render_valid_manifests(tools, values):
    rc, resources, out = tools.kubeconform(stdin=tools.template(*k8s_values_stack(values)).stdout)
    _assert_all_valid(rc, resources, out)
    assert resources


def test_k8s_manifests_exist():
    names = {p.relative_to(ROOT).as_posix() for p in K8S_MANIFESTS}
    assert {"k8s/jobs/pong.yaml", "k8s/jobs/cartpole.yaml", "k8s/serve/rayservice.yaml"} <= names


@pytest.mark.parametrize("path", K8S_MANIFESTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_k8s_manifest_is_valid(tools, path):
    rc, resources, out = tools.kubeconform(str(path))
    _assert_all_valid(rc, resources, out)
    assert len(resources) == len([d for d in yaml.safe_load_all(path.read_text()) if d])


@pytest.mark.parametrize(
    "kind, needle, replacement",
    [
        ("RayCluster", "    serviceType: ClusterIP\n", "    serviceType: ClusterIP\n    bogusField: 1\n"),
        ("RayCluster", "      replicas: 2\n", "      replicas: \"two\"\n"),
        ("PodDisruptionBudget", "  minAvailable: 1\n", "  minAvailable: 1\n  minAvailabel: 1\n"),
        ("ServiceAccount", "automountServiceAccountToken: false", "automountServiceAccountToken: nope"),
    ],
    ids=["unknown-field-in-raycluster", "wrong-type-in-raycluster", "typo-in-pdb", "wrong-type-in-core"],
)
def test_kubeconform_rejects_a_broken_manifest(tools, kind, needle, replacement):
    manifest = tools.template().stdout
    assert needle in manifest
    rc, resources, out = tools.kubeconform(stdin=manifest.replace(needle, replacement, 1))
    assert rc != 0
    assert any(r["kind"] == kind and r["status"] == "statusInvalid" for r in resources), out


def test_kubeconform_rejects_a_broken_podmonitor(tools):
    from chartkit import CHART

    manifest = tools.template(CHART / "ci" / "monitoring-on-values.yaml").stdout
    rc, resources, out = tools.kubeconform(stdin=manifest.replace("  jobLabel:", "  jobLable:", 1))
    assert rc != 0
    assert any(r["kind"] == "PodMonitor" and r["status"] == "statusInvalid" for r in resources), out
