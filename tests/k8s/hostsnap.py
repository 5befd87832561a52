"""A normalized picture of the host state the local cluster tier touches, to prove `make cluster-down` undoes it.

What is compared comes from hack/cluster/host-changes.sh, the list node.sh itself records and restores (its
sysctls, host paths, daemons, bridge, state folders), widened where a forgotten change would still show: every
sysctl (not only the listed ones), every iptables/ip6tables/nft rule, IPv4 and IPv6 routes of every table and the
policy rules, links, addresses, mounts, network namespaces, kubepods cgroups, the first level of the folders a
kubelet/containerd/CNI write to, our daemons by pid + command line, their listening sockets, and every process
that still refers to the cluster's state folders. A tool the picture needs that is missing fails the snapshot: a
silently empty section would compare equal.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOST_CHANGES = ROOT / "hack" / "cluster" / "host-changes.sh"
# The tools live in sbin, which a non-login PATH may lack.
TOOL_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin", "/bin"])
TOOLS = ("ip", "ss", "sysctl", "iptables-save", "ip6tables-save")
# Counters and other values that change on their own (node.sh host-snapshot leaves the same ones out).
VOLATILE_SYSCTL = re.compile(r"^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota\.)|kernel\.(ns_last_pid|"
                             r"random\.|pty\.nr|perf_event_max_sample_rate)|net\.netfilter\.nf_conntrack_count)")
# Folders whose first level shows a file or folder a kubelet, containerd or CNI plugin would add outside the list.
WATCHED_DIRS = ("/etc", "/var/lib", "/var/log", "/opt", "/usr/libexec", "/run", "/var/run")
# Runtime folders that are not the cluster's to compare: Docker's own (another test may start the engine meanwhile)
# and util-linux's /run/mount (libmount's utab, made by the first mount on a new machine: debootstrap's in
# hack/images.sh, or node.sh's, and never removed).
NOT_OURS_RUN = re.compile(r"^/(var/)?run/(docker(\.pid|\.sock)?|containerd|mount)$")
# The mounts of Docker's runtime (its default netns appears when the engine first starts: on a new machine's cold
# run, between the tier's photographs).
DOCKER_MOUNT = re.compile(r"^\S+ /(var/)?run/docker/")
# Docker's bridge: its IPv6 link-local address and routes appear when its first container ever starts (on a new
# machine's cold run, the containers suite's, between the tier's photographs); Docker's doing, not the cluster's.
DOCKER_BRIDGE = re.compile(r"(^|\s)docker0([:@\s]|$)")


def not_docker(lines) -> list[str]:
    """`lines` (links, addresses, routes) without those of Docker's bridge."""
    return [line for line in lines if not DOCKER_BRIDGE.search(line)]


class MissingTool(AssertionError):
    pass


def manifest() -> dict[str, list[str]]:
    """hack/cluster/host-changes.sh as {kind: [values]} (sysctl, path, daemon, bridge, run-dir, cluster-dir, ...)."""
    script = f'source "{ROOT}/hack/cluster/common.sh" && source "{HOST_CHANGES}" && host_changes_list'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=30).stdout
    m: dict[str, list[str]] = {}
    for line in out.splitlines():
        kind, _, value = line.partition(" ")
        m.setdefault(kind, []).append(value)
    assert m.get("sysctl") and m.get("path") and m.get("daemon"), f"{HOST_CHANGES}: no list read ({out!r})"
    return m


def tool(name: str) -> str:
    path = shutil.which(name, path=TOOL_PATH)
    if not path:
        raise MissingTool(f"host snapshot: `{name}` is not installed (not on PATH, /usr/sbin or /sbin): without it "
                          f"that part of the host could not be compared (node.sh up installs iptables; "
                          f"apt-get install iptables iproute2 procps)")
    return path


