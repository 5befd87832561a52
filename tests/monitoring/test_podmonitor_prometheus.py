"""promkit's PodMonitor Prometheus offline: the upstream Prometheus (hack/tools.sh prometheus-k8s, built with
kubernetes_sd) takes the scrape config hack/promconfig.py generates from the chart's PodMonitors, discovers through a
real kube-apiserver (the cluster tier's binaries, with etcd, on 127.0.0.1; no kubelet) exactly the pods those
PodMonitors select, scrapes them and labels their series as the dashboards expect; and it says clearly when it cannot
discover pods. Scraping pods that KubeRay made on a real node is the cluster tier's job (tests/k8s)."""

from __future__ import annotations

import copy
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from prometheus_client import CollectorRegistry, Counter, start_http_server

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "chart"))

from chartkit import Tools, missing, tool_env  # noqa: E402
from promkit import free_port, free_ports, podmonitor_config, start_podmonitor_prometheus  # noqa: E402
from trainer_helpers import stop_process  # noqa: E402


def service_cidr() -> str:
    """The cluster tier's Service range (hack/cluster/common.sh, its one home)."""
    return subprocess.run(["bash", "-c", f"source {ROOT}/hack/cluster/common.sh; echo $SERVICE_CIDR"], check=True,
                          capture_output=True, text=True, timeout=30).stdout.strip()

# chart: helm renders the PodMonitors. The `tools` fixture may wait for the cluster phase of the background build
# (Go builds, tens of minutes on a cold machine): bounded like the cluster tier's first test, not pytest's 900 s.
pytestmark = [pytest.mark.monitoring, pytest.mark.chart, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def tools() -> Tools:
    # prometheus-k8s is not part of `make tools`: built on first use (cached by version), with kube-apiserver and etcd
    # (cluster-a, below); under `make test` this waits for the background build of both.
    return Tools(tool_env("all", "cluster-a", "prometheus-k8s"))


@pytest.fixture(scope="module")
def rendered(tools) -> list[dict]:
    return tools.render(sets={"monitoring.enabled": True})


def _kubeconfig(path: Path, server: str, token: str = "not-checked-offline", ca: Path | None = None) -> Path:
    trust = {"certificate-authority": str(ca)} if ca else {"insecure-skip-tls-verify": True}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, **trust}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


