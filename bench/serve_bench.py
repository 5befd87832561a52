#!/usr/bin/env python
"""Policy-server benchmark: sequential latency and concurrent throughput over real HTTP, next to the
in-process floor for the same module, measured in the same run. A script, not a test; writes JSON.

    .venv/bin/python bench/serve_bench.py --checkpoint outputs/cartpole_ppo/checkpoints/final
    (make serve-bench)

What runs: `python -m serving` in a subprocess (embedded Ray, the one serve_config.yaml, validation and metrics
on, `--ingress direct` unless told otherwise). Clients are a minimal asyncio HTTP/1.1 keep-alive client with
pre-built requests, so the figures measure the server rather than a Python HTTP library; every response's
status is checked. Each phase runs `--repeats` times; the JSON holds every run and the medians.

Where the time goes is reported from three vantage points: the in-process floors (forward_inference alone;
validation + forward + JSON as the replica does it), the replica's own request latency (mean of the
`ray_rl_serve_request_latency_ms` histogram over the sequential phase, scraped from Ray's metrics port) and
the client's round trip. Round trip minus replica time = HTTP server + Serve's request path + kernel + client.

Baseline in the same run and client: bench/bare_asgi_server.py, a bare ASGI app on uvicorn doing the same
validation + inference + JSON without Serve; its phases alternate with Serve's (`--no-baseline` skips it).

Transition logging (user_config.log, serving/transitions.py): the same server also runs the sequential and
concurrent phases with session requests (a new session every 50 steps, as episode-playing clients send them),
with logging off and at sample_rate 1.0 (every step a Parquet row, default flush settings), switched by a config
reload between phases; the JSON reports both side by side and their ratios (`--no-log-compare` skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import queue
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

# Ports outside the ranges Ray and the kernel pick from (a released ephemeral port can be taken by a Ray process
# before the server binds it): the one port helper the tests use.
from trainer_helpers import free_ports  # noqa: E402

LOG_EPISODE_STEPS = 50  # session requests: a new session id every this many steps


def stop_server(server: subprocess.Popen) -> None:
    """`python -m serving` stops cleanly on SIGINT (Serve shut down, Ray stopped); SIGKILL after 60 s."""
    server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()


def wait_ready(server: subprocess.Popen, log_path: Path, timeout_s: float = 240) -> None:
    """Read `python -m serving`'s stdout until its `{"event": "ready", ...}` line (it exits or times out otherwise)."""
    deadline = time.monotonic() + timeout_s
    while True:
        line = server.stdout.readline()
        if not line:
            raise SystemExit(f"server exited ({server.poll()}); log: {log_path}")
        if line.startswith('{"event": "ready"'):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"server not ready in {timeout_s:.0f} s; log: {log_path}")


def read_lines(server: subprocess.Popen) -> "queue.Queue[str | None]":
    """`python -m serving`'s further stdout lines, read by a thread (None at EOF), so waiting can time out."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in server.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def wait_event(server: subprocess.Popen, lines: "queue.Queue[str | None]", event: str, log_path: Path,
               timeout_s: float) -> None:
    """Wait for the server's `{"event": "<event>", ...}` line; a refused reload or an exit ends the benchmark."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise SystemExit(f"server: no {event!r} event in {timeout_s:.0f} s; log: {log_path}") from None
        if line is None:
            raise SystemExit(f"server exited ({server.wait()}); log: {log_path}")
        if line.startswith(f'{{"event": "{event}"'):
            return
        if line.startswith('{"event": "reload_failed"'):
            raise SystemExit(f"server refused the config: {line.strip()}")


def reload_with_log(server: subprocess.Popen, lines: "queue.Queue[str | None]", path: Path, log_uri: str | None,
                    log_path: Path) -> None:
    """Logging on (at `log_uri`) or off, applied by a SIGHUP reload (the server runs with --no-watch)."""
    write_config(path, log_uri)
    server.send_signal(signal.SIGHUP)
    wait_event(server, lines, "reloaded", log_path, 180)


def write_config(path: Path, log_uri: str | None) -> None:
    """The one serve_config.yaml, with transition logging on (at `log_uri`, sample_rate 1.0) or off."""
    import yaml

    from serving import launch

    cfg = launch.load_config()
    if log_uri is not None:
        launch.policy_deployment(cfg).setdefault("user_config", {})["log"] = {"uri": log_uri, "sample_rate": 1.0}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))
    os.replace(tmp, path)  # the server's config watcher never reads half a file


