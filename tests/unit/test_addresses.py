"""Every address range this repo puts on the machine (the cluster tier's bridge, pods, Services; the Docker engine that
hack/images.sh starts) comes from the benchmarking range 198.18.0.0/15, none overlaps another, and the engine is
started with them: this machine class forbids traffic to the private ranges even on local bridges, and Docker's own
default bridge is 172.17.0.0/16."""

from __future__ import annotations

import ipaddress
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = ipaddress.ip_network("198.18.0.0/15")


def common(*names: str) -> dict[str, str]:
    script = f"source {ROOT}/hack/cluster/common.sh; " + "; ".join(f'echo "{n}=${{{n}}}"' for n in names)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=30).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_every_range_is_in_198_18_0_0_15_and_none_overlaps_another():
    v = common("NODE_CIDR", "POD_CIDR", "SERVICE_CIDR", "KUBERNETES_SVC_IP", "DNS_SVC_IP", "DOCKER_BRIDGE_IP",
               "DOCKER_ADDRESS_POOL")
    pool = re.fullmatch(r"base=([0-9./]+),size=(\d+)", v["DOCKER_ADDRESS_POOL"])
    assert pool, f"DOCKER_ADDRESS_POOL is not dockerd's base=CIDR,size=N: {v['DOCKER_ADDRESS_POOL']!r}"
    ranges = {
        "node bridge": ipaddress.ip_network(v["NODE_CIDR"]),
        "services": ipaddress.ip_network(v["SERVICE_CIDR"]),
        "docker bridge": ipaddress.ip_interface(v["DOCKER_BRIDGE_IP"]).network,
        "docker pool": ipaddress.ip_network(pool.group(1)),
    }
    outside = {k: str(n) for k, n in ranges.items() if not n.subnet_of(ALLOWED)}
    assert not outside, f"ranges outside {ALLOWED}: {outside}"
    names = list(ranges)
    overlaps = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if ranges[a].overlaps(ranges[b])]
    assert not overlaps, f"overlapping ranges: {overlaps} ({ {k: str(n) for k, n in ranges.items()} })"
    assert int(pool.group(2)) >= ranges["docker pool"].prefixlen, v["DOCKER_ADDRESS_POOL"]
    assert ipaddress.ip_network(v["POD_CIDR"]).subnet_of(ranges["node bridge"]), v
    for ip in ("KUBERNETES_SVC_IP", "DNS_SVC_IP"):
        assert ipaddress.ip_address(v[ip]) in ranges["services"], (ip, v[ip], v["SERVICE_CIDR"])


def test_hack_images_starts_dockerd_on_those_ranges():
    text = (ROOT / "hack/images.sh").read_text()
    starts = [line for line in text.splitlines() if re.search(r"\bdockerd\b", line) and "nohup" in line]
    assert starts, "hack/images.sh no longer starts dockerd with nohup: update this test"
    for line in starts:
        assert '--bip "${DOCKER_BRIDGE_IP}"' in line and '--default-address-pool "${DOCKER_ADDRESS_POOL}"' in line, (
            f"dockerd started without this repo's addresses (Docker's default bridge is 172.17.0.0/16): {line.strip()}")
    assert re.search(r'^source "\$\{ROOT\}/hack/cluster/common.sh"', text, re.M), "hack/images.sh does not read common.sh"
