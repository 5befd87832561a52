"""`make cluster-down` stops everything the local cluster tier started and undoes every host change it made.

Run alone (`pytest tests/k8s/test_3_teardown.py`) it brings the Level B cluster up itself first: the real node makes
the most host changes (hack/cluster/host-changes.sh lists them)."""

from __future__ import annotations

import pytest

from hostsnap import diff, manifest, not_docker, snapshot, state_references
from kubekit import IN_CI, sh
from trainer_helpers import docker_containers_lock


def test_cluster_down_restores_the_host(k8s_session, local_cluster_of_session):
    if k8s_session.preexisting or k8s_session.before is None:
        assert not IN_CI, "a cluster ran before the session and was not brought down"  # conftest brings it down
        pytest.skip("a local cluster was already running before the tests: it is not ours to tear down")
    proc = sh("make", "--no-print-directory", "cluster-down", timeout=600)
    # Any test after this one brings its cluster up again (and a new host picture is taken first).
    k8s_session.clusters = {k: v for k, v in k8s_session.clusters.items() if k[0] != "local"}
    before, k8s_session.before = k8s_session.before, None
    with docker_containers_lock(exclusive=True):  # as the photograph before it (tests/k8s/conftest.py)
        after = snapshot()
    # Nothing may still point into the cluster's state: a daemon, shim or pod process that outlived the tear-down.
    m = manifest()
    refs = state_references(m["run-dir"] + m["cluster-dir"])
    assert not refs, f"processes still refer to the cluster's state after cluster-down: {refs}"
    # Folders the Level B node keeps between runs on purpose (the image store) are not under the paths checked here.
    changed = diff(before, after)
    assert not changed, f"host differs after cluster-down:\n{changed}\n{proc.stderr[-2000:]}"
    # A second cluster-down finds nothing to do and still succeeds.
    again = sh("make", "--no-print-directory", "cluster-down", timeout=120)
    assert "nothing to stop" in again.stderr, again.stderr


def test_the_host_picture_leaves_dockers_bridge_out():
    """Docker's bridge changes on its own (its IPv6 link-local address and routes come with its first container), so
    the picture drops its lines, and only its: a cluster link or route that merely mentions docker stays compared."""
    lines = ["docker0:", "docker0@if3:", "docker0 inet6 fe80::42:1:2:3/64",
             "ipv6 fe80::/64 dev docker0 proto kernel metric 256 pref medium",
             "rlp0:", "rlp0 inet 198.18.0.1/24", "ipv4 198.18.0.0/24 dev rlp0 proto kernel", "mydocker0x:"]
    assert not_docker(lines) == ["rlp0:", "rlp0 inet 198.18.0.1/24", "ipv4 198.18.0.0/24 dev rlp0 proto kernel",
                                 "mydocker0x:"]
