"""rl_submit.queue: the pod sets Kueue makes of the chart's RayJob, the flavor assignment that decides whether a
queue can ever admit it (on the chart's own ClusterQueue and ResourceFlavors), and the "queued" line."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from rl_submit.queue import PodSet, never_admitted, pod_sets, workload_line

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
GPU_JOB = ["resources.num_env_runners=2", "resources.num_learners=1", "resources.num_gpus_per_learner=1"]


def render(helm: str, *sets: str, values: dict | None = None, tmp=None) -> dict[str, list[dict]]:
    """The chart's Kueue objects and RayJob for k8s/values/pong.yaml (GPU learners) plus `values` and `sets`, by
    kind."""
    extra = []
    if values:
        (tmp / "extra.yaml").write_text(yaml.safe_dump(values))
        extra = ["-f", str(tmp / "extra.yaml")]
    out = subprocess.run([helm, "template", "rl-platform", str(ROOT / "charts" / "rl-platform"), "-n", "rl-platform",
                          "-f", str(ROOT / "k8s" / "values" / "pong.yaml"), *extra, "--set", "kueue.enabled=true",
                          "--set", "rayJob.queue=training", *[a for s in sets for a in ("--set", s)]],
                         capture_output=True, text=True, check=True).stdout
    docs: dict[str, list[dict]] = {}
    for d in yaml.safe_load_all(out):
        if d:
            docs.setdefault(d["kind"], []).append(d)
    return docs


def verdict(docs):
    flavors = {f["metadata"]["name"]: f for f in docs["ResourceFlavor"]}
    (cq,) = docs["ClusterQueue"]
    (job,) = docs["RayJob"]
    return never_admitted(pod_sets(job), cq, flavors)


def test_pod_sets_are_the_head_each_worker_group_and_the_submitter(built_helm):
    (job,) = render(built_helm)["RayJob"]
    sets = {p.name: p for p in pod_sets(job)}
    groups = {g["groupName"]: g for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert list(sets) == ["head", *groups, "submitter"] and {"rollout-cpu", "learner-gpu"} <= set(groups)
    assert sets["learner-gpu"].count == groups["learner-gpu"]["replicas"] >= 1
    assert sets["learner-gpu"].requests["nvidia.com/gpu"] == 1
    assert sets["learner-gpu"].node_selector == {"rl-platform.io/pool": "gpu"}
    assert sets["head"].requests["cpu"] > 0 and "nvidia.com/gpu" not in sets["head"].requests
    # The submitter's requests (0.1 CPU) are counted too: Kueue admits every pod of the job at once.
    assert sets["submitter"].requests["cpu"] == pytest.approx(0.1)


def test_the_default_queue_admits_a_one_gpu_job(built_helm):
    assert verdict(render(built_helm)) is None


def test_more_gpus_than_the_quota_is_never_admitted_and_names_the_pod_set_and_flavor(built_helm):
    why = verdict(render(built_helm, "workerGroups.learner-gpu.replicas=2", "workerGroups.learner-gpu.maxReplicas=2"))
    assert why is not None
    assert why.startswith("pod set learner-gpu (2 pods) needs ") and "nvidia.com/gpu 2" in why, why
    assert "ClusterQueue rl-platform can never give it that: rl-platform-gpu has nvidia.com/gpu 1" in why, why


def test_the_head_never_takes_the_gpu_flavor_it_does_not_tolerate(built_helm, tmp_path):
    # CPU quota too small for the head on the cpu flavor: the gpu flavor has room but its taint keeps the head off.
    flavors = [{"name": "cpu", "nodeLabels": {"rl-platform.io/pool": "cpu"},
                "quota": {"cpu": "0.1", "memory": "64Gi", "nvidia.com/gpu": "0"}},
               {"name": "gpu", "nodeLabels": {"rl-platform.io/pool": "gpu"},
                "nodeTaints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
                "quota": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "4"}}]
    docs = render(built_helm, values={"kueue": {"clusterQueue": {"flavors": flavors}}}, tmp=tmp_path)
    why = verdict(docs)
    assert why is not None and why.startswith("pod set head (1 pod) needs cpu "), why
    assert "rl-platform-gpu" not in why  # not a candidate at all: the head does not tolerate nvidia.com/gpu


def test_a_pod_set_on_a_flavor_shared_with_another_counts_both():
    cq = {"metadata": {"name": "q"}, "spec": {"resourceGroups": [
        {"coveredResources": ["cpu"], "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": "3"}]}]}]}}
    flavors = {"f": {"metadata": {"name": "f"}, "spec": {}}}
    two = [PodSet("a", 1, {"cpu": 2.0}, {}, []), PodSet("b", 1, {"cpu": 1.0}, {}, [])]
    assert never_admitted(two, cq, flavors) is None
    three = two + [PodSet("c", 2, {"cpu": 0.5}, {}, [])]
    assert never_admitted(three, cq, flavors) == (
        "pod set c (2 pods) needs cpu 1 and ClusterQueue q can never give it that: f has cpu 0")
    assert never_admitted([PodSet("a", 1, {"cpu": 1.0, "example.com/fpga": 1.0}, {}, [])], cq, flavors) == (
        "pod set a requests example.com/fpga, which ClusterQueue q has no quota for")


def _wl(name, created, priority=0, queue="training", reserved=False, message=None, evicted=None):
    conds = [{"type": "QuotaReserved", "status": "True" if reserved else "False", "reason": "Pending",
              "message": message or "couldn't assign flavors to pod set head: insufficient unused quota for cpu "
                                    "in flavor rl-platform-cpu, 1 more needed"}]
    if evicted:
        conds.append({"type": "Evicted", "status": "True", "reason": "Preempted", "message": evicted})
    return {"metadata": {"name": name, "creationTimestamp": created},
            "spec": {"queueName": queue, "priority": priority}, "status": {"conditions": conds}}


def test_the_queued_line_gives_kueues_reason_and_the_place_by_priority_then_age():
    a, b, c = _wl("a", "2026-12-02T10:00:00Z"), _wl("b", "2026-12-02T10:00:05Z"), _wl("c", "2026-12-02T10:00:09Z", 1000)
    line = workload_line(b, [a, b, c])
    assert line == ("queued in LocalQueue training, position 3 of 3: couldn't assign flavors to pod set head: "
                    "insufficient unused quota for cpu in flavor rl-platform-cpu, 1 more needed")
    assert workload_line(c, [a, b, c]).startswith("queued in LocalQueue training, position 1 of 3: ")
    assert workload_line(_wl("d", "2026-12-02T10:00:00Z", reserved=True), [a]) is None
    pre = workload_line(_wl("e", "2026-12-02T09:00:00Z", evicted="Preempted to accommodate a higher priority"), [])
    assert pre.startswith("queued in LocalQueue training: preempted (Preempted: Preempted to accommodate"), pre
