"""Level A: the chart's autoscaling and pod-priority values (charts/rl-platform/ci/autoscaling-values.yaml) on the real
API server and KubeRay operator. The release's PriorityClasses are created, KubeRay accepts the RayCluster with the
autoscaler v2 and per-group idle timeouts (it refuses `idleTimeoutSeconds` under v1), the head runs the autoscaler
sidecar, and every pod carries its pool's priority class with the value the API server resolved from it."""

from __future__ import annotations

import pytest
import yaml

from kubekit import NAMESPACE, ROOT, Cluster, dump, helm_path, sh, wait_until

RELEASE = "prio"  # rendered as its own release: its RayCluster and PriorityClasses are not the deployed release's
VALUES = ROOT / "charts" / "rl-platform" / "ci" / "autoscaling-values.yaml"


@pytest.fixture(scope="module")
def applied(cluster_a: Cluster):
    docs = [d for d in yaml.safe_load_all(sh(
        helm_path(), "template", RELEASE, str(ROOT / "charts" / "rl-platform"), "--namespace", NAMESPACE,
        "-f", str(VALUES), "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=rl-platform",
        "--show-only", "templates/priorityclasses.yaml", "--show-only", "templates/raycluster.yaml").stdout) if d]
    manifest = yaml.safe_dump_all(docs)
    cluster_a.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=manifest)
    yield cluster_a, {d["kind"]: d for d in docs}, [d for d in docs if d["kind"] == "PriorityClass"]
    # Waited for: later tests count the namespace's RayClusters and pods.
    cluster_a.kubectl("-n", NAMESPACE, "delete", "--ignore-not-found", "-f", "-", input=manifest, check=False,
                      timeout=180)
    wait_until(f"the pods of release {RELEASE} to go", lambda: not cluster_a.pods(
        f"ray.io/cluster={RELEASE}-rl-platform"), 180)


def test_operator_runs_the_autoscaler_v2_cluster_and_gives_each_pod_its_pools_priority(applied):
    c, by_kind, classes = applied
    assert {p["metadata"]["name"]: p["value"] for p in classes} == {
        "rl-platform-head": 3000, "rl-platform-learner": 2000, "rl-platform-rollout": 1000}
    rc = by_kind["RayCluster"]["metadata"]["name"]
    assert by_kind["RayCluster"]["spec"]["autoscalerOptions"]["version"] == "v2"
    # Accepted by KubeRay (a refused spec gets no pods, only a warning event), its head made with the sidecar.
    head = wait_until(f"the head pod of {rc}", lambda: next(iter(c.pods(f"ray.io/cluster={rc},ray.io/node-type=head")),
                                                             None), 120,
                      on_timeout=lambda: "\n".join(c.events_for(rc)))
    assert "autoscaler" in [ct.name for ct in head.spec.containers], [ct.name for ct in head.spec.containers]
    assert (head.spec.priority_class_name, head.spec.priority) == ("rl-platform-head", 3000), dump(head.spec.to_dict())
    assert not [e for e in c.events_for(rc) if e.startswith("Warning")], c.events_for(rc)
    stored = {g["groupName"]: g for g in c.ray("rayclusters", rc)["spec"]["workerGroupSpecs"]}
    assert {n: g.get("idleTimeoutSeconds") for n, g in stored.items()} == {"learner-gpu": 30, "rollout-cpu": 300}, stored
    # Worker groups start at 0 replicas here (autoscaling-values.yaml): the pod template the operator will use
    # carries the pool's class; scaling one group up by hand makes a pod that shows it.
    c.kubectl("-n", NAMESPACE, "patch", "raycluster", rc, "--type=json", "-p",
              '[{"op": "replace", "path": "/spec/workerGroupSpecs/%d/replicas", "value": 1}]'
              % list(stored).index("rollout-cpu"))
    worker = wait_until("a rollout worker pod", lambda: next(iter(c.pods(
        f"ray.io/cluster={rc},ray.io/group=rollout-cpu")), None), 120,
        on_timeout=lambda: "\n".join(c.events_for(rc)))
    assert (worker.spec.priority_class_name, worker.spec.priority) == ("rl-platform-rollout", 1000), \
        dump(worker.spec.to_dict())
    assert stored["learner-gpu"]["template"]["spec"]["priorityClassName"] == "rl-platform-learner"