def scrape_log_rows(metrics_url: str) -> dict[str, float]:
    """ray_rl_serve_log_rows_total by result, summed over replicas and policies."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'ray_rl_serve_log_rows_total\{.*result="(\w+)".*\} (\S+)$', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q / 100.0 * (len(xs) - 1)))))]


# ------------------------------------------------------------------------------------------ raw HTTP client


class Conn:
    """One keep-alive HTTP/1.1 connection sending a pre-built request and reading Content-Length bodies."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.r, self.w = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> "Conn":
        r, w = await asyncio.open_connection(host, port)
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(r, w)

    async def roundtrip(self, req: bytes) -> tuple[int, bytes]:
        self.w.write(req)
        head = await self.r.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        m = re.search(rb"(?i)content-length:\s*(\d+)", head)
        body = await self.r.readexactly(int(m.group(1))) if m else b""
        return status, body

    def close(self) -> None:
        self.w.close()


def build_request(host: str, port: int, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def sequential(host: str, port: int, reqs: list[bytes], warmup: int) -> list[float]:
    c = await Conn.open(host, port)
    lat = []
    try:
        for i, req in enumerate(reqs):
            t0 = time.perf_counter()
            status, body = await c.roundtrip(req)
            dt = time.perf_counter() - t0
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
            if i >= warmup:
                lat.append(dt * 1e3)
    finally:
        c.close()
    return lat


async def concurrent(host: str, port: int, reqs: list[bytes], clients: int, seconds: float) -> dict:
    conns = [await Conn.open(host, port) for _ in range(clients)]
    counts = [0] * clients
    lat: list[float] = []
    errors = 0
    stop_at = 0.0

    async def loop(i: int) -> None:
        nonlocal errors
        c, n = conns[i], len(reqs)
        k = i
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            status, _ = await c.roundtrip(reqs[k % n])
            lat.append((time.perf_counter() - t0) * 1e3)
            k += clients
            if status == 200:
                counts[i] += 1
            else:
                errors += 1

    # Warm every connection, then measure.
    for c in conns:
        await c.roundtrip(reqs[0])
    stop_at = time.perf_counter() + seconds
    t0 = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(clients)))
    wall = time.perf_counter() - t0
    for c in conns:
        c.close()
    return {"requests": sum(counts), "errors": errors, "seconds": wall, "req_per_s": sum(counts) / wall,
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}


# ------------------------------------------------------------------------------------------ metrics scrape


