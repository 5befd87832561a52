"""Monitoring proven live: a real Prometheus (Debian's package, via hack/tools.sh) scrapes a live local Ray's metrics
port while a short training runs and the policy server takes traffic; every dashboard panel query and every rule of
the chart (rendered by helm, as shipped) must return series. The report goes to bench/results/monitoring_live.json.
The served policies have candidate versions (a 50/50 split whose candidate earns less reward, a shadow candidate, a
candidate that always fails) and the traffic plays whole episodes and posts their rewards, so the per-version panels
and canary rules see data; test_canary_figures_follow_the_traffic checks their figures against the clients' own.

Alert rules are conditions (`x > threshold`); a healthy run must not meet them, so the test evaluates each alert's
expression without its trailing comparison (promkit.underlying) and asserts the underlying series exist: that proves
metric names, labels and arithmetic match what Ray exports. Whether they fire at their thresholds is promtool's job
(tests/chart/promtool/rules_test.yaml). Queries that cannot return data on one CPU-only node are listed in
EXPECTED_EMPTY with the reason; an entry that returns data is stale and fails the test (the exemption hid nothing, or
its reason no longer holds), an entry naming no shipped query fails too, and each shared reason's premise (no
GPU, one node, no gRPC, exceptions answered by the server itself, no multiplexing) is checked by
test_exemption_reasons_hold.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "chart"))
sys.path.insert(0, str(ROOT / "tests" / "serving"))
sys.path.insert(0, str(ROOT / "hack"))

import promconfig  # noqa: E402
from chartkit import Tools, tool_env  # noqa: E402
from promkit import Prometheus, dashboard_queries, resolve_variables, rule_queries, underlying  # noqa: E402
from trainer_helpers import RayHead, free_ports, stop_process, wait_for  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.monitoring]
REPORT = ROOT / "bench" / "results" / "monitoring_live.json"
# Prometheus scrapes every SCRAPE_S; queries are evaluated every STEP_S. Some of Ray's gauges are exported only for a
# few seconds after each set. Measured: Serve's controller sets ray_serve_deployment_replica_healthy every ~10 s; with
# the 2 s report interval below it is on the metrics port ~4 s of each 10 (continuously with Ray's default 10 s, which
# the chart keeps). Prometheus ends a series with a staleness marker at the first scrape without it, so a grid coarser
# than the scrape interval can fall in the gaps every time (10 s period, 5 s step: phase-locked; CI missed it once).
# A step below the scrape interval puts a grid point inside every scraped sample's lifetime: "returns series" then
# means "Prometheus had it".
SCRAPE_S, STEP_S = 2, 1

# Reasons shared by several exemptions; test_exemption_reasons_hold checks each one's premise about this run.
_NO_GPU = "no GPU on this CPU-only host"
_ONE_NODE = "a one-node local Ray: no worker nodes, no autoscaler"
_NO_GRPC = "the policy server is HTTP only (no gRPC ingress)"
_HEALTHY = "counts failures/OOM kills/spilling that a healthy short run does not have"
# Checked with a replica raising on bad input: 115 answers 500 left Serve's error panels empty; with app.py's
# catch-all removed as well they returned series. Server errors count in ray_rl_serve_requests_total{status="500"}
# (alert RLPolicyErrors).
_NO_APP_ERRORS = ("no exception reaches Serve: serving/app.py answers any exception itself with a JSON 500, so Serve's "
                  "deployment error counter never counts one")
_NO_MULTIPLEX = "the policy server does not use Serve model multiplexing"
# (dashboard uid or rule group, panel title or rule name [refId]) -> why it has no data here.
EXPECTED_EMPTY: dict[tuple[str, str], str] = {
    **{("rayDefaultDashboard", f"{t} [{r}]"): _NO_GPU for t, refs in {
        "Cluster Utilization": "BD", "Node GPU Usage": "AB", "Node GPU Usage %": "A",
        "Node GPU Memory Usage (GRAM)": "AB", "Node GPU Memory Usage (GRAM) %": "A", "Node GPU Power": "A",
        "Node GPU Temperature": "A", "Node GPU Usage by Component": "A",
        "Node GPU Memory Usage by Component": "AB", "Logical GPUs Usage": "ABC",
        "Node TPU Tensorcore Utilization %": "A", "Node TPU High Bandwidth Memory Utilization %": "A"}.items()
       for r in refs},
    ("rayServeDashboard", "Cluster Utilization [B]"): _NO_GPU,
    ("rayServeDashboard", "Cluster Utilization [D]"): _NO_GPU,
    ("rayDefaultDashboard", "Ray OOM Kills (Tasks and Actors) [A]"): _HEALTHY,
    ("rayDefaultDashboard", "Unexpected System Level Worker Failures [A]"): _HEALTHY,
    ("rayDefaultDashboard", "All Tasks by State [B]"): "retried tasks only (IsRetry!=0): " + _HEALTHY,
    ("rayDefaultDashboard", "Active Tasks by Name [B]"): "retried tasks only (IsRetry!=0): " + _HEALTHY,
    ("rayDefaultDashboard", "Running Tasks by Name [B]"): "retried tasks only (IsRetry!=0): " + _HEALTHY,
    ("rayDefaultDashboard", "All Placement Groups by State [A]"): "PPO with local env runner and learner "
                                                                  "creates no placement group",
    **{("rayServeDashboard", f"{t} [B]"): _NO_GRPC for t in (
        "QPS per application", "Error QPS per application", "Error QPS per application per error code",
        "P50 latency per application", "P90 latency per application", "P99 latency per application")},
    ("rayServeDashboard", "Ongoing gRPC Requests [A]"): _NO_GRPC,
    ("rayServeDashboard", "Error QPS per deployment [A]"): _NO_APP_ERRORS,
    ("rayServeDeploymentDashboard", "Error QPS per replica [A]"): _NO_APP_ERRORS,
    **{("rayServeDeploymentDashboard", f"{t} [A]"): _NO_MULTIPLEX for t in (
        "Multiplexed models per replica", "Multiplexed model loads per replica",
        "Multiplexed model unloads per replica", "P99 latency of multiplexed model loads per replica",
        "P99 latency of multiplexed model unloads per replica", "Multiplexed model ids per replica",
        "Multiplexed model cache hit rate")},
    ("rayDefaultDashboard", "Node Count [B]"): "autoscaler_recently_failed_nodes: no node failed",
    ("rayServeDashboard", "Node count [B]"): "autoscaler_recently_failed_nodes: no node failed",
    ("rayDefaultDashboard", "Logical CPUs Usage [C]"): "shown only while pending demand exceeds the cluster; "
                                                      "a fixed one-node Ray has none",
    ("rayDefaultDashboard", "Logical Memory Usage [C]"): "shown only while pending demand exceeds the cluster; "
                                                        "a fixed one-node Ray has none",
    ("rl-platform.nodes", "RayWorkerDown"): _ONE_NODE + " (up{ray_io_node_type=\"worker\"} has no series)",
}


def _premises(live: dict) -> dict[str, str | None]:
    """Each shared reason -> None when its premise holds in this run, else what contradicts it."""
    prom, cfg = live["prom"], live["serve_config"]
    gpus = sorted(str(p) for p in Path("/dev").glob("nvidia*"))
    # Over the run's whole window, not at this instant: the Ray whose nodes are counted may be gone by now (its series
    # are stale once its last scrape fails: a cold CI run read `[]` here).
    counted = prom.query_range("count(ray_node_cpu_utilization)", live["start"], live["end"], STEP_S)
    nodes = sorted({v for series in counted for _, v in series["values"]})
    app = (ROOT / "serving" / "app.py").read_text()
    multiplexed = [str(p.relative_to(ROOT)) for p in (ROOT / "serving").rglob("*.py") if "multiplex" in p.read_text()]
    return {
        _NO_GPU: f"GPU devices {gpus}" if gpus else None,
        _ONE_NODE: None if nodes == ["1"] else f"count(ray_node_cpu_utilization) over the run took values {nodes}",
        _NO_GRPC: f"serve config has grpc_options {cfg['grpc_options']}" if cfg.get("grpc_options") else None,
        _NO_APP_ERRORS: None if re.search(r"except Exception:.*\n(?:.*\n){0,4}.*\"internal_error\".*500", app) else
        "serving/app.py has no catch-all `except Exception` answering 500 internal_error",
        _NO_MULTIPLEX: f"serving/ uses multiplexing: {multiplexed}" if multiplexed else None,
    }


def _rendered(tools: Tools) -> list[dict]:
    return tools.render(sets={"monitoring.enabled": True})


def _dashboards(docs: list[dict]) -> list[dict]:
    out = []
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1":
            ((_, body),) = d["data"].items()
            out.append(json.loads(body))
    return out


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update(PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
    env.update(extra)
    return env


# Served policies (issue 20's versions): "default" splits new sessions 50/50 between its champion and a candidate
# (another checkpoint); "shadowed" mirrors every request to a shadow candidate; "faulty" sends half of its requests to
# a candidate whose forward pass always raises (the champion answers them, the failures count as candidate errors).
SPLIT, SHADOW, FAULTY = "default", "shadowed", "faulty"
# Rewards per step of the episodes the traffic plays on SPLIT (3 steps each), alternating per version between two
# values so returns vary: champion 3 or 6 (mean 4.5), candidate 1.5 or 3 (mean 2.25): a canary that earns less.
STEPS = 3
REWARDS = {"champion": (1.0, 2.0), "candidate": (0.5, 1.0)}


def _traffic(base: str, proxy: str, stop: threading.Event, counts: dict[str, int],
             episodes: dict[str, list[float]]) -> None:
    """Acts with the policies, plays whole episodes (sticky sessions, rewards posted as feedback), plus client
    mistakes (unknown policy, bad body, feedback for unknown and ended sessions): error panels need errors. Some
    requests go through Serve's classic proxy: direct ingress bypasses Serve's request router, whose gauges
    (Scheduling Tasks, ... in Backoff) are set when it is created and on each request it routes."""
    s = requests.Session()

    def post(path: str, body: dict, via: str = base) -> requests.Response:
        r = s.post(f"{via}/v1/policies/{path}", json=body, timeout=10)
        counts[str(r.status_code)] = counts.get(str(r.status_code), 0) + 1
        return r

    i = 0
    while not stop.is_set():
        i += 1
        obs = [0.01 * (i % 7)] * 4
        if i % 20 == 1:
            post(f"{SHADOW}/act", {"observation": obs}, via=proxy)
        elif i % 10 == 0:
            post("nope/act", {"observation": obs})
        elif i % 10 == 5:
            post(f"{SPLIT}/act", {"observation": "bad"})
        elif i % 10 in (3, 7):
            post(f"{SHADOW}/act", {"observation": obs})
        elif i % 10 == 9:
            post(f"{FAULTY}/act", {"observation": obs})
        else:
            _episode(post, f"mon-{i}", episodes)
            if i % 50 == 1:
                post(f"{SPLIT}/feedback", {"session_id": f"mon-{i}", "reward": 1.0, "done": True})  # ended: 409
                post(f"{SPLIT}/feedback", {"session_id": "never-acted", "reward": 1.0})  # unknown: 404
        time.sleep(0.02)


def _episode(post, sid: str, episodes: dict[str, list[float]]) -> None:
    """One episode on SPLIT: act, then post the step's reward (done on the last step); the version of the first
    answer must answer every step (sticky sessions). Returns are recorded per version, or under "mixed"."""
    versions, ret = [], 0.0
    for step in range(STEPS):
        r = post(f"{SPLIT}/act", {"observation": [0.01 * step] * 4, "session_id": sid})
        if r.status_code != 200:
            return
        versions.append(r.json()["version"])
        reward = REWARDS[versions[0]][len(episodes[versions[0]]) % 2]
        done = step == STEPS - 1
        if post(f"{SPLIT}/feedback", {"session_id": sid, "reward": reward, "done": done}).status_code != 200:
            return
        ret += reward
    episodes[versions[0] if len(set(versions)) == 1 else "mixed"].append(ret)


def _fail_unscraped(prom: Prometheus, head: RayHead, needed: tuple[str, ...], work: Path) -> None:
    """Names each series Prometheus has not seen twice, and whether Ray's metrics port exports it at all (a
    scrape problem) or not (the process never reported it), with the logs that say why."""
    try:
        exposition = requests.get(f"http://127.0.0.1:{head.metrics_port}/metrics", timeout=30).text
    except requests.RequestException as e:
        exposition = f"<metrics port unreachable: {e}>"
    lines = []
    for n in needed:
        if prom.api("query", query=f"count_over_time({n}[1m]) >= 2")["result"]:
            continue
        where = "a recording rule: see its inputs" if ":" in n else \
            "exported by Ray's metrics port (a scrape problem)" if n.split("{")[0] in exposition else \
            "absent from Ray's metrics port (never reported)"
        lines.append(f"{n}: {where}")
    targets = [(t["scrapeUrl"], t["health"], t.get("lastError", ""), t.get("lastScrapeDuration"))
               for t in prom.api("targets")["activeTargets"]]
    logs = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-2500:]}" for f in
                     (work / "serve.log", work / "ray-head.log") if f.exists())
    raise AssertionError("after 300 s Prometheus still lacks:\n  " + "\n  ".join(lines)
                         + f"\nscrape targets: {targets}\n{logs}")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from make_checkpoint import make_module_checkpoint
    from serving import launch

    tools = Tools(tool_env())
    prom_bin = tools.env.get("PROMETHEUS", "")
    if not prom_bin or not os.path.exists(prom_bin):
        from chartkit import missing

        missing("PROMETHEUS (the Prometheus server)")
    docs = _rendered(tools)
    work = Path(os.environ.get("RLP_MONITORING_TMP") or __import__("tempfile").mkdtemp(prefix="rlmon", dir="/tmp"))
    rules_path = work / "rules.yaml"
    rules = promconfig.rule_groups(docs)
    rules_path.write_text(yaml.safe_dump(rules, sort_keys=False))

    prom_port, serve_port, as_port, dash_port, proxy_port = free_ports(5)
    # The head's env: the Ray dashboard's metrics view asks RAY_PROMETHEUS_HOST; direct ingress needs its ports
    # set before Ray starts (serving.launch.ingress_env).
    # The autoscaler and the dashboard export their own metrics (Ray's defaults 44217/44227 would clash with any
    # other Ray on this machine).
    # Workers push their metrics to the node's agent every 2 s instead of Ray's 10 s, so a short run is seen.
    head_env = _env(RAY_PROMETHEUS_HOST=f"http://127.0.0.1:{prom_port}", AUTOSCALER_METRIC_PORT=str(as_port),
                    RAY_metrics_report_interval_ms="2000",
                    DASHBOARD_METRIC_PORT=str(dash_port), **launch.ingress_env("direct", serve_port))
    t0 = time.time()
    head = RayHead(str(work / "ray"), head_env)
    procs: list[subprocess.Popen] = []
    prom = None
    stop = threading.Event()
    try:
        head.wait_metrics("ray_node_cpu_utilization", 120)
        prom = Prometheus(prom_bin, promconfig.local_config([f"127.0.0.1:{p}" for p in (head.metrics_port, as_port, dash_port)], [str(rules_path)],
                                                            interval=f"{SCRAPE_S}s"), work / "prometheus", port=prom_port)
        ckpt = make_module_checkpoint(work / "policy", "cartpole")
        other = make_module_checkpoint(work / "policy-b", "cartpole", seed=1)
        # Imported by this name, the name Ray's workers load the module class by (the repo root is on their
        # PYTHONPATH), so the checkpoint pickles the class as tests.serving.faulty_modules.RaisingPPOModule.
        if str(ROOT) not in sys.path:
            sys.path.append(str(ROOT))
        faulty = importlib.import_module("tests.serving.faulty_modules")
        raising = faulty.faulty_checkpoint(work / "policy-raising", faulty.RaisingPPOModule)
        cfg = launch.with_overrides(launch.load_config(), policies={n: str(ckpt) for n in (SPLIT, SHADOW, FAULTY)})
        policies = launch.policy_deployment(cfg)["user_config"]["policies"]
        policies[SPLIT]["candidate"] = {"checkpoint": str(other.resolve()), "weight": 0.5}
        policies[SHADOW]["candidate"] = {"checkpoint": str(other.resolve()), "weight": 1.0, "mode": "shadow"}
        policies[FAULTY]["candidate"] = {"checkpoint": str(raising.resolve()), "weight": 0.5}
        (work / "serve_config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        serve_log = open(work / "serve.log", "w")
        serve = subprocess.Popen(
            [sys.executable, "-m", "serving", "--address", head.address, "--config", str(work / "serve_config.yaml"),
             "--port", str(serve_port), "--proxy-port", str(proxy_port)],
            cwd=ROOT, env=head_env, stdout=subprocess.PIPE, stderr=serve_log, text=True)
        procs.append(serve)
        for line in serve.stdout:
            if '"ready"' in line:
                break
        else:
            raise AssertionError(f"policy server exited {serve.wait()}:\n{(work / 'serve.log').read_text()[-3000:]}")
        counts: dict[str, int] = {}
        episodes: dict[str, list[float]] = {"champion": [], "candidate": [], "mixed": []}
        traffic = threading.Thread(target=_traffic, args=(f"http://127.0.0.1:{serve_port}",
                                                          f"http://127.0.0.1:{proxy_port}", stop, counts, episodes),
                                   daemon=True)
        traffic.start()
        # Training runs (CartPole, never "solved" early; a greedy evaluation every 2nd iteration for the eval-return
        # gauge) until Prometheus has scraped every training series at least twice while the trainer was alive, then
        # is stopped with Ctrl-C (it checkpoints and exits 130). Its wall budget only bounds a run that hangs: on a
        # loaded machine (make test runs another suite beside this one) the scrapes take longer than a fixed 30 s.
        train = subprocess.Popen(
            [sys.executable, "-m", "trainer", f"resources.address={head.address}", f"output_dir={work / 'train'}",
             "stop.episode_return_mean=null", "stop.env_steps=null", "stop.wall_s=600",
             "checkpoint.every_n_iterations=2", "evaluation.interval=2", "evaluation.episodes=2"],
            cwd=ROOT, env=_env(), stdout=open(work / "train.log", "w"), stderr=subprocess.STDOUT)
        procs.append(train)
        # The Serve replica's own gauges too: on a loaded machine its metrics reach the agent seconds after traffic.
        needed = ("ray_rl_train_episode_return_mean", "ray_rl_train_eval_return_mean",
                  "ray_rl_train_last_checkpoint_timestamp_seconds",
                  "ray_rl_train_learner_update_seconds", "rl_platform:serve_requests:rate5m",
                  "ray_serve_deployment_replica_healthy", "ray_rl_serve_policy_info",
                  "ray_rl_serve_episodes_total", "ray_rl_serve_shadow_total", "ray_rl_serve_version_info",
                  # The GCS's actor-state gauge ("All Actors by State"): one run's ~75 s of scrapes never saw it.
                  'ray_actors{Source="gcs"}')
        gauges = " and ".join(f"count(count_over_time({n}[1m]) >= 2)" for n in needed)
        deadline = time.monotonic() + 300
        while not prom.api("query", query=gauges)["result"]:
            assert train.poll() is None, f"trainer exited {train.returncode} before its metrics were scraped:\n" \
                                         + (work / "train.log").read_text()[-3000:]
            if time.monotonic() > deadline:
                _fail_unscraped(prom, head, needed, work)
            time.sleep(1)
        train.send_signal(signal.SIGINT)
        assert train.wait(timeout=300) == 130, (work / "train.log").read_text()[-4000:]
        stop.set()
        traffic.join(timeout=15)
        # The figures are read at `end`: by then the server's episode counters in Prometheus hold every episode the
        # clients finished (Ray exports every 2 s, Prometheus scrapes every 2 s) and the canary rules were evaluated
        # after that scrape, so the rules and the clients describe the same episodes.
        played = {v: float(len(eps)) for v, eps in episodes.items() if v != "mixed" and eps}
        counted_q = f'sum by (version) (ray_rl_serve_episodes_total{{policy="{SPLIT}"}})'
        wait_for(lambda: _by(prom, counted_q, time.time(), "version") == played, 60,
                 f"Prometheus to count every episode the clients played {played}",
                 interval=0.5, on_timeout=lambda: _by(prom, counted_q, time.time(), "version"))
        counted_at = time.time()
        rule_q = f'min(timestamp(rl_platform:policy_version_return_mean:canary_window{{policy="{SPLIT}"}}))'
        wait_for(lambda: (r := prom.query(rule_q)) and float(r[0]["value"][1]) > counted_at, 60,
                 f"the canary rules to be evaluated after {counted_at}", interval=0.5,
                 on_timeout=lambda: prom.query(rule_q))
        dash_health = requests.get(f"http://127.0.0.1:{head.dashboard_port}/api/prometheus_health", timeout=30)
        yield {"prom": prom, "docs": docs, "rules": rules, "start": t0, "end": time.time(), "counts": counts,
               "episodes": episodes, "dashboard_health": dash_health, "setup_s": time.time() - t0,
               "serve_config": cfg}
    finally:
        stop.set()
        for p in procs:
            stop_process(p, signal.SIGINT)
        if prom is not None:
            prom.stop()
        head.stop()


def test_every_panel_and_rule_returns_series(live):
    prom, end, step = live["prom"], live["end"], STEP_S
    # Evaluation steps end exactly at `end`: a grid anchored at the start could stop up to a step before it.
    start = end - step * math.ceil((end - live["start"]) / step)
    assert sum(v for k, v in live["counts"].items() if k == "200") > 50, live["counts"]
    queries = []
    for dash in _dashboards(live["docs"]):
        queries += dashboard_queries(dash, resolve_variables(dash, prom, start, end))
    queries += rule_queries(live["rules"])
    rows, empty, stale = [], [], []
    for q in queries:
        series = prom.query_range(q.query, start, end, step)
        key = (q.source, q.name)
        row = {"kind": q.kind, "source": q.source, "name": q.name, "query": q.query, "series": len(series)}
        if key in EXPECTED_EMPTY:
            row["expected_empty"] = EXPECTED_EMPTY[key]
            if series:
                stale.append(key)
        elif not series:
            empty.append(f"{q.kind} {q.source} / {q.name}: {q.query}")
        rows.append(row)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps({
        "what": "series each shipped dashboard panel query / rule returned from a real Prometheus scraping a live "
                "local Ray (tests/monitoring/test_monitoring_live.py)",
        "wall_s": round(time.time() - live["start"], 1), "requests_by_status": live["counts"],
        "panels": sum(r["kind"] == "panel" for r in rows), "alerts": sum(r["kind"] == "alert" for r in rows),
        "records": sum(r["kind"] == "record" for r in rows), "empty": empty,
        "stale_expected_empty": [list(k) for k in stale], "queries": rows}, indent=1) + "\n")
    assert not empty, f"{len(empty)} of {len(rows)} queries returned no series:\n" + "\n".join(empty)
    assert not stale, f"{len(stale)} EXPECTED_EMPTY exemption(s) returned series; remove them or fix the reason:\n" \
        + "\n".join(f"{s} / {n} (exempt because: {EXPECTED_EMPTY[(s, n)]})" for s, n in stale)
    assert not [k for k in live["counts"] if k.startswith("5")], f"the policy server failed requests: {live['counts']}"


def test_exemption_reasons_hold(live):
    """The shared reasons of EXPECTED_EMPTY are facts about this run, checked here, not only prose."""
    premises = _premises(live)
    unused = {p for p in premises if not any(p in why for why in EXPECTED_EMPTY.values())}
    assert not unused, f"premises checked for reasons no exemption gives: {unused}"
    broken = {r: why for r, why in premises.items() if why}
    assert not broken, f"EXPECTED_EMPTY reasons that do not hold in this run: {broken}"


def test_every_exemption_names_a_shipped_query_and_says_why():
    """An exemption for a panel or rule that was renamed or removed hides nothing: fail on it (no Prometheus
    needed: the chart is rendered and its queries listed as the live test lists them)."""
    docs = _rendered(Tools(tool_env()))
    shipped = {(q.source, q.name) for dash in _dashboards(docs) for q in dashboard_queries(dash, {})}
    shipped |= {(q.source, q.name) for q in rule_queries(promconfig.rule_groups(docs))}
    assert len(shipped) > 150, len(shipped)
    unknown = sorted(set(EXPECTED_EMPTY) - shipped)
    assert not unknown, f"EXPECTED_EMPTY names queries the chart does not ship: {unknown}"
    assert all(len(why) > 20 for why in EXPECTED_EMPTY.values()), EXPECTED_EMPTY


def test_ray_dashboard_metrics_view_reaches_prometheus(live):
    """RAY_PROMETHEUS_HOST on the head: the Ray dashboard's metrics view finds this Prometheus."""
    r = live["dashboard_health"]
    assert r.status_code == 200, r.text


