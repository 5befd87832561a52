"""Policy-server metrics, recorded with `ray.util.metrics` so they are exported on Ray's metrics port
next to Serve's own `ray_serve_*` series. Ray prefixes every name with `ray_`; counters gain `_total`.

| exported name                                | type      | tags                          |
|----------------------------------------------|-----------|-------------------------------|
| ray_rl_serve_requests_total                  | counter   | policy, endpoint, status      |
| ray_rl_serve_request_latency_ms              | histogram | policy, endpoint              |
| ray_rl_serve_batch_size                      | histogram | policy                        |
| ray_rl_serve_inference_latency_ms            | histogram | policy                        |
| ray_rl_serve_policy_info                     | gauge     | policy, checkpoint_id, env, registry_version, alias |
| ray_rl_serve_policy_eval_return              | gauge     | policy, checkpoint_id, stat   |
| ray_rl_serve_policy_reloads_total            | counter   | policy, result                |
| ray_rl_serve_sessions                        | gauge     | policy                        |
| ray_rl_serve_version_requests_total          | counter   | policy, version, result       |
| ray_rl_serve_version_latency_ms              | histogram | policy, version               |
| ray_rl_serve_episodes_total                  | counter   | policy, version               |
| ray_rl_serve_episode_return_sum              | gauge     | policy, version               |
| ray_rl_serve_episode_return_sq_sum           | gauge     | policy, version               |
| ray_rl_serve_version_weight                  | gauge     | policy, version               |
| ray_rl_serve_version_info                    | gauge     | policy, version, checkpoint_id, mode |
| ray_rl_serve_version_sessions                | gauge     | policy, version               |
| ray_rl_serve_shadow_total                    | counter   | policy, outcome               |
| ray_rl_serve_feedback_total                  | counter   | policy, result                |
| ray_rl_serve_log_rows_total                  | counter   | policy, result                |
| ray_rl_serve_log_files_total                 | counter   | policy, result                |

`policy` is "-" for requests that name no known policy, so a client cannot grow the label set.
`registry_version` and `alias` are the registry's ("-" for a policy not loaded through `registry:`);
`policy_eval_return` carries the newest greedy evaluation of the served checkpoint (rl-eval), `stat` = mean |
ci95_low | ci95_high. `version` is the role under one policy name: "champion" | "candidate" (serving/versions.py);
`result` of version_requests is ok | error (a version's own failure, not a client's 4xx); `mode` of version_info
is split | shadow for the candidate, "-" for the champion; shadow `outcome` = agree | disagree | dropped | error;
feedback `result` = ok (accepted items) | unknown_session | session_ended | invalid (refused requests).
Transition log (serving/transitions.py): log_rows `result` = written | dropped (buffer full: max_buffer rows
waiting, an outage's unwritten rows included); log_files `result` = written | failed (a write the store refused;
its rows are kept and retried, so one row can be in several failed writes).
"""

from __future__ import annotations

from rl_metrics import KeptGauge

LATENCY_BOUNDARIES_MS = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0]
BATCH_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
INFERENCE_BOUNDARIES_MS = [0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 50.0, 250.0]

NAMES = {
    "requests": "rl_serve_requests",
    "latency": "rl_serve_request_latency_ms",
    "batch": "rl_serve_batch_size",
    "inference": "rl_serve_inference_latency_ms",
    "info": "rl_serve_policy_info",
    "eval": "rl_serve_policy_eval_return",
    "reloads": "rl_serve_policy_reloads",
    "sessions": "rl_serve_sessions",
    "version_requests": "rl_serve_version_requests",
    "version_latency": "rl_serve_version_latency_ms",
    "episodes": "rl_serve_episodes",
    "return_sum": "rl_serve_episode_return_sum",
    "return_sq_sum": "rl_serve_episode_return_sq_sum",
    "version_weight": "rl_serve_version_weight",
    "version_info": "rl_serve_version_info",
    "version_sessions": "rl_serve_version_sessions",
    "shadow": "rl_serve_shadow",
    "feedback": "rl_serve_feedback",
    "log_rows": "rl_serve_log_rows",
    "log_files": "rl_serve_log_files",
}


