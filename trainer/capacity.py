"""Can this Ray ever run the request? Checked before the algorithm is built, so a request no node can satisfy
fails in seconds with one line naming the missing resource, instead of RLlib waiting for actors for ever.

The request: every env runner and learner actor is a bundle of Ray resources (CPU, GPU, the rollout/learner pool
resources); a Tune trial adds one CPU for its driver actor. It fits when each bundle fits on some node and the sum
fits the cluster. An embedded Ray cannot grow: a misfit fails at once. A cluster may add nodes (KubeRay
autoscaler): the trainer waits up to `resources.wait_for_resources_s` for nodes to join, then fails, unless the
autoscaler reported its node groups' maxima and even those cannot fit the request (fail at once). While it waits,
the request is posted to the autoscaler (Ray's `request_resources`): an autoscaler adds nodes for pending actors, and
the trainer creates none until they fit, so without it a group at zero (KubeRay `minReplicas: 0`) would never grow.
The request is withdrawn as soon as the nodes are there (the actors then hold them; idle nodes can go after the run)
or the wait fails.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Callable, Mapping

from trainer.errors import TrainerError

Bundle = Mapping[str, float]


def request(cfg) -> list[tuple[str, Bundle]]:
    """[(what, bundle)] every actor a run of the composed config `cfg` asks Ray to place at once, in RLlib's order.

    The same request RLlib's Algorithm.default_resource_request makes for the AlgorithmConfig trainer.algo builds
    (tests/unit/test_capacity.py checks the two agree), read from the config alone so that rl-submit can check a job
    against a cluster shape without importing RLlib: the trial driver (a Tune run only; a plain run is driven by this
    process, outside Ray's accounting), one bundle per env runner ({CPU, rollout pool}) and per evaluation env runner
    (built from the training env runners' config, trainer.algo), then per learner ({CPU, GPU, learner pool}). With no
    learner actors the learner lives in the driver, so a Tune trial's driver bundle carries the learner's CPU and GPU.
    """
    res, ev = cfg.resources, cfg.evaluation
    out: list[tuple[str, dict[str, float]]] = []
    if cfg.tune.scheduler != "none":
        driver = ({"CPU": max(float(res.num_cpus_per_learner), 1.0), "GPU": float(res.num_gpus_per_learner)}
                  if res.num_learners == 0 else {"CPU": 1.0})
        out.append(("the Tune trial driver", driver))
    runner: dict[str, float] = {"CPU": float(res.num_cpus_per_env_runner)}
    if res.rollout_resource:
        runner[res.rollout_resource] = 1.0
    out += [(f"env runner {i + 1}", runner) for i in range(res.num_env_runners)]
    n_eval = ev.num_env_runners if ev.interval else 0
    out += [(f"evaluation env runner {i + 1}", runner) for i in range(n_eval)]
    learner: dict[str, float] = {"CPU": float(res.num_cpus_per_learner), "GPU": float(res.num_gpus_per_learner)}
    if res.learner_resource:
        learner[res.learner_resource] = 1.0
    out += [(f"learner {i + 1}", learner) for i in range(res.num_learners)]
    return [(what, {k: v for k, v in b.items() if v > 0}) for what, b in out]


def shortfall(req: list[tuple[str, Bundle]], nodes: list[Bundle]) -> str | None:
    """Why `req` cannot be placed on `nodes` (each node's total resources), or None if it can."""
    have = Counter()
    for n in nodes:
        have.update({k: float(v) for k, v in n.items()})
    for what, bundle in req:
        if bundle and not any(all(n.get(k, 0.0) >= v for k, v in bundle.items()) for n in nodes):
            missing = [k for k, v in bundle.items() if not any(n.get(k, 0.0) >= v for n in nodes)] or sorted(bundle)
            return (f"{what} needs {_fmt(bundle)} on one node, but no node has "
                    + ", ".join(f"{k} {v:g}" for k, v in bundle.items() if k in missing)
                    + f" (largest: {_fmt(_largest(nodes, missing))})")
    total = Counter()
    for _, bundle in req:
        total.update(bundle)
    for k, v in sorted(total.items()):
        if v > have.get(k, 0.0) + 1e-9:
            n = sum(1 for _, b in req if k in b)
            return f"{n} actor{'s' * (n != 1)} need{'s' * (n == 1)} {k} {v:g} in total, the cluster has {k} {have.get(k, 0.0):g}"
    return None


def _largest(nodes: list[Bundle], keys: list[str]) -> dict[str, float]:
    return {k: max((float(n.get(k, 0.0)) for n in nodes), default=0.0) for k in keys}


def _fmt(b: Bundle) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(b.items())) or "nothing"


def _alive_nodes() -> list[Bundle]:
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def _autoscaler_maxima() -> dict[str, float] | None:
    """Most of each resource the autoscaler's node groups can reach, if it reported them (autoscaler v2)."""
    try:
        from ray._private.state import state

        return state.get_max_resources_from_cluster_config()
    except Exception:  # noqa: BLE001 - not reported / not supported: unknown ceiling
        return None


def _ask_autoscaler(bundles: list[Bundle]) -> None:
    """Post `bundles` as this cluster's standing resource request; [] withdraws it (Ray's autoscaler SDK)."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[dict(b) for b in bundles])


def check_capacity(cfg, log: Callable[[str], None], nodes: Callable[[], list[Bundle]] = _alive_nodes,
                   ask: Callable[[list[Bundle]], None] = _ask_autoscaler) -> None:
    res = cfg.resources
    req = request(cfg)
    why = shortfall(req, nodes())
    if why is None:
        return
    fix = _hint(res, why)
    if not res.address:
        raise TrainerError(f"resources: {why}; this embedded Ray cannot add nodes: {fix}")
    maxima = _autoscaler_maxima()
    if maxima is not None:
        over = {k: v for k, v in _total(req).items() if v > maxima.get(k, 0) + 1e-9}
        if over:
            raise TrainerError(f"resources: {why}, and the autoscaler can grow to at most "
                               + ", ".join(f"{k} {maxima.get(k, 0):g}" for k in sorted(over)) + f": {fix}")
    wait = float(res.wait_for_resources_s)
    log(f"waiting up to {wait:g}s for the cluster to add nodes (asked its autoscaler for them): {why}")
    t0 = time.monotonic()
    deadline = t0 + wait
    ask([b for _, b in req if b])
    try:
        while time.monotonic() < deadline:
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
            why = shortfall(req, nodes())
            if why is None:
                log(f"the cluster now fits the request (after {time.monotonic() - t0:.0f}s)")
                return
    finally:
        ask([])  # a standing request would keep the nodes after the run (or grow them after a failed wait)
    raise TrainerError(f"resources: {why}; no node that fits joined in {wait:g}s (resources.wait_for_resources_s): "
                       f"check the cluster's worker groups and autoscaler, or {fix}")


def _hint(res, why: str) -> str:
    if " GPU " in f" {why} ":
        return "set resources.num_gpus_per_learner=0 or use a cluster with GPU nodes"
    for key in ("rollout_resource", "learner_resource"):
        name = res[key]
        if name and f"{name} " in why:
            return f"give nodes the {name!r} resource or unset resources.{key}"
    return "lower resources.num_env_runners / num_learners / num_cpus_per_env_runner / num_cpus_per_learner"


def _total(req: list[tuple[str, Bundle]]) -> dict[str, float]:
    t = Counter()
    for _, b in req:
        t.update(b)
    return dict(t)
