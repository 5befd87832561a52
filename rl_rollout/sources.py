"""Where the figures come from: the policy server's own stats endpoint or Prometheus's HTTP API. Both return a
`figures.Snapshot` (cumulative, per version) or raise `FiguresUnavailable` with a one-line reason.

  ServerStats   GET <server>/v1/policies/NAME/stats: one replica's figures per answer. Answers are kept per
                replica id and summed (latest of each replica seen), which is exact with one replica (the local
                default); for several replicas behind one URL use Prometheus.
  Prometheus    instant queries (/api/v1/query) over the series the server exports, summed over replicas and
                filtered by policy (plus --prom-selector's label matchers, e.g. namespace="rl"):

    requests       sum by (version) (ray_rl_serve_version_requests_total{policy="NAME"})
    errors         sum by (version) (ray_rl_serve_version_requests_total{policy="NAME",result="error"})
    latency        sum by (version, le) (ray_rl_serve_version_latency_ms_bucket{policy="NAME"})
    episodes       sum by (version) (ray_rl_serve_episodes_total{policy="NAME"})
    return_sum     sum by (version) (ray_rl_serve_episode_return_sum{policy="NAME"})
    return_sq_sum  sum by (version) (ray_rl_serve_episode_return_sq_sum{policy="NAME"})
    sessions       sum by (version) (ray_rl_serve_version_sessions{policy="NAME"})
    shadow         sum by (outcome) (ray_rl_serve_shadow_total{policy="NAME"})
    served         sum by (version, checkpoint_id) (ray_rl_serve_version_info{policy="NAME"})

`served` names the checkpoint each version serves in the figures (the replicas serving it; 0 for what a version
served before): a snapshot's `checkpoint_id` per version, so the controller waits for Prometheus, which scrapes
seconds behind the server, to show the versions it just applied before it takes a baseline (several at once while
replicas change over reads as their ids joined by "+").

A series that does not exist yet (Ray exports a counter once it was first incremented) reads as 0; a missing
sessions series means "unknown" (the promotion then does not wait for sticky sessions to drain).

`ServerClient` also reads GET /v1/policies/NAME (what is served), which the controller polls to confirm that the
server applied a config change.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import requests

from rl_rollout.errors import FiguresUnavailable, RolloutError
from rl_rollout.figures import ROLES, SHADOW_KEYS, Snapshot, VersionFigures, _le

TIMEOUT_S = (3.0, 10.0)  # connect, read


def _short(e: Exception) -> str:
    text = str(e)
    for known in ("Connection refused", "timed out", "Name or service not known", "No route to host",
                  "Network is unreachable", "Connection reset"):
        if known.lower() in text.lower():
            return known.lower()
    return " ".join(text.split())[:200]


def _base(url: str, flag: str) -> str:
    if not re.match(r"^https?://[^/\s]+", url or ""):
        raise RolloutError(f"{flag} {url!r}: expected http(s)://HOST[:PORT]")
    return url.rstrip("/")


# ---------------------------------------------------------------------------------------------- the server
class ServerClient:
    """The policy server's HTTP API, as far as the controller reads it."""

    def __init__(self, url: str):
        self.url = _base(url, "--server")
        self.http = requests.Session()

    def _get(self, path: str) -> Any:
        try:
            r = self.http.get(self.url + path, timeout=TIMEOUT_S)
        except requests.RequestException as e:
            raise FiguresUnavailable(f"the server at {self.url} is unreachable: {_short(e)}") from None
        if r.status_code == 404:
            raise LookupError(self._error_text(r))
        if r.status_code != 200:
            raise FiguresUnavailable(f"GET {path} answered {r.status_code}: {self._error_text(r)}")
        try:
            return r.json()
        except ValueError:
            raise FiguresUnavailable(f"GET {path} answered 200 without JSON") from None

    @staticmethod
    def _error_text(r: requests.Response) -> str:
        try:
            body = r.json()
            err = body.get("error", body) if isinstance(body, dict) else body
            if isinstance(err, dict):
                return str(err.get("message") or err.get("detail") or err)
            return str(err)[:300]
        except ValueError:
            return (r.text or r.reason or "").strip()[:300]

    def info(self, name: str) -> dict[str, Any]:
        """GET /v1/policies/NAME; LookupError when the server does not serve NAME."""
        return self._get(f"/v1/policies/{name}")

    def stats(self, name: str) -> dict[str, Any]:
        return self._get(f"/v1/policies/{name}/stats")


