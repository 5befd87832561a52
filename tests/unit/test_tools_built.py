"""`hack/tools.sh built cluster`, which decides whether `make test` runs its suite groups side by side (Makefile
TEST_WORKERS): 0 only when every cluster-phase product is in the cache, 1 when any one is missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _built(cache: Path) -> int:
    env = {**os.environ, "RLP_CACHE": str(cache)}
    return subprocess.run([str(ROOT / "hack" / "tools.sh"), "built", "cluster"], env=env, capture_output=True,
                          timeout=60).returncode


def _products(cache: Path) -> list[Path]:
    env = {**os.environ, "RLP_CACHE": str(cache)}
    out = subprocess.run([str(ROOT / "hack" / "tools.sh"), "env"], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    kv = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
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