def _by(prom: Prometheus, query: str, at: float, label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in prom.api("query", query=query, time=at)["result"]}


def test_canary_figures_follow_the_traffic(live):
    """The per-version series and the canary rules' arithmetic agree with what the clients did: returns per version
    (the rule's mean and the clients' own), the split, the failing candidate's errors, shadow comparisons; and the
    worse-return condition holds for the candidate that earns less (its `for` is longer than this run)."""
    prom, end, eps = live["prom"], live["end"], live["episodes"]
    assert not eps["mixed"], f"{len(eps['mixed'])} sessions were answered by two versions"
    assert min(len(eps["champion"]), len(eps["candidate"])) >= 30, {k: len(v) for k, v in eps.items()}
    assert live["counts"].get("404") and live["counts"].get("409"), live["counts"]
    rules = yaml.safe_load((ROOT / "charts" / "rl-platform" / "values.yaml").read_text())["monitoring"]["rules"]
    # The 30m window holds the whole run: the rule's means are those of every episode Prometheus saw.
    assert end - live["start"] < 1800 and rules["canaryReturnWindow"] == "30m"
    mean = _by(prom, f'rl_platform:policy_version_return_mean:canary_window{{policy="{SPLIT}"}}', end, "version")
    for version in ("champion", "candidate"):
        client = sum(eps[version]) / len(eps[version])
        assert mean.get(version) == pytest.approx(client, rel=0.1), (version, mean, client)
    expr = next(r["expr"] for g in live["rules"]["groups"] for r in g["rules"]
                if r.get("alert") == "RLPolicyCanaryWorseReturn")
    z = prom.api("query", query=underlying(expr), time=end)["result"]
    assert [r["metric"]["policy"] for r in z] == [SPLIT] and float(z[0]["value"][1]) > rules["canaryReturnZ"], z
    by_version = "sum by (version, result) (increase(ray_rl_serve_version_requests_total{policy=\"%s\"}[30m]))"
    split = _by(prom, f"sum by (version) ({by_version % SPLIT})", end, "version")
    assert 0.3 < split["candidate"] / (split["candidate"] + split["champion"]) < 0.7, split
    faulty = {(r["metric"]["version"], r["metric"]["result"]): float(r["value"][1])
              for r in prom.api("query", query=by_version % FAULTY, time=end)["result"]}
    assert faulty.get(("candidate", "error"), 0) > 0 and not faulty.get(("candidate", "ok")), faulty
    assert not faulty.get(("champion", "error")), faulty
    shadow = _by(prom, f'sum by (outcome) (increase(ray_rl_serve_shadow_total{{policy="{SHADOW}"}}[30m]))', end,
                 "outcome")
    assert shadow.get("agree", 0) + shadow.get("disagree", 0) > 0, shadow