class ServerMetrics:
    def __init__(self) -> None:
        from ray.util import metrics as m

        self.requests = m.Counter(
            NAMES["requests"], "Policy server HTTP requests by policy, endpoint and status code.",
            tag_keys=("policy", "endpoint", "status"),
        )
        self.latency = m.Histogram(
            NAMES["latency"], "Time in the replica from request received to response built (ms).",
            boundaries=LATENCY_BOUNDARIES_MS, tag_keys=("policy", "endpoint"),
        )
        self.batch = m.Histogram(
            NAMES["batch"], "Observations per forward pass (dynamic batching and batch requests).",
            boundaries=BATCH_BOUNDARIES, tag_keys=("policy",),
        )
        self.inference = m.Histogram(
            NAMES["inference"], "RLModule forward_inference time per batch (ms).",
            boundaries=INFERENCE_BOUNDARIES_MS, tag_keys=("policy",),
        )
        self.info = KeptGauge(
            NAMES["info"], "1 for the checkpoint a policy currently serves, 0 for ones it served before.",
            tag_keys=("policy", "checkpoint_id", "env", "registry_version", "alias"),
        )
        self.eval = KeptGauge(
            NAMES["eval"], "Greedy evaluation return of the served checkpoint (newest rl-eval record).",
            tag_keys=("policy", "checkpoint_id", "stat"),
        )
        self.reloads = m.Counter(
            NAMES["reloads"], "Checkpoint (re)loads by result (ok / error).", tag_keys=("policy", "result"),
        )
        self.sessions = KeptGauge(
            NAMES["sessions"], "Open frame-stacking sessions per policy (replica-local).", tag_keys=("policy",),
        )
        pv = ("policy", "version")
        self.version_requests = m.Counter(
            NAMES["version_requests"], "act/act_batch requests per version (champion/candidate) by result "
            "(ok, or error: the version itself failed).", tag_keys=("policy", "version", "result"))
        self.version_latency = m.Histogram(
            NAMES["version_latency"], "act/act_batch time in the replica per version that answered (ms).",
            boundaries=LATENCY_BOUNDARIES_MS, tag_keys=pv)
        self.episodes = m.Counter(NAMES["episodes"], "Episodes ended by feedback (done=true) per version.",
                                  tag_keys=pv)
        self.return_sum = KeptGauge(NAMES["return_sum"], "Sum of ended episodes' returns per version in this "
                                    "replica, across loads like the episodes counter.", tag_keys=pv)
        self.return_sq_sum = KeptGauge(NAMES["return_sq_sum"], "Sum of squared episode returns per version in "
                                       "this replica, across loads like the episodes counter.", tag_keys=pv)
        self.version_weight = KeptGauge(NAMES["version_weight"], "Configured traffic share per version (champion "
                                        "1-w, candidate w; shadow: champion 1).", tag_keys=pv)
        self.version_info = KeptGauge(NAMES["version_info"], "1 for the checkpoint a version serves now, 0 before.",
                                      tag_keys=("policy", "version", "checkpoint_id", "mode"))
        self.version_sessions = KeptGauge(NAMES["version_sessions"], "Sticky sessions open per version "
                                          "(replica-local).", tag_keys=pv)
        self.shadow = m.Counter(NAMES["shadow"], "Shadow comparisons by outcome (agree, disagree, dropped: "
                                "queue full, error: the candidate failed).", tag_keys=("policy", "outcome"))
        self.feedback_total = m.Counter(NAMES["feedback"], "Feedback: accepted items (ok) and refused requests "
                                        "(unknown_session, session_ended, invalid).", tag_keys=("policy", "result"))
        self.log_rows_total = m.Counter(NAMES["log_rows"], "Transition log rows: written to the store, or dropped "
                                        "(buffer full).", tag_keys=("policy", "result"))
        self.log_files_total = m.Counter(NAMES["log_files"], "Transition log Parquet files: written, or failed "
                                         "(the store refused; rows kept and retried).", tag_keys=("policy", "result"))
        # Tag dicts are reused: building them per request is a measurable share of a ~1 ms request.
        self._req_tags: dict[tuple[str, str, int], dict[str, str]] = {}
        self._lat_tags: dict[tuple[str, str], dict[str, str]] = {}
        self._pol_tags: dict[str, dict[str, str]] = {}
        self._pv_tags: dict[tuple[str, str], dict[str, str]] = {}
        # (policy, version) -> [return sum, sum of squares], running across loads like the episodes counter (a reset
        # at load made a baseline scraped before the reload hold the previous candidate's sum: CI saw a window mean of
        # -271). Set only by `episode`: Ray exports a counter from its first increment only, so the return gauges
        # must not start earlier either, or the canary rules' increase() of the counter misses the episodes of its
        # first export while delta() of the gauges counts them (means read ~12 % high in a live run).
        self._returns: dict[tuple[str, str], list[float]] = {}
        self._pvr_tags: dict[tuple[str, str, str], dict[str, str]] = {}
        self._out_tags: dict[tuple[str, str], dict[str, str]] = {}

    def request(self, policy: str, endpoint: str, status: int, latency_ms: float) -> None:
        key = (policy, endpoint, status)
        tags = self._req_tags.get(key)
        if tags is None:
            tags = self._req_tags[key] = {"policy": policy, "endpoint": endpoint, "status": str(status)}
        self.requests.inc(1.0, tags)
        lkey = (policy, endpoint)
        ltags = self._lat_tags.get(lkey)
        if ltags is None:
            ltags = self._lat_tags[lkey] = {"policy": policy, "endpoint": endpoint}
        self.latency.observe(latency_ms, ltags)

    def _ptags(self, policy: str) -> dict[str, str]:
        tags = self._pol_tags.get(policy)
        if tags is None:
            tags = self._pol_tags[policy] = {"policy": policy}
        return tags

    def forward(self, policy: str, batch_size: int, inference_ms: float) -> None:
        tags = self._ptags(policy)
        self.batch.observe(batch_size, tags)
        self.inference.observe(inference_ms, tags)

    @staticmethod
    def info_tags(policy: str, checkpoint_id: str, env: str | None, registry: dict | None = None) -> dict[str, str]:
        reg = registry or {}
        return {"policy": policy, "checkpoint_id": checkpoint_id, "env": env or "-",
                "registry_version": str(reg.get("version") or "-"), "alias": str(reg.get("alias") or "-")}

    def loaded(self, tags: dict[str, str], previous: dict[str, str] | None,
               evaluation: dict | None = None) -> None:
        """`tags` (info_tags) of the checkpoint a policy serves now; `previous` those of the one it replaced."""
        if previous is not None and previous != tags:
            self.info.set(0, previous)
        self.info.set(1, tags)
        if evaluation:
            base = {"policy": tags["policy"], "checkpoint_id": tags["checkpoint_id"]}
            for stat, value in (("mean", evaluation["mean"]), ("ci95_low", evaluation["ci95"][0]),
                                ("ci95_high", evaluation["ci95"][1])):
                self.eval.set(float(value), {**base, "stat": stat})

    def reload(self, policy: str, ok: bool) -> None:
        self.reloads.inc(1.0, {"policy": policy, "result": "ok" if ok else "error"})

    def set_sessions(self, policy: str, n: int) -> None:
        self.sessions.set(n, self._ptags(policy))

    # ------------------------------------------------------------------ versions (serving/versions.py)

    def pv_tags(self, policy: str, version: str) -> dict[str, str]:
        key = (policy, version)
        tags = self._pv_tags.get(key)
        if tags is None:
            tags = self._pv_tags[key] = {"policy": policy, "version": version}
        return tags

    def version_request(self, policy: str, version: str, ok: bool, latency_ms: float | None) -> None:
        """One act/act_batch request of a version; latency only for the version that answered."""
        result = "ok" if ok else "error"
        key = (policy, version, result)
        tags = self._pvr_tags.get(key)
        if tags is None:
            tags = self._pvr_tags[key] = {"policy": policy, "version": version, "result": result}
        self.version_requests.inc(1.0, tags)
        if latency_ms is not None:
            self.version_latency.observe(latency_ms, self.pv_tags(policy, version))

    def episode(self, policy: str, version: str, ret: float) -> None:
        """An episode of `version` ended with return `ret`: the episodes counter and the version's running return
        sums move together, so any one scrape's (episodes, return_sum) pair is consistent with any other's."""
        tags = self.pv_tags(policy, version)
        sums = self._returns.setdefault((policy, version), [0.0, 0.0])
        sums[0] += ret
        sums[1] += ret * ret
        self.episodes.inc(1.0, tags)
        self.return_sum.set(sums[0], tags)
        self.return_sq_sum.set(sums[1], tags)

    def version_loaded(self, policy: str, version: str, checkpoint_id: str, mode: str | None,
                       previous: tuple[str, str | None] | None, weight: float) -> None:
        """A version (role) serves `checkpoint_id` in `mode` now; `previous` (checkpoint_id, mode) it served before.
        The role's episode counter and return sums run on across loads (a window's figures are differences)."""
        now = {"policy": policy, "version": version, "checkpoint_id": checkpoint_id, "mode": mode or "-"}
        # The weight first, the info last: a report that shows the new checkpoint_id shows its weight too.
        self.version_weight.set(weight, self.pv_tags(policy, version))
        if previous is not None and (previous[0], previous[1] or "-") != (checkpoint_id, mode or "-"):
            self.version_info.set(0, {**now, "checkpoint_id": previous[0], "mode": previous[1] or "-"})
        self.version_info.set(1, now)

    def version_gone(self, policy: str, version: str, checkpoint_id: str, mode: str | None) -> None:
        self.version_info.set(0, {"policy": policy, "version": version, "checkpoint_id": checkpoint_id,
                                  "mode": mode or "-"})
        tags = self.pv_tags(policy, version)
        self.version_weight.set(0.0, tags)
        self.version_sessions.set(0, tags)

    def set_weight(self, policy: str, version: str, weight: float) -> None:
        self.version_weight.set(weight, self.pv_tags(policy, version))

    def set_version_sessions(self, policy: str, version: str, n: int) -> None:
        self.version_sessions.set(n, self.pv_tags(policy, version))

    def shadow_outcome(self, policy: str, outcome: str, n: int = 1) -> None:
        key = (policy, outcome)
        tags = self._out_tags.get(key)
        if tags is None:
            tags = self._out_tags[key] = {"policy": policy, "outcome": outcome}
        self.shadow.inc(float(n), tags)

    def feedback(self, policy: str, result: str, n: int = 1) -> None:
        self.feedback_total.inc(float(n), {"policy": policy, "result": result})

    def log_rows(self, policy: str, result: str, n: int = 1) -> None:
        self.log_rows_total.inc(float(n), {"policy": policy, "result": result})

    def log_files(self, policy: str, result: str) -> None:
        self.log_files_total.inc(1.0, {"policy": policy, "result": result})
