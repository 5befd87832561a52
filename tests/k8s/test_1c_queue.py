"""Kueue on the cluster tier (Level A: KWOK nodes, the real scheduler, KubeRay operator and Kueue manager).

A ClusterQueue sized for exactly one CartPole job (its pod sets' requests, computed from the chart's own RayJob), fed
by a LocalQueue, both rendered from the chart (templates/kueue.yaml). Jobs go in with `rl-submit --queue`: Kueue
keeps all but the one its quota holds suspended, with no RayCluster and no pod, and admits the next when the running
one ends (at Level A a job ends FAILED: KWOK completes the submitter pod and no Ray answers) or is stopped. The GPU
quota is checked the same way on the KWOK GPU node; a higher-priority job preempts (suspends) a running lower one.
What only real pods show (SUCCEEDED in turn, a preempted trainer resuming from its checkpoint) is Level B's.
"""

from __future__ import annotations

import time

import pytest

from kubekit import (CARTPOLE_VALUES, NAMESPACE, ROOT, Cluster, dump, job_pods, one_job_quota, quota_reserved,
                     queue_manifest, rl_submit, wait_until, workload, workload_condition)

PREFIX = "rl-platform-q-"       # every RayJob this module creates
QUEUE, CQ = "one-job", "qtest-one-job"
CARTPOLE = CARTPOLE_VALUES
PONG = ROOT / "k8s" / "values" / "pong.yaml"
# Pong with a GPU learner and one rollout pod: its CPU pods fit the one-CartPole-job quota of the cpu flavor.
PONG_GPU = ("-f", str(PONG), "--set", "workerGroups.rollout-cpu.replicas=1", "--set", "workerGroups.rollout-cpu.minReplicas=1",
            "--set", "workerGroups.rollout-cpu.maxReplicas=1", "resources.num_env_runners=1")


@pytest.fixture(scope="module")
def c(cluster_a: Cluster, tmp_path_factory):
    """The test queue (rendered from the chart: a cpu flavor with room for one CartPole job, a gpu flavor with one
    GPU, priorities) applied to the Level A cluster; everything it made is deleted afterwards."""
    quota = one_job_quota()
    manifest = queue_manifest(QUEUE, CQ, quota, tmp_path_factory.mktemp("queue"))
    cluster_a.kubectl("apply", "--server-side", "-f", "-", input=manifest)
    cluster_a.figures["kueue_test_queue_quota"] = quota
    yield cluster_a
    for j in cluster_a.ray_list("rayjobs"):
        if j["metadata"]["name"].startswith(PREFIX):
            cluster_a.delete_ray("rayjobs", j["metadata"]["name"], wait_pods=False)
    cluster_a.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=manifest, check=False)


def job(c: Cluster, name: str) -> dict:
    return c.ray("rayjobs", PREFIX + name)


def suspended(c: Cluster, name: str) -> bool:
    return bool(job(c, name)["spec"].get("suspend"))


def own_pods(c: Cluster, name: str) -> list[str]:
    return job_pods(c, PREFIX + name)


def reserved(c: Cluster, name: str) -> bool:
    return quota_reserved(c, PREFIX + name)


def pending_reason(c: Cluster, name: str) -> str:
    cond = workload_condition(c, PREFIX + name, "QuotaReserved")
    return cond.get("message", "") if cond.get("status") == "False" else ""


def submit(c: Cluster, name: str, *args: str) -> None:
    rl_submit(c, "--detach", "--name", f"q-{name}", "--queue", QUEUE, *args, check=0)


