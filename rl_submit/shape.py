"""Can a training job ever fit the Ray cluster it is sent to? Answered from the rendered YAML, before the API server.

Supply: KubeRay starts Ray on every pod of a RayCluster spec with flags it derives from the group's rayStartParams
and the Ray container's resources (ray_node_resources); a cluster may have its head and each worker group at
maxReplicas when the in-tree autoscaler runs, else at replicas. Demand: trainer.capacity.request for the trainer's
composed config, the request RLlib's Algorithm.default_resource_request makes, read from the config without importing
RLlib: one bundle per env runner ({CPU, rollout_pool}), evaluation runner and learner ({CPU, GPU, learner_pool}), and
first a Tune trial's driver (a plain run is driven by the job's entrypoint process on the head, outside Ray's
accounting; one Tune trial must fit, more run one after another). Placement is first fit, biggest bundles first
(RLlib asks for PACK, which Ray places bundle by bundle). rl-submit refuses a misfit with one line; tests/chart checks
every job of k8s/values with the same code.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field

Bundle = dict[str, float]
# Ray resources a node advertises that no actor of ours asks for by name: left out of placement and messages.
_NOT_PLACED = ("memory", "object_store_memory")

_UNITS = {"": 1, "m": 1e-3, "k": 1e3, "Ki": 2**10, "M": 1e6, "Mi": 2**20, "G": 1e9, "Gi": 2**30, "T": 1e12,
          "Ti": 2**40}


def quantity(q) -> float:
    """A Kubernetes quantity ("500m", "4Gi", 2) as a number."""
    if isinstance(q, (int, float)):
        return float(q)
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(m|k|Ki|M|Mi|G|Gi|T|Ti)?", str(q))
    if not m:
        raise ValueError(f"not a quantity: {q!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


# -- supply: what the nodes of a rendered cluster advertise ---------------------------------------------------------
def cluster_specs(doc: dict) -> list[tuple[str, dict]]:
    """(where, RayCluster spec) of a RayCluster, a RayJob with its own cluster, or a RayService."""
    kind, spec = doc.get("kind"), doc.get("spec", {})
    if kind == "RayCluster":
        return [("RayCluster/spec", spec)]
    if kind == "RayJob" and "rayClusterSpec" in spec:
        return [("RayJob/spec.rayClusterSpec", spec["rayClusterSpec"])]
    if kind == "RayService":
        return [("RayService/spec.rayClusterConfig", spec["rayClusterConfig"])]
    return []


def ray_groups(cluster_spec: dict) -> list[tuple[str, dict, dict, int]]:
    """(group, rayStartParams, pod spec, replicas) of the head ("head", 1 replica) and every worker group; the Ray
    container is the pod's first."""
    head = cluster_spec["headGroupSpec"]
    out = [("head", head.get("rayStartParams", {}), head["template"]["spec"], 1)]
    for g in cluster_spec.get("workerGroupSpecs", []):
        out.append((g["groupName"], g.get("rayStartParams", {}), g["template"]["spec"], int(g.get("replicas", 0))))
    return out


def ray_node_resources(params: dict, container: dict) -> tuple[dict[str, float], list[str]]:
    """The Ray resources a node of this group advertises, and what KubeRay 1.6 complains about on the way.

    Follows KubeRay's generateRayStartCommand (ray-operator/controllers/ray/common/pod.go): num-cpus from the CPU
    limit (else request) and memory from the memory limit unless set; `--num-gpus` from the nvidia.com/gpu limit only
    when KubeRay can JSON-parse `resources` after trimming the quotes around it ("failed to add accelerator
    resources" otherwise); then `ray start --key=value ...` through the shell.
    """
    params = {k: str(v) for k, v in params.items()}
    res = container.get("resources", {})
    limits, requests = res.get("limits", {}), res.get("requests", {})
    errors = []
    if "num-cpus" not in params and (limits.get("cpu") or requests.get("cpu")):
        params["num-cpus"] = str(math.ceil(quantity(limits.get("cpu") or requests["cpu"])))
    if "memory" not in params and limits.get("memory"):
        params["memory"] = str(math.ceil(quantity(limits["memory"])))
    if limits:
        try:
            json.loads(params.get("resources", "{}").strip("'\"` "))
        except ValueError as e:
            errors.append(f"failed to add accelerator resources: {e}")
        else:
            if "num-gpus" not in params and quantity(limits.get("nvidia.com/gpu", 0)) > 0:
                params["num-gpus"] = str(math.ceil(quantity(limits["nvidia.com/gpu"])))
    flags = []
    for k in sorted(params):  # convertParamMap: "true"/"false" are switches
        v = params[k]
        if v.lower() in ("true", "false") and k not in ("log-color", "include-dashboard"):
            flags += [f"--{k}"] if v.lower() == "true" else []
        else:
            flags.append(f"--{k}={v}")
    argv = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "true") for a in shlex.split(" ".join(flags)))
    out = {"CPU": float(argv.get("num-cpus", 0)), "GPU": float(argv.get("num-gpus", 0))}
    if "memory" in argv:
        out["memory"] = float(argv["memory"])
    if "object-store-memory" in argv:
        out["object_store_memory"] = float(argv["object-store-memory"])
    if "resources" in argv:
        out.update(json.loads(argv["resources"]))
    return out, errors


@dataclass(frozen=True)
class Group:
    """One group of a cluster: what each of its nodes advertises to placement, and how many nodes it may have."""

    name: str
    resources: Bundle
    count: int
    bound: str  # where count comes from: "head", "replicas" or "maxReplicas" (autoscaling)
    errors: list[str] = field(default_factory=list, compare=False)


