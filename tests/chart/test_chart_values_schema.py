"""values.schema.json rejects invalid values at `helm template`/`install` time with a message naming the value."""

import pytest

pytestmark = pytest.mark.chart


@pytest.mark.parametrize(
    "sets, expected",
    [
        ({"workerGroups.rollout-cpu.replicas": -1}, "at '/workerGroups/rollout-cpu/replicas': minimum: got -1, want 0"),
        ({"workerGroups.rollout-cpu.maxReplicas": -2}, "at '/workerGroups/rollout-cpu/maxReplicas': minimum: got -2"),
        ({"workerGroups.learner-gpu.enabled": True, "workerGroups.learner-gpu.nodeSelector": None},
         "at '/workerGroups/learner-gpu': missing property 'nodeSelector'"),
        ({"workerGroups.big-gpu": {"pool": "learner", "replicas": 1, "minReplicas": 0, "maxReplicas": 1, "cpus": 8,
                                   "memory": "32Gi", "gpus": 4, "nodeSelector": {}}},
         "at '/workerGroups/big-gpu/nodeSelector': minProperties: got 0, want 1"),
        ({"workerGroups.rollout-cpu.gpus": 1}, "at '/workerGroups/rollout-cpu/gpus'"),
        ({"replicaCount": 2}, "additional properties 'replicaCount' not allowed"),
        ({"head.serviceType": "NodePort"}, "at '/head': additional properties 'serviceType' not allowed"),
        ({"workerGroups.rollout-cpu.cpu": 2}, "at '/workerGroups/rollout-cpu': additional properties 'cpu' not allowed"),
        ({"rayJob.outputDir": "relative/path"}, "at '/rayJob/outputDir'"),
        ({"image.pullPolicy": "Sometimes"}, "at '/image/pullPolicy'"),
    ],
    ids=["negative-replicas", "negative-max", "gpu-learners-no-selector", "new-gpu-group-empty-selector",
         "gpu-on-rollout-pool", "unknown-top-level-key", "head-service-type", "typo-in-group", "relative-output-dir",
         "bad-pull-policy"],
)
def test_invalid_values_are_rejected_with_a_readable_message(tools, sets, expected):
    proc = tools.template(sets=sets, check=False)
    assert proc.returncode != 0, f"accepted {sets}"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert expected in proc.stderr, proc.stderr


def test_valid_extra_worker_group_is_accepted(tools):
    docs = tools.render(sets={"workerGroups.eval-cpu": {"pool": "none", "replicas": 1, "minReplicas": 0,
                                                          "maxReplicas": 2, "cpus": 1, "memory": "1Gi", "gpus": 0}})
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    assert [g["groupName"] for g in cluster["spec"]["workerGroupSpecs"]] == ["eval-cpu", "rollout-cpu"]


def test_replicas_outside_min_max_fail_with_the_group_name(tools):
    proc = tools.template(sets={"workerGroups.rollout-cpu.replicas": 9}, check=False)
    assert proc.returncode != 0
    assert "workerGroups.rollout-cpu: replicas (9) must lie between minReplicas (1) and maxReplicas (8)" in proc.stderr


@pytest.mark.parametrize(
    "sets, expected",
    [
        ({"gcsFaultTolerance.redisAddress": "redis with spaces", "gcsFaultTolerance.passwordSecret.name": "s"},
         "at '/gcsFaultTolerance/redisAddress'"),
        # An external Redis without the Secret of its password: refused by the schema (the template says it too).
        ({"gcsFaultTolerance.redisAddress": "redis.example.internal:6379"},
         "at '/gcsFaultTolerance/passwordSecret/name': minLength: got 0, want 1"),
        ({"gcsFaultTolerance.redis.persistence.size": "lots"}, "at '/gcsFaultTolerance/redis/persistence/size'"),
        ({"gcsFaultTolerance.waitForRedisSeconds": -1}, "at '/gcsFaultTolerance/waitForRedisSeconds': minimum"),
        ({"gcsFaultTolerance.rayservice": True}, "at '/gcsFaultTolerance': additional properties 'rayservice'"),
    ],
    ids=["address-not-host-port", "external-redis-without-secret", "bad-claim-size", "negative-wait", "typo"],
)
def test_invalid_gcs_fault_tolerance_values_are_rejected(tools, sets, expected):
    proc = tools.template(sets=sets, check=False)
    assert proc.returncode != 0, f"accepted {sets}"
    assert expected in proc.stderr, proc.stderr
