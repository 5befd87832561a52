"""What a process tree listens on, and whether each non-loopback listener refuses a caller without the token.

psutil lists the LISTEN sockets of a process and its descendants (Ray's gcs_server, raylet, agents, workers,
Serve replicas). A listener on loopback is reachable only from this machine; one on any other address must
refuse an unauthenticated request: HTTP answers 401/403, Ray's gRPC services UNAUTHENTICATED.
"""

from __future__ import annotations

import http.client
import ipaddress
import urllib.error
import urllib.request
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Listener:
    pid: int
    name: str
    ip: str
    port: int

    @property
    def loopback(self) -> bool:
        addr = ipaddress.ip_address(self.ip)
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return addr.is_loopback

    def __str__(self) -> str:
        return f"{self.name}[{self.pid}] {self.ip}:{self.port}"


def process_tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def listeners(pid: int) -> list[Listener]:
    """LISTEN TCP sockets of `pid` and every descendant (Ray's daemons are children of the driver)."""
    out = []
    for p in process_tree(pid):
        try:
            conns = p.net_connections(kind="inet")
            name = p.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                out.append(Listener(p.pid, name, c.laddr.ip, c.laddr.port))
    return out


def http_status(url: str, headers: dict[str, str] | None = None, timeout: float = 5.0) -> int:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


# A method of each Ray gRPC service a listener may be: GCS, raylet, core worker, Serve replica (inter-deployment).
# Requests are empty; without the token the auth check answers before any handler runs.
GRPC_PROBES = (
    "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
    "/ray.rpc.NodeManagerService/GetSystemConfig",
    "/ray.rpc.CoreWorkerService/NumPendingTasks",
    "/ray.serve.ASGIService/HandleRequest",
)


def grpc_code(host: str, port: int, method: str, token: str | None, timeout: float = 5.0) -> str:
    """gRPC status name of an empty call to `method`, without (token=None) or with the bearer token."""
    import grpc

    meta = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(f"{host}:{port}") as ch:
        call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            call(b"", timeout=timeout, metadata=meta)
            return "OK"
        except grpc.RpcError as e:
            return e.code().name


def token_guarded(host: str, port: int, token: str) -> str | None:
    """How the listener refuses a caller without `token` (and serves one with it), or None if it does not.

    HTTP: 401/403 without the token, another status with it. gRPC: UNAUTHENTICATED without, anything else with.
    """
    try:
        without = http_status(f"http://{host}:{port}/")
    except (OSError, http.client.HTTPException):
        without = None  # not HTTP/1.1: a gRPC (HTTP/2-only) server
    if without is not None:
        with_token = http_status(f"http://{host}:{port}/", {"Authorization": f"Bearer {token}"})
        return f"HTTP {without} without token, {with_token} with" if without in (401, 403) and with_token not in (
            401, 403) else None
    for method in GRPC_PROBES:
        if grpc_code(host, port, method, None) == "UNAUTHENTICATED":
            with_token = grpc_code(host, port, method, token)
            if with_token != "UNAUTHENTICATED":
                return f"gRPC {method}: UNAUTHENTICATED without token, {with_token} with"
    return None


def ray_token(pid: int) -> str | None:
    """The token Ray's daemons were started with (the driver sets it before starting them; same user only)."""
    for p in process_tree(pid):
        try:
            if p.name() in ("gcs_server", "raylet"):
                return p.environ().get("RAY_AUTH_TOKEN")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None