def groups(cluster_spec: dict) -> list[Group]:
    autoscaling = bool(cluster_spec.get("enableInTreeAutoscaling"))
    specs = {g["groupName"]: g for g in cluster_spec.get("workerGroupSpecs", [])}
    out = []
    for name, params, pod, replicas in ray_groups(cluster_spec):
        bound = "head" if name == "head" else "maxReplicas" if autoscaling else "replicas"
        count = int(specs[name].get("maxReplicas", replicas)) if bound == "maxReplicas" else replicas
        res, errors = ray_node_resources(params, pod["containers"][0])
        res = {k: float(v) for k, v in res.items() if k not in _NOT_PLACED and v}
        out.append(Group(name, res, count, bound, errors))
    return out


def nodes(cluster: list[Group]) -> list[tuple[str, Bundle]]:
    """(group#i, resources) of every node the cluster may have, head first."""
    return [(f"{g.name}#{i}", dict(g.resources)) for g in cluster for i in range(g.count)]


# -- placement -------------------------------------------------------------------------------------------------------
def _fits(bundle: Bundle, free: Bundle) -> bool:
    return all(free.get(k, 0.0) >= v - 1e-9 for k, v in bundle.items())


def place(bundles: list[Bundle], free_nodes: list[tuple[str, Bundle]]) -> list[Bundle]:
    """First fit, biggest bundles first: the bundles that found no node (none: the job fits)."""
    free = [dict(res) for _, res in free_nodes]
    left = []
    for b in sorted(bundles, key=lambda b: (-len(b), -sum(b.values()))):
        res = next((r for r in free if _fits(b, r)), None)
        if res is None:
            left.append(b)
            continue
        for k, v in b.items():
            res[k] -= v
    return left


def fmt(b: Bundle) -> str:
    """{CPU: 1, GPU: 1, learner_pool: 1}: Ray's names, numbers without a needless .0."""
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in b.items()) + "}"


def _closest(bundle: Bundle, cluster: list[Group]) -> Group:
    """The group whose node holds most of what `bundle` asks for (then the biggest node)."""
    return max(cluster, key=lambda g: (sum(g.resources.get(k, 0.0) >= v for k, v in bundle.items()),
                                       sum(min(g.resources.get(k, 0.0) / v, 1.0) for k, v in bundle.items()),
                                       sum(g.resources.values())))


def _count(g: Group) -> str:
    if g.bound == "head":
        return "1 node"
    n = f"{g.count} node{'s' * (g.count != 1)}"
    return f"at most {n} (maxReplicas)" if g.bound == "maxReplicas" else f"{n} (replicas, no autoscaling)"


def _who(labels: list[str]) -> str:
    """"learner 1", or "4 env runners" for several actors asking for the same bundle."""
    if len(labels) == 1:
        return labels[0]
    kinds = list(dict.fromkeys(re.sub(r" [0-9]+$", "", w) for w in labels))
    return f"{len(labels)} {kinds[0]}s" if len(kinds) == 1 else f"{len(labels)} actors ({', '.join(kinds)})"


def misfit(request: list[tuple[str, Bundle]], cluster: list[Group]) -> str | None:
    """None when `request` fits the nodes `cluster` may have; else one line naming what cannot be placed and the
    group that comes closest."""
    left = place([b for _, b in request], nodes(cluster))
    if not left:
        return None
    live = [g for g in cluster if g.count > 0]  # a group without nodes (replicas 0, no autoscaling) holds nothing
    # A bundle no node can hold at all is the cause to name, before bundles that only ran out of room.
    bundle = next((b for b in left if not any(_fits(b, g.resources) for g in live)), left[0])
    what = [w for w, b in request if b == bundle]
    who, each = _who(what), "" if len(what) == 1 else " each"
    verb = "needs" if len(what) == 1 else "need"
    near = _closest(bundle, live)
    if not _fits(bundle, near.resources):  # too big for any node, however many there are
        lacking = [k for k, v in bundle.items() if not any(g.resources.get(k, 0.0) >= v for g in live)]
        empty = [g for g in cluster if g.count == 0 and _fits(bundle, g.resources)]
        return (f"{who} {verb} {fmt(bundle)}{each} on one node, and no node of this cluster has "
                f"{', '.join(f'{k} {bundle[k]:g}' for k in lacking) or 'all of that'} "
                f"(largest group {near.name}: {fmt(near.resources)} per node"
                + "".join(f"; group {g.name} would hold it but has {_count(g)}" for g in empty) + ")")
    need: dict[str, float] = {}
    for _, b in request:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    have = {k: sum(g.resources.get(k, 0.0) * g.count for g in cluster) for k in need}
    # Name the scarce resource: a pool first (it says which group to grow), CPU or GPU after.
    short = sorted((k for k in bundle if need[k] > have[k] + 1e-9), key=lambda k: (k in ("CPU", "GPU"), k))
    scarce = (f"the job needs {short[0]} {need[short[0]]:g} in all and the cluster has at most {short[0]} "
              f"{have[short[0]]:g}" if short else "the cluster's nodes have no room left after the other actors")
    holders = [g for g in cluster if _fits(bundle, g.resources)]
    return (f"{who} {verb} {fmt(bundle)}{each}; {scarce} ("
            + "; ".join(f"group {g.name}: {_count(g)} x {fmt(g.resources)}" for g in holders) + ")")
