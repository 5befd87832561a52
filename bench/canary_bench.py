#!/usr/bin/env python
"""What a candidate costs the champion's traffic: the policy server with no candidate vs a 10% split vs a shadow
candidate mirroring every request, side by side in one run. A script, not a test; writes JSON.

    .venv/bin/python bench/canary_bench.py --checkpoint outputs/cartpole_ppo/checkpoints/final   (make canary-bench)

Three `python -m serving` processes (embedded Ray each, the one serve_config.yaml, `--ingress direct`) serve the
same CartPole checkpoint as champion; the candidate is a copy of it under another checkpoint_id (so its forward
costs exactly the same, and shadow agreement must be 1.0). Their phases alternate run by run (baseline, split, shadow, baseline,
...) on the same client (serve_bench's raw keep-alive HTTP/1.1 client), so the shared machine's noise falls on
all three alike; the figures that matter are the ratios to the baseline:

    split_10:  sequential p50 and 8-client throughput with weight 0.1 (a tenth of the requests on the candidate)
    shadow:    the champion's sequential p50 with every request mirrored to the candidate off the critical path

Goals (issue 20): split costs <= 5% (p50 and throughput); shadow's champion p50 within 10% of no shadow.
Requests carry no session id (split per request); one sequential run per phase uses a session id per 100
requests to include the sticky table's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import benchkit  # noqa: E402
from serve_bench import build_request, concurrent, ensure_checkpoint, pct, sequential, stop_server, wait_ready  # noqa: E402
from trainer_helpers import free_ports  # noqa: E402

VARIANTS = {
    "baseline": None,
    "split_10": {"weight": 0.1, "mode": "split"},
    "shadow": {"weight": 1.0, "mode": "shadow"},
}


def twin_candidate(champion: str, work: Path) -> str:
    """The champion's checkpoint copied under a new checkpoint_id: the same module, so the candidate's forward
    costs exactly the champion's and a shadow run must agree on every action."""
    import dataclasses

    from rl_checkpoint import Storage, resolve, write_metadata

    out = work / "candidate"
    shutil.copytree(champion, out)
    meta = resolve(str(out)).metadata
    write_metadata(Storage.open(str(out)), dataclasses.replace(meta, checkpoint_id=meta.checkpoint_id + "-twin"))
    return str(out)