def test_three_jobs_at_once_run_one_at_a_time_and_the_waiting_ones_have_no_pods(c: Cluster):
    names = ["a", "b", "c"]
    t0 = time.monotonic()
    for n in names:  # one after another within seconds: all three are in the queue before the first can end
        submit(c, n, "-f", str(CARTPOLE), "stop.iterations=1")
    # Kueue admits exactly one; the other two stay suspended with no RayCluster and no pod.
    first = wait_until("Kueue to admit one of the three jobs",
                       lambda: [n for n in names if reserved(c, n)] or None, 120)
    assert len(first) == 1, first
    (running,) = first
    waiting = [n for n in names if n != running]
    wait_until(f"the admitted job {running} to get pods", lambda: own_pods(c, running), 120)
    for n in waiting:
        wait_until(f"Kueue's reason for {n}", lambda n=n: "insufficient unused quota" in pending_reason(c, n), 60,
                   on_timeout=lambda n=n: dump(workload(c, PREFIX + n)))
        assert suspended(c, n) and own_pods(c, n) == [], (n, own_pods(c, n))
        assert not job(c, n).get("status", {}).get("rayClusterName") or not [
            r for r in c.ray_list("rayclusters") if r["metadata"]["name"].startswith(PREFIX + n)]
    # rl-submit status says where each waiting job stands and why (Kueue's own message), not a bare "Suspended".
    lines = {n: rl_submit(c, "status", PREFIX + n, check=0).stdout.strip() for n in waiting}
    for n, line in lines.items():
        assert line.startswith(f"{PREFIX}{n}: queued in LocalQueue {QUEUE}, position "), line
        assert "insufficient unused quota for cpu in flavor qtest-rl-platform-cpu" in line, line
    assert {line.split("position ")[1][:6] for line in lines.values()} == {"1 of 2", "2 of 2"}, lines
    c.figures["kueue_admit_first_s"] = round(time.monotonic() - t0, 1)
    # They run in turn: the next is admitted only once the running one has ended (Level A: FAILED, no Ray in the
    # pods) or been stopped, and never two at a time.
    order = [running]
    nxt = sorted(waiting, key=lambda n: lines[n].split("position ")[1])
    for i, n in enumerate(nxt):
        prev = order[-1]
        if i == 0:
            # The first one ends by itself: its finished Workload gives the quota back.
            wait_until(f"{prev} to end", lambda p=prev: job(c, p).get("status", {}).get("jobDeploymentStatus")
                       in ("Failed", "Complete"), 240, interval=2)
        else:
            rl_submit(c, "stop", PREFIX + prev, check=0)  # a stopped (deleted) job gives it back too
        t = time.monotonic()
        wait_until(f"Kueue to admit {n} after {prev}", lambda n=n: reserved(c, n), 120)
        c.figures[f"kueue_next_admitted_after_{'end' if i == 0 else 'stop'}_s"] = round(time.monotonic() - t, 1)
        assert [m for m in names if m not in order and reserved(c, m)] == [n], lines  # one at a time
        wait_until(f"{n} to get pods", lambda n=n: own_pods(c, n), 120)
        order.append(n)
    assert order[1:] == nxt  # admitted in the order `rl-submit status` gave (position 1 first)


def test_a_job_needing_more_gpus_than_the_quota_is_refused_and_never_gets_a_pod(c: Cluster):
    two_gpus = (*PONG_GPU, "--set", "workerGroups.learner-gpu.replicas=2",
                "--set", "workerGroups.learner-gpu.maxReplicas=2", "resources.num_learners=2")
    proc = rl_submit(c, "--name", "q-gpu2", "--queue", QUEUE, *two_gpus)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: this job can never be admitted from LocalQueue 'one-job': pod set "
                                  "learner-gpu (2 pods) needs "), proc.stderr
    assert "nvidia.com/gpu 2" in proc.stderr and "qtest-rl-platform-gpu has nvidia.com/gpu 1" in proc.stderr
    with pytest.raises(Exception):
        job(c, "gpu2")  # refused before anything was created
    # The same RayJob applied with kubectl (no rl-submit to refuse it): Kueue holds it, no pod is ever made.
    dry = rl_submit(c, "--dry-run", "--name", "q-gpu2", "--queue", QUEUE, "-n", NAMESPACE, *two_gpus, check=0)
    c.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=dry.stdout)
    wait_until("Kueue's reason for the 2-GPU job", lambda: "nvidia.com/gpu" in pending_reason(c, "gpu2"), 60,
               on_timeout=lambda: dump(workload(c, PREFIX + "gpu2")))
    assert suspended(c, "gpu2") and own_pods(c, "gpu2") == []
    c.delete_ray("rayjobs", PREFIX + "gpu2", wait_pods=False)