def version_from_stats(raw: dict[str, Any]) -> VersionFigures:
    lat = raw.get("latency_ms") or {}
    shadow = raw.get("shadow")
    return VersionFigures(
        requests=int(raw.get("requests", 0)), errors=int(raw.get("errors", 0)),
        latency_le=tuple(_le(b) for b in lat.get("le") or ()), latency_counts=tuple(lat.get("counts") or ()),
        episodes=int(raw.get("episodes", 0)), return_sum=float(raw.get("return_sum", 0.0)),
        return_sq_sum=float(raw.get("return_sq_sum", 0.0)),
        active_sessions=None if raw.get("active_sessions") is None else int(raw["active_sessions"]),
        shadow={k: int(shadow.get(k, 0)) for k in SHADOW_KEYS} if isinstance(shadow, dict) else None,
        checkpoint_id=raw.get("checkpoint_id"), weight=raw.get("weight"), mode=raw.get("mode"))


def add(a: VersionFigures, b: VersionFigures) -> VersionFigures:
    """Two replicas' figures of one version, summed (histograms bucket by bucket)."""
    if a.latency_counts and b.latency_counts and a.latency_le != b.latency_le:
        raise FiguresUnavailable(f"replicas report different latency buckets ({list(a.latency_le)} vs "
                                 f"{list(b.latency_le)})")
    counts = (tuple(x + y for x, y in zip(a.latency_counts, b.latency_counts))
              if a.latency_counts and b.latency_counts else a.latency_counts or b.latency_counts)
    shadow = None
    if a.shadow is not None or b.shadow is not None:
        shadow = {k: (a.shadow or {}).get(k, 0) + (b.shadow or {}).get(k, 0) for k in SHADOW_KEYS}
    sessions = None if a.active_sessions is None and b.active_sessions is None else \
        (a.active_sessions or 0) + (b.active_sessions or 0)
    return VersionFigures(a.requests + b.requests, a.errors + b.errors, a.latency_le or b.latency_le, counts,
                          a.episodes + b.episodes, a.return_sum + b.return_sum, a.return_sq_sum + b.return_sq_sum,
                          sessions, shadow, a.checkpoint_id or b.checkpoint_id,
                          a.weight if a.weight is not None else b.weight, a.mode or b.mode)


class ServerStats:
    """Figures from the server's stats endpoint, summed over the replicas seen so far."""

    def __init__(self, server: ServerClient, name: str):
        self.server, self.name = server, name
        self.kind = f"server {server.url}"
        self._replicas: dict[str, tuple[VersionFigures, VersionFigures | None]] = {}

    def fetch(self) -> Snapshot:
        try:
            raw = self.server.stats(self.name)
        except LookupError as e:
            raise FiguresUnavailable(f"GET /v1/policies/{self.name}/stats answered 404: {e}") from None
        try:
            versions = raw["versions"]
            champ = version_from_stats(versions["champion"])
            cand = version_from_stats(versions["candidate"]) if versions.get("candidate") else None
            replica = str(raw.get("replica", ""))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise FiguresUnavailable(f"GET /v1/policies/{self.name}/stats: unexpected answer ({e!r})") from None
        self._replicas[replica] = (champ, cand)
        total_champ, total_cand = VersionFigures(), None
        for ch, ca in self._replicas.values():
            total_champ = add(total_champ, ch)
            if ca is not None:
                total_cand = ca if total_cand is None else add(total_cand, ca)
        # Identity and configured share come from the newest answer, not the sum.
        total_champ = _identity(total_champ, champ)
        total_cand = _identity(total_cand, cand) if total_cand is not None and cand is not None else total_cand
        return Snapshot(at=float(raw.get("at") or time.time()), champion=total_champ, candidate=total_cand,
                        source=self.kind)


def _identity(total: VersionFigures, newest: VersionFigures) -> VersionFigures:
    from dataclasses import replace

    return replace(total, checkpoint_id=newest.checkpoint_id, weight=newest.weight, mode=newest.mode)


# ---------------------------------------------------------------------------------------------- Prometheus
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*'
_SELECTOR = re.compile(rf"^{_MATCHER}(,{_MATCHER})*,?\s*$")
SERIES = {
    "requests": ("ray_rl_serve_version_requests_total", "version", {}),
    "errors": ("ray_rl_serve_version_requests_total", "version", {"result": "error"}),
    "latency": ("ray_rl_serve_version_latency_ms_bucket", "version, le", {}),
    "episodes": ("ray_rl_serve_episodes_total", "version", {}),
    "return_sum": ("ray_rl_serve_episode_return_sum", "version", {}),
    "return_sq_sum": ("ray_rl_serve_episode_return_sq_sum", "version", {}),
    "sessions": ("ray_rl_serve_version_sessions", "version", {}),
    "shadow": ("ray_rl_serve_shadow_total", "outcome", {}),
    "served": ("ray_rl_serve_version_info", "version, checkpoint_id", {}),
}


