"""The local cluster tier itself: idempotent bring-up, a real versioned API server, ServiceAccount tokens, the KubeRay
CRDs and operator, fake nodes shaped like the chart's pools, and nothing listening beyond this machine."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from kubernetes import client

from kubekit import ROOT, Cluster, sh


@pytest.fixture(scope="module")
def local(cluster_a: Cluster) -> Cluster:
    if cluster_a.kind != "local":
        pytest.skip("checks of the local tier's own processes")
    return cluster_a


def _pids() -> dict[str, str]:
    out = sh(str(ROOT / "hack" / "cluster.sh"), "status").stdout
    return dict(re.findall(r"^(\S+)\s+running \(pid (\d+)\)", out, re.M))


def test_cluster_up_is_idempotent_and_ends_with_the_env_line(local: Cluster):
    before = _pids()
    assert {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kuberay-operator", "kwok"} <= set(before)
    proc = sh(str(ROOT / "hack" / "cluster.sh"), "up", "--level", "a", timeout=600)
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f"export KUBECONFIG={local.kubeconfig} PATH={local.bin_dir}:$PATH", last
    assert _pids() == before, "a second `up` restarted components"
    # The line works as printed: the kubectl and helm it puts on PATH talk to this cluster.
    out = subprocess.run(["bash", "-c", f"{last} && kubectl version -o json && helm version --short"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"gitVersion": "v1.34.' in out.stdout and "v3." in out.stdout, out.stdout


def test_api_server_reports_its_release_version(local: Cluster):
    v = client.VersionApi(local.api_client).get_code()
    assert v.major == "1" and v.minor == "34" and v.git_version.startswith("v1.34."), v


def test_service_account_tokens_authenticate(local: Cluster):
    ns = "default"
    token = local.core.create_namespaced_service_account_token(
        "default", ns, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[],
                                                                                          expiration_seconds=600)))
    cfg = client.Configuration()
    cfg.host = local.api_client.configuration.host
    cfg.ssl_ca_cert = local.api_client.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token.status.token}"}
    review = client.AuthenticationV1Api(client.ApiClient(cfg)).create_self_subject_review(
        client.V1SelfSubjectReview())
    assert review.status.user_info.username == f"system:serviceaccount:{ns}:default", review.status.user_info


def _declared_kuberay() -> dict[str, str]:
    chart = yaml.safe_load((ROOT / "charts" / "rl-platform" / "Chart.yaml").read_text())["annotations"]
    readme = (ROOT / "charts" / "rl-platform" / "README.md").read_text()
    m = re.search(r"KubeRay operator \*\*([0-9.]+)\*\*", readme)
    return {"Chart.yaml": chart["rl-platform.io/kuberay-version"], "chart README": m.group(1) if m else "(none)"}


def test_running_kuberay_operator_is_the_version_the_chart_declares(local: Cluster):
    """The operator every cluster-tier test runs against is the release Chart.yaml and the chart README name:
    the Go build info of the running operator process (`go version -m`), not the binary the cache says it built."""
    pid = _pids().get("kuberay-operator")
    assert pid, "no kuberay-operator process in `hack/cluster.sh status`"
    info = sh("go", "version", "-m", f"/proc/{pid}/exe").stdout
    m = re.search(r"^\s*mod\s+github\.com/ray-project/kuberay/ray-operator\s+v(\S+)", info, re.M)
    assert m, f"the running operator (pid {pid}) is not a ray-operator build:\n{info[:600]}"
    declared = _declared_kuberay()
    assert set(declared.values()) == {m.group(1)}, f"the operator runs KubeRay {m.group(1)}; declared: {declared}"


def test_kuberay_crds_are_served(local: Cluster):
    crds = {c.metadata.name for c in client.ApiextensionsV1Api(local.api_client).list_custom_resource_definition().items}
    assert {"rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io"} <= crds, crds


def test_fake_nodes_carry_the_chart_pools(local: Cluster):
    nodes = {n.metadata.name: n for n in local.core.list_node().items}
    gpu = [n for n in nodes.values() if n.metadata.labels.get("rl-platform.io/pool") == "gpu"]
    cpu = [n for n in nodes.values() if n.metadata.labels.get("rl-platform.io/pool") == "cpu"]
    assert gpu and cpu, sorted(nodes)
    for n in gpu:
        assert n.status.allocatable.get("nvidia.com/gpu") == "1", n.status.allocatable
        assert any(t.key == "nvidia.com/gpu" and t.effect == "NoSchedule" for t in n.spec.taints or [])
    for n in cpu:
        assert "nvidia.com/gpu" not in (n.status.allocatable or {})
        assert not n.spec.taints


def test_control_plane_listens_only_on_this_machine(local: Cluster):
    """Every socket the control plane opened is on loopback or the node bridge (198.18.0.0/15), never on all interfaces."""
    pids = set(_pids().values())
    out = sh("ss", "-Hltnp").stdout
    for line in out.splitlines():
        owners = set(re.findall(r"pid=(\d+)", line))
        if not owners & pids:
            continue
        local_addr = line.split()[3]
        host = local_addr.rsplit(":", 1)[0].strip("[]")
        assert host == "127.0.0.1" or host.startswith("198.18.") or host.startswith("198.19."), line
