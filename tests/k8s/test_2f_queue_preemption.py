"""Kueue preemption that loses nothing, on real pods (Level B: Ray runs on this machine as a node).

A queue with room for one CartPole job. A low-priority job trains; a high-priority one arrives; Kueue preempts the
low one (suspends its RayJob: KubeRay deletes its RayCluster, the head's preStop hook stops the Ray job, and the
trainer checkpoints on SIGTERM onto the shared claim). The high one runs to SUCCEEDED; the low one is re-admitted,
its trainer resumes from that checkpoint (`resume=auto`, same output_dir) and SUCCEEDS with every iteration done
once (none repeated from the start) and its env-step budget counted across the preemption. A third job, low
priority, submitted with the high one waits with no pods while either other job runs, then runs in its turn: three
jobs through a queue with room for one, all SUCCEEDED.
"""

from __future__ import annotations

import csv
import json
import time

import pytest

from kubekit import (CARTPOLE_VALUES, HOST_STORAGE, Cluster, dump, fresh_start, job_diagnostics, job_pods,
                     one_job_quota, quota_reserved, queue_manifest, rl_submit, wait_job, wait_until,
                     workload_condition)

QUEUE, CQ = "preempt-one", "qtest-preempt-one"
LOW, HIGH, NEXT = "rl-platform-qp-low", "rl-platform-qp-high", "rl-platform-qp-next"
# The low job's budget in env steps: counted across the preemption (stop.iterations would count this invocation's).
ENV_STEPS = 30_000
# Small iterations (~1,000 env steps, a few seconds each on 2 cores) with a checkpoint after every one.
TRAIN = ["algo.train_batch_size=1000", "algo.minibatch_size=250", "algo.num_epochs=2", "evaluation=off",
         "checkpoint.every_n_iterations=1", "stop.episode_return_mean=null", "stop.iterations=null"]


@pytest.fixture(scope="module")
def c(cluster_b: Cluster, tmp_path_factory):
    manifest = queue_manifest(QUEUE, CQ, one_job_quota(), tmp_path_factory.mktemp("queue"))
    cluster_b.kubectl("apply", "--server-side", "-f", "-", input=manifest)
    yield cluster_b
    for name in (LOW, HIGH, NEXT):
        cluster_b.delete_ray("rayjobs", name, wait_pods=False)
    cluster_b.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=manifest, check=False)


def out_dir(name: str):
    return HOST_STORAGE / "results" / "cartpole" / name  # rayJob.outputDir of k8s/values/cartpole.yaml + job name


def progress(name: str) -> list[dict]:
    f = out_dir(name) / "progress.csv"
    return list(csv.DictReader(f.open())) if f.exists() else []


def state(name: str) -> dict:
    f = out_dir(name) / "state.json"
    return json.loads(f.read_text()) if f.exists() else {}


def submit(c: Cluster, name: str, priority: str, env_steps: int) -> None:
    rl_submit(c, "--detach", "--name", name.removeprefix("rl-platform-"), "--queue", QUEUE, "--priority", priority,
              "-f", str(CARTPOLE_VALUES), *TRAIN, f"stop.env_steps={env_steps}", check=0)


def test_a_preempted_job_checkpoints_and_resumes_from_that_checkpoint(c: Cluster):
    for name in (LOW, HIGH, NEXT):
        fresh_start(c, "rayjobs", name, out_dir(name))
    t0 = time.monotonic()
    submit(c, LOW, "qtest-low", ENV_STEPS)
    wait_until("the low-priority job to train 2 iterations", lambda: len(progress(LOW)) >= 2, 600, interval=2,
               on_timeout=lambda: job_diagnostics(c, LOW))
    c.figures["kueue_b_low_to_2_iterations_s"] = round(time.monotonic() - t0, 1)

    t1 = time.monotonic()
    submit(c, HIGH, "qtest-high", 1000)
    submit(c, NEXT, "qtest-low", 1000)
    wait_until("Kueue to preempt the low-priority job", lambda: workload_condition(c, LOW, "Evicted").get("reason")
               == "Preempted", 120)
    wait_until("the preempted job's pods to go", lambda: not job_pods(c, LOW), 300)
    c.figures["kueue_b_preempted_pods_gone_s"] = round(time.monotonic() - t1, 1)
    at_preemption = state(LOW)
    done = int(at_preemption.get("iteration") or 0)
    # Preempted with a checkpoint on the claim: complete (state.json is written after it) and not behind the
    # iterations the run had logged.
    assert at_preemption.get("latest_checkpoint") and done >= 2, at_preemption
    assert (out_dir(LOW) / at_preemption["latest_checkpoint"]).is_dir(), at_preemption
    assert done >= len(progress(LOW)) - 1, (done, len(progress(LOW)))
    assert int(at_preemption.get("env_steps") or 0) < ENV_STEPS, f"the low job finished before it was preempted: {at_preemption}"
    line = rl_submit(c, "status", LOW, check=0).stdout
    assert "queued in LocalQueue" in line and "preempted (Preempted" in line, line

    # The third job waits while the high one runs: no quota, no pods.
    assert not quota_reserved(c, NEXT) and not job_pods(c, NEXT), dump(workload_condition(c, NEXT, "QuotaReserved"))
    wait_job(c, HIGH)
    t2 = time.monotonic()
    # Then the two low-priority jobs, one at a time (Kueue orders them by priority, then age): whichever is admitted
    # first runs to SUCCEEDED while the other waits with no pods.
    first = wait_until("a low-priority job to be admitted", lambda: next(
        (n for n in (LOW, NEXT) if quota_reserved(c, n)), None), 300,
        on_timeout=lambda: dump([workload_condition(c, n, "QuotaReserved") for n in (LOW, NEXT)]))
    second = NEXT if first == LOW else LOW
    assert not quota_reserved(c, second) and not job_pods(c, second), f"{second} admitted next to {first}"
    line = rl_submit(c, "status", second, check=0).stdout
    assert "queued in LocalQueue" in line, line
    rc = wait_job(c, first)["rayClusterName"]
    t3 = time.monotonic()
    # Kueue gives the quota to the second job at the first one's end: the first one's pods go then too (a queued job's
    # cleanup is `ttl`, 0 s by default), or they would hold the node while the second job's pods waited Pending.
    wait_until(f"the pods of {first} gone at its end", lambda: not c.pods(f"ray.io/cluster={rc}"), 120, interval=2)
    c.figures["kueue_b_succeeded_to_pods_gone_s"] = round(time.monotonic() - t3, 1)
    wait_until(f"{second} to be admitted after {first} ended", lambda: quota_reserved(c, second), 300,
               on_timeout=lambda: dump(workload_condition(c, second, "QuotaReserved")))
    wait_job(c, second)
    c.figures["kueue_b_high_done_to_both_low_succeeded_s"] = round(time.monotonic() - t2, 1)
    assert json.loads((out_dir(NEXT) / "summary.json").read_text())["env_steps"] >= 1000
    summary = json.loads((out_dir(LOW) / "summary.json").read_text())
    assert summary["resumed_from"] and summary["resumed_from"].rstrip("/").endswith(at_preemption["latest_checkpoint"]), (
        summary, at_preemption)
    rows = progress(LOW)
    iterations, steps = [int(r["iteration"]) for r in rows], [int(r["env_steps"]) for r in rows]
    # Each iteration once (resumed, not restarted), the budget counted across the preemption, met within one round.
    assert iterations == list(range(1, len(rows) + 1)), iterations
    assert steps == sorted(steps) and ENV_STEPS <= steps[-1] < ENV_STEPS + 1100, steps
    assert summary["stop_reason"].startswith("env_steps"), summary