def write_config(path: Path, champion: str, candidate: str, variant: dict | None) -> None:
    from serving import launch

    cfg = launch.with_overrides(launch.load_config(), policies={"default": champion})
    if variant is not None:
        dep = launch.policy_deployment(cfg)
        dep["user_config"]["policies"]["default"]["candidate"] = {"checkpoint": candidate, **variant}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def shadow_counts(metrics_url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("ray_rl_serve_shadow_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=None, help="CartPole checkpoint (default: train one with 1 iteration)")
    p.add_argument("--sequential", type=int, default=2000, help="requests per sequential run")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each concurrent run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="canary_bench_"))
    champion = ensure_checkpoint(args.checkpoint, work)
    candidate = twin_candidate(champion, work)

    import numpy as np

    rng = np.random.default_rng(0)
    observations = (rng.uniform(-1, 1, size=(1000, 4)) * [2.0, 1.0, 0.2, 1.0]).round(5).tolist()
    servers: dict[str, dict] = {}
    logs = []
    try:
        for name, variant in VARIANTS.items():
            port, metrics_port, proxy_port = free_ports(3)
            cfg = work / f"{name}.yaml"
            write_config(cfg, champion, candidate, variant)
            log = open(work / f"{name}.log", "w")
            logs.append(log)
            cmd = [sys.executable, "-m", "serving", "--config", str(cfg), "--port", str(port), "--proxy-port",
                   str(proxy_port), "--metrics-port", str(metrics_port), "--temp-dir", str(work / f"ray_{name}"),
                   "--num-cpus", "2", "--no-watch"]
            print(f"starting {name}:", " ".join(cmd), flush=True)
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
            servers[name] = {"proc": proc, "port": port, "metrics": f"http://127.0.0.1:{metrics_port}/metrics"}
            wait_ready(proc, work / f"{name}.log")
        host, path = "127.0.0.1", "/v1/policies/default/act"
        results: dict[str, dict[str, list]] = {n: {"seq": [], "seq_sessions": [], "conc": []} for n in servers}
        for r in range(args.repeats):
            for name, s in servers.items():
                reqs = [build_request(host, s["port"], path, json.dumps({"observation": o}).encode())
                        for o in observations]
                n = args.sequential + 200
                lat = asyncio.run(sequential(host, s["port"], [reqs[i % len(reqs)] for i in range(n)], 200))
                results[name]["seq"].append({"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "n": len(lat)})
                sreqs = [build_request(host, s["port"], path, json.dumps(
                    {"observation": observations[i % len(observations)], "session_id": f"r{r}-s{i // 100}"}).encode())
                    for i in range(n)]
                lat = asyncio.run(sequential(host, s["port"], sreqs, 200))
                results[name]["seq_sessions"].append({"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "n": len(lat)})
                res = asyncio.run(concurrent(host, s["port"], reqs, args.clients, args.seconds))
                if res["errors"]:
                    raise SystemExit(f"{name}: {res['errors']} failed requests under load")
                results[name]["conc"].append(res)
                print(f"  run {r + 1} {name:9s}: seq p50 {results[name]['seq'][-1]['p50_ms']:.3f} ms  "
                      f"(sessions {results[name]['seq_sessions'][-1]['p50_ms']:.3f} ms)  "
                      f"{args.clients} clients {res['req_per_s']:.0f} req/s p50 {res['p50_ms']:.2f} ms", flush=True)
        shadow = shadow_counts(servers["shadow"]["metrics"])
    finally:
        for s in servers.values():
            stop_server(s["proc"])
        for log in logs:
            log.close()

    med = statistics.median
    summary = {}
    for name, r in results.items():
        summary[name] = {"sequential_p50_ms": med(x["p50_ms"] for x in r["seq"]),
                         "sequential_p99_ms": med(x["p99_ms"] for x in r["seq"]),
                         "sequential_sessions_p50_ms": med(x["p50_ms"] for x in r["seq_sessions"]),
                         "req_per_s": med(x["req_per_s"] for x in r["conc"]),
                         "concurrent_p50_ms": med(x["p50_ms"] for x in r["conc"]), "runs": r}
    base = summary["baseline"]
    ratios = {name: {"sequential_p50": round(s["sequential_p50_ms"] / base["sequential_p50_ms"], 3),
                     "sequential_sessions_p50": round(s["sequential_sessions_p50_ms"] / base["sequential_sessions_p50_ms"], 3),
                     "req_per_s": round(s["req_per_s"] / base["req_per_s"], 3)}
              for name, s in summary.items() if name != "baseline"}
    compared = shadow.get("agree", 0.0) + shadow.get("disagree", 0.0)
    result = {
        "benchmark": "canary_bench",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": benchkit.machine(load_before),
        "setup": {"champion": champion, "candidate": "copy of the champion under another checkpoint_id", "clients": args.clients,
                  "sequential_requests": args.sequential, "concurrent_seconds": args.seconds, "repeats": args.repeats,
                  "variants": VARIANTS, "ingress": "direct",
                  "order": "baseline, split_10, shadow alternating per run, one client"},
        "summary": summary,
        "ratios_to_baseline": ratios,
        "shadow_outcomes": {**shadow, "mirrored_share": round(compared / max(1.0, sum(shadow.values())), 3)},
        "goals": {"split_10_cost_max": 0.05, "shadow_p50_cost_max": 0.10,
                  "met": bool(ratios["split_10"]["sequential_p50"] <= 1.05 and ratios["split_10"]["req_per_s"] >= 0.95
                              and ratios["shadow"]["sequential_p50"] <= 1.10)},
    }
    if args.keep:
        print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    benchkit.write("canary_bench", result)
    print(json.dumps({"ratios_to_baseline": ratios, "shadow_outcomes": result["shadow_outcomes"],
                      "goals": result["goals"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
