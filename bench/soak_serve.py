#!/usr/bin/env python
"""Soak: steady concurrent load on the policy server for N minutes; errors, latency and memory over time.

    .venv/bin/python bench/soak_serve.py --checkpoint outputs/cartpole_ppo/checkpoints/final [--minutes 5]

What runs: `python -m serving` as `make serve` runs it (embedded Ray, serve_config.yaml, `--ingress direct`
unless told otherwise), `--clients` keep-alive connections sending act requests back to back (serve_bench's raw
HTTP client), and psutil sampling the RSS of the Serve processes (replica, proxy, controller) and the launcher
every `--sample-s` seconds. Expected: 0 errors, and RSS flat: the slope (least squares over the samples after the
first minute's warm-up) is reported in MiB/min per process. A script, not a test; writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from serve_bench import Conn, build_request, ensure_checkpoint, free_ports, pct, stop_server, wait_ready  # noqa: E402

TITLES = ("ray::ServeReplica", "ray::ProxyActor", "ray::ServeController")


def serve_processes(root: int) -> dict[str, psutil.Process]:
    """{role: process} for the launcher and its Serve actors (Ray titles workers `ray::<actor class>:...`)."""
    out = {"launcher": psutil.Process(root)}
    for p in out["launcher"].children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if cmd and cmd[0].startswith(TITLES):
            out[f"{cmd[0].split()[0]}[{p.pid}]"] = p
    return out


def slope_mib_per_min(ts: list[float], mib: list[float]) -> float:
    if len(ts) < 2:
        return 0.0
    return statistics.linear_regression(ts, mib).slope * 60.0


async def load(host: str, port: int, reqs: list[bytes], clients: int, seconds: float) -> dict:
    lat: list[float] = []
    errors: dict[str, int] = {}
    ok = 0
    stop_at = time.perf_counter() + seconds

    async def loop(i: int) -> None:
        nonlocal ok
        c = await Conn.open(host, port)
        k = i
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            try:
                status, body = await asyncio.wait_for(c.roundtrip(reqs[k % len(reqs)]), 30)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                c.close()
                c = await Conn.open(host, port)
                continue
            lat.append((time.perf_counter() - t0) * 1e3)
            k += clients
            if status == 200:
                ok += 1
            else:
                errors[f"HTTP {status}"] = errors.get(f"HTTP {status}", 0) + 1
        c.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(clients)))
    wall = time.perf_counter() - t0
    return {"requests": ok + sum(errors.values()), "ok": ok, "errors": sum(errors.values()),
            "errors_by_kind": errors, "seconds": wall, "req_per_s": ok / wall,
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "max_ms": max(lat) if lat else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=None, help="CartPole checkpoint (default: train one with 1 iteration)")
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling period")
    p.add_argument("--ingress", default="direct", choices=("direct", "proxy"))
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "soak_serve.json"))
    p.add_argument("--keep", action="store_true", help="keep the temp dir (server log, Ray logs, trained checkpoint)")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="soak_", dir="/tmp"))
    ckpt = ensure_checkpoint(args.checkpoint, work)
    import numpy as np

    rng = np.random.default_rng(0)
    observations = (rng.uniform(-1, 1, size=(1000, 4)) * [2.0, 1.0, 0.2, 1.0]).round(5).tolist()

    port, metrics_port, proxy_port = free_ports(3)
    cmd = [sys.executable, "-m", "serving", "--checkpoint", ckpt, "--port", str(port), "--proxy-port",
           str(proxy_port), "--metrics-port", str(metrics_port), "--temp-dir", str(work / "ray"),
           "--ingress", args.ingress]
    print("starting:", " ".join(cmd), flush=True)
    log = open(work / "server.log", "w")
    server = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
    samples: dict[str, list[tuple[float, float]]] = {}
    stop = threading.Event()
    try:
        wait_ready(server, work / "server.log")
        procs = serve_processes(server.pid)
        print("sampling RSS of:", ", ".join(procs), flush=True)
        t_start = time.monotonic()

        def sample() -> None:
            while True:
                t = time.monotonic() - t_start
                for role, proc in procs.items():
                    try:
                        samples.setdefault(role, []).append((t, proc.memory_info().rss / 2**20))
                    except psutil.Error:
                        samples.setdefault(role + " (gone)", []).append((t, 0.0))
                if stop.wait(args.sample_s):
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        reqs = [build_request("127.0.0.1", port, "/v1/policies/default/act", json.dumps({"observation": o}).encode())
                for o in observations]
        res = asyncio.run(load("127.0.0.1", port, reqs, args.clients, args.minutes * 60))
        stop.set()
        sampler.join()
    finally:
        stop.set()
        stop_server(server)
        log.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    warm = min(60.0, args.minutes * 60 / 5)
    rss = {}
    for role, pts in samples.items():
        steady = [(t, m) for t, m in pts if t >= warm] or pts
        rss[role] = {"start_mib": round(pts[0][1], 1), "end_mib": round(pts[-1][1], 1),
                     "max_mib": round(max(m for _, m in pts), 1),
                     "slope_mib_per_min_after_warmup": round(slope_mib_per_min(*map(list, zip(*steady))), 3),
                     "samples": len(pts)}
    result = {
        "benchmark": "soak_serve",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                 "loadavg_at_end": os.getloadavg()},
        "setup": {"minutes": args.minutes, "clients": args.clients, "ingress": args.ingress, "checkpoint": ckpt,
                  "sample_s": args.sample_s, "warmup_s_excluded_from_slope": warm,
                  "client": "asyncio raw HTTP/1.1 keep-alive (serve_bench's), one act observation per request"},
        "load": res,
        "rss": rss,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{res['requests']} requests in {res['seconds']:.0f}s ({res['req_per_s']:.0f} req/s), "
          f"errors {res['errors']} {res['errors_by_kind']}, p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms")
    for role, r in rss.items():
        print(f"  RSS {role}: start {r['start_mib']} MiB, end {r['end_mib']} MiB, max {r['max_mib']} MiB, "
              f"slope {r['slope_mib_per_min_after_warmup']} MiB/min")
    print(f"wrote {args.out}")
    return 0 if res["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
