"""Policy-server metrics, recorded with `ray.util.metrics` so they are exported on Ray's metrics port
next to Serve's own `ray_serve_*` series. Ray prefixes every name with `ray_`; counters gain `_total`.

| exported name                                | type      | tags                          |
|----------------------------------------------|-----------|-------------------------------|
| ray_rl_serve_requests_total                  | counter   | policy, endpoint, status      |
| ray_rl_serve_request_latency_ms              | histogram | policy, endpoint              |
| ray_rl_serve_batch_size                      | histogram | policy                        |
| ray_rl_serve_inference_latency_ms            | histogram | policy                        |
| ray_rl_serve_policy_info                     | gauge     | policy, checkpoint_id, env, version, alias |
| ray_rl_serve_policy_eval_return              | gauge     | policy, checkpoint_id, stat   |
| ray_rl_serve_policy_reloads_total            | counter   | policy, result                |
| ray_rl_serve_sessions                        | gauge     | policy                        |

`policy` is "-" for requests that name no known policy, so a client cannot grow the label set. `version` and
`alias` are the registry's ("-" for a policy not loaded through `registry:`); `policy_eval_return` carries the
newest greedy evaluation of the served checkpoint (rl-eval), `stat` = mean | ci95_low | ci95_high.
"""

from __future__ import annotations

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
        self.info = m.Gauge(
            NAMES["info"], "1 for the checkpoint a policy currently serves, 0 for ones it served before.",
            tag_keys=("policy", "checkpoint_id", "env", "version", "alias"),
        )
        self.eval = m.Gauge(
            NAMES["eval"], "Greedy evaluation return of the served checkpoint (newest rl-eval record).",
            tag_keys=("policy", "checkpoint_id", "stat"),
        )
        self.reloads = m.Counter(
            NAMES["reloads"], "Checkpoint (re)loads by result (ok / error).", tag_keys=("policy", "result"),
        )
        self.sessions = m.Gauge(
            NAMES["sessions"], "Open frame-stacking sessions per policy (replica-local).", tag_keys=("policy",),
        )
        # Tag dicts are reused: building them per request is a measurable share of a ~1 ms request.
        self._req_tags: dict[tuple[str, str, int], dict[str, str]] = {}
        self._lat_tags: dict[tuple[str, str], dict[str, str]] = {}
        self._pol_tags: dict[str, dict[str, str]] = {}

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
                "version": str(reg.get("version") or "-"), "alias": str(reg.get("alias") or "-")}

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