def check_selector(extra: str | None) -> str | None:
    """--prom-selector: extra label matchers such as `namespace="rl",pod=~"rl-.*"` (no braces)."""
    if extra is None or not extra.strip():
        return None
    if not _SELECTOR.match(extra):
        raise RolloutError(f"--prom-selector {extra!r}: expected label matchers such as namespace=\"rl\" "
                           "(comma-separated, values in double quotes, no braces)")
    return extra.strip().rstrip(",")


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def query(figure: str, policy: str, extra: str | None = None) -> str:
    """The PromQL of one figure for one policy (see the module docstring)."""
    metric, by, labels = SERIES[figure]
    matchers = [f"policy={_quote(policy)}"] + [f"{k}={_quote(v)}" for k, v in labels.items()]
    if extra:
        matchers.append(extra)
    return f"sum by ({by}) ({metric}{{{','.join(matchers)}}})"


class Prometheus:
    def __init__(self, url: str, name: str, selector: str | None = None):
        self.url, self.name = _base(url, "--prometheus"), name
        self.selector = check_selector(selector)
        self.kind = f"prometheus {self.url}"
        self.http = requests.Session()

    def instant(self, promql: str) -> list[dict[str, Any]]:
        try:
            r = self.http.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=TIMEOUT_S)
        except requests.RequestException as e:
            raise FiguresUnavailable(f"Prometheus at {self.url} is unreachable: {_short(e)}") from None
        try:
            body = r.json()
        except ValueError:
            raise FiguresUnavailable(f"Prometheus at {self.url} answered {r.status_code} without JSON "
                                     f"({(r.text or '').strip()[:120]!r})") from None
        if r.status_code != 200 or body.get("status") != "success":
            raise FiguresUnavailable(f"Prometheus query failed ({r.status_code} {body.get('errorType', '')}: "
                                     f"{body.get('error', '')}): {promql}")
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise FiguresUnavailable(f"Prometheus answered a {data.get('resultType')!r}, not a vector: {promql}")
        return data.get("result") or []

    def fetch(self) -> Snapshot:
        at = time.time()
        got = {f: self.instant(query(f, self.name, self.selector)) for f in SERIES}

        def per_version(figure: str) -> dict[str, float]:
            out: dict[str, float] = {}
            for s in got[figure]:
                v = float(s["value"][1])
                out[s["metric"].get("version", "")] = 0.0 if math.isnan(v) else v
            return out

        buckets: dict[str, dict[float, float]] = {r: {} for r in ROLES}
        for s in got["latency"]:
            role = s["metric"].get("version", "")
            if role in buckets and "le" in s["metric"]:
                buckets[role][_le(s["metric"]["le"])] = float(s["value"][1])
        shadow = {s["metric"].get("outcome", ""): int(float(s["value"][1])) for s in got["shadow"]}
        served: dict[str, list[str]] = {r: [] for r in ROLES}
        for s in got["served"]:
            role, cid = s["metric"].get("version", ""), s["metric"].get("checkpoint_id", "")
            if role in served and cid and float(s["value"][1]) > 0:
                served[role].append(cid)
        req, err, eps = per_version("requests"), per_version("errors"), per_version("episodes")
        rs, rsq, sess = per_version("return_sum"), per_version("return_sq_sum"), per_version("sessions")
        figs = {}
        for role in ROLES:
            le = tuple(sorted(buckets[role]))
            figs[role] = VersionFigures(
                requests=int(req.get(role, 0)), errors=int(err.get(role, 0)), latency_le=le,
                latency_counts=tuple(buckets[role][b] for b in le), episodes=int(eps.get(role, 0)),
                return_sum=rs.get(role, 0.0), return_sq_sum=rsq.get(role, 0.0),
                active_sessions=int(sess[role]) if role in sess else None,
                shadow={"compared": shadow.get("agree", 0) + shadow.get("disagree", 0),
                        "agreed": shadow.get("agree", 0), "dropped": shadow.get("dropped", 0),
                        "errors": shadow.get("error", 0)} if role == "candidate" else None,
                checkpoint_id="+".join(sorted(served[role])) or None)
        return Snapshot(at=at, champion=figs["champion"], candidate=figs["candidate"], source=self.kind)
