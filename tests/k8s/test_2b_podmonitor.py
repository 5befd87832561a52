"""Level B: the chart's PodMonitors, turned into a Prometheus scrape config as prometheus-operator would
(hack/promconfig.py), discover the release's real Ray head pod through the cluster's apiserver and scrape Ray's
metrics from it, labelled as the dashboards expect. Prometheus is the upstream server with kubernetes_sd
(hack/tools.sh prometheus-k8s), on 127.0.0.1 on the host, which reaches pod IPs on the cluster bridge."""

from __future__ import annotations

import sys

import pytest
import yaml

from kubekit import NAMESPACE, ROOT, Cluster, helm_path, sh, wait_until

sys.path.insert(0, str(ROOT / "tests" / "monitoring"))
sys.path.insert(0, str(ROOT / "tests" / "chart"))
from chartkit import tool_env  # noqa: E402
from promkit import start_podmonitor_prometheus  # noqa: E402


def test_podmonitors_scrape_the_real_head_pod(cluster_b: Cluster, tmp_path):
    if cluster_b.kind != "local":
        pytest.skip("kind: no host route to pod IPs; kube-prometheus-stack covers it there")
    env = tool_env()
    # The release exactly as `make deploy-cluster` installs it, with its monitors rendered (the local cluster has no
    # prometheus-operator CRDs, so the deploy leaves them off; the flag changes no pod labels or ports).
    rendered = sh(helm_path(), "template", "rl-platform", str(ROOT / "charts" / "rl-platform"), "--namespace", NAMESPACE,
                  "--kube-version", env["KUBE_VERSION"], "-f", str(ROOT / "k8s" / "values" / "kind.yaml"),
                  "-f", str(ROOT / "k8s" / "values" / "local.yaml"), "--set", "monitoring.enabled=true").stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    prom = start_podmonitor_prometheus(env["PROMETHEUS_K8S"], cluster_b.kubeconfig, docs, tmp_path / "prom")
    try:
        head_job = next(c["job_name"] for c in prom.config["scrape_configs"] if c["job_name"].endswith("-head/0"))
        prom.wait_for_targets(300, jobs=[head_job])  # raises naming what discovery and the scrapes saw

        def series():
            return prom.query('ray_node_cpu_utilization{ray_io_cluster="rl-platform"}') or None

        got = wait_until("Ray's node metrics scraped from the head pod", series, 180, interval=2)
        labels = got[0]["metric"]
        assert labels["namespace"] == NAMESPACE and labels["ray_io_node_type"] == "head", labels
        assert labels["pod"].startswith("rl-platform-head-"), labels
    finally:
        prom.stop()
