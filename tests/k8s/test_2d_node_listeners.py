"""Level B: what the real node's own daemons listen on (hack/cluster/node.sh: containerd, kubelet, kube-proxy,
CoreDNS). Each socket is on loopback or the node bridge address, never on all interfaces; the exposed set (bridge
address) is exactly the kubelet's API and CoreDNS, and the kubelet refuses a caller without a client certificate.
The control plane's sockets are checked at Level A (test_0_cluster.py)."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import subprocess
from pathlib import Path

import psutil
import pytest

from kubekit import ROOT, Cluster

DAEMONS = ("containerd", "kubelet", "kube-proxy", "coredns")


def _common(name: str) -> str:
    return subprocess.run(["bash", "-c", f'source "{ROOT}/hack/cluster/common.sh" && printf %s "${{{name}}}"'],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def node(cluster_b: Cluster) -> dict[str, int]:
    if cluster_b.kind != "local":
        pytest.skip("the local tier's own node daemons")
    pids_dir = Path(cluster_b.kubeconfig).parent / "pids"
    pids = {}
    for d in DAEMONS:
        f = pids_dir / f"{d}.pid"
        assert f.exists(), f"no {f}: node.sh did not start {d}"
        pids[d] = int(f.read_text().strip())
        assert psutil.pid_exists(pids[d]), f"{d} (pid {pids[d]}) is not running"
    return pids


def _sockets(pid: int) -> set[tuple[str, str, int]]:
    """(tcp|udp, address, port) of every TCP listener and bound UDP socket of `pid`."""
    out = set()
    for c in psutil.Process(pid).net_connections(kind="inet"):
        if c.type == socket.SOCK_STREAM and c.status == psutil.CONN_LISTEN:
            out.add(("tcp", c.laddr.ip, c.laddr.port))
        elif c.type == socket.SOCK_DGRAM and not c.raddr:
            out.add(("udp", c.laddr.ip, c.laddr.port))
    return out


def test_node_daemons_listen_on_loopback_or_the_bridge_and_expose_only_kubelet_and_dns(node: dict[str, int]):
    node_ip = _common("NODE_IP")
    found = {d: _sockets(pid) for d, pid in node.items()}
    flat = [(d, *s) for d, socks in found.items() for s in socks]
    # Every daemon has its health/metrics sockets (kubelet 2, kube-proxy 2, CoreDNS 4, containerd 1: seen 9).
    assert len(flat) >= 9 and all(found.values()), found
    wild = [s for s in flat if ipaddress.ip_address(s[2]).is_unspecified]
    assert not wild, f"listening on all interfaces: {wild}"
    elsewhere = [s for s in flat if not ipaddress.ip_address(s[2]).is_loopback and s[2] != node_ip]
    assert not elsewhere, f"listening beyond loopback and the node bridge {node_ip}: {elsewhere}"
    exposed = {s for s in flat if s[2] == node_ip}
    assert exposed == {("kubelet", "tcp", node_ip, 10250), ("coredns", "tcp", node_ip, 53),
                       ("coredns", "udp", node_ip, 53)}, exposed


def test_kubelet_api_refuses_a_caller_without_a_client_certificate(node: dict[str, int]):
    node_ip = _common("NODE_IP")
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((node_ip, 10250), timeout=10) as raw, ctx.wrap_socket(raw) as s:
        s.sendall(f"GET /pods HTTP/1.1\r\nHost: {node_ip}\r\nConnection: close\r\n\r\n".encode())
        status = s.recv(200).decode(errors="replace").split("\r\n", 1)[0]
    assert status.split()[1] in ("401", "403"), status
