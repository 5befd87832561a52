"""A normalized picture of the host state the local cluster tier touches, to prove `make cluster-down` undoes it:
network links and addresses, iptables chains and rules (no counters), routes, mounts, network namespaces, the
kernel settings a kubelet changes, kubelet/CNI folders, cgroups, listening sockets and our processes."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
           "kernel/keys/root_maxbytes", "net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables",
           "net/ipv4/conf/all/route_localnet", "net/netfilter/nf_conntrack_max")
PATHS = ("/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/var/lib/cni", "/etc/cni/net.d", "/run/netns",
         "/opt/cni", "/var/run/kubernetes", "/tmp/rl-platform-containerd")
PROCS = re.compile(r"^(etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kube-proxy|kwok|ray-operator|"
                   r"coredns|containerd|containerd-shim.*|pause)$")


def _out(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _iptables() -> list[str]:
    lines = []
    for table_dump in (_out("iptables-save"), _out("ip6tables-save")):
        for line in table_dump.splitlines():
            if line.startswith("#") or line == "COMMIT":
                continue
            # ":CHAIN POLICY [packets:bytes]" -> ":CHAIN POLICY"
            lines.append(re.sub(r" \[\d+:\d+\]$", "", line))
    return sorted(lines)


def _cgroups() -> list[str]:
    found = []
    root = Path("/sys/fs/cgroup")
    if root.is_dir():
        for ctrl in sorted(root.iterdir()):
            for name in ("kubepods", "kubepods.slice", "kube-proxy", "kubelet", "system.slice/containerd.service"):
                if (ctrl / name).exists():
                    found.append(f"{ctrl.name}/{name}")
    return found


def snapshot() -> dict[str, list[str]]:
    sysctls = []
    for s in SYSCTLS:
        p = Path("/proc/sys") / s
        if p.exists():
            try:
                sysctls.append(f"{s}={p.read_text().strip()}")
            except OSError:
                pass
    procs = sorted({(Path(f"/proc/{pid}/comm").read_text().strip()) for pid in os.listdir("/proc")
                    if pid.isdigit() and _readable_comm(pid)} & _proc_names())
    listen = sorted(_listeners())
    return {
        "links": sorted(re.sub(r"^\d+: ", "", line.split("<")[0]).strip() for line in _out("ip", "-o", "link").splitlines()),
        "addresses": sorted(" ".join(line.split()[1:4]) for line in _out("ip", "-o", "addr").splitlines()),
        "routes": sorted(_out("ip", "route").splitlines()),
        "iptables": _iptables(),
        "mounts": sorted(line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()),
        "netns": sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else [],
        "sysctls": sysctls,
        "paths": [p for p in PATHS if os.path.exists(p)],
        "cgroups": _cgroups(),
        "processes": procs,
        "listening": listen,
    }


def _readable_comm(pid: str) -> bool:
    try:
        Path(f"/proc/{pid}/comm").read_text()
        return True
    except OSError:
        return False


def _listeners() -> set[str]:
    """`proto address:port process` of every socket a cluster-tier process (PROCS) listens on. Other processes'
    listeners come and go with whatever else runs on the machine; they are not ours to compare."""
    found = set()
    for line in _out("ss", "-Hltnup").splitlines():
        cols = line.split()
        owner = re.search(r'users:\(\("([^"]+)"', line)
        if len(cols) >= 5 and owner and PROCS.match(owner.group(1)):
            found.add(f"{cols[0]} {cols[4]} {owner.group(1)}")
    return found


def _proc_names() -> set[str]:
    names = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                n = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if PROCS.match(n):
                names.add(n)
    return names


def diff(before: dict[str, list[str]], after: dict[str, list[str]], ignore: dict[str, set[str]] | None = None) -> dict:
    """{key: {"added": [...], "removed": [...]}} for every key that changed (minus `ignore`d items)."""
    out = {}
    for key in before.keys() | after.keys():
        b, a = set(before.get(key, [])), set(after.get(key, []))
        skip = (ignore or {}).get(key, set())
        added, removed = sorted(a - b - skip), sorted(b - a - skip)
        if added or removed:
            out[key] = {"added": added, "removed": removed}
    return out