def test_a_one_gpu_job_within_the_quota_puts_its_learner_on_the_gpu_node(c: Cluster):
    submit(c, "gpu1", *PONG_GPU, "stop.iterations=1")
    wait_until("Kueue to admit the 1-GPU job", lambda: reserved(c, "gpu1"), 120,
               on_timeout=lambda: dump(workload(c, PREFIX + "gpu1")))
    name = PREFIX + "gpu1"

    def learner_pod():
        pods = [p for p in c.core.list_namespaced_pod(NAMESPACE).items
                if (p.metadata.labels or {}).get("ray.io/cluster", "").startswith(name)
                and (p.metadata.labels or {}).get("ray.io/group") == "learner-gpu" and p.spec.node_name]
        return pods[0] if pods else None

    pod = wait_until("the learner pod to be scheduled", learner_pod, 120)
    labels = c.node_labels()[pod.spec.node_name]
    assert labels.get("rl-platform.io/pool") == "gpu" and labels.get("nvidia.com/gpu.present") == "true", labels
    # Kueue's flavor put its node labels on the pod (the gpu flavor was assigned, not the cpu one).
    assert pod.spec.node_selector.get("rl-platform.io/pool") == "gpu", pod.spec.node_selector
    assert any(r["name"] == "learner-gpu" and r["flavors"].get("nvidia.com/gpu") == "qtest-rl-platform-gpu"
               for r in workload(c, PREFIX + "gpu1")["status"]["admission"]["podSetAssignments"]), dump(workload(c, PREFIX + "gpu1"))
    rl_submit(c, "stop", name, check=0)


def test_a_high_priority_job_preempts_a_running_low_priority_one(c: Cluster):
    submit(c, "low", "-f", str(CARTPOLE), "--priority", "qtest-low", "stop.iterations=1000")
    wait_until("the low-priority job to run", lambda: reserved(c, "low") and own_pods(c, "low"), 120)
    t0 = time.monotonic()
    submit(c, "high", "-f", str(CARTPOLE), "--priority", "qtest-high", "stop.iterations=1")
    wait_until("Kueue to admit the high-priority job", lambda: reserved(c, "high"), 120,
               on_timeout=lambda: dump(workload(c, PREFIX + "high")) + dump(workload(c, PREFIX + "low")))
    c.figures["kueue_preempt_to_admitted_s"] = round(time.monotonic() - t0, 1)
    # The low one was suspended: its Workload evicted as preempted, its RayCluster and pods deleted.
    wl = workload(c, PREFIX + "low")
    evicted = {x["type"]: x for x in wl["status"]["conditions"]}.get("Evicted", {})
    assert evicted.get("reason") == "Preempted", dump(wl)
    wait_until("the preempted job's pods to go", lambda: not own_pods(c, "low"), 120)
    assert suspended(c, "low")
    line = rl_submit(c, "status", PREFIX + "low", check=0).stdout
    assert f"queued in LocalQueue {QUEUE}" in line and "preempted (Preempted" in line, line
    # When the high one is gone, the low one is admitted again.
    rl_submit(c, "stop", PREFIX + "high", check=0)
    wait_until("the preempted job to be re-admitted", lambda: reserved(c, "low") and own_pods(c, "low"), 180)
    rl_submit(c, "stop", PREFIX + "low", check=0)


def test_an_unknown_queue_or_priority_is_named_and_nothing_is_created(c: Cluster):
    proc = rl_submit(c, "--name", "q-noq", "--queue", "no-such-queue")
    assert proc.returncode == 3 and proc.stderr.startswith(
        f"error: no Kueue LocalQueue 'no-such-queue' in namespace '{NAMESPACE}'"), proc.stderr
    proc = rl_submit(c, "--name", "q-nop", "--queue", QUEUE, "--priority", "no-such-priority")
    assert proc.returncode == 2 and proc.stderr.startswith(
        "error: no Kueue WorkloadPriorityClass 'no-such-priority'"), proc.stderr
    names = {j["metadata"]["name"] for j in c.ray_list("rayjobs")}
    assert not {PREFIX + "noq", PREFIX + "nop"} & names, names