class ApiServer:
    """etcd + kube-apiserver on 127.0.0.1 ephemeral ports: an admin token, no authorization, no controllers or
    kubelet (a test sets pod status itself). ServiceAccount admission is off: no controller creates `default`."""

    TOKEN = "offline-admin-token"

    def __init__(self, k8s_bin: str, etcd: str, work: Path):
        work.mkdir(parents=True, exist_ok=True)
        client_port, peer_port, self.port = free_ports(3)
        subprocess.run(["openssl", "genrsa", "-out", str(work / "sa.key"), "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(work / "sa.key"), "-pubout", "-out", str(work / "sa.pub")],
                       check=True, capture_output=True)
        (work / "tokens.csv").write_text(f"{self.TOKEN},admin,admin,system:masters\n")
        self.log = open(work / "control-plane.log", "w")
        peer = f"http://127.0.0.1:{peer_port}"
        self.procs = [subprocess.Popen(
            [etcd, "--data-dir", str(work / "etcd"), "--listen-client-urls", f"http://127.0.0.1:{client_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{client_port}", "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}"],
            stdout=self.log, stderr=subprocess.STDOUT)]
        self.procs.append(subprocess.Popen(
            [f"{k8s_bin}/kube-apiserver", "--etcd-servers", f"http://127.0.0.1:{client_port}",
             "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(self.port),
             "--cert-dir", str(work / "certs"), "--token-auth-file", str(work / "tokens.csv"),
             "--authorization-mode", "AlwaysAllow", "--disable-admission-plugins", "ServiceAccount",
             "--service-account-issuer", "https://kubernetes.default.svc",
             "--service-account-key-file", str(work / "sa.pub"),
             "--service-account-signing-key-file", str(work / "sa.key"),
             "--service-cluster-ip-range", service_cidr(), "--endpoint-reconciler-type", "none",
             "--profiling=false"], stdout=self.log, stderr=subprocess.STDOUT))
        try:
            self._wait_ready(180)
        except BaseException:
            self.stop()
            raise
        # The self-signed serving certificate it generated (written with its signing CA) is what clients trust.
        self.kubeconfig = _kubeconfig(work / "kubeconfig", f"https://127.0.0.1:{self.port}", self.TOKEN,
                                      ca=work / "certs" / "apiserver.crt")
        self.core = client.CoreV1Api(config.new_client_from_config(config_file=str(self.kubeconfig)))

    def _wait_ready(self, timeout_s: float) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # its certificate is not written yet at first
        req = urllib.request.Request(f"https://127.0.0.1:{self.port}/readyz",
                                     headers={"Authorization": f"Bearer {self.TOKEN}"})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            try:
                with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.log.flush()
        raise AssertionError(f"kube-apiserver not ready:\n{Path(self.log.name).read_text()[-3000:]}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            stop_process(p, signal.SIGTERM)
        self.log.close()


@pytest.fixture(scope="module")
def apiserver(tools, tmp_path_factory):
    k8s_bin, etcd = tools.env.get("K8S_BIN", ""), tools.env.get("ETCD", "")
    if not (os.path.exists(f"{k8s_bin}/kube-apiserver") and os.path.exists(etcd)):
        missing("kube-apiserver and etcd (the cluster tier's binaries: `make cluster-tools`)")
    api = ApiServer(k8s_bin, etcd, tmp_path_factory.mktemp("apiserver"))
    yield api
    api.stop()


def _pod(template: dict, name: str, extra_labels: dict, metrics_port: int) -> dict:
    """A pod as KubeRay makes it from a rendered group template: its labels plus the ones the operator adds; the
    `metrics` port moved to where this test's exporter listens (every pod here has the IP 127.0.0.1)."""
    spec = copy.deepcopy(template["spec"])
    for c in spec["containers"]:
        for port in c.get("ports", []):
            if port["name"] == "metrics":
                port["containerPort"] = metrics_port
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "labels": {**template["metadata"]["labels"], **extra_labels}}}


