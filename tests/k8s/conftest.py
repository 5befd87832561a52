"""Fixtures of the cluster-tier tests: one cluster per kind (`local`: the tier hack/cluster.sh builds from registry
sources; `kind`: a kind cluster where kind can create one), deployed with `make deploy-cluster` as users do.

Level A (test_1_*): KWOK fake nodes, real scheduler and KubeRay operator: placement, validation, admission.
Level B (test_2_*): this machine as a real node: Ray really runs in pods.
test_3_*: `make cluster-down` leaves the host as it found it.
The local cluster needs root (a bridge, a kubelet); without it the tests skip (fail under CI=true).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
import yaml

from hostsnap import snapshot
from kubekit import IN_CI, ROOT, Cluster, sh
from trainer_helpers import docker_containers_lock

FIGURES = ROOT / "bench" / "results" / "cluster_tier.json"


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/k8s/" in str(item.fspath):
            item.add_marker(pytest.mark.k8s)
            # The first test of a level also sets its cluster up (`make deploy-cluster`, bounded at 3600 s): on a cold
            # machine that imports the images into the node's containerd, past pytest's 900 s default. Every wait
            # in the tests themselves has its own deadline.
            item.add_marker(pytest.mark.timeout(3600))


def _skip_or_fail(msg: str):
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


def _kind_unavailable() -> str | None:
    """Why kind cannot create a cluster here (None when it can): a kind binary, a Docker daemon and a node image."""
    kind = shutil.which("kind")
    if not kind:
        return "kind: no `kind` on PATH (laptops: `make kind-tool` and put it on PATH, or install kind)"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "kind: the Docker daemon does not answer"
    if os.environ.get("RLP_TEST_KIND") != "1":
        return "kind: set RLP_TEST_KIND=1 to create a kind cluster (it pulls kindest/node; no registry here)"
    return None


class _Session:
    def __init__(self):
        self.before = None          # host snapshot before the local cluster existed
        self.preexisting = False    # a local cluster was already running: never tear it down
        self.clusters: dict[tuple, Cluster] = {}
        self.figures: dict = {}


@pytest.fixture(scope="session")
def k8s_session():
    s = _Session()
    yield s
    if s.figures:
        FIGURES.parent.mkdir(parents=True, exist_ok=True)
        FIGURES.write_text(json.dumps(s.figures, indent=2, sort_keys=True) + "\n")


def _wait_for_the_binaries(s: _Session, low: bool = False) -> None:
    t0 = time.monotonic()
    # Beside the Python suites (low), only Level A's part: Level B's `make deploy-cluster` waits for its part (and the
    # images), which the background run builds meanwhile.
    low_prio = [str(ROOT / "hack" / "background.sh"), "low"] if low else []
    targets = ("helm", "cluster-a") if low else ("all", "cluster")
    sh(*low_prio, str(ROOT / "hack" / "tools.sh"), *targets, timeout=3000)
    s.figures["tools_wait_s"] = round(time.monotonic() - t0, 1)


def _local_cluster(s: _Session, level: str) -> Cluster:
    if os.geteuid() != 0:
        _skip_or_fail("local cluster tier needs root (it creates a bridge and runs a kubelet)")
    # `make test` builds the cluster tier's binaries in the background (mk/k8s.mk TEST_BACKGROUND). In the cached
    # layout (Makefile TEST_LAYOUT; also `pytest tests/k8s` run by hand) the tier waits for that build first
    # (hack/tools.sh raises its priority while it waits), so that no build runs while the host is photographed. In
    # the cold layout, beside the Python suites, the host is photographed at once, while the background run builds
    # only binaries (the images come after them; hack/images.sh holds the photograph's lock, docker_containers_lock,
    # while it builds: a Docker build's containers touch the host), and the wait leaves the build niced
    # (hack/background.sh low): a raised build takes the Python suites' CPU (bench/results/make_test_cold.json).
    cold = os.environ.get("RLP_TEST_LAYOUT") == "cold"
    if s.before is None and not cold:
        _wait_for_the_binaries(s)
    if s.before is None and IN_CI:
        # CI proves the tear-down on every run: whatever a cluster left before the session (a running one, or the
        # remains of one whose run was killed: daemons, bridge, pods, which `status` does not call running) is
        # brought down first, so the host picture is taken with no cluster (the teardown test never skips under CI).
        sh("make", "--no-print-directory", "cluster-down", timeout=600)
    status = sh(str(ROOT / "hack" / "cluster.sh"), "status", check=False)
    if s.before is None:
        s.preexisting = status.returncode == 0
        if not s.preexisting:
            # A Level B node installs the host packages it lacks (apt: containerd, nftables, ...): installed now, the
            # packages and what they bring are the host before the cluster, not a change the tear-down left behind
            # (a new machine's CI run otherwise sees /etc/nftables.conf and every Docker nft rule "added").
            sh(str(ROOT / "hack" / "cluster" / "node.sh"), "packages", timeout=600)
            with docker_containers_lock(exclusive=True):  # not while the containers suite runs beside (cold layout)
                s.before = snapshot()
        if cold:
            _wait_for_the_binaries(s, low=True)
    t0 = time.monotonic()
    # Exactly what the README tells users: make deploy-cluster (brings the cluster up, installs the release).
    proc = sh("make", "--no-print-directory", "deploy-cluster", "CLUSTER=local", f"LEVEL={level}", timeout=3600)
    s.figures[f"level_{level}_deploy_cluster_s"] = round(time.monotonic() - t0, 1)
    envline = sh(str(ROOT / "hack" / "cluster.sh"), "env").stdout.strip()
    kv = dict(part.split("=", 1) for part in envline.removeprefix("export ").split() if "=" in part)
    bin_dir = kv["PATH"].split(":", 1)[0]
    print(proc.stdout[-2000:])
    return Cluster("local", kv["KUBECONFIG"], bin_dir, level=level, figures=s.figures)


@pytest.fixture(scope="session", params=["local", "kind"])
def cluster_kind(request):
    if request.param == "kind":
        why = _kind_unavailable()
        if why:
            pytest.skip(why)
    return request.param


def _cluster(k8s_session: _Session, kind: str, level: str) -> Cluster:
    key = (kind, level)
    if key not in k8s_session.clusters:
        if kind == "local":
            k8s_session.clusters[key] = _local_cluster(k8s_session, level)
        else:
            sh("make", "deploy-cluster", "CLUSTER=kind", timeout=3600)
            home_kube = os.path.expanduser("~/.kube/config")
            k8s_session.clusters[key] = Cluster("kind", home_kube, os.path.dirname(shutil.which("kubectl") or "/usr/bin/kubectl"),
                                                level=level, figures=k8s_session.figures)
    return k8s_session.clusters[key]


@pytest.fixture(scope="module")
def cluster_a(k8s_session, cluster_kind) -> Cluster:
    """Level A: fake CPU rollout nodes + fake GPU learner node (local), or kind's nodes."""
    return _cluster(k8s_session, cluster_kind, "a")


