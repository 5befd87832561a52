"""`make cluster-down` stops everything the local cluster tier started and undoes every host change it made."""

from __future__ import annotations

import pytest

from hostsnap import diff, snapshot
from kubekit import sh


def test_cluster_down_restores_the_host(k8s_session):
    if not k8s_session.clusters.get(("local", "a")) and not k8s_session.clusters.get(("local", "b")):
        pytest.skip("no local cluster was brought up in this session")
    if k8s_session.preexisting or k8s_session.before is None:
        pytest.skip("a local cluster was already running before the tests: it is not ours to tear down")
    proc = sh("make", "--no-print-directory", "cluster-down", timeout=600)
    after = snapshot()
    # Folders the Level B node keeps between runs on purpose (image store) are not under the paths checked here.
    changed = diff(k8s_session.before, after)
    assert not changed, f"host differs after cluster-down:\n{changed}\n{proc.stderr[-2000:]}"
    # A second cluster-down finds nothing to do and still succeeds.
    again = sh("make", "--no-print-directory", "cluster-down", timeout=120)
    assert "nothing to stop" in again.stderr, again.stderr