def test_podmonitors_discover_select_and_scrape_the_chart_pods(tools, rendered, apiserver, tmp_path):
    (cluster,) = [d for d in rendered if d["kind"] == "RayCluster"]
    name, head_t = cluster["metadata"]["name"], cluster["spec"]["headGroupSpec"]["template"]
    group = cluster["spec"]["workerGroupSpecs"][0]
    # Each pod's metrics port: a real exporter on 127.0.0.1 with one counter naming the pod it stands for.
    registries, servers = {}, []
    for pod in ("head", "worker", "finished-head", "other-release-head"):
        registries[pod] = CollectorRegistry()
        Counter("rlp_offline_probe", "which pod answered", ["as_pod"], registry=registries[pod]).labels(pod).inc()
    ports = {}
    for pod, reg in registries.items():
        ports[pod] = free_port()
        servers.append(start_http_server(ports[pod], addr="127.0.0.1", registry=reg)[0])
    kuberay = {"ray.io/cluster": name}
    pods = {
        "head": _pod(head_t, "head", {**kuberay, "ray.io/node-type": "head", "ray.io/group": "headgroup"},
                     ports["head"]),
        "worker": _pod(group["template"], "worker", {**kuberay, "ray.io/node-type": "worker",
                                                     "ray.io/group": group["groupName"]}, ports["worker"]),
        # Not to be scraped: a pod that finished, and a head of another release in the same namespace.
        "finished-head": _pod(head_t, "finished-head", {**kuberay, "ray.io/node-type": "head"},
                              ports["finished-head"]),
        "other-release-head": _pod(head_t, "other-release-head", {**kuberay, "ray.io/node-type": "head",
                                                                  "app.kubernetes.io/instance": "other"},
                                   ports["other-release-head"]),
    }
    ns = "rl"  # the namespace tools.render renders the chart for
    apiserver.core.create_namespace({"metadata": {"name": ns}})
    for pod, body in pods.items():
        apiserver.core.create_namespaced_pod(ns, body)
        apiserver.core.patch_namespaced_pod_status(pod, ns, {"status": {
            "phase": "Succeeded" if pod == "finished-head" else "Running",
            "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}})
    prom = start_podmonitor_prometheus(tools.path("PROMETHEUS_K8S"), apiserver.kubeconfig, rendered,
                                       tmp_path / "prom", scrape_interval="1s")
    try:
        jobs = {c["job_name"] for c in prom.config["scrape_configs"]}
        head_job, worker_job = (next(j for j in jobs if j.endswith(f"-{s}/0")) for s in ("head", "workers"))
        active = prom.wait_for_targets(120, jobs=[head_job, worker_job])
        assert sorted((t["scrapePool"], t["labels"]["pod"]) for t in active) == \
            [(head_job, "head"), (worker_job, "worker")], prom.discovery_report()
        # What the dashboards filter and group on, from the pod labels (podTargetLabels, jobLabel).
        deadline = time.monotonic() + 60
        while not (series := prom.query("rlp_offline_probe_total")) and time.monotonic() < deadline:
            time.sleep(0.5)
        got = {s["metric"]["as_pod"]: s["metric"] for s in series}
        assert set(got) == {"head", "worker"}, series
        for pod, labels in got.items():
            assert labels["pod"] == pod and labels["namespace"] == ns and labels["endpoint"] == "metrics"
            assert labels["job"] == head_t["metadata"]["labels"]["app.kubernetes.io/instance"]
            assert labels["ray_io_cluster"] == name
            assert labels["container"] == pods[pod]["spec"]["containers"][0]["name"]
        assert got["head"]["ray_io_node_type"] == "head" and got["worker"]["ray_io_node_type"] == "worker"
        assert got["worker"]["rl_platform_io_pool"] == group["template"]["metadata"]["labels"]["rl-platform.io/pool"]
    finally:
        prom.stop()
        for server in servers:
            server.shutdown()


def test_upstream_build_has_kubernetes_sd_and_says_its_version(tools):
    out = subprocess.run([tools.path("PROMETHEUS_K8S"), "--version"], capture_output=True, text=True, check=True)
    assert f"version {tools.env['PROMETHEUS_K8S_VERSION']} " in out.stdout, out.stdout
    assert "enable_kubernetes_sd" in out.stdout, out.stdout


def test_upstream_promtool_accepts_the_podmonitor_config(tools, rendered, tmp_path):
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:6443")
    config = podmonitor_config(rendered, kubeconfig, scrape_interval="2s")
    assert len(config["scrape_configs"]) == 3
    for job in config["scrape_configs"]:
        assert job["scrape_interval"] == "2s" and "scrape_timeout" not in job
        assert [sd["kubeconfig_file"] for sd in job["kubernetes_sd_configs"]] == [str(kubeconfig)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = subprocess.run([tools.path("PROMTOOL_K8S"), "check", "config", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_unreachable_apiserver_is_reported_and_prometheus_stops_on_sigterm(tools, rendered, tmp_path):
    # Nothing listens on this port: every LIST/WATCH of pods fails.
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{free_port()}")
    prom = start_podmonitor_prometheus(tools.path("PROMETHEUS_K8S"), kubeconfig, rendered, tmp_path / "prom")
    try:
        loaded = yaml.safe_load(prom.api("status/config")["yaml"])
        assert {sd["kubeconfig_file"] for j in loaded["scrape_configs"] for sd in j["kubernetes_sd_configs"]} == \
            {str(kubeconfig)}
        assert prom.targets() == []
        deadline = time.monotonic() + 60
        while "'<error>'" not in (report := prom.discovery_report()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "'<error>'" in report, report
        with pytest.raises(AssertionError) as err:
            prom.wait_for_targets(timeout_s=1)
        assert "'<error>'" in str(err.value) and "podMonitor/rl/rlp-rl-platform-head/0" in str(err.value), err.value
    finally:
        prom.stop()
    assert prom.proc.returncode == 0, prom.log_tail()


def test_unreadable_kubeconfig_fails_start_in_one_line(tools, rendered, tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [\n")
    with pytest.raises(ValueError, match=r"kubernetes_sd could not start: .*error loading config file") as err:
        start_podmonitor_prometheus(tools.path("PROMETHEUS_K8S"), bad, rendered, tmp_path / "prom")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="no such file"):
        podmonitor_config(rendered, tmp_path / "absent")
