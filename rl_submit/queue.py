"""Kueue for rl-submit: will the queue ever admit this job, and where does a queued job stand?

A RayJob labelled `kueue.x-k8s.io/queue-name` is created suspended by Kueue's webhook and stays so, with no pods,
until its ClusterQueue's quota holds all of its pods at once (one Workload per RayJob, one pod set per group: the
head, each worker group, the K8sJobMode submitter). Kueue gives each pod set one ResourceFlavor of the quota's
resource group: the first, in the ClusterQueue's order, whose nodeLabels agree with the pods' node selector, whose
nodeTaints the pods tolerate and whose quota still has room for the pod set's requests. `never_admitted` replays that
assignment on an empty queue: a job it cannot place would wait for ever, so rl-submit refuses it with one line.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_submit.shape import quantity

KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


@dataclass(frozen=True)
class PodSet:
    """One pod set of the job's Workload: `count` pods, each asking `requests`, placed by `node_selector`."""

    name: str
    count: int
    requests: dict[str, float]
    node_selector: dict[str, str]
    tolerations: list[dict]


def _pod_requests(spec: dict) -> dict[str, float]:
    """What Kueue counts for one pod: each container's requests (its limits where a request is unset), summed."""
    total: dict[str, float] = {}
    for c in spec.get("containers", []):
        res = c.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for k, v in asked.items():
            total[k] = total.get(k, 0.0) + quantity(v)
    return total


def _pod_set(name: str, count: int, pod: dict) -> PodSet:
    spec = pod.get("spec") or {}
    return PodSet(name, count, _pod_requests(spec), dict(spec.get("nodeSelector") or {}),
                  list(spec.get("tolerations") or []))


def pod_sets(rayjob: dict) -> list[PodSet]:
    """The pod sets Kueue makes of a RayJob with its own cluster: head, worker groups, the submitter."""
    spec = rayjob["spec"]
    cluster = spec["rayClusterSpec"]
    out = [_pod_set("head", 1, cluster["headGroupSpec"]["template"])]
    for g in cluster.get("workerGroupSpecs", []):
        out.append(_pod_set(g["groupName"], int(g.get("replicas", 0)) * int(g.get("numOfHosts", 1)), g["template"]))
    if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode" and spec.get("submitterPodTemplate"):
        out.append(_pod_set("submitter", 1, spec["submitterPodTemplate"]))
    return [p for p in out if p.count > 0]


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _agrees(ps: PodSet, flavor: dict) -> bool:
    spec = flavor.get("spec") or {}
    labels = spec.get("nodeLabels") or {}
    if any(k in ps.node_selector and ps.node_selector[k] != v for k, v in labels.items()):
        return False
    return all(_tolerates(ps.tolerations, t) for t in spec.get("nodeTaints") or [])


def _fmt(res: dict[str, float]) -> str:
    def one(k: str, v: float) -> str:
        if k == "memory" or k.endswith("storage"):
            return f"{k} {v / 2**30:g}Gi"
        return f"{k} {v:g}"
    return ", ".join(one(k, v) for k, v in res.items())


def never_admitted(sets: list[PodSet], cluster_queue: dict, flavors: dict[str, dict]) -> str | None:
    """Why `cluster_queue` can never admit a job of these pod sets, even with nothing else in it; None when it can.

    `flavors` maps ResourceFlavor names to the objects (a missing one holds nothing). Borrowing from a cohort is not
    counted: a ClusterQueue in a cohort may lend more, so the caller skips this check there."""
    groups = (cluster_queue.get("spec") or {}).get("resourceGroups") or []
    covered = {r for g in groups for r in g.get("coveredResources", [])}
    used: dict[tuple[str, str], float] = {}
    for ps in sets:
        need = {k: v * ps.count for k, v in ps.requests.items() if v > 0}
        missing = sorted(k for k in need if k not in covered and k != "pods")
        if missing:
            return (f"pod set {ps.name} requests {', '.join(missing)}, which ClusterQueue "
                    f"{cluster_queue['metadata']['name']} has no quota for")
        for g in groups:
            want = {k: v for k, v in need.items() if k in g.get("coveredResources", [])}
            if not want:
                continue
            tried = []
            for f in g.get("flavors", []):
                name = f["name"]
                if name not in flavors or not _agrees(ps, flavors[name]):
                    continue
                quota = {r["name"]: quantity(r["nominalQuota"]) for r in f.get("resources", [])}
                short = {k: v for k, v in want.items() if used.get((name, k), 0.0) + v > quota.get(k, 0.0) + 1e-9}
                if not short:
                    for k, v in want.items():
                        used[(name, k)] = used.get((name, k), 0.0) + v
                    break
                tried.append(f"{name} has {_fmt({k: quota.get(k, 0.0) - used.get((name, k), 0.0) for k in short})}")
            else:
                pods = f"{ps.count} pod{'s' * (ps.count != 1)}"
                where = ("; ".join(tried) if tried else
                         f"no flavor of it matches the pods' node selector {ps.node_selector or '{}'} and tolerations")
                return (f"pod set {ps.name} ({pods}) needs {_fmt(want)} and ClusterQueue "
                        f"{cluster_queue['metadata']['name']} can never give it that: {where}")
    return None


def workload_line(workload: dict, pending: list[dict]) -> str | None:
    """"queued in LocalQueue Q, position i of n: <Kueue's reason>" while the job's Workload waits; None once admitted.

    Position: Kueue orders a queue's pending Workloads by priority, then creation time (BestEffortFIFO and
    StrictFIFO alike); `pending` are the Workloads of the same LocalQueue that hold no quota."""
    status = workload.get("status") or {}
    conds = {c["type"]: c for c in status.get("conditions") or []}
    if conds.get("QuotaReserved", {}).get("status") == "True":
        return None
    queue = (workload.get("spec") or {}).get("queueName", "?")

    def key(w: dict):
        return (-int((w.get("spec") or {}).get("priority") or 0), w["metadata"]["creationTimestamp"],
                w["metadata"]["name"])

    order = sorted(pending, key=key)
    names = [w["metadata"]["name"] for w in order]
    where = workload["metadata"]["name"]
    pos = f", position {names.index(where) + 1} of {len(names)}" if where in names else ""
    evicted = conds.get("Evicted", {})
    why = (conds.get("QuotaReserved", {}).get("message") or conds.get("Pending", {}).get("message")
           or "waiting for Kueue to consider it")
    if evicted.get("status") == "True":
        why = f"preempted ({evicted.get('reason')}: {evicted.get('message')}); {why}"
    return f"queued in LocalQueue {queue}{pos}: {why}"
