"""A real Prometheus server for tests, and the queries the chart ships: every dashboard panel target (with Grafana's
template variables resolved as Grafana would) and every rule expression (alert conditions without their threshold).
Also the chart's PodMonitors against a live cluster: `start_podmonitor_prometheus` runs the upstream Prometheus
(hack/tools.sh prometheus-k8s, the one with kubernetes_sd) on the scrape config hack/promconfig.py generates from them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
import promconfig  # noqa: E402
from trainer_helpers import free_port, free_ports, stop_process  # noqa: E402,F401 - re-exported for the monitoring tests

# Grafana's interval variables. $__rate_interval is max(4 x scrape interval, step + scrape interval) in Grafana;
# the live test scrapes every 2 s (its evaluation step is finer, see test_monitoring_live.STEP_S), so a 20 s rate
# window holds at least 4 samples of a series, as a panel on a real Grafana would at its usual step.
GRAFANA_INTERVALS = {"__rate_interval": "20s", "__interval": "5s", "__range": "5m", "__range_s": "300"}
# A trailing `<op> <number>` of an alert expression: the threshold, stripped to see the underlying series.
_THRESHOLD = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*[-+]?[0-9.]+(e[-+]?[0-9]+)?\s*$", re.I)


@dataclass
class Query:
    kind: str  # panel | alert | record
    source: str  # dashboard uid or rule group
    name: str  # panel title (with refId) or rule name
    expr: str  # as shipped
    query: str  # what is evaluated


class Prometheus:
    """`prometheus` on 127.0.0.1:<ephemeral port> with its own data dir; stopped (SIGTERM, then SIGKILL) by stop()."""

    def __init__(self, binary: str, config: dict[str, Any], workdir: Path, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.config_path}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
            stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self.wait_ready(60)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {timeout_s}s:\n{self.log_tail()}")

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise ValueError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query_range(self, query: str, start: float, end: float, step: float = 5) -> list[dict]:
        return self.api("query_range", query=query, start=start, end=end, step=step)["result"]

    def query(self, query: str) -> list[dict]:
        return self.api("query", query=query)["result"]

    def targets(self) -> list[dict]:
        """/api/v1/targets' active targets: scrapePool (the job), labels, health (up|down|unknown), lastError."""
        return self.api("targets", state="active")["activeTargets"]

    def own_metrics(self) -> dict[str, list]:
        """Prometheus' own /metrics: family name -> samples."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        return {f.name: f.samples for f in text_string_to_metric_families(text)}

    def discovery_report(self) -> str:
        """One line on service discovery, from Prometheus' own metrics: apiserver requests by status code, targets
        discovered per job, and the active targets' health (kubernetes_sd logs its failures only at debug level)."""
        m = self.own_metrics()
        requests = {s.labels["status_code"]: int(s.value) for s in m.get("prometheus_sd_kubernetes_http_request", [])
                    if s.name.endswith("_total")}
        discovered = {s.labels["config"]: int(s.value) for s in m.get("prometheus_sd_discovered_targets", [])
                      if s.labels.get("name") == "scrape"}
        health: dict[str, list[str]] = {}
        for t in self.targets():
            health.setdefault(t["scrapePool"], []).append(
                t["health"] + (f" ({t['lastError']})" if t.get("lastError") else ""))
        return (f"{self.failed_discovery_configs()} scrape job(s) failed to start discovery; kubernetes_sd apiserver "
                f"requests by status {requests or 'none'}; discovered targets {discovered}; active targets "
                f"{health or 'none'}")

    def failed_discovery_configs(self) -> int:
        """Scrape jobs whose service discovery could not be created (e.g. an unreadable kubeconfig): Prometheus
        logs them and keeps running without their targets."""
        return sum(int(s.value) for s in self.own_metrics().get("prometheus_sd_failed_configs", [])
                   if s.labels.get("name") == "scrape")

    def wait_for_targets(self, timeout_s: float, jobs: Iterable[str] | None = None) -> list[dict]:
        """Poll until every job in `jobs` (default: every scrape job in the config) has an active target and all its
        active targets are up; return the active targets. Raises AssertionError naming what service discovery and
        the scrapes saw."""
        jobs = set(jobs or (c["job_name"] for c in self.config.get("scrape_configs", [])))
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.log_tail()}")
            active = self.targets()
            pools = {j: [t for t in active if t["scrapePool"] == j] for j in jobs}
            if all(ts and all(t["health"] == "up" for t in ts) for ts in pools.values()):
                return active
            if time.monotonic() > deadline:
                raise AssertionError(f"not every scrape job in {sorted(jobs)} has all targets up after {timeout_s}s: "
                                     f"{self.discovery_report()}")
            time.sleep(0.5)

    def log_tail(self, n: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text()[-n:]

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGTERM)
        self._log.close()


