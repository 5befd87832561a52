"""rl-rollout's loop end to end against a fake policy server (no Ray): the fake re-reads the Serve config file on
every request, as `python -m serving --config FILE` applies a changed file, serves GET /v1/policies/NAME from it
and simulates traffic at the configured weight on every GET .../stats (returns drawn per checkpoint). The CLI runs
as the installed console script with short intervals: promotion, rollbacks (returns, errors, latency, a load
error), a pause while the figures are unavailable, abort from another process, resume after Ctrl-C, shadow, and
a registry candidate whose promotion moves the registry's champion.

The end-to-end load test against a real server is tests/serving's; this one pins the controller's behaviour."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import yaml

from rl_checkpoint import CheckpointMetadata, Registry, Storage, resolve, write_metadata
from rl_checkpoint.checkpoint import _MODULE_MARKER
from rl_checkpoint.registry import is_registry_ref, resolve_ref
from serving.config import ServerConfig

BIN = Path(sys.executable).parent
LE = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0, "+Inf"]


def make_ckpt(path: Path) -> str:
    st = Storage.open(str(path))
    st.write_bytes(b"", _MODULE_MARKER)
    write_metadata(st, CheckpointMetadata(checkpoint_id=path.name, env="cartpole", module_dir="."))
    return str(path)


def write_config(path: Path, champion: str, name: str = "cartpole") -> Path:
    cfg = {"applications": [{"name": "policy", "route_prefix": "/", "import_path": "serving.app:build_app",
                             "deployments": [{"name": "PolicyServer",
                                              "user_config": {"policies": {name: {"checkpoint": champion}}}}]}]}
    path.write_text("# a test Serve config\n" + yaml.safe_dump(cfg, sort_keys=False))
    return path


class Role:
    def __init__(self):
        self.cid = None
        self.requests = self.errors = self.episodes = 0
        self.return_sum = self.return_sq_sum = 0.0
        self.buckets = [0] * len(LE)
        self.shadow = {"compared": 0, "agreed": 0, "dropped": 0, "errors": 0}


class FakeServer:
    """Behaviour per checkpoint id: mean/sd of returns, error_rate, latency_ms, load_error, agreement."""

    def __init__(self, config: Path, behaviour: dict[str, dict], name: str = "cartpole"):
        self.config, self.behaviour, self.name = config, behaviour, name
        self.roles = {"champion": Role(), "candidate": Role()}
        self.rng = np.random.default_rng(0)
        self.stats_down = False  # answer 503 on /stats
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                code, body = fake.handle(self.path)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()

    @staticmethod
    def cid_of(loc: str) -> str:
        return resolve_ref(loc)[1].checkpoint_id if is_registry_ref(loc) else resolve(loc).checkpoint_id

    def served(self):
        uc = yaml.safe_load(self.config.read_text())["applications"][0]["deployments"][0]["user_config"]
        ServerConfig.parse(uc)  # what the controller writes must pass the server's own schema
        spec = uc["policies"][self.name]
        spec = {"checkpoint": spec} if isinstance(spec, str) else spec
        champ = self.cid_of(spec["checkpoint"])
        cand, err = spec.get("candidate"), None
        if cand:
            cid = self.cid_of(cand["checkpoint"])
            if self.behaviour.get(cid, {}).get("load_error"):
                err = {"checkpoint": cand["checkpoint"], "error": self.behaviour[cid]["load_error"], "at": 0}
                cand = None
            else:
                cand = {"checkpoint_id": cid, "weight": float(cand.get("weight", 0.0)),
                        "mode": cand.get("mode", "split")}
        return champ, cand, err

    def handle(self, path: str):
        with self.lock:
            champ, cand, err = self.served()
            for role, cid in (("champion", champ), ("candidate", cand and cand["checkpoint_id"])):
                if self.roles[role].cid != cid:  # a new version in the role: its figures start again
                    self.roles[role] = Role()
                    self.roles[role].cid = cid
            if path == f"/v1/policies/{self.name}":
                return 200, {"name": self.name, "checkpoint_id": champ, "candidate": cand,
                             **({"candidate_error": err} if err else {})}
            if path == f"/v1/policies/{self.name}/stats":
                if self.stats_down:
                    return 503, {"error": {"code": "unavailable", "message": "stats down"}}
                self.tick(cand)
                versions = {"champion": self.version("champion", cand)}
                if cand:
                    versions["candidate"] = self.version("candidate", cand)
                return 200, {"policy": self.name, "replica": "r1", "at": time.time(), "versions": versions}
            return 404, {"error": {"code": "unknown_policy", "message": path}}

    def tick(self, cand):
        w = cand["weight"] if cand else 0.0
        shadow = bool(cand) and cand["mode"] == "shadow"
        for role in ("champion", "candidate"):
            r = self.roles[role]
            if r.cid is None:
                continue
            b = self.behaviour.get(r.cid, {})
            share = (1.0 if role == "champion" else 0.0) if shadow else (w if role == "candidate" else 1 - w)
            n, eps = int(round(200 * share)), int(round(20 * share))
            if shadow and role == "candidate":
                m = int(round(200 * w))
                agree = int(round(m * b.get("agreement", 1.0)))
                r.shadow["compared"] += m
                r.shadow["agreed"] += agree
                continue
            errs = int(round(n * b.get("error_rate", 0.0)))
            r.requests += n
            r.errors += errs
            lat = b.get("latency_ms", 0.9)
            idx = next(i for i, le in enumerate(LE) if le == "+Inf" or lat <= le)
            r.buckets[idx] += n - errs
            rets = self.rng.normal(b.get("mean", 100.0), b.get("sd", 10.0), eps)
            r.episodes += eps
            r.return_sum += float(rets.sum())
            r.return_sq_sum += float((rets * rets).sum())

    def version(self, role, cand):
        r = self.roles[role]
        counts = list(np.cumsum(r.buckets).astype(int).tolist())
        w = cand["weight"] if cand else 0.0
        out = {"checkpoint_id": r.cid, "weight": w if role == "candidate" else 1 - w, "requests": r.requests,
               "errors": r.errors, "latency_ms": {"le": LE, "counts": counts, "sum": 0.0, "count": counts[-1]},
               "episodes": r.episodes, "return_sum": r.return_sum, "return_sq_sum": r.return_sq_sum,
               "active_sessions": 0 if (role == "champion" and w >= 1.0) else 2}
        if role == "candidate":
            out["shadow"] = dict(r.shadow)
            out["mode"] = cand["mode"]
        return out


@pytest.fixture
def setup(tmp_path):
    made = []

    def make(behaviour: dict[str, dict] | None = None):
        champ = make_ckpt(tmp_path / "champ")
        for cid in ("good", "bad", "slow", "erroring", "broken"):
            make_ckpt(tmp_path / cid)
        beh = {"champ": {"mean": 100}, "good": {"mean": 100}, "bad": {"mean": 20, "sd": 5},
               "slow": {"latency_ms": 300}, "erroring": {"error_rate": 0.5}, "broken": {"load_error": "boom: bad weights"},
               **(behaviour or {})}
        cfg = write_config(tmp_path / "serve.yaml", champ)
        srv = FakeServer(cfg, beh)
        made.append(srv)
        return cfg, srv

    yield make
    for s in made:
        s.close()


FAST = ["--interval", "0.3", "--min-episodes", "5", "--min-requests", "5", "--max-p99-ms", "100",
        "--apply-timeout", "10", "--drain-timeout", "5"]


def rollout(*args, timeout=60, **kw):
    return subprocess.run([str(BIN / "rl-rollout"), *args], capture_output=True, text=True, timeout=timeout, **kw)


def policy(cfg: Path, name="cartpole"):
    return yaml.safe_load(cfg.read_text())["applications"][0]["deployments"][0]["user_config"]["policies"][name]


def record(cfg: Path, name="cartpole"):
    return json.loads((cfg.parent / f".{cfg.name}.rollouts.json").read_text())[name]


def test_a_good_candidate_goes_through_every_step_and_is_promoted(setup, tmp_path):
    cfg, srv = setup()
    p = rollout("start", "cartpole", str(tmp_path / "good"), "--config", str(cfg), "--server", srv.url, *FAST)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("cartpole: promoted"), p.stdout
    assert policy(cfg) == str(tmp_path / "good") or policy(cfg) == {"checkpoint": str(tmp_path / "good")}
    rec = record(cfg)
    assert rec["status"] == "promoted" and rec["outcome"]["drain"] == "champion sessions drained"
    events = [h["event"] for h in rec["history"]]
    assert events == ["start", "advance", "advance", "advance", "promoted"], events
    assert [h["weight"] for h in rec["history"]][:4] == [0.05, 0.25, 0.5, 1.0]
    assert cfg.read_text().startswith("# a test Serve config\n")  # the header comment survives rewrites
    s = rollout("status", "cartpole", "--config", str(cfg))
    assert s.returncode == 0 and s.stdout.startswith("cartpole: promoted") and "healthy at 100%" in s.stdout


@pytest.mark.parametrize("cand,rule", [("bad", "candidate mean return"), ("erroring", "candidate error ratio"),
                                       ("slow", "candidate p99")])
def test_a_worse_candidate_is_rolled_back_at_the_first_step(setup, tmp_path, cand, rule):
    cfg, srv = setup()
    p = rollout("start", "cartpole", str(tmp_path / cand), "--config", str(cfg), "--server", srv.url, *FAST)
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stdout.startswith("cartpole: rolled_back") and rule in p.stdout and "at 5%" in p.stdout, p.stdout
    assert "candidate" not in policy(cfg)  # the champion alone
    assert record(cfg)["status"] == "rolled_back"


def test_a_candidate_that_fails_to_load_is_rolled_back_with_the_load_error(setup, tmp_path):
    cfg, srv = setup()
    p = rollout("start", "cartpole", str(tmp_path / "broken"), "--config", str(cfg), "--server", srv.url, *FAST)
    assert p.returncode == 3, p.stderr
    assert "candidate failed to load: boom: bad weights" in p.stdout
    assert "candidate" not in policy(cfg)


def test_unavailable_figures_pause_then_the_rollout_continues(setup, tmp_path):
    cfg, srv = setup()
    proc = subprocess.Popen([str(BIN / "rl-rollout"), "start", "cartpole", str(tmp_path / "good"), "--config",
                             str(cfg), "--server", srv.url, *FAST[:1], "0.5", *FAST[2:]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while "candidate" not in policy(cfg) or "baseline" not in json.dumps(policy(cfg)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        srv.stats_down = True
        while True:
            s = rollout("status", "cartpole", "--config", str(cfg))
            if s.stdout.startswith("cartpole: paused"):
                break
            assert time.monotonic() < deadline, s.stdout
            time.sleep(0.2)
        assert "figures unavailable: GET /v1/policies/cartpole/stats answered 503" in s.stdout, s.stdout
        weight = policy(cfg)["candidate"]["weight"]
        time.sleep(2.5)
        assert policy(cfg)["candidate"]["weight"] == weight  # nothing advances on missing data
        srv.stats_down = False
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    events = [h["event"] for h in record(cfg)["history"]]
    assert "pause" in events and "resume" in events and events[-1] == "promoted", events


def test_a_second_start_is_refused_and_abort_stops_the_running_controller(setup, tmp_path):
    cfg, srv = setup({"good": {"mean": 100, "sd": 10}})
    proc = subprocess.Popen([str(BIN / "rl-rollout"), "start", "cartpole", str(tmp_path / "good"), "--config",
                             str(cfg), "--server", srv.url, *FAST[:1], "0.5", *FAST[2:], "--min-episodes", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while "candidate" not in policy(cfg):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        p = rollout("start", "cartpole", str(tmp_path / "bad"), "--config", str(cfg), "--server", srv.url)
        assert p.returncode == 2 and p.stderr.startswith("error: a rollout of cartpole is already running")
        assert len(p.stderr.strip().splitlines()) == 1 and str(tmp_path / "good") in p.stderr
        a = rollout("abort", "cartpole", "--config", str(cfg), "--server", srv.url, "--reason", "test")
        assert a.returncode == 0, a.stderr
        assert "aborted" in a.stdout and "test" in a.stdout
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 5, err
    assert "candidate" not in policy(cfg) and record(cfg)["status"] == "aborted"


def test_ctrl_c_leaves_the_rollout_in_the_config_and_resume_finishes_it(setup, tmp_path):
    cfg, srv = setup()
    proc = subprocess.Popen([str(BIN / "rl-rollout"), "start", "cartpole", str(tmp_path / "good"), "--config",
                             str(cfg), "--server", srv.url, *FAST[:1], "0.5", *FAST[2:]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not policy(cfg).get("candidate", {}).get("weight", 0) >= 0.25:
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    st = policy(cfg)["candidate"]["rollout"]
    assert st["status"] == "running" and st["controller"] is None and st["step"] >= 1
    s = rollout("status", "cartpole", "--config", str(cfg))
    assert "no controller" in s.stdout, s.stdout
    r = rollout("resume", "cartpole", "--config", str(cfg))  # the server URL comes from the state
    assert r.returncode == 0, r.stderr
    events = [h["event"] for h in record(cfg)["history"]]
    assert "resume" in events and events[-1] == "promoted", events


def test_detach_then_resume(setup, tmp_path):
    cfg, srv = setup()
    p = rollout("start", "cartpole", str(tmp_path / "good"), "--config", str(cfg), "--server", srv.url, *FAST,
                "--detach")
    assert p.returncode == 0 and "rl-rollout resume cartpole" in p.stdout, p.stderr
    s = rollout("status", "cartpole", "--config", str(cfg), "--json")
    st = json.loads(s.stdout)
    assert st["candidate"]["weight"] == 0.05 and st["rollout"]["status"] == "running"
    assert rollout("resume", "cartpole", "--config", str(cfg), "--server", srv.url).returncode == 0


def test_shadow_completes_without_promoting(setup, tmp_path):
    cfg, srv = setup()
    p = rollout("start", "cartpole", str(tmp_path / "good"), "--config", str(cfg), "--server", srv.url, *FAST,
                "--mode", "shadow", "--steps", "50,100")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("cartpole: completed") and "agreement 1.000" in p.stdout
    assert policy(cfg) == {"checkpoint": str(tmp_path / "champ")}  # champion unchanged, candidate removed


def test_shadow_low_agreement_rolls_back_with_min_agreement(setup, tmp_path):
    cfg, srv = setup({"good": {"agreement": 0.5}})
    p = rollout("start", "cartpole", str(tmp_path / "good"), "--config", str(cfg), "--server", srv.url, *FAST,
                "--mode", "shadow", "--min-agreement", "0.9")
    assert p.returncode == 3 and "candidate agreement 0.500 < 0.9" in p.stdout, p.stdout + p.stderr


def test_a_registry_candidate_moves_the_registry_champion_forced_with_the_rollout_reason(setup, tmp_path):
    cfg, srv = setup()
    root = str(tmp_path / "registry")
    reg = Registry.open(root)
    reg.register("cartpole", str(tmp_path / "champ"))
    reg.promote("cartpole", 1, force_reason="first")
    reg.register("cartpole", str(tmp_path / "good"))
    p = rollout("start", "cartpole", f"registry:{root}/cartpole@2", "--config", str(cfg), "--server", srv.url, *FAST)
    assert p.returncode == 0, p.stderr
    assert Registry.open(root).get("cartpole").version == 2
    r = record(cfg)["outcome"]["registry"]
    assert r["moved"] and r["forced"] and "no_evaluation" in r["gate"] and r["force_reason"].startswith("rl-rollout")
    assert policy(cfg)["checkpoint"] == f"registry:{root}/cartpole@2"
    assert "registry champion v2 (forced)" in p.stdout