def scrape_latency(metrics_url: str, endpoint: str = "act") -> tuple[float, float]:
    """(sum_ms, count) of ray_rl_serve_request_latency_ms for status-agnostic `endpoint`, summed over replicas."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    s = c = 0.0
    for line in text.splitlines():
        if line.startswith("ray_rl_serve_request_latency_ms_") and f'endpoint="{endpoint}"' in line:
            val = float(line.rsplit(" ", 1)[1])
            if line.startswith("ray_rl_serve_request_latency_ms_sum"):
                s += val
            elif line.startswith("ray_rl_serve_request_latency_ms_count"):
                c += val
    return s, c


def wait_metric_count(metrics_url: str, at_least: float, timeout_s: float = 30.0) -> tuple[float, float]:
    deadline = time.monotonic() + timeout_s
    s, c = 0.0, 0.0
    while time.monotonic() < deadline:
        try:
            s, c = scrape_latency(metrics_url)
        except OSError:
            pass
        if c >= at_least:
            return s, c
        time.sleep(0.5)
    return s, c


# ------------------------------------------------------------------------------------------ in-process floor


def inprocess_floor(checkpoint: str, observations: list[list[float]], n: int) -> dict:
    import numpy as np
    import torch

    from serving.policy import LoadedPolicy

    torch.set_num_threads(1)
    pol = LoadedPolicy.load("bench", checkpoint)
    arrs = [np.asarray(o, np.float32)[None] for o in observations]
    bodies = [json.dumps({"observation": o}).encode() for o in observations]
    for a in arrs[:200]:
        pol.act(a)
    fwd, full = [], []
    for i in range(n):
        a = arrs[i % len(arrs)]
        t0 = time.perf_counter()
        pol.module.forward_inference({"obs": torch.from_numpy(a)})
        fwd.append((time.perf_counter() - t0) * 1e3)
    served = []
    for i in range(n):
        a = arrs[i % len(arrs)]
        t0 = time.perf_counter()
        pol.act(a)  # the server's forward: inference-only twin + greedy action
        served.append((time.perf_counter() - t0) * 1e3)
    for i in range(n):
        body = bodies[i % len(bodies)]
        t0 = time.perf_counter()
        obs = pol.observation(json.loads(body)["observation"])
        act = pol.act(obs[None])[0]
        json.dumps({"action": act, "policy": "bench", "checkpoint_id": pol.checkpoint_id})
        full.append((time.perf_counter() - t0) * 1e3)
    return {
        # RLlib's public call on the module as loaded from the checkpoint (the issue's "floor").
        "forward_inference_p50_ms": pct(fwd, 50), "forward_inference_p99_ms": pct(fwd, 99),
        # What the replica runs per batch: inference-only twin, no per-call eval(), + argmax.
        "served_forward_act_p50_ms": pct(served, 50), "served_forward_act_p99_ms": pct(served, 99),
        "validate_forward_json_p50_ms": pct(full, 50), "validate_forward_json_p99_ms": pct(full, 99),
        "load_seconds": pol.load_seconds, "checkpoint_id": pol.checkpoint_id,
        "observation_space": str(pol.observation_space), "n": n,
    }


# ------------------------------------------------------------------------------------------ main


def ensure_checkpoint(path: str | None, workdir: Path) -> str:
    if path and Path(path).is_dir():
        return str(Path(path).resolve())
    if path:
        raise SystemExit(f"checkpoint {path!r} does not exist (run `make train`, or omit --checkpoint to train one)")
    out = workdir / "train"
    cmd = [sys.executable, "-m", "trainer", f"output_dir={out}", "stop.iterations=1",
           f"resources.ray_tmp_dir={workdir / 'ray_train'}"]
    print("training a checkpoint:", " ".join(cmd), flush=True)
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"trainer failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])["checkpoint"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=None, help="CartPole checkpoint (default: train one with 1 iteration)")
    p.add_argument("--ingress", default="direct", choices=("direct", "proxy"))
    p.add_argument("--max-batch-size", type=int, default=None, help="override user_config.max_batch_size")
    p.add_argument("--sequential", type=int, default=2000, help="requests per sequential run")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each concurrent run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--floor-n", type=int, default=5000)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "serve_bench.json"))
    p.add_argument("--keep", action="store_true", help="keep the temp dir (server log, Ray logs, trained checkpoint)")
    p.add_argument("--no-baseline", action="store_true", help="skip the bare ASGI baseline")
    p.add_argument("--no-log-compare", dest="log_compare", action="store_false",
                   help="skip the transition-logging phases (session requests, logging off vs on)")
    args = p.parse_args(argv)
    load_before = os.getloadavg()

    work = Path(tempfile.mkdtemp(prefix="serve_bench_"))
    ckpt = ensure_checkpoint(args.checkpoint, work)

    import numpy as np

    rng = np.random.default_rng(0)
    observations = (rng.uniform(-1, 1, size=(1000, 4)) * [2.0, 1.0, 0.2, 1.0]).round(5).tolist()

    print("in-process floor ...", flush=True)
    floor = inprocess_floor(ckpt, observations, args.floor_n)

    port, metrics_port, proxy_port, bare_port = free_ports(4)
    config_path, log_uri = work / "serve_config.yaml", str(work / "transitions")
    write_config(config_path, None)
    cmd = [sys.executable, "-m", "serving", "--config", str(config_path), "--checkpoint", ckpt, "--port", str(port),
           "--proxy-port", str(proxy_port), "--metrics-port", str(metrics_port), "--temp-dir", str(work / "ray"),
           "--ingress", args.ingress, "--no-watch"]
    if args.max_batch_size is not None:
        cmd += ["--max-batch-size", str(args.max_batch_size)]
    print("starting:", " ".join(cmd), flush=True)
    log = open(work / "server.log", "w")
    server = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
    bare = None
    bare_seq, bare_conc = [], []
    log_runs: dict[str, dict[str, list]] = {"off": {"seq": [], "conc": []}, "on": {"seq": [], "conc": []}}
    log_rows: dict[str, float] = {}
    try:
        if not args.no_baseline:
            bare = subprocess.Popen([sys.executable, str(REPO / "bench" / "bare_asgi_server.py"), "--checkpoint", ckpt,
                                     "--port", str(bare_port)], cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
            if not bare.stdout.readline().startswith('{"event": "ready"'):
                raise SystemExit(f"bare ASGI baseline did not start; log: {work / 'server.log'}")
        wait_ready(server, work / "server.log")
        lines = read_lines(server)
        host = "127.0.0.1"
        path = "/v1/policies/default/act"
        reqs = [build_request(host, port, path, json.dumps({"observation": o}).encode()) for o in observations]
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        n_seq = args.sequential + 200
        # Session requests for the logging phases: distinct sessions per phase (a logged session's rows are its own).
        def session_reqs(phase: str) -> list[bytes]:
            return [build_request(host, port, path, json.dumps(
                {"observation": observations[i % len(observations)],
                 "session_id": f"{phase}-{i // LOG_EPISODE_STEPS}"}).encode()) for i in range(n_seq)]

        seq_runs, conc_runs, replica_ms = [], [], []
        sent = 0  # act requests sent so far: the replica histogram's count once everything is exported
        for r in range(args.repeats):
            # Wait until every earlier request is exported, so the window holds only this sequential phase.
            s0, c0 = wait_metric_count(metrics_url, sent, timeout_s=60)
            lat = asyncio.run(sequential(host, port, [reqs[i % len(reqs)] for i in range(args.sequential + 200)], 200))
            sent += args.sequential + 200
            seq_runs.append({"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "mean_ms": statistics.fmean(lat),
                             "n": len(lat)})
            s1, c1 = wait_metric_count(metrics_url, sent, timeout_s=60)
            if c1 > c0 and c0 >= sent - args.sequential - 200 and c1 == sent:
                replica_ms.append((s1 - s0) / (c1 - c0))
            print(f"  sequential run {r + 1}: p50 {seq_runs[-1]['p50_ms']:.3f} ms  p99 {seq_runs[-1]['p99_ms']:.3f} ms",
                  flush=True)
            res = asyncio.run(concurrent(host, port, reqs, args.clients, args.seconds))
            sent += res["requests"] + res["errors"] + args.clients  # + one warm-up request per connection
            conc_runs.append(res)
            print(f"  {args.clients} clients run {r + 1}: {res['req_per_s']:.0f} req/s  p50 {res['p50_ms']:.2f} ms  "
                  f"p99 {res['p99_ms']:.2f} ms  errors {res['errors']}", flush=True)
            if bare is not None:
                breqs = [build_request(host, bare_port, path, json.dumps({"observation": o}).encode())
                         for o in observations]
                lat = asyncio.run(sequential(host, bare_port, [breqs[i % len(breqs)] for i in range(args.sequential + 200)],
                                             200))
                bare_seq.append({"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "mean_ms": statistics.fmean(lat),
                                 "n": len(lat)})
                bare_conc.append(asyncio.run(concurrent(host, bare_port, breqs, args.clients, args.seconds)))
                print(f"  bare ASGI run {r + 1}: sequential p50 {bare_seq[-1]['p50_ms']:.3f} ms; {args.clients} clients "
                      f"{bare_conc[-1]['req_per_s']:.0f} req/s", flush=True)
            if args.log_compare:
                for mode in ("off", "on"):
                    reload_with_log(server, lines, config_path, log_uri if mode == "on" else None, work / "server.log")
                    lat = asyncio.run(sequential(host, port, session_reqs(f"r{r}-{mode}-seq"), 200))
                    log_runs[mode]["seq"].append({"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
                                                  "mean_ms": statistics.fmean(lat), "n": len(lat)})
                    res = asyncio.run(concurrent(host, port, session_reqs(f"r{r}-{mode}-conc"), args.clients,
                                                 args.seconds))
                    log_runs[mode]["conc"].append(res)
                    sent += n_seq + res["requests"] + res["errors"] + args.clients
                    print(f"  logging {mode} run {r + 1}: sequential p50 {log_runs[mode]['seq'][-1]['p50_ms']:.3f} ms; "
                          f"{args.clients} clients {res['req_per_s']:.0f} req/s  errors {res['errors']}", flush=True)
                reload_with_log(server, lines, config_path, None, work / "server.log")  # the log closes: rows written
        if args.log_compare:
            deadline = time.monotonic() + 60  # until every row is counted (metrics export every few seconds)
            while time.monotonic() < deadline:
                log_rows = scrape_log_rows(metrics_url)
                if sum(log_rows.values()) >= sum(r["n"] + 200 for r in log_runs["on"]["seq"]):
                    break
                time.sleep(1)
    finally:
        if bare is not None:
            bare.terminate()
            bare.wait(timeout=30)
        stop_server(server)
        log.close()

    med = statistics.median
    seq_p50 = med(r["p50_ms"] for r in seq_runs)
    result = {
        "benchmark": "serve_bench",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                 "loadavg_at_end": os.getloadavg()},
        "setup": {"ingress": args.ingress, "checkpoint": ckpt, "clients": args.clients,
                  "sequential_requests": args.sequential, "concurrent_seconds": args.seconds,
                  "repeats": args.repeats, "max_batch_size": args.max_batch_size or "config",
                  "validation": "on (shape, dtype, finite, bounds, body size)", "metrics": "on",
                  "client": "asyncio raw HTTP/1.1 keep-alive, one process"},
        "in_process": floor,
        "sequential": {"p50_ms": seq_p50, "p99_ms": med(r["p99_ms"] for r in seq_runs), "runs": seq_runs},
        "concurrent": {"req_per_s": med(r["req_per_s"] for r in conc_runs),
                       "p50_ms": med(r["p50_ms"] for r in conc_runs), "p99_ms": med(r["p99_ms"] for r in conc_runs),
                       "runs": conc_runs},
        "breakdown_ms": {
            "forward_inference": floor["forward_inference_p50_ms"],
            "served_forward_act": floor["served_forward_act_p50_ms"],
            "validate_forward_json_in_process": floor["validate_forward_json_p50_ms"],
            # Mean (not p50: the histogram's buckets are coarse) over each sequential phase incl. its warm-up.
            "replica_handler_mean": med(replica_ms) if replica_ms else None,
            "client_round_trip_p50": seq_p50,
            "client_round_trip_mean": med(r["mean_ms"] for r in seq_runs),
            # Round trip minus replica handler (means): uvicorn + Serve's direct-ingress wrapper + kernel + client.
            "outside_handler_mean": (med(r["mean_ms"] for r in seq_runs) - med(replica_ms)) if replica_ms else None,
        },
        "targets": {"sequential_p50_ms_max": 1.5, "req_per_s_8_clients_min": 1500},
    }
    if bare_seq:
        b_p50, b_rps = med(r["p50_ms"] for r in bare_seq), med(r["req_per_s"] for r in bare_conc)
        result["bare_asgi"] = {"sequential": {"p50_ms": b_p50, "p99_ms": med(r["p99_ms"] for r in bare_seq),
                                              "runs": bare_seq},
                               "concurrent": {"req_per_s": b_rps, "p50_ms": med(r["p50_ms"] for r in bare_conc),
                                              "runs": bare_conc}}
        result["ratios_serve_over_bare"] = {"sequential_p50": round(seq_p50 / b_p50, 3),
                                            "req_per_s": round(result["concurrent"]["req_per_s"] / b_rps, 3)}
        result["goals"] = {"sequential_p50_ms_max": 0.4, "req_per_s_at_least_bare": True,
                           "met": bool(seq_p50 <= 0.4 and result["concurrent"]["req_per_s"] >= b_rps)}
    if args.log_compare:
        lr = {mode: {"sequential_p50_ms": med(x["p50_ms"] for x in runs["seq"]),
                     "sequential_p99_ms": med(x["p99_ms"] for x in runs["seq"]),
                     "req_per_s": med(x["req_per_s"] for x in runs["conc"]),
                     "concurrent_p50_ms": med(x["p50_ms"] for x in runs["conc"]), "runs": runs}
              for mode, runs in log_runs.items()}
        ratios = {"sequential_p50": round(lr["on"]["sequential_p50_ms"] / lr["off"]["sequential_p50_ms"], 3),
                  "req_per_s": round(lr["on"]["req_per_s"] / lr["off"]["req_per_s"], 3)}
        result["transition_log"] = {
            "requests": f"act with session_id, a new session every {LOG_EPISODE_STEPS} steps; no feedback",
            "on": {"sample_rate": 1.0, "uri": "local directory", "flush": "defaults (serving/config.py)"},
            "logging_off": lr["off"], "logging_on": lr["on"], "ratios_on_over_off": ratios,
            "rows": log_rows,  # ray_rl_serve_log_rows_total by result over the whole run
            "goal": {"cost_max": 0.05, "met": bool(ratios["sequential_p50"] <= 1.05 and ratios["req_per_s"] >= 0.95)},
        }
    result["host"]["loadavg_before"] = load_before
    result["host"]["note"] = "Serve and the bare baseline alternate phase by phase; compare ratios, not absolute ms"
    result["targets"]["met"] = bool(seq_p50 <= 1.5 and result["concurrent"]["req_per_s"] >= 1500)
    if args.keep:
        print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("sequential", "concurrent", "breakdown_ms")}, indent=1, default=str)[:3000])
    if "transition_log" in result:
        t = result["transition_log"]
        print(json.dumps({k: t[k] for k in ("ratios_on_over_off", "rows", "goal")}
                         | {m: {k: v for k, v in t[m].items() if k != "runs"} for m in ("logging_off", "logging_on")},
                         indent=1))
    print(f"wrote {out}")
    if bare_seq:
        sys.path.insert(0, str(REPO / "bench"))
        import benchkit

        benchkit.bar_png("serve_bench", f"{args.clients}-client throughput (median), same client",
                         ["Ray Serve", "bare ASGI"], [result["concurrent"]["req_per_s"], b_rps], "req/s",
                         out=out.with_suffix(".png"))  # next to the JSON (--out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