# -- the chart's PodMonitors on a live cluster ------------------------------------------------------------------------
def podmonitor_config(rendered: Iterable[dict[str, Any]] | Path | str, kubeconfig: Path | str,
                      scrape_interval: str | None = None) -> dict[str, Any]:
    """prometheus.yml scraping what the rendered chart's PodMonitors select, discovered through `kubeconfig`'s
    apiserver (hack/promconfig.py, as the operator would generate it). `rendered`: `helm template` documents, or a
    file of its output. `scrape_interval` replaces the PodMonitors' own (a test wants samples sooner)."""
    docs = promconfig.load(str(rendered)) if isinstance(rendered, (str, Path)) else list(rendered)
    configs = promconfig.scrape_configs(docs, promconfig.kubeconfig_path(str(kubeconfig)))
    if not configs:
        raise ValueError("no PodMonitor in the rendered chart (render it with monitoring.enabled=true)")
    if scrape_interval:
        for c in configs:
            c["scrape_interval"] = scrape_interval
            c.pop("scrape_timeout", None)  # the PodMonitor's may exceed the new interval; Prometheus caps the default
    return {"global": {"scrape_interval": scrape_interval or "15s"}, "scrape_configs": configs}


def start_podmonitor_prometheus(binary: str, kubeconfig: Path | str, rendered: Iterable[dict[str, Any]] | Path | str,
                                workdir: Path, scrape_interval: str | None = "5s") -> Prometheus:
    """The upstream Prometheus (PROMETHEUS_K8S of `hack/tools.sh env`) on 127.0.0.1:<free port>, scraping the pods the
    chart's PodMonitors select. Query it with .targets() / .wait_for_targets() / .query(); stop it with .stop()."""
    prom = Prometheus(binary, podmonitor_config(rendered, kubeconfig, scrape_interval), workdir)
    if prom.failed_discovery_configs():  # known once ready: the config (and its discovery) loads before that
        prom.stop()
        errors = [ln for ln in prom.log_path.read_text().splitlines() if "Cannot create service discovery" in ln]
        raise ValueError(f"kubernetes_sd could not start: {errors[0] if errors else prom.log_tail(500)}")
    return prom


# -- dashboards ------------------------------------------------------------------------------------------------------
def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel with queries, rows' nested panels included."""
    out = []
    for p in dash.get("panels", []):
        out += panels(p) if p.get("type") == "row" and p.get("panels") else [p] if p.get("targets") else []
    return out


def _all_value(var: dict[str, Any]) -> str:
    if var.get("allValue"):
        return var["allValue"]
    options = [o["value"] for o in var.get("options", []) if o.get("value") not in (None, "$__all")]
    if not options and var.get("type") == "custom":
        options = [v.strip() for v in str(var.get("query", "")).split(",") if v.strip()]
    # Grafana's "All" without allValue: a regex alternation of every option.
    return "(" + "|".join(re.escape(o) for o in options) + ")" if options else ".*"


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, m.group(0))

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", one, expr)


def resolve_variables(dash: dict[str, Any], prom: Prometheus, start: float, end: float) -> dict[str, str]:
    """Template variables as Grafana's defaults pick them: "All" where the variable offers it, else the first value
    `label_values(...)` finds in Prometheus."""
    values = dict(GRAFANA_INTERVALS)
    for var in dash.get("templating", {}).get("list", []):
        name, kind = var["name"], var.get("type")
        if kind == "datasource":
            continue
        if var.get("includeAll"):
            values[name] = _all_value(var)
            continue
        query = var.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        m = re.fullmatch(r"\s*label_values\((?:(.*),\s*)?(\w+)\)\s*", str(query or ""))
        if kind == "query" and m:
            selector, label = substitute(m.group(1) or "", values), m.group(2)
            params = {"start": start, "end": end}
            if selector:
                params["match[]"] = selector
            found = sorted(prom.api(f"label/{label}/values", **params))
            values[name] = found[0] if found else ""
        elif kind in ("custom", "constant", "textbox"):
            values[name] = str(var.get("query", "")).split(",")[0].strip()
    return values


def dashboard_queries(dash: dict[str, Any], values: dict[str, str]) -> list[Query]:
    out = []
    for p in panels(dash):
        for t in p["targets"]:
            if t.get("expr"):
                out.append(Query("panel", dash["uid"], f"{p.get('title', p['id'])} [{t.get('refId', '?')}]",
                                 t["expr"], substitute(t["expr"], values)))
    return out


# -- rules -----------------------------------------------------------------------------------------------------------
def underlying(expr: str) -> str:
    """An alert condition without its trailing threshold comparison: `x / y > 0.05` -> `x / y`."""
    return _THRESHOLD.sub("", expr.strip())


def rule_queries(groups: dict[str, Any]) -> list[Query]:
    out = []
    for g in groups["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                out.append(Query("alert", g["name"], r["alert"], r["expr"], underlying(r["expr"])))
            else:
                out.append(Query("record", g["name"], r["record"], r["expr"], r["record"]))
    return out


def env_path(key: str) -> str | None:
    p = os.environ.get(key)
    return p if p and os.path.exists(p) else None