def _out(*cmd: str) -> str:
    proc = subprocess.run([tool(cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"host snapshot: `{' '.join(cmd)}` exited {proc.returncode}: {proc.stderr[-500:]}")
    return proc.stdout


def _iptables() -> list[str]:
    lines = []
    for save in ("iptables-save", "ip6tables-save"):
        table = ""
        for line in _out(save).splitlines():
            if line.startswith("*"):
                table = line[1:]
            if line.startswith("#") or line == "COMMIT":
                continue
            # ":CHAIN POLICY [packets:bytes]" -> ":CHAIN POLICY"; rules are compared with their table.
            lines.append(f"{save} {table} " + re.sub(r" \[\d+:\d+\]$", "", line))
    return sorted(lines)


def _nft() -> list[str]:
    if not shutil.which("nft", path=TOOL_PATH):
        return []  # iptables-legacy hosts: iptables-save above is the whole firewall
    text = _out("nft", "list", "ruleset")
    return sorted({re.sub(r"counter packets \d+ bytes \d+", "counter", line.strip()) for line in text.splitlines()
                   if line.strip() and line.strip() != "}"})


def _sysctls() -> list[str]:
    out = []
    for line in _out("sysctl", "-a").splitlines():
        key = line.split(" = ", 1)[0]
        if VOLATILE_SYSCTL.match(key):
            continue
        # Per-interface keys of links other than ours and the defaults come and go with those links.
        m = re.match(r"^net\.ipv[46]\.(conf|neigh)\.([^.]+)\.", key)
        if m and m.group(2) not in ("all", "default", "lo") and not m.group(2).startswith("rlp"):
            continue
        out.append(re.sub(r"\s+", " ", line).strip())
    return sorted(out)


def _cgroups() -> list[str]:
    root = Path("/sys/fs/cgroup")
    found = []
    for ctrl in sorted(root.iterdir()) if root.is_dir() else []:
        for pattern in ("kubepods*", "*/kubepods*", "kube-proxy", "kubelet*"):
            found += [str(p.relative_to(root)) for p in ctrl.glob(pattern)]
    return sorted(found)


def _processes(names: set[str]) -> list[str]:
    """`pid comm cmdline` of every process named like one of our daemons: a daemon that outlived the tear-down has a
    pid that was not there before, even where another program has the same name (Docker's containerd)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if comm not in names:
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        out.append(f"{pid} {comm} {cmd}")
    return sorted(out)


def state_references(dirs: list[str]) -> list[str]:
    """Processes whose command line, executable, working folder or open files are under one of `dirs`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            targets = [cmd]
            for link in ("exe", "cwd"):
                try:
                    targets.append(os.readlink(f"/proc/{pid}/{link}"))
                except OSError:
                    pass
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
                    except OSError:
                        pass
            except OSError:
                pass
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for d in dirs:
            if any(d in t for t in targets):
                found.append(f"{pid} {comm} -> {d}")
                break
    return sorted(found)


def _first_level() -> list[str]:
    out = []
    for d in WATCHED_DIRS:
        p = Path(d)
        if p.is_dir() and not p.is_symlink():
            out += [str(e) for e in p.iterdir() if not NOT_OURS_RUN.match(str(e))]
    return sorted(out)


def _listeners(names: set[str]) -> list[str]:
    """`proto address:port process` of every socket one of our daemons listens on."""
    found = set()
    for line in _out("ss", "-Hltnup").splitlines():
        cols = line.split()
        owner = re.search(r'users:\(\("([^"]+)"', line)
        if len(cols) >= 5 and owner and owner.group(1) in names:
            found.add(f"{cols[0]} {cols[4]} {owner.group(1)}")
    return sorted(found)


def snapshot() -> dict[str, list[str]]:
    for t in TOOLS:
        tool(t)
    m = manifest()
    daemons = set(m["daemon"])
    sysctls = _sysctls()
    keys = {line.split(" = ", 1)[0] for line in sysctls}
    # The listed sysctls must be readable here, or the list names keys this kernel lacks (a stale list).
    unread = [k for k in m["sysctl"] if k not in keys and not k.startswith(("net.netfilter.", "net.bridge."))]
    assert not unread, f"host snapshot: sysctls of {HOST_CHANGES.name} not readable here: {unread}"
    state_dirs = m["run-dir"] + m["cluster-dir"]
    return {
        "links": sorted(not_docker(re.sub(r"^\d+: ", "", line.split("<")[0]).strip().split("@")[0]
                                   for line in _out("ip", "-o", "link").splitlines())),
        "addresses": sorted(not_docker(" ".join(line.split()[1:4]) for line in _out("ip", "-o", "addr").splitlines())),
        "routes": sorted(not_docker(f"ipv{v} " + re.sub(r" linkdown", "", line) for v in "46"
                                    for line in _out("ip", f"-{v}", "route", "show", "table", "all").splitlines())),
        "rules": sorted(f"ipv{v} {line}" for v in "46" for line in _out("ip", f"-{v}", "rule").splitlines()),
        "iptables": _iptables(),
        "nft": _nft(),
        "mounts": sorted(m for m in (" ".join(line.split()[:3]) for line in Path("/proc/mounts").read_text().splitlines())
                         if not DOCKER_MOUNT.match(m)),
        "netns": sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else [],
        "sysctls": sysctls,
        "paths": [p for p in m["path"] + state_dirs if os.path.exists(p)],
        "dirs": _first_level(),
        "cgroups": _cgroups(),
        "processes": _processes(daemons),
        "listening": _listeners(daemons),
        "state_refs": state_references(state_dirs),
        # Kernel modules load on demand (bridge, br_netfilter, nf_conntrack, ...) and are not unloaded: see ALLOWED.
        "modules": sorted(line.split()[0] for line in Path("/proc/modules").read_text().splitlines())
        if Path("/proc/modules").exists() else [],  # a kernel without loadable modules
    }


# Changes a tear-down does not undo, on purpose: a kernel module the kernel loaded on demand for the first cluster of
# a boot (unloading it could break other users of the module), and the sysctls such a module brings with it.
ALLOWED_ADDED = {"modules"}


def diff(before: dict[str, list[str]], after: dict[str, list[str]], ignore: dict[str, set[str]] | None = None) -> dict:
    """{key: {"added": [...], "removed": [...]}} for every key that changed (minus `ignore`d items and additions that
    ALLOWED_ADDED permits)."""
    out = {}
    new_modules = set(after.get("modules", [])) - set(before.get("modules", []))
    before_keys = {line.split(" = ", 1)[0] for line in before.get("sysctls", [])}
    for key in before.keys() | after.keys():
        b, a = set(before.get(key, [])), set(after.get(key, []))
        skip = (ignore or {}).get(key, set())
        added, removed = sorted(a - b - skip), sorted(b - a - skip)
        if key in ALLOWED_ADDED:
            added = []
        if key == "sysctls" and new_modules:
            added = [s for s in added if s.split(" = ", 1)[0] in before_keys]  # a changed value, not a new key
        if added or removed:
            out[key] = {"added": added, "removed": removed}
    return out
