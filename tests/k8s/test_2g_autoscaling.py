"""Level B: a learner group at zero scaled by Ray's in-tree autoscaler (v2, a sidecar in the head pod), on real pods.

k8s/values/cartpole.yaml with `autoscaling.enabled=true` and its CPU learner group at `replicas: 0, minReplicas: 0,
maxReplicas: 1` and a short `idleTimeoutSeconds`: the RayCluster starts with no learner pod; the trainer asks for
`learner_pool` (its learner actor); the autoscaler raises the group to 1 (it patches the RayCluster, KubeRay makes the
pod), the job trains to SUCCEEDED, and once the learner is idle for its timeout the autoscaler takes the group back
to 0 while the head stays (under autoscaling the chart's clean-up deletes the whole cluster `keepHeadSeconds` after
the end: KubeRay refuses DeleteWorkers there). Figures (k8s_session.figures and bench/results/k8s_autoscale.json):
apply -> learner pod Running, SUCCEEDED -> learner pod gone.
"""

from __future__ import annotations

import json
import time

import yaml

from kubekit import (CARTPOLE_VALUES, HOST_STORAGE, NAMESPACE, ROOT, Cluster, dump, fresh_start, helm_path,
                     job_diagnostics, sh, wait_job, wait_until)

RESULTS = ROOT / "bench" / "results" / "k8s_autoscale.json"
NAME = "scale"
IDLE_S = 30  # the chart's learner default (values.yaml learner-gpu): long enough for RLlib to place the learner
TRAIN = ["stop.iterations=2", "stop.episode_return_mean=null", "evaluation=off", "registry.root=null",
         "algo.train_batch_size=1000", "algo.minibatch_size=250", "algo.num_epochs=1"]


def _job() -> str:
    overrides = yaml.safe_load(CARTPOLE_VALUES.read_text())["rayJob"]["overrides"] + TRAIN
    overrides = [o for o in overrides if not o.startswith("registry.root=/")]
    return sh(helm_path(), "template", "rl-platform", str(ROOT / "charts" / "rl-platform"), "--namespace", NAMESPACE,
              "-f", str(CARTPOLE_VALUES), "--set", f"rayJob.name={NAME}",
              "--set", f"rayJob.outputDir=/mnt/rl-platform/results/{NAME}",
              "--set", "autoscaling.enabled=true",
              "--set", "workerGroups.learner-cpu.replicas=0", "--set", "workerGroups.learner-cpu.minReplicas=0",
              "--set", f"workerGroups.learner-cpu.idleTimeoutSeconds={IDLE_S}",
              "--set-json", f"rayJob.overrides={json.dumps(overrides)}", "--show-only", "templates/rayjob.yaml").stdout


def _learner_replicas(c: Cluster, rc: str) -> int:
    groups = {g["groupName"]: g for g in c.ray("rayclusters", rc)["spec"]["workerGroupSpecs"]}
    return int(groups["learner-cpu"].get("replicas", 0))


def _live(pods: list) -> list:
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def _unless_ended(c: Cluster, name: str, probe):
    """`probe`, failing at once (with the job's diagnostics) if RayJob `name` ended first."""
    def check():
        st = c.ray("rayjobs", name).get("status", {})
        assert st.get("jobStatus") not in ("SUCCEEDED", "FAILED", "STOPPED"), job_diagnostics(c, name)
        return probe()
    return check


def test_learner_group_scales_from_zero_for_a_job_and_back_to_zero_when_idle(cluster_b: Cluster):
    c = cluster_b
    manifest = _job()
    job = yaml.safe_load(manifest)
    name = job["metadata"]["name"]
    spec = {g["groupName"]: g for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]}["learner-cpu"]
    assert (spec["replicas"], spec["minReplicas"], spec["maxReplicas"]) == (0, 0, 1), spec
    out = HOST_STORAGE / "results" / NAME
    fresh_start(c, "rayjobs", name, out)
    t0 = time.monotonic()
    c.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=manifest)
    try:
        rc = wait_until("the job's RayCluster", lambda: c.ray("rayjobs", name).get("status", {}).get("rayClusterName"),
                        120)
        learners = f"ray.io/cluster={rc},ray.io/group=learner-cpu"
        # Up: only the autoscaler raises the group (KubeRay makes pods to `replicas`, created at 0).
        pod = wait_until("a learner pod made for the job's learner_pool demand", _unless_ended(c, name, lambda: next(
            iter([p for p in _live(c.pods(learners)) if p.status.phase == "Running"]), None)), 420, interval=2,
            on_timeout=lambda: job_diagnostics(c, name))
        c.figures["level_b_autoscale_apply_to_learner_running_s"] = round(time.monotonic() - t0, 1)
        assert _learner_replicas(c, rc) == 1, dump(c.ray("rayclusters", rc)["spec"]["workerGroupSpecs"])
        (head,) = _live(c.pods(f"ray.io/cluster={rc},ray.io/node-type=head"))
        sidecar = c.kubectl("-n", NAMESPACE, "logs", head.metadata.name, "-c", "autoscaler", check=False).stdout
        assert "learner-cpu" in sidecar, sidecar[-3000:]

        wait_job(c, name)
        t_end = time.monotonic()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["iterations"] == 2, summary
        # Down: idle for IDLE_S, the autoscaler takes the group back to 0 (its pods deleted, not only terminating); the
        # head (kept for the logs) stays.
        wait_until(f"the learner group of {rc} back to 0 after {IDLE_S} s idle", lambda: not c.pods(learners)
                   and _learner_replicas(c, rc) == 0, 240, interval=2,
                   on_timeout=lambda: c.kubectl("-n", NAMESPACE, "logs", head.metadata.name, "-c", "autoscaler",
                                                "--tail=40", check=False).stdout)
        c.figures["level_b_autoscale_succeeded_to_learner_gone_s"] = round(time.monotonic() - t_end, 1)
        assert _live(c.pods(f"ray.io/cluster={rc},ray.io/node-type=head")), f"the head of {rc} went with the learner"
        assert pod.metadata.name not in {p.metadata.name for p in c.pods(learners)}
        RESULTS.write_text(json.dumps({
            "_about": "tests/k8s/test_2g_autoscaling.py on the local cluster tier, level B (2 cores, one real node): a "
                      "CartPole RayJob (2 iterations) whose CPU learner group starts at 0 under Ray's autoscaler v2",
            "learner_idle_timeout_s": IDLE_S,
            "apply_to_learner_running_s": c.figures["level_b_autoscale_apply_to_learner_running_s"],
            "succeeded_to_learner_gone_s": c.figures["level_b_autoscale_succeeded_to_learner_gone_s"],
        }, indent=2, sort_keys=True) + "\n")
    finally:
        c.delete_ray("rayjobs", name, wait_pods=False)
