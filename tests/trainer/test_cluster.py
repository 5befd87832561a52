"""Resource isolation on a real multi-node Ray on one host: env runners only on the rollout pool, learners only on
the learner pool. Pools are Ray custom resources (no fake GPUs: RLlib crashes on NCCL on a CPU host)."""

import os

import pytest
import ray
from ray._common.utils import get_default_ray_temp_dir
from ray.cluster_utils import Cluster

from trainer_helpers import run_trainer, short_tmp, summary_of

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def pooled_cluster():
    # cluster_utils.Cluster writes its address file under Ray's *default* temp dir even when the head has its own
    # temp_dir; on a machine where no Ray ran before, that directory does not exist yet.
    os.makedirs(get_default_ray_temp_dir(), exist_ok=True)
    cluster = Cluster()
    try:
        cluster.add_node(num_cpus=1, temp_dir=short_tmp("rayc"), include_dashboard=True, dashboard_host="127.0.0.1")
        rollout = cluster.add_node(num_cpus=2, resources={"rollout_pool": 2})
        learner = cluster.add_node(num_cpus=1, resources={"learner_pool": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        yield cluster, rollout.node_id, learner.node_id
    finally:  # also when the set-up failed half-way: a leftover head would leak into later tests in this process
        ray.shutdown()
        cluster.shutdown()


def test_env_runners_on_rollout_pool_learners_on_learner_pool(pooled_cluster, tmp_path):
    cluster, rollout_node, learner_node = pooled_cluster
    proc = run_trainer(
        "resources=cluster", f"resources.address={cluster.address}", "resources.num_env_runners=2",
        "resources.num_learners=1", "resources.num_gpus_per_learner=0", "env.num_envs_per_env_runner=2",
        "algo.train_batch_size=256", "algo.minibatch_size=64", "algo.num_epochs=1", "stop.iterations=2",
        f"output_dir={tmp_path}", timeout=600,
    )
    assert summary_of(proc)["iterations"] == 2

    from ray.util.state import list_actors

    actors = list_actors(detail=True, limit=1000, raise_on_missing_output=False)
    runners = [a for a in actors if a.class_name.endswith("EnvRunner")]
    # Remote learners run inside Ray Train's executable wrapper (RLlib's LearnerGroup uses its BackendExecutor).
    learners = [a for a in actors if a.class_name.endswith("Learner") or a.class_name.endswith("_WrappedExecutable")]
    assert len(runners) + len(learners) == len(actors), [a.class_name for a in actors]
    # Two remote env runners, one remote learner were created by the run, wherever Ray put them.
    assert len(runners) >= 2, [a.class_name for a in actors]
    assert len(learners) >= 1, [a.class_name for a in actors]
    assert {a.node_id for a in runners} == {rollout_node}
    assert {a.node_id for a in learners} == {learner_node}
    assert all(a.required_resources.get("rollout_pool") == 1 for a in runners)
    assert all(a.required_resources.get("learner_pool") == 1 for a in learners)


def test_a_request_no_node_joins_for_fails_after_the_wait(pooled_cluster, tmp_path):
    """3 env runners need rollout_pool 3; the pool has 2 and no autoscaler adds more: one line after the wait."""
    cluster, _, _ = pooled_cluster
    proc = run_trainer(
        "resources=cluster", f"resources.address={cluster.address}", "resources.num_env_runners=3",
        "resources.num_learners=0", "resources.num_gpus_per_learner=0", "resources.wait_for_resources_s=3",
        "stop.iterations=1", f"output_dir={tmp_path}", check=False, timeout=300,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "waiting up to 3s" in proc.stdout
    err = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and "rollout_pool 3" in err[0] and "rollout_pool 2" in err[0], proc.stderr[-2000:]
