"""hack/tools.sh's cache: `built cluster`, which decides how `make test` lays its suite groups out (Makefile
TEST_LAYOUT cached or cold): 0 only when every cluster-phase product is in the cache, 1 when any one is missing; and a
cached folder without its product is completed by the next run."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _built(cache: Path) -> int:
    env = {**os.environ, "RLP_CACHE": str(cache)}
    return subprocess.run([str(ROOT / "hack" / "tools.sh"), "built", "cluster"], env=env, capture_output=True,
                          timeout=60).returncode


def _paths(cache: Path) -> dict[str, str]:
    """`hack/tools.sh env` for a cache: NAME=path of every product."""
    env = {**os.environ, "RLP_CACHE": str(cache)}
    out = subprocess.run([str(ROOT / "hack" / "tools.sh"), "env"], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _products(cache: Path) -> list[Path]:
    kv = _paths(cache)
    files = [Path(kv[k]) for k in ("ETCD", "KWOK", "COREDNS", "PAUSE_IMAGE_TAR", "KUBERAY_OPERATOR", "PROMETHEUS_K8S",
                                    "KUEUE")]
    return files + [Path(kv["K8S_BIN"]) / b for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                                       "kubectl", "kubelet", "kube-proxy")]


def test_built_only_when_every_cluster_product_is_cached(tmp_path):
    cache = tmp_path / "cache"
    assert _built(cache) == 1  # empty cache: a cold machine
    products = _products(cache)
    for p in products:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")
        p.chmod(0o755)
    assert _built(cache) == 0
    products[-1].unlink()  # one binary missing: still something to compile
    assert _built(cache) == 1


def test_an_incomplete_cached_folder_is_completed_not_kept(tmp_path):
    """A tool's folder that exists without its product (emptied, or left by a killed run) is filled in by the next
    run, keeping what else it holds. Before: the fresh build was thrown away because the folder existed, so every
    run rebuilt helm and the chart suites failed with `HELM ... is missing` (stop 30's CI)."""
    cache = tmp_path / "cache"
    env = {**os.environ, "RLP_CACHE": str(cache)}
    folder = Path(_paths(cache)["K8S_SCHEMAS"])
    folder.mkdir(parents=True)
    (folder / "other").write_text("kept")  # e.g. the cluster phase's bin/ in KubeRay's folder
    run = subprocess.run([str(ROOT / "hack" / "tools.sh"), "k8s-schemas"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert len(list(folder.glob("*-local-strict/*.json"))) > 100
    assert "replacing the incomplete" in run.stderr
    assert (folder / "other").read_text() == "kept"
    assert not list(folder.parent.glob(f"{folder.name}.tmp.*"))  # the staging folder went


def test_coredns_is_built_with_exactly_the_plugins_the_corefile_uses():
    """build_coredns links only COREDNS_PLUGINS: a Corefile directive outside that list would stop the node's CoreDNS
    at start ("Unknown directive"), one inside it that the Corefile no longer uses is build time for nothing."""
    tools = (ROOT / "hack" / "tools.sh").read_text()
    built = re.search(r"^COREDNS_PLUGINS=\(([^)]*)\)", tools, re.M).group(1).split()
    node = (ROOT / "hack" / "cluster" / "node.sh").read_text()
    corefile = re.search(r'cat >"\$\{NODE_DIR\}/Corefile" <<EOF\n(.*?)\nEOF', node, re.S).group(1)
    used = set(re.findall(r"^    (\w+)", corefile, re.M))  # the server block's directives (4 spaces in)
    assert used == set(built), f"Corefile directives {sorted(used)} vs built plugins {sorted(built)}"