@pytest.fixture(scope="module")
def cluster_b(k8s_session, cluster_kind) -> Cluster:
    """Level B: this machine as the real CPU node + a fake GPU learner node (local), or kind's nodes."""
    return _cluster(k8s_session, cluster_kind, "b")


@pytest.fixture
def local_cluster_of_session(k8s_session) -> Cluster:
    """The local cluster this session brought up (Level B if it brought up both), or a Level B one brought up now:
    the teardown test runs alone as well as after the others."""
    for level in ("b", "a"):
        if ("local", level) in k8s_session.clusters:
            return k8s_session.clusters[("local", level)]
    return _cluster(k8s_session, "local", "b")  # skips (fails under CI) where the local tier cannot run


@pytest.fixture(scope="session")
def pong_checkpoint(k8s_session, cluster_kind) -> dict:
    """The Pong checkpoint k8s/serve/rayservice.yaml serves, written in this session by the CPU-learner Pong RayJob
    (k8s/values/pong-cpu.yaml, 2 iterations) on the real node: its folder is cleared first, so nothing left by an
    earlier session can stand in for it. Any test that serves Pong on the cluster takes it, whichever runs first."""
    from kubekit import HOST_STORAGE, fresh_start, pong_cpu_job, wait_job
    from rl_checkpoint import FINAL, checkpoint_rel, resolve

    c = _cluster(k8s_session, cluster_kind, "b")
    manifest = pong_cpu_job()
    name = yaml.safe_load(manifest)["metadata"]["name"]
    out = HOST_STORAGE / "results" / "pong"
    applied_at = fresh_start(c, "rayjobs", name, out)
    t0 = time.monotonic()
    c.kubectl("-n", "rl-platform", "apply", "-f", "-", input=manifest)
    wait_job(c, name)
    k8s_session.figures["level_b_pong_cpu_2iter_apply_to_succeeded_s"] = round(time.monotonic() - t0, 1)
    final = resolve(str(out / checkpoint_rel(FINAL)))
    c.delete_ray("rayjobs", name)
    return {"job": name, "applied_at": applied_at, "checkpoint_id": final.checkpoint_id, "metadata": final.metadata}
